//! What each step of the lifecycle does to the stores: a batch of message
//! moves handed to the message store, owner records written, discarded
//! replies deleted, an ended process counted.

use super::Interpreter;
use crate::error::MailboxError;
use crate::service::alert_kind::AlertKind;
use crate::service::alerts::Alert;
use crate::service::basics::{Held, again};
use crate::service::error::ExchangeError;
use crate::service::hold::hold;
use crate::service::records::{Owner, ProcessRecord};
use crate::store::{FileName, Folder, Location, Op};
use crate::wire::ProcessState;
use crate::{Id, ProcessId};

impl Interpreter<'_> {
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
        crate::service::arrivals::announce(self.registry, self.push, &applied.arrivals, registry)
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
        let expiry = ended.map(|_| self.clock.now().after(self.retention));
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
        let mut g = hold(&self.sessions.process, pid, "process").await?;
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
        if let (Some(state), Some(o)) = (ended, self.observer) {
            o.ended(state);
        }
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
        let prepared = Location::new(db.clone(), Folder::Prepared);
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
}
