//! The six processor calls (API_1 … API_6) and the process status, each a
//! command on the database's session: two calls for one database never
//! interleave, and the process record is durable before the answer.

use super::core::Core;
use super::error::ExchangeError;
use super::state::{Process, Record, Step, Verdict, db_key};
use crate::mailbox::{FileName, Filter, Folder};
use crate::tenancy::{Principal, Role};
use crate::wire::{
    AcceptRequest, CallResponse, CallStatus, Message, PrepareRequest, ProcessState, ProcessStatus,
    ResultStatus, StartRequest, StartResponse, Version,
};
use crate::{Id, MessageId, ProcessId};
use estafeta_session::SessionGuard;
use std::collections::HashSet;

type Guard = SessionGuard<String, Record>;

/// Where a process id was found for a call.
enum Found {
    /// The database's live process.
    Live,
    /// Among the database's processes in doubt, at this index.
    InDoubt(usize),
    /// Ended in this state.
    Ended(ProcessState),
    /// Never issued.
    Unknown,
}

fn answer(status: CallStatus) -> CallResponse {
    CallResponse::new(status)
}

/// The database a processor's token stands for.
pub(crate) fn database_of(who: &Principal) -> Result<Id, ExchangeError> {
    match who {
        Principal::Database { id, .. } => Ok(id.clone()),
        _ => Err(ExchangeError::forbidden("this call needs a database token")),
    }
}

impl Core {
    async fn db_session(&self, db: &Id) -> Result<Guard, ExchangeError> {
        self.sessions()?
            .get(db_key(db), true)
            .await?
            .ok_or_else(|| {
                ExchangeError::unavailable("storage_error", "database session unavailable")
            })
    }

    /// Find `pid` for database `db`: 403 if it belongs to another database.
    async fn locate(
        &self,
        db: &Id,
        pid: &str,
        g: &Guard,
    ) -> Result<(Found, Option<ProcessId>), ExchangeError> {
        let Ok(pid) = pid.parse::<ProcessId>() else {
            return Ok((Found::Unknown, None));
        };
        let rec = g.state();
        if rec.process.as_ref().is_some_and(|p| p.id == pid) {
            return Ok((Found::Live, Some(pid)));
        }
        if let Some(i) = rec.in_doubt.iter().position(|p| p.id == pid) {
            return Ok((Found::InDoubt(i), Some(pid)));
        }
        match self.owner(&pid).await? {
            None => Ok((Found::Unknown, Some(pid))),
            Some(o) if &o.db != db => Err(ExchangeError::forbidden(
                "the process belongs to another database",
            )),
            Some(o) => Ok((o.ended.map_or(Found::Unknown, Found::Ended), Some(pid))),
        }
    }

    /// The database's session, held, if `pid` is its live process and still
    /// STARTED (`None`: the call is answered CANCELLED).
    async fn started(&self, db: &Id, pid: &str) -> Result<Option<Guard>, ExchangeError> {
        let g = self.db_session(db).await?;
        let (found, _) = self.locate(db, pid, &g).await?;
        let started = matches!(found, Found::Live)
            && g.state()
                .process
                .as_ref()
                .is_some_and(|p| p.state == ProcessState::Started);
        Ok(started.then_some(g))
    }

    /// API_1.
    pub(crate) async fn start(
        &self,
        who: &Principal,
        req: StartRequest,
    ) -> Result<Vec<u8>, ExchangeError> {
        let db = database_of(who)?;
        if req.db_id != db {
            return Err(ExchangeError::forbidden(
                "db_id is not the token's database",
            ));
        }
        let limits = self
            .config
            .limits
            .narrow(req.max_files, req.max_mb)
            .map_err(|e| ExchangeError::bad_request("bad_limits", e.to_string()))?;
        let filter = Filter::new(req.subsystems, req.senders);
        let mut g = self.db_session(&db).await?;
        if g.state().process.is_some() {
            tracing::info!(target: "estafeta::event", db = %db, "start answered BUSY");
            return Ok(json(&StartResponse::busy()));
        }
        let queue = self.location(&db, Folder::Messages);
        let chosen = self.mailboxes.select(&queue, &filter, limits).await?;
        if chosen.is_empty() {
            return Ok(json(&StartResponse::idle()));
        }
        let names: Vec<_> = chosen.into_iter().map(|e| e.name).collect();
        let raw = self.mailboxes.read_array(&queue, &names).await?;
        if raw.names.is_empty() {
            return Ok(json(&StartResponse::idle()));
        }
        let pid = self.ids.process_id(self.now_system());
        self.write_owner(&pid, &db, None).await?;
        let process = Process {
            id: pid,
            db: db.clone(),
            state: ProcessState::Started,
            started_at: self.now(),
            ready_at: None,
            ended_at: None,
            messages: raw.names,
            accepted: None,
            results: Vec::new(),
            preparing: Vec::new(),
            replies: Vec::new(),
            pending: Vec::new(),
            target: None,
            attempts: 0,
            deferred: Vec::new(),
        };
        let deadline = self.session_now().after(self.config.started_timeout);
        g.update(|s| {
            s.persistent_mut().process = Some(process);
            s.set_expires_at(Some(deadline));
            Ok::<_, ExchangeError>(())
        })
        .await?;
        g.release().await?;
        tracing::info!(target: "estafeta::event", process = %pid, db = %db, "process started");
        Ok(StartResponse::ok_json_from_raw(pid, &raw.json))
    }

    /// API_2.
    pub(crate) async fn accept(
        &self,
        who: &Principal,
        pid: &str,
        req: AcceptRequest,
    ) -> Result<CallResponse, ExchangeError> {
        let db = database_of(who)?;
        let Some(mut g) = self.started(&db, pid).await? else {
            return Ok(answer(CallStatus::Cancelled));
        };
        let Some(p) = g.state().process.as_ref() else {
            return Ok(answer(CallStatus::Cancelled));
        };
        let known: HashSet<MessageId> = p.messages.iter().map(|n| n.id).collect();
        if let Some(bad) = req.message_ids.iter().find(|id| !known.contains(id)) {
            return Err(ExchangeError::unprocessable(
                "not_in_process",
                format!("message {bad} is not in this process"),
            ));
        }
        let narrowed = req.message_ids.len();
        g.update(|s| {
            if let Some(p) = s.persistent_mut().process.as_mut() {
                p.accepted = Some(req.message_ids);
            }
            Ok::<_, ExchangeError>(())
        })
        .await?;
        g.release().await?;
        tracing::info!(target: "estafeta::event", process = pid, db = %db, accepted = narrowed, "process narrowed (accept)");
        Ok(answer(CallStatus::Ok))
    }

    /// API_3.
    pub(crate) async fn prepare(
        &self,
        who: &Principal,
        pid: &str,
        req: PrepareRequest,
    ) -> Result<CallResponse, ExchangeError> {
        let db = database_of(who)?;
        let Principal::Database { enterprise, .. } = who else {
            return Err(ExchangeError::forbidden("database token needed"));
        };
        let Some(mut g) = self.started(&db, pid).await? else {
            return Ok(answer(CallStatus::Cancelled));
        };
        let Some(p) = g.state().process.as_ref() else {
            return Ok(answer(CallStatus::Cancelled));
        };
        let accepted = p.accepted_names();
        // Every accepted message exactly once.
        let mut verdicts = Vec::with_capacity(req.results.len());
        let mut seen = HashSet::new();
        for r in &req.results {
            let Some(name) = accepted.iter().find(|n| n.id == r.message_id) else {
                return Err(ExchangeError::unprocessable(
                    "results_mismatch",
                    format!("{} is not an accepted message", r.message_id),
                ));
            };
            if !seen.insert(r.message_id) {
                return Err(ExchangeError::unprocessable(
                    "results_mismatch",
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
                "results_mismatch",
                "every accepted message needs exactly one result",
            ));
        }
        let default_subsystem = accepted
            .first()
            .map_or_else(|| db.clone(), |n| n.subsystem.clone());
        let now = self.now();
        let mut replies = Vec::with_capacity(req.replies.len());
        let mut deferred = Vec::new();
        for r in req.replies {
            let endpoint = self
                .registry
                .endpoint(&r.to)
                .filter(|e| &e.enterprise == enterprise)
                .ok_or_else(|| {
                    ExchangeError::unprocessable(
                        "unknown_recipient",
                        format!("{} is not an endpoint of this enterprise", r.to),
                    )
                })?;
            let subsystem = match endpoint.role {
                Role::Device { subsystem } => subsystem,
                _ => default_subsystem.clone(),
            };
            let id = self.ids.message_id(self.now_system());
            if let Some(at) = r.deliver_at.filter(|at| *at > now) {
                deferred.push((id, at));
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
        let prepared = self.location(&db, Folder::Prepared);
        // The reply names are durable before the files are written, so that
        // a crash in between leaves no orphans: start-up processing deletes
        // the files of a prepare that was never answered.
        if let Some(p) = g.state().process.as_ref() {
            self.discard_prepared(&db, &p.preparing).await;
        }
        g.update(|s| {
            if let Some(p) = s.persistent_mut().process.as_mut() {
                p.preparing = replies.iter().map(FileName::of).collect();
            }
            Ok::<_, ExchangeError>(())
        })
        .await?;
        let written = self.mailboxes.write_all(&prepared, &replies).await?;
        let ready_deadline = self.session_now().after(self.config.ready_timeout);
        let updated = g.update(|s| {
            if let Some(p) = s.persistent_mut().process.as_mut() {
            p.results = verdicts;
            p.replies = written.iter().map(|e| e.name.clone()).collect();
            p.preparing.clear();
            p.deferred = deferred;
            p.state = ProcessState::ReadyToCommit;
            p.ready_at = Some(now);
            for v in &p.results {
                if v.status == ResultStatus::ProcessedIncorrect {
                    tracing::warn!(
                        target: "estafeta::event", process = %p.id, db = %p.db, message = %v.name.id,
                        code = ?v.error_code, text = ?v.error_text, "message processed incorrectly"
                    );
                }
            }
            }
            s.set_expires_at(Some(ready_deadline));
            Ok::<_, ExchangeError>(())
        })
        .await;
        if let Err(e) = updated {
            let names: Vec<_> = written.into_iter().map(|e| e.name).collect();
            for r in self.mailboxes.delete_all(&prepared, &names).await {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "removing a reply after a failed prepare");
                }
            }
            return Err(e);
        }
        g.release().await?;
        tracing::info!(target: "estafeta::event", process = pid, db = %db, "process READY_TO_COMMIT (prepare)");
        Ok(answer(CallStatus::Ok))
    }

    /// API_4.
    pub(crate) async fn commit(
        &self,
        who: &Principal,
        pid: &str,
    ) -> Result<CallResponse, ExchangeError> {
        let db = database_of(who)?;
        let mut g = self.db_session(&db).await?;
        let (found, _) = self.locate(&db, pid, &g).await?;
        match found {
            Found::Live => {
                let state = g.state().process.as_ref().map(|p| p.state);
                match state {
                    Some(ProcessState::ReadyToCommit) => {
                        // The intent record first: CLEANUP with every move
                        // decided, durable before the first file moves.
                        let steps = g
                            .state()
                            .process
                            .as_ref()
                            .map(|p| self.commit_steps(p))
                            .unwrap_or_default();
                        g.update(|s| {
                            if let Some(p) = s.persistent_mut().process.as_mut() {
                                p.state = ProcessState::Cleanup;
                                p.pending = steps;
                                p.target = Some(ProcessState::Done);
                            }
                            s.set_expires_at(None);
                            Ok::<_, ExchangeError>(())
                        })
                        .await?;
                        self.cleanup(g).await
                    }
                    Some(ProcessState::Cleanup | ProcessState::Failed) => self.cleanup(g).await,
                    _ => Ok(answer(CallStatus::Cancelled)),
                }
            }
            Found::InDoubt(i) => self.settle_in_doubt(g, i, true).await,
            Found::Ended(ProcessState::Done) => Ok(answer(CallStatus::Ok)),
            Found::Ended(_) | Found::Unknown => {
                tracing::info!(target: "estafeta::event", process = pid, db = %db, "commit answered CANCELLED");
                Ok(answer(CallStatus::Cancelled))
            }
        }
    }

    /// Run the CLEANUP moves of the live process: OK, or FAILED (retried by
    /// the session deadline with backoff, and by a later commit at once).
    async fn cleanup(&self, mut g: Guard) -> Result<CallResponse, ExchangeError> {
        let (state, next) = self.run_pending(g.persistent_mut()).await?;
        g.set_expires_at(next);
        g.release().await?;
        Ok(answer(if state == ProcessState::Failed {
            CallStatus::Failed
        } else {
            CallStatus::Ok
        }))
    }

    /// A late commit or rollback of a process in doubt.
    async fn settle_in_doubt(
        &self,
        mut g: Guard,
        i: usize,
        commit: bool,
    ) -> Result<CallResponse, ExchangeError> {
        let target = if commit {
            ProcessState::Done
        } else {
            ProcessState::RolledBack
        };
        let steps = self.settle_steps(&g.state().in_doubt[i], commit);
        tracing::info!(
            target: "estafeta::event", process = %g.state().in_doubt[i].id,
            db = %g.state().in_doubt[i].db, commit, "settling a process in doubt"
        );
        g.update(|s| {
            if let Some(p) = s.persistent_mut().in_doubt.get_mut(i) {
                p.pending = steps;
                p.target = Some(target);
            }
            Ok::<_, ExchangeError>(())
        })
        .await?;
        self.replay_in_doubt(g.persistent_mut()).await?;
        g.release().await?;
        tracing::info!(target: "estafeta::event", commit, "process in doubt settled");
        Ok(answer(CallStatus::Ok))
    }

    /// API_5 and API_6: the processor's transaction did not commit.
    pub(crate) async fn give_up(
        &self,
        who: &Principal,
        pid: &str,
        target: ProcessState,
        text: &str,
    ) -> Result<CallResponse, ExchangeError> {
        let db = database_of(who)?;
        let mut g = self.db_session(&db).await?;
        let (found, _) = self.locate(&db, pid, &g).await?;
        match found {
            Found::Live => {
                let p = g.state().process.clone();
                let Some(p) = p.filter(|p| {
                    matches!(p.state, ProcessState::Started | ProcessState::ReadyToCommit)
                }) else {
                    return Ok(answer(CallStatus::Cancelled));
                };
                tracing::info!(target: "estafeta::event", process = %p.id, db = %db, state = ?target, text, "processor gave up");
                let steps: Vec<Step> = p
                    .replies
                    .iter()
                    .chain(p.preparing.iter())
                    .map(|r| Step::delete(r, (&db, Folder::Prepared)))
                    .collect();
                // Failed deletes are only logged: reconciliation at start-up
                // moves any leftover in Prepared to Unknown.
                if let Err(e) = self.run_steps(&steps).await {
                    tracing::warn!(error = %e, "deleting prepared replies failed");
                }
                self.write_owner(&p.id, &db, Some(target)).await?;
                let now = self.now();
                g.update(|s| {
                    let rec = s.persistent_mut();
                    if let Some(p) = rec.process.take() {
                        rec.end(p, target, now);
                    }
                    s.set_expires_at(None);
                    Ok::<_, ExchangeError>(())
                })
                .await?;
                g.release().await?;
                Ok(answer(CallStatus::Ok))
            }
            Found::InDoubt(i) => {
                let r = self.settle_in_doubt(g, i, false).await?;
                if target == ProcessState::Aborted {
                    tracing::info!(target: "estafeta::event", text, "process in doubt aborted (rolled back)");
                }
                Ok(r)
            }
            Found::Ended(ProcessState::Done) | Found::Unknown => {
                tracing::info!(target: "estafeta::event", process = pid, db = %db, state = ?target, "rollback or abort answered CANCELLED");
                Ok(answer(CallStatus::Cancelled))
            }
            Found::Ended(_) => Ok(answer(CallStatus::Ok)),
        }
    }

    /// GET /v1/processes/{pid}.
    pub(crate) async fn status(
        &self,
        who: &Principal,
        pid: &str,
    ) -> Result<ProcessStatus, ExchangeError> {
        let not_found = || ExchangeError::not_found("no such process");
        let pid: ProcessId = pid.parse().map_err(|_| not_found())?;
        let owner = self.owner(&pid).await?.ok_or_else(not_found)?;
        match who {
            Principal::Admin => {}
            Principal::Database { id, .. } if *id == owner.db => {}
            _ => {
                return Err(ExchangeError::forbidden(
                    "the process belongs to another database",
                ));
            }
        }
        let state = match owner.ended {
            Some(s) => s,
            None => {
                let g = self.db_session(&owner.db).await?;
                let rec = g.state();
                let p = rec
                    .process
                    .iter()
                    .chain(rec.in_doubt.iter())
                    .chain(rec.recent.iter())
                    .find(|p| p.id == pid);
                p.map(|p| p.state).ok_or_else(not_found)?
            }
        };
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
