//! Administration of what exists: list, show and delete enterprises,
//! subsystems, databases and devices; rotate tokens; and the reasons the
//! server still remembers for the messages in a database's `Error`.
//!
//! A database or device is deleted only when its mailbox holds no message
//! besides `Log`, none waits for its `deliver_at` to enter it and no
//! process of it is open, unless forced: a forced delete aborts the live
//! process, settles those in doubt as rolled back, and discards every
//! message of the mailbox and every one scheduled for it.

use crate::wire::ErrorCode;
use std::collections::HashMap;

use super::super::Exchange;
use super::super::device::{DeviceCalls, with_keys};
use super::super::drive::Interpreter;
use super::super::error::ExchangeError;
use super::super::hold::hold;
use super::super::lifecycle::Event;
use super::super::records::{DbRecord, DeviceRecord, Process};
use super::admin;
use crate::store::{Folder, Location};
use crate::tenancy::{Endpoint, Kind, Principal, Role};
use crate::token::Token;
use crate::wire::ProcessState;
use crate::wire::{
    Deleted, EndpointDetail, EnterpriseDetail, FolderCounts, ProcessSummary, ResultStatus, Version,
};
use crate::{Id, MessageId, ProcessId};

impl Exchange {
    /// Admin: up to `limit` enterprises after `after`, each with its subsystems.
    pub fn enterprises_page(
        &self,
        who: &Principal,
        after: Option<&Id>,
        limit: usize,
    ) -> Result<Vec<(Id, Vec<Id>)>, ExchangeError> {
        admin(who)?;
        Ok(self.parts.registry.enterprises_page(after, limit))
    }

    /// Admin: an enterprise, its subsystems and how many databases and
    /// devices it has.
    pub fn enterprise(&self, who: &Principal, id: &Id) -> Result<EnterpriseDetail, ExchangeError> {
        admin(who)?;
        let registry = &self.parts.registry;
        if !registry.enterprise_exists(id) {
            return Err(ExchangeError::not_found(format!("unknown enterprise {id}")));
        }
        let count = |kind| {
            registry
                .endpoints_page(kind, Some(id), None, usize::MAX)
                .len() as u64
        };
        Ok(EnterpriseDetail {
            version: Version,
            id: id.clone(),
            subsystems: registry.subsystems(id),
            databases: count(Kind::Database),
            devices: count(Kind::Device),
        })
    }

    /// Admin: up to `limit` databases or devices after `after`, of
    /// `enterprise` when given.
    pub fn endpoints_page(
        &self,
        who: &Principal,
        kind: Kind,
        enterprise: Option<&Id>,
        after: Option<&Id>,
        limit: usize,
    ) -> Result<Vec<Endpoint>, ExchangeError> {
        admin(who)?;
        Ok(self
            .parts
            .registry
            .endpoints_page(kind, enterprise, after, limit))
    }

    /// Admin: a database or device, its folders' file counts and its open
    /// processes.
    pub async fn endpoint_detail(
        &self,
        who: &Principal,
        kind: Kind,
        id: &Id,
    ) -> Result<EndpointDetail, ExchangeError> {
        admin(who)?;
        let endpoint = self.require(kind, id)?;
        let folders = self.folder_counts_of(id).await?;
        let open_processes = self.open_processes(id).await?;
        Ok(EndpointDetail {
            version: Version,
            id: endpoint.id,
            enterprise: endpoint.enterprise,
            subsystem: endpoint.role.subsystem().cloned(),
            folders,
            open_processes,
        })
    }

    /// Admin: delete an enterprise that has no subsystems, databases or devices.
    pub async fn delete_enterprise(&self, who: &Principal, id: Id) -> Result<(), ExchangeError> {
        admin(who)?;
        self.parts.registry.delete_enterprise(id.clone()).await?;
        tracing::warn!(target: "estafeta::event", enterprise = %id, "enterprise deleted");
        Ok(())
    }

    /// Admin: delete a subsystem that no device runs.
    pub async fn delete_subsystem(
        &self,
        who: &Principal,
        enterprise: Id,
        id: Id,
    ) -> Result<(), ExchangeError> {
        admin(who)?;
        self.parts
            .registry
            .delete_subsystem(enterprise.clone(), id.clone())
            .await?;
        tracing::warn!(target: "estafeta::event", enterprise = %enterprise, subsystem = %id, "subsystem deleted");
        Ok(())
    }

    /// Admin: delete a database or device and its mailbox. Refused (409
    /// `not_empty`) while its mailbox holds messages besides `Log`,
    /// messages wait for their `deliver_at` to enter it, or a process of it
    /// is open, unless `force`: then its live process is aborted, those in
    /// doubt are rolled back, and every message of it or scheduled for it
    /// is discarded. It runs on the mailbox's session, so no call of the
    /// database or device runs meanwhile; nothing is written under the id
    /// afterwards, and a database or device made again under it starts
    /// empty.
    pub async fn delete_endpoint(
        &self,
        who: &Principal,
        kind: Kind,
        id: Id,
        force: bool,
    ) -> Result<Deleted, ExchangeError> {
        admin(who)?;
        let endpoint = self.require(kind, &id)?;
        self.detached(move |ex| async move {
            let deleted = match kind {
                Kind::Database => ex.delete_database(&endpoint, force).await?,
                Kind::Device => ex.delete_device(&endpoint, force).await?,
            };
            tracing::warn!(
                target: "estafeta::event", id = %endpoint.id, kind = kind.as_str(), force,
                discarded = deleted.discarded, "the operator deleted a {}", kind.as_str()
            );
            Ok(deleted)
        })
        .await
    }

    /// Admin: a new token for a database or device (shown once); the old
    /// one stops working at once.
    pub async fn rotate_token(
        &self,
        who: &Principal,
        kind: Kind,
        id: Id,
    ) -> Result<Token, ExchangeError> {
        admin(who)?;
        let token = self.parts.registry.rotate_token(kind, id.clone()).await?;
        tracing::warn!(target: "estafeta::event", id = %id, kind = kind.as_str(), "token rotated");
        Ok(token)
    }

    /// Admin: a new admin token (shown once); the old one stops working at
    /// once. Refused (409 `admin_token_pinned`) when `ESTAFETA_ADMIN_TOKEN`
    /// sets it.
    pub async fn rotate_admin_token(&self, who: &Principal) -> Result<Token, ExchangeError> {
        admin(who)?;
        let token = self.parts.registry.rotate_admin_token().await?;
        tracing::warn!(target: "estafeta::event", "admin token rotated");
        Ok(token)
    }

    /// Admin: the error code and text given with PROCESSED_INCORRECT for
    /// the messages of a database, as far as its processes in doubt and its
    /// recently ended ones remember them.
    pub async fn error_reasons(
        &self,
        who: &Principal,
        db: &Id,
    ) -> Result<HashMap<MessageId, (Option<i64>, Option<String>)>, ExchangeError> {
        admin(who)?;
        let Some(g) = self.parts.sessions.db.get(db.clone(), false).await? else {
            return Ok(HashMap::new());
        };
        let rec = g.state();
        Ok(rec
            .recent
            .iter()
            .flat_map(|e| e.incorrect.iter())
            .chain(rec.in_doubt.iter().flat_map(|p| p.results.iter()))
            .filter(|v| v.status == ResultStatus::ProcessedIncorrect)
            .map(|v| (v.name.id, (v.error_code, v.error_text.clone())))
            .collect())
    }

    fn require(&self, kind: Kind, id: &Id) -> Result<Endpoint, ExchangeError> {
        match self.parts.registry.endpoint(id) {
            Some(e) if (kind == Kind::Database) == (e.role == Role::Database) => Ok(e),
            _ => Err(ExchangeError::not_found(format!(
                "no {} {id}",
                kind.as_str()
            ))),
        }
    }

    /// A database's live process and its processes in doubt.
    async fn open_processes(&self, id: &Id) -> Result<Vec<ProcessSummary>, ExchangeError> {
        let Some(g) = self.parts.sessions.db.get(id.clone(), false).await? else {
            return Ok(Vec::new());
        };
        Ok(g.state().open().map(Process::summary).collect())
    }

    async fn folder_counts_of(&self, id: &Id) -> Result<FolderCounts, ExchangeError> {
        let mut counts = FolderCounts::default();
        for folder in Folder::ALL {
            let n = self
                .parts
                .store
                .count(&Location::new(id.clone(), folder))
                .await? as u64;
            *match folder {
                Folder::Messages => &mut counts.messages,
                Folder::Prepared => &mut counts.prepared,
                Folder::Log => &mut counts.log,
                Folder::Unknown => &mut counts.unknown,
                Folder::Error => &mut counts.error,
            } = n;
        }
        Ok(counts)
    }

    /// What a delete of `id` is refused for unless forced: messages held
    /// besides `Log`, messages scheduled for it, open processes.
    async fn holds(&self, id: &Id, open: usize) -> Result<Option<String>, ExchangeError> {
        let c = self.folder_counts_of(id).await?;
        let scheduled = self.parts.store.scheduled_for(id).await?;
        let held = c.messages + c.prepared + c.unknown + c.error;
        Ok((held > 0 || scheduled > 0 || open > 0).then(|| {
            format!(
                "{id} still holds {held} messages (Messages {}, Prepared {}, Unknown {}, \
                 Error {}), {scheduled} messages waiting for their deliver_at and {open} open \
                 processes; settle them first, or force the delete to discard them",
                c.messages, c.prepared, c.unknown, c.error,
            )
        }))
    }

    /// The mailbox of `id`, whose session the caller holds, removed from
    /// the message store and `id` from the registry; how many messages were
    /// discarded. Should the registry refuse, the mailbox is made again
    /// (empty) so that the id stays usable.
    async fn remove(&self, id: &Id, kind: Kind) -> Result<u64, ExchangeError> {
        let discarded = self.parts.store.remove_mailbox(id).await?;
        if let Err(e) = self.parts.registry.delete_endpoint(kind, id.clone()).await {
            if let Err(again) = self.parts.store.create_mailbox(id).await {
                tracing::error!(id = %id, error = %again, "making a mailbox again after a failed delete");
            }
            return Err(e.into());
        }
        Ok(discarded)
    }

    /// Deletes a database on its held session (see
    /// [`Exchange::delete_endpoint`]).
    async fn delete_database(
        &self,
        endpoint: &Endpoint,
        force: bool,
    ) -> Result<Deleted, ExchangeError> {
        let id = &endpoint.id;
        let mut g = hold(&self.parts.sessions.db, id, "database").await?;
        let open: Vec<(ProcessId, ProcessState)> =
            g.state().open().map(|p| (p.id, p.state)).collect();
        if !force && let Some(why) = self.holds(id, open.len()).await? {
            g.release().await?;
            return Err(not_empty(Kind::Database, why));
        }
        for (pid, state) in &open {
            let as_state = match state {
                ProcessState::InDoubt => ProcessState::RolledBack,
                _ => ProcessState::Aborted,
            };
            tracing::warn!(target: "estafeta::event", process = %pid, db = %id, state = ?as_state, "the operator deleted the database: its process ends");
            let event = Event::GiveUp {
                pid: *pid,
                as_state,
                ended: None,
            };
            Interpreter::of(&self.parts)
                .drive(&mut g, event, false)
                .await?;
        }
        g.update(|s| {
            *s.persistent_mut() = DbRecord::default();
            s.set_expires_at(None);
            Ok::<_, ExchangeError>(())
        })
        .await?;
        if let Some(tally) = &self.parts.process_tally {
            tally.forget(id);
        }
        let discarded = self.remove(id, Kind::Database).await?;
        g.release().await?;
        Ok(deleted(endpoint, force, discarded, open))
    }

    /// Deletes a device on its held session (see
    /// [`Exchange::delete_endpoint`]): its idempotency keys go too.
    async fn delete_device(
        &self,
        endpoint: &Endpoint,
        force: bool,
    ) -> Result<Deleted, ExchangeError> {
        let id = &endpoint.id;
        let mut g = hold(&self.parts.sessions.device, id, "device").await?;
        if !force && let Some(why) = self.holds(id, 0).await? {
            g.release().await?;
            return Err(not_empty(Kind::Device, why));
        }
        // Its record's keys are what tells a start after a crash that its
        // last keyed uploads were accepted: settled before they go.
        DeviceCalls::of(&self.parts)
            .settle(g.state().keys.values().map(|u| &u.name))
            .await?;
        g.update(|s| {
            *s.persistent_mut() = DeviceRecord::default();
            s.set_expires_at(None);
            Ok::<_, ExchangeError>(())
        })
        .await?;
        with_keys(&self.parts.keys, {
            let id = id.clone();
            move |keys| keys.remove_device(&id)
        })
        .await?;
        let discarded = self.remove(id, Kind::Device).await?;
        g.release().await?;
        Ok(deleted(endpoint, force, discarded, Vec::new()))
    }
}

fn not_empty(kind: Kind, why: String) -> ExchangeError {
    ExchangeError::new(
        super::super::ErrorKind::Conflict,
        ErrorCode::NotEmpty,
        format!("{} {why}", kind.as_str()),
    )
}

fn deleted(
    endpoint: &Endpoint,
    force: bool,
    discarded: u64,
    ended: Vec<(ProcessId, ProcessState)>,
) -> Deleted {
    Deleted {
        version: Version,
        id: endpoint.id.clone(),
        forced: force,
        discarded,
        ended_processes: ended.into_iter().map(|(pid, _)| pid).collect(),
    }
}
