//! Counters a database session keeps about its processes, saved with the
//! session (so they are as durable as the process state and cost no write
//! of their own): they are updated only where the record changes anyway,
//! when a process ends or goes in doubt.

use crate::{Id, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A database's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct DbCounters {
    /// Processes that ended (any way).
    pub(crate) ended: u64,
    /// Messages committed PROCESSED.
    pub(crate) processed: u64,
    /// Messages reported PROCESSED_DEADLOCK in committed processes.
    pub(crate) deadlocks: u64,
    /// Messages committed PROCESSED_INCORRECT.
    pub(crate) incorrect: u64,
    /// Replies committed.
    pub(crate) replies: u64,
    /// Processes ended by rollback, abort or timeout.
    pub(crate) not_committed: u64,
    /// Processes that went in doubt.
    pub(crate) in_doubt: u64,
    /// The last PROCESSED_INCORRECT error (code and text).
    pub(crate) last_error: Option<String>,
    /// When a process of this database last ended or went in doubt.
    pub(crate) last_seen: Option<Timestamp>,
    /// The committed verdicts by the device (or database) that sent the
    /// message.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) by_sender: BTreeMap<Id, SenderCounts>,
}

/// The committed verdicts on one sender's messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct SenderCounts {
    /// Committed PROCESSED.
    pub(crate) processed: u64,
    /// Reported PROCESSED_DEADLOCK in a committed process.
    pub(crate) deadlocks: u64,
    /// Committed PROCESSED_INCORRECT.
    pub(crate) incorrect: u64,
}

impl SenderCounts {
    /// Adds `other`'s counts.
    pub(crate) fn add(&mut self, other: &SenderCounts) {
        self.processed += other.processed;
        self.deadlocks += other.deadlocks;
        self.incorrect += other.incorrect;
    }
}

impl DbCounters {
    /// Whether nothing was counted (the record then leaves them out).
    pub(crate) fn is_empty(&self) -> bool {
        *self == DbCounters::default()
    }

    /// A process went in doubt at `now`.
    pub(crate) fn went_in_doubt(&mut self, now: Timestamp) {
        self.in_doubt += 1;
        self.last_seen = Some(now);
    }
}

/// A device's counters, kept in its session and saved with it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct DeviceCounters {
    /// Messages uploaded (new ones, not repeats).
    pub(crate) sent: u64,
    /// Bytes of the message bodies uploaded.
    pub(crate) bytes: u64,
    /// Uploads that repeated an idempotency key (answered with the
    /// earlier id).
    pub(crate) duplicates: u64,
    /// Replies acknowledged.
    pub(crate) acked: u64,
    /// When the device last uploaded or acknowledged.
    pub(crate) last_seen: Option<Timestamp>,
}

impl DeviceCounters {
    /// Whether nothing was counted (the record then leaves them out).
    pub(crate) fn is_empty(&self) -> bool {
        *self == DeviceCounters::default()
    }
}
