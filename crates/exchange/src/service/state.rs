//! What the exchange keeps in its sessions.
//!
//! One session engine holds three kinds of session, told apart by key:
//! `db/<id>` for a database (its live process, its processes in doubt and
//! the last ended ones), `dev/<id>` for a device (its recent idempotency
//! keys), and `pid/<process id>` for a process (which database it belongs
//! to and how it ended, kept for the retention period so that a late call
//! is answered correctly). One record type serves all three; each uses its
//! own fields.

use super::stats::{DbCounters, DeviceCounters};
use crate::mailbox::{FileName, Folder, Location};
use crate::wire::{ProcessState, ResultStatus};
use crate::{Id, MessageId, ProcessId, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// How many ended processes a database session remembers in full (for the
/// admin list); older ones are only in their `pid/` sessions.
pub(crate) const RECENT: usize = 32;

pub(crate) fn db_key(id: &Id) -> String {
    format!("db/{id}")
}
pub(crate) fn dev_key(id: &Id) -> String {
    format!("dev/{id}")
}
pub(crate) fn pid_key(pid: &ProcessId) -> String {
    format!("pid/{pid}")
}

/// A session's record.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Record {
    /// `db/`: the process that has not ended (at most one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) process: Option<Process>,
    /// `db/`: processes in doubt, waiting for a late commit or rollback.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) in_doubt: Vec<Process>,
    /// `db/`: the last ended processes, newest last.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub(crate) recent: VecDeque<Process>,
    /// `dev/`: idempotency key → the message it made.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) keys: BTreeMap<String, Upload>,
    /// `pid/`: where a process lives and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<Owner>,
    /// `db/`: counters of the database's processes.
    #[serde(default, skip_serializing_if = "DbCounters::is_empty")]
    pub(crate) counters: DbCounters,
    /// `dev/`: counters of the device's uploads and acknowledgements.
    #[serde(default, skip_serializing_if = "DeviceCounters::is_empty")]
    pub(crate) device: DeviceCounters,
    /// `db/` and `dev/`: where arrivals are pushed ([`super::push`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) webhook: Option<String>,
}

impl Record {
    /// A database's process ended as `state` at `now`: it is counted and
    /// kept among the recent ones.
    pub(crate) fn end(&mut self, mut p: Process, state: ProcessState, now: Timestamp) {
        p.state = state;
        p.ended_at = Some(now);
        self.counters.ended(&p, state, now);
        p.pending.clear();
        p.target = None;
        tracing::info!(target: "estafeta::event", process = %p.id, db = %p.db, state = ?state, "process ended");
        self.recent.push_back(p);
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
    }
}

/// A device upload with an idempotency key: written into the device
/// session before the message file, so that a retry after a crash in
/// between writes the same file rather than a second message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Upload {
    #[serde(with = "display")]
    pub(crate) name: FileName,
    pub(crate) at: Timestamp,
}

/// The `pid/` record.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    #[serde(with = "display_vec")]
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
    #[serde(default, with = "display_vec")]
    pub(crate) preparing: Vec<FileName>,
    /// The replies written to `Prepared` (API_3).
    #[serde(default, with = "display_vec")]
    pub(crate) replies: Vec<FileName>,
    /// File moves and deletes decided but maybe not all done: the intent
    /// record. Each is idempotent, so after a crash they are simply run
    /// again; when all are done the process ends as `target`.
    #[serde(default)]
    pub(crate) pending: Vec<Step>,
    #[serde(default)]
    pub(crate) target: Option<ProcessState>,
    /// Failed attempts to run `pending` (for the retry backoff).
    #[serde(default)]
    pub(crate) attempts: u32,
    /// Replies with a `deliver_at`: kept aside at commit until that time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) deferred: Vec<(MessageId, Timestamp)>,
}

impl Process {
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

/// A processor's verdict on one message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Verdict {
    #[serde(with = "display")]
    pub(crate) name: FileName,
    pub(crate) status: ResultStatus,
    #[serde(default)]
    pub(crate) error_code: Option<i64>,
    #[serde(default)]
    pub(crate) error_text: Option<String>,
}

/// One idempotent file operation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Step {
    Move {
        #[serde(with = "display")]
        name: FileName,
        from: (Id, Folder),
        to: (Id, Folder),
    },
    Delete {
        #[serde(with = "display")]
        name: FileName,
        at: (Id, Folder),
    },
    /// Keep the file aside until `at` (scheduled delivery), then it leaves `from`.
    Schedule {
        #[serde(with = "display")]
        name: FileName,
        from: (Id, Folder),
        at: Timestamp,
    },
}

impl Step {
    pub(crate) fn mv(name: &FileName, from: (&Id, Folder), to: (&Id, Folder)) -> Step {
        Step::Move {
            name: name.clone(),
            from: (from.0.clone(), from.1),
            to: (to.0.clone(), to.1),
        }
    }
    /// A reply's way to its recipient's `Messages`: moved now, or kept
    /// aside until its `deliver_at`.
    pub(crate) fn deliver(p: &Process, name: &FileName, from: (&Id, Folder)) -> Step {
        match p.deferred.iter().find(|(id, _)| *id == name.id) {
            Some((_, at)) => Step::Schedule {
                name: name.clone(),
                from: (from.0.clone(), from.1),
                at: *at,
            },
            None => Step::mv(name, from, (&name.to, Folder::Messages)),
        }
    }
    pub(crate) fn delete(name: &FileName, at: (&Id, Folder)) -> Step {
        Step::Delete {
            name: name.clone(),
            at: (at.0.clone(), at.1),
        }
    }
}

pub(crate) fn loc((id, folder): &(Id, Folder)) -> Location {
    Location::new(id.clone(), *folder)
}

/// Serde through `Display` and `FromStr` (file names are stored as names).
mod display {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};
    use std::fmt::Display;
    use std::str::FromStr;

    pub(crate) fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }
    pub(crate) fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let s = String::deserialize(d)?;
        s.parse().map_err(D::Error::custom)
    }
}

mod display_vec {
    use serde::{Deserialize, Deserializer, Serializer, de::Error, ser::SerializeSeq};
    use std::fmt::Display;
    use std::str::FromStr;

    pub(crate) fn serialize<T: Display, S: Serializer>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(v.len()))?;
        for x in v {
            seq.serialize_element(&x.to_string())?;
        }
        seq.end()
    }
    pub(crate) fn deserialize<'de, T, D>(d: D) -> Result<Vec<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|s| s.parse().map_err(D::Error::custom))
            .collect()
    }
}
