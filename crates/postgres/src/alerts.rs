//! [`PgAlerts`]: the alerts raised to the administrators, kept in the
//! `alerts` table and shared by every node.
//!
//! An alert's condition key is unique among ongoing alerts (a partial
//! unique index), so when two nodes see the same event only the first
//! records it, and the deliveries of that alert (repeat entries, source
//! `alerts`) are written by the same transaction: one alert, one delivery
//! per channel, whichever nodes saw it.

use estafeta_exchange::{Alert, Timestamp};
use estafeta_repeat::Entry;

use crate::schedule::{PUT_ENTRY, attempt_to_sql, to_sql};
use crate::{Error, Store};

/// Takes an id only when the condition is not ongoing already (the
/// `NOT EXISTS` keeps the id sequence dense, as the embedded store's ids
/// are); the conflict clause settles two nodes raising it at once.
const RAISE: &str = "INSERT INTO alerts (key, alert) SELECT $1::text, $2::bytea
    WHERE NOT EXISTS (SELECT 1 FROM alerts WHERE key = $1 AND ended_at IS NULL)
    ON CONFLICT (key) WHERE ended_at IS NULL DO NOTHING RETURNING id";
use crate::joint::CLOSE;
const ACK: &str = "UPDATE alerts SET acked_at = coalesce(acked_at, $2) WHERE id = $1";
const LIST: &str = "SELECT id, alert, ended_at, acked_at FROM alerts ORDER BY id DESC LIMIT $1";
const OPEN: &str = "SELECT 1 FROM alerts WHERE key = $1 AND ended_at IS NULL";
const UNACKED: &str = "SELECT count(*) FROM alerts WHERE acked_at IS NULL";

/// One stored alert and what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAlert {
    /// Its id (increasing).
    pub id: u64,
    /// The alert as raised.
    pub alert: Alert,
    /// When its condition ended, if it did.
    pub ended_at: Option<Timestamp>,
    /// When an operator acknowledged it, if one did.
    pub acked_at: Option<Timestamp>,
}

/// The raised alerts in the cluster store. Cheap to clone.
#[derive(Clone)]
pub struct PgAlerts {
    store: Store,
}

fn millis(t: Option<i64>) -> Option<Timestamp> {
    t.map(Timestamp::from_millis)
}

impl PgAlerts {
    /// The alerts of `store` (migrated).
    pub fn new(store: Store) -> PgAlerts {
        PgAlerts { store }
    }

    /// Records `alert` as ongoing and schedules its `deliveries`, in one
    /// transaction; `None` when its condition is ongoing already (nothing is
    /// written then), else the new alert's id.
    pub async fn raise(&self, alert: &Alert, deliveries: &[Entry]) -> Result<Option<u64>, Error> {
        let json = serde_json::to_vec(alert).map_err(|e| Error::Options(e.to_string()))?;
        let mut client = self.store.client().await?;
        let tx = client.transaction().await?;
        let Some(row) = tx.query_opt(RAISE, &[&alert.key, &json]).await? else {
            return Ok(None);
        };
        let id: i64 = row.get(0);
        for e in deliveries {
            let (due, attempt) = (to_sql(e.due), attempt_to_sql(e.attempt));
            tx.execute(PUT_ENTRY, &[&e.id, &e.source, &due, &attempt, &e.payload])
                .await?;
        }
        tx.commit().await?;
        Ok(Some(u64::try_from(id).unwrap_or(0)))
    }

    /// [`raise`](Self::raise) as part of `step`, a step of this crate's
    /// session storage: written by the step's commit, with the record that
    /// step saves, or not at all (a node that lost the step's key raises
    /// nothing). `false` when `step` is not one (nothing was done).
    pub fn raise_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        alert: &Alert,
        deliveries: &[Entry],
    ) -> bool {
        let Ok(json) = serde_json::to_vec(alert) else {
            return false;
        };
        match crate::session_storage::joint_of(step) {
            Some(joint) => {
                joint.raise(&alert.key, json, deliveries);
                true
            }
            None => false,
        }
    }

    /// [`close`](Self::close) as part of `step`, as
    /// [`raise_in_step`](Self::raise_in_step).
    pub fn close_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        key: &str,
        at: Timestamp,
    ) -> bool {
        match crate::session_storage::joint_of(step) {
            Some(joint) => {
                joint.close(key, at.as_millis());
                true
            }
            None => false,
        }
    }

    /// Whether the condition `key` is ongoing.
    pub async fn is_open(&self, key: &str) -> Result<bool, Error> {
        let client = self.store.client().await?;
        Ok(client.query_opt(OPEN, &[&key]).await?.is_some())
    }

    /// The condition `key` ended at `at`; `false` if it was not ongoing.
    pub async fn close(&self, key: &str, at: Timestamp) -> Result<bool, Error> {
        let client = self.store.client().await?;
        Ok(client.execute(CLOSE, &[&key, &at.as_millis()]).await? > 0)
    }

    /// An operator acknowledged alert `id` at `at` (a second
    /// acknowledgement keeps the first time); `false` if there is no such
    /// alert.
    pub async fn acknowledge(&self, id: u64, at: Timestamp) -> Result<bool, Error> {
        let Ok(id) = i64::try_from(id) else {
            return Ok(false);
        };
        let client = self.store.client().await?;
        Ok(client.execute(ACK, &[&id, &at.as_millis()]).await? > 0)
    }

    /// The newest `limit` alerts, newest first. A row whose alert cannot be
    /// read (written by a newer build) is left out.
    pub async fn list(&self, limit: usize) -> Result<Vec<StoredAlert>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.store.client().await?;
        let rows = client.query(LIST, &[&limit]).await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let alert = serde_json::from_slice(row.get::<_, &[u8]>(1)).ok()?;
                Some(StoredAlert {
                    id: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
                    alert,
                    ended_at: millis(row.get(2)),
                    acked_at: millis(row.get(3)),
                })
            })
            .collect())
    }

    /// How many alerts no operator acknowledged yet.
    pub async fn unacknowledged(&self) -> Result<u64, Error> {
        let client = self.store.client().await?;
        let n: i64 = client.query_one(UNACKED, &[]).await?.get(0);
        Ok(u64::try_from(n).unwrap_or(0))
    }
}
