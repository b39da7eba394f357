//! Operator actions of the admin dashboard: look into `Unknown` and
//! `Error`, put a message back into `Messages` or discard it, settle a
//! process in doubt as committed or rolled back, and the cheap folder
//! figures of the metrics.
//!
//! A file that a live or in-doubt process still refers to is not moved by
//! hand: settling the process moves it (through the same late commit and
//! rollback a processor would call), so the process record and the folders
//! never disagree.

use super::super::Exchange;
use super::super::arrivals::arrived;
use super::super::error::ExchangeError;
use super::super::protocol::ProcessCalls;
use super::admin;
use crate::store::{FileName, Folder, Location, Op};
use crate::tenancy::Principal;
use crate::wire::ErrorCode;
use crate::wire::{CallResponse, ProcessState};
use crate::{Id, MessageId, ProcessId};
use std::path::Path;

/// The folders an operator settles by hand.
fn settleable(folder: Folder) -> Result<(), ExchangeError> {
    match folder {
        Folder::Unknown | Folder::Error => Ok(()),
        other => Err(ExchangeError::bad_request(
            ErrorCode::BadFolder,
            format!(
                "only Unknown and Error are settled by hand, not {}",
                other.as_str()
            ),
        )),
    }
}

/// The answer for a message that is not in `mailbox`'s `folder` (404).
fn no_message(mailbox: &Id, folder: Folder, id: MessageId) -> ExchangeError {
    ExchangeError::not_found(format!("no message {id} in {mailbox}/{}", folder.as_str()))
}

impl Exchange {
    /// The data folder (for the disk-free figure and the server's own files).
    pub fn data_dir(&self) -> &Path {
        &self.parts.config.data_dir
    }

    /// Admin: every database and device id, databases first.
    pub fn mailbox_ids(&self, who: &Principal) -> Result<(Vec<Id>, Vec<Id>), ExchangeError> {
        admin(who)?;
        let ids = |v: Vec<crate::tenancy::Endpoint>| v.into_iter().map(|e| e.id).collect();
        Ok((
            ids(self.parts.registry.databases()),
            ids(self.parts.registry.devices()),
        ))
    }

    /// Admin: the number of message files in each folder of each mailbox,
    /// from the folder indexes (no folder is listed), for the metrics.
    pub async fn folder_counts(
        &self,
        who: &Principal,
    ) -> Result<Vec<(Id, Folder, u64)>, ExchangeError> {
        let (dbs, devs) = self.mailbox_ids(who)?;
        let mut out = Vec::new();
        for id in dbs.into_iter().chain(devs) {
            for folder in Folder::ALL {
                let loc = Location::new(id.clone(), folder);
                // A folder that cannot be read counts as empty here.
                let n = self.parts.store.count(&loc).await.map_or(0, |n| n as u64);
                out.push((id.clone(), folder, n));
            }
        }
        Ok(out)
    }

    /// Admin: the oldest message waiting in a database's `Messages`.
    pub async fn oldest_waiting(
        &self,
        who: &Principal,
        db: &Id,
    ) -> Result<Option<FileName>, ExchangeError> {
        admin(who)?;
        let queue = Location::new(db.clone(), Folder::Messages);
        Ok(self.parts.store.oldest(&queue, 1).await?.into_iter().next())
    }

    /// Admin: a database's processes in doubt and the messages each holds
    /// (its PROCESSED messages and its replies, in `Unknown`).
    pub async fn in_doubt(
        &self,
        who: &Principal,
        db: &Id,
    ) -> Result<Vec<(ProcessId, Vec<MessageId>)>, ExchangeError> {
        admin(who)?;
        let Some(g) = self.parts.sessions.db.get(db.clone(), false).await? else {
            return Ok(Vec::new());
        };
        Ok(g.state()
            .in_doubt
            .iter()
            .map(|p| {
                let held = p.messages.iter().chain(p.replies.iter()).map(|n| n.id);
                (p.id, held.collect())
            })
            .collect())
    }

    /// Admin: one message of a mailbox's `Unknown` or `Error` folder, as its
    /// file's JSON bytes.
    pub async fn read_message(
        &self,
        who: &Principal,
        mailbox: &Id,
        folder: Folder,
        id: MessageId,
    ) -> Result<Vec<u8>, ExchangeError> {
        admin(who)?;
        settleable(folder)?;
        let (_, bytes) = self.find_file(mailbox, folder, id).await?;
        Ok(bytes)
    }

    /// Admin: move a message from `Unknown` or `Error` into its recipient's
    /// `Messages`, where it is handed out again. Refused (422) while a
    /// process refers to it: settle the process instead.
    pub async fn requeue(
        &self,
        who: &Principal,
        mailbox: &Id,
        folder: Folder,
        id: MessageId,
    ) -> Result<(), ExchangeError> {
        self.settle_by_hand(who, mailbox, folder, id, true).await
    }

    /// Admin: delete a message from `Unknown` or `Error` for good. Refused
    /// (422) while a process refers to it.
    pub async fn discard(
        &self,
        who: &Principal,
        mailbox: &Id,
        folder: Folder,
        id: MessageId,
    ) -> Result<(), ExchangeError> {
        self.settle_by_hand(who, mailbox, folder, id, false).await
    }

    /// Admin: [`requeue`](Self::requeue) (`requeue`) or
    /// [`discard`](Self::discard) a message of `Unknown` or `Error`.
    async fn settle_by_hand(
        &self,
        who: &Principal,
        mailbox: &Id,
        folder: Folder,
        id: MessageId,
        requeue: bool,
    ) -> Result<(), ExchangeError> {
        admin(who)?;
        settleable(folder)?;
        let mailbox = mailbox.clone();
        self.detached(move |ex| async move { ex.hand_settle(&mailbox, folder, id, requeue).await })
            .await
    }

    /// Admin: settle a process in doubt as committed (`commit`) or rolled
    /// back, as a late `commit` or `rollback` of its processor would. 422
    /// when the process is not in doubt.
    pub async fn settle(
        &self,
        who: &Principal,
        pid: &str,
        commit: bool,
    ) -> Result<CallResponse, ExchangeError> {
        admin(who)?;
        let not_in_doubt =
            || ExchangeError::unprocessable(ErrorCode::NotInDoubt, "the process is not in doubt");
        let parsed: ProcessId = pid.parse().map_err(|_| not_in_doubt())?;
        let owner = self
            .parts
            .sessions
            .owner(&parsed)
            .await?
            .ok_or_else(not_in_doubt)?;
        let in_doubt = self.in_doubt(who, &owner.db).await?;
        if !in_doubt.iter().any(|(p, _)| *p == parsed) {
            return Err(not_in_doubt());
        }
        let enterprise = self
            .parts
            .registry
            .enterprise_of(&owner.db)
            .ok_or_else(|| ExchangeError::not_found(format!("no database {}", owner.db)))?;
        let processor = super::super::Presented::from(&Principal::Database {
            id: owner.db.clone(),
            enterprise,
        });
        tracing::warn!(
            target: "estafeta::event", process = %parsed, db = %owner.db, commit,
            "the operator settles a process in doubt"
        );
        let pid = pid.to_owned();
        self.detached(move |ex| async move {
            let calls = ProcessCalls::of(&ex.parts);
            if commit {
                calls.commit(&processor, &pid).await
            } else {
                let text = "settled as rolled back by the operator";
                calls
                    .give_up(&processor, &pid, ProcessState::RolledBack, text)
                    .await
            }
        })
        .await
    }

    /// The file of message `id` in `mailbox`'s `folder`; 404 if it is not
    /// there.
    async fn find_name(
        &self,
        mailbox: &Id,
        folder: Folder,
        id: MessageId,
    ) -> Result<FileName, ExchangeError> {
        let not_found = || no_message(mailbox, folder, id);
        if self.parts.registry.endpoint(mailbox).is_none() {
            return Err(not_found());
        }
        let at = Location::new(mailbox.clone(), folder);
        self.parts.store.find(&at, id).await?.ok_or_else(not_found)
    }

    /// A message file of a folder and its bytes; 404 if it is not there.
    async fn find_file(
        &self,
        mailbox: &Id,
        folder: Folder,
        id: MessageId,
    ) -> Result<(FileName, Vec<u8>), ExchangeError> {
        let name = self.find_name(mailbox, folder, id).await?;
        let at = Location::new(mailbox.clone(), folder);
        let names = std::slice::from_ref(&name);
        let raw = self.parts.store.read_array(&at, names).await?;
        if raw.names.is_empty() {
            return Err(no_message(mailbox, folder, id));
        }
        // `[` + the file's bytes + `]`.
        let bytes = raw.json[1..raw.json.len() - 1].to_vec();
        Ok((name, bytes))
    }

    /// Requeue (`requeue`) or discard one file, on the mailbox's session so
    /// that no protocol call of its database runs in between.
    async fn hand_settle(
        &self,
        mailbox: &Id,
        folder: Folder,
        id: MessageId,
        requeue: bool,
    ) -> Result<(), ExchangeError> {
        let mut g = self.parts.sessions.db.get(mailbox.clone(), false).await?;
        if let Some(g) = &g
            && g.state().referenced().any(|n| n.id == id)
        {
            return Err(ExchangeError::unprocessable(
                ErrorCode::HeldByProcess,
                format!("message {id} belongs to a process; settle the process instead"),
            ));
        }
        let name = self.find_name(mailbox, folder, id).await?;
        let at = Location::new(mailbox.clone(), folder);
        let op = match requeue {
            true => Op::Move {
                name: name.clone(),
                from: at,
                to: Location::new(name.to.clone(), Folder::Messages),
            },
            false => Op::Delete {
                name: name.clone(),
                at,
            },
        };
        let held = g.as_mut().and_then(|g| g.step());
        for r in self.parts.store.apply(held, &[op]).await.results {
            r?;
        }
        if requeue {
            arrived(&self.parts.registry, self.parts.push.as_ref(), &name.to);
            tracing::warn!(
                target: "estafeta::event", db = %mailbox, message = %id, to = %name.to,
                from_folder = folder.as_str(), "the operator requeued a message into Messages"
            );
        } else {
            tracing::warn!(
                target: "estafeta::event", db = %mailbox, message = %id,
                from_folder = folder.as_str(), "the operator discarded a message"
            );
        }
        if let Some(g) = g {
            g.release().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::ExchangeConfig;
    use std::sync::Arc;

    async fn exchange(data: &Path) -> Exchange {
        let clock: Arc<dyn estafeta_session::Clock> = Arc::new(estafeta_session::SystemClock);
        let stores = crate::Stores::embedded(data, clock.clone(), &Default::default())
            .await
            .unwrap();
        let (ex, _) = Exchange::open(
            ExchangeConfig::new(data),
            clock,
            crate::Sinks::default(),
            stores,
        )
        .await
        .unwrap();
        let admin = Principal::Admin;
        let acme: Id = "acme".parse().unwrap();
        ex.create_enterprise(&admin, acme.clone()).await.unwrap();
        ex.create_database(&admin, acme, "db-a".parse().unwrap())
            .await
            .unwrap();
        ex.recover().await.unwrap();
        ex
    }

    #[tokio::test]
    async fn bad_operator_requests_are_refused_and_change_nothing() {
        let data = tempfile::tempdir().unwrap();
        let ex = exchange(data.path()).await;
        let admin = Principal::Admin;
        let db: Id = "db-a".parse().unwrap();
        let mid: MessageId = "01JD6Y0000000000000000000A".parse().unwrap();
        let kind = |r: Result<(), ExchangeError>| r.unwrap_err().kind();
        assert_eq!(
            kind(ex.requeue(&admin, &db, Folder::Messages, mid).await),
            ErrorKind::BadRequest
        );
        assert_eq!(
            kind(ex.discard(&admin, &db, Folder::Unknown, mid).await),
            ErrorKind::NotFound
        );
        let processor = Principal::Database {
            id: db.clone(),
            enterprise: "acme".parse().unwrap(),
        };
        assert_eq!(
            kind(ex.requeue(&processor, &db, Folder::Unknown, mid).await),
            ErrorKind::Forbidden
        );
        let settle = ex.settle(&admin, "not-a-process", true).await.unwrap_err();
        assert_eq!(settle.code(), ErrorCode::NotInDoubt);
        assert!(ex.in_doubt(&admin, &db).await.unwrap().is_empty());
        assert_eq!(ex.oldest_waiting(&admin, &db).await.unwrap(), None);
        let counts = ex.folder_counts(&admin).await.unwrap();
        assert_eq!(counts.len(), Folder::ALL.len());
        assert!(counts.iter().all(|(id, _, n)| *id == db && *n == 0));
        assert_eq!(ex.data_dir(), data.path());
    }
}
