//! Durable file-system steps shared by every crate that keeps a file of
//! its own: making a folder's entries durable, creating folders that
//! survive a power loss, and creating a redb file so that a power loss
//! never leaves it half made. A [`WriteGate`] lets an online backup hold
//! back the durable writes of the stores opened with it.
//!
//! A file's contents become durable at its fsync; its entry in a folder (a
//! create, a rename) only at an fsync of that folder. redb syncs a new
//! file's contents, and writes its header between two syncs, so a power
//! loss during a first start could leave a file that redb refuses to open
//! ("magic number mismatch") and the server could never start again.
//! [`open_redb`] makes a new database under a temporary name, lets the
//! caller create its tables durably there, and only then renames it into
//! place and fsyncs the folder: after a power loss the file is either
//! absent (made again at the next start) or whole.
//!
//! # Example
//!
//! ```
//! use redb::TableDefinition;
//!
//! const ITEMS: TableDefinition<'_, &str, u64> = TableDefinition::new("items");
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("state.redb");
//! let db = estafeta_durable::open_redb(&path, |db| {
//!     let txn = db.begin_write()?;
//!     txn.open_table(ITEMS)?;
//!     txn.commit()?;
//!     Ok(())
//! })?;
//! assert!(path.exists());
//! # drop(db);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod gate;
pub mod limits;

pub use gate::{Closed, Passing, WriteGate};

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use redb::Database;

/// Makes the entries of `dir` (files created, renamed or removed in it)
/// durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Makes everything written to the file system that holds `dir` durable
/// (`syncfs`): every file's data and every folder's entries, whoever
/// wrote them. For a clean stop, when what was left to the page cache
/// must be on disk before a marker says so.
pub fn sync_file_system(dir: &Path) -> io::Result<()> {
    let folder = std::fs::File::open(dir)?;
    rustix::fs::syncfs(&folder).map_err(io::Error::from)
}

/// Makes `path`'s entry in its folder durable.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    sync_dir(parent(path))
}

/// Creates `dir` and every missing parent with `mode`, and makes each
/// new folder's entry durable in its parent before returning (whoever
/// creates a folder first makes it durable: a later caller finds it
/// present and creates nothing).
pub fn create_dir_all(dir: &Path, mode: u32) -> io::Result<()> {
    create_dir_all_with(dir, mode, &mut sync_dir)
}

/// [`create_dir_all`] with the folder fsync given.
fn create_dir_all_with(
    dir: &Path,
    mode: u32,
    sync: &mut dyn FnMut(&Path) -> io::Result<()>,
) -> io::Result<()> {
    let mut new = Vec::new();
    let mut up = Some(dir);
    while let Some(folder) = up.filter(|f| !f.as_os_str().is_empty()) {
        if folder.try_exists()? {
            break;
        }
        new.push(folder);
        up = folder.parent();
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    // Outermost first: each parent's own entry is durable before its
    // child's.
    for folder in new.iter().rev() {
        sync(parent(folder))?;
    }
    Ok(())
}

/// The folder that holds `path` (`.` for a bare file name).
pub fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Opens the redb database at `path`, creating it if it does not exist,
/// and runs `init` on it (create the tables; `init` must commit durably).
///
/// A new database is made as `<path>.new`, initialized there, renamed to
/// `path`, and the folder fsynced before this returns, so the file is
/// never seen half made. A `<path>.new` left by a crash is removed first.
pub fn open_redb(
    path: &Path,
    init: impl FnOnce(&Database) -> Result<(), redb::Error>,
) -> Result<Database, redb::Error> {
    if path.try_exists()? {
        let db = Database::create(path)?;
        init(&db)?;
        return Ok(db);
    }
    let temp = temp_path(path);
    match std::fs::remove_file(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    {
        let db = Database::create(&temp)?;
        init(&db)?;
    }
    std::fs::rename(&temp, path)?;
    sync_parent(path)?;
    Ok(Database::create(path)?)
}

/// Where [`open_redb`] makes a new database before it is whole.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(OsString::from)
        .unwrap_or_else(|| OsString::from("db"));
    name.push(".new");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, TableDefinition};

    const T: TableDefinition<'_, &str, u64> = TableDefinition::new("t");

    fn init(db: &Database) -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        txn.open_table(T)?.insert("k", 1)?;
        txn.commit()?;
        Ok(())
    }

    /// Creates `dir`; the folders fsynced meanwhile, in order.
    fn synced_while_creating(dir: &Path) -> Vec<PathBuf> {
        let mut synced = Vec::new();
        create_dir_all_with(dir, 0o700, &mut |d| {
            synced.push(d.to_path_buf());
            Ok(())
        })
        .unwrap();
        synced
    }

    #[test]
    fn new_folders_are_made_durable_in_their_parents_once() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let dir = data.join(".estafeta").join("events");
        assert_eq!(
            synced_while_creating(&dir),
            [
                tmp.path().to_path_buf(),
                data.clone(),
                data.join(".estafeta")
            ]
        );
        assert!(dir.is_dir());
        assert_eq!(synced_while_creating(&dir), Vec::<PathBuf>::new());
    }

    #[test]
    fn a_half_made_file_from_a_crash_does_not_stop_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        // What a power loss between redb's two syncs leaves: a file without
        // redb's header, under the temporary name.
        std::fs::write(temp_path(&path), vec![0u8; 4096]).unwrap();
        let db = open_redb(&path, init).unwrap();
        let txn = db.begin_read().unwrap();
        assert_eq!(
            txn.open_table(T)
                .unwrap()
                .get("k")
                .unwrap()
                .unwrap()
                .value(),
            1
        );
        assert!(!temp_path(&path).exists());
    }

    #[test]
    fn an_existing_database_is_opened_and_initialized_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        drop(open_redb(&path, init).unwrap());
        let mut calls = 0;
        let db = open_redb(&path, |db| {
            calls += 1;
            init(db)
        })
        .unwrap();
        assert_eq!(calls, 1);
        drop(db);
        assert!(!temp_path(&path).exists());
    }

    #[test]
    fn a_failed_init_leaves_no_file_under_the_final_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let err = open_redb(&path, |_| Err(io::Error::other("disk full").into()));
        assert!(err.is_err());
        assert!(!path.exists(), "only a whole file gets the final name");
    }
}
