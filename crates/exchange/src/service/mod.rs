//! The exchange as one service: tenancy, device uploads and inboxes, the
//! six-call process protocol, recovery and retention, each a method that
//! the server's HTTP handlers call with the authenticated caller.

mod config;
mod error;

pub use config::ExchangeConfig;
pub use error::{ErrorKind, ExchangeError};

use crate::mailbox::Folder;
use crate::tenancy::{AdminToken, Principal};
use crate::token::Token;
use crate::wire::{
    AbortRequest, AckRequest, AckResponse, AcceptRequest, CallResponse, CommitRequest, FolderListing, MessageAccepted,
    PrepareRequest, ProcessList, ProcessStatus, RollbackRequest, SendMessage, StartRequest, Stats,
};
use crate::Id;
use estafeta_session::Clock;
use std::sync::Arc;

/// What start-up processing found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Databases looked at.
    pub databases: usize,
    /// STARTED processes past their timeout, removed.
    pub timed_out: usize,
    /// CLEANUP (or FAILED) processes whose moves were finished.
    pub cleanups_finished: usize,
    /// READY_TO_COMMIT processes put in doubt.
    pub in_doubt: usize,
    /// Files in `Prepared` that no process referred to, moved to `Unknown`.
    pub orphans: usize,
    /// Files removed by retention.
    pub expired_files: usize,
}

/// Whether an upload made a new message or found the earlier one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upload {
    /// A new message (201).
    Created,
    /// The same idempotency key from the same device: the earlier id (200).
    Repeated,
}

/// The exchange service. Cheap to clone.
#[derive(Clone)]
pub struct Exchange {
    _clock: Arc<dyn Clock>,
}

fn not_built() -> ExchangeError {
    ExchangeError::unavailable("not_ready", "not built yet")
}

impl Exchange {
    /// Open the data folder: registry, mailboxes, sessions. Returns the admin
    /// token's provenance (print it when `Generated`). Call
    /// [`Exchange::recover`] before serving protocol calls.
    pub async fn open(_config: ExchangeConfig, clock: Arc<dyn Clock>) -> Result<(Exchange, AdminToken), ExchangeError> {
        let _ = clock;
        Err(not_built())
    }

    /// Start-up processing (API.md, seed 004): timed-out STARTED removed,
    /// CLEANUP finished, READY_TO_COMMIT put in doubt, orphans in `Prepared`
    /// moved to `Unknown`, retention applied. Protocol calls answer 503
    /// (`not_ready`) until it has run.
    pub async fn recover(&self) -> Result<RecoveryReport, ExchangeError> {
        Err(not_built())
    }

    /// Whether start-up processing is done.
    pub fn is_ready(&self) -> bool {
        false
    }

    /// Who a bearer token belongs to.
    pub fn authenticate(&self, _token: &str) -> Option<Principal> {
        None
    }

    /// Admin: create an enterprise (409 if it exists).
    pub async fn create_enterprise(&self, _who: &Principal, _id: Id) -> Result<(), ExchangeError> {
        Err(not_built())
    }

    /// Admin: create a subsystem of an enterprise.
    pub async fn create_subsystem(&self, _who: &Principal, _enterprise: Id, _id: Id) -> Result<(), ExchangeError> {
        Err(not_built())
    }

    /// Admin: create a database of an enterprise; its token, shown once.
    pub async fn create_database(&self, _who: &Principal, _enterprise: Id, _id: Id) -> Result<Token, ExchangeError> {
        Err(not_built())
    }

    /// Admin: create a device of an enterprise and subsystem; its token.
    pub async fn create_device(
        &self,
        _who: &Principal,
        _enterprise: Id,
        _id: Id,
        _subsystem: Id,
    ) -> Result<Token, ExchangeError> {
        Err(not_built())
    }

    /// Admin: every process not yet forgotten.
    pub async fn processes(&self, _who: &Principal) -> Result<ProcessList, ExchangeError> {
        Err(not_built())
    }

    /// Admin: counters per database and device.
    pub async fn stats(&self, _who: &Principal) -> Result<Stats, ExchangeError> {
        Err(not_built())
    }

    /// Admin: the files of one folder of one mailbox.
    pub async fn folder(&self, _who: &Principal, _mailbox: Id, _folder: Folder) -> Result<FolderListing, ExchangeError> {
        Err(not_built())
    }

    /// Device: upload a message to a database of its enterprise, durably.
    pub async fn send(&self, _who: &Principal, _req: SendMessage) -> Result<(MessageAccepted, Upload), ExchangeError> {
        Err(not_built())
    }

    /// Device: its unacknowledged messages, oldest first, as the JSON body
    /// of the answer (assembled from the files' bytes).
    pub async fn inbox(&self, _who: &Principal, _limit: Option<usize>) -> Result<Vec<u8>, ExchangeError> {
        Err(not_built())
    }

    /// Device: acknowledge messages (moved to `Log`).
    pub async fn ack(&self, _who: &Principal, _req: AckRequest) -> Result<AckResponse, ExchangeError> {
        Err(not_built())
    }

    /// API_1: start a process; the JSON body of the answer.
    pub async fn start(&self, _who: &Principal, _req: StartRequest) -> Result<Vec<u8>, ExchangeError> {
        Err(not_built())
    }

    /// API_2: narrow the process's list.
    pub async fn accept(&self, _who: &Principal, _pid: &str, _req: AcceptRequest) -> Result<CallResponse, ExchangeError> {
        Err(not_built())
    }

    /// API_3: results and replies; READY_TO_COMMIT.
    pub async fn prepare(&self, _who: &Principal, _pid: &str, _req: PrepareRequest) -> Result<CallResponse, ExchangeError> {
        Err(not_built())
    }

    /// API_4: the processor committed.
    pub async fn commit(&self, _who: &Principal, _pid: &str, _req: CommitRequest) -> Result<CallResponse, ExchangeError> {
        Err(not_built())
    }

    /// API_5: the processor's commit failed.
    pub async fn rollback(&self, _who: &Principal, _pid: &str, _req: RollbackRequest) -> Result<CallResponse, ExchangeError> {
        Err(not_built())
    }

    /// API_6: the processor gave up.
    pub async fn abort(&self, _who: &Principal, _pid: &str, _req: AbortRequest) -> Result<CallResponse, ExchangeError> {
        Err(not_built())
    }

    /// A process's state (404 for an id never issued).
    pub async fn process_status(&self, _who: &Principal, _pid: &str) -> Result<ProcessStatus, ExchangeError> {
        Err(not_built())
    }

    /// Remove files older than the retention period (never one a live
    /// process refers to); the number removed.
    pub async fn retention_sweep(&self) -> Result<usize, ExchangeError> {
        Err(not_built())
    }

    /// Stop: refuse new calls, let running ones finish, save sessions.
    pub async fn shutdown(&self) -> Result<(), ExchangeError> {
        Err(not_built())
    }
}
