//! Opening the server at start, waiting out a full disk or a cluster store
//! out of reach.
//!
//! After a crash, the embedded stores repair themselves on open, and that
//! writes. On a full disk the open fails; exiting then would leave a server
//! that needs an operator (or a supervisor loop) to come back. Instead the
//! start waits, trying again with a growing pause, for as long as the data
//! folder's file system stays under the low-space threshold, and goes on by
//! itself once space is freed. A cluster store out of reach (a failover
//! under way, a connection lost while opening) is waited out the same way,
//! as a running node waits it out. Any other failure ends the start at
//! once: a corrupt or unreadable store does not heal by waiting.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use estafeta_exchange::ExchangeConfig;
use estafeta_exchange::tenancy::AdminToken;
use estafeta_session::Clock;

use crate::config::{ClusterStore, HttpSettings};
use crate::error::ServeError;
use crate::events::EventLogHandle;
use crate::notify::NotifySettings;
use crate::notify::disk::free_bytes;
use crate::serve::Server;

/// The first pause after a failed open on a full disk or with the cluster
/// store out of reach; it doubles.
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest pause between two tries on a full disk.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// The longest pause between two tries with the cluster store out of
/// reach (a failover takes seconds).
const MAX_STORE_WAIT: Duration = Duration::from_secs(5);
/// The low-space threshold when the disk alert is off (`disk_alert_mb` 0).
const DEFAULT_LOW: u64 = 16 << 20;

/// Opens the server on `config.data_dir` over the stores `store` names
/// ([`crate::stores::stores`], [`Server::open_with`]). While opening fails and the file
/// system has less than `low_bytes` free (0: 16 MiB), or the cluster store
/// cannot be reached, waits and tries again.
pub async fn open_server(
    config: ExchangeConfig,
    clock: Arc<dyn Clock>,
    http: HttpSettings,
    notify: NotifySettings,
    low_bytes: u64,
    store: Option<&ClusterStore>,
    event_log: Option<&EventLogHandle>,
) -> Result<(Server, AdminToken), ServeError> {
    let low = if low_bytes == 0 {
        DEFAULT_LOW
    } else {
        low_bytes
    };
    let mut wait = FIRST_WAIT;
    loop {
        let opened = Server::open_with(
            config.clone(),
            clock.clone(),
            http.clone(),
            notify.clone(),
            store,
            event_log,
        )
        .await;
        let error = match opened {
            Ok(opened) => return Ok(opened),
            Err(e) => e,
        };
        if error.is_store_unavailable() {
            tracing::error!(
                %error, retry_in = ?wait,
                "the cluster store is out of reach: opening failed; trying again"
            );
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_STORE_WAIT);
            continue;
        }
        let dir = config.data_dir.clone();
        let free = tokio::task::spawn_blocking(move || free_where(&dir))
            .await
            .ok()
            .flatten();
        match free {
            Some(free) if free < low => {
                tracing::error!(
                    target: "estafeta::alert",
                    free_bytes = free, %error, retry_in = ?wait,
                    "the disk of the data folder is full: opening it failed; waiting for free space"
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_WAIT);
            }
            _ => return Err(error),
        }
    }
}

/// Free bytes on the file system of `dir`, or of its nearest existing
/// ancestor (the data folder may not exist yet).
fn free_where(dir: &Path) -> Option<u64> {
    dir.ancestors().find_map(|d| free_bytes(d).ok())
}
