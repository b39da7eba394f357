//! Exclusivity of a key's steps across the cluster: a row lock held for one
//! step's transaction.
//!
//! Within a node the session engine already runs one command per key at a
//! time; across nodes the lock is the key's row in `sessions`, locked with
//! `SELECT … FOR UPDATE` in the transaction that carries out the step. The
//! lock lives exactly as long as the transaction: commit or rollback ends
//! it, and so does the holder's connection closing (a node killed, a
//! network cut) or the server ending a session that sat idle in its
//! transaction past the hold limit (a paused node). A holder that lost its
//! lock cannot write afterwards: its writes belonged to the transaction the
//! server already rolled back, so there is no stale write to fence off.

use crate::joint::Joint;
use crate::{Error, Store};
use deadpool_postgres::Object;

/// Loads the key's record and locks its row until the transaction ends;
/// reads the registry's change counter on the way (the same statement: a
/// command that holds a step needs no round trip of its own to see whether
/// the registry changed).
/// It also gives the step's transaction its id (`pg_current_xact_id`),
/// by which a lost answer to its `COMMIT` is found out
/// (`Store::found_out`).
const SELECT_FOR_UPDATE: &str = "SELECT record,
    coalesce((SELECT value FROM cluster_counters WHERE name = 'registry'), 0),
    pg_current_xact_id()::text
    FROM sessions WHERE key = $1 FOR UPDATE";
/// Makes the key's row when the key has never been seen (its first step).
const INSERT_KEY: &str = "INSERT INTO sessions (key) VALUES ($1) ON CONFLICT (key) DO NOTHING";
const SAVE: &str = "UPDATE sessions SET record = $2, expires_at = $3 WHERE key = $1";
/// A key whose session ended goes whole: its row is only made again by
/// the key's next step.
const REMOVE: &str = "DELETE FROM sessions WHERE key = $1";

impl Store {
    /// Begin an exclusive step for `key`: wait until no other step (on any
    /// node) holds the key, then hold it until [`Locked::commit`] or until
    /// the [`Locked`] is dropped.
    ///
    /// `BEGIN` and the locking read travel together (pipelined), so taking
    /// the lock costs one round trip on a key seen before, two on a new one.
    pub async fn lock(&self, key: &[u8]) -> Result<Locked, Error> {
        let mut locked = Locked {
            client: Some(self.client().await?),
            store: self.clone(),
            key: key.to_vec(),
            record: None,
            registry: 0,
            xid: String::new(),
        };
        let client = locked.client();
        let select = client.prepare_cached(SELECT_FOR_UPDATE).await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&key];
        let (begun, row) = tokio::join!(
            client.batch_execute("BEGIN"),
            client.query_opt(&select, &params)
        );
        begun?;
        let row = match row? {
            Some(row) => row,
            // A key never seen: its row made, then locked, in one round
            // trip (the two statements travel together).
            None => {
                let insert = client.prepare_cached(INSERT_KEY).await?;
                let (inserted, row) = tokio::join!(
                    client.execute(&insert, &params),
                    client.query_one(&select, &params)
                );
                inserted?;
                row?
            }
        };
        locked.took(&row);
        Ok(locked)
    }
}

/// An exclusive step on one key: an open transaction holding the key's row
/// lock. Statements run through [`Locked::client`] belong to the step and
/// take effect together at [`Locked::commit`].
///
/// Dropped without a commit, the step's connection is closed rather than
/// returned to the pool: the server rolls the transaction back and releases
/// the lock, and nothing of the step remains.
pub struct Locked {
    client: Option<Object>,
    /// Where a lost answer to the step's `COMMIT` is looked up.
    store: Store,
    key: Vec<u8>,
    record: Option<Vec<u8>>,
    registry: u64,
    /// The step's transaction id.
    xid: String,
}

impl Locked {
    /// What the locking read answered: the record, the registry's counter
    /// and the transaction's id.
    fn took(&mut self, row: &tokio_postgres::Row) {
        self.record = row.get(0);
        self.registry = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
        self.xid = row.get(2);
    }

    /// The registry's change counter as the step began (read by the locking
    /// statement, once the lock was granted or before it was waited for:
    /// every registry change committed before the step asked for its lock
    /// is counted).
    pub fn registry(&self) -> u64 {
        self.registry
    }

    /// The key's stored record as the step began, if any.
    pub fn record(&self) -> Option<&[u8]> {
        self.record.as_deref()
    }

    /// The step's connection, inside its transaction.
    pub fn client(&self) -> &deadpool_postgres::ClientWrapper {
        self.client
            .as_ref()
            .expect("a Locked holds its connection until commit or drop")
    }

    /// Replace the key's record (and its deadline, in milliseconds since the
    /// Unix epoch) as part of the step.
    pub async fn save(&mut self, record: &[u8], expires_at: Option<i64>) -> Result<(), Error> {
        let client = self.client();
        let save = client.prepare_cached(SAVE).await?;
        client
            .execute(&save, &[&self.key, &record, &expires_at])
            .await?;
        self.record = Some(record.to_vec());
        Ok(())
    }

    /// Replace the key's record (`None`: remove it) and its deadline, and
    /// commit the step, in one round trip: the write and the `COMMIT`
    /// travel together (see [`Locked::save`] and [`Locked::commit`]). A
    /// write that fails, or that follows a statement of the step that
    /// failed, aborts the transaction, so the `COMMIT` rolls it back and the
    /// write's error is returned.
    pub async fn save_and_commit(
        self,
        record: Option<&[u8]>,
        expires_at: Option<i64>,
    ) -> Result<(), Error> {
        self.finish(&Joint::default(), Some((record, expires_at)))
            .await
    }

    /// Commit the step: every statement it ran takes effect at once, and the
    /// lock is released. When this returns `Ok`, the step is durable.
    ///
    /// A probe travels with the `COMMIT` (pipelined, no extra round trip):
    /// PostgreSQL answers a `COMMIT` of a transaction that an earlier failed
    /// statement aborted with a silent rollback, and the probe's error is
    /// what reveals it.
    pub async fn commit(self) -> Result<(), Error> {
        self.finish(&Joint::default(), None).await
    }

    /// Write `joint`'s rows, then the record's `save` if any (the record,
    /// `None` to remove it, and its deadline), then commit, all in one
    /// round trip: the statements and the `COMMIT` travel together. Any
    /// statement that fails aborts the transaction: the `COMMIT` rolls it
    /// back, nothing of the step remains, and the statement's error is
    /// returned. A write sent ahead of the `COMMIT` is also what reveals a
    /// transaction an earlier statement aborted (it fails then); with no
    /// write to send, the probe of [`Locked::commit`] goes instead.
    pub(crate) async fn finish(
        self,
        joint: &Joint,
        save: Option<(Option<&[u8]>, Option<i64>)>,
    ) -> Result<(), Error> {
        self.end(joint, save, false).await.map(drop)
    }

    /// As [`finish`](Self::finish), then, in the same round trip and on the
    /// same connection, a new step on the key: `BEGIN` and the locking
    /// read travel behind the `COMMIT`, so the lock is asked for once the
    /// commit is done. `Ok(None)`: the commit is durable but the new step
    /// could not begin (its connection is closed; the key is not held).
    pub(crate) async fn finish_and_lock(
        self,
        joint: &Joint,
        save: Option<(Option<&[u8]>, Option<i64>)>,
    ) -> Result<Option<Locked>, Error> {
        self.end(joint, save, true).await
    }

    async fn end(
        mut self,
        joint: &Joint,
        save: Option<(Option<&[u8]>, Option<i64>)>,
        again: bool,
    ) -> Result<Option<Locked>, Error> {
        match self.send_end(joint, save, again).await {
            Ok(next) => Ok(next),
            // A refusal rolled the transaction back; a failure of the
            // connection may have come after the `COMMIT` was made.
            Err(Ending::Refused(e)) => Err(e),
            Err(Ending::Lost(e)) => self.store.found_out(e, &self.xid).await.map(|()| None),
        }
    }

    /// The statements of [`end`](Self::end) and the `COMMIT`, sent
    /// together.
    async fn send_end(
        &mut self,
        joint: &Joint,
        save: Option<(Option<&[u8]>, Option<i64>)>,
        again: bool,
    ) -> Result<Option<Locked>, Ending> {
        let client = self.client();
        let prepared = joint.prepare(client).await.map_err(Ending::of)?;
        let statement = match save {
            Some((Some(_), _)) => Some(client.prepare_cached(SAVE).await.map_err(Ending::of)?),
            Some((None, _)) => Some(client.prepare_cached(REMOVE).await.map_err(Ending::of)?),
            None => None,
        };
        let select = match again {
            true => Some(
                client
                    .prepare_cached(SELECT_FOR_UPDATE)
                    .await
                    .map_err(Ending::of)?,
            ),
            false => None,
        };
        let key: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.key];
        let (joined, saved, probe, committed, relocked) = tokio::join!(
            joint.write(client, &prepared),
            async {
                match (&statement, save) {
                    (Some(statement), Some((Some(record), expires_at))) => {
                        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                            [&self.key, &record, &expires_at];
                        client.execute(statement, &params).await.map(drop)
                    }
                    (Some(statement), Some((None, _))) => {
                        client.execute(statement, &key).await.map(drop)
                    }
                    _ => Ok(()),
                }
            },
            async {
                match save.is_none() && prepared.is_empty() {
                    true => client.simple_query("SELECT 1").await.map(drop),
                    false => Ok(()),
                }
            },
            client.batch_execute("COMMIT"),
            async {
                match &select {
                    Some(select) => {
                        let (begun, row) = tokio::join!(
                            client.batch_execute("BEGIN"),
                            client.query_opt(select, &key)
                        );
                        begun.and(row).map(Some)
                    }
                    None => Ok(None),
                }
            }
        );
        // Any refusal among the answers rolled the transaction back, so it
        // tells more than a failed connection does.
        let mut lost = None;
        for answer in [
            joined,
            saved.map_err(Error::from),
            probe.map_err(Error::from),
        ] {
            match answer {
                Ok(()) => {}
                Err(e) if e.is_unavailable() => {
                    lost.get_or_insert(e);
                }
                Err(e) => return Err(Ending::Refused(e)),
            }
        }
        if let Some(e) = lost {
            return Err(Ending::Lost(e));
        }
        committed.map_err(Ending::of)?;
        match relocked {
            // The new step holds the key on the same connection.
            Ok(Some(Some(row))) => {
                self.took(&row);
                Ok(Some(self.taken()))
            }
            // Committed and nothing begun: the connection is clean and goes
            // back to the pool.
            Ok(None) => {
                self.client.take();
                Ok(None)
            }
            // Committed, the new step not begun (its row gone, or its
            // statements failed): dropped, its connection is closed.
            Ok(Some(None)) | Err(_) => Ok(None),
        }
    }

    /// This step's hold, moved out (its connection and key) for the new
    /// step that began on it; `self` is left empty.
    fn taken(&mut self) -> Locked {
        Locked {
            client: self.client.take(),
            store: self.store.clone(),
            key: std::mem::take(&mut self.key),
            record: self.record.take(),
            registry: self.registry,
            xid: std::mem::take(&mut self.xid),
        }
    }
}

/// Why a step's end failed: the server refused a statement (the
/// transaction rolled back), or the connection failed, maybe after the
/// `COMMIT` was made.
enum Ending {
    Refused(Error),
    Lost(Error),
}

impl Ending {
    fn of(e: impl Into<Error>) -> Ending {
        let e = e.into();
        match e.is_unavailable() {
            true => Ending::Lost(e),
            false => Ending::Refused(e),
        }
    }
}

impl std::fmt::Debug for Locked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locked")
            .field("key", &self.key)
            .field("record_len", &self.record.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            drop(Object::take(client));
        }
    }
}
