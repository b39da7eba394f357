//! The six processor calls (API_1 … API_6) and the process status, each a
//! command on the database's session: two calls for one database never
//! interleave, and the process record is durable before the answer. A call
//! checks its request, then hands the process lifecycle an event
//! ([`super::lifecycle`]) and carries out its steps ([`Interpreter::drive`]).

use super::Presented;
use super::drive::Interpreter;
use super::error::ExchangeError;
use super::hold::hold_for;
use super::lifecycle::{self, Answer, Event};
use super::observer::Messages;
use super::parts::Parts;
use super::records::{DbRecord, Verdict};
use super::sessions::Sessions;
use crate::store::Limits;
use crate::store::{FileName, Filter, Folder, Location};
use crate::tenancy::{Principal, Registry, Role};
use crate::wire::ErrorCode;
use crate::wire::{
    AcceptRequest, CallResponse, CallStatus, Message, PrepareRequest, ProcessState, ProcessStatus,
    StartRequest, StartResponse, Version,
};
use crate::{Id, MessageId, ProcessId, Timestamp, UlidGenerator};
use estafeta_session::{Clock, SessionGuard};
use std::collections::HashSet;

type Guard = SessionGuard<Id, DbRecord>;

fn answer(a: Answer) -> CallResponse {
    CallResponse::new(match a {
        Answer::Ok => CallStatus::Ok,
        Answer::Failed => CallStatus::Failed,
        Answer::Cancelled | Answer::Busy => CallStatus::Cancelled,
    })
}

/// The database a processor's token stands for, and its enterprise.
fn database_of(who: &Principal) -> Result<(Id, &Id), ExchangeError> {
    match who {
        Principal::Database { id, enterprise } => Ok((id.clone(), enterprise)),
        _ => Err(ExchangeError::forbidden("this call needs a database token")),
    }
}

/// What the processor calls use of the exchange, and nothing more.
pub(crate) struct ProcessCalls<'a> {
    /// The time of each call: new ids, reply timestamps, deadlines.
    clock: &'a dyn Clock,
    /// New process and reply ids.
    ids: &'a UlidGenerator,
    /// The server's limits for a process start.
    limits: &'a Limits,
    /// Who the replies may go to; confirms a presented token.
    registry: &'a Registry,
    /// The database's queue and its `Prepared`.
    store: &'a Messages,
    /// The databases' sessions, and the process records.
    sessions: &'a Sessions,
    /// How an event changes a database's record, and what it does.
    lifecycle: Interpreter<'a>,
}

impl<'a> ProcessCalls<'a> {
    /// The parts the processor calls use.
    pub(crate) fn of(parts: &'a Parts) -> ProcessCalls<'a> {
        ProcessCalls {
            clock: parts.clock.as_ref(),
            ids: &parts.ids,
            limits: &parts.config.limits,
            registry: &parts.registry,
            store: &parts.store,
            sessions: &parts.sessions,
            lifecycle: Interpreter::of(parts),
        }
    }

    fn now(&self) -> Timestamp {
        super::basics::now(self.clock)
    }

    /// The session of `db`, the database of `who`, held, the caller
    /// confirmed in its step ([`hold_for`]).
    async fn db_session(&self, db: &Id, who: &Presented) -> Result<Guard, ExchangeError> {
        hold_for(self.registry, &self.sessions.db, db, "database", who).await
    }

    /// Find `pid` for database `db`: `None` if it is not a process id; with
    /// how its owner record says it ended when the database holds it no
    /// more. 403 if it belongs to another database.
    async fn locate(
        &self,
        db: &Id,
        pid: &str,
        g: &Guard,
    ) -> Result<Option<(ProcessId, Option<ProcessState>)>, ExchangeError> {
        let Ok(pid) = pid.parse::<ProcessId>() else {
            return Ok(None);
        };
        if lifecycle::holds(g.state(), &pid) {
            return Ok(Some((pid, None)));
        }
        match self.sessions.owner(&pid).await? {
            Some(o) if &o.db != db => Err(ExchangeError::forbidden(
                "the process belongs to another database",
            )),
            o => Ok(Some((pid, o.and_then(|o| o.ended)))),
        }
    }

    /// API_1.
    pub(crate) async fn start(
        &self,
        who: &Presented,
        req: StartRequest,
    ) -> Result<Vec<u8>, ExchangeError> {
        let (db, _) = database_of(&who.who)?;
        if req.db_id != db {
            return Err(ExchangeError::forbidden(
                "db_id is not the token's database",
            ));
        }
        let limits = self
            .limits
            .narrow(req.max_files, req.max_mb)
            .map_err(|e| ExchangeError::bad_request(ErrorCode::BadLimits, e.to_string()))?;
        let filter = Filter::new(req.subsystems, req.senders);
        let mut g = self.db_session(&db, who).await?;
        if !lifecycle::can_start(g.state()) {
            tracing::info!(target: "estafeta::event", db = %db, "start answered BUSY");
            return Ok(json(&StartResponse::busy()));
        }
        let queue = Location::new(db.clone(), Folder::Messages);
        let chosen = self.store.select(&queue, &filter, limits).await?;
        if chosen.is_empty() {
            return Ok(json(&StartResponse::idle()));
        }
        let names: Vec<_> = chosen.into_iter().map(|e| e.name).collect();
        let raw = self.store.read_array(&queue, &names).await?;
        if raw.names.is_empty() {
            return Ok(json(&StartResponse::idle()));
        }
        let pid = self.ids.process_id(self.clock.now().to_system_time());
        let event = Event::Start {
            pid,
            db: db.clone(),
            messages: raw.names,
        };
        if self.lifecycle.drive(&mut g, event, true).await? == Answer::Busy {
            return Ok(json(&StartResponse::busy()));
        }
        g.release().await?;
        tracing::info!(target: "estafeta::event", process = %pid, db = %db, "process started");
        Ok(StartResponse::ok_json_from_raw(pid, &raw.json))
    }

    /// API_2.
    pub(crate) async fn accept(
        &self,
        who: &Presented,
        pid: &str,
        req: AcceptRequest,
    ) -> Result<CallResponse, ExchangeError> {
        let (db, _) = database_of(&who.who)?;
        let mut g = self.db_session(&db, who).await?;
        let Some((pid, _)) = self.locate(&db, pid, &g).await? else {
            return Ok(answer(Answer::Cancelled));
        };
        let Some(p) = lifecycle::started(g.state(), &pid) else {
            return Ok(answer(Answer::Cancelled));
        };
        let known: HashSet<MessageId> = p.messages.iter().map(|n| n.id).collect();
        if let Some(bad) = req.message_ids.iter().find(|id| !known.contains(id)) {
            return Err(ExchangeError::unprocessable(
                ErrorCode::NotInProcess,
                format!("message {bad} is not in this process"),
            ));
        }
        let narrowed = req.message_ids.len();
        let event = Event::Accept {
            pid,
            ids: req.message_ids,
        };
        let a = self.lifecycle.drive(&mut g, event, true).await?;
        g.release().await?;
        tracing::info!(target: "estafeta::event", process = %pid, db = %db, accepted = narrowed, "process narrowed (accept)");
        Ok(answer(a))
    }

    /// API_3.
    pub(crate) async fn prepare(
        &self,
        who: &Presented,
        pid: &str,
        req: PrepareRequest,
    ) -> Result<CallResponse, ExchangeError> {
        let (db, enterprise) = database_of(&who.who)?;
        let mut g = self.db_session(&db, who).await?;
        let Some((pid, _)) = self.locate(&db, pid, &g).await? else {
            return Ok(answer(Answer::Cancelled));
        };
        let Some(p) = lifecycle::started(g.state(), &pid) else {
            return Ok(answer(Answer::Cancelled));
        };
        let accepted = p.accepted_names();
        // Every accepted message exactly once.
        let mut verdicts = Vec::with_capacity(req.results.len());
        let mut seen = HashSet::new();
        for r in &req.results {
            let Some(name) = accepted.iter().find(|n| n.id == r.message_id) else {
                return Err(ExchangeError::unprocessable(
                    ErrorCode::ResultsMismatch,
                    format!("{} is not an accepted message", r.message_id),
                ));
            };
            if !seen.insert(r.message_id) {
                return Err(ExchangeError::unprocessable(
                    ErrorCode::ResultsMismatch,
                    format!("{} is named twice", r.message_id),
                ));
            }
            verdicts.push(Verdict {
                name: name.clone(),
                status: r.status,
                error_code: r.error_code,
                error_text: r.error_text.clone(),
            });
        }
        if seen.len() != accepted.len() {
            return Err(ExchangeError::unprocessable(
                ErrorCode::ResultsMismatch,
                "every accepted message needs exactly one result",
            ));
        }
        let default_subsystem = accepted
            .first()
            .map_or_else(|| db.clone(), |n| n.subsystem.clone());
        let now = self.now();
        let mut replies = Vec::with_capacity(req.replies.len());
        let mut scheduled = Vec::new();
        for r in req.replies {
            let endpoint = self
                .registry
                .endpoint(&r.to)
                .filter(|e| &e.enterprise == enterprise)
                .ok_or_else(|| {
                    ExchangeError::unprocessable(
                        ErrorCode::UnknownRecipient,
                        format!("{} is not an endpoint of this enterprise", r.to),
                    )
                })?;
            let subsystem = match endpoint.role {
                Role::Device { subsystem } => subsystem,
                _ => default_subsystem.clone(),
            };
            let id = self.ids.message_id(self.clock.now().to_system_time());
            if let Some(at) = r.deliver_at.filter(|at| *at > now) {
                scheduled.push((id, at));
            }
            replies.push(Message {
                version: Version,
                id,
                from: db.clone(),
                to: r.to,
                subsystem,
                created_at: r.created_at.unwrap_or(now),
                body: r.body,
            });
        }
        let prepared = Location::new(db.clone(), Folder::Prepared);
        let names: Vec<FileName> = replies.iter().map(FileName::of).collect();
        let joined = match g.step() {
            Some(step) => self.store.put_all_in_step(step, &prepared, &replies)?,
            None => None,
        };
        let written = match joined {
            // The replies are rows of the database's step: durable with the
            // save of their names, in one transaction, or not at all.
            Some(_) => {
                let a = self
                    .lifecycle
                    .drive(&mut g, Event::Preparing { pid, names }, false)
                    .await?;
                if a != Answer::Ok {
                    return Ok(answer(a));
                }
                replies.iter().map(FileName::of).collect()
            }
            None => {
                // The reply names are durable before the files appear, so
                // that a crash in between leaves no orphans: start-up
                // processing deletes the files of a prepare that was never
                // answered. The files are written and fsynced while the
                // names are saved.
                let (go, when) = tokio::sync::oneshot::channel();
                let saving = async {
                    let a = self
                        .lifecycle
                        .drive(&mut g, Event::Preparing { pid, names }, false)
                        .await;
                    // For the fault-injection harness: a crash with the
                    // names recorded and no reply published.
                    fail::fail_point!("prepare::recorded");
                    let _ = go.send(matches!(a, Ok(Answer::Ok)));
                    a
                };
                let (a, written) =
                    tokio::join!(saving, self.store.put_all(&prepared, &replies, when));
                let a = a?;
                if a != Answer::Ok {
                    return Ok(answer(a));
                }
                written?.into_iter().map(|e| e.name).collect()
            }
        };
        // For the fault-injection harness: a crash with the replies stored
        // and the process not yet READY_TO_COMMIT.
        fail::fail_point!("prepare::written");
        let event = Event::Prepared {
            pid,
            results: verdicts,
            replies: written,
            scheduled,
        };
        // A failed save leaves the replies where they are: the record
        // names them (as a prepare under way, or, should the save have
        // been made after all, as the process's replies), and whatever
        // ends the process removes or delivers them.
        let a = self.lifecycle.drive(&mut g, event, true).await?;
        g.release().await?;
        tracing::info!(target: "estafeta::event", process = %pid, db = %db, "process READY_TO_COMMIT (prepare)");
        Ok(answer(a))
    }

    /// API_4 (and the operator settling a process in doubt as committed).
    pub(crate) async fn commit(
        &self,
        who: &Presented,
        pid: &str,
    ) -> Result<CallResponse, ExchangeError> {
        let (db, _) = database_of(&who.who)?;
        let mut g = self.db_session(&db, who).await?;
        let Some((pid, ended)) = self.locate(&db, pid, &g).await? else {
            tracing::info!(target: "estafeta::event", process = pid, db = %db, "commit answered CANCELLED");
            return Ok(answer(Answer::Cancelled));
        };
        let a = self
            .lifecycle
            .drive(&mut g, Event::Commit { pid, ended }, true)
            .await?;
        g.release().await?;
        Ok(answer(a))
    }

    /// API_5 and API_6 (and the operator settling a process in doubt as
    /// rolled back): the processor's transaction did not commit.
    pub(crate) async fn give_up(
        &self,
        who: &Presented,
        pid: &str,
        as_state: ProcessState,
        text: &str,
    ) -> Result<CallResponse, ExchangeError> {
        let (db, _) = database_of(&who.who)?;
        let mut g = self.db_session(&db, who).await?;
        let Some((pid, ended)) = self.locate(&db, pid, &g).await? else {
            tracing::info!(target: "estafeta::event", process = pid, db = %db, state = ?as_state, "rollback or abort answered CANCELLED");
            return Ok(answer(Answer::Cancelled));
        };
        tracing::info!(target: "estafeta::event", process = %pid, db = %db, state = ?as_state, text, "processor gave up");
        let event = Event::GiveUp {
            pid,
            as_state,
            ended,
        };
        let a = self.lifecycle.drive(&mut g, event, true).await?;
        g.release().await?;
        Ok(answer(a))
    }

    /// GET /v1/processes/{pid}.
    pub(crate) async fn status(
        &self,
        who: &Principal,
        pid: &str,
    ) -> Result<ProcessStatus, ExchangeError> {
        let not_found = || ExchangeError::not_found("no such process");
        let pid: ProcessId = pid.parse().map_err(|_| not_found())?;
        let owner = self.sessions.owner(&pid).await?.ok_or_else(not_found)?;
        match who {
            Principal::Admin => {}
            Principal::Database { id, .. } if *id == owner.db => {}
            _ => {
                return Err(ExchangeError::forbidden(
                    "the process belongs to another database",
                ));
            }
        }
        // The database record first: a process's owner record may say how
        // it will end while the database still holds it.
        let (live, remembered) = match self.sessions.db.get(owner.db.clone(), false).await? {
            Some(g) => {
                let rec = g.state();
                let live = rec.open().find(|p| p.id == pid).map(|p| p.state);
                let remembered = rec.recent.iter().find(|e| e.id == pid).map(|e| e.state);
                (live, remembered)
            }
            None => (None, None),
        };
        let state = live.or(owner.ended).or(remembered).ok_or_else(not_found)?;
        Ok(ProcessStatus {
            version: Version,
            process_id: pid,
            db_id: owner.db,
            state,
        })
    }
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}
