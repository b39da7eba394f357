//! Group commit of directory operations: the renames, removals and
//! directory fsyncs that make file writes, moves and deletes durable.
//!
//! Every mailbox change ends with "rename or unlink, then fsync the
//! directory". One fsync per change would cap the server at the disk's fsync
//! rate, so changes are funnelled through one task that takes them in
//! batches: it applies each change of a batch, fsyncs every touched directory
//! once (in parallel), and only then answers every caller.
//!
//! A batch closes when no other change is under way (every caller that holds
//! a [`Ticket`] has submitted or given up), when it is full, or when the
//! linger time since its first change has passed. Callers take a ticket
//! before their slow part (writing and fsyncing a file), so concurrent writes
//! that started together are committed together instead of one by one.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::error::MailboxError;

/// Tuning of the group commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncConfig {
    /// The most changes in one batch.
    pub max_batch: usize,
    /// How long a batch may wait for changes that are still under way
    /// (a file being written) before it is committed without them.
    pub linger: Duration,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            max_batch: 512,
            linger: Duration::from_millis(2),
        }
    }
}

/// Counters of the group commit, for `/metrics` and for tests that check
/// that concurrent changes really share fsyncs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Changes committed (publishes, moves, deletes).
    pub changes: u64,
    /// Batches committed.
    pub batches: u64,
    /// Directory fsyncs made.
    pub dir_fsyncs: u64,
    /// File fsyncs made (by writers, before their changes were submitted).
    pub file_fsyncs: u64,
}

/// One filesystem change applied by the commit task.
#[derive(Debug)]
pub(crate) enum Change {
    /// Rename a written and fsynced temporary file to its final name.
    Publish {
        /// The temporary file.
        temp: PathBuf,
        /// The final name, in the same directory.
        target: PathBuf,
    },
    /// Rename a file into another folder; done if it is already there.
    Move {
        /// Where the file is.
        from: PathBuf,
        /// Where it goes.
        to: PathBuf,
    },
    /// Remove a file; done if it is already gone.
    Delete {
        /// The file.
        path: PathBuf,
    },
}

/// What a change found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// The change was made now.
    Done,
    /// The change had already been made (the source was gone, the target there).
    AlreadyDone,
}

/// A change waiting in a batch, with the caller waiting for its outcome.
struct Job {
    change: Change,
    reply: oneshot::Sender<Result<Applied, MailboxError>>,
}

/// State shared by the handles and the commit task.
#[derive(Default)]
struct Shared {
    /// Tickets taken and not yet submitted or dropped.
    in_flight: AtomicUsize,
    /// Wakes the commit task when a ticket is submitted or dropped.
    progress: Notify,
    changes: AtomicU64,
    batches: AtomicU64,
    dir_fsyncs: AtomicU64,
    file_fsyncs: AtomicU64,
}

/// The handle to the commit task; cheap to clone.
#[derive(Clone)]
pub(crate) struct Syncer {
    tx: mpsc::UnboundedSender<Job>,
    shared: Arc<Shared>,
}

impl Syncer {
    /// Starts the commit task on the current tokio runtime. It ends when the
    /// last handle is dropped.
    pub(crate) fn start(config: SyncConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        tokio::spawn(run(rx, Arc::clone(&shared), config));
        Self { tx, shared }
    }

    /// Announces a change that will be submitted soon, so that the batch
    /// being formed waits for it (up to the linger time).
    pub(crate) fn ticket(&self) -> Ticket {
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        Ticket {
            syncer: self.clone(),
            live: true,
        }
    }

    /// Counts a file fsync made by a writer.
    pub(crate) fn count_file_fsync(&self) {
        self.shared.file_fsyncs.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters so far.
    pub(crate) fn stats(&self) -> SyncStats {
        let s = &self.shared;
        SyncStats {
            changes: s.changes.load(Ordering::Relaxed),
            batches: s.batches.load(Ordering::Relaxed),
            dir_fsyncs: s.dir_fsyncs.load(Ordering::Relaxed),
            file_fsyncs: s.file_fsyncs.load(Ordering::Relaxed),
        }
    }
}

/// A promise to submit one change; dropping it unsubmitted withdraws the
/// promise (the writer failed), so no batch waits for it.
pub(crate) struct Ticket {
    syncer: Syncer,
    live: bool,
}

impl Ticket {
    /// Submits the change and waits until it is applied and its directories
    /// are fsynced.
    pub(crate) async fn submit(self, change: Change) -> Result<Applied, MailboxError> {
        self.send(change).wait().await
    }

    /// Queues the change without waiting, so that a caller with many
    /// changes can queue them all into one batch and then wait for each.
    pub(crate) fn send(mut self, change: Change) -> Pending {
        let (reply, answer) = oneshot::channel();
        let sent = self.syncer.tx.send(Job { change, reply });
        self.release();
        Pending(sent.ok().map(|()| answer))
    }

    fn release(&mut self) {
        if std::mem::take(&mut self.live) {
            self.syncer.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.syncer.shared.progress.notify_one();
        }
    }
}

/// A queued change whose outcome has not been awaited yet.
pub(crate) struct Pending(Option<oneshot::Receiver<Result<Applied, MailboxError>>>);

impl Pending {
    /// Waits until the change is applied and its directories are fsynced.
    pub(crate) async fn wait(self) -> Result<Applied, MailboxError> {
        let answer = self.0.ok_or(MailboxError::SyncStopped)?;
        answer.await.map_err(|_| MailboxError::SyncStopped)?
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.release();
    }
}

/// The commit task: forms batches and commits them, one at a time.
async fn run(mut rx: mpsc::UnboundedReceiver<Job>, shared: Arc<Shared>, config: SyncConfig) {
    let max_batch = config.max_batch.max(1);
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = Instant::now() + config.linger;
        loop {
            drain(&mut rx, &mut batch, max_batch);
            if batch.len() >= max_batch {
                break;
            }
            if shared.in_flight.load(Ordering::SeqCst) == 0 {
                // Whoever released the last ticket sent its job first.
                drain(&mut rx, &mut batch, max_batch);
                break;
            }
            tokio::select! {
                () = shared.progress.notified() => {}
                () = tokio::time::sleep_until(deadline) => {
                    drain(&mut rx, &mut batch, max_batch);
                    break;
                }
            }
        }
        commit(batch, &shared).await;
    }
}

/// Moves every job already queued into the batch, up to its limit.
fn drain(rx: &mut mpsc::UnboundedReceiver<Job>, batch: &mut Vec<Job>, max_batch: usize) {
    while batch.len() < max_batch {
        match rx.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
}

/// Applies the batch's changes, fsyncs each touched directory once, answers.
async fn commit(batch: Vec<Job>, shared: &Shared) {
    let (jobs, replies): (Vec<Change>, Vec<_>) =
        batch.into_iter().map(|j| (j.change, j.reply)).unzip();
    let applied = match tokio::task::spawn_blocking(move || {
        let results: Vec<_> = jobs.iter().map(apply).collect();
        (jobs, results)
    })
    .await
    {
        Ok(done) => done,
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(MailboxError::Join(e.to_string())));
            }
            return;
        }
    };
    let (jobs, results) = applied;

    // Every directory any change touched, failed ones included: a failed
    // publish removed its temporary file, and that removal is made durable too.
    let dirs: BTreeSet<PathBuf> = jobs.iter().flat_map(dirs_of).collect();
    let mut fsyncs = JoinSet::new();
    for dir in dirs {
        fsyncs.spawn_blocking(move || {
            let r = fsync_dir(&dir);
            (dir, r)
        });
    }
    let mut failed_dirs: Vec<(PathBuf, io::Error)> = Vec::new();
    let mut lost_task = None;
    while let Some(joined) = fsyncs.join_next().await {
        match joined {
            Ok((_, Ok(()))) => {
                shared.dir_fsyncs.fetch_add(1, Ordering::Relaxed);
            }
            Ok((dir, Err(e))) => failed_dirs.push((dir, e)),
            Err(e) => lost_task = Some(e.to_string()),
        }
    }
    // Durable, but no caller knows yet: a crash here must lose nothing.
    fail::fail_point!("mailbox::synced");
    shared.batches.fetch_add(1, Ordering::Relaxed);
    shared
        .changes
        .fetch_add(jobs.len() as u64, Ordering::Relaxed);

    for ((change, result), reply) in jobs.into_iter().zip(results).zip(replies) {
        let answer = result.and_then(|applied| {
            if let Some(e) = &lost_task {
                undo_unsynced(&change);
                return Err(MailboxError::Join(e.clone()));
            }
            let touched = dirs_of(&change);
            match failed_dirs.iter().find(|(dir, _)| touched.contains(dir)) {
                None => Ok(applied),
                Some((dir, e)) => {
                    undo_unsynced(&change);
                    Err(MailboxError::io(
                        dir,
                        io::Error::new(e.kind(), e.to_string()),
                    ))
                }
            }
        });
        let _ = reply.send(answer);
    }
}

/// After a failed directory fsync, a published file is not known to be
/// durable; it is removed so that the caller's error ("not stored") is the
/// whole truth. Moves and deletes are left as they are: they are idempotent
/// and the caller retries them.
fn undo_unsynced(change: &Change) {
    if let Change::Publish { target, .. } = change {
        let _ = std::fs::remove_file(target);
    }
}

/// Applies one change (blocking).
fn apply(change: &Change) -> Result<Applied, MailboxError> {
    match change {
        Change::Publish { temp, target } => match rename(temp, target) {
            Ok(()) => Ok(Applied::Done),
            Err(e) => {
                let _ = std::fs::remove_file(temp);
                Err(MailboxError::io(target, e))
            }
        },
        Change::Move { from, to } => match rename(from, to) {
            Ok(()) => Ok(Applied::Done),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // ENOENT is also what a missing target folder gives, so look
                // at both ends before calling the move done or lost.
                if exists(from) {
                    Err(MailboxError::io(to, e))
                } else if exists(to) {
                    Ok(Applied::AlreadyDone)
                } else {
                    Err(MailboxError::NotFound {
                        name: file_name(from),
                        from: parent(from).to_owned(),
                        to: parent(to).to_owned(),
                    })
                }
            }
            Err(e) => Err(MailboxError::io(from, e)),
        },
        Change::Delete { path } => match unlink(path) {
            Ok(()) => Ok(Applied::Done),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Applied::AlreadyDone),
            Err(e) => Err(MailboxError::io(path, e)),
        },
    }
}

/// The directories whose entries a change alters.
fn dirs_of(change: &Change) -> Vec<PathBuf> {
    match change {
        Change::Publish { target, .. } => vec![parent(target).to_owned()],
        Change::Move { from, to } => vec![parent(from).to_owned(), parent(to).to_owned()],
        Change::Delete { path } => vec![parent(path).to_owned()],
    }
}

fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// A change's rename, behind a named point where the fault-injection
/// harness crashes the server or injects a full disk.
fn rename(from: &Path, to: &Path) -> io::Result<()> {
    fail::fail_point!("mailbox::rename", |_| Err(super::injected_disk_full()));
    std::fs::rename(from, to)
}

/// A change's unlink, behind a named point like [`rename`].
fn unlink(path: &Path) -> io::Result<()> {
    fail::fail_point!("mailbox::unlink", |_| Err(super::injected_disk_full()));
    std::fs::remove_file(path)
}

/// Makes a directory's entries durable (blocking).
pub(crate) fn fsync_dir(dir: &Path) -> io::Result<()> {
    fail::fail_point!("mailbox::dir_fsync", |_| Err(super::injected_disk_full()));
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_flight(s: &Syncer) -> usize {
        s.shared.in_flight.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn tickets_are_released_by_submit_and_by_drop() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start(SyncConfig::default());
        let ticket = syncer.ticket();
        assert_eq!(in_flight(&syncer), 1);
        drop(ticket);
        assert_eq!(in_flight(&syncer), 0);

        let gone = dir.path().join("gone");
        let applied = syncer
            .ticket()
            .submit(Change::Delete { path: gone })
            .await
            .unwrap();
        assert_eq!(applied, Applied::AlreadyDone);
        assert_eq!(in_flight(&syncer), 0);
        let stats = syncer.stats();
        assert_eq!((stats.changes, stats.batches, stats.dir_fsyncs), (1, 1, 1));
    }

    #[tokio::test]
    async fn a_batch_does_not_wait_past_the_linger_for_a_silent_ticket() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start(SyncConfig {
            max_batch: 8,
            linger: Duration::from_millis(1),
        });
        let silent = syncer.ticket();
        let applied = syncer
            .ticket()
            .submit(Change::Delete {
                path: dir.path().join("x"),
            })
            .await
            .unwrap();
        assert_eq!(applied, Applied::AlreadyDone);
        assert_eq!(in_flight(&syncer), 1);
        drop(silent);
    }

    #[tokio::test]
    async fn a_failed_directory_fsync_fails_its_changes() {
        // A path whose parent is a file: the rename fails, and so would the fsync.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        let syncer = Syncer::start(SyncConfig::default());
        let temp = dir.path().join(".t.tmp");
        std::fs::write(&temp, b"{}").unwrap();
        let err = syncer
            .ticket()
            .submit(Change::Publish {
                temp: temp.clone(),
                target: file.join("m.msg"),
            })
            .await
            .unwrap_err();
        assert!(matches!(err, MailboxError::Storage { .. }), "{err}");
        assert!(!temp.exists(), "the temporary file is removed");
    }
}
