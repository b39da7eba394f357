//! Admin figures for the dashboard that stay cheap at any size: totals per
//! folder over every mailbox and the oldest waiting message (the store's
//! running totals, kept by the folder indexes as files come and go), the
//! processes by state and a page of the process list (kept as database
//! records are saved), and one page of a folder.

use super::super::Exchange;
use super::super::error::ExchangeError;
use super::admin;
use super::process_tally::ProcessTotals;
use crate::store::{FileName, Folder, Location, MailboxKind, Tallies};
use crate::tenancy::Principal;
use crate::wire::ProcessSummary;
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

impl From<Tallies> for Totals {
    fn from(t: Tallies) -> Self {
        Totals {
            waiting: t.databases.messages,
            oldest_waiting: t.databases.oldest_message,
            unknown: t.databases.unknown + t.devices.unknown,
            error: t.databases.error + t.devices.error,
        }
    }
}

impl Exchange {
    /// Admin: the messages waiting, the oldest of them, and the files in
    /// `Unknown` and `Error` ([`tallies`](Self::tallies) summed).
    pub async fn totals(&self, who: &Principal) -> Result<Totals, ExchangeError> {
        Ok(self.tallies(who).await?.into())
    }

    /// Admin: the files in `Messages`, `Unknown` and `Error` by kind of
    /// mailbox, and the oldest in a `Messages`, from the store's running
    /// totals (the first call tells the store every registered mailbox and
    /// builds their folder indexes; a store that keeps no totals is
    /// counted place by place, four counts per mailbox).
    pub async fn tallies(&self, who: &Principal) -> Result<Tallies, ExchangeError> {
        admin(who)?;
        self.counting().await;
        match self.parts.store.tallies().await {
            Some(t) => Ok(t),
            None => self.recount_tallies(who).await,
        }
    }

    /// Tells the store, once, every registered mailbox to keep in its
    /// running totals (those registered later are told as they are).
    async fn counting(&self) {
        let parts = &self.parts;
        parts
            .counting
            .get_or_init(|| async {
                let (dbs, devs) = (parts.registry.databases(), parts.registry.devices());
                for db in dbs {
                    parts.store.count_as(&db.id, MailboxKind::Database);
                }
                for dev in devs {
                    parts.store.count_as(&dev.id, MailboxKind::Device);
                }
            })
            .await;
    }

    /// Admin: the mailboxes whose `folder` (`Messages`, `Unknown` or
    /// `Error`) holds files, databases first, each kind in id order, from
    /// the store's running totals; `None` when the store keeps none (the
    /// caller looks at every mailbox).
    pub async fn holding(
        &self,
        who: &Principal,
        folder: Folder,
    ) -> Result<Option<Vec<(MailboxKind, Id)>>, ExchangeError> {
        admin(who)?;
        self.counting().await;
        Ok(self.parts.store.holding(folder).await)
    }

    /// Admin: [`totals`](Self::totals) counted place by place from the
    /// folder indexes (what the running totals must always equal).
    pub async fn recount(&self, who: &Principal) -> Result<Totals, ExchangeError> {
        Ok(self.recount_tallies(who).await?.into())
    }

    /// [`tallies`](Self::tallies) counted place by place.
    async fn recount_tallies(&self, who: &Principal) -> Result<Tallies, ExchangeError> {
        let (dbs, devs) = self.mailbox_ids(who)?;
        let store = &self.parts.store;
        let mut t = Tallies::default();
        let kinds = [(&dbs, &mut t.databases), (&devs, &mut t.devices)];
        for (ids, kind) in kinds {
            for id in ids {
                let count = |folder| {
                    let loc = Location::new(id.clone(), folder);
                    async move { store.count(&loc).await.map_or(0, |c| c as u64) }
                };
                let waiting = count(Folder::Messages).await;
                if waiting > 0 {
                    kind.messages += waiting;
                    let queue = Location::new(id.clone(), Folder::Messages);
                    if let Ok(Some(oldest)) =
                        store.oldest(&queue, 1).await.map(|v| v.into_iter().next())
                    {
                        kind.oldest_message = Some(match kind.oldest_message {
                            Some(o) if o <= oldest.created_at => o,
                            _ => oldest.created_at,
                        });
                    }
                }
                kind.unknown += count(Folder::Unknown).await;
                kind.error += count(Folder::Error).await;
            }
        }
        Ok(t)
    }

    /// The process list: kept in memory (its records of an earlier run read
    /// at the first call, each under its session, so no save slips by), or
    /// read from every record where the records are shared; `f` reads it.
    async fn with_process_list<T>(
        &self,
        f: impl FnOnce(&super::process_tally::ProcessTally) -> T,
    ) -> Result<T, ExchangeError> {
        let parts = &self.parts;
        let Some(tally) = &parts.process_tally else {
            return Ok(f(&self.read_all_processes().await?));
        };
        tally
            .loaded
            .get_or_try_init(|| async {
                for db in parts.registry.databases() {
                    if let Some(g) = parts.sessions.db.get(db.id.clone(), false).await? {
                        tally.first(&db.id, g.state());
                    }
                }
                Ok::<_, ExchangeError>(())
            })
            .await?;
        Ok(f(tally))
    }

    /// Admin: how many processes of every database are in each state
    /// (open ones and the recently ended), and since when the oldest
    /// READY_TO_COMMIT has been ready, kept as the records are saved (read
    /// from every record when other servers share the session store).
    pub async fn process_totals(&self, who: &Principal) -> Result<ProcessTotals, ExchangeError> {
        admin(who)?;
        self.with_process_list(|t| t.totals()).await
    }

    /// The process list read from every database's record.
    async fn read_all_processes(
        &self,
    ) -> Result<super::process_tally::ProcessTally, ExchangeError> {
        let read = super::process_tally::ProcessTally::default();
        for db in self.parts.registry.databases() {
            if let Some(g) = self.parts.sessions.db.get(db.id.clone(), false).await? {
                read.replace(&db.id, g.state());
            }
        }
        Ok(read)
    }

    /// Admin: how many processes the list holds, and up to `limit` of them
    /// after the `skip` first: open ones first, then the recently ended,
    /// newest first within each (as [`process_totals`](Self::process_totals)
    /// keeps or reads them).
    pub async fn process_page(
        &self,
        who: &Principal,
        skip: usize,
        limit: usize,
    ) -> Result<(usize, Vec<ProcessSummary>), ExchangeError> {
        admin(who)?;
        self.with_process_list(|t| t.page(skip, limit)).await
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
        let loc = Location::new(mailbox.clone(), folder);
        let total = self.parts.store.count(&loc).await? as u64;
        if limit == 0 || skip as u64 >= total {
            return Ok((total, Vec::new()));
        }
        let names = self
            .parts
            .store
            .oldest(&loc, skip.saturating_add(limit))
            .await?;
        Ok((total, names.into_iter().skip(skip).collect()))
    }
}
