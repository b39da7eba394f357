//! Opening the data folder at start, waiting out a full disk; the stores
//! the exchange runs on: embedded under the data folder, or a cluster's
//! PostgreSQL database (the `store` setting).
//!
//! After a crash, the embedded stores repair themselves on open, and that
//! writes. On a full disk the open fails; exiting then would leave a server
//! that needs an operator (or a supervisor loop) to come back. Instead the
//! start waits, trying again with a growing pause, for as long as the data
//! folder's file system stays under the low-space threshold, and goes on by
//! itself once space is freed. Any other failure ends the start at once: a
//! corrupt or unreadable store does not heal by waiting.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use estafeta_exchange::tenancy::AdminToken;
use estafeta_exchange::{ExchangeConfig, Gated, Quiesce, Stores};
use estafeta_session::Clock;

use crate::config::HttpSettings;
use crate::notify::NotifySettings;
use crate::notify::disk::free_bytes;
use crate::serve::{ServeError, Server};

/// The first pause after a failed open on a full disk; it doubles.
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest pause between two tries.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// The low-space threshold when the disk alert is off (`disk_alert_mb` 0).
const DEFAULT_LOW: u64 = 16 << 20;

/// The stores the exchange runs on: with no `store` URL, the embedded ones
/// under `data_dir`; with a `postgres://` URL, the cluster's database, its
/// schema created or brought up to date first (safe when several nodes
/// start at once).
pub async fn stores(
    data_dir: &Path,
    store: Option<&str>,
    clock: Arc<dyn Clock>,
    quiesce: &Quiesce,
) -> Result<Stores, ServeError> {
    let Some(url) = store else {
        return Stores::embedded(data_dir, clock, quiesce)
            .await
            .map_err(ServeError::Open);
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(ServeError::StoreUrl);
    }
    let db = estafeta_cluster::Store::connect(url).map_err(ServeError::Store)?;
    db.migrate().await.map_err(ServeError::Store)?;
    let sessions = estafeta_cluster::SessionStorage::open(db.clone())
        .await
        .map_err(ServeError::Store)?;
    // Gated for the commit observer (the metrics' commit latency); an online
    // backup is the database's own (pg_dump, base backups), not a pause.
    let scheduled = Arc::new(Gated::new(
        estafeta_cluster::PgSchedule::new(db.clone()),
        quiesce.clone(),
    ));
    Ok(Stores {
        messages: Arc::new(Gated::new(
            estafeta_cluster::PgMessages::with_clock(db.clone(), clock.clone()),
            quiesce.clone(),
        )),
        registry: Arc::new(Gated::new(
            estafeta_cluster::PgRegistry::new(db.clone()),
            quiesce.clone(),
        )),
        sessions: Arc::new(Gated::new(sessions, quiesce.clone())),
        scheduled: estafeta_exchange::store::Scheduled::new(scheduled, clock),
        keys: Arc::new(Gated::new(
            estafeta_cluster::PgKeys::new(db),
            quiesce.clone(),
        )),
    })
}

/// Opens the server on `config.data_dir` over the stores `store` names
/// ([`stores`], [`Server::open_with`]). While opening fails and the file
/// system has less than `low_bytes` free (0: 16 MiB), waits and tries
/// again.
pub async fn open_server(
    config: ExchangeConfig,
    clock: Arc<dyn Clock>,
    http: HttpSettings,
    notify: NotifySettings,
    low_bytes: u64,
    store: Option<&str>,
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
        )
        .await;
        let error = match opened {
            Ok(opened) => return Ok(opened),
            Err(e) => e,
        };
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
