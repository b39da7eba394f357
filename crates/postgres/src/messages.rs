//! The exchange's message store (`estafeta_exchange::store::MessageStore`)
//! over the `messages` table: one row per message, body included, its
//! place given by `owner` and `place`.
//!
//! A batch of ops ([`MessageStore::apply`]) is one transaction: all of it
//! or none. Each op is still idempotent, because the exchange records a
//! step's batch before running it and runs it again after a crash: a move
//! whose message is already in its target is `AlreadyDone`, a delete whose
//! message is gone likewise, and a message in none of an op's places is
//! `NotFound`. Moves with the same source and target are one `UPDATE` of
//! all their ids, so a commit of 100 messages is a few statements.
//!
//! A message scheduled for its `deliver_at` ([`Op::Schedule`] with a
//! time still to come) becomes an entry of the repeat scheduler's table
//! (`repeat_entries`, see [`PgSchedule`](crate::PgSchedule)), exactly the
//! entry the exchange's scheduler makes for an upload due later, written in
//! the batch's transaction; the scheduler delivers both the same way.
//!
//! Nothing is left half-done by a crash, so [`MessageStore::recover_writes`]
//! has nothing to do. A prepare's replies are stored apart from the step
//! that names them, though: a node that lost the database's key while
//! storing them, after another node rolled the process back, leaves rows
//! in `Prepared` that no process names, which [`MessageStore::orphans`]
//! finds.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Display;
use std::sync::Arc;

use estafeta_exchange::error::MailboxError;
use estafeta_exchange::store::{
    Applied, FileEntry, FileName, Filter, Folder, Limits, Location, MailboxKind, MessageReads,
    MessageSteps, MessageUpkeep, Op, Outcome, RawArray, Tallies, scheduled_entry, take_within,
};
use estafeta_exchange::wire::Message;
use estafeta_exchange::{Id, MessageId, Timestamp};
use estafeta_session::Clock;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::closing::Closing;
use crate::{Error, Store};

/// The columns a [`FileEntry`] is made of, in [`entry`]'s order.
const ENTRY: &str = "id, created_at, sender, recipient, subsystem, size";

pub(crate) const SELECT: &str =
    "SELECT id, created_at, sender, recipient, subsystem, size FROM messages
    WHERE owner = $1 AND place = $2
      AND ($3::text[] IS NULL OR subsystem = ANY($3))
      AND ($4::text[] IS NULL OR sender = ANY($4))
    ORDER BY created_at, id LIMIT $5";
/// Moves messages of one place to another (a device's acknowledgement).
/// Found by primary key: see [`MOVE`] on `IS NOT DISTINCT FROM`.
const MOVE_ALL_OF: &str = "UPDATE messages SET owner = $4, place = $5
    WHERE id = ANY($1) AND (owner, place) IS NOT DISTINCT FROM ($2, $3) RETURNING id";
/// The oldest messages of a place, with their bodies.
const OLDEST_BODIES: &str =
    "SELECT id, created_at, sender, recipient, subsystem, size, body FROM messages
    WHERE owner = $1 AND place = $2 ORDER BY created_at, id LIMIT $3";
const BODIES: &str = "SELECT id, body FROM messages
    WHERE id = ANY($1) AND (owner, place) IS NOT DISTINCT FROM ($2, $3)";
/// Every move of a batch in one statement (each column an array, one
/// element per move): per move, its place in the arrays (from 1), whether
/// it moved, and whether its message was already in its target before the
/// statement (a data-modifying `WITH` and the query around it read the
/// same snapshot). Each read finds the batch's rows by primary key
/// (`id = ANY($1)`), so its cost does not grow with the folders: a probe of
/// the folder index per move would walk its folder's entries (live, and
/// dead ones until a vacuum). A row's owner and place are compared with
/// `IS NOT DISTINCT FROM`, which no index can serve, so that no plan
/// (a generic one made without statistics included) takes that probe;
/// both columns are `NOT NULL`, where it means `=`.
pub(crate) const MOVE: &str = "WITH v AS (
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
            WITH ORDINALITY AS v(id, from_owner, from_place, to_owner, to_place, n)),
    was AS (
        SELECT id, owner, place FROM messages WHERE id = ANY($1::text[])),
    gone AS (
        SELECT v.id FROM v
        WHERE NOT EXISTS (SELECT 1 FROM message_owners o WHERE o.id = v.to_owner)),
    dropped AS (
        DELETE FROM messages m USING v
        WHERE m.id = ANY($1::text[]) AND m.id = v.id
            AND (m.owner, m.place) IS NOT DISTINCT FROM (v.from_owner, v.from_place)
            AND v.id IN (SELECT id FROM gone)
        RETURNING m.id),
    moved AS (
        UPDATE messages m SET owner = v.to_owner, place = v.to_place FROM v
        WHERE m.id = ANY($1::text[]) AND m.id = v.id
            AND (m.owner, m.place) IS NOT DISTINCT FROM (v.from_owner, v.from_place)
            AND v.id NOT IN (SELECT id FROM gone)
        RETURNING m.id)
    SELECT v.n, moved.id IS NOT NULL OR dropped.id IS NOT NULL,
        coalesce(was.owner = v.to_owner AND was.place = v.to_place, false)
            OR (was.id IS NULL AND v.id IN (SELECT id FROM gone)),
        v.id IN (SELECT id FROM gone)
    FROM v LEFT JOIN moved ON moved.id = v.id LEFT JOIN dropped ON dropped.id = v.id
        LEFT JOIN was ON was.id = v.id";
const DELETE: &str = "DELETE FROM messages
    WHERE id = ANY($1) AND (owner, place) IS NOT DISTINCT FROM ($2, $3) RETURNING id";
const TAKE: &str =
    "DELETE FROM messages WHERE id = $1 AND owner = $2 AND place = $3 RETURNING body";
const DELIVER_NOW: &str = "UPDATE messages SET owner = recipient, place = 'Messages'
    WHERE id = $1 AND owner = $2 AND place = $3 RETURNING recipient";
/// Whether a mailbox is held (not removed).
const OWNED: &str = "SELECT EXISTS (SELECT 1 FROM message_owners WHERE id = $1)";
/// Schedules a message for its recipient `$6` (see
/// [`PUT_ENTRY`](crate::schedule::PUT_ENTRY)): removed with the recipient.
const SCHEDULE: &str = "INSERT INTO repeat_entries (id, source, due, attempt, payload, owner)
    VALUES ($1, $2, $3, $4, $5, $6)
    ON CONFLICT (id) DO UPDATE SET source = EXCLUDED.source, due = EXCLUDED.due,
        attempt = EXCLUDED.attempt, payload = EXCLUDED.payload, owner = EXCLUDED.owner";
/// Whether the message `$1` for `$2`, which a batch schedules and which is
/// no longer where the batch takes it from, is where an earlier run of the
/// batch put it: waiting in the scheduler, or delivered (the scheduler
/// writes a due message into its recipient's `Messages` before it removes
/// the entry, so one of the two holds it throughout).
const SCHEDULED_BEFORE: &str = "SELECT EXISTS (SELECT 1 FROM repeat_entries WHERE id = $1)
    OR EXISTS (SELECT 1 FROM messages WHERE id = $1 AND owner = $2
        AND place IN ('Messages', 'Log', 'Unknown', 'Error'))";
const MAKE_OWNERS: &str =
    "INSERT INTO message_owners (id) SELECT * FROM unnest($1::text[]) ON CONFLICT DO NOTHING";
/// Removes a mailbox, its messages and those scheduled for it (the
/// foreign keys cascade), counting them first.
const REMOVE_OWNER: &str = "WITH held AS (
        SELECT (SELECT count(*) FROM messages WHERE owner = $1)
            + (SELECT count(*) FROM repeat_entries WHERE owner = $1) AS n),
    removed AS (DELETE FROM message_owners WHERE id = $1)
    SELECT n FROM held";

/// The messages of every database and device, in the cluster store.
/// Cheap to clone.
#[derive(Clone)]
pub struct PgMessages {
    store: Store,
    /// Tells whether an [`Op::Schedule`]'s time has come.
    clock: Arc<dyn Clock>,
}

impl PgMessages {
    /// The message store over `store` (migrated), on the system clock.
    pub fn new(store: Store) -> PgMessages {
        PgMessages::with_clock(store, Arc::new(estafeta_session::SystemClock))
    }

    /// The message store over `store`, deciding on `clock` (the exchange's)
    /// whether a scheduled message is due at once.
    pub fn with_clock(store: Store, clock: Arc<dyn Clock>) -> PgMessages {
        PgMessages { store, clock }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_millis(i64::try_from(self.clock.now().0).unwrap_or(i64::MAX))
    }

    async fn client(&self, at: impl Display) -> Result<deadpool_postgres::Object, MailboxError> {
        self.store.client().await.map_err(|e| failed(at, e))
    }

    /// The rows of `sql` (whose first two parameters are `at`'s mailbox and
    /// folder) as entries.
    async fn entries(
        &self,
        at: &Location,
        sql: &str,
        more: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let client = self.client(at).await?;
        let (owner, place) = (at.mailbox.as_str(), at.folder.as_str());
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&owner, &place];
        params.extend_from_slice(more);
        let statement = client
            .prepare_cached(sql)
            .await
            .map_err(|e| failed(at, e))?;
        let rows = client
            .query(&statement, &params)
            .await
            .map_err(|e| failed(at, e))?;
        rows.iter().map(|r| entry(at, r)).collect()
    }

    async fn insert(
        &self,
        at: &Location,
        messages: &[Message],
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let bytes = messages
            .iter()
            .map(Message::to_file_bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(MailboxError::Serialize)?;
        let column = |f: fn(&Message) -> String| messages.iter().map(f).collect::<Vec<_>>();
        let ids = column(|m| m.id.to_string());
        let owners = vec![at.mailbox.as_str(); messages.len()];
        let places = vec![at.folder.as_str(); messages.len()];
        let senders = column(|m| m.from.to_string());
        let recipients = column(|m| m.to.to_string());
        let subsystems = column(|m| m.subsystem.to_string());
        let created: Vec<i64> = messages.iter().map(|m| m.created_at.as_millis()).collect();
        let sizes: Vec<i64> = bytes.iter().map(|b| b.len() as i64).collect();
        let client = self.client(at).await?;
        let insert = client
            .prepare_cached(crate::joint::INSERT_MESSAGES)
            .await
            .map_err(|e| failed(at, e))?;
        client
            .execute(
                &insert,
                &[
                    &ids,
                    &owners,
                    &places,
                    &senders,
                    &recipients,
                    &subsystems,
                    &created,
                    &sizes,
                    &bytes,
                ],
            )
            .await
            .map_err(|e| refused_or_failed(&at.mailbox, e))?;
        Ok(messages
            .iter()
            .zip(&bytes)
            .map(|(m, b)| FileEntry {
                name: FileName::of(m),
                size: b.len() as u64,
            })
            .collect())
    }

    /// The batch in one transaction of its own: moves first (one statement
    /// for all), then schedules, then deletes (one statement per place),
    /// the order the file store keeps. A batch of moves only is one round
    /// trip: `BEGIN`, the moves and `COMMIT` travel together.
    async fn apply_all(
        &self,
        ops: &[Op],
        results: &mut [Option<Result<Outcome, MailboxError>>],
        arrivals: &mut BTreeSet<Id>,
    ) -> Result<(), Error> {
        if ops.iter().all(|op| matches!(op, Op::Move { .. })) {
            return self.move_all(ops, results, arrivals).await;
        }
        let client = Closing::new(self.store.client().await?);
        let on = client.get();
        on.batch_execute("BEGIN").await?;
        self.run_batch(on, ops, results, arrivals).await?;
        client.commit().await
    }

    /// The batch in the transaction of `step`, the step a command holds
    /// (see [`MessageStore::apply`]), inside a savepoint: a statement the
    /// server refuses undoes the batch and leaves the step's transaction
    /// usable. A failed connection fails the step (it lost its key).
    async fn apply_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        ops: &[Op],
        results: &mut [Option<Result<Outcome, MailboxError>>],
        arrivals: &mut BTreeSet<Id>,
    ) -> Result<(), Error> {
        let Some(locked) = crate::session_storage::held(step) else {
            return Err(Error::Unavailable(
                "the step no longer holds its key".into(),
            ));
        };
        let on = locked.client();
        let (saved, ran) = tokio::join!(
            on.batch_execute("SAVEPOINT batch"),
            self.run_batch(on, ops, results, arrivals)
        );
        let ran = saved.map_err(Error::from).and(ran);
        if let Err(e) = &ran
            && !e.is_unavailable()
        {
            on.batch_execute("ROLLBACK TO SAVEPOINT batch").await?;
        }
        ran
    }

    /// The statements of a batch on `on`, inside a transaction the caller
    /// began.
    async fn run_batch(
        &self,
        on: &deadpool_postgres::ClientWrapper,
        ops: &[Op],
        results: &mut [Option<Result<Outcome, MailboxError>>],
        arrivals: &mut BTreeSet<Id>,
    ) -> Result<(), Error> {
        let moves = Moves::of(ops);
        if !moves.is_empty() {
            let statement = on.prepare_cached(MOVE).await?;
            let rows = on.query(&statement, &moves.params()).await?;
            moves.outcomes(ops, &rows, results, arrivals);
        }
        let now = self.now();
        for (i, op) in ops.iter().enumerate() {
            let Op::Schedule { name, from, until } = op else {
                continue;
            };
            let (owner, place) = loc(from);
            let id = name.id.to_string();
            let to = Location::new(name.to.clone(), Folder::Messages);
            let owned: bool = on
                .query_one(&on.prepare_cached(OWNED).await?, &[&name.to.as_str()])
                .await?
                .get(0);
            // The message taken from `from`: `None` if it is not there.
            let taken = if !owned {
                // For a removed mailbox: the message goes.
                let deleted = on
                    .execute(
                        &on.prepare_cached(DELETE).await?,
                        &[&vec![id.clone()], &owner, &place],
                    )
                    .await?;
                Some(match deleted {
                    0 => Outcome::AlreadyDone,
                    _ => Outcome::Done,
                })
            } else if *until > now {
                match on
                    .query_opt(&on.prepare_cached(TAKE).await?, &[&id, &owner, &place])
                    .await?
                {
                    Some(row) => {
                        let entry = scheduled_entry(name.id, row.get(0), *until);
                        let due = crate::schedule::to_sql(entry.due);
                        let attempt = crate::schedule::attempt_to_sql(entry.attempt);
                        on.execute(
                            &on.prepare_cached(SCHEDULE).await?,
                            &[
                                &entry.id,
                                &entry.source,
                                &due,
                                &attempt,
                                &entry.payload,
                                &name.to.as_str(),
                            ],
                        )
                        .await?;
                        Some(Outcome::Done)
                    }
                    None => None,
                }
            } else {
                match on
                    .query_opt(
                        &on.prepare_cached(DELIVER_NOW).await?,
                        &[&id, &owner, &place],
                    )
                    .await?
                {
                    Some(_) => {
                        arrivals.insert(name.to.clone());
                        Some(Outcome::Done)
                    }
                    None => None,
                }
            };
            let outcome = match taken {
                Some(taken) => Ok(taken),
                None => {
                    let before: bool = on
                        .query_one(
                            &on.prepare_cached(SCHEDULED_BEFORE).await?,
                            &[&id, &name.to.as_str()],
                        )
                        .await?
                        .get(0);
                    match before {
                        true => Ok(Outcome::AlreadyDone),
                        false => Err(not_found(op, from, &to)),
                    }
                }
            };
            results[i] = Some(outcome);
        }
        let mut deletes: Vec<(&Location, Vec<usize>)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if let Op::Delete { at, .. } = op {
                group(&mut deletes, at, i);
            }
        }
        let id_of = |i: usize| match &ops[i] {
            Op::Move { name, .. } | Op::Delete { name, .. } | Op::Schedule { name, .. } => {
                name.id.to_string()
            }
        };
        for (at, indexes) in deletes {
            let ids: Vec<String> = indexes.iter().map(|&i| id_of(i)).collect();
            let rows = on
                .query(
                    &on.prepare_cached(DELETE).await?,
                    &[&ids, &loc(at).0, &loc(at).1],
                )
                .await?;
            let deleted: HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
            for (&i, id) in indexes.iter().zip(&ids) {
                let outcome = if deleted.contains(id) {
                    Outcome::Done
                } else {
                    Outcome::AlreadyDone
                };
                results[i] = Some(Ok(outcome));
            }
        }
        Ok(())
    }

    /// A batch of moves only, in one transaction and one round trip.
    async fn move_all(
        &self,
        ops: &[Op],
        results: &mut [Option<Result<Outcome, MailboxError>>],
        arrivals: &mut BTreeSet<Id>,
    ) -> Result<(), Error> {
        let moves = Moves::of(ops);
        if moves.is_empty() {
            return Ok(());
        }
        let client = Closing::new(self.store.client().await?);
        let on = client.get();
        let statement = on.prepare_cached(MOVE).await?;
        let params = moves.params();
        let (begun, rows, committed) = tokio::join!(
            on.batch_execute("BEGIN"),
            on.query(&statement, &params),
            on.batch_execute("COMMIT")
        );
        begun?;
        // A failed move aborted the transaction: its `COMMIT` rolled back.
        let rows = rows?;
        committed?;
        client.keep();
        moves.outcomes(ops, &rows, results, arrivals);
        Ok(())
    }

    /// The `n` oldest messages of `at` as one JSON array (one index range
    /// read, names and bodies together), and with `registry` the registry's
    /// change counter, read in the same round trip.
    async fn read_oldest(
        &self,
        at: &Location,
        n: usize,
        registry: bool,
    ) -> Result<(RawArray, Option<u64>), MailboxError> {
        let max = i64::try_from(n).unwrap_or(i64::MAX);
        let client = self.client(at).await?;
        let statement = client
            .prepare_cached(OLDEST_BODIES)
            .await
            .map_err(|e| failed(at, e))?;
        let version = match registry {
            true => Some(
                client
                    .prepare_cached(crate::registry::VERSION)
                    .await
                    .map_err(|e| failed(at, e))?,
            ),
            false => None,
        };
        let (owner, place) = loc(at);
        let params: [&(dyn ToSql + Sync); 3] = [&owner, &place, &max];
        let (counter, rows) = tokio::join!(
            async {
                match &version {
                    Some(version) => client.query_one(version, &[]).await.map(Some),
                    None => Ok(None),
                }
            },
            client.query(&statement, &params)
        );
        let rows = rows.map_err(|e| failed(at, e))?;
        let counter = counter
            .map_err(|e| failed(at, e))?
            .map(|row| u64::try_from(row.get::<_, i64>(0)).unwrap_or(0));
        let mut json = Vec::with_capacity(2 + rows.len() * 256);
        let mut names = Vec::with_capacity(rows.len());
        json.push(b'[');
        for row in &rows {
            let name = entry(at, row)?.name;
            let body: &[u8] = row.get(6);
            if body.first() != Some(&b'{') || body.last() != Some(&b'}') {
                return Err(MailboxError::Corrupt(
                    format!("postgres:{at}/{name}").into(),
                ));
            }
            if !names.is_empty() {
                json.push(b',');
            }
            json.extend_from_slice(body);
            names.push(name);
        }
        json.push(b']');
        Ok((RawArray { json, names }, counter))
    }
}

/// The moves of a batch as the columns of [`MOVE`], and which op each is.
struct Moves<'a> {
    indexes: Vec<usize>,
    ids: Vec<String>,
    from_owners: Vec<&'a str>,
    from_places: Vec<&'static str>,
    to_owners: Vec<&'a str>,
    to_places: Vec<&'static str>,
}

impl<'a> Moves<'a> {
    fn of(ops: &'a [Op]) -> Moves<'a> {
        let mut m = Moves {
            indexes: Vec::new(),
            ids: Vec::new(),
            from_owners: Vec::new(),
            from_places: Vec::new(),
            to_owners: Vec::new(),
            to_places: Vec::new(),
        };
        for (i, op) in ops.iter().enumerate() {
            if let Op::Move { name, from, to } = op {
                m.indexes.push(i);
                m.ids.push(name.id.to_string());
                m.from_owners.push(loc(from).0);
                m.from_places.push(loc(from).1);
                m.to_owners.push(loc(to).0);
                m.to_places.push(loc(to).1);
            }
        }
        m
    }

    fn is_empty(&self) -> bool {
        self.indexes.is_empty()
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.ids,
            &self.from_owners,
            &self.from_places,
            &self.to_owners,
            &self.to_places,
        ]
    }

    /// Each move's outcome from [`MOVE`]'s `rows`: moved (or deleted, its
    /// target removed), already in its target, or in neither place; the
    /// recipients whose `Messages` received (or already held) a message go
    /// to `arrivals`.
    fn outcomes(
        &self,
        ops: &[Op],
        rows: &[Row],
        results: &mut [Option<Result<Outcome, MailboxError>>],
        arrivals: &mut BTreeSet<Id>,
    ) {
        for row in rows {
            let n: i64 = row.get(0);
            let Some(&i) = usize::try_from(n - 1)
                .ok()
                .and_then(|n| self.indexes.get(n))
            else {
                continue;
            };
            let Op::Move { from, to, .. } = &ops[i] else {
                continue;
            };
            let outcome = match (row.get::<_, bool>(1), row.get::<_, bool>(2)) {
                (true, _) => Ok(Outcome::Done),
                (false, true) => Ok(Outcome::AlreadyDone),
                (false, false) => Err(not_found(&ops[i], from, to)),
            };
            let discarded: bool = row.get(3);
            if outcome.is_ok() && to.folder == Folder::Messages && !discarded {
                arrivals.insert(to.mailbox.clone());
            }
            results[i] = Some(outcome);
        }
    }
}

/// Adds op `i` to the group of `key`, made if it is the first.
fn group<K: PartialEq>(groups: &mut Vec<(K, Vec<usize>)>, key: K, i: usize) {
    match groups.iter_mut().find(|(k, _)| *k == key) {
        Some((_, members)) => members.push(i),
        None => groups.push((key, vec![i])),
    }
}

/// A location as its two columns.
fn loc(at: &Location) -> (&str, &'static str) {
    (at.mailbox.as_str(), at.folder.as_str())
}

/// A store failure as the exchange's storage error, naming where it
/// happened: unavailable (retry later) or failed, as
/// [`Error::is_unavailable`] tells.
fn failed(at: impl Display, e: impl Into<Error>) -> MailboxError {
    let e = e.into();
    let unavailable = e.is_unavailable();
    MailboxError::store(format!("postgres:{at}"), e, unavailable)
}

/// A write for `owner` refused because the mailbox was removed (the
/// foreign key to `message_owners` found no row) as
/// [`MailboxError::NoMailbox`]; any other failure as [`failed`].
fn refused_or_failed(owner: &Id, e: tokio_postgres::Error) -> MailboxError {
    match e.code() {
        Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION) => {
            MailboxError::NoMailbox(owner.clone())
        }
        _ => failed(owner, e),
    }
}

fn not_found(op: &Op, from: &Location, to: &Location) -> MailboxError {
    let name = match op {
        Op::Move { name, .. } | Op::Delete { name, .. } | Op::Schedule { name, .. } => name,
    };
    MailboxError::NotFound {
        name: name.to_string(),
        from: format!("postgres:{from}").into(),
        to: format!("postgres:{to}").into(),
    }
}

/// A row of [`ENTRY`]'s columns as an entry; a row that does not make a
/// valid name (written by hand) is an error, not a panic.
fn entry(at: &Location, row: &Row) -> Result<FileEntry, MailboxError> {
    let corrupt = || MailboxError::Corrupt(format!("postgres:{at}").into());
    let id: &str = row.get(0);
    let name = FileName {
        id: id.parse().map_err(|_| corrupt())?,
        created_at: Timestamp::from_millis(row.get(1)),
        from: Id::new(row.get::<_, &str>(2)).map_err(|_| corrupt())?,
        to: Id::new(row.get::<_, &str>(3)).map_err(|_| corrupt())?,
        subsystem: Id::new(row.get::<_, &str>(4)).map_err(|_| corrupt())?,
    };
    let size: i64 = row.get(5);
    Ok(FileEntry {
        name,
        size: u64::try_from(size).map_err(|_| corrupt())?,
    })
}

fn texts(set: &Option<HashSet<Id>>) -> Option<Vec<&str>> {
    set.as_ref().map(|s| s.iter().map(Id::as_str).collect())
}

/// The smallest id of a message that arrived at `t` (ids are ULIDs, whose
/// text sorts by arrival time first).
fn first_id_at(t: Timestamp) -> String {
    MessageId::from_parts(u64::try_from(t.as_millis()).unwrap_or(0), 0).to_string()
}

#[async_trait::async_trait]
impl MessageSteps for PgMessages {
    /// An entry of the repeat scheduler's table for its recipient, which
    /// whichever node polls first delivers at its time.
    async fn schedule(&self, message: &Message, until: Timestamp) -> Result<(), MailboxError> {
        let bytes = message.to_file_bytes().map_err(MailboxError::Serialize)?;
        let entry = scheduled_entry(message.id, bytes, until);
        let to = message.to.as_str();
        let client = self.client(to).await?;
        let statement = client
            .prepare_cached(SCHEDULE)
            .await
            .map_err(|e| failed(to, e))?;
        let (due, attempt) = (
            crate::schedule::to_sql(entry.due),
            crate::schedule::attempt_to_sql(entry.attempt),
        );
        client
            .execute(
                &statement,
                &[
                    &entry.id,
                    &entry.source,
                    &due,
                    &attempt,
                    &entry.payload,
                    &to,
                ],
            )
            .await
            .map(drop)
            .map_err(|e| refused_or_failed(&message.to, e))
    }

    /// A message whose id is stored already stays where it is (a delivery
    /// repeated by another node finds the first one's message): one
    /// message per id.
    async fn put(&self, at: &Location, message: &Message) -> Result<FileEntry, MailboxError> {
        let mut entries = self.insert(at, std::slice::from_ref(message)).await?;
        // One entry per message given.
        Ok(entries.swap_remove(0))
    }

    /// A row of the step's joint (its rows of this crate's tables), inserted with
    /// the step's commit (one message per id, as [`put`](Self::put)).
    fn put_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        at: &Location,
        message: &Message,
    ) -> Result<Option<FileEntry>, MailboxError> {
        let Some(joint) = crate::session_storage::joint_of(step) else {
            return Ok(None);
        };
        let bytes = message.to_file_bytes().map_err(MailboxError::Serialize)?;
        let entry = FileEntry {
            name: FileName::of(message),
            size: bytes.len() as u64,
        };
        joint.put_message(at, message, bytes);
        Ok(Some(entry))
    }

    /// Rows of the step's joint, as [`put_in_step`](Self::put_in_step).
    fn put_all_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        at: &Location,
        messages: &[Message],
    ) -> Result<Option<Vec<FileEntry>>, MailboxError> {
        let Some(joint) = crate::session_storage::joint_of(step) else {
            return Ok(None);
        };
        let mut entries = Vec::with_capacity(messages.len());
        for message in messages {
            let bytes = message.to_file_bytes().map_err(MailboxError::Serialize)?;
            entries.push(FileEntry {
                name: FileName::of(message),
                size: bytes.len() as u64,
            });
            joint.put_message(at, message, bytes);
        }
        Ok(Some(entries))
    }

    /// One statement, all or none, sent once the go-ahead came: a row
    /// appears only when it is committed, so there is no write to overlap
    /// with the caller's step.
    async fn put_all(
        &self,
        at: &Location,
        messages: &[Message],
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        match when.await {
            Ok(true) => self.insert(at, messages).await,
            _ => Ok(Vec::new()),
        }
    }

    /// In `step`'s transaction when it is one of this store's steps that
    /// holds its key (fenced by that key's lock); without a step, in a
    /// transaction of its own. A step that no longer holds its key (or is
    /// not this store's) writes nothing: its command's view may be stale,
    /// and a write outside the step would escape the fence.
    async fn apply(
        &self,
        step: Option<&mut dyn estafeta_session::storage::Step>,
        ops: &[Op],
    ) -> Applied {
        let mut results: Vec<Option<Result<Outcome, MailboxError>>> =
            ops.iter().map(|_| None).collect();
        let mut arrivals = BTreeSet::new();
        let done = match step {
            Some(step) => {
                let done = self
                    .apply_in_step(step, ops, &mut results, &mut arrivals)
                    .await;
                if done.as_ref().is_err_and(Error::is_unavailable) {
                    step.abandon();
                }
                done
            }
            _ => self.apply_all(ops, &mut results, &mut arrivals).await,
        };
        if let Err(e) = done {
            // Rolled back: nothing of the batch happened.
            let (text, unavailable) = (e.to_string(), e.is_unavailable());
            return Applied {
                results: ops
                    .iter()
                    .map(|_| {
                        Err(MailboxError::store(
                            "postgres:batch",
                            text.clone(),
                            unavailable,
                        ))
                    })
                    .collect(),
                arrivals: BTreeSet::new(),
            };
        }
        Applied {
            results: results.into_iter().flatten().collect(),
            arrivals,
        }
    }

    async fn delete_all(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Vec<Result<Outcome, MailboxError>> {
        let ops: Vec<Op> = names
            .iter()
            .map(|name| Op::Delete {
                name: name.clone(),
                at: at.clone(),
            })
            .collect();
        self.apply(None, &ops).await.results
    }

    /// One `UPDATE` in the step's transaction.
    async fn move_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        from: &Location,
        to: &Location,
        ids: &HashSet<MessageId>,
    ) -> Result<Option<Vec<MessageId>>, MailboxError> {
        let Some(locked) = crate::session_storage::held(step) else {
            return Ok(None);
        };
        let client = locked.client();
        let ids: Vec<String> = ids.iter().map(MessageId::to_string).collect();
        let statement = client
            .prepare_cached(MOVE_ALL_OF)
            .await
            .map_err(|e| failed(from, e))?;
        let rows = client
            .query(
                &statement,
                &[&ids, &loc(from).0, &loc(from).1, &loc(to).0, &loc(to).1],
            )
            .await
            .map_err(|e| failed(from, e))?;
        rows.iter()
            .map(|r| {
                r.get::<_, &str>(0)
                    .parse()
                    .map_err(|_| MailboxError::Corrupt(format!("postgres:{from}").into()))
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

#[async_trait::async_trait]
impl MessageReads for PgMessages {
    /// One range scan of `messages_folder` that stops after
    /// `limits.max_files` rows; the byte limit is applied to those.
    async fn select(
        &self,
        at: &Location,
        filter: &Filter,
        limits: Limits,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let subsystems = texts(&filter.subsystems);
        let senders = texts(&filter.senders);
        let max = i64::try_from(limits.max_files).unwrap_or(i64::MAX);
        let rows = self
            .entries(at, SELECT, &[&subsystems, &senders, &max])
            .await?;
        let taken = take_within(rows, |e| Some(e.size), limits);
        Ok(taken.into_iter().map(|(e, _)| e).collect())
    }

    async fn read_array(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Result<RawArray, MailboxError> {
        let ids: Vec<String> = names.iter().map(|n| n.id.to_string()).collect();
        let client = self.client(at).await?;
        let bodies = client
            .prepare_cached(BODIES)
            .await
            .map_err(|e| failed(at, e))?;
        let rows = client
            .query(&bodies, &[&ids, &loc(at).0, &loc(at).1])
            .await
            .map_err(|e| failed(at, e))?;
        let mut bodies: HashMap<String, Vec<u8>> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let mut json = Vec::with_capacity(2 + names.len() * 256);
        let mut included = Vec::with_capacity(names.len());
        json.push(b'[');
        for (name, id) in names.iter().zip(&ids) {
            let Some(body) = bodies.remove(id) else {
                continue;
            };
            if body.first() != Some(&b'{') || body.last() != Some(&b'}') {
                return Err(MailboxError::Corrupt(
                    format!("postgres:{at}/{name}").into(),
                ));
            }
            if !included.is_empty() {
                json.push(b',');
            }
            json.extend_from_slice(&body);
            included.push(name.clone());
        }
        json.push(b']');
        Ok(RawArray {
            json,
            names: included,
        })
    }

    async fn count(&self, at: &Location) -> Result<usize, MailboxError> {
        let client = self.client(at).await?;
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM messages WHERE owner = $1 AND place = $2",
                &[&loc(at).0, &loc(at).1],
            )
            .await
            .map_err(|e| failed(at, e))?
            .get(0);
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    async fn oldest(&self, at: &Location, n: usize) -> Result<Vec<FileName>, MailboxError> {
        let max = i64::try_from(n).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {ENTRY} FROM messages WHERE owner = $1 AND place = $2
             ORDER BY created_at, id LIMIT $3"
        );
        let entries = self.entries(at, &sql, &[&max]).await?;
        Ok(entries.into_iter().map(|e| e.name).collect())
    }

    /// One index range read, names and bodies together.
    async fn oldest_array(&self, at: &Location, n: usize) -> Result<RawArray, MailboxError> {
        self.read_oldest(at, n, false).await.map(|(raw, _)| raw)
    }

    /// The read of [`oldest_array`](Self::oldest_array) and the registry's
    /// counter travel together on one connection: one round trip.
    async fn oldest_array_and_registry(
        &self,
        at: &Location,
        n: usize,
    ) -> Result<(RawArray, Option<u64>), MailboxError> {
        self.read_oldest(at, n, true).await
    }

    async fn find(&self, at: &Location, id: MessageId) -> Result<Option<FileName>, MailboxError> {
        let sql =
            format!("SELECT {ENTRY} FROM messages WHERE owner = $1 AND place = $2 AND id = $3");
        let entries = self.entries(at, &sql, &[&id.to_string()]).await?;
        Ok(entries.into_iter().next().map(|e| e.name))
    }

    async fn find_all(
        &self,
        at: &Location,
        ids: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError> {
        let ids: Vec<String> = ids.iter().map(MessageId::to_string).collect();
        let sql = format!(
            "SELECT {ENTRY} FROM messages WHERE owner = $1 AND place = $2 AND id = ANY($3)
             ORDER BY created_at, id"
        );
        let entries = self.entries(at, &sql, &[&ids]).await?;
        Ok(entries.into_iter().map(|e| e.name).collect())
    }

    async fn delivered(&self, name: &FileName) -> Result<bool, MailboxError> {
        let client = self.client(name).await?;
        let row = client
            .query_opt(
                "SELECT 1 FROM messages WHERE id = $1 AND owner = $2
                   AND place IN ('Messages', 'Log', 'Unknown', 'Error')",
                &[&name.id.to_string(), &name.to.as_str()],
            )
            .await
            .map_err(|e| failed(name, e))?;
        Ok(row.is_some())
    }

    async fn list(&self, at: &Location) -> Result<Vec<FileEntry>, MailboxError> {
        let sql = format!(
            "SELECT {ENTRY} FROM messages WHERE owner = $1 AND place = $2 ORDER BY created_at, id"
        );
        self.entries(at, &sql, &[]).await
    }
}

#[async_trait::async_trait]
impl MessageUpkeep for PgMessages {
    /// Its row in `message_owners`, which its messages reference.
    async fn create_mailbox(&self, owner: &Id) -> Result<(), MailboxError> {
        self.create_mailboxes(std::slice::from_ref(owner))
            .await
            .pop()
            .unwrap_or(Ok(()))
    }

    /// Every row in one statement.
    async fn create_mailboxes(&self, owners: &[Id]) -> Vec<Result<(), MailboxError>> {
        let ids: Vec<&str> = owners.iter().map(Id::as_str).collect();
        let made = async {
            let client = self.store.client().await?;
            let statement = client.prepare_cached(MAKE_OWNERS).await?;
            client.execute(&statement, &[&ids]).await?;
            Ok::<_, Error>(())
        };
        match made.await {
            Ok(()) => owners.iter().map(|_| Ok(())).collect(),
            Err(e) => {
                let unavailable = e.is_unavailable();
                let text = e.to_string();
                owners
                    .iter()
                    .map(|o| {
                        Err(MailboxError::store(
                            format!("postgres:{o}"),
                            text.clone(),
                            unavailable,
                        ))
                    })
                    .collect()
            }
        }
    }

    /// The mailbox's row goes, and with it (the foreign keys cascade) its
    /// messages and those scheduled for it, in one transaction: a write
    /// for it that holds its row's key lock commits first and goes with
    /// it; any later one fails on the missing row.
    async fn remove_mailbox(&self, owner: &Id) -> Result<u64, MailboxError> {
        let client = self.client(owner).await?;
        let n: i64 = client
            .query_one(REMOVE_OWNER, &[&owner.as_str()])
            .await
            .map_err(|e| failed(owner, e))?
            .get(0);
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn scheduled_for(&self, owner: &Id) -> Result<u64, MailboxError> {
        let client = self.client(owner).await?;
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM repeat_entries WHERE owner = $1",
                &[&owner.as_str()],
            )
            .await
            .map_err(|e| failed(owner, e))?
            .get(0);
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Age is the arrival time in the id: the ids below the first id of
    /// `cutoff`'s millisecond, read from the folder's index range.
    async fn remove_older_than(
        &self,
        at: &Location,
        cutoff: Timestamp,
        keep: &HashSet<MessageId>,
    ) -> Result<usize, MailboxError> {
        let keep: Vec<String> = keep.iter().map(MessageId::to_string).collect();
        let client = self.client(at).await?;
        let n = client
            .execute(
                "DELETE FROM messages WHERE owner = $1 AND place = $2 AND id < $3
                   AND NOT (id = ANY($4))",
                &[&loc(at).0, &loc(at).1, &first_id_at(cutoff), &keep],
            )
            .await
            .map_err(|e| failed(at, e))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Every write is one transaction: nothing is left half-done.
    async fn recover_writes(&self, _owner: &Id) -> Result<(), MailboxError> {
        Ok(())
    }

    /// The rows of the database's `Prepared` whose id is not referenced,
    /// from the folder's index range.
    async fn orphans(
        &self,
        db: &Id,
        referenced: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError> {
        let referenced: Vec<String> = referenced.iter().map(MessageId::to_string).collect();
        let sql = format!(
            "SELECT {ENTRY} FROM messages WHERE owner = $1 AND place = $2
               AND NOT (id = ANY($3)) ORDER BY created_at, id"
        );
        let prepared = Location::new(db.clone(), Folder::Prepared);
        let entries = self.entries(&prepared, &sql, &[&referenced]).await?;
        Ok(entries.into_iter().map(|e| e.name).collect())
    }

    /// No running totals are kept (each node would need every other
    /// node's changes): the exchange counts place by place.
    fn count_as(&self, _owner: &Id, _kind: MailboxKind) {}

    async fn tallies(&self) -> Option<Tallies> {
        None
    }

    async fn holding(&self, _folder: Folder) -> Option<Vec<(MailboxKind, Id)>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Postgres;

    /// A batch's statements find its rows by primary key whatever a folder
    /// holds: their plans, generic (made once per connection, without the
    /// batch's values, here without statistics, as on a new database) and
    /// custom, never probe the folder index per row, which walks every
    /// entry of the folder. Without the fix, the generic plans of `MOVE`,
    /// `MOVE_ALL_OF` and `DELETE` walk `messages_folder`: a commit of 100
    /// messages took 50 ms after 30,000 messages had passed through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_reads_its_rows_by_key_whatever_the_folder_holds() {
        let pg = Postgres::start().unwrap();
        let store = Store::connect(&pg.url()).unwrap();
        store.migrate().await.unwrap();
        let client = store.client().await.unwrap();
        // 20,000 messages in one folder (moved in from another, so that
        // its old place keeps their dead entries too), never analysed.
        client
            .batch_execute(
                "ALTER TABLE messages SET (autovacuum_enabled = false);
                 INSERT INTO message_owners VALUES ('db-a'), ('dev-1');
                 INSERT INTO messages SELECT 'M' || lpad(g::text, 8, '0'), 'db-a', 'Messages',
                     'dev-1', 'db-a', 'sub', g, 100, '\\x00' FROM generate_series(1, 20000) g;
                 UPDATE messages SET place = 'Log' WHERE created_at > 100;",
            )
            .await
            .unwrap();
        let ids = format!(
            "ARRAY[{}]",
            (1..=100)
                .map(|g| format!("'M{g:08}'"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let column = |v: &str| format!("array_fill('{v}'::text, ARRAY[100])");
        let statements = [
            (
                "mv",
                MOVE,
                "text[], text[], text[], text[], text[]",
                format!(
                    "{ids}, {}, {}, {}, {}",
                    column("db-a"),
                    column("Messages"),
                    column("db-a"),
                    column("Log")
                ),
            ),
            (
                "mv_all",
                MOVE_ALL_OF,
                "text[], text, text, text, text",
                format!("{ids}, 'db-a', 'Messages', 'dev-1', 'Log'"),
            ),
            (
                "del",
                DELETE,
                "text[], text, text",
                format!("{ids}, 'db-a', 'Messages'"),
            ),
            (
                "bodies",
                BODIES,
                "text[], text, text",
                format!("{ids}, 'db-a', 'Messages'"),
            ),
        ];
        for mode in ["force_generic_plan", "force_custom_plan"] {
            for (name, sql, types, args) in &statements {
                let explained = client
                    .simple_query(&format!(
                        "SET plan_cache_mode = {mode};
                         PREPARE {name}_{mode}({types}) AS {sql};
                         BEGIN;
                         EXPLAIN (FORMAT JSON) EXECUTE {name}_{mode}({args});
                         ROLLBACK;"
                    ))
                    .await
                    .unwrap();
                let plan: String = explained
                    .iter()
                    .filter_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                        _ => None,
                    })
                    .collect();
                assert!(plan.contains("messages_pkey"), "{name} ({mode}): {plan}");
                assert!(
                    !plan.contains("messages_folder"),
                    "{name} ({mode}) walks the folder index: {plan}"
                );
            }
        }
    }
}
