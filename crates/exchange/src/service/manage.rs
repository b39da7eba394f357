//! Administration of what exists: list, show and delete enterprises,
//! subsystems, databases and devices; rotate tokens; and the reasons the
//! server still remembers for the messages in a database's `Error`.
//!
//! A database or device is deleted only when its mailbox holds no message
//! besides `Log` and no process of it is open, unless forced: a forced
//! delete aborts the live process, settles those in doubt as rolled back,
//! and deletes every file of the mailbox.

use crate::wire::ErrorCode;
use std::collections::HashMap;

use super::Exchange;
use super::admin::{admin, summary};
use super::error::ExchangeError;
use crate::store::Folder;
use crate::tenancy::{Endpoint, Kind, Principal, Role};
use crate::token::Token;
use crate::wire::{
    AbortRequest, Deleted, EndpointDetail, EnterpriseDetail, FolderCounts, ProcessSummary,
    ResultStatus, Version,
};
use crate::{Id, MessageId};

impl Exchange {
    /// Admin: up to `limit` enterprises after `after`, each with its subsystems.
    pub fn enterprises_page(
        &self,
        who: &Principal,
        after: Option<&Id>,
        limit: usize,
    ) -> Result<Vec<(Id, Vec<Id>)>, ExchangeError> {
        admin(who)?;
        Ok(self.core.registry.enterprises_page(after, limit))
    }

    /// Admin: an enterprise, its subsystems and how many databases and
    /// devices it has.
    pub fn enterprise(&self, who: &Principal, id: &Id) -> Result<EnterpriseDetail, ExchangeError> {
        admin(who)?;
        let registry = &self.core.registry;
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
            .core
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
            subsystem: match endpoint.role {
                Role::Database => None,
                Role::Device { subsystem } => Some(subsystem),
            },
            folders,
            open_processes,
        })
    }

    /// Admin: delete an enterprise that has no subsystems, databases or devices.
    pub async fn delete_enterprise(&self, who: &Principal, id: Id) -> Result<(), ExchangeError> {
        admin(who)?;
        self.core.registry.delete_enterprise(id.clone()).await?;
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
        self.core
            .registry
            .delete_subsystem(enterprise.clone(), id.clone())
            .await?;
        tracing::warn!(target: "estafeta::event", enterprise = %enterprise, subsystem = %id, "subsystem deleted");
        Ok(())
    }

    /// Admin: delete a database or device and its mailbox. Refused (409
    /// `not_empty`) while its mailbox holds messages besides `Log` or a
    /// process of it is open, unless `force`.
    pub async fn delete_endpoint(
        &self,
        who: &Principal,
        kind: Kind,
        id: Id,
        force: bool,
    ) -> Result<Deleted, ExchangeError> {
        admin(who)?;
        let endpoint = self.require(kind, &id)?;
        let counts = self.folder_counts_of(&id).await?;
        let open = self.open_processes(&id).await?;
        let held = counts.messages + counts.prepared + counts.unknown + counts.error;
        if !force && (held > 0 || !open.is_empty()) {
            return Err(ExchangeError::new(
                super::ErrorKind::Conflict,
                ErrorCode::NotEmpty,
                format!(
                    "{kind} {id} still holds {held} messages (Messages {}, Prepared {}, Unknown {}, \
                     Error {}) and {} open processes; settle them first, or force the delete to \
                     discard them",
                    counts.messages,
                    counts.prepared,
                    counts.unknown,
                    counts.error,
                    open.len(),
                    kind = kind.as_str(),
                ),
            ));
        }
        let ended = self.end_processes(&endpoint, &open).await?;
        self.core.registry.delete_endpoint(kind, id.clone()).await?;
        self.core.process_tally.forget(&id);
        let discarded = self.empty_mailbox(&id).await?;
        tracing::warn!(
            target: "estafeta::event", id = %id, kind = kind.as_str(), force, discarded,
            "the operator deleted a {}", kind.as_str()
        );
        Ok(Deleted {
            version: Version,
            id,
            forced: force,
            discarded,
            ended_processes: ended,
        })
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
        let token = self.core.registry.rotate_token(kind, id.clone()).await?;
        tracing::warn!(target: "estafeta::event", id = %id, kind = kind.as_str(), "token rotated");
        Ok(token)
    }

    /// Admin: a new admin token (shown once); the old one stops working at
    /// once. Refused (409 `admin_token_pinned`) when `ESTAFETA_ADMIN_TOKEN`
    /// sets it.
    pub async fn rotate_admin_token(&self, who: &Principal) -> Result<Token, ExchangeError> {
        admin(who)?;
        let token = self.core.registry.rotate_admin_token().await?;
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
        let Some(g) = self.core.sessions.db.get(db.clone(), false).await? else {
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
        match self.core.registry.endpoint(id) {
            Some(e) if (kind == Kind::Database) == (e.role == Role::Database) => Ok(e),
            _ => Err(ExchangeError::not_found(format!(
                "no {} {id}",
                kind.as_str()
            ))),
        }
    }

    async fn folder_counts_of(&self, id: &Id) -> Result<FolderCounts, ExchangeError> {
        let mut counts = FolderCounts::default();
        for folder in Folder::ALL {
            let n = self
                .core
                .store
                .count(&self.core.location(id, folder))
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

    /// A database's live process and its processes in doubt.
    async fn open_processes(&self, id: &Id) -> Result<Vec<ProcessSummary>, ExchangeError> {
        let Some(g) = self.core.sessions.db.get(id.clone(), false).await? else {
            return Ok(Vec::new());
        };
        let rec = g.state();
        Ok(rec
            .process
            .iter()
            .chain(rec.in_doubt.iter())
            .map(summary)
            .collect())
    }

    /// Ends the open processes of a database being deleted: the live one
    /// aborted, those in doubt settled as rolled back.
    async fn end_processes(
        &self,
        endpoint: &Endpoint,
        open: &[ProcessSummary],
    ) -> Result<Vec<crate::ProcessId>, ExchangeError> {
        let processor = Principal::Database {
            id: endpoint.id.clone(),
            enterprise: endpoint.enterprise.clone(),
        };
        let mut ended = Vec::new();
        for p in open {
            let pid = p.process_id.to_string();
            if p.state == crate::wire::ProcessState::InDoubt {
                self.settle(&Principal::Admin, &pid, false).await?;
            } else {
                let req = AbortRequest {
                    version: Version,
                    message: "the operator deleted the database".to_owned(),
                };
                self.abort(&processor, &pid, req).await?;
            }
            ended.push(p.process_id);
        }
        Ok(ended)
    }

    /// Deletes every message of a mailbox; how many there were.
    async fn empty_mailbox(&self, id: &Id) -> Result<u64, ExchangeError> {
        Ok(self.core.store.remove_mailbox(id).await?)
    }
}
