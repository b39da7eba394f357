//! Writes that land in a mailbox from outside its owner's session (an
//! upload into a database's queue, a reply delivered to a device, a message
//! scheduled for either, a scheduled delivery) against the mailbox's
//! removal. Such a write holds its recipient's lock shared for as long as
//! it runs and first checks that the mailbox is not removed; a removal
//! holds it exclusively while it marks the mailbox removed. So every write
//! either finished before the removal (and the removal then finds and
//! deletes what it wrote) or finds the mailbox gone: nothing lands under a
//! deleted id, and nothing written for a deleted mailbox reaches one made
//! again under its id.
//!
//! A removal is durable: each removed mailbox has an empty file named by
//! its id under `<data>/.estafeta/removed/`, made before the mailbox's
//! messages go and removed when the mailbox is made again, so a batch run
//! again after a restart (a commit's reply to a device deleted meanwhile)
//! finds the mailbox removed too.
//!
//! The locks are striped by the id's hash: a removal holds back the
//! writes of the ids of its stripe only, and only while it marks.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Mutex;

use tokio::sync::{RwLock, RwLockReadGuard};

use crate::error::MailboxError;
use crate::id::Id;
use crate::mailbox::blocking;

/// How many locks the ids share.
const STRIPES: usize = 64;

/// The removed mailboxes and the locks that order writes into a mailbox
/// with its removal.
pub(crate) struct Removals {
    stripes: Vec<RwLock<()>>,
    /// Mailboxes removed and not made again, as their files say.
    removed: Mutex<HashSet<Id>>,
    /// Where each removed mailbox has its file.
    dir: PathBuf,
}

/// Writes into some mailboxes, holding back their removal until dropped.
pub(crate) struct Entered<'a> {
    _held: Vec<RwLockReadGuard<'a, ()>>,
    /// Those of the mailboxes that are removed: nothing may be written
    /// into them.
    removed: HashSet<Id>,
}

impl Entered<'_> {
    /// Whether nothing may be written into `id` (it was removed).
    pub(crate) fn is_removed(&self, id: &Id) -> bool {
        self.removed.contains(id)
    }
}

impl Removals {
    /// The removals recorded under `dir` (made if missing), read on a
    /// blocking thread.
    pub(crate) async fn open(dir: PathBuf) -> Result<Removals, MailboxError> {
        let read = dir.clone();
        let removed = blocking(move || {
            estafeta_durable::create_dir_all(&read, 0o700)
                .map_err(|e| MailboxError::io(&read, e))?;
            let mut removed = HashSet::new();
            for entry in std::fs::read_dir(&read).map_err(|e| MailboxError::io(&read, e))? {
                let entry = entry.map_err(|e| MailboxError::io(&read, e))?;
                // Anything else there (a file of an interrupted write) is
                // not a removal.
                if let Some(id) = entry.file_name().to_str().and_then(|n| Id::new(n).ok()) {
                    removed.insert(id);
                }
            }
            Ok(removed)
        })
        .await?;
        Ok(Removals {
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            removed: Mutex::new(removed),
            dir,
        })
    }

    fn removed(&self) -> std::sync::MutexGuard<'_, HashSet<Id>> {
        self.removed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn stripe(&self, id: &Id) -> usize {
        let mut h = DefaultHasher::new();
        id.hash(&mut h);
        usize::try_from(h.finish() % STRIPES as u64).unwrap_or(0)
    }

    /// Writes into `ids` may go on while the answer is held, except into
    /// those it names removed. Each stripe is taken once, in order, so
    /// that two writers and a removal cannot wait on each other.
    pub(crate) async fn enter<'i>(&self, ids: impl IntoIterator<Item = &'i Id>) -> Entered<'_> {
        let ids: Vec<&Id> = ids.into_iter().collect();
        let stripes: std::collections::BTreeSet<usize> =
            ids.iter().map(|id| self.stripe(id)).collect();
        let mut held = Vec::with_capacity(stripes.len());
        for i in stripes {
            held.push(self.stripes[i].read().await);
        }
        let removed = self.removed();
        let removed = ids
            .into_iter()
            .filter(|id| removed.contains(*id))
            .cloned()
            .collect();
        Entered {
            _held: held,
            removed,
        }
    }

    /// Marks `id` removed, durably, once every write into it under way has
    /// finished.
    pub(crate) async fn remove(&self, id: &Id) -> Result<(), MailboxError> {
        let _held = self.stripes[self.stripe(id)].write().await;
        let (dir, file) = (self.dir.clone(), self.dir.join(id.as_str()));
        blocking(move || {
            std::fs::File::create(&file).map_err(|e| MailboxError::io(&file, e))?;
            estafeta_durable::sync_dir(&dir).map_err(|e| MailboxError::io(&dir, e))
        })
        .await?;
        self.removed().insert(id.clone());
        Ok(())
    }

    /// `id` is a mailbox again (made anew, or its removal undone), durably.
    pub(crate) async fn restore(&self, id: &Id) -> Result<(), MailboxError> {
        if !self.removed().contains(id) {
            return Ok(());
        }
        let (dir, file) = (self.dir.clone(), self.dir.join(id.as_str()));
        blocking(move || {
            match std::fs::remove_file(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(MailboxError::io(&file, e));
                }
                _ => {}
            }
            estafeta_durable::sync_dir(&dir).map_err(|e| MailboxError::io(&dir, e))
        })
        .await?;
        self.removed().remove(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn id(s: &str) -> Id {
        Id::new(s).unwrap()
    }

    #[tokio::test]
    async fn a_removal_waits_for_writes_under_way_and_refuses_later_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("removed");
        let removals = Arc::new(Removals::open(dir.clone()).await.unwrap());
        let db = id("db-a");
        let writing = removals.enter([&db]).await;
        assert!(!writing.is_removed(&db));
        let removing = tokio::spawn({
            let (removals, db) = (removals.clone(), db.clone());
            async move { removals.remove(&db).await.unwrap() }
        });
        tokio::task::yield_now().await;
        assert!(!removing.is_finished(), "the removal waits for the write");
        drop(writing);
        removing.await.unwrap();
        let (b, c) = (id("db-b"), id("db-c"));
        let after = removals.enter([&db, &b, &c, &db]).await;
        assert!(after.is_removed(&db));
        assert!(!after.is_removed(&b) && !after.is_removed(&c));
        drop(after);
        let reopened = Removals::open(dir.clone()).await.unwrap();
        assert!(reopened.enter([&db]).await.is_removed(&db), "durable");
        removals.restore(&db).await.unwrap();
        assert!(!removals.enter([&db]).await.is_removed(&db));
        let reopened = Removals::open(dir).await.unwrap();
        assert!(!reopened.enter([&db]).await.is_removed(&db));
    }
}
