//! [`Processor`]: a database processor that runs the six-call protocol the
//! way a real processor (Gedemin) does, against a real SQLite database.
//!
//! One cycle ([`Processor::run_once`]):
//!
//! 1. settle every process its database still knows (after a crash, a lost
//!    answer or a failed call): a late `commit` if its transaction committed,
//!    a `rollback` otherwise;
//! 2. `start` (BUSY is retried with a random back-off);
//! 3. record the process id in the `pending` table (a small transaction of
//!    its own, before the main one), so that a process it loses track of
//!    (a crash, a lost answer) is rolled back on the server rather than
//!    left to the STARTED timeout;
//! 4. narrow the list with `accept` when it rejects some messages;
//! 5. one transaction: a SAVEPOINT per message, a row in `applied` (UNIQUE
//!    message id) per processed message, some messages marked deadlocked or
//!    incorrect at the configured rates (their savepoint rolled back; an
//!    incorrect one gets a row in `incorrect`), and the process id in
//!    `committed`, so that the outcome of the transaction and the knowledge
//!    of which process it belonged to are one fact;
//! 6. `prepare` with a verdict per message and one reply per message with a
//!    final verdict (PROCESSED or PROCESSED_INCORRECT; a deadlocked message
//!    is answered when it is processed again);
//! 7. commit its transaction (or, at the configured rate, fail to), then
//!    `commit` (or `rollback`) and forget the process.
//!
//! A message the server hands out again after it was applied hits the
//! UNIQUE constraint: the processor records it in `duplicates` (the proof of
//! double processing the harness looks for) and does not apply it twice.

use std::path::Path;
use std::time::{Duration, SystemTime};

use estafeta_client::Client;
use estafeta_wire::{
    Body, CallStatus, Id, Message, MessageId, MessageResult, PrepareRequest, ProcessId, Reply,
    ResultStatus, StartRequest, StartStatus, Timestamp, Version,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rusqlite::{Connection, ErrorCode, OptionalExtension, params};

use crate::SimError;

/// The processor's schema: applied messages and those found incorrect (as
/// received), proof of duplicates, the processes whose transaction
/// committed, and the processes not yet settled with the server.
const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = FULL;
CREATE TABLE IF NOT EXISTS applied (
    message_id TEXT NOT NULL UNIQUE,
    process_id TEXT NOT NULL,
    sender TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS incorrect (
    message_id TEXT NOT NULL,
    process_id TEXT NOT NULL,
    sender TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS duplicates (message_id TEXT NOT NULL, process_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS committed (process_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS pending (process_id TEXT PRIMARY KEY);
";

/// The Firebird error code the simulator reports for an incorrect message
/// (a constraint violation), so that replies and the event log carry a
/// realistic number.
const INCORRECT_CODE: i64 = 335_544_665;

/// The time `delay` from now, as a `deliver_at`.
fn due_after(delay: Duration) -> Timestamp {
    Timestamp::from_system_time(SystemTime::now() + delay)
}

/// How a processor behaves.
#[derive(Clone, Debug)]
pub struct ProcessorConfig {
    /// The database it processes for.
    pub db_id: Id,
    /// Its own limit on messages per process (the server's may be smaller).
    pub max_files: Option<u64>,
    /// The share of offered messages it will not handle (narrowed with `accept`).
    pub reject_rate: f64,
    /// The share of messages that hit a deadlock (left for a later process).
    pub deadlock_rate: f64,
    /// The share of messages that are incorrect (moved to `Error`).
    pub incorrect_rate: f64,
    /// The share of transactions whose commit fails (then `rollback`).
    pub commit_failure_rate: f64,
    /// How many times a BUSY start is retried before giving up for this cycle.
    pub busy_retries: u32,
    /// The longest random wait between two BUSY retries.
    pub busy_backoff: Duration,
    /// The share of replies scheduled for later (`deliver_at`), the others
    /// delivered at commit.
    pub scheduled_reply_rate: f64,
    /// How long after it is made a scheduled reply is due.
    pub reply_delay: Duration,
    /// The seed of its random choices.
    pub seed: u64,
}

impl ProcessorConfig {
    /// A processor for `db_id` that handles everything: no rejections,
    /// deadlocks, incorrect messages or failed commits.
    pub fn new(db_id: Id) -> ProcessorConfig {
        ProcessorConfig {
            db_id,
            max_files: None,
            reject_rate: 0.0,
            deadlock_rate: 0.0,
            incorrect_rate: 0.0,
            commit_failure_rate: 0.0,
            busy_retries: 5,
            busy_backoff: Duration::from_millis(100),
            scheduled_reply_rate: 0.0,
            reply_delay: Duration::from_secs(1),
            seed: 0,
        }
    }
}

/// A named point of the cycle, reported to the step hook after it is done:
/// the places where the harness kills a processor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    /// `start` answered OK with a process id.
    Started,
    /// The process id is in `pending` (a small transaction of its own).
    Recorded,
    /// The list is final (narrowed with `accept`, or taken whole).
    Accepted,
    /// Every message is applied inside the open transaction.
    Applied,
    /// `prepare` answered OK; the transaction is still open.
    Prepared,
    /// The transaction is committed (or rolled back after a failed commit).
    CommittedLocally,
    /// `commit` or `rollback` answered; the process is forgotten.
    Settled,
}

impl Step {
    /// Every step, in cycle order.
    pub const ALL: [Step; 7] = [
        Step::Started,
        Step::Recorded,
        Step::Accepted,
        Step::Applied,
        Step::Prepared,
        Step::CommittedLocally,
        Step::Settled,
    ];

    /// The step's name on a command line.
    pub fn name(self) -> &'static str {
        match self {
            Step::Started => "started",
            Step::Accepted => "accepted",
            Step::Recorded => "recorded",
            Step::Applied => "applied",
            Step::Prepared => "prepared",
            Step::CommittedLocally => "committed-locally",
            Step::Settled => "settled",
        }
    }

    /// The step of a name given by [`Step::name`].
    pub fn from_name(name: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// What one cycle did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cycle {
    /// Nothing waits for this database.
    Idle,
    /// Another process of this database is running (after the retries).
    Busy,
    /// The server cancelled the process before prepare; nothing was kept.
    Cancelled,
    /// Every offered message was rejected; the process was aborted.
    Rejected,
    /// A process ran to its end.
    Done {
        /// The process.
        process_id: ProcessId,
        /// Messages applied (PROCESSED).
        processed: usize,
        /// Messages that hit a deadlock.
        deadlocked: usize,
        /// Messages found incorrect.
        incorrect: usize,
        /// Whether its transaction committed (else it was rolled back).
        committed: bool,
    },
}

/// The answer to `start`, after the BUSY retries.
enum Offer {
    Idle,
    Busy,
    Process(ProcessId, Vec<Message>),
}

/// A message as the processor's database keeps it (`applied` or
/// `incorrect`): what the server handed out, for an oracle to compare with
/// what was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The message id.
    pub id: MessageId,
    /// The process that handled it.
    pub process: String,
    /// The sender the server named.
    pub sender: String,
    /// The body's JSON as received.
    pub body: String,
}

/// A hook called after each [`Step`]; the harness's processor child blocks
/// in it to be killed exactly there.
pub type StepHook = Box<dyn FnMut(Step, &ProcessId) + Send>;

/// A simulated processor on one SQLite database file.
pub struct Processor {
    client: Client,
    config: ProcessorConfig,
    conn: Connection,
    rng: StdRng,
    hook: Option<StepHook>,
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Processor {
    /// Opens (or creates) the processor's database at `path`; `client`
    /// carries the database's token.
    pub fn open(
        path: &Path,
        client: Client,
        config: ProcessorConfig,
    ) -> Result<Processor, SimError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        let rng = StdRng::seed_from_u64(config.seed);
        Ok(Processor {
            client,
            config,
            conn,
            rng,
            hook: None,
        })
    }

    /// Calls `hook` after every step of the cycle.
    pub fn set_step_hook(&mut self, hook: StepHook) {
        self.hook = Some(hook);
    }

    /// The message ids applied in this database.
    pub fn applied(&self) -> Result<Vec<MessageId>, SimError> {
        self.ids("SELECT message_id FROM applied ORDER BY message_id")
    }

    /// The messages applied in this database, as received.
    pub fn applied_rows(&self) -> Result<Vec<Kept>, SimError> {
        self.kept("SELECT message_id, process_id, sender, body FROM applied ORDER BY message_id")
    }

    /// The messages found incorrect in a committed transaction (moved to
    /// `Error`), as received; one row per time.
    pub fn incorrect_rows(&self) -> Result<Vec<Kept>, SimError> {
        self.kept("SELECT message_id, process_id, sender, body FROM incorrect ORDER BY message_id")
    }

    fn kept(&self, sql: &str) -> Result<Vec<Kept>, SimError> {
        let mut stmt = self.conn.prepare(sql)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        // Rows this processor wrote hold valid ids; anything else is skipped.
        Ok(rows
            .into_iter()
            .filter_map(|(id, process, sender, body)| {
                Some(Kept {
                    id: id.parse().ok()?,
                    process,
                    sender,
                    body,
                })
            })
            .collect())
    }

    /// The message ids offered again after they were applied.
    pub fn duplicates(&self) -> Result<Vec<MessageId>, SimError> {
        self.ids("SELECT message_id FROM duplicates ORDER BY message_id")
    }

    /// How many processes the database knows that are not settled with the server.
    pub fn unsettled(&self) -> Result<usize, SimError> {
        let n: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM pending", [], |r| r.get(0))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    fn ids(&self, sql: &str) -> Result<Vec<MessageId>, SimError> {
        let mut stmt = self.conn.prepare(sql)?;
        let texts = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        // Rows this processor wrote hold valid ids; anything else is skipped.
        Ok(texts.iter().filter_map(|t| t.parse().ok()).collect())
    }

    /// Runs until the server answers IDLE (or BUSY after the retries),
    /// settling first; the cycles that ran.
    pub async fn run_until_idle(&mut self) -> Result<Vec<Cycle>, SimError> {
        let mut cycles = Vec::new();
        loop {
            let cycle = self.run_once().await?;
            let last = matches!(cycle, Cycle::Idle | Cycle::Busy);
            cycles.push(cycle);
            if last {
                return Ok(cycles);
            }
        }
    }

    /// One cycle of the protocol (see the module overview).
    pub async fn run_once(&mut self) -> Result<Cycle, SimError> {
        self.settle().await?;
        let (pid, messages) = match self.start().await? {
            Offer::Idle => return Ok(Cycle::Idle),
            Offer::Busy => return Ok(Cycle::Busy),
            Offer::Process(pid, messages) => (pid, messages),
        };
        self.step(Step::Started, &pid);

        self.conn.execute(
            "INSERT OR IGNORE INTO pending (process_id) VALUES (?1)",
            [pid.to_string()],
        )?;
        self.step(Step::Recorded, &pid);

        let (accepted, rejected): (Vec<Message>, Vec<Message>) = messages
            .into_iter()
            .partition(|_| !self.rng.random_bool(self.config.reject_rate));
        if accepted.is_empty() {
            self.client.abort(&pid, "no message can be handled").await?;
            self.forget(&pid)?;
            return Ok(Cycle::Rejected);
        }
        if !rejected.is_empty() {
            let ids: Vec<MessageId> = accepted.iter().map(|m| m.id).collect();
            match self.client.accept(&pid, &ids).await {
                Ok(answer) if answer.status == CallStatus::Ok => {}
                Ok(_) => {
                    self.forget(&pid)?;
                    return Ok(Cycle::Cancelled);
                }
                Err(e) => {
                    // No confirmation ends the process here.
                    // `pending` remembers to roll it back on the server, so
                    // the database is free before the STARTED timeout.
                    return Err(e.into());
                }
            }
        }
        self.step(Step::Accepted, &pid);

        let (request, counts) = match self.apply(&pid, &accepted) {
            Ok(applied) => applied,
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        };
        self.step(Step::Applied, &pid);

        match self.client.prepare(&pid, &request).await {
            Ok(answer) if answer.status == CallStatus::Ok => {}
            other => {
                // CANCELLED, a timeout or a network error: roll back and
                // end; `pending` remembers to tell the server (settle).
                self.conn.execute_batch("ROLLBACK")?;
                self.finish(&pid, false).await?;
                return match other {
                    Err(e) => Err(e.into()),
                    Ok(_) => Ok(Cycle::Cancelled),
                };
            }
        }
        self.step(Step::Prepared, &pid);

        let committed = if self.rng.random_bool(self.config.commit_failure_rate) {
            self.conn.execute_batch("ROLLBACK")?;
            false
        } else {
            match self.conn.execute_batch("COMMIT") {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, %pid, "commit failed; rolling back");
                    let _ = self.conn.execute_batch("ROLLBACK");
                    false
                }
            }
        };
        self.step(Step::CommittedLocally, &pid);
        self.finish(&pid, committed).await?;
        self.step(Step::Settled, &pid);
        let (processed, deadlocked, incorrect) = counts;
        Ok(Cycle::Done {
            process_id: pid,
            processed,
            deadlocked,
            incorrect,
            committed,
        })
    }

    /// Settles every process the database knows: a late commit when its
    /// transaction committed, a rollback otherwise. How many were settled.
    pub async fn settle(&mut self) -> Result<usize, SimError> {
        let known: Vec<(String, bool)> = {
            let mut stmt = self.conn.prepare(
                "SELECT p.process_id, c.process_id IS NOT NULL
                 FROM pending p LEFT JOIN committed c ON c.process_id = p.process_id",
            )?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?
        };
        let mut settled = 0;
        for (text, committed) in known {
            match text.parse::<ProcessId>() {
                Ok(pid) => {
                    if self.finish(&pid, committed).await? {
                        settled += 1;
                    }
                }
                Err(_) => {
                    self.conn
                        .execute("DELETE FROM pending WHERE process_id = ?1", [&text])?;
                }
            }
        }
        Ok(settled)
    }

    /// `start`, with BUSY retried after a random back-off.
    async fn start(&mut self) -> Result<Offer, SimError> {
        let request = StartRequest {
            max_files: self.config.max_files,
            ..StartRequest::new(self.config.db_id.clone())
        };
        for attempt in 0..=self.config.busy_retries {
            let answer = self.client.start(&request).await?;
            match (answer.status, answer.process_id) {
                (StartStatus::Ok, Some(pid)) => {
                    return Ok(Offer::Process(pid, answer.messages.unwrap_or_default()));
                }
                (StartStatus::Busy, _) if attempt < self.config.busy_retries => {
                    let max = self.config.busy_backoff.as_millis().max(1);
                    let wait = self.rng.random_range(0..max);
                    tokio::time::sleep(Duration::from_millis(
                        u64::try_from(wait).unwrap_or(u64::MAX),
                    ))
                    .await;
                }
                (StartStatus::Busy, _) => return Ok(Offer::Busy),
                // OK without a process id is not an answer the API gives;
                // treat it as nothing to do.
                (StartStatus::Idle | StartStatus::Ok, _) => return Ok(Offer::Idle),
            }
        }
        Ok(Offer::Busy)
    }

    /// The main transaction up to (not including) its commit: a savepoint
    /// per message, the verdicts and the replies.
    #[allow(clippy::type_complexity)]
    fn apply(
        &mut self,
        pid: &ProcessId,
        messages: &[Message],
    ) -> Result<(PrepareRequest, (usize, usize, usize)), SimError> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let mut results = Vec::with_capacity(messages.len());
        let mut replies = Vec::with_capacity(messages.len());
        let (mut processed, mut deadlocked, mut incorrect) = (0, 0, 0);
        for m in messages {
            self.conn.execute_batch("SAVEPOINT message")?;
            let verdict = if self.rng.random_bool(self.config.deadlock_rate) {
                ResultStatus::ProcessedDeadlock
            } else if self.rng.random_bool(self.config.incorrect_rate) {
                ResultStatus::ProcessedIncorrect
            } else {
                self.apply_one(pid, m)?;
                ResultStatus::Processed
            };
            match verdict {
                ResultStatus::Processed => {
                    self.conn.execute_batch("RELEASE message")?;
                    processed += 1;
                }
                ResultStatus::ProcessedDeadlock => {
                    self.conn
                        .execute_batch("ROLLBACK TO message; RELEASE message")?;
                    deadlocked += 1;
                }
                ResultStatus::ProcessedIncorrect => {
                    self.conn
                        .execute_batch("ROLLBACK TO message; RELEASE message")?;
                    self.keep("incorrect", pid, m)?;
                    incorrect += 1;
                }
            }
            let incorrect_now = verdict == ResultStatus::ProcessedIncorrect;
            results.push(MessageResult {
                message_id: m.id,
                status: verdict,
                error_code: incorrect_now.then_some(INCORRECT_CODE),
                error_text: incorrect_now.then(|| "simulated constraint violation".to_owned()),
            });
            if verdict != ResultStatus::ProcessedDeadlock {
                // The message's nonce, if its body has one, tells an oracle
                // which upload request this answers.
                let nonce = serde_json::from_str::<serde_json::Value>(m.body.get())
                    .ok()
                    .and_then(|b| b.get("nonce").cloned())
                    .unwrap_or(serde_json::Value::Null);
                // Drawn only when some replies are scheduled, so that a
                // processor that schedules none makes the choices its seed
                // always made.
                let scheduled = self.config.scheduled_reply_rate > 0.0
                    && self.rng.random_bool(self.config.scheduled_reply_rate);
                replies.push(Reply {
                    to: m.from.clone(),
                    body: Body::from_value(&serde_json::json!({
                        "re": m.id.to_string(),
                        "db": self.config.db_id.to_string(),
                        "verdict": verdict,
                        "nonce": nonce,
                        "scheduled": scheduled,
                    }))?,
                    created_at: None,
                    deliver_at: scheduled.then(|| due_after(self.config.reply_delay)),
                });
            }
        }
        self.conn.execute(
            "INSERT INTO committed (process_id) VALUES (?1)",
            [pid.to_string()],
        )?;
        let request = PrepareRequest {
            version: Version,
            results,
            replies,
        };
        Ok((request, (processed, deadlocked, incorrect)))
    }

    /// Keeps `m`, as received, in `table` (`applied` or `incorrect`).
    fn keep(&self, table: &str, pid: &ProcessId, m: &Message) -> rusqlite::Result<usize> {
        self.conn.execute(
            &format!(
                "INSERT INTO {table} (message_id, process_id, sender, body) VALUES (?1, ?2, ?3, ?4)"
            ),
            params![
                m.id.to_string(),
                pid.to_string(),
                m.from.to_string(),
                m.body.get()
            ],
        )
    }

    /// Applies one message: its row, or the proof that it came again.
    fn apply_one(&mut self, pid: &ProcessId, m: &Message) -> Result<(), SimError> {
        let inserted = self.keep("applied", pid, m);
        match inserted {
            Ok(_) => Ok(()),
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
                let first: Option<String> = self
                    .conn
                    .query_row(
                        "SELECT process_id FROM applied WHERE message_id = ?1",
                        [m.id.to_string()],
                        |r| r.get(0),
                    )
                    .optional()?;
                tracing::error!(message = %m.id, %pid, ?first, "a message was offered again after it was applied");
                self.conn.execute(
                    "INSERT INTO duplicates (message_id, process_id) VALUES (?1, ?2)",
                    [m.id.to_string(), pid.to_string()],
                )?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Tells the server the outcome of `pid` and forgets it once the server
    /// has an answer (OK or CANCELLED). `false` when the server answered
    /// FAILED (its moves are pending; the process stays known and the next
    /// settle calls commit again).
    async fn finish(&mut self, pid: &ProcessId, committed: bool) -> Result<bool, SimError> {
        let answer = if committed {
            self.client.commit(pid).await?
        } else {
            self.client
                .rollback(pid, "the processor's transaction did not commit")
                .await?
        };
        match answer.status {
            CallStatus::Ok => {}
            CallStatus::Failed => return Ok(false),
            CallStatus::Cancelled => {
                if committed {
                    tracing::error!(%pid, "commit after a committed transaction was cancelled");
                }
            }
        }
        self.forget(pid)?;
        Ok(true)
    }

    /// The server has the outcome of `pid`: nothing left to settle.
    fn forget(&mut self, pid: &ProcessId) -> Result<(), SimError> {
        self.conn.execute(
            "DELETE FROM pending WHERE process_id = ?1",
            [pid.to_string()],
        )?;
        Ok(())
    }

    fn step(&mut self, step: Step, pid: &ProcessId) {
        if let Some(hook) = self.hook.as_mut() {
            hook(step, pid);
        }
    }
}
