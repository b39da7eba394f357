//! [`Raised`]: every alert the server raised, kept in a redb file. It is
//! the one source of truth for both questions asked about alerts:
//!
//! - *is this condition still going on?* (its key is among the ongoing
//!   ones until the exchange says it ended), so that the same condition
//!   does not alert twice while it lasts, across restarts too;
//! - *has an operator seen it?* (acknowledged on the dashboard), which is
//!   what the dashboard's alert list and its open count, and the
//!   `estafeta_alerts_open` metric, show.
//!
//! The two are independent: a condition that ended still waits for its
//! acknowledgement, and acknowledging an ongoing condition does not make
//! it alert again.
//!
//! The notifier reaches its alerts through [`AlertStore`]: this file
//! (with the deliveries in the notifier's repeat store beside it) on the
//! embedded store, [`estafeta_postgres::PgAlerts`] in cluster mode, where
//! the alert and its deliveries are one transaction and one event is one
//! alert whichever nodes raise it.

use std::path::Path;
use std::sync::Arc;

use estafeta_durable::WriteGate;
use estafeta_exchange::{Alert, Timestamp};
use estafeta_repeat::Entry;
use estafeta_session::BoxFuture;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

/// Alert id → the [`AlertRecord`] as JSON.
const ALERTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("alerts.all");
/// Condition key of an ongoing condition → its alert's id.
const ONGOING: TableDefinition<'_, &str, u64> = TableDefinition::new("alerts.ongoing");

/// The alert store failed, or was asked about an alert it does not have.
#[derive(Debug, thiserror::Error)]
pub enum RaisedError {
    /// No alert has this id.
    #[error("no alert {0}")]
    Unknown(u64),
    /// Reading or writing the store failed.
    #[error("alert store: {0}")]
    Store(String),
}

fn err(e: impl std::fmt::Display) -> RaisedError {
    RaisedError::Store(e.to_string())
}

/// One raised alert and what became of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertRecord {
    /// Its id in the store (increasing).
    pub id: u64,
    /// The alert as raised.
    pub alert: Alert,
    /// When its condition ended, if it did.
    pub ended_at: Option<Timestamp>,
    /// When an operator acknowledged it, if one did.
    pub acked_at: Option<Timestamp>,
}

/// Where the raised alerts are kept, and their deliveries scheduled.
pub trait AlertStore: Send + Sync {
    /// Records `alert` as ongoing and schedules its `deliveries` (repeat
    /// entries of the notifier's source), durably; `false` when its
    /// condition was ongoing already (nothing is scheduled then).
    fn raise<'a>(
        &'a self,
        alert: &'a Alert,
        deliveries: Vec<Entry>,
    ) -> BoxFuture<'a, Result<bool, RaisedError>>;

    /// The condition `key` ended at `at`, durably; `false` if it was not ongoing.
    fn close<'a>(&'a self, key: &'a str, at: Timestamp)
    -> BoxFuture<'a, Result<bool, RaisedError>>;

    /// [`raise`](Self::raise) as part of `step`, the step a command holds
    /// in a shared session store whose transactions this store writes in:
    /// recorded with the step's commit, or not at all. `false` (the
    /// default): this store cannot; nothing was done.
    fn raise_in_step(
        &self,
        _step: &mut dyn estafeta_session::Step,
        _alert: &Alert,
        _deliveries: &[Entry],
    ) -> bool {
        false
    }

    /// [`close`](Self::close) as part of `step`, as
    /// [`raise_in_step`](Self::raise_in_step).
    fn close_in_step(
        &self,
        _step: &mut dyn estafeta_session::Step,
        _key: &str,
        _at: Timestamp,
    ) -> bool {
        false
    }

    /// An operator acknowledged alert `id` at `at`, durably (a second
    /// acknowledgement keeps the first time).
    fn acknowledge(&self, id: u64, at: Timestamp) -> BoxFuture<'_, Result<(), RaisedError>>;

    /// The newest `limit` alerts, newest first.
    fn list(&self, limit: usize) -> BoxFuture<'_, Result<Vec<AlertRecord>, RaisedError>>;

    /// How many alerts no operator acknowledged yet.
    fn unacknowledged(&self) -> BoxFuture<'_, Result<u64, RaisedError>>;
}

impl AlertStore for estafeta_postgres::PgAlerts {
    fn raise_in_step(
        &self,
        step: &mut dyn estafeta_session::Step,
        alert: &Alert,
        deliveries: &[Entry],
    ) -> bool {
        estafeta_postgres::PgAlerts::raise_in_step(self, step, alert, deliveries)
    }

    fn close_in_step(
        &self,
        step: &mut dyn estafeta_session::Step,
        key: &str,
        at: Timestamp,
    ) -> bool {
        estafeta_postgres::PgAlerts::close_in_step(self, step, key, at)
    }

    fn raise<'a>(
        &'a self,
        alert: &'a Alert,
        deliveries: Vec<Entry>,
    ) -> BoxFuture<'a, Result<bool, RaisedError>> {
        Box::pin(async move {
            let id = estafeta_postgres::PgAlerts::raise(self, alert, &deliveries)
                .await
                .map_err(err)?;
            Ok(id.is_some())
        })
    }

    fn close<'a>(
        &'a self,
        key: &'a str,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<bool, RaisedError>> {
        Box::pin(async move {
            estafeta_postgres::PgAlerts::close(self, key, at)
                .await
                .map_err(err)
        })
    }

    fn acknowledge(&self, id: u64, at: Timestamp) -> BoxFuture<'_, Result<(), RaisedError>> {
        Box::pin(async move {
            match estafeta_postgres::PgAlerts::acknowledge(self, id, at).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(RaisedError::Unknown(id)),
                Err(e) => Err(err(e)),
            }
        })
    }

    fn list(&self, limit: usize) -> BoxFuture<'_, Result<Vec<AlertRecord>, RaisedError>> {
        Box::pin(async move {
            let stored = estafeta_postgres::PgAlerts::list(self, limit)
                .await
                .map_err(err)?;
            Ok(stored
                .into_iter()
                .map(|s| AlertRecord {
                    id: s.id,
                    alert: s.alert,
                    ended_at: s.ended_at,
                    acked_at: s.acked_at,
                })
                .collect())
        })
    }

    fn unacknowledged(&self) -> BoxFuture<'_, Result<u64, RaisedError>> {
        Box::pin(async move {
            estafeta_postgres::PgAlerts::unacknowledged(self)
                .await
                .map_err(err)
        })
    }
}

/// The raised alerts. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Raised {
    db: Arc<Database>,
    /// What an online backup closes to hold back the writes.
    gate: WriteGate,
}

impl Raised {
    /// Opens (or creates) the store at `path`, its writes passing `gate`.
    pub fn open(path: &Path, gate: WriteGate) -> Result<Self, RaisedError> {
        let db = estafeta_durable::open_redb(path, |db| {
            let txn = db.begin_write()?;
            txn.open_table(ALERTS)?;
            txn.open_table(ONGOING)?;
            txn.commit()?;
            Ok(())
        })
        .map_err(err)?;
        Ok(Raised {
            db: Arc::new(db),
            gate,
        })
    }

    /// Records `alert` and its condition as ongoing, durably; `false` when
    /// the condition was ongoing already (nothing is written then).
    pub async fn open_alert(&self, alert: &Alert) -> Result<bool, RaisedError> {
        let db = Arc::clone(&self.db);
        let alert = alert.clone();
        self.writing(move || {
            let txn = db.begin_write().map_err(err)?;
            let fresh = {
                let mut ongoing = txn.open_table(ONGOING).map_err(err)?;
                let fresh = ongoing.get(alert.key.as_str()).map_err(err)?.is_none();
                if fresh {
                    let mut all = txn.open_table(ALERTS).map_err(err)?;
                    let id = match all.last().map_err(err)? {
                        Some((k, _)) => k.value() + 1,
                        None => 1,
                    };
                    let record = AlertRecord {
                        id,
                        alert: alert.clone(),
                        ended_at: None,
                        acked_at: None,
                    };
                    let json = serde_json::to_vec(&record).map_err(err)?;
                    all.insert(id, json.as_slice()).map_err(err)?;
                    ongoing.insert(alert.key.as_str(), id).map_err(err)?;
                }
                fresh
            };
            txn.commit().map_err(err)?;
            Ok(fresh)
        })
        .await
    }

    /// Whether the condition `key` is ongoing.
    pub async fn is_open(&self, key: &str) -> Result<bool, RaisedError> {
        let db = Arc::clone(&self.db);
        let key = key.to_owned();
        blocking(move || {
            let txn = db.begin_read().map_err(err)?;
            let table = txn.open_table(ONGOING).map_err(err)?;
            Ok(table.get(key.as_str()).map_err(err)?.is_some())
        })
        .await
    }

    /// The condition `key` ended at `at`, durably; `false` if it was not ongoing.
    pub async fn close(&self, key: &str, at: Timestamp) -> Result<bool, RaisedError> {
        let db = Arc::clone(&self.db);
        let key = key.to_owned();
        self.writing(move || {
            let txn = db.begin_write().map_err(err)?;
            let was = {
                let mut ongoing = txn.open_table(ONGOING).map_err(err)?;
                let id = ongoing
                    .remove(key.as_str())
                    .map_err(err)?
                    .map(|v| v.value());
                if let Some(id) = id {
                    update(&txn, id, |r| r.ended_at = Some(at))?;
                }
                id.is_some()
            };
            txn.commit().map_err(err)?;
            Ok(was)
        })
        .await
    }

    /// An operator acknowledged alert `id` at `at`, durably (a second
    /// acknowledgement keeps the first time).
    pub async fn acknowledge(&self, id: u64, at: Timestamp) -> Result<(), RaisedError> {
        let db = Arc::clone(&self.db);
        self.writing(move || {
            let txn = db.begin_write().map_err(err)?;
            update(&txn, id, |r| {
                r.acked_at.get_or_insert(at);
            })?;
            txn.commit().map_err(err)?;
            Ok(())
        })
        .await
    }

    /// Runs the write transaction `f` on a blocking thread, outside any
    /// backup's pause.
    async fn writing<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, RaisedError> + Send + 'static,
    ) -> Result<T, RaisedError> {
        let gate = self.gate.clone();
        blocking(move || gate.pass(f)).await
    }

    /// The newest `limit` alerts, newest first.
    pub async fn list(&self, limit: usize) -> Result<Vec<AlertRecord>, RaisedError> {
        let db = Arc::clone(&self.db);
        blocking(move || {
            let txn = db.begin_read().map_err(err)?;
            let table = txn.open_table(ALERTS).map_err(err)?;
            let mut out = Vec::new();
            for row in table.iter().map_err(err)?.rev().take(limit) {
                let (_, v) = row.map_err(err)?;
                out.push(serde_json::from_slice(v.value()).map_err(err)?);
            }
            Ok(out)
        })
        .await
    }

    /// How many alerts no operator acknowledged yet.
    pub async fn unacknowledged(&self) -> Result<u64, RaisedError> {
        let db = Arc::clone(&self.db);
        blocking(move || {
            let txn = db.begin_read().map_err(err)?;
            let table = txn.open_table(ALERTS).map_err(err)?;
            let mut n = 0;
            for row in table.iter().map_err(err)? {
                let (_, v) = row.map_err(err)?;
                let r: AlertRecord = serde_json::from_slice(v.value()).map_err(err)?;
                n += u64::from(r.acked_at.is_none());
            }
            Ok(n)
        })
        .await
    }
}

/// Changes the stored record `id` inside `txn`.
fn update(
    txn: &redb::WriteTransaction,
    id: u64,
    change: impl FnOnce(&mut AlertRecord),
) -> Result<(), RaisedError> {
    let mut all = txn.open_table(ALERTS).map_err(err)?;
    let mut record: AlertRecord = {
        let found = all.get(id).map_err(err)?.ok_or(RaisedError::Unknown(id))?;
        serde_json::from_slice(found.value()).map_err(err)?
    };
    change(&mut record);
    let json = serde_json::to_vec(&record).map_err(err)?;
    all.insert(id, json.as_slice()).map_err(err)?;
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RaisedError> + Send + 'static,
) -> Result<T, RaisedError> {
    tokio::task::spawn_blocking(f).await.map_err(err)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use estafeta_exchange::AlertKind;

    #[tokio::test]
    async fn a_condition_alerts_once_while_it_lasts_and_acknowledgements_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.redb");
        let t = Timestamp::from_millis;
        let a = Alert::new(AlertKind::InDoubt, "p1", "t", t(1));
        let raised = Raised::open(&path, WriteGate::default()).unwrap();
        assert!(raised.open_alert(&a).await.unwrap());
        assert!(!raised.open_alert(&a).await.unwrap());
        drop(raised);

        let raised = Raised::open(&path, WriteGate::default()).unwrap();
        assert!(raised.is_open(&a.key).await.unwrap());
        assert_eq!(raised.unacknowledged().await.unwrap(), 1);
        // Acknowledged while it lasts: still not news again.
        raised.acknowledge(1, t(5)).await.unwrap();
        raised.acknowledge(1, t(6)).await.unwrap();
        assert!(!raised.open_alert(&a).await.unwrap());
        assert_eq!(raised.unacknowledged().await.unwrap(), 0);
        assert!(raised.close(&a.key, t(7)).await.unwrap());
        assert!(!raised.close(&a.key, t(8)).await.unwrap());

        // Ended, the same condition is a new alert.
        assert!(raised.open_alert(&a).await.unwrap());
        let list = raised.list(10).await.unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(
            (list[0].id, list[0].ended_at, list[0].acked_at),
            (2, None, None)
        );
        assert_eq!(list[1].ended_at, Some(t(7)));
        assert_eq!(list[1].acked_at, Some(t(5)));
        assert_eq!(raised.unacknowledged().await.unwrap(), 1);
        assert!(matches!(
            raised.acknowledge(9, t(9)).await,
            Err(RaisedError::Unknown(9))
        ));
    }
}
