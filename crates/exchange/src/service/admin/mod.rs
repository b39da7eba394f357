//! Administration, in one place: provisioning, the process list,
//! statistics and folders here; what exists and its deletion
//! (`manage.rs`); the dashboard's operator actions (`operator.rs`); the
//! figures that stay cheap at any size (`totals.rs`) over the process list
//! kept as records are saved (`process_tally.rs`); webhooks (`webhooks.rs`).

use super::Exchange;
use super::error::ExchangeError;
use super::records::{DbRecord, Ended, Process};
use super::stats::SenderCounts;
use crate::Id;
use crate::store::{FileEntry, Folder, Location, MailboxKind};
use crate::tenancy::{Principal, Role};
use crate::token::Token;
use crate::wire::{DatabaseStats, DeviceStats, FolderListing, ProcessList, Stats, Version};
use std::collections::HashMap;

mod manage;
mod operator;
pub(crate) mod process_tally;
mod totals;
mod webhooks;

pub use totals::Totals;

pub(crate) fn admin(who: &Principal) -> Result<(), ExchangeError> {
    match who {
        Principal::Admin => Ok(()),
        _ => Err(ExchangeError::forbidden("this call needs the admin token")),
    }
}

impl Exchange {
    /// Admin: create an enterprise (409 if it exists).
    pub async fn create_enterprise(&self, who: &Principal, id: Id) -> Result<(), ExchangeError> {
        admin(who)?;
        Ok(self.parts.registry.create_enterprise(id).await?)
    }

    /// Admin: create a subsystem of an enterprise.
    pub async fn create_subsystem(
        &self,
        who: &Principal,
        enterprise: Id,
        id: Id,
    ) -> Result<(), ExchangeError> {
        admin(who)?;
        Ok(self.parts.registry.create_subsystem(enterprise, id).await?)
    }

    /// Admin: create a database of an enterprise; its token, shown once.
    pub async fn create_database(
        &self,
        who: &Principal,
        enterprise: Id,
        id: Id,
    ) -> Result<Token, ExchangeError> {
        admin(who)?;
        let token = self
            .parts
            .registry
            .create_database(enterprise, id.clone())
            .await?;
        self.parts.store.create_mailbox(&id).await?;
        self.parts.store.count_as(&id, MailboxKind::Database);
        tracing::info!(target: "estafeta::event", db = %id, "database created");
        Ok(token)
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
        let token = self
            .parts
            .registry
            .create_device(enterprise, id.clone(), subsystem)
            .await?;
        self.parts.store.create_mailbox(&id).await?;
        self.parts.store.count_as(&id, MailboxKind::Device);
        tracing::info!(target: "estafeta::event", device = %id, "device created");
        Ok(token)
    }

    /// Admin: the live, in-doubt and recently ended processes.
    pub async fn processes(&self, who: &Principal) -> Result<ProcessList, ExchangeError> {
        admin(who)?;
        let mut processes = Vec::new();
        for db in self.parts.registry.databases() {
            let Some(g) = self.parts.sessions.db.get(db.id.clone(), false).await? else {
                continue;
            };
            let rec = g.state();
            processes.extend(
                (rec.open().map(Process::summary)).chain(rec.recent.iter().map(Ended::summary)),
            );
        }
        processes.sort_by_key(|p| p.started_at);
        Ok(ProcessList {
            version: Version,
            processes,
        })
    }

    /// Admin: counters per database and device.
    pub async fn stats(&self, who: &Principal) -> Result<Stats, ExchangeError> {
        admin(who)?;
        let (store, sessions) = (&self.parts.store, &self.parts.sessions);
        let count = |id: &Id, folder| {
            let at = Location::new(id.clone(), folder);
            async move { Ok::<_, ExchangeError>(store.count(&at).await? as u64) }
        };
        let mut databases = Vec::new();
        let mut by_sender: HashMap<Id, SenderCounts> = HashMap::new();
        let never_used = DbRecord::default();
        for db in self.parts.registry.databases() {
            let waiting = count(&db.id, Folder::Messages).await?;
            let logged = count(&db.id, Folder::Log).await?;
            let g = sessions.db.get(db.id.clone(), false).await?;
            let rec = g.as_ref().map_or(&never_used, |g| g.state());
            let c = &rec.counters;
            for (sender, counts) in &c.by_sender {
                by_sender.entry(sender.clone()).or_default().add(counts);
            }
            databases.push(DatabaseStats {
                id: db.id.clone(),
                enterprise: db.enterprise.clone(),
                received: waiting + logged,
                waiting,
                // Ended processes are counted; the live one and those in
                // doubt are still going.
                processes: c.ended + rec.open().count() as u64,
                processed: c.processed,
                deadlocks: c.deadlocks,
                incorrect: c.incorrect,
                replies: c.replies,
                not_committed: c.not_committed,
                in_doubt: c.in_doubt,
                last_error: c.last_error.clone(),
                last_seen: c.last_seen,
            });
        }
        let mut devices = Vec::new();
        for d in self.parts.registry.devices() {
            let Role::Device { subsystem } = d.role.clone() else {
                continue;
            };
            let inbox = count(&d.id, Folder::Messages).await?;
            let acked = count(&d.id, Folder::Log).await?;
            let counters = match sessions.device.get(d.id.clone(), false).await? {
                Some(g) => g.state().device.clone(),
                None => Default::default(),
            };
            let verdicts = by_sender.get(&d.id).copied().unwrap_or_default();
            devices.push(DeviceStats {
                id: d.id.clone(),
                enterprise: d.enterprise.clone(),
                subsystem,
                sent: counters.sent,
                duplicates: counters.duplicates,
                received: inbox + acked,
                acked,
                processed: verdicts.processed,
                deadlocks: verdicts.deadlocks,
                incorrect: verdicts.incorrect,
            });
        }
        Ok(Stats {
            version: Version,
            databases,
            devices,
        })
    }

    /// Admin: the files of one folder of one mailbox.
    pub async fn folder(
        &self,
        who: &Principal,
        mailbox: Id,
        folder: Folder,
    ) -> Result<FolderListing, ExchangeError> {
        admin(who)?;
        if self.parts.registry.endpoint(&mailbox).is_none() {
            return Err(ExchangeError::not_found(format!(
                "no database or device {mailbox}"
            )));
        }
        let files: Vec<FileEntry> = self
            .parts
            .store
            .list(&Location::new(mailbox.clone(), folder))
            .await?;
        Ok(FolderListing {
            version: Version,
            db_id: mailbox,
            folder,
            files: files.iter().map(Into::into).collect(),
        })
    }
}
