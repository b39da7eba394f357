//! The session engine's storage (`estafeta_session::Storage`) over the
//! cluster store: the `sessions` and `quarantined_sessions` tables.
//!
//! The trait is synchronous and the engine calls it from blocking threads;
//! each call runs on the pool through the runtime handle taken at
//! [`SessionStorage::open`]. A write batch is one transaction.
//!
//! The store is shared by every node, so it offers the engine steps
//! ([`estafeta_session::storage::Shared`]): each command holds its key's
//! row lock ([`Store::lock`]) from the record it starts from to its last
//! save, and the deadlines due are read from `sessions.expires_at`,
//! skipping the keys a step holds. Steps are asynchronous: their round
//! trips run on the command's task, with no blocking thread between.

use crate::Locked;
use crate::joint::Joint;
use crate::{Error, Store};
use estafeta_session::clock::Timestamp;
use estafeta_session::storage::{Pending, Shared, Step, Storage, StorageError, Write};

const LOAD: &str = "SELECT record FROM sessions WHERE key = $1";
const PUT: &str =
    "INSERT INTO sessions (key, record, expires_at, generation) VALUES ($1, $2, $3, $4)
    ON CONFLICT (key) DO UPDATE SET record = $2, expires_at = $3, generation = $4";
const DELETE: &str = "DELETE FROM sessions WHERE key = $1";
const DEADLINES: &str =
    "SELECT key, expires_at FROM sessions WHERE expires_at IS NOT NULL AND record IS NOT NULL";
const QUARANTINE: &str = "INSERT INTO quarantined_sessions (key, record, reason)
    SELECT key, record, $2 FROM sessions WHERE key = $1
    ON CONFLICT (key) DO UPDATE SET record = EXCLUDED.record, reason = EXCLUDED.reason";
const QUARANTINED: &str = "SELECT key FROM quarantined_sessions ORDER BY key";
/// Due keys of a prefix, skipping those a step holds (its row is locked);
/// the transaction is only the read, so the keys are not kept locked.
const DUE: &str = "SELECT key FROM sessions
    WHERE expires_at <= $1 AND record IS NOT NULL
      AND substring(key from 1 for length($2::bytea)) = $2::bytea
    ORDER BY expires_at LIMIT $3 FOR UPDATE SKIP LOCKED";
const NEXT_GENERATION: &str =
    "UPDATE cluster_counters SET value = value + 1 WHERE name = 'generation' RETURNING value";

/// Session records in the cluster store, for an `estafeta_session::Engine`.
pub struct SessionStorage {
    store: Store,
    runtime: tokio::runtime::Handle,
    generation: u64,
}

impl SessionStorage {
    /// Open the storage on the current runtime: takes this node's start
    /// generation from the cluster-wide counter (each opening on any node
    /// gets a greater one). The schema must be migrated.
    pub async fn open(store: Store) -> Result<SessionStorage, Error> {
        let client = store.client().await?;
        let generation: i64 = client.query_one(NEXT_GENERATION, &[]).await?.get(0);
        Ok(SessionStorage {
            store,
            runtime: tokio::runtime::Handle::current(),
            generation: u64::try_from(generation).unwrap_or(0),
        })
    }

    fn run<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, StorageError> {
        self.runtime.block_on(f).map_err(storage_error)
    }
}

/// A store failure as the engine's error, with the original as its
/// source: unavailable (retry later) or failed, as
/// [`Error::is_unavailable`] tells.
fn storage_error(e: Error) -> StorageError {
    match e.is_unavailable() {
        true => StorageError::Unavailable(std::sync::Arc::new(e)),
        false => StorageError::Shared(std::sync::Arc::new(e)),
    }
}

/// What a `session::commit` failpoint returns: the store out of reach, as
/// a lost connection would leave it.
#[cfg(feature = "failpoints")]
fn injected(point: &str) -> Error {
    Error::Unavailable(format!("failure injected at {point}"))
}

/// Milliseconds as PostgreSQL's `bigint` (saturating: no real deadline is
/// past the year 292 million).
fn millis(t: Timestamp) -> i64 {
    i64::try_from(t.0).unwrap_or(i64::MAX)
}

impl Storage for SessionStorage {
    fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.run(async {
            let client = self.store.client().await?;
            let row = client.query_opt(LOAD, &[&key]).await?;
            Ok(row.and_then(|r| r.get(0)))
        })
    }

    fn write(&self, batch: &[Write]) -> Result<(), StorageError> {
        let generation = i64::try_from(self.generation).unwrap_or(i64::MAX);
        self.run(async {
            let mut client = self.store.client().await?;
            let tx = client.transaction().await?;
            for write in batch {
                match write {
                    Write::Put {
                        key,
                        record,
                        expires_at,
                    } => {
                        let expires_at = expires_at.map(millis);
                        tx.execute(PUT, &[key, record, &expires_at, &generation])
                            .await?;
                    }
                    Write::Delete { key } => {
                        tx.execute(DELETE, &[key]).await?;
                    }
                }
            }
            fail::fail_point!("session::commit", |_| Err(injected("session::commit")));
            tx.commit().await?;
            fail::fail_point!("session::committed");
            Ok(())
        })
    }

    fn deadlines(&self) -> Result<Vec<(Vec<u8>, Timestamp)>, StorageError> {
        self.run(async {
            let client = self.store.client().await?;
            let rows = client.query(DEADLINES, &[]).await?;
            Ok(rows
                .iter()
                .map(|r| {
                    let at: i64 = r.get(1);
                    (r.get(0), Timestamp(u64::try_from(at).unwrap_or(0)))
                })
                .collect())
        })
    }

    fn quarantine(&self, key: &[u8], reason: &str) -> Result<(), StorageError> {
        self.run(async {
            let mut client = self.store.client().await?;
            let tx = client.transaction().await?;
            tx.execute(QUARANTINE, &[&key, &reason]).await?;
            tx.execute(DELETE, &[&key]).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn quarantined(&self) -> Result<Vec<Vec<u8>>, StorageError> {
        self.run(async {
            let client = self.store.client().await?;
            let rows = client.query(QUARANTINED, &[]).await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn shared(&self) -> Option<&dyn Shared> {
        Some(self)
    }
}

impl Shared for SessionStorage {
    fn begin<'a>(&'a self, key: &'a [u8]) -> Pending<'a, Box<dyn Step>> {
        Box::pin(async move {
            let locked = self.store.lock(key).await.map_err(storage_error)?;
            Ok(Box::new(PgStep {
                joint: Joint::new(locked.registry()),
                locked: Some(locked),
            }) as Box<dyn Step>)
        })
    }

    fn due<'a>(
        &'a self,
        prefix: &'a [u8],
        now: Timestamp,
        limit: usize,
    ) -> Pending<'a, Vec<Vec<u8>>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Box::pin(async move {
            let due = async {
                let mut client = self.store.client().await?;
                let tx = client.transaction().await?;
                let rows = tx.query(DUE, &[&millis(now), &prefix, &limit]).await?;
                tx.commit().await?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            };
            due.await.map_err(storage_error)
        })
    }
}

/// A command's hold on one key: the key's row locked in an open
/// transaction ([`Locked`]), and the rows of other tables written in it
/// ([`Joint`]: an upload's message and key). A save commits them and the
/// record together and locks the row again at once, in the same round trip
/// and on the same connection. The save is done once
/// its commit is: when the lock cannot be taken again (the connection lost,
/// or another node took the key in between and changed its record), the
/// save still answers Ok — what it wrote is durable, and a caller told
/// otherwise would undo a change that was made — and the step holds the key
/// no more: a later save or a final write writes nothing and fails
/// ([`StorageError::Conflict`]).
pub(crate) struct PgStep {
    /// `None` once the key is not held (nothing more is written).
    pub(crate) locked: Option<Locked>,
    /// Rows to write with the next commit.
    pub(crate) joint: Joint,
}

impl PgStep {
    /// Write `joint`'s rows and `write` into the held transaction and
    /// commit it, all in one round trip; with `again`, a new step on the
    /// key begins in the same round trip (see [`Locked::finish_and_lock`]).
    async fn commit(
        locked: Locked,
        write: Option<&Write>,
        joint: &Joint,
        again: bool,
    ) -> Result<Option<Locked>, Error> {
        // Named points for the fault-injection harness: a crash before the
        // commit (the step's transaction rolled back, its lock released) or
        // an injected failure, and a crash after it (durable, but nobody
        // was told).
        fail::fail_point!("session::commit", |_| Err(injected("session::commit")));
        let save = match write {
            Some(Write::Put {
                record, expires_at, ..
            }) => Some((Some(record.as_slice()), expires_at.map(millis))),
            Some(Write::Delete { .. }) => Some((None, None)),
            None => None,
        };
        let next = match again {
            true => locked.finish_and_lock(joint, save).await?,
            false => locked.finish(joint, save).await.map(|()| None)?,
        };
        fail::fail_point!("session::committed");
        Ok(next)
    }
}

impl Step for PgStep {
    fn record(&self) -> Option<&[u8]> {
        self.locked.as_ref().and_then(Locked::record)
    }

    fn save<'a>(&'a mut self, write: &'a Write) -> Pending<'a, ()> {
        Box::pin(async move {
            let locked = self.locked.take().ok_or(StorageError::Conflict)?;
            let joint = std::mem::take(&mut self.joint);
            self.joint.registry = joint.registry;
            let again = PgStep::commit(locked, Some(write), &joint, true)
                .await
                .map_err(storage_error)?;
            let saved = match write {
                Write::Put { record, .. } => Some(record.as_slice()),
                Write::Delete { .. } => None,
            };
            self.locked = again.filter(|again| again.record() == saved);
            if let Some(again) = &self.locked {
                self.joint.registry = again.registry();
            }
            Ok(())
        })
    }

    fn held(&self) -> bool {
        self.locked.is_some()
    }

    fn abandon(&mut self) {
        // Dropped, the lock closes its connection: the server rolls the
        // transaction back and lets the key go.
        self.locked = None;
        self.joint = Joint::new(self.joint.registry);
    }

    fn put_beside(&mut self, write: Write, if_absent: bool) -> bool {
        if self.locked.is_none() {
            return false;
        }
        self.joint.put_session(write, if_absent);
        true
    }

    fn finish<'a>(mut self: Box<Self>, write: Option<&'a Write>) -> Pending<'a, ()> {
        Box::pin(async move {
            let Some(locked) = self.locked.take() else {
                return match write {
                    Some(_) => Err(StorageError::Conflict),
                    None => Ok(()),
                };
            };
            PgStep::commit(locked, write, &self.joint, false)
                .await
                .map(drop)
                .map_err(storage_error)
        })
    }

    /// The step itself: its [`Joint`] takes rows for the commit, and its
    /// open transaction runs statements whose answers the caller needs
    /// before the commit (see [`held`]).
    fn joint(&mut self) -> Option<&mut (dyn std::any::Any + Send + Sync)> {
        match self.locked {
            Some(_) => Some(self),
            None => None,
        }
    }
}

/// The joint of `step` if it is one of this crate's steps (a session
/// store's step of another kind carries no rows of these tables).
pub(crate) fn joint_of(step: &mut dyn estafeta_session::storage::Step) -> Option<&mut Joint> {
    Some(&mut step.joint()?.downcast_mut::<PgStep>()?.joint)
}

/// The open transaction of `step`, if it is one of this crate's steps and
/// still holds its key: statements run on it take effect with the step's
/// next commit, or not at all, and answer at once.
pub(crate) fn held(step: &mut dyn estafeta_session::storage::Step) -> Option<&Locked> {
    step.joint()?.downcast_mut::<PgStep>()?.locked.as_ref()
}
