//! The mailboxes on disk: one folder per database id and per device id,
//! each with `Messages`, `Prepared`, `Log`, `Unknown` and `Error`, and one
//! file per message.
//!
//! A message file holds exactly the message's JSON as the API hands it out,
//! and its [`FileName`] holds everything needed to route, filter, list, limit
//! and expire it, so the hot paths never parse a file: a start (API_1) or an
//! inbox answer is assembled by joining file bytes ([`Mailboxes::read_array`]).
//!
//! Durability: a write goes to a dot-prefixed temporary name in the target
//! folder (hidden from listings; an empty file made ahead when one is
//! ready, see [`SPARE_PREFIX`]), is fsynced, renamed to its final name, and
//! the folder is fsynced, unless the temporary name was durable already (a
//! durable spare, [`DURABLE_SPARE_PREFIX`], whose written content the next
//! run publishes if a crash loses the rename); a move is a rename plus fsyncs of both folders; a
//! delete is an unlink plus a folder fsync. A folder fsync is shared by
//! every caller that needs one of that folder at the same time; a single
//! write is published on the thread that wrote its file, and the moves,
//! deletes and batch writes of concurrent callers are committed in batches
//! by one task (see [`SyncConfig`]); no call returns before its change is
//! on disk. Moves and
//! deletes are idempotent, so an interrupted sequence of them can simply be
//! repeated after a crash.
//!
//! A mailbox's folders are made when their first file goes into them (the
//! new folder's entry fsynced before the file's), so an idle mailbox costs
//! nothing on disk; a folder not made yet lists as empty.
//!
//! Listings, selections and counts are answered from an in-memory index of
//! each folder (built at the folder's first use, told of every change once
//! its folder fsync is done, and checked against the directory every
//! [`SyncConfig::verify_every`]), so their cost does not grow with the
//! number of files waiting; the files stay the truth.

mod folder;
mod index;
mod name;
mod rounds;
mod select;
mod spares;
mod sync;
mod tally;

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

pub use folder::{Folder, Location};
pub use name::FileName;
pub use select::{Filter, Limits, MB, take_within};
pub use spares::{CONFIRMED_SPARE_PREFIX, DURABLE_SPARE_PREFIX, SPARE_PREFIX, is_idle_spare};
pub use sync::{SyncConfig, SyncStats};
pub use tally::{COUNTED, KindTotals, MailboxKind, Tallies};

use crate::error::MailboxError;
use crate::id::Id;
use crate::timestamp::Timestamp;
use crate::ulid_ids::MessageId;
use crate::wire::{FileInfo, Message};
use index::{FolderIndex, Indexes};
use spares::{Kind, Spares};
use sync::{Applied, Change, DirSync, Entries, Fate, Settle, Syncer};

/// A message file in a listing: its parsed name and its size in bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileEntry {
    /// The parsed file name.
    pub name: FileName,
    /// The file's size, from its metadata.
    pub size: u64,
}

impl From<&FileEntry> for FileInfo {
    fn from(e: &FileEntry) -> Self {
        FileInfo {
            name: e.name.to_string(),
            size: e.size,
            id: e.name.id,
            from: e.name.from.clone(),
            to: e.name.to.clone(),
            subsystem: e.name.subsystem.clone(),
            created_at: e.name.created_at,
            error_code: None,
            error_text: None,
        }
    }
}

/// A JSON array assembled from message files, and the files it holds (a
/// file that vanished since it was listed is left out of both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawArray {
    /// `[` file bytes joined by `,` `]`.
    pub json: Vec<u8>,
    /// The files included, in order.
    pub names: Vec<FileName>,
}

/// The outcome of an idempotent move or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The change was made by this call.
    Done,
    /// It had been made before (the source was already gone and, for a move,
    /// the target present); the folders were fsynced again all the same.
    AlreadyDone,
}

impl From<Applied> for Outcome {
    fn from(a: Applied) -> Self {
        match a {
            Applied::Done => Outcome::Done,
            Applied::AlreadyDone => Outcome::AlreadyDone,
        }
    }
}

/// A message written to a temporary file and fsynced, not yet published.
#[derive(Clone)]
struct Staged {
    name: FileName,
    size: u64,
    temp: PathBuf,
    target: PathBuf,
}

/// One message's write into a folder: its temporary file written and
/// fsynced ([`write`](Single::write)), then published
/// ([`publish`](Single::publish)); both blocking.
struct Single {
    syncer: Syncer,
    index: Arc<FolderIndex>,
    staged: Staged,
    /// Whether the temporary file's name is durable already (a durable
    /// spare): then the publish needs no folder fsync, and a failed write's
    /// removal of it does.
    entries: Entries,
    /// Whether the temporary file is a spare, or a name of the write's own.
    temp: Temp,
    dir: PathBuf,
    bytes: Vec<u8>,
}

impl Single {
    /// Writes and fsyncs the temporary file (removed again on a failure;
    /// durably if its name was durable, as it may hold the whole message).
    fn write(&self) -> Result<(), MailboxError> {
        let temp = &self.staged.temp;
        let written = write_in_folder(&self.syncer, &self.dir, temp, || {
            write_and_sync(temp, self.temp, &self.bytes)
        });
        if written.is_err() && self.entries == Entries::Durable {
            let _ = self.syncer.sync_dir(&self.dir);
        }
        written?;
        self.syncer.count_file_fsync();
        Ok(())
    }

    /// Renames the written file to its name, fsyncs its folder unless the
    /// temporary name was durable ([`Syncer::apply_now`]), and tells the
    /// folder's index.
    fn publish(&self) -> Result<FileEntry, MailboxError> {
        let (change, settle, entry) = publish_change(Arc::clone(&self.index), self.staged.clone());
        self.syncer.apply_now(change, settle, self.entries)?;
        Ok(entry)
    }
}

/// What the thread that wrote a file of [`Mailboxes::write_when`] found
/// of its go-ahead once the file was fsynced.
enum GoAhead {
    /// Given: the file was published on that thread.
    Published(Result<FileEntry, MailboxError>),
    /// Refused (or its sender gone): the file is not to appear.
    Refused,
    /// Not given yet: to be awaited off the blocking threads.
    Awaited(tokio::sync::oneshot::Receiver<bool>),
}

/// The mailboxes under one data folder. Cheap to clone; all clones share
/// one group-commit task, which must run on a tokio runtime.
#[derive(Clone)]
pub struct Mailboxes {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    syncer: Syncer,
    indexes: Indexes,
    /// Held while the counted folders are checked before the totals are
    /// read: a second reader waits for the first's check.
    checking: tokio::sync::Mutex<()>,
    /// The end of the temporary names of this run's writes
    /// (`.<run>.tmp`, see [`temp_suffix`]): a temporary file with another
    /// end was left by an earlier run.
    temp_suffix: String,
    /// Empty temporary files made ahead for the writes published once
    /// allowed into folders other than `Messages` (the batches), so that a
    /// write creates none.
    spares: Spares,
    /// The same, their names durable, for the writes published at once
    /// ([`write`](Mailboxes::write)).
    durable_spares: Spares,
    /// The same, their names durable, for the writes into `Messages`
    /// published once allowed ([`write_when`](Mailboxes::write_when)).
    confirmed_spares: Spares,
    /// The earlier runs' spares found in each queue folder by
    /// [`unconfirmed_written`](Mailboxes::unconfirmed_written), for the
    /// [`publish_written`](Mailboxes::publish_written) that follows it:
    /// a start reads each queue's folder once (nothing else writes an
    /// earlier run's spare in between).
    earlier_found: std::sync::Mutex<HashMap<PathBuf, Vec<(Kind, PathBuf)>>>,
}

impl Inner {
    /// Keeps what a look at the queue folder `dir` found of earlier runs'
    /// spares, for the publish that follows.
    fn found_earlier(&self, dir: PathBuf, found: Vec<(Kind, PathBuf)>) {
        if let Ok(mut kept) = self.earlier_found.lock() {
            kept.insert(dir, found);
        }
    }

    /// What [`found_earlier`](Self::found_earlier) kept of `dir`, taken.
    fn take_found_earlier(&self, dir: &Path) -> Option<Vec<(Kind, PathBuf)>> {
        self.earlier_found.lock().ok()?.remove(dir)
    }

    /// The spares of `kind`.
    fn spares(&self, kind: Kind) -> &Spares {
        match kind {
            Kind::Gated => &self.spares,
            Kind::Durable => &self.durable_spares,
            Kind::Confirmed => &self.confirmed_spares,
        }
    }

    /// Every kind's spares.
    fn pools(&self) -> [&Spares; 3] {
        [&self.spares, &self.durable_spares, &self.confirmed_spares]
    }
}

/// The end of the temporary file names of one run of the mailboxes:
/// `.<run>.tmp`, `<run>` four random characters (`0-9a-z`), so that the
/// sweep of what earlier runs left never touches a write under way
/// (whatever the clocks say). A name of an earlier run that happens to end
/// the same (one chance in 1.7 million) is left until a later run.
fn temp_suffix() -> String {
    use std::hash::BuildHasher;
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut random = std::collections::hash_map::RandomState::new().hash_one(SystemTime::now());
    let mut run = String::with_capacity(4);
    for _ in 0..4 {
        run.push(char::from(DIGITS[(random % 36) as usize]));
        random /= 36;
    }
    format!(".{run}.tmp")
}

impl Mailboxes {
    /// Opens (creating if needed) the data folder `root` and starts the
    /// group-commit task and the index checks on the current runtime.
    pub async fn open(root: impl Into<PathBuf>, config: SyncConfig) -> Result<Self, MailboxError> {
        Self::open_with(root.into(), config, Arc::new(sync::fsync_dir)).await
    }

    /// [`open`](Self::open), making directories durable with `dir_sync`.
    async fn open_with(
        root: PathBuf,
        config: SyncConfig,
        dir_sync: DirSync,
    ) -> Result<Self, MailboxError> {
        let dir = root.clone();
        let sync_root = Arc::clone(&dir_sync);
        blocking(move || {
            if dir.is_dir() {
                // Made durable by the start that created it; a start on a
                // full disk must not fail on an fsync it does not need.
                return Ok(());
            }
            std::fs::create_dir_all(&dir).map_err(|e| MailboxError::io(&dir, e))?;
            // The folder's own entry must be durable too; a relative root
            // like `estafeta-data` has the current folder as its parent.
            let parent = match dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            sync_root(parent).map_err(|e| MailboxError::io(parent, e))
        })
        .await?;
        let suffix = temp_suffix();
        let inner = Arc::new(Inner {
            root,
            syncer: Syncer::start(config, dir_sync),
            indexes: Indexes::new(suffix.clone()),
            checking: tokio::sync::Mutex::new(()),
            spares: Spares::new(spares::Kind::Gated, suffix.clone()),
            durable_spares: Spares::new(spares::Kind::Durable, suffix.clone()),
            confirmed_spares: Spares::new(spares::Kind::Confirmed, suffix.clone()),
            earlier_found: std::sync::Mutex::default(),
            temp_suffix: suffix,
        });
        tokio::spawn(verify_every(Arc::downgrade(&inner), config.verify_every));
        Ok(Self { inner })
    }

    /// The data folder.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The directory of a folder.
    pub fn path(&self, loc: &Location) -> PathBuf {
        loc.path(&self.inner.root)
    }

    /// Counters of the group commit.
    pub fn stats(&self) -> SyncStats {
        self.inner.syncer.stats()
    }

    /// Checks that the mailbox of a database or device can be used: nothing
    /// that is not a folder is in the way of its folder. Nothing is made:
    /// the mailbox's folders are made when their first file goes into them.
    /// Checking an existing mailbox is not an error.
    pub async fn create_mailbox(&self, id: &Id) -> Result<(), MailboxError> {
        let base = self.inner.root.join(id.as_str());
        blocking(move || match std::fs::metadata(&base) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(MailboxError::io(
                &base,
                io::Error::new(io::ErrorKind::NotADirectory, "not a folder"),
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(MailboxError::io(&base, e)),
        })
        .await
    }

    /// The index of a folder, not necessarily built.
    fn index(&self, loc: &Location) -> Arc<FolderIndex> {
        self.inner.indexes.folder(loc, || self.path(loc))
    }

    /// The index of a folder, built from its directory at its first use.
    async fn ready(&self, loc: &Location) -> Result<Arc<FolderIndex>, MailboxError> {
        let index = self.index(loc);
        if !index.ready() {
            let building = Arc::clone(&index);
            blocking(move || building.build()).await?;
        }
        Ok(index)
    }

    /// The index of a folder like [`ready`](Self::ready), or `None` for a
    /// folder that has no index and does not exist: it holds nothing, and a
    /// look at an idle mailbox (a listing, a count, a retention sweep)
    /// leaves it no index in memory.
    async fn ready_unless_absent(
        &self,
        loc: &Location,
    ) -> Result<Option<Arc<FolderIndex>>, MailboxError> {
        if !self.inner.indexes.has(loc) {
            let dir = self.path(loc);
            let absent = move || {
                let found = std::fs::metadata(&dir);
                Ok(found.is_err_and(|e| e.kind() == io::ErrorKind::NotFound))
            };
            if blocking(absent).await? {
                return Ok(None);
            }
        }
        self.ready(loc).await.map(Some)
    }

    /// Counts the `Messages`, `Unknown` and `Error` of mailbox `id` in the
    /// running totals ([`tallies`](Self::tallies)) as a mailbox of `kind`,
    /// from now on. Telling it again is not an error; telling another kind
    /// moves what it counts.
    pub fn count_as(&self, id: &Id, kind: MailboxKind) {
        self.inner.indexes.count_as(id, kind);
    }

    /// The running totals of the mailboxes told to [`count_as`](Self::count_as):
    /// files in `Messages`, `Unknown` and `Error` by kind of mailbox, and
    /// the oldest file waiting in a `Messages`. Kept by the folder indexes
    /// as files come and go, so a read costs the same at any size; the
    /// first read after a mailbox is told to count builds the indexes of
    /// its existing counted folders (a folder that cannot be read is
    /// logged, counts as empty, and is tried again at the next read).
    /// Files added or removed by hand are counted from the next
    /// [`verify`](Self::verify) after a read.
    pub async fn tallies(&self) -> Tallies {
        self.check_counted().await;
        self.inner.indexes.tally.read()
    }

    /// The mailboxes told to [`count_as`](Self::count_as) whose `folder`
    /// (one of the counted) holds files: databases first, each kind in id
    /// order; kept with the totals, so it costs what the number of such
    /// mailboxes does, not all of them.
    pub async fn holding(&self, folder: Folder) -> Vec<(MailboxKind, Id)> {
        self.check_counted().await;
        self.inner.indexes.tally.holding(folder)
    }

    /// Builds the indexes of the counted folders waiting to be checked
    /// that exist (those absent are noted, and given no index).
    async fn check_counted(&self) {
        let indexes = &self.inner.indexes;
        let _checking = self.inner.checking.lock().await;
        let unchecked = indexes.take_unchecked();
        if unchecked.is_empty() {
            return;
        }
        let (known, unknown): (Vec<_>, Vec<_>) =
            unchecked.into_iter().partition(|loc| indexes.has(loc));
        // Whether each folder without an index exists, in one blocking call.
        let (root, probed) = (self.inner.root.clone(), unknown.clone());
        let found = blocking(move || {
            Ok(probed
                .into_iter()
                .map(|loc| {
                    let gone = std::fs::metadata(loc.path(&root))
                        .is_err_and(|e| e.kind() == io::ErrorKind::NotFound);
                    (loc, gone)
                })
                .collect::<Vec<_>>())
        })
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "checking the counted folders failed; tried again at the next read");
            for loc in unknown {
                indexes.uncheck(loc);
            }
            Vec::new()
        });
        let mut to_build = known;
        for (loc, gone) in found {
            if gone {
                // A file's arrival makes its index, which puts the folder
                // back to be checked; a folder made by hand is found by
                // the next check of the indexes.
                indexes.absent(loc);
            } else {
                to_build.push(loc);
            }
        }
        for loc in to_build {
            match self.ready(&loc).await {
                Ok(_) => indexes.checked(&loc),
                Err(e) => {
                    tracing::warn!(folder = %loc, error = %e, "a counted folder cannot be read; it counts as empty");
                    indexes.uncheck(loc);
                }
            }
        }
    }

    /// Checks the index of every folder read since its last check against
    /// its directory, so that files added or removed by hand are seen by
    /// the next listing; if the totals were read since the last check, also
    /// every counted folder (and those found absent, in case one was made
    /// by hand), so that the totals see them too. Run every
    /// [`SyncConfig::verify_every`] in the background. Returns how many
    /// folders were checked, or the first error (the other folders are
    /// checked all the same).
    pub async fn verify(&self) -> Result<usize, MailboxError> {
        let mut checked = 0;
        let mut first_error = None;
        let indexes = &self.inner.indexes;
        let counted = indexes.tally.take_read();
        if counted {
            indexes.recheck_absent();
            self.check_counted().await;
        }
        for index in indexes.used(counted) {
            match blocking(move || index.rescan()).await {
                Ok(()) => checked += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(checked),
            Some(e) => Err(e),
        }
    }

    /// Writes `message` durably into `loc` and returns its file entry. On any
    /// error nothing is visible: the temporary file is removed.
    ///
    /// Cancellation: if this future is dropped before it completes, the
    /// message may or may not appear (complete, never partial), and a hidden
    /// temporary file may stay behind until [`sweep_temp_files`](Self::sweep_temp_files).
    /// Run writes whose outcome must be known to completion (e.g. on a task
    /// of their own, not on a request future a client can cancel).
    pub async fn write(
        &self,
        loc: &Location,
        message: &Message,
    ) -> Result<FileEntry, MailboxError> {
        // Durable spares serve `Messages` folders only, the folders whose
        // leftovers the start looks at before anything moves messages
        // (`publish_written`).
        let kind = match loc.folder {
            Folder::Messages => Kind::Durable,
            _ => Kind::Gated,
        };
        let single = self.single(loc, message, kind)?;
        let dir = single.dir.clone();
        // One blocking thread from the temporary file's creation to its
        // publish: no hand-over between threads on the way.
        let written = blocking(move || {
            single.write()?;
            single.publish()
        })
        .await;
        self.refill_spares(dir, kind);
        written
    }

    /// Like [`write`](Self::write), but the file appears in `loc` only once
    /// `when` answers `true`: it is written and fsynced meanwhile, so that
    /// whatever the caller makes durable before the message may appear
    /// overlaps the file's fsync. If `when` answers `false` (or its sender
    /// is dropped), the file does not appear, its temporary file is
    /// removed, and the answer is `None`.
    ///
    /// Into `Messages` the file is written into a confirmed spare (see
    /// [`CONFIRMED_SPARE_PREFIX`]), and its rename needs no folder fsync: a
    /// crash may then leave it written but unpublished, and the next start
    /// asks the caller whether its go-ahead was given
    /// ([`unconfirmed_written`](Self::unconfirmed_written),
    /// [`publish_written`](Self::publish_written)). So a caller writing
    /// into `Messages` must, at the next start, be able to tell from the
    /// message whether it gave the go-ahead, and must
    /// [`settle`](Self::settle) the folder before it forgets that it did.
    ///
    /// The go-ahead is never waited for on the blocking thread that wrote
    /// the file: what gives it may need a blocking thread of its own (a
    /// key's commit does), and a pool full of writers waiting would never
    /// see it. A go-ahead already given when the file is fsynced is taken
    /// there, and the file published on the same thread; otherwise it is
    /// awaited here, and the file published here too if it went into a
    /// confirmed spare (one rename, about 15 µs: cheaper than a hand-off to
    /// a blocking thread and back, which costs a keyed upload about 2.5
    /// `futex` calls and 2 context switches), else on a blocking thread (a
    /// rename and a folder fsync).
    pub async fn write_when(
        &self,
        loc: &Location,
        message: &Message,
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Option<FileEntry>, MailboxError> {
        use tokio::sync::oneshot::error::TryRecvError;
        let kind = match loc.folder {
            Folder::Messages => Kind::Confirmed,
            _ => Kind::Gated,
        };
        let single = Arc::new(self.single(loc, message, kind)?);
        let written = {
            let single = Arc::clone(&single);
            let mut when = when;
            blocking(move || {
                single.write()?;
                Ok(match when.try_recv() {
                    Ok(true) => GoAhead::Published(single.publish()),
                    Ok(false) | Err(TryRecvError::Closed) => GoAhead::Refused,
                    Err(TryRecvError::Empty) => GoAhead::Awaited(when),
                })
            })
            .await
        };
        self.refill_spares(single.dir.clone(), kind);
        let go = match written? {
            GoAhead::Published(entry) => return entry.map(Some),
            GoAhead::Refused => false,
            GoAhead::Awaited(when) => when.await.unwrap_or(false),
        };
        if go {
            return match single.entries {
                Entries::Durable => single.publish().map(Some),
                Entries::Unsynced => blocking(move || single.publish()).await.map(Some),
            };
        }
        // The removal is not made durable: a temporary file a crash brings
        // back is swept at start-up (a confirmed spare, removed there as
        // its go-ahead is not confirmed).
        blocking(move || {
            let _ = std::fs::remove_file(&single.staged.temp);
            Ok(None)
        })
        .await
    }

    /// How `message` is written into `loc` on its own, into a spare of
    /// `kind` if one is ready.
    fn single(
        &self,
        loc: &Location,
        message: &Message,
        kind: Kind,
    ) -> Result<Single, MailboxError> {
        let name = FileName::of(message);
        let bytes = message.to_file_bytes().map_err(MailboxError::Serialize)?;
        let dir = self.path(loc);
        let final_name = name.to_string();
        let (temp, entries, of) = match self.inner.spares(kind).take(&dir) {
            Some(spare) if kind.durable() => (spare, Entries::Durable, Temp::Spare),
            Some(spare) => (spare, Entries::Unsynced, Temp::Spare),
            None => (
                self.own_temp_path(&dir, &final_name),
                Entries::Unsynced,
                Temp::Own,
            ),
        };
        Ok(Single {
            syncer: self.inner.syncer.clone(),
            index: self.index(loc),
            staged: Staged {
                size: bytes.len() as u64,
                target: dir.join(&final_name),
                temp,
                name,
            },
            entries,
            temp: of,
            dir,
            bytes,
        })
    }

    /// The temporary name of a write of the file `final_name` into `dir`
    /// that finds no spare: `.<final_name>.<run>.tmp`.
    fn own_temp_path(&self, dir: &Path, final_name: &str) -> PathBuf {
        dir.join(format!(".{final_name}{}", self.inner.temp_suffix))
    }

    /// Makes new spares of `kind` for `dir` on a blocking task of their
    /// own, if it runs low: after a write, so that the files are made
    /// beside its answer, not before it.
    fn refill_spares(&self, dir: PathBuf, kind: Kind) {
        if self.inner.spares(kind).claim_refill(&dir) {
            let inner = Arc::clone(&self.inner);
            drop(tokio::task::spawn_blocking(move || {
                inner
                    .spares(kind)
                    .refill(&dir, &|dir| inner.syncer.sync_dir(dir))
            }));
        }
    }

    /// Removes every spare not taken, at a clean stop once nothing more is
    /// written, and makes no more; a refill under way removes what it makes
    /// and is waited for (a second at most). The removals are not made
    /// durable: a spare a crash brings back is swept at the next start.
    /// `true` if no spare is left (every removal done, no refill under way).
    pub async fn remove_spares(&self) -> bool {
        let inner = Arc::clone(&self.inner);
        let removed = blocking(move || {
            let pools = inner.pools();
            let mut all = true;
            for spare in pools.iter().flat_map(|pool| pool.close()) {
                if let Err(e) = std::fs::remove_file(&spare) {
                    tracing::debug!(file = %spare.display(), error = %e, "removing a spare file failed");
                    all = false;
                }
            }
            let until = std::time::Instant::now() + Duration::from_secs(1);
            while pools.iter().any(|pool| pool.refilling()) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(all && !pools.iter().any(|pool| pool.refilling()))
        });
        removed.await.unwrap_or(false)
    }

    /// Forgets the spares of mailbox `id`'s folders, before the mailbox is
    /// removed whole (see [`SPARE_PREFIX`]).
    pub fn forget_spares(&self, id: &Id) {
        let base = self.inner.root.join(id.as_str());
        for pool in self.inner.pools() {
            pool.forget_under(&base);
        }
    }

    /// Writes each message into a temporary file of `loc` and fsyncs it,
    /// as [`write`](Self::write) does before publishing: the files are
    /// created and written one after another on one thread (creations in
    /// one folder take the folder's lock in turn whatever the threads, and
    /// threads waiting for it spin), then fsynced each on its own thread
    /// (so that the fsyncs overlap, and the file system and the disk group
    /// them).
    /// Creation stops at the first failure, and then nothing is fsynced.
    /// Answers the files staged, in the order of `messages` (`None` for
    /// one failed or not made, whose temporary file is not left behind),
    /// and the first error; on an error the caller removes the files
    /// staged.
    async fn stage_all(
        &self,
        loc: &Location,
        messages: &[Message],
    ) -> (Vec<Option<Staged>>, Option<MailboxError>) {
        let mut staged: Vec<Option<Staged>> = messages.iter().map(|_| None).collect();
        let mut first_error = None;
        let dir = self.path(loc);
        let mut plans = Vec::with_capacity(messages.len());
        for m in messages {
            let name = FileName::of(m);
            let bytes = match m.to_file_bytes() {
                Ok(b) => b,
                Err(e) => {
                    first_error.get_or_insert(MailboxError::Serialize(e));
                    continue;
                }
            };
            plans.push((plans.len(), name, bytes));
        }
        if first_error.is_some() {
            return (staged, first_error);
        }
        // Spares are taken only for a batch that is written.
        let plans: Vec<_> = plans
            .into_iter()
            .map(|(i, name, bytes)| {
                let final_name = name.to_string();
                let (temp, of) = match self.inner.spares.take(&dir) {
                    Some(spare) => (spare, Temp::Spare),
                    None => (self.own_temp_path(&dir, &final_name), Temp::Own),
                };
                (i, name, bytes, (temp, of), dir.join(final_name))
            })
            .collect();
        let refill = dir.clone();
        let syncer = self.inner.syncer.clone();
        let created = blocking(move || {
            let mut created = Vec::with_capacity(plans.len());
            let mut plans = plans.into_iter();
            while let Some((i, name, bytes, (temp, of), target)) = plans.next() {
                match write_in_folder(&syncer, &dir, &temp, || write_temp(&temp, of, &bytes)) {
                    Ok(file) => {
                        let size = bytes.len() as u64;
                        let staged = Staged {
                            name,
                            size,
                            temp,
                            target,
                        };
                        created.push((i, file, staged));
                    }
                    Err(e) => {
                        // The spares taken for the files not made go too.
                        for (_, _, _, (temp, _), _) in plans {
                            let _ = std::fs::remove_file(temp);
                        }
                        return Ok((created, Some(e)));
                    }
                }
            }
            Ok((created, None))
        })
        .await;
        self.refill_spares(refill, Kind::Gated);
        let created = match created {
            Ok((created, failed)) => {
                first_error = failed;
                created
            }
            Err(e) => return (staged, Some(e)),
        };
        if first_error.is_some() {
            // Not fsynced: the caller removes them.
            for (i, _, s) in created {
                staged[i] = Some(s);
            }
            return (staged, first_error);
        }
        let mut fsyncs = tokio::task::JoinSet::new();
        for (i, file, s) in created {
            fsyncs.spawn_blocking(move || match sync_written(&file) {
                Ok(()) => Ok((i, s)),
                Err(e) => {
                    let _ = std::fs::remove_file(&s.temp);
                    Err(MailboxError::io(&s.temp, e))
                }
            });
        }
        while let Some(joined) = fsyncs.join_next().await {
            match joined {
                Ok(Ok((i, s))) => {
                    self.inner.syncer.count_file_fsync();
                    staged[i] = Some(s);
                }
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(MailboxError::Join(e.to_string()));
                }
            }
        }
        (staged, first_error)
    }

    /// Writes several messages into `loc`, concurrently (so they share
    /// fsyncs), all or nothing: if one fails, those already written are
    /// deleted again and the first error is returned.
    pub async fn write_all(
        &self,
        loc: &Location,
        messages: &[Message],
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let (go, when) = tokio::sync::oneshot::channel();
        let _ = go.send(true);
        self.write_all_when(loc, messages, when).await
    }

    /// Like [`write_all`](Self::write_all), but the files appear in `loc`
    /// only once `when` answers `true`: they are written and fsynced
    /// meanwhile, so that whatever the caller makes durable before they may
    /// appear overlaps their fsyncs. If `when` answers `false` (or its
    /// sender is dropped), no file appears, the temporary files are
    /// removed and the answer is empty.
    pub async fn write_all_when(
        &self,
        loc: &Location,
        messages: &[Message],
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let (staged, first_error) = self.stage_all(loc, messages).await;
        let go = when.await.unwrap_or(false);
        if first_error.is_some() || !go {
            let temps: Vec<PathBuf> = staged.into_iter().flatten().map(|s| s.temp).collect();
            // Not fsynced: a temporary file a crash brings back is swept at
            // start-up.
            blocking(move || {
                for temp in temps {
                    let _ = std::fs::remove_file(temp);
                }
                Ok(())
            })
            .await?;
            return first_error.map_or(Ok(Vec::new()), Err);
        }
        let (changes, entries): (Vec<_>, Vec<_>) = staged
            .into_iter()
            .flatten()
            .map(|s| {
                let (change, settle, entry) = publish_change(self.index(loc), s);
                ((change, settle), entry)
            })
            .unzip();
        let outcomes = self.commit_all(changes).await;
        let mut first_error = None;
        let mut written = Vec::with_capacity(entries.len());
        for (entry, outcome) in entries.into_iter().zip(outcomes) {
            match outcome {
                Ok(_) => written.push(entry),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let Some(e) = first_error else {
            return Ok(written);
        };
        for entry in written {
            if let Err(undo) = self.delete(loc, &entry.name).await {
                tracing::error!(%loc, name = %entry.name, error = %undo,
                    "could not remove a message of a failed batch write");
            }
        }
        Err(e)
    }

    /// The message file names in `loc`, oldest first, without their sizes.
    /// Temporary files are skipped; foreign names are skipped with a warning.
    /// This copies the whole listing: for a count or the oldest few, see
    /// [`count`](Self::count) and [`oldest`](Self::oldest).
    pub async fn list_names(&self, loc: &Location) -> Result<Vec<FileName>, MailboxError> {
        let Some(index) = self.ready_unless_absent(loc).await? else {
            return Ok(Vec::new());
        };
        blocking(move || Ok(index.names_where(|_| true))).await
    }

    /// The message files in `loc`, oldest first, with their sizes.
    pub async fn list(&self, loc: &Location) -> Result<Vec<FileEntry>, MailboxError> {
        let index = self.ready(loc).await?;
        blocking(move || index.entries()).await
    }

    /// How many message files `loc` holds.
    pub async fn count(&self, loc: &Location) -> Result<usize, MailboxError> {
        Ok(self
            .ready_unless_absent(loc)
            .await?
            .map_or(0, |index| index.count()))
    }

    /// The names of the `n` oldest message files in `loc`, oldest first.
    pub async fn oldest(&self, loc: &Location, n: usize) -> Result<Vec<FileName>, MailboxError> {
        Ok(self
            .ready_unless_absent(loc)
            .await?
            .map_or_else(Vec::new, |index| index.oldest(n)))
    }

    /// The oldest messages in `loc` that pass `filter`, within `limits` (see
    /// [`Limits`]: a single message larger than the byte limit comes alone).
    /// Only the files looked at until the limits are reached count, so the
    /// cost does not grow with the files waiting (unless the filter passes
    /// few of them).
    pub async fn select(
        &self,
        loc: &Location,
        filter: &Filter,
        limits: Limits,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let index = self.ready(loc).await?;
        let filter = filter.clone();
        blocking(move || index.select(&filter, limits)).await
    }

    /// Reads the named files of `loc` and joins their bytes into one JSON
    /// array, in the given order, without parsing them. A file that is gone
    /// is left out (see [`RawArray::names`]); a file that does not look like
    /// a JSON object is an error rather than a broken answer.
    pub async fn read_array(
        &self,
        loc: &Location,
        names: &[FileName],
    ) -> Result<RawArray, MailboxError> {
        let dir = self.path(loc);
        let names = names.to_vec();
        let index = self.index(loc);
        blocking(move || {
            let mut json = Vec::with_capacity(2 + names.len() * 256);
            let mut included = Vec::with_capacity(names.len());
            json.push(b'[');
            for name in names {
                let path = dir.join(name.to_string());
                let mut file = match std::fs::File::open(&path) {
                    Ok(f) => f,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        // Removed by hand, or moved away meanwhile.
                        index.remove(&name);
                        continue;
                    }
                    Err(e) => return Err(MailboxError::io(&path, e)),
                };
                if !included.is_empty() {
                    json.push(b',');
                }
                let start = json.len();
                read_appending(&mut file, &mut json).map_err(|e| MailboxError::io(&path, e))?;
                if !looks_like_object(&json[start..]) {
                    return Err(MailboxError::Corrupt(path));
                }
                included.push(name);
            }
            json.push(b']');
            Ok(RawArray {
                json,
                names: included,
            })
        })
        .await
    }

    /// The file of message `id` in `loc`, if it is there. This looks
    /// through the folder's index; to look up many ids, call
    /// [`list_names`](Self::list_names) once.
    pub async fn find(
        &self,
        loc: &Location,
        id: MessageId,
    ) -> Result<Option<FileName>, MailboxError> {
        let index = self.ready(loc).await?;
        blocking(move || Ok(index.names_where(|n| n.id == id).into_iter().next())).await
    }

    /// Moves a file between folders (of the same or another mailbox)
    /// durably. Idempotent: if the file is already in `to` and not in
    /// `from`, that is [`Outcome::AlreadyDone`]; if it is in neither,
    /// [`MailboxError::NotFound`].
    pub async fn move_file(
        &self,
        name: &FileName,
        from: &Location,
        to: &Location,
    ) -> Result<Outcome, MailboxError> {
        self.commit_one(self.move_change(name, from, to)).await
    }

    /// Makes one change durable, with what its indexes learn when it is
    /// settled.
    async fn commit_one(
        &self,
        (change, settle): (Change, Settle),
    ) -> Result<Outcome, MailboxError> {
        Ok(self
            .inner
            .syncer
            .ticket()
            .submit(change, settle)
            .await?
            .into())
    }

    /// The change of a move, and what the indexes learn when it is settled
    /// (the target expects the file from now on).
    fn move_change(&self, name: &FileName, from: &Location, to: &Location) -> (Change, Settle) {
        let file = name.to_string();
        let change = Change::Move {
            from: self.path(from).join(&file),
            to: self.path(to).join(&file),
        };
        let (source, target) = (self.index(from), self.index(to));
        target.expect(name);
        let name = name.clone();
        let settle = Settle::new(move |fate| match fate {
            Fate::Durable => {
                let size = source.size_of(&name);
                source.remove(&name);
                target.settle_in(&name, Some(size));
            }
            Fate::Missing => {
                source.remove(&name);
                target.settle_in(&name, None);
            }
            Fate::Failed => target.settle_in(&name, None),
        });
        (change, settle)
    }

    /// The change of a delete, and what the index learns when it is settled.
    fn delete_change(&self, loc: &Location, name: &FileName) -> (Change, Settle) {
        let change = Change::Delete {
            path: self.path(loc).join(name.to_string()),
        };
        let (index, name) = (self.index(loc), name.clone());
        let settle = Settle::new(move |fate| {
            if fate == Fate::Durable {
                index.remove(&name);
            }
        });
        (change, settle)
    }

    /// Moves many files at once, each like [`move_file`](Self::move_file),
    /// in one group commit. Returns one outcome per move, in order; a failed
    /// move does not stop the others (repeat them: moves are idempotent).
    pub async fn move_all(
        &self,
        moves: &[(FileName, Location, Location)],
    ) -> Vec<Result<Outcome, MailboxError>> {
        let changes = moves
            .iter()
            .map(|(name, from, to)| self.move_change(name, from, to));
        self.commit_all(changes.collect()).await
    }

    /// Deletes many files of one folder at once, each like
    /// [`delete`](Self::delete), in one group commit. Returns one outcome
    /// per file, in order.
    pub async fn delete_all(
        &self,
        loc: &Location,
        names: &[FileName],
    ) -> Vec<Result<Outcome, MailboxError>> {
        let changes = names.iter().map(|name| self.delete_change(loc, name));
        self.commit_all(changes.collect()).await
    }

    /// Queues all changes before waiting for any, so they share one batch.
    async fn commit_all(
        &self,
        changes: Vec<(Change, Settle)>,
    ) -> Vec<Result<Outcome, MailboxError>> {
        // Every ticket first: the batch then waits until all are queued.
        let tickets: Vec<_> = changes.iter().map(|_| self.inner.syncer.ticket()).collect();
        let pending: Vec<_> = tickets
            .into_iter()
            .zip(changes)
            .map(|(ticket, (change, settle))| ticket.send(change, settle))
            .collect();
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            out.push(p.wait().await.map(Outcome::from));
        }
        out
    }

    /// Deletes a file durably. Idempotent: a file already gone is
    /// [`Outcome::AlreadyDone`].
    pub async fn delete(&self, loc: &Location, name: &FileName) -> Result<Outcome, MailboxError> {
        self.commit_one(self.delete_change(loc, name)).await
    }

    /// The files in `loc` that arrived before `cutoff`. Age is read from the
    /// message id (a ULID holds the server's time of arrival), not from the
    /// sender-given `created_at`, so a device with a wrong clock cannot make
    /// its messages expire early. A folder not made yet and not used has
    /// none, and is given no index (a sweep over idle mailboxes costs them
    /// no memory).
    pub async fn older_than(
        &self,
        loc: &Location,
        cutoff: Timestamp,
    ) -> Result<Vec<FileName>, MailboxError> {
        let Some(index) = self.ready_unless_absent(loc).await? else {
            return Ok(Vec::new());
        };
        blocking(move || Ok(index.names_where(|n| n.id.timestamp() < cutoff))).await
    }

    /// Deletes the files in `loc` that arrived before `cutoff`, except
    /// messages in `keep` (those a live process refers to). Returns how many
    /// were deleted.
    pub async fn remove_older_than(
        &self,
        loc: &Location,
        cutoff: Timestamp,
        keep: &HashSet<MessageId>,
    ) -> Result<usize, MailboxError> {
        let mut expired = self.older_than(loc, cutoff).await?;
        expired.retain(|name| !keep.contains(&name.id));
        let mut removed = 0;
        for outcome in self.delete_all(loc, &expired).await {
            if outcome? == Outcome::Done {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The messages that [`write_when`](Self::write_when)s into the
    /// `Messages` of `mailbox` wrote before a crash and did not publish
    /// (its earlier run's written confirmed spares, see
    /// [`CONFIRMED_SPARE_PREFIX`]), for the caller to tell which of them
    /// had their go-ahead ([`publish_written`](Self::publish_written)). A
    /// spare holding no whole message is removed. Blocking work of one look
    /// at the folder, whose findings `publish_written` takes.
    pub async fn unconfirmed_written(&self, mailbox: &Id) -> Result<Vec<Message>, MailboxError> {
        let dir = self.path(&Location::new(mailbox.clone(), Folder::Messages));
        let ours = self.inner.temp_suffix.clone();
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let found = earlier_spares(&dir, &ours, &[Kind::Confirmed, Kind::Durable])?;
            let mut written = Vec::new();
            for (_, path) in found.iter().filter(|(kind, _)| *kind == Kind::Confirmed) {
                if let Some(message) =
                    spares::read_earlier(path).map_err(|e| MailboxError::io(path, e))?
                {
                    written.push(message);
                }
            }
            inner.found_earlier(dir, found);
            Ok(written)
        })
        .await
    }

    /// Publishes the messages that writes acknowledged before a crash left
    /// in spares of the `Messages` of `mailbox`: those of confirmed spares
    /// whose ids are in `confirmed` (the others' are removed: see
    /// [`unconfirmed_written`](Self::unconfirmed_written)), and those of
    /// durable spares (see [`DURABLE_SPARE_PREFIX`]), through a scan of the
    /// folder's index if it holds an earlier run's durable spare; blocking
    /// work of one look at the folder otherwise. Run before anything moves
    /// the mailbox's messages at start-up (a database's recovery repeats
    /// the moves its processes recorded, by name).
    pub async fn publish_written(
        &self,
        mailbox: &Id,
        confirmed: &HashSet<MessageId>,
    ) -> Result<(), MailboxError> {
        let loc = Location::new(mailbox.clone(), Folder::Messages);
        let dir = self.path(&loc);
        let ours = self.inner.temp_suffix.clone();
        let confirmed = confirmed.clone();
        let inner = Arc::clone(&self.inner);
        let rescan = blocking(move || {
            let found = match inner.take_found_earlier(&dir) {
                Some(found) => found,
                None => earlier_spares(&dir, &ours, &[Kind::Confirmed, Kind::Durable])?,
            };
            let mut rescan = false;
            for (kind, path) in found {
                let io = |e| MailboxError::io(&path, e);
                if kind == Kind::Durable {
                    rescan = true;
                    continue;
                }
                match spares::read_earlier(&path).map_err(io)? {
                    Some(message) if confirmed.contains(&message.id) => {
                        spares::publish_message(&dir, &path, &message).map_err(io)?;
                        rescan = true;
                    }
                    Some(_) => spares::remove_earlier(&path).map_err(io)?,
                    None => {}
                }
            }
            Ok(rescan)
        })
        .await?;
        if rescan {
            let index = self.index(&loc);
            blocking(move || index.rescan()).await?;
        }
        Ok(())
    }

    /// Makes the renames of the messages published into `loc` so far
    /// durable: its folder fsynced (in a round shared with other callers).
    /// What [`write_when`](Self::write_when) into `Messages` asks of its
    /// caller before it forgets a go-ahead it gave. A folder that does not
    /// exist (its mailbox removed) holds nothing to settle.
    pub async fn settle(&self, loc: &Location) -> Result<(), MailboxError> {
        let dir = self.path(loc);
        let syncer = self.inner.syncer.clone();
        blocking(move || match syncer.sync_dir(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(MailboxError::io(&dir, e)),
            _ => Ok(()),
        })
        .await
    }

    /// Removes temporary files left in a mailbox's folders by writes that
    /// were interrupted by a crash (none of them was ever acknowledged):
    /// every hidden file but the temporary files of this run's writes, so
    /// that it can run while new writes go on. The durable spares of an
    /// earlier run (see [`DURABLE_SPARE_PREFIX`]) are left to a scan of
    /// their folder's index, made here, which publishes or removes each:
    /// one place decides, under the index's lock. Returns how many files
    /// were removed here.
    pub async fn sweep_temp_files(&self, mailbox: &Id) -> Result<usize, MailboxError> {
        let base = self.inner.root.join(mailbox.as_str());
        let ours = self.inner.temp_suffix.clone();
        let (removed, to_scan) = blocking(move || {
            let mut removed = 0;
            let mut to_scan = Vec::new();
            for folder in Folder::ALL {
                let dir = base.join(folder.as_str());
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(MailboxError::io(&dir, e)),
                };
                let mut touched = false;
                let mut earlier = false;
                for entry in entries {
                    let entry = entry.map_err(|e| MailboxError::io(&dir, e))?;
                    let name = entry.file_name();
                    if Kind::Durable.is_earlier(&name, &ours) {
                        earlier = true;
                        continue;
                    }
                    let name = name.as_encoded_bytes();
                    if name.starts_with(b".") && !name.ends_with(ours.as_bytes()) {
                        let path = entry.path();
                        std::fs::remove_file(&path).map_err(|e| MailboxError::io(&path, e))?;
                        removed += 1;
                        touched = true;
                    }
                }
                if touched {
                    sync::fsync_dir(&dir).map_err(|e| MailboxError::io(&dir, e))?;
                }
                if earlier {
                    to_scan.push(folder);
                }
            }
            Ok((removed, to_scan))
        })
        .await?;
        for folder in to_scan {
            let index = self.index(&Location::new(mailbox.clone(), folder));
            blocking(move || index.rescan()).await?;
        }
        Ok(removed)
    }
}

/// The spares of `kinds` an earlier run (one whose temporary suffix is not
/// `ours`) left in `dir`, with their kind; none if `dir` does not exist.
/// Blocking: one read of the folder.
fn earlier_spares(
    dir: &Path,
    ours: &str,
    kinds: &[Kind],
) -> Result<Vec<(Kind, PathBuf)>, MailboxError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(MailboxError::io(dir, e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| MailboxError::io(dir, e))?;
        let name = entry.file_name();
        if let Some(&kind) = kinds.iter().find(|k| k.is_earlier(&name, ours)) {
            found.push((kind, entry.path()));
        }
    }
    Ok(found)
}

/// The change that publishes a staged file, and what `index` (its
/// folder's) learns when it is settled: it expects the file from now on.
fn publish_change(index: Arc<FolderIndex>, staged: Staged) -> (Change, Settle, FileEntry) {
    let Staged {
        name,
        size,
        temp,
        target,
    } = staged;
    index.expect(&name);
    let settled = name.clone();
    let settle = Settle::new(move |fate| {
        index.settle_in(&settled, (fate == Fate::Durable).then_some(Some(size)));
    });
    (
        Change::Publish { temp, target },
        settle,
        FileEntry { name, size },
    )
}

/// Runs blocking filesystem work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MailboxError> + Send + 'static,
) -> Result<T, MailboxError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| MailboxError::Join(e.to_string()))?
}

/// Checks the indexes in use every `every` (or, after a long round of
/// checks, 19 times as long as it took), until the mailboxes are dropped.
async fn verify_every(inner: Weak<Inner>, every: Duration) {
    let mut pause = every;
    loop {
        tokio::time::sleep(pause).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let began = tokio::time::Instant::now();
        if let Err(e) = (Mailboxes { inner }).verify().await {
            tracing::warn!(error = %e, "checking a mailbox folder against its directory failed");
        }
        pause = every.max(began.elapsed() * 19);
    }
}

/// Runs `write` of the temporary file `temp` in `dir`, making the folder
/// and running it again if the folder does not exist yet; removes the file
/// again on any failure.
fn write_in_folder<T>(
    syncer: &Syncer,
    dir: &Path,
    temp: &Path,
    write: impl Fn() -> io::Result<T>,
) -> Result<T, MailboxError> {
    let written = match write() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            syncer.make_folder(dir).and_then(|()| write())
        }
        other => other,
    };
    written.map_err(|e| {
        let _ = std::fs::remove_file(temp);
        MailboxError::io(temp, e)
    })
}

/// Which temporary file a message is written into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Temp {
    /// A spare: made empty by this run ([`spares`]) and handed out once, so
    /// written as it is. Opened with `O_TRUNC`, an empty file would be
    /// truncated all the same (ext4 runs its truncate whatever the size),
    /// at the cost of a few percent of an upload's CPU.
    Spare,
    /// A name of the write's own, which an earlier attempt may have left:
    /// emptied first.
    Own,
}

/// The write and the fsync of a temporary file.
fn write_and_sync(temp: &Path, of: Temp, bytes: &[u8]) -> io::Result<()> {
    sync_written(&write_temp(temp, of, bytes)?)
}

/// The write of a temporary file, behind a named point where the
/// fault-injection harness crashes the server or injects a full disk.
fn write_temp(temp: &Path, of: Temp, bytes: &[u8]) -> io::Result<std::fs::File> {
    fail::fail_point!("mailbox::temp_write", |_| Err(injected_disk_full()));
    // Messages are the server's user's only, whatever the umask.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(of == Temp::Own)
        .mode(0o600)
        .open(temp)?;
    f.write_all(bytes)?;
    Ok(f)
}

/// The fsync of a written temporary file, behind a named point where the
/// fault-injection harness crashes the server or injects a full disk.
fn sync_written(f: &std::fs::File) -> io::Result<()> {
    fail::fail_point!("mailbox::temp_fsync", |_| Err(injected_disk_full()));
    f.sync_all()
}

/// What a failpoint that injects an error returns: the error of a full disk.
#[cfg(feature = "failpoints")]
fn injected_disk_full() -> io::Error {
    io::Error::from(io::ErrorKind::StorageFull)
}

/// Appends the rest of `file` to `out`. Read through a plain reader, not
/// `File`'s own `read_to_end`, which asks the file's size and position
/// first (two system calls per message a start hands out): `out` already
/// has room for a typical message.
fn read_appending(file: &mut std::fs::File, out: &mut Vec<u8>) -> io::Result<()> {
    file.take(u64::MAX).read_to_end(out).map(|_| ())
}

/// A cheap check (no parsing) that a file can be spliced into an array.
fn looks_like_object(bytes: &[u8]) -> bool {
    let trimmed = bytes.trim_ascii();
    trimmed.first() == Some(&b'{') && trimmed.last() == Some(&b'}')
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::mpsc;

    use super::*;
    use crate::wire::{Body, Version};

    pub(super) fn message(seq: u128) -> Message {
        Message {
            version: Version,
            id: MessageId::from_parts(1_000, seq),
            from: Id::new("phone-1").unwrap(),
            to: Id::new("db-a").unwrap(),
            subsystem: Id::new("sales").unwrap(),
            created_at: Timestamp::from_millis(1_000),
            body: Body::from_json("{}").unwrap(),
        }
    }

    /// Mailboxes over the folder `data` in `tmp`, with default syncing.
    async fn opened(tmp: &tempfile::TempDir) -> Mailboxes {
        Mailboxes::open(tmp.path().join("data"), SyncConfig::default())
            .await
            .unwrap()
    }

    /// A runtime of one worker thread and at most `n` blocking threads.
    fn with_blocking_threads(n: usize) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(n)
            .enable_all()
            .build()
            .unwrap()
    }

    /// `folder` of the database `db-a`.
    fn db_a(folder: Folder) -> Location {
        Location::new(Id::new("db-a").unwrap(), folder)
    }

    /// The write of `message(seq)` to `loc`, on a task of its own.
    fn spawn_write(
        mailboxes: &Mailboxes,
        loc: &Location,
        seq: u128,
    ) -> tokio::task::JoinHandle<Result<FileEntry, MailboxError>> {
        let (mailboxes, loc) = (mailboxes.clone(), loc.clone());
        tokio::spawn(async move { mailboxes.write(&loc, &message(seq)).await })
    }

    /// The names of the files in `dir`, temporary ones included but for
    /// spares not taken (empty); none if `dir` is not there.
    fn file_names(dir: &Path) -> Vec<String> {
        match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .map(|e| e.unwrap())
                .filter(|e| {
                    let len = e.metadata().map_or(1, |m| m.len());
                    !is_idle_spare(&e.file_name().to_string_lossy(), len)
                })
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Every name in `dir`, spares included, sorted.
    pub(super) fn every_name(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Starts a write that waits for a go-ahead (`start`, given the
    /// go-ahead's receiver), checks that once it has fsynced `fsyncs` files
    /// none of them is in `loc` yet, then gives it `go_ahead` and returns
    /// its answer.
    async fn answer_to_go_ahead<T: Send + 'static>(
        mailboxes: &Mailboxes,
        loc: &Location,
        fsyncs: u64,
        go_ahead: bool,
        start: impl FnOnce(
            tokio::sync::oneshot::Receiver<bool>,
        ) -> tokio::task::JoinHandle<Result<T, MailboxError>>,
    ) -> T {
        let fsynced = mailboxes.stats().file_fsyncs + fsyncs;
        let (go, when) = tokio::sync::oneshot::channel();
        let writing = start(when);
        while mailboxes.stats().file_fsyncs < fsynced {
            tokio::task::yield_now().await;
        }
        let files = file_names(&mailboxes.path(loc));
        assert!(files.iter().all(|f| f.starts_with('.')), "{files:?}");
        assert_eq!(mailboxes.count(loc).await.unwrap(), 0);
        go.send(go_ahead).unwrap();
        writing.await.unwrap().unwrap()
    }

    /// Mailboxes over the folder `data` in `tmp` whose first fsync of
    /// `held` (a folder under the data folder) tells the test it has begun
    /// and waits for its go-ahead.
    async fn holding(
        tmp: &tempfile::TempDir,
        held: &str,
    ) -> (
        Mailboxes,
        mpsc::UnboundedReceiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (reached, reached_rx) = mpsc::unbounded_channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let gate = Mutex::new(Some((reached, go_rx)));
        let data = tmp.path().join("data");
        let held = data.join(held);
        let dir_sync: DirSync = Arc::new(move |dir: &Path| {
            if dir == held {
                let first = gate.lock().unwrap().take();
                if let Some((reached, go)) = first {
                    reached.send(()).unwrap();
                    go.recv().unwrap();
                }
            }
            sync::fsync_dir(dir)
        });
        let mailboxes = Mailboxes::open_with(data, SyncConfig::default(), dir_sync)
            .await
            .unwrap();
        (mailboxes, reached_rx, go)
    }

    async fn selected(mailboxes: &Mailboxes, queue: &Location) -> usize {
        mailboxes
            .select(queue, &Filter::default(), Limits::default())
            .await
            .unwrap()
            .len()
    }

    /// Counting, listing and sweeping the folders of an idle mailbox (none
    /// made) gives them no index: idle mailboxes cost no memory.
    #[tokio::test]
    async fn looking_at_an_idle_mailbox_leaves_no_index() {
        let tmp = tempfile::tempdir().unwrap();
        let mailboxes = opened(&tmp).await;
        let id = Id::new("phone-1").unwrap();
        for folder in Folder::ALL {
            let loc = Location::new(id.clone(), folder);
            assert_eq!(mailboxes.count(&loc).await.unwrap(), 0);
            assert_eq!(mailboxes.list_names(&loc).await.unwrap(), vec![]);
            assert_eq!(mailboxes.oldest(&loc, 5).await.unwrap(), vec![]);
            let keep = HashSet::new();
            let now = Timestamp::from_millis(i64::MAX);
            assert_eq!(
                mailboxes.remove_older_than(&loc, now, &keep).await.unwrap(),
                0
            );
            assert!(!mailboxes.inner.indexes.has(&loc), "{loc}");
        }
        assert_eq!(mailboxes.sweep_temp_files(&id).await.unwrap(), 0);
    }

    /// The sweep of what crashed writes left can run beside this run's
    /// writes: their temporary files are left alone.
    #[tokio::test]
    async fn a_sweep_leaves_the_temporary_files_of_this_run_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let mailboxes = opened(&tmp).await;
        let queue = db_a(Folder::Messages);
        let dir = mailboxes.path(&queue);
        std::fs::create_dir_all(&dir).unwrap();
        let name = FileName::of(&message(1)).to_string();
        let ours = dir.join(format!(".{name}{}", mailboxes.inner.temp_suffix));
        let earlier = dir.join(format!(".{name}.x-yz.tmp"));
        std::fs::write(&ours, b"{").unwrap();
        std::fs::write(&earlier, b"{").unwrap();
        assert_eq!(mailboxes.sweep_temp_files(&queue.mailbox).await.unwrap(), 1);
        assert!(ours.exists());
        assert!(!earlier.exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_is_not_selected_before_its_folder_fsync_completes() {
        let tmp = tempfile::tempdir().unwrap();
        let (mailboxes, mut reached, go) = holding(&tmp, "db-a/Messages").await;
        let queue = db_a(Folder::Messages);
        // The index is built before the write.
        assert_eq!(selected(&mailboxes, &queue).await, 0);

        let writing = spawn_write(&mailboxes, &queue, 1);
        reached.recv().await.unwrap();
        // Renamed into the folder, its folder fsync not done: not visible,
        // not even after a check of the folder against its directory.
        let file = mailboxes
            .path(&queue)
            .join(FileName::of(&message(1)).to_string());
        assert!(file.is_file());
        assert_eq!(selected(&mailboxes, &queue).await, 0);
        assert_eq!(mailboxes.count(&queue).await.unwrap(), 0);
        assert_eq!(mailboxes.verify().await.unwrap(), 1);
        assert_eq!(selected(&mailboxes, &queue).await, 0);

        go.send(()).unwrap();
        writing.await.unwrap().unwrap();
        assert_eq!(selected(&mailboxes, &queue).await, 1);
    }

    /// Writes waiting for their go-ahead hold no blocking thread while
    /// they wait: with as many such writes as the runtime has blocking
    /// threads, a go-ahead that needs a blocking thread itself (as a key's
    /// commit does) still comes.
    #[test]
    fn writes_waiting_for_their_go_ahead_leave_the_blocking_threads_free() {
        const THREADS: usize = 2;
        with_blocking_threads(THREADS).block_on(async {
            let tmp = tempfile::tempdir().unwrap();
            let mailboxes = opened(&tmp).await;
            let queue = db_a(Folder::Messages);
            let writes: Vec<_> = (0..THREADS as u128)
                .map(|seq| {
                    let (go, when) = tokio::sync::oneshot::channel();
                    let waiting = mailboxes.clone();
                    tokio::spawn(async move {
                        // Once every write's file is fsynced, the go-ahead
                        // is made on a blocking thread.
                        while waiting.stats().file_fsyncs < THREADS as u64 {
                            tokio::task::yield_now().await;
                        }
                        let given = tokio::task::spawn_blocking(|| true).await.unwrap();
                        let _ = go.send(given);
                    });
                    let (mailboxes, queue) = (mailboxes.clone(), queue.clone());
                    tokio::spawn(
                        async move { mailboxes.write_when(&queue, &message(seq), when).await },
                    )
                })
                .collect();
            let all = async {
                for w in writes {
                    assert!(w.await.unwrap().unwrap().is_some());
                }
            };
            // Only a failure waits this long: the go-ahead never comes.
            tokio::time::timeout(Duration::from_secs(30), all)
                .await
                .expect("the writes held every blocking thread waiting for their go-ahead");
            assert_eq!(mailboxes.count(&queue).await.unwrap(), THREADS);
        });
    }

    /// A go-ahead that comes after the file is fsynced publishes it where
    /// it is awaited, when its spare's name is durable (a rename, no
    /// folder fsync): no blocking thread is needed, so the write ends while
    /// the only one is held.
    #[test]
    fn a_late_go_ahead_publishes_a_confirmed_spare_without_a_blocking_thread() {
        with_blocking_threads(1).block_on(async {
            let tmp = tempfile::tempdir().unwrap();
            let mailboxes = opened(&tmp).await;
            let queue = db_a(Folder::Messages);
            // The folder's first write makes its confirmed spares.
            let (go, when) = tokio::sync::oneshot::channel();
            go.send(true).unwrap();
            let first = mailboxes.write_when(&queue, &message(0), when).await;
            assert!(first.unwrap().is_some());
            while mailboxes.inner.confirmed_spares.refilling() {
                tokio::task::yield_now().await;
            }
            let (go, when) = tokio::sync::oneshot::channel();
            let writing = {
                let (mailboxes, queue) = (mailboxes.clone(), queue.clone());
                tokio::spawn(async move { mailboxes.write_when(&queue, &message(1), when).await })
            };
            while mailboxes.stats().file_fsyncs < 2 {
                tokio::task::yield_now().await;
            }
            // The only blocking thread, held from once the write's file is
            // fsynced (the write let it go without its go-ahead).
            let (held, holding) = tokio::sync::oneshot::channel();
            let (release, released) = std::sync::mpsc::channel::<()>();
            let holder = tokio::task::spawn_blocking(move || {
                let _ = held.send(());
                let _ = released.recv();
            });
            holding.await.unwrap();
            go.send(true).unwrap();
            // Only a failure waits this long: the publish waits for the
            // blocking thread held.
            let written = tokio::time::timeout(Duration::from_secs(30), writing)
                .await
                .expect("the publish waited for a blocking thread");
            assert!(written.unwrap().unwrap().is_some());
            release.send(()).unwrap();
            holder.await.unwrap();
            assert_eq!(mailboxes.count(&queue).await.unwrap(), 2);
        });
    }

    /// Writes that end while a fsync of their folder is under way share
    /// the next one: 64 writes, two fsyncs of their folder.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_ending_during_a_folder_fsync_share_the_next() {
        let tmp = tempfile::tempdir().unwrap();
        let (mailboxes, mut reached, go) = holding(&tmp, "db-a/Prepared").await;
        let queue = db_a(Folder::Prepared);
        // Writes that publish once allowed (allowed at once), outside
        // `Messages`: a write into a durable or confirmed spare needs no
        // folder fsync to share.
        let write = |seq| {
            let (go, when) = tokio::sync::oneshot::channel();
            let _ = go.send(true);
            let (mailboxes, loc) = (mailboxes.clone(), queue.clone());
            tokio::spawn(async move { mailboxes.write_when(&loc, &message(seq), when).await })
        };
        let first = write(0);
        reached.recv().await.unwrap();
        let before = mailboxes.stats();
        let rest: Vec<_> = (1..64).map(write).collect();
        let dir = mailboxes.path(&queue);
        while mailboxes.inner.syncer.waiting(&dir) < 63 {
            tokio::task::yield_now().await;
        }
        go.send(()).unwrap();
        first.await.unwrap().unwrap();
        for w in rest {
            w.await.unwrap().unwrap();
        }
        let after = mailboxes.stats();
        assert_eq!(after.changes - before.changes, 64);
        assert_eq!(after.file_fsyncs - before.file_fsyncs, 63);
        assert_eq!(after.dir_fsyncs - before.dir_fsyncs, 2);
        assert_eq!(after.batches - before.batches, 2);
        assert_eq!(mailboxes.count(&queue).await.unwrap(), 64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_first_use_during_a_folder_fsync_does_not_see_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (mailboxes, mut reached, go) = holding(&tmp, "db-a/Messages").await;
        let queue = db_a(Folder::Messages);
        let writing = spawn_write(&mailboxes, &queue, 1);
        reached.recv().await.unwrap();
        // The folder's first use reads the directory, file included.
        assert_eq!(selected(&mailboxes, &queue).await, 0);
        go.send(()).unwrap();
        writing.await.unwrap().unwrap();
        assert_eq!(selected(&mailboxes, &queue).await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_moved_message_appears_in_its_target_only_after_the_fsyncs() {
        let tmp = tempfile::tempdir().unwrap();
        let (mailboxes, mut reached, go) = holding(&tmp, "db-a/Log").await;
        let (queue, log) = (db_a(Folder::Messages), db_a(Folder::Log));
        let entry = mailboxes.write(&queue, &message(1)).await.unwrap();
        assert_eq!(mailboxes.count(&log).await.unwrap(), 0);
        let moving = {
            let (mailboxes, queue, log) = (mailboxes.clone(), queue.clone(), log.clone());
            tokio::spawn(async move { mailboxes.move_file(&entry.name, &queue, &log).await })
        };
        reached.recv().await.unwrap();
        assert_eq!(mailboxes.count(&log).await.unwrap(), 0);
        mailboxes.verify().await.unwrap();
        assert_eq!(mailboxes.count(&log).await.unwrap(), 0);
        go.send(()).unwrap();
        assert_eq!(moving.await.unwrap().unwrap(), Outcome::Done);
        assert_eq!(mailboxes.count(&log).await.unwrap(), 1);
        assert_eq!(mailboxes.count(&queue).await.unwrap(), 0);
    }

    /// A file written to wait for its go-ahead is fsynced before it and
    /// appears only with it; without it, it does not appear and no
    /// temporary file is left.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_waiting_for_its_go_ahead_appears_only_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mailboxes = opened(&tmp).await;
        let queue = db_a(Folder::Messages);
        for (go_ahead, seq) in [(false, 1), (true, 2)] {
            let written = answer_to_go_ahead(&mailboxes, &queue, 1, go_ahead, |when| {
                let (mailboxes, queue) = (mailboxes.clone(), queue.clone());
                tokio::spawn(async move { mailboxes.write_when(&queue, &message(seq), when).await })
            })
            .await;
            assert_left_as_told(&mailboxes, &queue, seq, go_ahead, written).await;
        }
    }

    /// What a write of `message(seq)` into `queue` (empty before), told
    /// `go_ahead`, answered (`written`) and left: its file alone, or nothing.
    async fn assert_left_as_told(
        mailboxes: &Mailboxes,
        queue: &Location,
        seq: u128,
        go_ahead: bool,
        written: Option<FileEntry>,
    ) {
        let names = file_names(&mailboxes.path(queue));
        if go_ahead {
            let name = FileName::of(&message(seq));
            assert_eq!(written.map(|e| e.name), Some(name.clone()));
            assert_eq!(
                mailboxes.oldest(queue, 10).await.unwrap(),
                vec![name.clone()]
            );
            assert_eq!(names, vec![name.to_string()]);
        } else {
            assert_eq!(written, None);
            assert!(names.is_empty(), "{names:?}");
        }
    }

    /// A go-ahead given before the file is even written is taken by the
    /// thread that wrote it: the file appears, or, refused, leaves nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_go_ahead_given_before_the_write_is_taken_when_the_file_is_fsynced() {
        let tmp = tempfile::tempdir().unwrap();
        let mailboxes = opened(&tmp).await;
        let queue = db_a(Folder::Messages);
        for (go_ahead, seq) in [(false, 1), (true, 2)] {
            let (go, when) = tokio::sync::oneshot::channel();
            go.send(go_ahead).unwrap();
            let written = mailboxes
                .write_when(&queue, &message(seq), when)
                .await
                .unwrap();
            assert_left_as_told(&mailboxes, &queue, seq, go_ahead, written).await;
        }
    }

    /// Files written to wait for a go-ahead are fsynced before it and
    /// appear only with it; without it, none appears and no temporary file
    /// is left.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_waiting_for_its_go_ahead_appears_only_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mailboxes = opened(&tmp).await;
        let prepared = db_a(Folder::Prepared);
        let files = || file_names(&mailboxes.path(&prepared));
        for (go_ahead, seqs) in [(false, [1, 2]), (true, [3, 4])] {
            let batch: Vec<Message> = seqs.into_iter().map(message).collect();
            let written = answer_to_go_ahead(&mailboxes, &prepared, 2, go_ahead, |when| {
                let (mailboxes, prepared) = (mailboxes.clone(), prepared.clone());
                tokio::spawn(async move { mailboxes.write_all_when(&prepared, &batch, when).await })
            })
            .await;
            if go_ahead {
                assert_eq!(written.len(), 2);
                assert_eq!(mailboxes.count(&prepared).await.unwrap(), 2);
                assert_eq!(files().len(), 2);
            } else {
                assert!(written.is_empty());
                assert!(files().is_empty(), "{:?}", files());
            }
        }
    }

    /// A batch into a folder not made yet makes it and writes every file
    /// whole, larger than the room a start's answer keeps for a message; a
    /// start reads them back byte for byte, leaves out one that is gone and
    /// refuses one that is not an object.
    #[tokio::test]
    async fn a_batch_into_a_new_folder_is_read_back_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let mailboxes = opened(&tmp).await;
        let queue = db_a(Folder::Messages);
        let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(20_000));
        let batch: Vec<Message> = (1..=5)
            .map(|seq| Message {
                body: Body::from_json(&big).unwrap(),
                ..message(seq)
            })
            .collect();
        let written = mailboxes.write_all(&queue, &batch).await.unwrap();
        let names: Vec<FileName> = written.iter().map(|e| e.name.clone()).collect();
        assert_eq!(names, batch.iter().map(FileName::of).collect::<Vec<_>>());
        let dir = mailboxes.path(&queue);
        std::fs::remove_file(dir.join(names[1].to_string())).unwrap();
        let raw = mailboxes.read_array(&queue, &names).await.unwrap();
        let files: Vec<Vec<u8>> = [0, 2, 3, 4]
            .iter()
            .map(|&i| batch[i].to_file_bytes().unwrap())
            .collect();
        assert_eq!(raw.json, [&b"["[..], &files.join(&b','), b"]"].concat());
        assert_eq!(raw.names, [0, 2, 3, 4].map(|i| names[i].clone()));
        std::fs::write(dir.join(names[3].to_string()), b"not an object").unwrap();
        assert!(matches!(
            mailboxes.read_array(&queue, &names).await,
            Err(MailboxError::Corrupt(_))
        ));
    }

    /// A write into a folder with spares ready takes one: the message is
    /// the spare's file, renamed; the first write into a folder finds none
    /// and makes them beside its answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_takes_a_spare_of_its_folder() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let mailboxes = opened(&tmp).await;
        let queue = db_a(Folder::Messages);
        mailboxes.write(&queue, &message(1)).await.unwrap();
        let dir = mailboxes.path(&queue);
        let spares = || -> std::collections::HashMap<u64, String> {
            std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap())
                .filter(|e| {
                    let len = e.metadata().unwrap().len();
                    is_idle_spare(&e.file_name().to_string_lossy(), len)
                })
                .map(|e| {
                    (
                        e.metadata().unwrap().ino(),
                        e.file_name().to_string_lossy().into(),
                    )
                })
                .collect()
        };
        // The refill runs on a task of its own: wait until it is done.
        while spares().len() < spares::HIGH || mailboxes.inner.durable_spares.refilling() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let before = spares();
        let synced = mailboxes.stats().dir_fsyncs;
        let written = mailboxes.write(&queue, &message(2)).await.unwrap();
        let ino = std::fs::metadata(dir.join(written.name.to_string()))
            .unwrap()
            .ino();
        let taken = before.get(&ino).expect("the message is one of the spares");
        assert!(taken.starts_with(DURABLE_SPARE_PREFIX), "{taken}");
        assert!(!dir.join(taken).exists(), "renamed, not copied");
        assert_eq!(
            mailboxes.stats().dir_fsyncs,
            synced,
            "a durable spare's name needs no folder fsync"
        );
        assert_eq!(
            std::fs::read(dir.join(written.name.to_string())).unwrap(),
            message(2).to_file_bytes().unwrap()
        );
        assert_eq!(mailboxes.oldest(&queue, 10).await.unwrap().len(), 2);
        // A clean stop leaves the messages alone, and no spare behind.
        assert!(mailboxes.remove_spares().await, "every spare removed");
        assert_eq!(
            every_name(&dir),
            [FileName::of(&message(1)), written.name].map(|n| n.to_string())
        );
    }

    /// A message written into a durable spare whose rename a crash lost
    /// (the spare, written, under its own name) is published by the next
    /// run: by the first listing of its folder, or by the sweep, whichever
    /// comes first; a spare holding half a message is removed by either.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_written_durable_spare_left_by_a_crash_is_published_by_the_next_run() {
        let tmp = tempfile::tempdir().unwrap();
        let queue = db_a(Folder::Messages);
        let dir = {
            let mailboxes = opened(&tmp).await;
            mailboxes.write(&queue, &message(1)).await.unwrap();
            // No refill left running into the next run's look.
            mailboxes.remove_spares().await;
            mailboxes.path(&queue)
        };
        let lost = |seq: u128, spare: &str| {
            let bytes = message(seq).to_file_bytes().unwrap();
            std::fs::write(dir.join(spare), bytes).unwrap();
        };
        let half = |spare: &str| {
            let bytes = message(9).to_file_bytes().unwrap();
            std::fs::write(dir.join(spare), &bytes[..bytes.len() / 2]).unwrap();
        };
        lost(2, ".durable-1.zz01.tmp");
        lost(1, ".durable-2.zz01.tmp");
        half(".durable-3.zz01.tmp");

        // A listing publishes them.
        let mailboxes = opened(&tmp).await;
        let listed: Vec<FileName> = mailboxes.oldest(&queue, 10).await.unwrap();
        assert_eq!(listed, [1, 2].map(|n| FileName::of(&message(n))));
        assert_eq!(
            every_name(&dir),
            [1, 2].map(|n| FileName::of(&message(n)).to_string())
        );
        assert_eq!(
            std::fs::read(dir.join(FileName::of(&message(2)).to_string())).unwrap(),
            message(2).to_file_bytes().unwrap()
        );

        // So does the sweep, before any listing (through a scan of the
        // folder); a spare of this run (a write under way) is left alone.
        drop(mailboxes);
        lost(3, ".durable-4.zz01.tmp");
        half(".durable-5.zz01.tmp");
        let mailboxes = opened(&tmp).await;
        let ours = format!(".durable-6{}", mailboxes.inner.temp_suffix);
        lost(4, &ours);
        // Removed by the scan, not by the sweep itself: 0.
        assert_eq!(mailboxes.sweep_temp_files(&queue.mailbox).await.unwrap(), 0);
        let mut expected: Vec<String> = [1, 2, 3]
            .map(|n| FileName::of(&message(n)).to_string())
            .into();
        expected.push(ours);
        expected.sort();
        assert_eq!(every_name(&dir), expected);
        assert_eq!(mailboxes.oldest(&queue, 10).await.unwrap().len(), 3);
    }

    /// A write into `Messages` published once allowed takes a confirmed
    /// spare, whose rename needs no folder fsync. What such writes left
    /// written at a crash is told to the next run, which publishes the
    /// ones confirmed and removes the others; no listing publishes them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_confirmed_spare_left_by_a_crash_is_published_only_if_confirmed() {
        let tmp = tempfile::tempdir().unwrap();
        let queue = db_a(Folder::Messages);
        let go = |given: bool| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            tx.send(given).unwrap();
            rx
        };
        let dir = {
            let mailboxes = opened(&tmp).await;
            mailboxes
                .write_when(&queue, &message(1), go(true))
                .await
                .unwrap();
            let dir = mailboxes.path(&queue);
            let ready = || {
                every_name(&dir)
                    .iter()
                    .filter(|n| n.starts_with(CONFIRMED_SPARE_PREFIX))
                    .count()
            };
            // The refill runs on a task of its own: wait until it is done.
            while ready() < spares::HIGH || mailboxes.inner.confirmed_spares.refilling() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let synced = mailboxes.stats().dir_fsyncs;
            let written = mailboxes.write_when(&queue, &message(2), go(true)).await;
            assert!(written.unwrap().is_some());
            assert_eq!(
                mailboxes.stats().dir_fsyncs,
                synced,
                "a confirmed spare's name needs no folder fsync"
            );
            mailboxes.settle(&queue).await.unwrap();
            assert_eq!(
                mailboxes.stats().dir_fsyncs,
                synced + 1,
                "settling the queue fsyncs its folder"
            );
            assert_eq!(ready(), spares::HIGH - 1);
            let refused = mailboxes.write_when(&queue, &message(3), go(false)).await;
            assert!(refused.unwrap().is_none());
            mailboxes.remove_spares().await;
            dir
        };
        let lost = |seq: u128, spare: &str| {
            let bytes = message(seq).to_file_bytes().unwrap();
            std::fs::write(dir.join(spare), bytes).unwrap();
        };
        lost(4, ".confirm-1.zz01.tmp");
        lost(5, ".confirm-2.zz01.tmp");
        lost(1, ".confirm-3.zz01.tmp");
        let bytes = message(9).to_file_bytes().unwrap();
        std::fs::write(dir.join(".confirm-4.zz01.tmp"), &bytes[..bytes.len() / 2]).unwrap();
        let name = |seq: u128| FileName::of(&message(seq));

        let mailboxes = opened(&tmp).await;
        assert_eq!(
            mailboxes.oldest(&queue, 10).await.unwrap(),
            [1, 2].map(name),
            "a listing publishes none"
        );
        let mut written: Vec<MessageId> = (mailboxes.unconfirmed_written(&queue.mailbox))
            .await
            .unwrap()
            .iter()
            .map(|m| m.id)
            .collect();
        written.sort();
        assert_eq!(
            written,
            [1, 4, 5].map(|n| message(n).id),
            "half a message is removed"
        );
        let confirmed = HashSet::from([message(1).id, message(4).id]);
        mailboxes
            .publish_written(&queue.mailbox, &confirmed)
            .await
            .unwrap();
        assert_eq!(every_name(&dir), [1, 2, 4].map(|n| name(n).to_string()));
        assert_eq!(
            std::fs::read(dir.join(name(4).to_string())).unwrap(),
            message(4).to_file_bytes().unwrap()
        );
        assert_eq!(
            mailboxes.oldest(&queue, 10).await.unwrap(),
            [1, 2, 4].map(name)
        );
    }

    /// A batch whose second file cannot be created fails whole: no file
    /// of it appears, no temporary file is left, and none was fsynced (the
    /// batch stops at the failure).
    #[tokio::test]
    async fn a_batch_stops_at_its_first_failed_creation_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let mailboxes = opened(&tmp).await;
        let queue = db_a(Folder::Messages);
        let batch: Vec<Message> = (1..=4).map(message).collect();
        let dir = mailboxes.path(&queue);
        std::fs::create_dir_all(&dir).unwrap();
        let squatted = format!(
            ".{}{}",
            FileName::of(&batch[1]),
            mailboxes.inner.temp_suffix
        );
        std::fs::create_dir(dir.join(&squatted)).unwrap();
        let fsyncs = mailboxes.stats().file_fsyncs;
        assert!(matches!(
            mailboxes.write_all(&queue, &batch).await,
            Err(MailboxError::Storage { path, .. }) if path == dir.join(&squatted)
        ));
        assert_eq!(file_names(&dir), vec![squatted]);
        assert_eq!(mailboxes.stats().file_fsyncs, fsyncs);
        assert_eq!(mailboxes.count(&queue).await.unwrap(), 0);
    }

    /// A batch whose second file cannot be written into its spare fails
    /// whole and gives back the spares it took for the files it did not
    /// make: after a clean stop's removal of the spares nothing of it is
    /// left but the spare that could not be opened.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_batch_leaves_none_of_the_spares_it_took() {
        let tmp = tempfile::tempdir().unwrap();
        let mailboxes = opened(&tmp).await;
        let queue = db_a(Folder::Messages);
        // A batch's write makes the spares batches take.
        let first = mailboxes.write_all(&queue, &[message(1)]).await.unwrap();
        let first = &first[0];
        let dir = mailboxes.path(&queue);
        let spare = |n: usize| format!("{SPARE_PREFIX}{n}{}", mailboxes.inner.temp_suffix);
        // The refill runs on a task of its own: wait until it is done.
        while !dir.join(spare(spares::HIGH - 1)).exists() || mailboxes.inner.spares.refilling() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Spares are taken last made first: the batch's second file would
        // go into the second last; it cannot be opened for writing.
        let unwritable = spare(spares::HIGH - 2);
        std::fs::remove_file(dir.join(&unwritable)).unwrap();
        std::fs::create_dir(dir.join(&unwritable)).unwrap();
        let batch: Vec<Message> = (2..=5).map(message).collect();
        assert!(mailboxes.write_all(&queue, &batch).await.is_err());
        mailboxes.remove_spares().await;
        assert_eq!(every_name(&dir), vec![unwritable, first.name.to_string()]);
    }
}
