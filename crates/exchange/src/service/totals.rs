//! Admin figures for the dashboard that stay cheap at any size: totals per
//! folder over every mailbox and the oldest waiting message, read from the
//! folder indexes (each count is kept by its index as files come and go,
//! so nothing is listed), and one page of a folder.

use super::Exchange;
use super::admin::admin;
use super::error::ExchangeError;
use crate::store::{FileName, Folder};
use crate::tenancy::Principal;
use crate::{Id, Timestamp};

/// Message files summed over every mailbox, and the oldest waiting message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Messages waiting in the databases' `Messages` (to be handed out).
    pub waiting: u64,
    /// When the oldest message waiting in a database's `Messages` was created.
    pub oldest_waiting: Option<Timestamp>,
    /// Files in `Unknown` over all mailboxes.
    pub unknown: u64,
    /// Files in `Error` over all mailboxes.
    pub error: u64,
}

impl Exchange {
    /// Admin: the messages waiting, the oldest of them, and the files in
    /// `Unknown` and `Error`, from the folder indexes (three counts per
    /// database, two per device, one oldest name per database with
    /// messages waiting). A folder that cannot be read counts as empty.
    pub async fn totals(&self, who: &Principal) -> Result<Totals, ExchangeError> {
        let (dbs, devs) = self.mailbox_ids(who)?;
        let store = &self.core.store;
        let count = |id: &Id, folder| {
            let loc = self.core.location(id, folder);
            async move { store.count(&loc).await.map_or(0, |c| c as u64) }
        };
        let mut t = Totals::default();
        for db in &dbs {
            let waiting = count(db, Folder::Messages).await;
            if waiting > 0 {
                t.waiting += waiting;
                let queue = self.core.location(db, Folder::Messages);
                if let Ok(Some(oldest)) =
                    store.oldest(&queue, 1).await.map(|v| v.into_iter().next())
                {
                    t.oldest_waiting = Some(match t.oldest_waiting {
                        Some(o) if o <= oldest.created_at => o,
                        _ => oldest.created_at,
                    });
                }
            }
        }
        for id in dbs.iter().chain(devs.iter()) {
            t.unknown += count(id, Folder::Unknown).await;
            t.error += count(id, Folder::Error).await;
        }
        Ok(t)
    }

    /// Admin: how many files a folder of a mailbox holds, and up to `limit`
    /// of their names after skipping the `skip` oldest (oldest first).
    pub async fn folder_page(
        &self,
        who: &Principal,
        mailbox: &Id,
        folder: Folder,
        skip: usize,
        limit: usize,
    ) -> Result<(u64, Vec<FileName>), ExchangeError> {
        admin(who)?;
        let loc = self.core.location(mailbox, folder);
        let total = self.core.store.count(&loc).await? as u64;
        if limit == 0 || skip as u64 >= total {
            return Ok((total, Vec::new()));
        }
        let names = self
            .core
            .store
            .oldest(&loc, skip.saturating_add(limit))
            .await?;
        Ok((total, names.into_iter().skip(skip).collect()))
    }
}
