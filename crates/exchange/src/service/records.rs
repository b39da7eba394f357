//! What the exchange keeps in its sessions, one record type per kind:
//! a database's [`DbRecord`] (its live process, its processes in doubt and
//! the last ended ones), a device's [`DeviceRecord`] (its counters)
//! and a process's [`ProcessRecord`] (which database it
//! belongs to and how it ended, kept for the retention period so that a
//! late call is answered correctly).

use super::stats::{DbCounters, DeviceCounters};
use crate::store::{FileName, Folder, Location, Op};
use crate::wire::{ProcessState, ProcessSummary, ResultStatus};
use crate::{Id, MessageId, ProcessId, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet, VecDeque};

/// The longest error text kept as a database's last error.
const MAX_ERROR: usize = 500;
/// How many ended processes a database session remembers in full (for the
/// admin list); older ones are only in their process sessions.
pub(crate) const RECENT: usize = 32;

/// A database's session.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct DbRecord {
    /// The process that has not ended (at most one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) process: Option<Process>,
    /// The replies of a process given up (rolled back or aborted), deleted
    /// from `Prepared` once its end is saved: named here until a later
    /// step sees them gone, so that a crash in between never leaves them
    /// for a process that no longer names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discarding: Option<Discarding>,
    /// Processes in doubt, waiting for a late commit or rollback.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) in_doubt: Vec<Process>,
    /// The last ended processes, newest last, as much of each as the
    /// admin list, the status and the error reasons need (the record is
    /// saved whole at every step: their file names would make it grow
    /// with the batch size times the number remembered).
    #[serde(
        default,
        skip_serializing_if = "VecDeque::is_empty",
        deserialize_with = "remembered"
    )]
    pub(crate) recent: VecDeque<Ended>,
    /// Counters of the database's processes.
    #[serde(default, skip_serializing_if = "DbCounters::is_empty")]
    pub(crate) counters: DbCounters,
    /// A webhook an earlier version kept here; start-up processing moves
    /// it into the registry ([`super::push`]) and clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) webhook: Option<String>,
}

/// Replies whose deletion from a database's `Prepared` is decided.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Discarding {
    /// The database whose `Prepared` holds them.
    pub(crate) db: Id,
    /// The replies.
    pub(crate) names: Vec<FileName>,
}

/// A device's session.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct DeviceRecord {
    /// The device's latest idempotency keys (with a session store of this
    /// server alone): saved with its counters in the upload's own commit,
    /// handed to the key store (`crate::keys`) in batches; and those that
    /// servers before the key store kept here. Each is honoured until it
    /// expires.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) keys: BTreeMap<String, Upload>,
    /// Counters of the device's uploads and acknowledgements.
    #[serde(default, skip_serializing_if = "DeviceCounters::is_empty")]
    pub(crate) device: DeviceCounters,
    /// A webhook an earlier version kept here; start-up processing moves
    /// it into the registry ([`super::push`]) and clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) webhook: Option<String>,
}

/// A process's session: `None` until its owner is recorded.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct ProcessRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<Owner>,
}

/// A device upload with an idempotency key, as its device's record keeps
/// it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Upload {
    pub(crate) name: FileName,
    pub(crate) at: Timestamp,
}

/// Where a process lives and how it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Owner {
    pub(crate) db: Id,
    /// `None` while the process lives (its state is in the database session).
    pub(crate) ended: Option<ProcessState>,
}

/// One process of the protocol.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Process {
    pub(crate) id: ProcessId,
    pub(crate) db: Id,
    pub(crate) state: ProcessState,
    pub(crate) started_at: Timestamp,
    #[serde(default)]
    pub(crate) ready_at: Option<Timestamp>,
    #[serde(default)]
    pub(crate) ended_at: Option<Timestamp>,
    /// The messages handed out by the start call, in `Messages`.
    pub(crate) messages: Vec<FileName>,
    /// The processor's narrowed list (API_2); `None`: all of `messages`.
    #[serde(default)]
    pub(crate) accepted: Option<Vec<MessageId>>,
    /// The verdict on each accepted message (API_3).
    #[serde(default)]
    pub(crate) results: Vec<Verdict>,
    /// Reply files a prepare is writing: recorded durably before they are
    /// written, so that if the server dies before the prepare is answered,
    /// start-up processing deletes them (the processor never got an OK).
    #[serde(default)]
    pub(crate) preparing: Vec<FileName>,
    /// The replies written to `Prepared` (API_3).
    #[serde(default)]
    pub(crate) replies: Vec<FileName>,
    /// File moves and deletes decided but maybe not all done: the intent
    /// record. Each is idempotent, so after a crash they are simply run
    /// again; when all are done the process ends as `target`.
    #[serde(default)]
    pub(crate) pending: Vec<Op>,
    #[serde(default)]
    pub(crate) target: Option<ProcessState>,
    /// Failed attempts to run `pending` (for the retry backoff).
    #[serde(default)]
    pub(crate) attempts: u32,
    /// When `pending` is tried again after a failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) retry_at: Option<Timestamp>,
    /// A late commit, rollback or abort that came while the moves putting
    /// the process in doubt were not all done: it settles the process as
    /// this state once they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) verdict: Option<ProcessState>,
    /// Replies with a `deliver_at`: scheduled at commit for that time.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "deferred")]
    pub(crate) scheduled: Vec<(MessageId, Timestamp)>,
}

impl Process {
    /// The process as the admin's process list shows it: as it would be
    /// remembered if it ended now.
    pub(crate) fn summary(&self) -> ProcessSummary {
        Ended::of(self).summary()
    }

    /// Counts in `c` this process's end as `state` at `now`.
    pub(crate) fn count_end(&self, c: &mut DbCounters, state: ProcessState, now: Timestamp) {
        c.ended += 1;
        c.last_seen = Some(now);
        match state {
            ProcessState::Done => {
                c.processed += self.verdicts(ResultStatus::Processed).len() as u64;
                c.deadlocks += self.verdicts(ResultStatus::ProcessedDeadlock).len() as u64;
                c.incorrect += self.verdicts(ResultStatus::ProcessedIncorrect).len() as u64;
                c.replies += self.replies.len() as u64;
                for v in &self.results {
                    let sender = c.by_sender.entry(v.name.from.clone()).or_default();
                    match v.status {
                        ResultStatus::Processed => sender.processed += 1,
                        ResultStatus::ProcessedDeadlock => sender.deadlocks += 1,
                        ResultStatus::ProcessedIncorrect => sender.incorrect += 1,
                    }
                }
                if let Some(v) = self
                    .results
                    .iter()
                    .rev()
                    .find(|v| v.status == ResultStatus::ProcessedIncorrect)
                {
                    let mut text = match (v.error_code, &v.error_text) {
                        (Some(code), Some(text)) => format!("{code}: {text}"),
                        (Some(code), None) => code.to_string(),
                        (None, Some(text)) => text.clone(),
                        (None, None) => "PROCESSED_INCORRECT".to_owned(),
                    };
                    if let Some((cut, _)) = text.char_indices().nth(MAX_ERROR) {
                        text.truncate(cut);
                    }
                    c.last_error = Some(text);
                }
            }
            ProcessState::RolledBack | ProcessState::Aborted | ProcessState::TimedOut => {
                c.not_committed += 1;
            }
            _ => {}
        }
    }

    /// A new STARTED process of `messages`.
    pub(crate) fn started(
        id: ProcessId,
        db: Id,
        messages: Vec<FileName>,
        now: Timestamp,
    ) -> Process {
        Process {
            id,
            db,
            state: ProcessState::Started,
            started_at: now,
            ready_at: None,
            ended_at: None,
            messages,
            accepted: None,
            results: Vec::new(),
            preparing: Vec::new(),
            replies: Vec::new(),
            pending: Vec::new(),
            target: None,
            attempts: 0,
            retry_at: None,
            verdict: None,
            scheduled: Vec::new(),
        }
    }

    pub(crate) fn accepted_names(&self) -> Vec<FileName> {
        match &self.accepted {
            None => self.messages.clone(),
            Some(ids) => self
                .messages
                .iter()
                .filter(|n| ids.contains(&n.id))
                .cloned()
                .collect(),
        }
    }

    /// Files of a verdict kind.
    pub(crate) fn verdicts(&self, status: ResultStatus) -> Vec<FileName> {
        self.results
            .iter()
            .filter(|v| v.status == status)
            .map(|v| v.name.clone())
            .collect()
    }
}

/// An ended process as its database remembers it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Ended {
    pub(crate) id: ProcessId,
    pub(crate) db: Id,
    pub(crate) state: ProcessState,
    pub(crate) started_at: Timestamp,
    pub(crate) ready_at: Option<Timestamp>,
    pub(crate) ended_at: Option<Timestamp>,
    /// How many messages the start handed out.
    pub(crate) messages: u64,
    /// How many replies the prepare wrote.
    pub(crate) replies: u64,
    /// The verdicts PROCESSED_INCORRECT, with their error code and text.
    pub(crate) incorrect: Vec<Verdict>,
}

impl Ended {
    /// The ended process as the admin's process list shows it.
    pub(crate) fn summary(&self) -> ProcessSummary {
        ProcessSummary {
            process_id: self.id,
            db_id: self.db.clone(),
            state: self.state,
            started_at: self.started_at,
            ready_at: self.ready_at,
            ended_at: self.ended_at,
            messages: self.messages,
            replies: self.replies,
        }
    }

    /// What is remembered of `p`, which ended.
    pub(crate) fn of(p: &Process) -> Ended {
        Ended {
            id: p.id,
            db: p.db.clone(),
            state: p.state,
            started_at: p.started_at,
            ready_at: p.ready_at,
            ended_at: p.ended_at,
            messages: p.messages.len() as u64,
            replies: p.replies.len() as u64,
            incorrect: p
                .results
                .iter()
                .filter(|v| v.status == ResultStatus::ProcessedIncorrect)
                .cloned()
                .collect(),
        }
    }
}

/// An ended process as stored: records saved before [`Ended`] existed
/// hold the whole [`Process`].
#[derive(Deserialize)]
#[serde(untagged)]
enum Remembered {
    Ended(Ended),
    Whole(Box<Process>),
}

/// Reads a database's ended processes, each stored as an [`Ended`] or as
/// the whole [`Process`] (see [`Remembered`]).
fn remembered<'de, D: serde::Deserializer<'de>>(d: D) -> Result<VecDeque<Ended>, D::Error> {
    let stored = VecDeque::<Remembered>::deserialize(d)?;
    let ended = stored.into_iter().map(|r| match r {
        Remembered::Ended(e) => e,
        Remembered::Whole(p) => Ended::of(&p),
    });
    Ok(ended.collect())
}

/// A processor's verdict on one message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Verdict {
    pub(crate) name: FileName,
    pub(crate) status: ResultStatus,
    #[serde(default)]
    pub(crate) error_code: Option<i64>,
    #[serde(default)]
    pub(crate) error_text: Option<String>,
}

impl Process {
    /// The moves of a confirmed commit: replies to their recipients (or
    /// scheduled for their `deliver_at`), processed messages to `Log`,
    /// incorrect ones to `Error`; deadlocked ones stay in `Messages`.
    pub(crate) fn moves_on_commit(&self) -> Vec<Op> {
        let prepared = (&self.db, Folder::Prepared);
        self.moves(
            |r| deliver(self, r, prepared),
            [Folder::Messages, Folder::Log],
            Some([Folder::Messages, Folder::Error]),
        )
    }

    /// The moves that put a READY_TO_COMMIT process in doubt: processed
    /// messages and replies to `Unknown`, incorrect ones to `Error`,
    /// deadlocked ones stay.
    pub(crate) fn moves_into_doubt(&self) -> Vec<Op> {
        let db = &self.db;
        self.moves(
            |r| Op::mv(r, (db, Folder::Prepared), (db, Folder::Unknown)),
            [Folder::Messages, Folder::Unknown],
            Some([Folder::Messages, Folder::Error]),
        )
    }

    /// The moves that settle a process in doubt as committed (replies on
    /// their way, processed messages to `Log`) or rolled back (replies
    /// deleted, processed and incorrect messages back to `Messages`).
    pub(crate) fn moves_settling(&self, commit: bool) -> Vec<Op> {
        let unknown = (&self.db, Folder::Unknown);
        match commit {
            true => self.moves(
                |r| deliver(self, r, unknown),
                [Folder::Unknown, Folder::Log],
                None,
            ),
            false => self.moves(
                |r| Op::delete(r, unknown),
                [Folder::Unknown, Folder::Messages],
                Some([Folder::Error, Folder::Messages]),
            ),
        }
    }

    /// Each reply's operation as `reply` makes it, then the processed
    /// messages moved from `processed[0]` to `processed[1]`, then, if
    /// given, the incorrect ones likewise.
    fn moves(
        &self,
        reply: impl Fn(&FileName) -> Op,
        processed: [Folder; 2],
        incorrect: Option<[Folder; 2]>,
    ) -> Vec<Op> {
        let db = &self.db;
        let mv = |status, [from, to]: [Folder; 2]| {
            self.verdicts(status)
                .into_iter()
                .map(move |n| Op::mv(&n, (db, from), (db, to)))
        };
        self.replies
            .iter()
            .map(reply)
            .chain(mv(ResultStatus::Processed, processed))
            .chain(
                incorrect
                    .into_iter()
                    .flat_map(|f| mv(ResultStatus::ProcessedIncorrect, f)),
            )
            .collect()
    }
}

impl DbRecord {
    /// This database's open processes: the live one and those in doubt.
    pub(crate) fn open(&self) -> impl Iterator<Item = &Process> {
        self.process.iter().chain(&self.in_doubt)
    }

    /// The file names this database's open processes refer to.
    pub(crate) fn referenced(&self) -> impl Iterator<Item = &FileName> {
        self.open()
            .flat_map(|p| p.messages.iter().chain(p.replies.iter()))
    }

    /// Every message of this database's `Prepared` that its record names: its
    /// processes' messages and replies, and the reply names of a prepare
    /// under way (whose files may be landing).
    pub(crate) fn names_in_prepared(&self) -> HashSet<MessageId> {
        self.referenced()
            .chain(self.process.iter().flat_map(|p| p.preparing.iter()))
            .chain(self.discarding.iter().flat_map(|d| d.names.iter()))
            .map(|n| n.id)
            .collect()
    }

    /// A process ended as `state` at `now`: it is counted and kept among the
    /// database's recent ones.
    pub(crate) fn end(&mut self, mut p: Process, state: ProcessState, now: Timestamp) {
        p.state = state;
        p.ended_at = Some(now);
        p.count_end(&mut self.counters, state, now);
        tracing::info!(target: "estafeta::event", process = %p.id, db = %p.db, state = ?state, "process ended");
        self.recent.push_back(Ended::of(&p));
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
    }
}

/// A reply's way to its recipient's `Messages`: moved now, or scheduled
/// for its `deliver_at`.
fn deliver(p: &Process, name: &FileName, from: (&Id, Folder)) -> Op {
    match p.scheduled.iter().find(|(id, _)| *id == name.id) {
        Some((_, at)) => Op::Schedule {
            name: name.clone(),
            from: Location::new(from.0.clone(), from.1),
            until: *at,
        },
        None => Op::mv(name, from, (&name.to, Folder::Messages)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UlidGenerator;
    use std::time::SystemTime;

    /// A process of `db-a` started at `now`, with no messages.
    fn started_at(now: Timestamp) -> Process {
        let id = UlidGenerator::new().process_id(SystemTime::now());
        Process::started(id, Id::new("db-a").unwrap(), Vec::new(), now)
    }

    /// A database's ended processes read back whether stored as what is
    /// remembered of them or, as records saved before that, whole; both
    /// are stored again as what is remembered.
    #[test]
    fn ended_processes_read_back_in_either_stored_form() {
        let now = Timestamp::from_millis(1_764_064_800_000);
        let mut whole = started_at(now);
        whole.state = ProcessState::Done;
        whole.ended_at = Some(now);
        let ended = Ended::of(&whole);
        let stored = serde_json::json!({ "recent": [ended, whole] });
        let back: DbRecord = serde_json::from_value(stored).unwrap();
        let summaries: Vec<_> = back.recent.iter().map(Ended::summary).collect();
        assert_eq!(summaries, [ended.summary(), ended.summary()]);
        let again = serde_json::to_value(&back).unwrap();
        assert_eq!(again, serde_json::json!({ "recent": [ended, ended] }));
    }

    /// A database record saved before reads back after: the replies a
    /// commit scheduled keep the key they are stored under.
    #[test]
    fn scheduled_replies_keep_their_stored_key() {
        let now = Timestamp::from_millis(1_764_064_800_000);
        let mut process = started_at(now);
        let reply = UlidGenerator::new().message_id(SystemTime::now());
        process.scheduled.push((reply, now));
        let stored = serde_json::to_value(&process).unwrap();
        assert!(stored.get("deferred").is_some(), "{stored}");
        let back: Process = serde_json::from_value(stored).unwrap();
        assert_eq!(back.scheduled, [(reply, now)]);
    }

    /// The file operations a record keeps (a step's batch, run again after
    /// a crash) read back as they were stored, and are stored so again.
    #[test]
    fn stored_file_operations_keep_their_form() {
        let (db, phone) = (Id::new("db-a").unwrap(), Id::new("phone-1").unwrap());
        let file = FileName {
            created_at: Timestamp::from_millis(1_764_064_700_000),
            id: "01KAXPJ1NP6ZMWJ3Q6C6SS0W1B".parse().unwrap(),
            from: phone.clone(),
            to: db.clone(),
            subsystem: Id::new("sales").unwrap(),
        };
        let name = file.to_string();
        let at = Timestamp::from_millis(1_764_064_800_000);
        let due = serde_json::to_string(&at).unwrap();
        let stored = format!(
            r#"[{{"Move":{{"name":"{name}","from":["db-a","Prepared"],"to":["phone-1","Messages"]}}}},{{"Delete":{{"name":"{name}","at":["db-a","Unknown"]}}}},{{"Schedule":{{"name":"{name}","from":["db-a","Prepared"],"at":{due}}}}}]"#
        );
        let ops: Vec<Op> = serde_json::from_str(&stored).unwrap();
        assert_eq!(
            ops,
            [
                Op::mv(&file, (&db, Folder::Prepared), (&phone, Folder::Messages)),
                Op::delete(&file, (&db, Folder::Unknown)),
                Op::Schedule {
                    name: file.clone(),
                    from: Location::new(db.clone(), Folder::Prepared),
                    until: at,
                },
            ]
        );
        assert_eq!(serde_json::to_string(&ops).unwrap(), stored);
    }
}
