//! The exchange as one service: tenancy, device uploads and inboxes, the
//! six-call process protocol, recovery and retention, each a method that
//! the server's HTTP handlers call with the authenticated caller; alerts
//! and message arrivals (for push notifications) are handed to sinks the
//! server plugs in.
//!
//! Where things are, in the order a call flows through them:
//! - `protocol.rs` (processor calls, on `ProcessCalls`), `device.rs`
//!   (uploads, inbox, acks, on `DeviceCalls`), each borrowing only the
//!   parts it uses from `parts.rs`; `admin/` (provisioning, deletion,
//!   operator actions, the admin's figures and process list) and
//!   `recovery.rs`, methods of the [`Exchange`]: the calls. A call that
//!   changes a database's processes or a device's records holds that
//!   database's or device's session while it runs (`hold.rs`, its caller
//!   confirmed in the session's step).
//! - `lifecycle.rs`: the process lifecycle as one pure function (state
//!   diagram in its doc): every change of a process is an event there,
//!   and the steps it returns say what to do (batches of message moves,
//!   owner records, alerts, saves).
//! - `drive.rs`: the one interpreter of the lifecycle's steps
//!   (`Interpreter`, for calls, session hooks and the operator's actions);
//!   `drive/effects.rs`: what the steps do to the stores (a batch of moves
//!   goes to the message store, [`crate::store::MessageStore`], as one
//!   `apply`).
//! - `hooks.rs` (deadlines and start-up processing of database sessions),
//!   `recovery.rs`, `arrivals.rs` (arrivals told to the [`PushSink`] of
//!   `push.rs`), `schedule.rs` (messages scheduled for their
//!   `deliver_at`), `alerting.rs` (alerts raised and cleared through the
//!   [`AlertSink`] of `alerts.rs`), `stats.rs`.
//! - `basics.rs`: the leaf pieces every part shares (the step a command
//!   holds, the time now).
//! - `sessions.rs` and `records.rs`: the session engines (databases,
//!   devices, processes) and their record types.
//! - `snapshot.rs`: the backup's pause ([`Quiesce`]: the gates every
//!   embedded store is opened with); `observer.rs`: the server's metrics
//!   told of each durable commit ([`CommitObserver`]).
//!
//! The service reaches messages and the registry only through the store
//! traits; which implementations it runs on is the caller's choice, given
//! to [`Exchange::open`] as [`Stores`] (the embedded files and redb:
//! [`Stores::embedded`]).

mod admin;
mod alert_kind;
mod alerting;
mod alerts;
mod arrivals;
mod basics;
mod config;
mod device;
mod drive;
mod error;
mod hold;
mod hooks;
mod lifecycle;
mod observer;
mod parts;
mod phase;
mod protocol;
mod push;
mod records;
mod recovery;
mod schedule;
mod sessions;
mod snapshot;
mod stats;

pub use crate::store::Listed;
pub use admin::Totals;
pub use admin::process_tally::{ProcessTotals, Verdicts};
pub use alerts::{Alert, AlertKind, AlertSink, LogOnly, key as alert_key};
pub use config::ExchangeConfig;
pub use error::{ErrorKind, ExchangeError};
pub use observer::{CommitObserver, Durable};
pub use phase::Phase;
pub use push::{NoPush, PushSink, RecipientKind, is_link_local_or_metadata};
pub use snapshot::{Paused, Quiesce};

use crate::UlidGenerator;
use crate::keys::UploadKeys;
use crate::store::{FileStore, MessageStore, RedbRegistry, RegistryStore, Scheduled};
use crate::tenancy::Registry;
use crate::tenancy::{AdminToken, Principal};
use crate::token::{Token, TokenHash};
use crate::wire::ErrorCode;
use crate::wire::ProcessState;
use crate::wire::{
    AbortRequest, AcceptRequest, AckRequest, AckResponse, CallResponse, CommitRequest,
    MessageAccepted, PrepareRequest, ProcessStatus, RollbackRequest, SendMessage, StartRequest,
};
use admin::admin;
use device::DeviceCalls;
use estafeta_durable::WriteGate;
use estafeta_session::{Clock, RedbStorage, Storage};
use hooks::ExchangeHooks;
use parts::Parts;
use protocol::ProcessCalls;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

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
    /// Files in `Prepared` that no process referred to, moved to `Unknown`
    /// (removed with a store shared by several servers).
    pub orphans: usize,
}

/// What the start-up work done after ready ([`Exchange::tidy`]) removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tidied {
    /// Mailboxes that could not be checked or cleared (something not a
    /// folder in the way, a read error): logged, the others went on.
    pub unusable: usize,
    /// Idempotency keys past their expiry.
    pub expired_keys: usize,
    /// Files older than the retention period.
    pub expired_files: usize,
    /// Webhooks found in session records (where an earlier version kept
    /// them), moved into the registry unless it held one set since.
    pub webhooks_moved: usize,
}

pub use crate::wire::Upload;

/// Who makes a call that takes its caller's session (an upload, an
/// acknowledgement, the processor's calls). Either a bearer token the
/// registry's copy in memory knows ([`Exchange::presented`],
/// [`Exchange::present`]), checked again inside the call's step: with a
/// shared registry, against the change counter read by the statement that
/// takes the step's lock (no round trip of its own), the copy reloaded
/// first if the counter moved; a token revoked or changed through any
/// server before the step began is refused there (401, nothing written).
/// Or a principal the caller vouches for (`From<&Principal>`: one that
/// [`Exchange::authenticate`] returned, or an in-process caller), taken as
/// it is.
#[derive(Clone, Debug)]
pub struct Presented {
    who: Principal,
    /// The token's hash, to check inside the step; `None`: vouched for.
    hash: Option<TokenHash>,
}

impl Presented {
    /// Who the token belongs to by the copy in memory.
    pub fn principal(&self) -> &Principal {
        &self.who
    }
}

impl From<&Principal> for Presented {
    fn from(who: &Principal) -> Self {
        Presented {
            who: who.clone(),
            hash: None,
        }
    }
}

impl From<&Presented> for Presented {
    fn from(presented: &Presented) -> Self {
        presented.clone()
    }
}

/// Where the exchange hands what it does not handle itself: alerts for
/// administrators and arrivals for push notifications. Given at
/// [`Exchange::open`], so that start-up processing's alerts reach them.
#[derive(Clone)]
pub struct Sinks {
    /// Where alerts go.
    pub alerts: Arc<dyn AlertSink>,
    /// Where arrivals for recipients with a webhook go.
    pub push: Arc<dyn PushSink>,
}

impl Default for Sinks {
    /// Alerts only logged ([`LogOnly`]), arrivals not pushed ([`NoPush`]).
    fn default() -> Self {
        Sinks {
            alerts: Arc::new(LogOnly),
            push: Arc::new(NoPush),
        }
    }
}

/// What the exchange keeps its state in, given at [`Exchange::open`]: the
/// embedded files and redb under the data folder ([`Stores::embedded`]),
/// or a shared store that several servers use at once.
pub struct Stores {
    /// Messages and their places.
    pub messages: Arc<dyn MessageStore>,
    /// Enterprises, subsystems, databases, devices and token hashes.
    pub registry: Arc<dyn RegistryStore>,
    /// The session engines' records of databases and devices.
    pub sessions: Arc<dyn Storage>,
    /// The process engine's records: `sessions` again, or, for a shared
    /// store, a storage over connections of its own, since a call holding
    /// its database's step takes its process's step too, and calls that
    /// hold every connection of one pool must not wait on it for another.
    pub process_sessions: Arc<dyn Storage>,
    /// Messages scheduled for their `deliver_at`.
    pub scheduled: Scheduled,
    /// The devices' idempotency keys.
    pub keys: Arc<dyn UploadKeys>,
}

impl Stores {
    /// The embedded stores under `data_dir`: message files, and
    /// `registry.redb`, `sessions.redb`, `scheduled.redb` and `keys.redb`
    /// in its state folder, each opened (and repaired after a crash) here.
    /// `clock` is the one the exchange is opened with (the scheduler of
    /// scheduled messages runs on it); every store's writes pass one of
    /// `quiesce`'s gates, which an online backup closes.
    pub async fn embedded(
        data_dir: &Path,
        clock: Arc<dyn Clock>,
        quiesce: &Quiesce,
    ) -> Result<Stores, ExchangeError> {
        let layout = crate::DataLayout::new(data_dir);
        let gate = quiesce.stores();
        let registry = RedbRegistry::open_gated(&layout, gate.clone()).await?;
        let sessions = blocking(RedbStorage::open_gated, layout.sessions(), gate).await?;
        let scheduled = blocking(
            estafeta_repeat::RedbStore::open_gated,
            layout.scheduled(),
            gate,
        )
        .await?;
        let keys = blocking(crate::keys::RedbKeys::open_gated, layout.keys(), gate).await?;
        let scheduled = Scheduled::new(Arc::new(scheduled), clock);
        let messages = FileStore::open(data_dir, &scheduled, quiesce.files().clone()).await?;
        let sessions: Arc<dyn Storage> = Arc::new(sessions);
        Ok(Stores {
            messages: Arc::new(messages),
            registry: Arc::new(registry),
            process_sessions: sessions.clone(),
            sessions,
            scheduled,
            keys: Arc::new(keys),
        })
    }
}

/// Opens one embedded redb file, its writes passing `gate`, on a blocking
/// thread (an open after a crash repairs it, which reads the whole file).
async fn blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    open: fn(PathBuf, WriteGate) -> Result<T, E>,
    path: PathBuf,
    gate: &WriteGate,
) -> Result<T, ExchangeError> {
    let gate = gate.clone();
    tokio::task::spawn_blocking(move || open(path, gate))
        .await
        .map_err(|e| ExchangeError::unavailable(ErrorCode::Internal, e.to_string()))?
        .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))
}

/// The exchange service. Cheap to clone.
#[derive(Clone)]
pub struct Exchange {
    parts: Arc<Parts>,
}

impl Exchange {
    /// Open the exchange over `stores`: the registry loaded, the sessions
    /// opened, alerts and arrivals handed to `sinks`. Returns the admin
    /// token's provenance (print it when `Generated`). Call
    /// [`Exchange::recover`] before serving protocol calls: until it
    /// begins, the phase is [`Phase::Starting`].
    pub async fn open(
        config: ExchangeConfig,
        clock: Arc<dyn Clock>,
        sinks: Sinks,
        stores: Stores,
    ) -> Result<(Exchange, AdminToken), ExchangeError> {
        let configured = config
            .admin_token
            .clone()
            .map(Token::from_text)
            .transpose()?;
        let (registry, admin_token) = Registry::with_store(stores.registry, configured).await?;
        let observer = config.quiesce.observer().cloned();
        let sessions = sessions::Sessions::open(
            stores.sessions,
            stores.process_sessions,
            clock.clone(),
            observer.as_ref(),
        )
        .await?;
        // The process list this server keeps in memory as records are
        // saved: only where it sees every save (with a store other servers
        // share, the list is read from the records).
        let process_tally = (!sessions.shared()).then(admin::process_tally::ProcessTally::default);
        // The database engine's hooks reach the parts that own the engine
        // through a `Weak` to it.
        let alerting = alerting::Alerting::new(sinks.alerts, clock.clone());
        let parts = Arc::new_cyclic(|parts| Parts {
            config,
            clock,
            registry,
            store: observer::Messages::new(stores.messages, observer),
            ids: UlidGenerator::new(),
            sessions: sessions.start(Arc::new(ExchangeHooks {
                parts: parts.clone(),
            })),
            phase: watch::Sender::new(Phase::Starting),
            recovery: Default::default(),
            alerting,
            keys: stores.keys,
            scheduled: stores.scheduled.scheduler,
            scheduled_store: stores.scheduled.store,
            push: sinks.push,
            counting: Default::default(),
            process_tally,
        });
        Ok((Exchange { parts }, admin_token))
    }

    /// [`Exchange::open`] over the embedded stores under
    /// `config.data_dir` ([`Stores::embedded`]).
    pub async fn open_embedded(
        config: ExchangeConfig,
        clock: Arc<dyn Clock>,
        sinks: Sinks,
    ) -> Result<(Exchange, AdminToken), ExchangeError> {
        let stores = Stores::embedded(&config.data_dir, clock.clone(), &config.quiesce).await?;
        Exchange::open(config, clock, sinks, stores).await
    }

    /// Raise an alert found outside the exchange (free disk, an outbound
    /// host down) through the same sink, with the same tracing event.
    pub async fn raise_alert(&self, alert: Alert) {
        tracing::error!(target: "estafeta::alert", key = %alert.key, "{}", alert.text);
        self.parts.alerting.raise(alert).await;
    }

    /// The condition with `key` ended.
    pub async fn clear_alert(&self, key: String) {
        self.parts.alerting.clear(key).await;
    }

    /// The exchange's clock (its time is what alerts and schedules read).
    pub fn now(&self) -> crate::Timestamp {
        basics::now(self.parts.clock.as_ref())
    }

    /// Run a call on a task of its own, over a clone of the exchange. A caller that goes away midway (a
    /// client that disconnects or times out drops the request's future)
    /// cannot cancel it half-way: the call finishes, durable or undone, just
    /// as if the caller had waited for the answer. The task runs in the
    /// caller's span, so what it logs carries the request's id.
    pub(crate) async fn detached<T, F, Fut>(&self, call: F) -> Result<T, ExchangeError>
    where
        F: FnOnce(Exchange) -> Fut,
        Fut: std::future::Future<Output = Result<T, ExchangeError>> + Send + 'static,
        T: Send + 'static,
    {
        let call = call(self.clone()).instrument(tracing::Span::current());
        match tokio::spawn(call).await {
            Ok(result) => result,
            Err(e) => Err(ExchangeError::unavailable(
                ErrorCode::Internal,
                format!("the call did not complete: {e}"),
            )),
        }
    }

    /// Protocol calls are served in [`Phase::Ready`] only (503
    /// `not_ready` before and once stopping began).
    fn ready(&self) -> Result<(), ExchangeError> {
        let why = match *self.parts.phase.borrow() {
            Phase::Ready => return Ok(()),
            Phase::Starting | Phase::Recovering => "start-up processing is not done yet",
            Phase::Stopping => "the server is stopping",
        };
        Err(ExchangeError::unavailable(ErrorCode::NotReady, why))
    }

    /// The server's phase, to read or to wait on.
    pub fn phase(&self) -> watch::Receiver<Phase> {
        self.parts.phase.subscribe()
    }

    /// Whether the phase is [`Phase::Ready`]: start-up processing done, not
    /// stopping.
    pub fn is_ready(&self) -> bool {
        *self.parts.phase.borrow() == Phase::Ready
    }

    /// Waits until start-up processing is done (what depends on its
    /// results starts after it) or stopping began; whether the phase is
    /// [`Phase::Ready`].
    pub async fn wait_ready(&self) -> bool {
        let mut phase = self.phase();
        // Err only when the sender is gone, i.e. never while `self` lives.
        let reached = phase.wait_for(|p| *p >= Phase::Ready).await;
        reached.is_ok_and(|p| *p == Phase::Ready)
    }

    /// Stopping began: the phase becomes [`Phase::Stopping`] (readiness
    /// ends, new protocol calls answer `not_ready`); calls in flight finish.
    pub fn begin_stopping(&self) {
        self.parts.phase.send_replace(Phase::Stopping);
    }

    /// Who a bearer token belongs to (`None`: nobody, 401). With a shared
    /// registry store, what other servers changed is read first; a store
    /// that cannot be read is an error (503), not a refusal.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Principal>, ExchangeError> {
        self.parts.registry.refresh().await?;
        Ok(self.parts.registry.authenticate(token))
    }

    /// Whether `hash` is the admin token's hash now (what other servers
    /// changed read first): a dashboard login holds only while the token it
    /// was opened with is the admin token.
    pub async fn is_admin_hash(&self, hash: &TokenHash) -> Result<bool, ExchangeError> {
        self.parts.registry.refresh().await?;
        Ok(self.parts.registry.authenticate_hash(hash) == Some(Principal::Admin))
    }

    /// Who `token` belongs to by the registry's copy in memory, without
    /// reading what other servers of a shared registry changed: `None` when
    /// the copy does not know the token. The calls that take a [`Presented`]
    /// check it inside their step.
    pub fn presented(&self, token: &str) -> Option<Presented> {
        let hash = TokenHash::of(token);
        let who = self.parts.registry.authenticate_hash(&hash)?;
        Some(Presented {
            who,
            hash: Some(hash),
        })
    }

    /// [`presented`](Self::presented), or, for a token the copy in memory
    /// does not know, [`authenticate`](Self::authenticate) (what other
    /// servers changed read first): `None` is nobody (401).
    pub async fn present(&self, token: &str) -> Result<Option<Presented>, ExchangeError> {
        if let Some(presented) = self.presented(token) {
            return Ok(Some(presented));
        }
        self.parts.registry.refresh().await?;
        Ok(self.presented(token))
    }

    /// Device: upload a message to a database of its enterprise, durably.
    pub async fn send(
        &self,
        who: impl Into<Presented>,
        req: SendMessage,
    ) -> Result<(MessageAccepted, Upload), ExchangeError> {
        self.ready()?;
        let who = who.into();
        self.detached(move |ex| async move {
            let r = DeviceCalls::of(&ex.parts).send(&who, req).await;
            ex.parts.alerting.watch_storage("message upload", r).await
        })
        .await
    }

    /// Device: its unacknowledged messages, oldest first, as the JSON body
    /// of the answer (assembled from the files' bytes).
    pub async fn inbox(
        &self,
        who: impl Into<Presented>,
        limit: Option<usize>,
    ) -> Result<Vec<u8>, ExchangeError> {
        self.ready()?;
        DeviceCalls::of(&self.parts).inbox(&who.into(), limit).await
    }

    /// Device: acknowledge messages (moved to `Log`).
    pub async fn ack(
        &self,
        who: impl Into<Presented>,
        req: AckRequest,
    ) -> Result<AckResponse, ExchangeError> {
        self.ready()?;
        let who = who.into();
        self.detached(move |ex| async move { DeviceCalls::of(&ex.parts).ack(&who, req).await })
            .await
    }

    /// API_1: start a process; the JSON body of the answer.
    pub async fn start(
        &self,
        who: impl Into<Presented>,
        req: StartRequest,
    ) -> Result<Vec<u8>, ExchangeError> {
        self.ready()?;
        let who = who.into();
        self.detached(move |ex| async move { ProcessCalls::of(&ex.parts).start(&who, req).await })
            .await
    }

    /// API_2: narrow the process's list.
    pub async fn accept(
        &self,
        who: impl Into<Presented>,
        pid: &str,
        req: AcceptRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.into(), pid.to_owned());
        self.detached(
            move |ex| async move { ProcessCalls::of(&ex.parts).accept(&who, &pid, req).await },
        )
        .await
    }

    /// API_3: results and replies; READY_TO_COMMIT.
    pub async fn prepare(
        &self,
        who: impl Into<Presented>,
        pid: &str,
        req: PrepareRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.into(), pid.to_owned());
        self.detached(move |ex| async move {
            let r = ProcessCalls::of(&ex.parts).prepare(&who, &pid, req).await;
            ex.parts.alerting.watch_storage("prepare", r).await
        })
        .await
    }

    /// API_4: the processor committed.
    pub async fn commit(
        &self,
        who: impl Into<Presented>,
        pid: &str,
        _req: CommitRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.into(), pid.to_owned());
        self.detached(move |ex| async move {
            let r = ProcessCalls::of(&ex.parts).commit(&who, &pid).await;
            ex.parts.alerting.watch_storage("commit", r).await
        })
        .await
    }

    /// API_5: the processor's commit failed.
    pub async fn rollback(
        &self,
        who: impl Into<Presented>,
        pid: &str,
        req: RollbackRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.into(), pid.to_owned());
        self.detached(move |ex| async move {
            ProcessCalls::of(&ex.parts)
                .give_up(&who, &pid, ProcessState::RolledBack, &req.error_text)
                .await
        })
        .await
    }

    /// API_6: the processor gave up.
    pub async fn abort(
        &self,
        who: impl Into<Presented>,
        pid: &str,
        req: AbortRequest,
    ) -> Result<CallResponse, ExchangeError> {
        self.ready()?;
        let (who, pid) = (who.into(), pid.to_owned());
        self.detached(move |ex| async move {
            ProcessCalls::of(&ex.parts)
                .give_up(&who, &pid, ProcessState::Aborted, &req.message)
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
        ProcessCalls::of(&self.parts).status(who, pid).await
    }

    /// Move scheduled messages (`deliver_at`) into their queues as they
    /// come due, until `stop` is cancelled. Run it once, beside serving.
    pub async fn run_deliveries(&self, stop: CancellationToken) -> Result<(), ExchangeError> {
        let parts = self.parts.clone();
        let handler = move |entry: estafeta_repeat::Entry| {
            let parts = parts.clone();
            async move { DeviceCalls::of(&parts).deliver_due(entry).await }
        };
        self.parts
            .scheduled
            .run(
                estafeta_repeat::WorkerPool::new(4),
                handler,
                stop.cancelled(),
            )
            .await
            .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))
    }

    /// Messages scheduled for their `deliver_at` (the first `limit`,
    /// soonest first): each entry's payload is the message file.
    pub async fn scheduled(
        &self,
        limit: usize,
    ) -> Result<Vec<estafeta_repeat::Entry>, ExchangeError> {
        let listed = Listed(self.parts.scheduled_store.clone());
        tokio::task::spawn_blocking(move || listed.entries(crate::store::SCHEDULED_SOURCE, limit))
            .await
            .map_err(|e| ExchangeError::unavailable(ErrorCode::Internal, e.to_string()))?
            .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))
    }

    /// The scheduled-delivery store's counts (backlog) and dispatch figures.
    pub async fn scheduled_stats(&self) -> Result<estafeta_repeat::Stats, ExchangeError> {
        self.parts
            .scheduled
            .stats()
            .await
            .map_err(|e| ExchangeError::unavailable(ErrorCode::StorageError, e.to_string()))
    }

    /// Stop: refuse new calls ([`Exchange::begin_stopping`]), let running
    /// ones finish, save sessions.
    pub async fn shutdown(&self) -> Result<(), ExchangeError> {
        self.begin_stopping();
        self.parts.scheduled.close().await;
        self.parts.sessions.stop().await?;
        self.parts.store.close().await;
        Ok(())
    }

    /// Admin: waits for the durable writes under way to end and holds back
    /// new ones (reads go on) until the guard is dropped: the data folder on
    /// disk is then a state a crash could have left, safe to copy.
    pub async fn pause_writes(&self, who: &Principal) -> Result<Paused, ExchangeError> {
        admin(who)?;
        Ok(self.parts.config.quiesce.pause().await)
    }

    /// The session engines' figures, added up (for metrics).
    pub fn session_stats(&self) -> estafeta_session::Stats {
        self.parts.sessions.stats()
    }
}
