//! Online backup of the embedded store: a copy of the whole data folder
//! (every redb file and file of `.estafeta/`, every mailbox folder and
//! message file) taken while the server serves, in a state a crash could
//! have left, so that `estafeta serve --data-dir DIR` on the copy serves the
//! same tenancy, waiting messages and processes after its start-up recovery.
//!
//! `estafeta backup DIR` asks the running server (`POST /v1/admin/backup`):
//! the server pauses every durable write ([`Exchange::pause_writes`]: the
//! writes under way end, new ones wait; reads go on), checks `DIR`
//! (absolute, outside the data folder, new or an empty folder whose parent
//! exists and is writable) before it changes anything, copies, and
//! resumes. Message files are never changed in place (written once, then
//! renamed or removed), so on the data folder's file system they are hard
//! links (no extra space, a fraction of the pause); on another file system
//! they are copied. Everything written is made durable (one `syncfs`) after
//! the pause, before the answer. A failure removes what was made.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::{ErrorCode, Version};
use estafeta_exchange::{DataLayout, Exchange, ExchangeError};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::events::EventLogStore;

/// The body of `POST /v1/admin/backup`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BackupRequest {
    /// Always 1.
    #[schema(value_type = u32)]
    pub version: Version,
    /// Where to make the copy, as an absolute path on the server's host: a
    /// new folder (its parent must exist) or an empty one, outside the data
    /// folder.
    #[schema(value_type = String)]
    pub dir: PathBuf,
}

/// What a backup copied.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BackupReport {
    /// Always 1.
    #[schema(value_type = u32)]
    pub version: Version,
    /// The copy.
    #[schema(value_type = String)]
    pub dir: PathBuf,
    /// Files in the copy.
    pub files: u64,
    /// Message files hard-linked (the copy is on the data folder's file
    /// system).
    pub linked: u64,
    /// Files copied (state files, and message files on another file system).
    pub copied: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// How long writes were held back, in seconds.
    pub paused_seconds: f64,
}

/// Why a backup was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The caller is not the admin, or the server is not ready.
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    /// The folder is given as a relative path.
    #[error("the backup folder must be an absolute path, not {0}")]
    NotAbsolute(PathBuf),
    /// The folder is inside the data folder.
    #[error("the backup folder {dir} is inside the data folder {data}; choose one outside it")]
    InsideData {
        /// The backup folder.
        dir: PathBuf,
        /// The data folder.
        data: PathBuf,
    },
    /// The folder exists and holds something.
    #[error("{0} exists and is not an empty folder; give a new or empty folder")]
    NotEmpty(PathBuf),
    /// The folder cannot be made or written.
    #[error("cannot write the backup folder {dir}: {source}")]
    Unwritable {
        /// The backup folder.
        dir: PathBuf,
        /// The file system's answer.
        source: io::Error,
    },
    /// Copying failed half-way (what was made is removed).
    #[error("copying {from} failed: {source}")]
    Copy {
        /// The file or folder being copied.
        from: PathBuf,
        /// The file system's answer.
        source: io::Error,
    },
    /// The copying task ended without finishing (a panic).
    #[error("the backup did not complete: {0}")]
    Interrupted(String),
}

impl From<BackupError> for ApiError {
    fn from(e: BackupError) -> Self {
        let (status, code) = match e {
            BackupError::Exchange(e) => return e.into(),
            BackupError::NotAbsolute(_)
            | BackupError::InsideData { .. }
            | BackupError::Unwritable { .. } => (StatusCode::BAD_REQUEST, ErrorCode::BadPath),
            BackupError::NotEmpty(_) => (StatusCode::CONFLICT, ErrorCode::NotEmpty),
            BackupError::Copy { .. } | BackupError::Interrupted(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal)
            }
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// Copies the data folder of `exchange` into `dir` while it serves (see
/// the module's doc); `who` must be the admin.
pub async fn backup(
    exchange: &Exchange,
    events: &Arc<dyn EventLogStore>,
    who: &Principal,
    dir: &Path,
) -> Result<BackupReport, BackupError> {
    let data = exchange.data_dir().to_path_buf();
    // The pause comes first: it is where the caller is found to be the
    // admin, before anything is made.
    let paused = exchange.pause_writes(who).await?;
    let started = Instant::now();
    let target = {
        let (data, dir) = (data.clone(), dir.to_path_buf());
        blocking(move || prepare(&data, &dir)).await?
    };
    let copied = {
        let (data, target, events) = (data.clone(), target.clone(), events.clone());
        blocking(move || copy_data(&data, &target.dir, events.as_ref())).await
    };
    let paused_seconds = started.elapsed().as_secs_f64();
    drop(paused);
    let finished = match copied {
        Ok(counts) => {
            let dir = target.dir.clone();
            blocking(move || sync(&dir).map(|()| counts)).await
        }
        Err(e) => Err(e),
    };
    match finished {
        Ok(counts) => {
            tracing::info!(
                target: "estafeta::event",
                dir = %target.dir.display(), files = counts.files, paused_seconds,
                "backup made"
            );
            Ok(BackupReport {
                version: Version,
                dir: target.dir,
                files: counts.files,
                linked: counts.linked,
                copied: counts.copied,
                bytes: counts.bytes,
                paused_seconds,
            })
        }
        Err(e) => {
            blocking(move || {
                target.undo();
                Ok(())
            })
            .await?;
            Err(e)
        }
    }
}

/// The backup folder, made or found empty.
#[derive(Clone)]
struct Target {
    dir: PathBuf,
    /// Whether the backup made it (else it was an empty folder).
    made: bool,
}

impl Target {
    /// Removes what the backup wrote.
    fn undo(&self) {
        let removed = if self.made {
            std::fs::remove_dir_all(&self.dir)
        } else {
            std::fs::read_dir(&self.dir).and_then(|entries| {
                entries.into_iter().try_for_each(|entry| {
                    let path = entry?.path();
                    if path.is_dir() {
                        std::fs::remove_dir_all(path)
                    } else {
                        std::fs::remove_file(path)
                    }
                })
            })
        };
        if let Err(e) = removed {
            tracing::warn!(dir = %self.dir.display(), error = %e, "removing a failed backup");
        }
    }
}

/// Checks `dir` and makes it if it does not exist; nothing is changed when
/// it is refused.
fn prepare(data: &Path, dir: &Path) -> Result<Target, BackupError> {
    if !dir.is_absolute() {
        return Err(BackupError::NotAbsolute(dir.to_path_buf()));
    }
    let unwritable = |source| BackupError::Unwritable {
        dir: dir.to_path_buf(),
        source,
    };
    let data = data.canonicalize().map_err(|source| BackupError::Copy {
        from: data.to_path_buf(),
        source,
    })?;
    let parent = dir.parent().unwrap_or(dir);
    let resolved = parent
        .canonicalize()
        .map_err(unwritable)?
        .join(dir.file_name().unwrap_or_default());
    if resolved.starts_with(&data) {
        return Err(BackupError::InsideData {
            dir: dir.to_path_buf(),
            data,
        });
    }
    match std::fs::metadata(dir) {
        Ok(found) if found.is_dir() => {
            let mut entries = std::fs::read_dir(dir).map_err(unwritable)?;
            if entries.next().is_some() {
                return Err(BackupError::NotEmpty(dir.to_path_buf()));
            }
            // An empty folder: the first write into it tells whether it can
            // be written, and leaves nothing behind.
            let probe = dir.join(".estafeta-backup-probe");
            std::fs::create_dir(&probe)
                .and_then(|()| std::fs::remove_dir(&probe))
                .map_err(unwritable)?;
            Ok(Target {
                dir: dir.to_path_buf(),
                made: false,
            })
        }
        Ok(_) => Err(BackupError::NotEmpty(dir.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir(dir).map_err(unwritable)?;
            Ok(Target {
                dir: dir.to_path_buf(),
                made: true,
            })
        }
        Err(e) => Err(unwritable(e)),
    }
}

/// What [`copy_data`] did.
#[derive(Clone, Copy, Default)]
struct Counts {
    files: u64,
    linked: u64,
    copied: u64,
    bytes: u64,
}

/// Copies the data folder `data` into `to` (which exists): folders with
/// their permissions, state files copied, message files hard-linked when
/// `to` is on the same file system and copied otherwise. A file gone
/// between listing and copying (an event log rotated away) is left out.
/// The event log's writer (`events`), which [`Exchange::pause_writes`]
/// does not hold back, waits while its file is copied.
fn copy_data(data: &Path, to: &Path, events: &dyn EventLogStore) -> Result<Counts, BackupError> {
    let layout = DataLayout::new(data);
    let state = layout.state_dir();
    let events_file = layout.events();
    let mut counts = Counts::default();
    let mut link = true;
    let mut folders = vec![(data.to_path_buf(), to.to_path_buf())];
    while let Some((from, into)) = folders.pop() {
        let failed = |source| BackupError::Copy {
            from: from.clone(),
            source,
        };
        for entry in std::fs::read_dir(&from).map_err(failed)? {
            let entry = entry.map_err(failed)?;
            let (source, target) = (entry.path(), into.join(entry.file_name()));
            let failed = |e| BackupError::Copy {
                from: source.clone(),
                source: e,
            };
            let kind = entry.file_type().map_err(failed)?;
            if kind.is_dir() {
                std::fs::create_dir(&target).map_err(failed)?;
                let permissions = entry.metadata().map_err(failed)?.permissions();
                std::fs::set_permissions(&target, permissions).map_err(failed)?;
                folders.push((source, target));
                continue;
            }
            // Not copied: what is not a regular file, and the hidden files
            // of mailbox folders (writes under way, spares made ahead of
            // writes), never acknowledged and removed at the restored
            // copy's start anyway.
            let hidden = entry.file_name().as_encoded_bytes().starts_with(b".");
            if !kind.is_file() || (hidden && !source.starts_with(&state)) {
                continue;
            }
            if link && !source.starts_with(&state) {
                match std::fs::hard_link(&source, &target) {
                    Ok(()) => {
                        counts.files += 1;
                        counts.linked += 1;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::CrossesDevices => link = false,
                    Err(e) => return Err(failed(e)),
                }
            }
            let _held = (source == events_file)
                .then(|| events.hold_writes())
                .flatten();
            match std::fs::copy(&source, &target) {
                Ok(bytes) => {
                    counts.files += 1;
                    counts.copied += 1;
                    counts.bytes += bytes;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed(e)),
            }
        }
    }
    Ok(counts)
}

/// Makes everything written under `dir`, and `dir`'s own entry, durable.
fn sync(dir: &Path) -> Result<(), BackupError> {
    let failed = |source| BackupError::Copy {
        from: dir.to_path_buf(),
        source,
    };
    let folder = std::fs::File::open(dir).map_err(failed)?;
    rustix::fs::syncfs(&folder).map_err(|e| failed(e.into()))?;
    estafeta_durable::sync_parent(dir).map_err(failed)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackupError> + Send + 'static,
) -> Result<T, BackupError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BackupError::Interrupted(e.to_string()))?
}
