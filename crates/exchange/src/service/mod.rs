//! The exchange as one service: tenancy, device uploads and inboxes, the
//! six-call process protocol, recovery and retention, each a method that
//! the server's HTTP handlers call with the authenticated caller; alerts
//! and message arrivals (for push notifications) are handed to sinks the
//! server plugs in.
//!
//! Where things are:
//! - `lifecycle.rs`: the process lifecycle as one pure function (state
//!   diagram in its doc): every change of a process is an event there.
//! - `core.rs`: the service's parts and the driver that carries out the
//!   lifecycle's steps (owner records, file moves, alerts, saves).
//! - `protocol.rs` (processor calls), `device.rs` (uploads, inbox, acks),
//!   `hooks.rs` (deadlines and start-up processing of database sessions),
//!   `operator.rs`, `recovery.rs`, `admin.rs`, `push.rs`, `schedule.rs`.
//! - `sessions.rs` and `state.rs`: the session engines (databases,
//!   devices, processes) and their record types.

mod admin;
mod alert_kind;
mod alerts;
mod config;
mod core;
mod device;
mod error;
mod hooks;
mod lifecycle;
mod manage;
mod operator;
mod protocol;
mod push;
mod recovery;
mod schedule;
mod sessions;
mod state;
mod stats;

pub use alerts::{Alert, AlertKind, AlertSink, LogOnly, key as alert_key};
pub use config::ExchangeConfig;
pub use error::{ErrorKind, ExchangeError};
pub use push::{NoPush, PushSink, RecipientKind, is_link_local_or_metadata};
pub use schedule::Listed;

use crate::mailbox::Folder;
use crate::mailbox::{Mailboxes, SyncConfig};
use crate::tenancy::Registry;
use crate::tenancy::{AdminToken, Principal};
use crate::token::Token;
use crate::wire::ErrorCode;
use crate::wire::ProcessState;
use crate::wire::{
    AbortRequest, AcceptRequest, AckRequest, AckResponse, CallResponse, CommitRequest,
    FolderListing, MessageAccepted, PrepareRequest, ProcessList, ProcessStatus, RollbackRequest,
    SendMessage, StartRequest, Stats,
};
use crate::{Id, UlidGenerator};
use admin::admin;
use core::Core;
use estafeta_session::{Clock, RedbStorage};
use hooks::ExchangeHooks;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

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

pub use crate::wire::Upload;

/// The exchange service. Cheap to clone.
#[derive(Clone)]
pub struct Exchange {
    core: Arc<Core>,
}

impl Exchange {
    /// Open the data folder: registry, mailboxes, sessions. Returns the admin
    /// token's provenance (print it when `Generated`). Call
    /// [`Exchange::recover`] before serving protocol calls.
    pub async fn open(
        config: ExchangeConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<(Exchange, AdminToken), ExchangeError> {
        let layout = crate::DataLayout::new(&config.data_dir);
        let (registry, admin_token) = Registry::open(&layout, config.admin_token.clone()).await?;
        let mailboxes = Mailboxes::open(&config.data_dir, SyncConfig::default()).await?;
        let sessions_path = layout.sessions();
        let storage = tokio::task::spawn_blocking(move || RedbStorage::open(sessions_path))
            .await
            .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))?
            .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))?;
        let scheduled_path = layout.scheduled();
        let scheduled =
            tokio::task::spawn_blocking(move || estafeta_repeat::RedbStore::open(scheduled_path))
                .await
                .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))?
                .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))?;
        let scheduled = Arc::new(scheduled);
        let deferred = estafeta_repeat::Scheduler::new(
            schedule::Listed(scheduled.clone()),
            schedule::WallClock(clock.clone()),
            estafeta_repeat::Options::default(),
        );
        let core = Arc::new(Core {
            config,
            clock: clock.clone(),
            registry,
            mailboxes,
            ids: UlidGenerator::new(),
            sessions: OnceLock::new(),
            ready: Default::default(),
            recovery: Default::default(),
            alerts: std::sync::RwLock::new(Arc::new(LogOnly)),
            storage_alert: Default::default(),
            deferred,
            deferred_store: scheduled,
            push: std::sync::RwLock::new(Arc::new(NoPush)),
            webhooks: Default::default(),
            became_ready: tokio::sync::Notify::new(),
            started: tokio::sync::watch::Sender::new(false),
        });
        let hooks = Arc::new(ExchangeHooks {
            core: Arc::downgrade(&core),
        });
        let sessions = sessions::Sessions::open(Arc::new(storage), clock, hooks).await?;
        let _ = core.sessions.set(sessions);
        Ok((Exchange { core }, admin_token))
    }

    /// Send alerts to `sink` from now on (the default only logs them). Set
    /// it before [`Exchange::recover`] so start-up alerts reach it.
    pub fn set_alert_sink(&self, sink: Arc<dyn AlertSink>) {
        *self
            .core
            .alerts
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = sink;
    }

    /// Raise an alert found outside the exchange (free disk, an outbound
    /// host down) through the same sink, with the same tracing event.
    pub async fn raise_alert(&self, alert: Alert) {
        tracing::error!(target: "estafeta::alert", key = %alert.key, "{}", alert.text);
        self.core.alert_sink().raise(alert).await;
    }

    /// The condition with `key` ended.
    pub async fn clear_alert(&self, key: String) {
        self.core.alert_sink().clear(key).await;
    }

    /// The exchange's clock (its time is what alerts and schedules read).
    pub fn now(&self) -> crate::Timestamp {
        self.core.now()
    }

    /// Run a call on a task of its own. A caller that goes away midway (a
    /// client that disconnects or times out drops the request's future)
    /// cannot cancel it half-way: the call finishes, durable or undone, just
    /// as if the caller had waited for the answer.
    pub(crate) async fn detached<T, F, Fut>(&self, call: F) -> Result<T, ExchangeError>
    where
        F: FnOnce(Arc<Core>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ExchangeError>> + Send + 'static,
        T: Send + 'static,
    {
        match tokio::spawn(call(self.core.clone())).await {
            Ok(result) => result,
            Err(e) => Err(ExchangeError::unavailable(
                ErrorCode::Internal,
                format!("the call did not complete: {e}"),
            )),
        }
    }

    fn ready(&self) -> Result<(), ExchangeError> {
        if self.is_ready() {
            Ok(())
        } else {
            Err(ExchangeError::unavailable(
                ErrorCode::NotReady,
                "start-up processing is not done yet",
            ))
        }
    }

    /// Start-up processing (API.md, seed 004): timed-out STARTED removed,
    /// CLEANUP finished, READY_TO_COMMIT put in doubt, orphans in `Prepared`
    /// moved to `Unknown`, retention applied. Protocol calls answer 503
    /// (`not_ready`) until it has run.
    pub async fn recover(&self) -> Result<RecoveryReport, ExchangeError> {
        self.core.recover().await
    }

    /// Whether start-up processing is done.
    pub fn is_ready(&self) -> bool {
        self.core.ready.load(Ordering::SeqCst)
    }

    /// Waits until start-up processing is done (what depends on its
    /// results, such as the webhooks it loads, starts after it).
    pub async fn wait_ready(&self) {
        loop {
            let woken = self.core.became_ready.notified();
            let mut woken = std::pin::pin!(woken);
            woken.as_mut().enable();
            if self.is_ready() {
                return;
            }
            woken.await;
        }
    }

    /// Who a bearer token belongs to.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        self.core.registry.authenticate(token)
    }

    /// Admin: create an enterprise (409 if it exists).
    pub async fn create_enterprise(&self, who: &Principal, id: Id) -> Result<(), ExchangeError> {
        admin(who)?;
        Ok(self.core.registry.create_enterprise(id).await?)
    }

    /// Admin: create a subsystem of an enterprise.
    pub async fn create_subsystem(
        &self,
        who: &Principal,
        enterprise: Id,
        id: Id,
    ) -> Result<(), ExchangeError> {
        admin(who)?;
        Ok(self.core.registry.create_subsystem(enterprise, id).await?)
    }

    /// Admin: create a database of an enterprise; its token, shown once.
    pub async fn create_database(
        &self,
        who: &Principal,
        enterprise: Id,
        id: Id,
    ) -> Result<Token, ExchangeError> {
        admin(who)?;
        self.core.create_database(enterprise, id).await
    }

    /// Admin: create a device of an enterprise and subsystem; its token.
    pub async fn create_device(
        &self,
        who: &Principal,
        enterprise: Id,
        id: Id,
        subsystem: Id,
    ) -> Result<Token, ExchangeError> {
        admin(who)?;
        self.core.create_device(enterprise, id, subsystem).await
    }

    /// Admin: the live, in-doubt and recently ended processes.
    pub async fn processes(&self, who: &Principal) -> Result<ProcessList, ExchangeError> {
        admin(who)?;
        self.core.processes().await
    }

    /// Admin: counters per database and device.
    pub async fn stats(&self, who: &Principal) -> Result<Stats, ExchangeError> {
        admin(who)?;
        self.core.stats().await
    }

    /// Admin: the files of one folder of one mailbox.
    pub async fn folder(
        &self,
        who: &Principal,
        mailbox: Id,
        folder: Folder,
    ) -> Result<FolderListing, ExchangeError> {
        admin(who)?;
        self.core.folder(mailbox, folder).await
    }

    /// Device: upload a message to a database of its enterprise, durably.
    pub async fn send(
        &self,
        who: &Principal,
        req: SendMessage,
    ) -> Result<(MessageAccepted, Upload), ExchangeError> {
        self.ready()?;
        let who = who.clone();
        self.detached(move |core| async move {
            let r = core.send(&who, req).await;
            core.watch_storage("message upload", r).await
        })
        .await
    }

    /// Device: its unacknowledged messages, oldest first, as the JSON body
    /// of the answer (assembled from the files' bytes).
    pub async fn inbox(
        &self,
        who: &Principal,
        limit: Option<usize>,
    ) -> Result<Vec<u8>, ExchangeError> {
        self.ready()?;
        self.core.inbox(who, limit).await
    }

    /// Device: acknowledge messages (moved to `Log`).
    pub async fn ack(
        &self,
        who: &Principal,
        req: AckRequest,
    ) -> Result<AckResponse, ExchangeError> {
        self.ready()?;
        let who = who.clone();
        self.detached(move |core| async move { core.ack(&who, req).await })
            .await
    }

    /// API_1: start a process; the JSON body of the answer.
    pub async fn start(
        &self,
        who: &Principal,
        req: StartRequest,
    ) -> Result<Vec<u8>, ExchangeError> {
        self.ready()?;
        let who = who.clone();
        self.detached(move |core| async move { core.start(&who, req).await })
            .await
    }

    /// API_2: narrow the process's list.
    pub async fn accept(
        &self,
        who: &Principal,
        pid: &str,
        req: AcceptRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.clone(), pid.to_owned());
        self.detached(move |core| async move { core.accept(&who, &pid, req).await })
            .await
    }

    /// API_3: results and replies; READY_TO_COMMIT.
    pub async fn prepare(
        &self,
        who: &Principal,
        pid: &str,
        req: PrepareRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.clone(), pid.to_owned());
        self.detached(move |core| async move {
            let r = core.prepare(&who, &pid, req).await;
            core.watch_storage("prepare", r).await
        })
        .await
    }

    /// API_4: the processor committed.
    pub async fn commit(
        &self,
        who: &Principal,
        pid: &str,
        _req: CommitRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.clone(), pid.to_owned());
        self.detached(move |core| async move {
            let r = core.commit(&who, &pid).await;
            core.watch_storage("commit", r).await
        })
        .await
    }

    /// API_5: the processor's commit failed.
    pub async fn rollback(
        &self,
        who: &Principal,
        pid: &str,
        req: RollbackRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.clone(), pid.to_owned());
        self.detached(move |core| async move {
            core.give_up(&who, &pid, ProcessState::RolledBack, &req.error_text)
                .await
        })
        .await
    }

    /// API_6: the processor gave up.
    pub async fn abort(
        &self,
        who: &Principal,
        pid: &str,
        req: AbortRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.clone(), pid.to_owned());
        self.detached(move |core| async move {
            core.give_up(&who, &pid, ProcessState::Aborted, &req.message)
                .await
        })
        .await
    }

    /// A process's state (404 for an id never issued).
    pub async fn process_status(
        &self,
        who: &Principal,
        pid: &str,
    ) -> Result<ProcessStatus, ExchangeError> {
        self.ready()?;
        self.core.status(who, pid).await
    }

    /// Remove files older than the retention period (never one a live
    /// process refers to); the number removed.
    pub async fn retention_sweep(&self) -> Result<usize, ExchangeError> {
        self.core.retention_sweep().await
    }

    /// Move scheduled messages (`deliver_at`) into their queues as they
    /// come due, until `shutdown` resolves. Run it once, beside serving.
    pub async fn run_deliveries(
        &self,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), ExchangeError> {
        let core = self.core.clone();
        let handler = move |entry: estafeta_repeat::Entry| {
            let core = core.clone();
            async move { core.deliver_due(entry).await }
        };
        self.core
            .deferred
            .run(estafeta_repeat::WorkerPool::new(4), handler, shutdown)
            .await
            .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))
    }

    /// Messages kept aside until their `deliver_at` (the first `limit`,
    /// soonest first): each entry's payload is the message file.
    pub async fn scheduled(
        &self,
        limit: usize,
    ) -> Result<Vec<estafeta_repeat::Entry>, ExchangeError> {
        let listed = schedule::Listed(self.core.deferred_store.clone());
        tokio::task::spawn_blocking(move || listed.entries(schedule::SOURCE, limit))
            .await
            .map_err(|e| ExchangeError::unavailable(ErrorCode::Internal, e.to_string()))?
            .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))
    }

    /// The scheduled-delivery store's counts (backlog) and dispatch figures.
    pub async fn scheduled_stats(&self) -> Result<estafeta_repeat::Stats, ExchangeError> {
        self.core
            .deferred
            .stats()
            .await
            .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))
    }

    /// Stop: refuse new calls, let running ones finish, save sessions.
    pub async fn shutdown(&self) -> Result<(), ExchangeError> {
        self.core.deferred.close().await;
        self.core.sessions()?.stop().await?;
        Ok(())
    }

    /// The session engines' figures, added up (for metrics).
    pub fn session_stats(&self) -> Option<estafeta_session::Stats> {
        self.core.sessions.get().map(sessions::Sessions::stats)
    }
}
