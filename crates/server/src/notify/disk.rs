//! Free disk space of the data folder, checked periodically: under the
//! threshold raises a `disk_low` alert, back over it clears the condition.

use std::path::{Path, PathBuf};
use std::time::Duration;

use estafeta_exchange::{Alert, AlertKind, Exchange, alert_key};
use tokio_util::sync::CancellationToken;

/// Bytes available to an unprivileged writer on the file system of `path`
/// (the same statvfs reading as the `estafeta_disk_free_bytes` metric).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Checks free space every `period` until `stop` is cancelled; `threshold`
/// 0: never.
pub async fn watch(
    exchange: Exchange,
    data_dir: PathBuf,
    threshold: u64,
    period: Duration,
    stop: CancellationToken,
) {
    if threshold == 0 {
        return stop.cancelled().await;
    }
    let mut tick = tokio::time::interval(period);
    // Unknown until the first look: an alert an earlier run left open
    // (killed before the space came back) is closed by the first look that
    // finds enough.
    let mut low: Option<bool> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
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
        let now_low = free < threshold;
        if low.replace(now_low) == Some(now_low) {
            continue;
        }
        if now_low {
            let text = format!(
                "free disk space in {} is {} MB, under the alert threshold of {} MB",
                data_dir.display(),
                free >> 20,
                threshold >> 20
            );
            let alert = Alert::new(AlertKind::DiskLow, "data", text, exchange.now());
            exchange.raise_alert(alert).await;
        } else {
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
