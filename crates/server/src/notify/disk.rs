//! Free disk space of the data folder, checked periodically: under the
//! threshold raises a `disk_low` alert, back over it clears the condition.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use estafeta_exchange::{Alert, AlertKind, Exchange, alert_key};

/// Bytes available to an unprivileged writer on the file system of `path`.
// The one call into the C library: std has no statvfs.
#[allow(unsafe_code)]
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `stat` a writable buffer
    // of the right type; statvfs only writes to it.
    let rc = unsafe { libc::statvfs(c.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::useless_conversion)] // the field widths differ between platforms
    Ok(u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

/// Checks free space every `period` until `stop`; `threshold` 0: never.
pub async fn watch(
    exchange: Exchange,
    data_dir: PathBuf,
    threshold: u64,
    period: Duration,
    stop: impl Future<Output = ()> + Send,
) {
    if threshold == 0 {
        return stop.await;
    }
    let mut stop = std::pin::pin!(stop);
    let mut tick = tokio::time::interval(period);
    let mut low = false;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        let dir = data_dir.clone();
        let free = match tokio::task::spawn_blocking(move || free_bytes(&dir)).await {
            Ok(Ok(free)) => free,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading free disk space failed");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading free disk space failed");
                continue;
            }
        };
        if free < threshold && !low {
            low = true;
            let text = format!(
                "free disk space in {} is {} MB, under the alert threshold of {} MB",
                data_dir.display(),
                free >> 20,
                threshold >> 20
            );
            let alert = Alert::new(AlertKind::DiskLow, "data", text, exchange.now());
            exchange.raise_alert(alert).await;
        } else if free >= threshold && low {
            low = false;
            exchange
                .clear_alert(alert_key(AlertKind::DiskLow, "data"))
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_is_read_and_a_missing_path_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }
}
