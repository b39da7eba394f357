//! A mailbox folder turned into a file while the server runs, so that
//! every write into it fails, and turned back.
//!
//! The folder is moved aside whole, in one rename, rather than deleted: the
//! server makes spare files in a folder beside a write's answer, and a
//! spare made while a deletion walks the folder would make the deletion
//! fail. Moved back, the folder keeps what it held.

use std::path::{Path, PathBuf};

/// The folder `dir` made a file; [`BrokenFolder::mend`] undoes it.
pub(crate) struct BrokenFolder {
    /// The folder the server writes into.
    dir: PathBuf,
    /// Where its contents wait meanwhile, outside the data folder (the
    /// server sees nothing of them), in a folder the value owns.
    aside: tempfile::TempDir,
}

impl BrokenFolder {
    /// Makes `dir` a file, moving the folder aside if it is there (a
    /// mailbox folder is made with its first file) and making its parent
    /// if need be.
    pub(crate) fn new(dir: &Path) -> Self {
        let aside = tempfile::tempdir().unwrap();
        if dir.is_dir() {
            std::fs::rename(dir, aside.path().join("folder")).unwrap();
        }
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        std::fs::write(dir, b"not a folder").unwrap();
        BrokenFolder {
            dir: dir.to_owned(),
            aside,
        }
    }

    /// Makes `dir` a folder again, with what it held when broken.
    pub(crate) fn mend(self) {
        std::fs::remove_file(&self.dir).unwrap();
        let held = self.aside.path().join("folder");
        if held.is_dir() {
            std::fs::rename(held, &self.dir).unwrap();
        } else {
            std::fs::create_dir(&self.dir).unwrap();
        }
    }
}
