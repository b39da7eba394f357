//! [`Raised`]: the alert conditions that are open, kept in a redb file so
//! that the same condition does not alert twice while it lasts, across
//! restarts too.

use std::path::Path;
use std::sync::Arc;

use estafeta_exchange::Alert;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

/// condition key → the alert as JSON.
const OPEN: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("alerts.open");

/// The open alert store failed.
#[derive(Debug, thiserror::Error)]
#[error("alert store: {0}")]
pub struct RaisedError(String);

fn err(e: impl std::fmt::Display) -> RaisedError {
    RaisedError(e.to_string())
}

/// The open alert conditions. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Raised {
    db: Arc<Database>,
}

impl Raised {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path) -> Result<Self, RaisedError> {
        let db = Database::create(path).map_err(err)?;
        let txn = db.begin_write().map_err(err)?;
        txn.open_table(OPEN).map_err(err)?;
        txn.commit().map_err(err)?;
        Ok(Raised { db: Arc::new(db) })
    }

    /// Records `alert` as open, durably; `false` when its condition was
    /// open already (nothing is written then).
    pub async fn open_alert(&self, alert: &Alert) -> Result<bool, RaisedError> {
        let db = Arc::clone(&self.db);
        let key = alert.key.clone();
        let value = serde_json::to_vec(alert).map_err(err)?;
        blocking(move || {
            let txn = db.begin_write().map_err(err)?;
            let fresh = {
                let mut table = txn.open_table(OPEN).map_err(err)?;
                let fresh = table.get(key.as_str()).map_err(err)?.is_none();
                if fresh {
                    table.insert(key.as_str(), value.as_slice()).map_err(err)?;
                }
                fresh
            };
            txn.commit().map_err(err)?;
            Ok(fresh)
        })
        .await
    }

    /// Whether the condition `key` is open.
    pub async fn is_open(&self, key: &str) -> Result<bool, RaisedError> {
        let db = Arc::clone(&self.db);
        let key = key.to_owned();
        blocking(move || {
            let txn = db.begin_read().map_err(err)?;
            let table = txn.open_table(OPEN).map_err(err)?;
            Ok(table.get(key.as_str()).map_err(err)?.is_some())
        })
        .await
    }

    /// The condition `key` ended, durably; `false` if it was not open.
    pub async fn close(&self, key: &str) -> Result<bool, RaisedError> {
        let db = Arc::clone(&self.db);
        let key = key.to_owned();
        blocking(move || {
            let txn = db.begin_write().map_err(err)?;
            let was = txn
                .open_table(OPEN)
                .map_err(err)?
                .remove(key.as_str())
                .map_err(err)?
                .is_some();
            txn.commit().map_err(err)?;
            Ok(was)
        })
        .await
    }

    /// Every open alert, by key.
    pub async fn list(&self) -> Result<Vec<Alert>, RaisedError> {
        let db = Arc::clone(&self.db);
        blocking(move || {
            let txn = db.begin_read().map_err(err)?;
            let table = txn.open_table(OPEN).map_err(err)?;
            let mut out = Vec::new();
            for row in table.iter().map_err(err)? {
                let (_, v) = row.map_err(err)?;
                out.push(serde_json::from_slice(v.value()).map_err(err)?);
            }
            Ok(out)
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RaisedError> + Send + 'static,
) -> Result<T, RaisedError> {
    tokio::task::spawn_blocking(f).await.map_err(err)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use estafeta_exchange::{AlertKind, Timestamp};

    #[tokio::test]
    async fn a_condition_opens_once_until_closed_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.redb");
        let a = Alert::new(AlertKind::InDoubt, "p1", "t", Timestamp::from_millis(1));
        let raised = Raised::open(&path).unwrap();
        assert!(raised.open_alert(&a).await.unwrap());
        assert!(!raised.open_alert(&a).await.unwrap());
        drop(raised);
        let raised = Raised::open(&path).unwrap();
        assert!(raised.is_open(&a.key).await.unwrap());
        assert_eq!(raised.list().await.unwrap(), vec![a.clone()]);
        assert!(raised.close(&a.key).await.unwrap());
        assert!(!raised.close(&a.key).await.unwrap());
        assert!(raised.open_alert(&a).await.unwrap());
    }
}
