//! The mailboxes' running totals ([`Mailboxes::tallies`]) stay equal to a
//! count of the directories themselves: after random writes, moves and
//! deletes through the mailboxes, files added and removed by hand (seen
//! after the next check of the indexes), mailboxes told to count before and
//! after they hold files, and restarts.

use std::path::Path;

use crate::common::{id, message};
use estafeta_exchange::Timestamp;
use estafeta_exchange::mailbox::{
    FileName, Folder, KindTotals, Location, MailboxKind, Mailboxes, SyncConfig, Tallies,
};
use proptest::prelude::*;

/// The mailboxes of the test and their kinds.
const MAILBOXES: [(&str, MailboxKind); 4] = [
    ("db-a", MailboxKind::Database),
    ("db-b", MailboxKind::Database),
    ("phone-1", MailboxKind::Device),
    ("phone-2", MailboxKind::Device),
];
/// The folders files go to (`Prepared` is not counted).
const FOLDERS: [Folder; 4] = [
    Folder::Messages,
    Folder::Unknown,
    Folder::Error,
    Folder::Prepared,
];

#[derive(Clone, Debug)]
enum Op {
    /// A message written through the mailboxes.
    Write {
        mailbox: u8,
        folder: u8,
        created: u16,
    },
    /// A file moved to another folder of its mailbox.
    Move {
        mailbox: u8,
        from: u8,
        to: u8,
        pick: u8,
    },
    /// A file deleted through the mailboxes.
    Delete { mailbox: u8, folder: u8, pick: u8 },
    /// A file written by hand.
    AddByHand {
        mailbox: u8,
        folder: u8,
        created: u16,
    },
    /// A file removed by hand.
    RemoveByHand { mailbox: u8, folder: u8, pick: u8 },
    /// The mailbox is told to count (again).
    Tell { mailbox: u8 },
    /// The mailboxes are opened again on the same folder.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let m = 0u8..4;
    let f = 0u8..4;
    prop_oneof![
        6 => (m.clone(), f.clone(), any::<u16>()).prop_map(|(mailbox, folder, created)| Op::Write { mailbox, folder, created }),
        4 => (m.clone(), f.clone(), f.clone(), any::<u8>()).prop_map(|(mailbox, from, to, pick)| Op::Move { mailbox, from, to, pick }),
        2 => (m.clone(), f.clone(), any::<u8>()).prop_map(|(mailbox, folder, pick)| Op::Delete { mailbox, folder, pick }),
        2 => (m.clone(), f.clone(), any::<u16>()).prop_map(|(mailbox, folder, created)| Op::AddByHand { mailbox, folder, created }),
        2 => (m.clone(), f.clone(), any::<u8>()).prop_map(|(mailbox, folder, pick)| Op::RemoveByHand { mailbox, folder, pick }),
        1 => m.prop_map(|mailbox| Op::Tell { mailbox }),
        1 => Just(Op::Restart),
    ]
}

fn at(mailbox: u8, folder: u8) -> Location {
    Location::new(id(MAILBOXES[mailbox as usize].0), FOLDERS[folder as usize])
}

/// The message files of a folder on disk, oldest first.
fn on_disk(root: &Path, loc: &Location) -> Vec<FileName> {
    let mut names: Vec<FileName> = std::fs::read_dir(loc.path(root))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The file on disk in `loc` that `pick` chooses (counting round the
/// sorted names); none if there is none.
fn picked(root: &Path, loc: &Location, pick: u8) -> Option<FileName> {
    let names = on_disk(root, loc);
    (!names.is_empty()).then(|| names[pick as usize % names.len()].clone())
}

/// The totals counted from the directories of the mailboxes told to count.
fn recount(root: &Path, told: &[bool; 4]) -> Tallies {
    let mut t = Tallies::default();
    for (i, (name, kind)) in MAILBOXES.iter().enumerate() {
        if !told[i] {
            continue;
        }
        let of: &mut KindTotals = match kind {
            MailboxKind::Database => &mut t.databases,
            MailboxKind::Device => &mut t.devices,
        };
        let files = |folder| on_disk(root, &Location::new(id(name), folder));
        let messages = files(Folder::Messages);
        of.messages += messages.len() as u64;
        if let Some(first) = messages.first() {
            of.oldest_message = Some(match of.oldest_message {
                Some(o) if o <= first.created_at => o,
                _ => first.created_at,
            });
        }
        of.unknown += files(Folder::Unknown).len() as u64;
        of.error += files(Folder::Error).len() as u64;
    }
    t
}

async fn open(root: &Path, told: &[bool; 4]) -> Mailboxes {
    let mailboxes = Mailboxes::open(root, SyncConfig::default()).await.unwrap();
    for (i, (name, kind)) in MAILBOXES.iter().enumerate() {
        if told[i] {
            mailboxes.count_as(&id(name), *kind);
        }
    }
    mailboxes
}

async fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    // Two mailboxes count from the start, the others once told.
    let mut told = [true, false, true, false];
    let mut mailboxes = open(&root, &told).await;
    let mut seq = 0u128;
    for op in ops {
        seq += 1;
        let by_hand = matches!(op, Op::AddByHand { .. } | Op::RemoveByHand { .. });
        match op {
            Op::Write {
                mailbox,
                folder,
                created,
            } => {
                let loc = at(mailbox, folder);
                let m = message(
                    "phone-1",
                    loc.mailbox.as_str(),
                    "sales",
                    i64::from(created),
                    5_000,
                    seq,
                    "{}",
                );
                mailboxes.write(&loc, &m).await.unwrap();
            }
            Op::Move {
                mailbox,
                from,
                to,
                pick,
            } => {
                let (from, to) = (at(mailbox, from), at(mailbox, to));
                if from != to
                    && let Some(name) = picked(&root, &from, pick)
                {
                    mailboxes.move_file(&name, &from, &to).await.unwrap();
                }
            }
            Op::Delete {
                mailbox,
                folder,
                pick,
            } => {
                let loc = at(mailbox, folder);
                if let Some(name) = picked(&root, &loc, pick) {
                    mailboxes.delete(&loc, &name).await.unwrap();
                }
            }
            Op::AddByHand {
                mailbox,
                folder,
                created,
            } => {
                let loc = at(mailbox, folder);
                let name = FileName {
                    created_at: Timestamp::from_millis(i64::from(created)),
                    id: estafeta_exchange::MessageId::from_parts(6_000, seq),
                    from: id("phone-1"),
                    to: loc.mailbox.clone(),
                    subsystem: id("sales"),
                };
                let path = loc.path(&root);
                std::fs::create_dir_all(&path).unwrap();
                std::fs::write(path.join(name.to_string()), b"{}").unwrap();
            }
            Op::RemoveByHand {
                mailbox,
                folder,
                pick,
            } => {
                let loc = at(mailbox, folder);
                if let Some(name) = picked(&root, &loc, pick) {
                    std::fs::remove_file(loc.path(&root).join(name.to_string())).unwrap();
                }
            }
            Op::Tell { mailbox } => {
                let (name, kind) = MAILBOXES[mailbox as usize];
                told[mailbox as usize] = true;
                mailboxes.count_as(&id(name), kind);
            }
            Op::Restart => {
                drop(mailboxes);
                mailboxes = open(&root, &told).await;
            }
        }
        if by_hand {
            // Seen once the indexes are checked after a read of the totals.
            mailboxes.tallies().await;
            mailboxes.verify().await.unwrap();
        }
        assert_eq!(
            mailboxes.tallies().await,
            recount(&root, &told),
            "after {seq} ops"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn the_totals_equal_a_count_of_the_directories(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(ops));
    }
}

/// A mailbox told to count while its folders hold files, including one
/// made by hand after the first read: the first read builds its indexes,
/// the folder made by hand is found by the next check.
#[tokio::test]
async fn files_already_there_and_folders_made_by_hand_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let mailboxes = Mailboxes::open(&root, SyncConfig::default()).await.unwrap();
    let queue = Location::new(id("db-a"), Folder::Messages);
    for seq in 0..3 {
        let m = message(
            "phone-1",
            "db-a",
            "sales",
            100 + seq as i64,
            5_000,
            seq,
            "{}",
        );
        mailboxes.write(&queue, &m).await.unwrap();
    }
    mailboxes.count_as(&id("db-a"), MailboxKind::Database);
    mailboxes.count_as(&id("phone-1"), MailboxKind::Device);
    let t = mailboxes.tallies().await;
    assert_eq!(t.databases.messages, 3);
    assert_eq!(
        t.databases.oldest_message,
        Some(Timestamp::from_millis(100))
    );
    assert_eq!(t.devices, KindTotals::default());

    let error = Location::new(id("phone-1"), Folder::Error);
    std::fs::create_dir_all(error.path(&root)).unwrap();
    let name = FileName {
        created_at: Timestamp::from_millis(7),
        id: estafeta_exchange::MessageId::from_parts(6_000, 1),
        from: id("db-a"),
        to: id("phone-1"),
        subsystem: id("sales"),
    };
    std::fs::write(error.path(&root).join(name.to_string()), b"{}").unwrap();
    mailboxes.verify().await.unwrap();
    assert_eq!(
        mailboxes.tallies().await,
        recount(&root, &[true, false, true, false])
    );
    assert_eq!(mailboxes.tallies().await.devices.error, 1);
}
