//! The shared core of the service: its parts, the clock, and what the
//! lifecycle's steps do to the stores (a batch of message moves handed to
//! the message store, owner records, discarded replies), which the
//! interpreter in `drive.rs` calls.

use super::ExchangeConfig;
use super::alert_kind::AlertKind;
use super::alerts::Alert;
use super::basics::{Held, again, now};
use super::error::ExchangeError;
use super::lifecycle::Ctx;
use super::records::{DbRecord, Owner, ProcessRecord};
use super::sessions::Sessions;
use crate::error::MailboxError;
use crate::store::{FileName, Folder, Location, Op};
use crate::tenancy::Registry;
use crate::wire::ErrorCode;
use crate::wire::ProcessState;
use crate::{Id, MessageId, ProcessId, Timestamp, UlidGenerator};
use estafeta_session::{Clock, Engine, SessionGuard, State};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

/// Counters of start-up processing, filled by the first-load hook.
#[derive(Default)]
pub(crate) struct RecoveryCounters {
    pub(crate) timed_out: AtomicUsize,
    pub(crate) cleanups: AtomicUsize,
    pub(crate) in_doubt: AtomicUsize,
}

pub(crate) struct Core {
    pub(crate) config: ExchangeConfig,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) registry: Registry,
    /// Where messages live, its writes told to the commit observer.
    pub(crate) store: super::observer::Messages,
    pub(crate) ids: UlidGenerator,
    /// The engines; their hooks reach the core through a `Weak` to it.
    pub(crate) sessions: Sessions,
    /// The server's phase: the exchange moves it, everyone reads it.
    pub(crate) phase: tokio::sync::watch::Sender<super::Phase>,
    pub(crate) recovery: RecoveryCounters,
    /// Where alerts go, and the storage-write condition.
    pub(crate) alerting: super::alerting::Alerting,
    /// The devices' idempotency keys.
    pub(crate) keys: std::sync::Arc<dyn crate::keys::UploadKeys>,
    /// Messages scheduled for their `deliver_at`.
    pub(crate) scheduled: std::sync::Arc<crate::store::scheduled::DeliveryScheduler>,
    /// The store under `scheduled`, read to list what is scheduled.
    pub(crate) scheduled_store: Arc<dyn estafeta_repeat::store::Store>,
    /// Where arrivals are pushed.
    pub(crate) push: Arc<dyn super::push::PushSink>,
    /// Set once every registered mailbox has been told to the store's
    /// running totals (those registered later are told as they are).
    pub(crate) counting: tokio::sync::OnceCell<()>,
    /// The processes of every database, kept as their records are saved:
    /// only where this server sees every save (a store of its own; with a
    /// shared store the list is read from the records when asked).
    pub(crate) process_tally: Option<super::admin::process_tally::ProcessTally>,
}

pub(crate) fn count(c: &AtomicUsize) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The session of `id` in `engine`, held (made if new); `what` names its
/// kind in the error of an engine that has none to give.
pub(crate) async fn hold<S: State>(
    engine: &Engine<Id, S>,
    id: &Id,
    what: &str,
) -> Result<SessionGuard<Id, S>, ExchangeError> {
    engine.get(id.clone(), true).await?.ok_or_else(|| {
        ExchangeError::unavailable(
            ErrorCode::StorageError,
            format!("{what} session unavailable"),
        )
    })
}

/// The session of `id` (the device or database of `who`) in `engine`,
/// held ([`hold`]), once `who` is confirmed ([`confirm`]) against
/// `registry` with the change counter its step's lock read. A token that
/// is no longer `who`'s is refused (401) and the session released,
/// nothing written.
pub(crate) async fn hold_for<S: State>(
    registry: &Registry,
    engine: &Engine<Id, S>,
    id: &Id,
    what: &str,
    who: &super::Presented,
) -> Result<SessionGuard<Id, S>, ExchangeError> {
    let mut g = hold(engine, id, what).await?;
    if who.hash.is_none() {
        return Ok(g);
    }
    let version = g.step().and_then(|step| registry.version_in_step(step));
    match confirm(registry, who, version).await {
        Ok(()) => Ok(g),
        Err(refused) => {
            g.release().await?;
            Err(refused)
        }
    }
}

/// Confirms `who`: a principal vouched for as it is; a presented token
/// against `registry` brought up to date, with a shared registry to
/// `version`, its change counter as a statement of the call read it (a
/// step's lock, or the call's read): reloaded only when it moved; without
/// one, the counter is read first. A token that is no longer `who`'s is
/// refused (401).
pub(crate) async fn confirm(
    registry: &Registry,
    who: &super::Presented,
    version: Option<u64>,
) -> Result<(), ExchangeError> {
    let Some(hash) = &who.hash else {
        return Ok(());
    };
    match version {
        Some(version) => registry.refresh_to(version).await?,
        None => registry.refresh().await?,
    }
    match registry.authenticate_hash(hash).as_ref() == Some(&who.who) {
        true => Ok(()),
        false => Err(ExchangeError::unauthorized("unknown token")),
    }
}

impl Core {
    pub(crate) fn now(&self) -> Timestamp {
        now(self.clock.as_ref())
    }

    pub(crate) fn now_system(&self) -> SystemTime {
        self.clock.now().to_system_time()
    }

    pub(crate) fn session_now(&self) -> estafeta_session::Timestamp {
        self.clock.now()
    }

    /// Hand a step's batch to the message store, in `held`, the step the
    /// batch's session holds (see [`Held`]). An op whose message is already
    /// where it should be, or gone, counts as done (it was done before a
    /// crash, or retention removed the message); a missing one raises an
    /// alert. The recipients are told of their arrivals with the registry
    /// as of `registry`, a shared registry's change counter read with the
    /// lock of the step that holds the batch's session (`None`: the
    /// counter is read first).
    pub(crate) async fn run_ops(
        &self,
        mut held: Held<'_>,
        ops: &[Op],
        registry: Option<u64>,
    ) -> Result<(), MailboxError> {
        // Named points for the fault-injection harness: a crash (or a
        // pause) after the step that recorded the batch and before the
        // store has any of it, and a crash once the store has all of it
        // (run again after the crash, each op finds itself done).
        fail::fail_point!("messages::apply");
        let applied = self.store.apply(again(&mut held), ops).await;
        fail::fail_point!("messages::applied");
        super::arrivals::announce(
            &self.registry,
            self.push.as_ref(),
            &applied.arrivals,
            registry,
        )
        .await;
        let mut first_error = None;
        for (op, r) in ops.iter().zip(applied.results) {
            let Err(e) = r else { continue };
            match &e {
                // A reply delivered by an earlier attempt and acknowledged
                // since (in its recipient's `Log`): done, not missing.
                MailboxError::NotFound { .. } if self.delivered_before(op).await => {}
                MailboxError::NotFound { name, .. } => {
                    let alert = Alert::new(
                        AlertKind::MissingFile,
                        name,
                        format!(
                            "{e}: lost, or removed by hand or by retention; the step is counted as done"
                        ),
                        self.now(),
                    );
                    self.alerting.raise_in(again(&mut held), alert).await;
                }
                _ => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Whether `op` delivers a message into another mailbox that holds it
    /// already (in `Messages`, `Log`, `Unknown` or `Error`): a move redone
    /// after its recipient took the message on.
    async fn delivered_before(&self, op: &Op) -> bool {
        match op {
            Op::Move { name, from, to } if from.mailbox != to.mailbox => {
                self.store.delivered(name).await.unwrap_or(false)
            }
            _ => false,
        }
    }

    /// Record in the process's own session who owns it and how it ended
    /// (unless it says so already); or that it lives (`ended: None`), if it
    /// has no owner record yet. In `held` when the session store writes
    /// other keys' records in a step (a shared store): then durable with
    /// the step's save, fenced by its lock. Else through the process's own
    /// session: durably for an end; a live process's record in the
    /// background (see [`Step::Owner`](super::lifecycle::Step::Owner): start-up processing writes it again
    /// when a crash lost it).
    pub(crate) async fn write_owner(
        &self,
        held: Held<'_>,
        pid: &ProcessId,
        db: &Id,
        ended: Option<ProcessState>,
    ) -> Result<(), ExchangeError> {
        let wanted = Owner {
            db: db.clone(),
            ended,
        };
        let expiry = ended.map(|_| self.session_now().after(self.config.retention));
        if let Some(step) = held {
            let record = ProcessRecord {
                owner: Some(wanted.clone()),
            };
            let write = self.sessions.process_write(pid, record, expiry)?;
            if step.put_beside(write, ended.is_none()) {
                self.count_end(ended);
                return Ok(());
            }
        }
        let mut g = self
            .sessions
            .process
            .get(*pid, true)
            .await?
            .ok_or_else(|| {
                ExchangeError::unavailable(ErrorCode::StorageError, "process record unavailable")
            })?;
        match &g.state().owner {
            Some(_) if ended.is_none() => return Ok(()),
            Some(o) if *o == wanted && !g.is_dirty() => return Ok(()),
            _ => {}
        }
        g.persistent_mut().owner = Some(wanted);
        g.set_expires_at(expiry);
        if ended.is_some() {
            g.release().await?;
            self.count_end(ended);
        }
        // Dropped with its change: saved in the background, the process's
        // key held until then.
        Ok(())
    }

    /// Tells the commit observer that a process ended (counted once, by the
    /// write that records the end).
    pub(crate) fn count_end(&self, ended: Option<ProcessState>) {
        if let (Some(state), Some(o)) = (ended, self.config.quiesce.observer()) {
            o.ended(state);
        }
    }

    /// The owner record of a process, if it was ever issued.
    pub(crate) async fn owner(&self, pid: &ProcessId) -> Result<Option<Owner>, ExchangeError> {
        let Some(g) = self.sessions.process.get(*pid, false).await? else {
            return Ok(None);
        };
        let owner = g.state().owner.clone();
        drop(g);
        Ok(owner)
    }

    /// Delete reply files from a database's `Prepared` (a missing one
    /// counts as deleted), in `held`. A store out of reach fails the step:
    /// it comes before the step's save, so the record keeps naming the
    /// files and the step is tried again (a call answered 503, a deadline
    /// retried). Other failures are logged: start-up processing moves
    /// leftovers to `Unknown`.
    pub(crate) async fn discard_prepared(
        &self,
        held: Held<'_>,
        db: &Id,
        names: &[FileName],
    ) -> Result<(), ExchangeError> {
        if names.is_empty() {
            return Ok(());
        }
        let prepared = self.location(db, Folder::Prepared);
        let deletes: Vec<Op> = names
            .iter()
            .map(|name| Op::Delete {
                name: name.clone(),
                at: prepared.clone(),
            })
            .collect();
        let mut unreachable = None;
        for r in self.store.apply(held, &deletes).await.results {
            match r {
                Ok(_) | Err(MailboxError::NotFound { .. }) => {}
                Err(e) if e.is_unavailable() => unreachable = Some(e),
                Err(e) => {
                    tracing::warn!(error = %e, "deleting the replies of an unanswered prepare")
                }
            }
        }
        match unreachable {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// The lifecycle's view of the time and the timeouts now.
    pub(crate) fn ctx(&self) -> Ctx {
        Ctx {
            now: self.now(),
            started_timeout: self.config.started_timeout,
            ready_timeout: self.config.ready_timeout,
        }
    }

    /// The file names a mailbox's live and in-doubt processes refer to.
    pub(crate) fn referenced(rec: &DbRecord) -> impl Iterator<Item = &FileName> {
        rec.process
            .iter()
            .chain(rec.in_doubt.iter())
            .flat_map(|p| p.messages.iter().chain(p.replies.iter()))
    }

    /// Every message of `rec`'s `Prepared` that its record names: its
    /// processes' messages and replies, and the reply names of a prepare
    /// under way (whose files may be landing).
    pub(crate) fn names_in_prepared(rec: &DbRecord) -> HashSet<MessageId> {
        Core::referenced(rec)
            .chain(rec.process.iter().flat_map(|p| p.preparing.iter()))
            .chain(rec.discarding.iter().flat_map(|d| d.names.iter()))
            .map(|n| n.id)
            .collect()
    }

    pub(crate) fn location(&self, id: &Id, folder: Folder) -> Location {
        Location::new(id.clone(), folder)
    }
}
