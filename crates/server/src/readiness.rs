//! [`Readiness`]: whether storage takes writes now, for `/readyz`. Checked
//! on each call, so that `/readyz` is 503 while storage cannot take writes
//! and 200 again as soon as it can.
//!
//! Writable means what the server's own writes need:
//! - the node's state folder (`<data>/.estafeta/`, which the embedded store
//!   keeps everything under, and where a cluster node keeps its folder):
//!   its file system has room, and a new file there takes one block;
//! - in a cluster, also the database: a durable commit of one update
//!   ([`estafeta_postgres::Store::takes_writes`]) within [`DATABASE_WAIT`],
//!   which fails on a standby, on a database set read-only, on one out of
//!   reach and on one that cannot write its write-ahead log.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::notify::disk::free_bytes;

/// The longest `/readyz` waits for the database's commit; a commit that
/// takes longer (a synchronous standby gone) counts as not writable.
pub const DATABASE_WAIT: Duration = Duration::from_secs(2);

/// What `/readyz` checks; see the module documentation.
#[derive(Clone)]
pub struct Readiness {
    /// The node's state folder, probed with a file.
    state_dir: PathBuf,
    /// In a cluster, the database, probed with a commit.
    database: Option<estafeta_postgres::Store>,
}

/// Why storage does not take writes.
#[derive(Debug, thiserror::Error)]
pub enum NotWritable {
    /// The state folder's file system is full or refuses a write.
    #[error("the data folder does not take writes: {0}")]
    Folder(#[from] std::io::Error),
    /// The cluster's database refused the write, or failed.
    #[error("the database does not take writes: {0}")]
    Database(#[from] estafeta_postgres::Error),
    /// The cluster's database did not commit within [`DATABASE_WAIT`].
    #[error("the database did not commit a write within {DATABASE_WAIT:?}")]
    DatabaseSlow,
}

impl Readiness {
    /// Checks `state_dir`, and in a cluster `database` too.
    pub fn new(state_dir: PathBuf, database: Option<estafeta_postgres::Store>) -> Readiness {
        Readiness {
            state_dir,
            database,
        }
    }

    /// `Ok` when storage takes writes now.
    pub async fn check(&self) -> Result<(), NotWritable> {
        let dir = self.state_dir.clone();
        tokio::task::spawn_blocking(move || folder_takes_writes(&dir))
            .await
            .map_err(std::io::Error::other)??;
        if let Some(db) = &self.database {
            tokio::time::timeout(DATABASE_WAIT, db.takes_writes())
                .await
                .map_err(|_| NotWritable::DatabaseSlow)??;
        }
        Ok(())
    }
}

/// Whether `dir` takes a write: its file system has room, and a new file
/// there takes one block (removed again). Not synced: a full or read-only
/// file system refuses the create or the write itself.
fn folder_takes_writes(dir: &Path) -> std::io::Result<()> {
    if free_bytes(dir)? == 0 {
        return Err(std::io::ErrorKind::StorageFull.into());
    }
    let mut probe = tempfile::Builder::new()
        .prefix(".ready-probe")
        .tempfile_in(dir)?;
    probe.write_all(&[0u8; 4096])?;
    probe.close()
}
