//! Running totals of the counted folders (`Messages`, `Unknown`, `Error`)
//! over every mailbox, by kind of mailbox, and the oldest file of each:
//! kept by the folder indexes in the same step as their own listing
//! changes (a settled write, move or delete, a scan), so reading them costs
//! the same with ten mailboxes as with ten thousand.
//!
//! An index counts here only once it is built and only if its mailbox was
//! told to count ([`Mailboxes::count_as`](super::Mailboxes::count_as)); each
//! index remembers what it last added ([`Share`]), so a rescan, a kind
//! changed or an index dropped adjusts the totals by exactly that.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::Folder;
use crate::id::Id;
use crate::timestamp::Timestamp;

/// Whose mailbox a folder belongs to.
pub use crate::wire::Kind as MailboxKind;

/// The folders the totals count.
pub const COUNTED: [Folder; 3] = [Folder::Messages, Folder::Unknown, Folder::Error];

/// The totals of one kind of mailbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindTotals {
    /// Files in `Messages`.
    pub messages: u64,
    /// The creation time of the oldest file in any `Messages`.
    pub oldest_message: Option<Timestamp>,
    /// Files in `Unknown`.
    pub unknown: u64,
    /// Files in `Error`.
    pub error: u64,
}

/// The running totals of every mailbox told to count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tallies {
    /// Over the databases' mailboxes.
    pub databases: KindTotals,
    /// Over the devices' mailboxes.
    pub devices: KindTotals,
}

/// What one folder index has added to the totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Share {
    pub(crate) files: usize,
    pub(crate) oldest: Option<Timestamp>,
}

/// One counted folder's totals: the files, and each folder's oldest file
/// (by time, then mailbox) for the oldest over all.
#[derive(Default)]
struct Slot {
    files: u64,
    oldest: BTreeSet<(Timestamp, Id)>,
}

/// The shared totals.
#[derive(Default)]
pub(crate) struct Tally {
    slots: Mutex<HashMap<(MailboxKind, Folder), Slot>>,
    /// Whether the totals were read since the indexes were last checked
    /// against their directories (see [`Tally::take_read`]).
    read: AtomicBool,
}

impl Tally {
    fn slots(&self) -> MutexGuard<'_, HashMap<(MailboxKind, Folder), Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the share `old` of folder `folder` of `mailbox` (a mailbox
    /// of `kind`) with `new`.
    pub(crate) fn replace(
        &self,
        kind: MailboxKind,
        folder: Folder,
        mailbox: &Id,
        old: Share,
        new: Share,
    ) {
        if old == new {
            return;
        }
        let mut slots = self.slots();
        let slot = slots.entry((kind, folder)).or_default();
        slot.files = slot.files.saturating_sub(old.files as u64) + new.files as u64;
        if old.oldest != new.oldest {
            if let Some(t) = old.oldest {
                slot.oldest.remove(&(t, mailbox.clone()));
            }
            if let Some(t) = new.oldest {
                slot.oldest.insert((t, mailbox.clone()));
            }
        }
    }

    /// The totals now; notes that they were read.
    pub(crate) fn read(&self) -> Tallies {
        self.read.store(true, Ordering::Relaxed);
        let slots = self.slots();
        let files = |kind, folder| slots.get(&(kind, folder)).map_or(0, |s| s.files);
        let of = |kind| KindTotals {
            messages: files(kind, Folder::Messages),
            oldest_message: slots
                .get(&(kind, Folder::Messages))
                .and_then(|s| s.oldest.first())
                .map(|(t, _)| *t),
            unknown: files(kind, Folder::Unknown),
            error: files(kind, Folder::Error),
        };
        Tallies {
            databases: of(MailboxKind::Database),
            devices: of(MailboxKind::Device),
        }
    }

    /// The counted mailboxes with files in `folder`, the databases' first,
    /// each kind in id order; notes a read, as [`Tally::read`] does.
    pub(crate) fn holding(&self, folder: Folder) -> Vec<(MailboxKind, Id)> {
        self.read.store(true, Ordering::Relaxed);
        let slots = self.slots();
        [MailboxKind::Database, MailboxKind::Device]
            .into_iter()
            .flat_map(|kind| {
                let ids: BTreeSet<&Id> = slots
                    .get(&(kind, folder))
                    .map(|s| s.oldest.iter().map(|(_, id)| id).collect())
                    .unwrap_or_default();
                ids.into_iter()
                    .map(move |id| (kind, id.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Whether the totals were read since the last call: the counted
    /// indexes are then checked against their directories with those in
    /// use, so that files added or removed by hand reach the totals.
    pub(crate) fn take_read(&self) -> bool {
        self.read.swap(false, Ordering::Relaxed)
    }
}

/// A counted folder's place in the totals.
#[derive(Clone)]
pub(crate) struct Counted {
    pub(crate) kind: MailboxKind,
    pub(crate) folder: Folder,
    pub(crate) mailbox: Id,
    pub(crate) tally: std::sync::Arc<Tally>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Id {
        Id::new(s).unwrap()
    }

    fn share(files: usize, t: i64) -> Share {
        Share {
            files,
            oldest: (files > 0).then(|| Timestamp::from_millis(t)),
        }
    }

    #[test]
    fn the_mailboxes_holding_files_are_kept_as_their_folders_fill_and_empty() {
        let tally = Tally::default();
        let none = Share::default();
        tally.replace(
            MailboxKind::Device,
            Folder::Error,
            &id("phone"),
            none,
            share(1, 5),
        );
        tally.replace(
            MailboxKind::Database,
            Folder::Error,
            &id("db-b"),
            none,
            share(2, 9),
        );
        tally.replace(
            MailboxKind::Database,
            Folder::Error,
            &id("db-a"),
            none,
            share(1, 1),
        );
        tally.replace(
            MailboxKind::Database,
            Folder::Unknown,
            &id("db-c"),
            none,
            share(1, 1),
        );
        assert_eq!(
            tally.holding(Folder::Error),
            vec![
                (MailboxKind::Database, id("db-a")),
                (MailboxKind::Database, id("db-b")),
                (MailboxKind::Device, id("phone")),
            ]
        );
        // db-a's folder empties: it holds nothing any more.
        tally.replace(
            MailboxKind::Database,
            Folder::Error,
            &id("db-a"),
            share(1, 1),
            none,
        );
        assert_eq!(
            tally.holding(Folder::Error),
            vec![
                (MailboxKind::Database, id("db-b")),
                (MailboxKind::Device, id("phone")),
            ]
        );
        assert_eq!(
            tally.holding(Folder::Unknown),
            vec![(MailboxKind::Database, id("db-c"))]
        );
        assert!(tally.holding(Folder::Messages).is_empty());
    }
}
