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
//! folder (hidden from listings), is fsynced, renamed to its final name, and
//! the folder is fsynced; a move is a rename plus fsyncs of both folders; a
//! delete is an unlink plus a folder fsync. The renames, unlinks and folder
//! fsyncs of concurrent callers are committed in batches by one task (see
//! [`SyncConfig`]); no call returns before its change is on disk. Moves and
//! deletes are idempotent, so an interrupted sequence of them can simply be
//! repeated after a crash.

mod folder;
mod name;
mod select;
mod sync;

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use folder::{Folder, Location};
pub use name::FileName;
pub use select::{Filter, Limits, MB};
pub use sync::{SyncConfig, SyncStats};

use crate::error::MailboxError;
use crate::id::Id;
use crate::timestamp::Timestamp;
use crate::ulid_ids::MessageId;
use crate::wire::{FileInfo, Message};
use sync::{Applied, Change, Syncer};

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

/// The mailboxes under one data folder. Cheap to clone; all clones share
/// one group-commit task, which must run on a tokio runtime.
#[derive(Clone)]
pub struct Mailboxes {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    syncer: Syncer,
}

impl Mailboxes {
    /// Opens (creating if needed) the data folder `root` and starts the
    /// group-commit task on the current runtime.
    pub async fn open(root: impl Into<PathBuf>, config: SyncConfig) -> Result<Self, MailboxError> {
        let root = root.into();
        let dir = root.clone();
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
            sync::fsync_dir(parent).map_err(|e| MailboxError::io(parent, e))
        })
        .await?;
        Ok(Self {
            inner: Arc::new(Inner {
                root,
                syncer: Syncer::start(config),
            }),
        })
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

    /// Creates the mailbox of a database or device (its five folders), durably.
    /// Creating an existing mailbox is not an error.
    pub async fn create_mailbox(&self, id: &Id) -> Result<(), MailboxError> {
        let root = self.inner.root.clone();
        let base = root.join(id.as_str());
        blocking(move || {
            create_dir(&base)?;
            for folder in Folder::ALL {
                create_dir(&base.join(folder.as_str()))?;
            }
            sync::fsync_dir(&base).map_err(|e| MailboxError::io(&base, e))?;
            sync::fsync_dir(&root).map_err(|e| MailboxError::io(&root, e))
        })
        .await
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
        let name = FileName::of(message);
        let bytes = message.to_file_bytes().map_err(MailboxError::Serialize)?;
        let size = bytes.len() as u64;
        let dir = self.path(loc);
        let final_name = name.to_string();
        let target = dir.join(&final_name);
        let temp = dir.join(format!(".{final_name}.tmp"));

        // The ticket makes the batch now forming wait for this file's fsync.
        let ticket = self.inner.syncer.ticket();
        let written = {
            let temp = temp.clone();
            blocking(move || write_synced(&temp, &bytes)).await
        };
        written?;
        self.inner.syncer.count_file_fsync();
        ticket.submit(Change::Publish { temp, target }).await?;
        Ok(FileEntry { name, size })
    }

    /// Writes several messages into `loc`, concurrently (so they share
    /// fsyncs), all or nothing: if one fails, those already written are
    /// deleted again and the first error is returned.
    pub async fn write_all(
        &self,
        loc: &Location,
        messages: &[Message],
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, m) in messages.iter().enumerate() {
            let (this, loc, m) = (self.clone(), loc.clone(), m.clone());
            tasks.spawn(async move { (i, this.write(&loc, &m).await) });
        }
        let mut written = vec![None; messages.len()];
        let mut first_error = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((i, Ok(entry))) => written[i] = Some(entry),
                Ok((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(MailboxError::Join(e.to_string()));
                }
            }
        }
        match first_error {
            None => Ok(written.into_iter().flatten().collect()),
            Some(e) => {
                for entry in written.into_iter().flatten() {
                    if let Err(undo) = self.delete(loc, &entry.name).await {
                        tracing::error!(%loc, name = %entry.name, error = %undo,
                            "could not remove a message of a failed batch write");
                    }
                }
                Err(e)
            }
        }
    }

    /// The message file names in `loc`, oldest first, without their sizes.
    /// Temporary files are skipped; foreign names are skipped with a warning.
    pub async fn list_names(&self, loc: &Location) -> Result<Vec<FileName>, MailboxError> {
        let dir = self.path(loc);
        blocking(move || read_names(&dir)).await
    }

    /// The message files in `loc`, oldest first, with their sizes.
    pub async fn list(&self, loc: &Location) -> Result<Vec<FileEntry>, MailboxError> {
        let dir = self.path(loc);
        blocking(move || {
            let names = read_names(&dir)?;
            let mut entries = Vec::with_capacity(names.len());
            for name in names {
                if let Some(size) = size_of(&dir, &name)? {
                    entries.push(FileEntry { name, size });
                }
            }
            Ok(entries)
        })
        .await
    }

    /// The oldest messages in `loc` that pass `filter`, within `limits` (see
    /// [`Limits`]: a single message larger than the byte limit comes alone).
    /// Only the files taken are looked at for their sizes.
    pub async fn select(
        &self,
        loc: &Location,
        filter: &Filter,
        limits: Limits,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let dir = self.path(loc);
        let filter = filter.clone();
        blocking(move || {
            let names = read_names(&dir)?;
            let mut stat_error = None;
            let taken = select::take_within(
                names.into_iter().filter(|n| filter.matches(n)),
                |name| match size_of(&dir, name) {
                    Ok(size) => size,
                    Err(e) => {
                        stat_error.get_or_insert(e);
                        None
                    }
                },
                limits,
            );
            match stat_error {
                Some(e) => Err(e),
                None => Ok(taken
                    .into_iter()
                    .map(|(name, size)| FileEntry { name, size })
                    .collect()),
            }
        })
        .await
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
        blocking(move || {
            let mut json = Vec::with_capacity(2 + names.len() * 256);
            let mut included = Vec::with_capacity(names.len());
            json.push(b'[');
            for name in names {
                let path = dir.join(name.to_string());
                let bytes = match read_file(&path) {
                    Ok(b) => b,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(MailboxError::io(&path, e)),
                };
                if !looks_like_object(&bytes) {
                    return Err(MailboxError::Corrupt(path));
                }
                if !included.is_empty() {
                    json.push(b',');
                }
                json.extend_from_slice(&bytes);
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

    /// The file of message `id` in `loc`, if it is there. This lists the
    /// folder; to look up many ids, call [`list_names`](Self::list_names) once.
    pub async fn find(
        &self,
        loc: &Location,
        id: MessageId,
    ) -> Result<Option<FileName>, MailboxError> {
        Ok(self.list_names(loc).await?.into_iter().find(|n| n.id == id))
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
        let file = name.to_string();
        let change = Change::Move {
            from: self.path(from).join(&file),
            to: self.path(to).join(&file),
        };
        Ok(self.inner.syncer.ticket().submit(change).await?.into())
    }

    /// Moves many files at once, each like [`move_file`](Self::move_file),
    /// in one group commit. Returns one outcome per move, in order; a failed
    /// move does not stop the others (repeat them: moves are idempotent).
    pub async fn move_all(
        &self,
        moves: &[(FileName, Location, Location)],
    ) -> Vec<Result<Outcome, MailboxError>> {
        let changes = moves.iter().map(|(name, from, to)| {
            let file = name.to_string();
            Change::Move {
                from: self.path(from).join(&file),
                to: self.path(to).join(&file),
            }
        });
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
        let dir = self.path(loc);
        let changes = names.iter().map(|name| Change::Delete {
            path: dir.join(name.to_string()),
        });
        self.commit_all(changes.collect()).await
    }

    /// Queues all changes before waiting for any, so they share one batch.
    async fn commit_all(&self, changes: Vec<Change>) -> Vec<Result<Outcome, MailboxError>> {
        // Every ticket first: the batch then waits until all are queued.
        let tickets: Vec<_> = changes.iter().map(|_| self.inner.syncer.ticket()).collect();
        let pending: Vec<_> = tickets
            .into_iter()
            .zip(changes)
            .map(|(ticket, change)| ticket.send(change))
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
        let change = Change::Delete {
            path: self.path(loc).join(name.to_string()),
        };
        Ok(self.inner.syncer.ticket().submit(change).await?.into())
    }

    /// The files in `loc` that arrived before `cutoff`. Age is read from the
    /// message id (a ULID holds the server's time of arrival), not from the
    /// sender-given `created_at`, so a device with a wrong clock cannot make
    /// its messages expire early.
    pub async fn older_than(
        &self,
        loc: &Location,
        cutoff: Timestamp,
    ) -> Result<Vec<FileName>, MailboxError> {
        let mut names = self.list_names(loc).await?;
        names.retain(|n| n.id.timestamp() < cutoff);
        Ok(names)
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

    /// Removes temporary files left in a mailbox's folders by writes that
    /// were interrupted by a crash (none of them was ever acknowledged).
    /// Meant for start-up, before any write. Returns how many were removed.
    pub async fn sweep_temp_files(&self, mailbox: &Id) -> Result<usize, MailboxError> {
        let base = self.inner.root.join(mailbox.as_str());
        blocking(move || {
            let mut removed = 0;
            for folder in Folder::ALL {
                let dir = base.join(folder.as_str());
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(MailboxError::io(&dir, e)),
                };
                let mut touched = false;
                for entry in entries {
                    let entry = entry.map_err(|e| MailboxError::io(&dir, e))?;
                    if entry.file_name().as_encoded_bytes().starts_with(b".") {
                        let path = entry.path();
                        std::fs::remove_file(&path).map_err(|e| MailboxError::io(&path, e))?;
                        removed += 1;
                        touched = true;
                    }
                }
                if touched {
                    sync::fsync_dir(&dir).map_err(|e| MailboxError::io(&dir, e))?;
                }
            }
            Ok(removed)
        })
        .await
    }
}

/// Runs blocking filesystem work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MailboxError> + Send + 'static,
) -> Result<T, MailboxError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| MailboxError::Join(e.to_string()))?
}

/// Creates a directory unless it exists.
fn create_dir(dir: &Path) -> Result<(), MailboxError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(MailboxError::io(dir, e)),
    }
}

/// Writes and fsyncs a temporary file; removes it again on any failure.
fn write_synced(temp: &Path, bytes: &[u8]) -> Result<(), MailboxError> {
    write_and_sync(temp, bytes).map_err(|e| {
        let _ = std::fs::remove_file(temp);
        MailboxError::io(temp, e)
    })
}

/// The write and the fsync of a temporary file, each behind a named point
/// where the fault-injection harness crashes the server or injects a full
/// disk.
fn write_and_sync(temp: &Path, bytes: &[u8]) -> io::Result<()> {
    fail::fail_point!("mailbox::temp_write", |_| Err(injected_disk_full()));
    // Messages are the server's user's only, whatever the umask.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(temp)?;
    f.write_all(bytes)?;
    fail::fail_point!("mailbox::temp_fsync", |_| Err(injected_disk_full()));
    f.sync_all()
}

/// What a failpoint that injects an error returns: the error of a full disk.
#[cfg(feature = "failpoints")]
fn injected_disk_full() -> io::Error {
    io::Error::from(io::ErrorKind::StorageFull)
}

/// The message file names of a directory, sorted.
fn read_names(dir: &Path) -> Result<Vec<FileName>, MailboxError> {
    let entries = std::fs::read_dir(dir).map_err(|e| MailboxError::io(dir, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| MailboxError::io(dir, e))?;
        let os_name = entry.file_name();
        let Some(text) = os_name.to_str() else {
            tracing::warn!(dir = %dir.display(), name = ?os_name, "ignoring a non-UTF-8 file name");
            continue;
        };
        if text.starts_with('.') {
            continue;
        }
        match text.parse::<FileName>() {
            Ok(name) => names.push(name),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), name = text, error = %e, "ignoring a foreign file")
            }
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// The size of a message file, or `None` if it is gone.
fn size_of(dir: &Path, name: &FileName) -> Result<Option<u64>, MailboxError> {
    let path = dir.join(name.to_string());
    match std::fs::metadata(&path) {
        Ok(m) => Ok(Some(m.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(MailboxError::io(&path, e)),
    }
}

fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A cheap check (no parsing) that a file can be spliced into an array.
fn looks_like_object(bytes: &[u8]) -> bool {
    let trimmed = bytes.trim_ascii();
    trimmed.first() == Some(&b'{') && trimmed.last() == Some(&b'}')
}
