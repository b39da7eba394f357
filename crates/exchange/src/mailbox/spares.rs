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
//! They are never made durable: only the name a write renames one to is,
//! by the folder's fsync that publishes the message.

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How a spare's name begins (then its number and the run's temporary
/// suffix): `.spare-17.k3x9.tmp`. An empty file of that name is a spare
/// not taken yet; one with content, a write into a spare under way (or cut
/// by a crash).
pub const SPARE_PREFIX: &str = ".spare-";

/// Whether a file of a mailbox folder, named `name` and `len` bytes long,
/// is a spare not taken yet: nothing was ever written into it, and it is
/// not a message nor a write under way.
pub fn is_idle_spare(name: &str, len: u64) -> bool {
    name.starts_with(SPARE_PREFIX) && len == 0
}

/// A folder with fewer spares ready than this gets more after a write.
const LOW: usize = 4;
/// How many spares a refill leaves ready in a folder: the writes into one
/// folder at once that find one.
pub(super) const HIGH: usize = 8;
/// How many folders keep spares: the busy ones (a database's queue, its
/// `Prepared`) are written first and often; the rest create their files.
const FOLDERS: usize = 64;

/// The spares of the folders written to in this run.
pub(super) struct Spares {
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
#[derive(Default)]
struct Stock {
    ready: Vec<PathBuf>,
    refilling: bool,
}

impl Spares {
    /// No spares yet; their names end with `suffix`.
    pub(super) fn new(suffix: String) -> Self {
        Spares {
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
        self.folders().get_mut(dir)?.ready.pop()
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
        if stock.refilling || stock.ready.len() >= LOW {
            return false;
        }
        stock.refilling = true;
        true
    }

    /// Makes spares in `dir` until [`HIGH`] are ready, after
    /// [`claim_refill`](Self::claim_refill) answered `true`; blocking.
    /// Stops at the first failure (the folder removed meanwhile, a full
    /// disk): writes then create their own files.
    pub(super) fn refill(&self, dir: &Path) {
        loop {
            let wanted = self
                .folders()
                .get(dir)
                .map_or(0, |s| HIGH.saturating_sub(s.ready.len()));
            if wanted == 0 {
                break;
            }
            let number = self.made.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("{SPARE_PREFIX}{number}{}", self.suffix));
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path);
            if let Err(e) = made {
                tracing::debug!(folder = %dir.display(), error = %e, "making a spare file failed");
                break;
            }
            let mut folders = self.folders();
            match folders.get_mut(dir) {
                Some(stock) if !self.closed.load(Ordering::Relaxed) => stock.ready.push(path),
                // Forgotten meanwhile (its mailbox is being removed), or
                // the store closed.
                _ => {
                    let _ = std::fs::remove_file(&path);
                    break;
                }
            }
        }
        if let Some(stock) = self.folders().get_mut(dir) {
            stock.refilling = false;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mailbox::tests::every_name;

    #[test]
    fn a_folder_running_low_is_refilled_once_at_a_time_and_its_spares_taken_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let spares = Spares::new(".ab12.tmp".into());
        assert_eq!(spares.take(dir), None, "none before a refill");
        assert!(spares.claim_refill(dir));
        assert!(!spares.claim_refill(dir), "one refill at a time");
        spares.refill(dir);
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

    #[test]
    fn a_closed_store_hands_over_its_spares_and_makes_no_more() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let spares = Spares::new(".ab12.tmp".into());
        assert!(spares.claim_refill(dir));
        spares.refill(dir);
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
        let spares = Spares::new(".ab12.tmp".into());
        let gone = tmp.path().join("db-a").join("Messages");
        assert!(spares.claim_refill(&gone));
        spares.refill(&gone);
        assert_eq!(spares.take(&gone), None, "no folder, no spares");
        assert!(!gone.exists(), "a refill makes no folder");

        let dir = tmp.path().join("db-b");
        std::fs::create_dir(&dir).unwrap();
        assert!(spares.claim_refill(&dir));
        spares.refill(&dir);
        spares.forget_under(tmp.path());
        assert_eq!(spares.take(&dir), None);
        assert!(spares.claim_refill(&dir), "forgotten: a fresh start");
    }
}
