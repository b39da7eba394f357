//! Idempotency keys of uploads (`estafeta_exchange::keys::UploadKeys`) over
//! the `idempotency_keys` table: one row per (device, key).
//!
//! Two nodes writing the same key at once write one row: the database
//! orders the two upserts, and the one that commits last is what every node
//! reads from then on, as a second write of a key on one node replaces the
//! first. The sweep of expired keys takes its rows with `SKIP LOCKED`, so
//! nodes sweeping at once share the work instead of waiting for each other.
//!
//! The trait is synchronous (the exchange calls it from blocking threads);
//! each call runs on the pool through the runtime handle taken at
//! [`PgKeys::new`]. The statements of an upload's look-up and record are
//! prepared once per connection (one round trip each after that).

use estafeta_exchange::keys::{KeyedUpload, KeysError, UploadKeys};
use estafeta_exchange::{Id, Timestamp};

use crate::{Error, Store};

const GET: &str = "SELECT name, at, expires_at FROM idempotency_keys
    WHERE device_id = $1 AND key = $2 AND expires_at > $3";
const REMOVE_DEVICE: &str = "DELETE FROM idempotency_keys WHERE device_id = $1";
const EXPIRE: &str = "DELETE FROM idempotency_keys WHERE (device_id, key) IN (
    SELECT device_id, key FROM idempotency_keys WHERE expires_at <= $1
    ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// Upload idempotency keys in the cluster store.
pub struct PgKeys {
    store: Store,
    runtime: tokio::runtime::Handle,
}

impl PgKeys {
    /// The key store over `store` (migrated). Call it within the Tokio
    /// runtime whose pool connections it will use: it keeps that runtime's
    /// handle, and its methods must then be called off the runtime's own
    /// threads.
    pub fn new(store: Store) -> PgKeys {
        PgKeys {
            store,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    fn run<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, KeysError> {
        self.runtime
            .block_on(f)
            .map_err(|e| match e.is_unavailable() {
                true => KeysError::Unavailable(Box::new(e)),
                false => KeysError::Backend(Box::new(e)),
            })
    }
}

impl UploadKeys for PgKeys {
    fn get(
        &self,
        device: &Id,
        key: &str,
        now: Timestamp,
    ) -> Result<Option<KeyedUpload>, KeysError> {
        self.run(async {
            let client = self.store.client().await?;
            let get = client.prepare_cached(GET).await?;
            let row = client
                .query_opt(&get, &[&device.as_str(), &key, &now.as_millis()])
                .await?;
            Ok(row.map(|r| KeyedUpload {
                name: r.get(0),
                at: Timestamp::from_millis(r.get(1)),
                expires_at: Timestamp::from_millis(r.get(2)),
            }))
        })
    }

    /// One statement. A key given twice is written once, as its last entry
    /// says (one statement cannot change a row twice).
    fn put_all(&self, entries: &[(Id, String, KeyedUpload)]) -> Result<(), KeysError> {
        let mut seen = std::collections::HashSet::new();
        let last: Vec<&(Id, String, KeyedUpload)> = entries
            .iter()
            .rev()
            .filter(|e| seen.insert((e.0.as_str(), e.1.as_str())))
            .collect();
        let devices: Vec<&str> = last.iter().map(|e| e.0.as_str()).collect();
        let keys: Vec<&str> = last.iter().map(|e| e.1.as_str()).collect();
        let names: Vec<&str> = last.iter().map(|e| e.2.name.as_str()).collect();
        let at: Vec<i64> = last.iter().map(|e| e.2.at.as_millis()).collect();
        let expires: Vec<i64> = last.iter().map(|e| e.2.expires_at.as_millis()).collect();
        self.run(async {
            let client = self.store.client().await?;
            let put = client.prepare_cached(crate::joint::PUT_KEYS).await?;
            client
                .execute(&put, &[&devices, &keys, &names, &at, &expires])
                .await?;
            Ok(())
        })
    }

    /// A row of the step's joint (its rows of this crate's tables), written with
    /// the step's commit.
    fn put_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        device: &Id,
        key: &str,
        upload: &KeyedUpload,
    ) -> bool {
        match crate::session_storage::joint_of(step) {
            Some(joint) => {
                joint.put_key(device.as_str(), key, upload);
                true
            }
            None => false,
        }
    }

    fn remove_device(&self, device: &Id) -> Result<u64, KeysError> {
        self.run(async {
            let client = self.store.client().await?;
            let remove = client.prepare_cached(REMOVE_DEVICE).await?;
            Ok(client.execute(&remove, &[&device.as_str()]).await?)
        })
    }

    fn expire(&self, now: Timestamp, max: usize) -> Result<usize, KeysError> {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.run(async {
            let client = self.store.client().await?;
            let n = client.execute(EXPIRE, &[&now.as_millis(), &max]).await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

    fn len(&self) -> Result<u64, KeysError> {
        self.run(async {
            let client = self.store.client().await?;
            let n: i64 = client
                .query_one("SELECT count(*) FROM idempotency_keys", &[])
                .await?
                .get(0);
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }
}
