//! Empty temporary files made ahead of the writes into a folder.
//!
//! Creating a file is the costliest single step of a write on ext4 (the
//! allocation of its inode, under the folder's lock). A write takes a spare
//! of its folder if one is ready, writes into it and renames it to the
//! message's name, as it would a temporary file of its own; after a write,
//! a blocking task makes new spares for the folder when it runs low, beside
//! the answer rather than before it. A write that finds none creates its own
//! file, as without spares.
//!
//! Spares are hidden and end with the run's temporary suffix, so listings
//! never see them and the start-up sweep removes those of an earlier run.
//! They come in three [`Kind`]s:
//! - **gated** spares ([`SPARE_PREFIX`]) serve the writes that may appear
//!   only once the caller says so into folders other than `Messages` (a
//!   batch of replies once its process commits). They are never made
//!   durable: a write is, by the folder's fsync that publishes it, and a
//!   crash before that leaves a spare that is swept;
//! - **durable** spares ([`DURABLE_SPARE_PREFIX`]) serve the writes into a
//!   `Messages` folder that appear at once (uploads, deliveries). Their
//!   names are made durable (one folder fsync for a refill) before they
//!   are handed out, so a message written into one is durable once the
//!   file is fsynced: its rename to the message's name needs no folder
//!   fsync before the answer. A crash that loses the rename leaves the
//!   written spare, and the next run publishes it ([`publish_earlier`])
//!   when it first lists the folder (a database's queue before its
//!   recovery repeats any move; the sweep lists the others), exactly as
//!   the rename would have; a spare holding no whole message (a write a
//!   crash cut, never answered) is removed. So is one whose message a
//!   folder of its mailbox holds: a move of the message out of the folder
//!   (a process's) fsyncs the folder before it is answered, which makes
//!   the rename durable, so a spare left beside such a move is a move the
//!   crash cut, and the recovery that finishes the move must not find the
//!   message back in the folder;
//! - **confirmed** spares ([`CONFIRMED_SPARE_PREFIX`]) serve the writes
//!   into a `Messages` folder that may appear only once the caller says so
//!   (a keyed upload, once its key is saved). Their names are durable as
//!   the durable spares' are, so the rename needs no folder fsync either;
//!   but a crash may leave a written spare whose go-ahead was never given,
//!   so the next run publishes one only if its caller confirms that the
//!   go-ahead was given (and durably so), and removes it otherwise.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{FileName, Folder};
use crate::wire::Message;

/// How a gated spare's name begins (then its number and the run's
/// temporary suffix): `.spare-17.k3x9.tmp`. An empty file of that name is a
/// spare not taken yet; one with content, a write under way (or cut by a
/// crash), never a message.
pub const SPARE_PREFIX: &str = ".spare-";

/// How a durable spare's name begins: `.durable-17.k3x9.tmp`. An empty file
/// of that name is a spare not taken yet; one with a whole message in it
/// that an earlier run left, a message whose rename a crash lost.
pub const DURABLE_SPARE_PREFIX: &str = ".durable-";

/// How a confirmed spare's name begins: `.confirm-17.k3x9.tmp`. An empty
/// file of that name is a spare not taken yet; one with a whole message in
/// it that an earlier run left, a message that appears only if its go-ahead
/// is confirmed.
pub const CONFIRMED_SPARE_PREFIX: &str = ".confirm-";

/// Whether a file of a mailbox folder, named `name` and `len` bytes long,
/// is a spare not taken yet: nothing was ever written into it, and it is
/// not a message nor a write under way.
pub fn is_idle_spare(name: &str, len: u64) -> bool {
    Kind::ALL.iter().any(|k| name.starts_with(k.prefix())) && len == 0
}

/// Publishes what an earlier run wrote into the durable spare `path` of
/// the mailbox folder `dir`: the message it holds ([`read_earlier`]),
/// published by [`publish_message`]. Blocking; called by a scan of the
/// folder's index only, under its lock, so one caller decides.
pub(super) fn publish_earlier(dir: &Path, path: &Path) -> io::Result<Option<String>> {
    match read_earlier(path)? {
        Some(message) => publish_message(dir, path, &message),
        None => Ok(None),
    }
}

/// The message an earlier run wrote into the spare `path`. A spare holding
/// no whole message (empty, or a write a crash cut) is removed, and so is
/// gone (as is one removed meanwhile, by hand: no error): `None`.
pub(super) fn read_earlier(path: &Path) -> io::Result<Option<Message>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) => return gone(e),
    };
    match serde_json::from_slice::<Message>(&bytes) {
        Ok(message) => Ok(Some(message)),
        Err(_) => std::fs::remove_file(path).map(|()| None).or_else(gone),
    }
}

/// Publishes `message`, which an earlier run wrote into the spare `path`
/// of the mailbox folder `dir`, under the message's own name, and answers
/// that name. The spare is removed instead if a folder of the mailbox
/// holds a file of that name: `dir` (the rename was durable after all; the
/// answer is the name all the same) or another (a move of the message out
/// of `dir` was under way; the answer is `None`). The rename is not
/// fsynced: if a crash loses it, the next run publishes the spare again.
pub(super) fn publish_message(
    dir: &Path,
    path: &Path,
    message: &Message,
) -> io::Result<Option<String>> {
    let name = FileName::of(message).to_string();
    let target = dir.join(&name);
    let there = |folder: &Path| std::fs::symlink_metadata(folder.join(&name)).is_ok();
    if there(dir) {
        return std::fs::remove_file(path)
            .map(|()| Some(name))
            .or_else(gone);
    }
    let mailbox = dir.parent().unwrap_or(dir);
    if Folder::ALL.iter().any(|f| there(&mailbox.join(f.as_str()))) {
        return std::fs::remove_file(path).map(|()| None).or_else(gone);
    }
    match std::fs::rename(path, &target) {
        Ok(()) => {
            tracing::info!(file = %target.display(), "a message written before a crash published");
            Ok(Some(name))
        }
        Err(e) => gone(e),
    }
}

/// Removes an earlier run's spare `path` whose message is not to appear
/// (its go-ahead not confirmed); one gone meanwhile is no error.
pub(super) fn remove_earlier(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A spare found gone (removed by hand) is no error: nothing to publish.
fn gone<T>(e: io::Error) -> io::Result<Option<T>> {
    if e.kind() == io::ErrorKind::NotFound {
        Ok(None)
    } else {
        Err(e)
    }
}

/// Which writes a folder's spares serve: see the module's overview.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// For writes published by their folder's fsync, once allowed.
    Gated,
    /// For writes published at once; made durable before handed out.
    Durable,
    /// For writes into a `Messages` folder published once allowed; made
    /// durable before handed out, an earlier run's published only if
    /// confirmed.
    Confirmed,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Gated, Kind::Durable, Kind::Confirmed];

    fn prefix(self) -> &'static str {
        match self {
            Kind::Gated => SPARE_PREFIX,
            Kind::Durable => DURABLE_SPARE_PREFIX,
            Kind::Confirmed => CONFIRMED_SPARE_PREFIX,
        }
    }

    /// Whether the spares' names are made durable before they are handed
    /// out, so that a write into one needs no folder fsync.
    pub(super) fn durable(self) -> bool {
        self != Kind::Gated
    }

    /// Whether `name` is a spare of this kind made by an earlier run (its
    /// name does not end with this run's suffix `ours`).
    pub(super) fn is_earlier(self, name: &OsStr, ours: &str) -> bool {
        let name = name.as_encoded_bytes();
        name.starts_with(self.prefix().as_bytes()) && !name.ends_with(ours.as_bytes())
    }
}

/// How many spares a refill leaves ready in a folder at first; a folder
/// with fewer than half its number ready gets more after a write.
pub(super) const HIGH: usize = 8;
/// The most spares a refill leaves ready in a folder. A folder whose
/// writes find none ready after a refill gets twice as many at its next
/// refill, up to this: the writes into it at once outrun its refills, and
/// each that finds none makes a file of its own, whose name needs a
/// folder fsync before its answer.
const MOST: usize = 64;
/// How many folders keep spares: the busy ones (a database's queue, its
/// `Prepared`) are written first and often; the rest create their files.
const FOLDERS: usize = 64;

/// The spares of the folders written to in this run.
pub(super) struct Spares {
    /// What the spares are for, and so how they are named and made.
    kind: Kind,
    /// The run's temporary suffix (`.<run>.tmp`), which every spare's name ends with.
    suffix: String,
    /// Spares made so far: the next one's number.
    made: AtomicU64,
    /// Set at a clean stop: no more refills.
    closed: AtomicBool,
    /// Each folder's spares ready to be taken, and whether a refill of it
    /// is under way.
    folders: Mutex<HashMap<PathBuf, Stock>>,
}

/// One folder's spares.
struct Stock {
    ready: Vec<PathBuf>,
    refilling: bool,
    /// How many a refill leaves ready: [`HIGH`], doubled up to [`MOST`]
    /// after each refill that left too few.
    want: usize,
    /// Whether a refill has left spares ready yet: before, a write that
    /// finds none is no sign of too few.
    filled: bool,
    /// Whether a write found none ready since the last refill began.
    short: bool,
}

impl Default for Stock {
    fn default() -> Self {
        Stock {
            ready: Vec::new(),
            refilling: false,
            want: HIGH,
            filled: false,
            short: false,
        }
    }
}

impl Spares {
    /// No spares of `kind` yet; their names end with `suffix`.
    pub(super) fn new(kind: Kind, suffix: String) -> Self {
        Spares {
            kind,
            suffix,
            made: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            folders: Mutex::new(HashMap::new()),
        }
    }

    fn folders(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Stock>> {
        // The map is consistent after every statement: a panic elsewhere
        // while it was held leaves nothing half done.
        self.folders.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A spare of `dir` to write into, if one is ready; it is the caller's
    /// from now on.
    pub(super) fn take(&self, dir: &Path) -> Option<PathBuf> {
        let mut folders = self.folders();
        let stock = folders.get_mut(dir)?;
        let spare = stock.ready.pop();
        if spare.is_none() && stock.filled {
            stock.short = true;
        }
        spare
    }

    /// Whether the caller is to [`refill`](Self::refill) `dir` now: it
    /// runs low, no refill of it is under way (this one is marked under
    /// way), it is one of the folders that keep spares, and the store is
    /// not closed.
    pub(super) fn claim_refill(&self, dir: &Path) -> bool {
        let mut folders = self.folders();
        let full = !folders.contains_key(dir) && folders.len() >= FOLDERS;
        if full || self.closed.load(Ordering::Relaxed) {
            return false;
        }
        let stock = folders.entry(dir.to_path_buf()).or_default();
        if stock.refilling || stock.ready.len() >= stock.want / 2 {
            return false;
        }
        stock.refilling = true;
        true
    }

    /// Makes spares in `dir` until as many are ready as it wants ([`HIGH`]
    /// at first, twice as many as the last time if a write found none
    /// since, up to [`MOST`]), after [`claim_refill`](Self::claim_refill)
    /// answered `true`; blocking.
    /// Durable spares are handed out only once `sync_dir` made their names
    /// durable. Stops at the first failure (the folder removed meanwhile, a
    /// full disk): writes then create their own files.
    pub(super) fn refill(&self, dir: &Path, sync_dir: &dyn Fn(&Path) -> io::Result<()>) {
        let wanted = self.folders().get_mut(dir).map_or(0, |stock| {
            if std::mem::take(&mut stock.short) {
                stock.want = (stock.want * 2).min(MOST);
            }
            stock.want.saturating_sub(stock.ready.len())
        });
        let mut made = Vec::with_capacity(wanted);
        for _ in 0..wanted {
            let number = self.made.fetch_add(1, Ordering::Relaxed);
            let prefix = self.kind.prefix();
            let path = dir.join(format!("{prefix}{number}{}", self.suffix));
            let created = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path);
            match created {
                Ok(_) => made.push(path),
                Err(e) => {
                    tracing::debug!(folder = %dir.display(), error = %e, "making a spare file failed");
                    break;
                }
            }
        }
        if self.kind.durable()
            && !made.is_empty()
            && let Err(e) = sync_dir(dir)
        {
            tracing::debug!(folder = %dir.display(), error = %e, "making spare files durable failed");
            remove_all(&made);
            made.clear();
        }
        let mut folders = self.folders();
        match folders.get_mut(dir) {
            Some(stock) if !self.closed.load(Ordering::Relaxed) => {
                stock.filled |= !made.is_empty();
                stock.ready.append(&mut made);
                stock.refilling = false;
            }
            // Forgotten meanwhile (its mailbox is being removed), or the
            // store closed.
            other => {
                if let Some(stock) = other {
                    stock.refilling = false;
                }
                drop(folders);
                remove_all(&made);
            }
        }
    }

    /// The spares ready in every folder, for the caller to remove (a clean
    /// stop); from now on no refill adds any.
    pub(super) fn close(&self) -> Vec<PathBuf> {
        let mut folders = self.folders();
        self.closed.store(true, Ordering::Relaxed);
        folders
            .values_mut()
            .flat_map(|stock| std::mem::take(&mut stock.ready))
            .collect()
    }

    /// Whether a refill is under way (after [`close`](Self::close), one
    /// that removes what it makes).
    pub(super) fn refilling(&self) -> bool {
        self.folders().values().any(|stock| stock.refilling)
    }

    /// Forgets the spares of the folders under `base`, a mailbox about to
    /// be removed whole: no write takes them, and no refill adds to them.
    pub(super) fn forget_under(&self, base: &Path) {
        self.folders().retain(|dir, _| !dir.starts_with(base));
    }
}

/// Removes the spares `made` (their removal not made durable: a spare a
/// crash brings back is empty, and swept).
fn remove_all(made: &[PathBuf]) {
    for path in made {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mailbox::tests::every_name;
    use std::sync::atomic::AtomicUsize;

    /// The folder fsync of gated spares: never called.
    fn unused(dir: &Path) -> io::Result<()> {
        panic!("gated spares are not made durable: {}", dir.display())
    }

    #[test]
    fn a_folder_running_low_is_refilled_once_at_a_time_and_its_spares_taken_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let spares = Spares::new(Kind::Gated, ".ab12.tmp".into());
        assert_eq!(spares.take(dir), None, "none before a refill");
        assert!(spares.claim_refill(dir));
        assert!(!spares.claim_refill(dir), "one refill at a time");
        spares.refill(dir, &unused);
        let made = every_name(dir);
        assert_eq!(made.len(), HIGH);
        assert!(
            made.iter()
                .all(|n| n.starts_with(SPARE_PREFIX) && n.ends_with(".ab12.tmp")),
            "{made:?}"
        );
        assert!(!spares.claim_refill(dir), "not low");
        let mut taken = Vec::new();
        while let Some(path) = spares.take(dir) {
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
            taken.push(path);
        }
        taken.sort();
        taken.dedup();
        assert_eq!(taken.len(), HIGH, "each spare taken once");
        assert!(spares.claim_refill(dir), "low again");
    }

    /// Takes every spare ready in `dir`: how many there were.
    fn take_all(spares: &Spares, dir: &Path) -> usize {
        std::iter::from_fn(|| spares.take(dir)).count()
    }

    #[test]
    fn a_folder_whose_writes_find_none_ready_gets_twice_as_many_up_to_the_most() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let spares = Spares::new(Kind::Gated, ".ab12.tmp".into());
        // Before the first refill is done, finding none is no sign.
        assert!(spares.claim_refill(dir));
        assert_eq!(spares.take(dir), None);
        spares.refill(dir, &unused);
        assert_eq!(take_all(&spares, dir), HIGH);
        // Each refill after writes that found none leaves twice as many.
        for want in [2 * HIGH, 4 * HIGH, MOST, MOST] {
            assert_eq!(spares.take(dir), None);
            assert!(spares.claim_refill(dir));
            spares.refill(dir, &unused);
            assert_eq!(take_all(&spares, dir), want);
        }
    }

    #[test]
    fn a_folder_whose_writes_always_find_one_keeps_its_number() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let spares = Spares::new(Kind::Gated, ".ab12.tmp".into());
        assert!(spares.claim_refill(dir));
        spares.refill(dir, &unused);
        for _ in 0..3 {
            for _ in 0..=HIGH / 2 {
                assert!(spares.take(dir).is_some());
            }
            assert!(spares.claim_refill(dir), "fewer than half ready");
            spares.refill(dir, &unused);
        }
        assert_eq!(take_all(&spares, dir), HIGH);
    }

    #[test]
    fn a_closed_store_hands_over_its_spares_and_makes_no_more() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let spares = Spares::new(Kind::Gated, ".ab12.tmp".into());
        assert!(spares.claim_refill(dir));
        spares.refill(dir, &unused);
        let mut handed = spares.close();
        handed.sort();
        let mut made: Vec<PathBuf> = every_name(dir).iter().map(|n| dir.join(n)).collect();
        made.sort();
        assert_eq!(handed, made);
        assert_eq!(spares.take(dir), None);
        assert!(!spares.claim_refill(dir));
    }

    #[test]
    fn a_forgotten_or_missing_folder_gets_no_spares() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = Spares::new(Kind::Gated, ".ab12.tmp".into());
        let gone = tmp.path().join("db-a").join("Messages");
        assert!(spares.claim_refill(&gone));
        spares.refill(&gone, &unused);
        assert_eq!(spares.take(&gone), None, "no folder, no spares");
        assert!(!gone.exists(), "a refill makes no folder");

        let dir = tmp.path().join("db-b");
        std::fs::create_dir(&dir).unwrap();
        assert!(spares.claim_refill(&dir));
        spares.refill(&dir, &unused);
        spares.forget_under(tmp.path());
        assert_eq!(spares.take(&dir), None);
        assert!(spares.claim_refill(&dir), "forgotten: a fresh start");
    }

    #[test]
    fn durable_spares_are_handed_out_only_once_their_folder_is_fsynced() {
        for kind in [Kind::Durable, Kind::Confirmed] {
            durable_refill(kind);
        }
    }

    /// A refill of `kind` (durable names) fsyncs its folder once, before
    /// handing any out; a failed fsync hands out none.
    fn durable_refill(kind: Kind) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let spares = Spares::new(kind, ".ab12.tmp".into());
        let syncs = AtomicUsize::new(0);
        let sync = |d: &Path| {
            assert_eq!(d, dir);
            // Every spare exists when its folder is fsynced.
            assert_eq!(every_name(d).len(), HIGH);
            syncs.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        assert!(spares.claim_refill(dir));
        spares.refill(dir, &sync);
        assert_eq!(syncs.load(Ordering::Relaxed), 1, "one fsync for the refill");
        let made = every_name(dir);
        assert!(
            made.iter()
                .all(|n| n.starts_with(kind.prefix()) && n.ends_with(".ab12.tmp")),
            "{made:?}"
        );
        assert!(spares.take(dir).is_some());

        // A failed fsync hands out none, and leaves none behind.
        let other = tmp.path().join("db-b");
        std::fs::create_dir(&other).unwrap();
        assert!(spares.claim_refill(&other));
        spares.refill(&other, &|_| Err(io::Error::other("injected")));
        assert_eq!(spares.take(&other), None);
        assert!(every_name(&other).is_empty());
        assert!(spares.claim_refill(&other), "no refill left under way");
    }

    #[test]
    fn an_earlier_runs_durable_spare_is_published_or_removed() {
        use crate::mailbox::tests::message;
        let tmp = tempfile::tempdir().unwrap();
        let queue = tmp.path().join("db-a").join("Messages");
        let log = tmp.path().join("db-a").join("Log");
        std::fs::create_dir_all(&queue).unwrap();
        std::fs::create_dir_all(&log).unwrap();
        let bytes = message(1).to_file_bytes().unwrap();
        let name = FileName::of(&message(1)).to_string();
        let spare = |n: u32| queue.join(format!("{DURABLE_SPARE_PREFIX}{n}.zz99.tmp"));
        let earlier = |name: &str| Kind::Durable.is_earlier(name.as_ref(), ".ab12.tmp");
        assert!(earlier(".durable-3.zz99.tmp"));
        assert!(!earlier(".durable-3.ab12.tmp"));
        assert!(!earlier(".spare-3.zz99.tmp"));
        assert!(!earlier(".confirm-3.zz99.tmp"));
        assert!(Kind::Confirmed.is_earlier(".confirm-3.zz99.tmp".as_ref(), ".ab12.tmp"));

        // A whole message: published under its name, bytes as written.
        std::fs::write(spare(1), &bytes).unwrap();
        assert_eq!(
            publish_earlier(&queue, &spare(1)).unwrap(),
            Some(name.clone())
        );
        assert_eq!(every_name(&queue), vec![name.clone()]);
        assert_eq!(std::fs::read(queue.join(&name)).unwrap(), bytes);

        // The same message again (its rename was durable after all): the
        // spare goes, the file stays.
        std::fs::write(spare(2), &bytes).unwrap();
        assert_eq!(
            publish_earlier(&queue, &spare(2)).unwrap(),
            Some(name.clone())
        );
        assert_eq!(every_name(&queue), vec![name.clone()]);

        // A message another folder of the mailbox holds (its move out of
        // the folder, cut by the crash): the spare goes, nothing appears.
        let moved = FileName::of(&message(2)).to_string();
        std::fs::write(log.join(&moved), b"moved").unwrap();
        std::fs::write(spare(3), message(2).to_file_bytes().unwrap()).unwrap();
        assert_eq!(publish_earlier(&queue, &spare(3)).unwrap(), None);
        assert_eq!(every_name(&queue), vec![name.clone()]);
        assert_eq!(every_name(&log), vec![moved]);

        // A write a crash cut, an idle spare: removed, nothing published.
        std::fs::write(spare(4), &bytes[..bytes.len() / 2]).unwrap();
        std::fs::write(spare(5), b"").unwrap();
        assert_eq!(publish_earlier(&queue, &spare(4)).unwrap(), None);
        assert_eq!(publish_earlier(&queue, &spare(5)).unwrap(), None);
        assert_eq!(every_name(&queue), vec![name]);

        // Gone meanwhile: no error.
        assert_eq!(publish_earlier(&queue, &spare(6)).unwrap(), None);
    }
}
