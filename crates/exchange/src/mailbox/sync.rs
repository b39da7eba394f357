//! Group commit of directory operations: the renames, removals and
//! directory fsyncs that make file writes, moves and deletes durable.
//!
//! Every mailbox change ends with "rename or unlink, then fsync the
//! directory". One fsync per change would cap the server at the disk's fsync
//! rate, so every directory fsync is shared with whoever needs one of the
//! same folder at the same time ([`Rounds`]). A single write is published on
//! the thread that wrote its file ([`Syncer::apply_now`]); moves, deletes
//! and writes of several files are funnelled through one task that takes
//! them in batches: it applies each change of a batch, fsyncs every touched
//! directory once (in parallel), and only then answers every caller.
//!
//! A batch closes when no other change is under way (every caller that holds
//! a [`Ticket`] has submitted or given up), when it is full, or when the
//! linger time since its first change has passed. Callers take a ticket
//! before their slow part (writing and fsyncing files), so concurrent
//! changes that started together are committed together instead of one by
//! one.
//!
//! Each change carries a [`Settle`]: what the folder indexes learn of its
//! fate. It runs after the directory fsyncs (so an index never shows a file
//! whose entry is not yet durable) and before the caller is answered; it runs
//! even if the caller has gone away, or, with [`Fate::Failed`], if the change
//! is dropped unapplied.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::rounds::{Rounds, Synced};
use crate::error::MailboxError;

/// Tuning of the group commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncConfig {
    /// The most changes in one batch.
    pub max_batch: usize,
    /// How long a batch may wait for changes that are still under way
    /// (a file being written) before it is committed without them.
    pub linger: Duration,
    /// How often the index of a folder in use is checked against its
    /// directory, so that files added or removed by hand are seen. A check
    /// of a large folder waits longer: at least 19 times as long as the
    /// previous round of checks took, so checking costs at most 5% of a core.
    pub verify_every: Duration,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            max_batch: 512,
            linger: Duration::from_millis(2),
            verify_every: Duration::from_secs(10),
        }
    }
}

/// Counters of the group commit, for `/metrics` and for tests that check
/// that concurrent changes really share fsyncs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Changes committed (publishes, moves, deletes).
    pub changes: u64,
    /// Batches committed: the commit task's, and each folder fsync a
    /// single write made for itself and whoever joined it.
    pub batches: u64,
    /// Directory fsyncs made (a folder made for its first file included).
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

/// What became of a change, as the folder indexes need to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Applied (now or before) and its directories fsynced.
    Durable,
    /// A move whose file is in neither of its folders.
    Missing,
    /// Not applied, not known to be durable, or withdrawn again.
    Failed,
}

/// What to do once a change's fate is known: the index updates of the
/// change. Dropped without being told, it is told [`Fate::Failed`].
pub(crate) struct Settle(Option<Box<dyn FnOnce(Fate) + Send>>);

impl Settle {
    /// Calls `f` with the fate of the change.
    pub(crate) fn new(f: impl FnOnce(Fate) + Send + 'static) -> Self {
        Self(Some(Box::new(f)))
    }

    fn tell(mut self, fate: Fate) {
        if let Some(f) = self.0.take() {
            f(fate);
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(Fate::Failed);
        }
    }
}

/// What a change applied with [`Syncer::apply_now`] still needs to be
/// durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entries {
    /// The folder fsyncs of the folders it changes.
    Unsynced,
    /// Nothing more: the entry it renames is durable, and so is the data.
    Durable,
}

/// How a directory's entries are made durable: [`fsync_dir`], or in unit
/// tests a stand-in that fails or waits.
pub(crate) type DirSync = Arc<dyn Fn(&Path) -> io::Result<()> + Send + Sync>;

/// A change waiting in a batch, with the caller waiting for its outcome.
struct Job {
    change: Change,
    settle: Settle,
    reply: oneshot::Sender<Result<Applied, MailboxError>>,
}

/// State shared by the handles and the commit task.
struct Shared {
    /// Makes a directory's entries durable.
    dir_sync: DirSync,
    /// Every folder fsync goes through these, so that whoever needs one
    /// at the same time shares it.
    rounds: Rounds,
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
    /// Starts the commit task on the current tokio runtime, making
    /// directories durable with `dir_sync`. It ends when the last handle is
    /// dropped.
    pub(crate) fn start(config: SyncConfig, dir_sync: DirSync) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            dir_sync,
            rounds: Rounds::default(),
            in_flight: AtomicUsize::new(0),
            progress: Notify::new(),
            changes: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            dir_fsyncs: AtomicU64::new(0),
            file_fsyncs: AtomicU64::new(0),
        });
        tokio::spawn(run(rx, Arc::clone(&shared), config));
        Self { tx, shared }
    }

    /// Applies `change` on the calling thread (blocking), as a batch
    /// would but without handing it to the commit task: the change made,
    /// then each of its folders fsynced in a round shared with whoever else
    /// needs one ([`Rounds`]), then `settle` told. A lone upload so costs
    /// no hand-over between threads, and concurrent ones still share
    /// folder fsyncs.
    ///
    /// With [`Entries::Durable`] (a publish from a spare whose name is
    /// durable) a rename that succeeds needs no folder fsync: a crash that
    /// loses it leaves the written spare, which the next run publishes
    /// (see [`spares`](super::spares)).
    pub(crate) fn apply_now(
        &self,
        change: Change,
        settle: Settle,
        entries: Entries,
    ) -> Result<Applied, MailboxError> {
        let shared = &self.shared;
        // The folders are fsynced after a failed change too: a failed
        // publish removed its temporary file, and that is made durable.
        let applied = apply(shared, &change);
        let durable = entries == Entries::Durable && applied.is_ok();
        let mut led = false;
        let mut unsynced = None;
        for dir in dirs_of(&change).filter(|_| !durable) {
            let synced = sync_round(shared, dir);
            led |= synced.led;
            match synced.result {
                Ok(()) => {}
                // A folder that does not exist holds nothing of the change.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    unsynced.get_or_insert(MailboxError::io(dir, e));
                }
            }
        }
        if led {
            // What one folder fsync made durable is a batch.
            shared.batches.fetch_add(1, Ordering::Relaxed);
        }
        let answer = applied.and_then(|applied| match unsynced {
            None => Ok(applied),
            Some(e) => {
                if let Change::Publish { target, .. } = &change {
                    withdraw_unsynced(shared, std::slice::from_ref(target));
                }
                Err(e)
            }
        });
        // Durable, but the caller does not know yet: a crash here must
        // lose nothing.
        fail::fail_point!("mailbox::synced");
        shared.changes.fetch_add(1, Ordering::Relaxed);
        settle.tell(fate(&answer));
        answer
    }

    /// Fsyncs the folder `dir` (blocking), in a round shared with whoever
    /// else needs one of it.
    pub(crate) fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        sync_round(&self.shared, dir).result
    }

    /// How many callers wait for an fsync of `dir` not yet begun.
    #[cfg(test)]
    pub(crate) fn waiting(&self, dir: &Path) -> usize {
        self.shared.rounds.waiting(dir)
    }

    /// Makes a folder for its first file (blocking): see [`make_folder`].
    pub(crate) fn make_folder(&self, dir: &Path) -> io::Result<()> {
        make_folder(&self.shared, dir)
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
    pub(crate) async fn submit(
        self,
        change: Change,
        settle: Settle,
    ) -> Result<Applied, MailboxError> {
        self.send(change, settle).wait().await
    }

    /// Queues the change without waiting, so that a caller with many
    /// changes can queue them all into one batch and then wait for each.
    pub(crate) fn send(mut self, change: Change, settle: Settle) -> Pending {
        let (reply, answer) = oneshot::channel();
        let sent = self.syncer.tx.send(Job {
            change,
            settle,
            reply,
        });
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

/// Applies the batch's changes, fsyncs each touched directory once, settles
/// the changes with the indexes and answers the callers.
async fn commit(batch: Vec<Job>, shared: &Arc<Shared>) {
    let mut changes = Vec::with_capacity(batch.len());
    let mut waiting = Vec::with_capacity(batch.len());
    for job in batch {
        changes.push(job.change);
        waiting.push((job.settle, job.reply));
    }
    // Every directory any change touched, failed ones included: a failed
    // publish removed its temporary file, and that removal is made durable too.
    let dirs: Vec<PathBuf> = changes
        .iter()
        .flat_map(dirs_of)
        .collect::<BTreeSet<&Path>>()
        .into_iter()
        .map(Path::to_owned)
        .collect();
    let applying = Arc::clone(shared);
    let (changes, results, dirs, mut synced) = match tokio::task::spawn_blocking(move || {
        let results: Vec<_> = changes.iter().map(|c| apply(&applying, c)).collect();
        // One folder: fsynced on this thread, without a
        // hand-over to another; several: each on its own, below.
        let synced = match &dirs[..] {
            [dir] => vec![(dir.clone(), sync(&applying, dir))],
            _ => Vec::new(),
        };
        (changes, results, dirs, synced)
    })
    .await
    {
        Ok(done) => done,
        Err(e) => {
            for (settle, reply) in waiting {
                settle.tell(Fate::Failed);
                let _ = reply.send(Err(MailboxError::Join(e.to_string())));
            }
            return;
        }
    };
    let mut lost_task = None;
    if dirs.len() > 1 {
        let mut fsyncs = JoinSet::new();
        for dir in dirs {
            let shared = Arc::clone(shared);
            fsyncs.spawn_blocking(move || {
                let r = sync(&shared, &dir);
                (dir, r)
            });
        }
        while let Some(joined) = fsyncs.join_next().await {
            match joined {
                Ok(done) => synced.push(done),
                Err(e) => lost_task = Some(e.to_string()),
            }
        }
    }
    let mut failed_dirs: Vec<(PathBuf, io::Error)> = Vec::new();
    for (dir, r) in synced {
        match r {
            Ok(()) => {}
            // A folder that does not exist holds none of the batch's entries
            // (a delete of a file in a folder never made).
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => failed_dirs.push((dir, e)),
        }
    }
    // Durable, but no caller knows yet: a crash here must lose nothing.
    fail::fail_point!("mailbox::synced");
    shared.batches.fetch_add(1, Ordering::Relaxed);
    shared
        .changes
        .fetch_add(changes.len() as u64, Ordering::Relaxed);

    let mut withdraw = Vec::new();
    let answers: Vec<_> = changes
        .into_iter()
        .zip(results)
        .map(|(change, result)| {
            result.and_then(|applied| {
                let unsynced = match &lost_task {
                    Some(e) => Some(MailboxError::Join(e.clone())),
                    None => failed_dirs
                        .iter()
                        .find(|(dir, _)| dirs_of(&change).any(|d| d == dir))
                        .map(|(dir, e)| {
                            MailboxError::io(dir, io::Error::new(e.kind(), e.to_string()))
                        }),
                };
                match unsynced {
                    None => Ok(applied),
                    Some(e) => {
                        if let Change::Publish { target, .. } = change {
                            withdraw.push(target);
                        }
                        Err(e)
                    }
                }
            })
        })
        .collect();
    if !withdraw.is_empty() {
        let withdrawing = Arc::clone(shared);
        let _ =
            tokio::task::spawn_blocking(move || withdraw_unsynced(&withdrawing, &withdraw)).await;
    }
    for (answer, (settle, reply)) in answers.into_iter().zip(waiting) {
        settle.tell(fate(&answer));
        let _ = reply.send(answer);
    }
}

/// What the folder indexes learn of a change that answered `answer`.
fn fate(answer: &Result<Applied, MailboxError>) -> Fate {
    match answer {
        Ok(_) => Fate::Durable,
        Err(MailboxError::NotFound { .. }) => Fate::Missing,
        Err(_) => Fate::Failed,
    }
}

/// After a failed directory fsync, a published file is not known to be
/// durable; it is removed, and the removal fsynced, so that the caller's
/// error ("not stored") is the whole truth, now and after a power loss.
/// Should that fsync fail too, a power loss may bring the file back: that
/// is logged as an error naming it (the start-up scan would then list the
/// message, which its sender was told had not been stored). Moves and
/// deletes are left as they are: they are idempotent and the caller
/// retries them.
fn withdraw_unsynced(shared: &Shared, targets: &[PathBuf]) {
    let mut dirs = BTreeSet::new();
    for target in targets {
        match std::fs::remove_file(target) {
            Ok(()) => {
                dirs.insert(parent(target).to_owned());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::error!(file = %target.display(), error = %e,
                "could not withdraw a message file whose folder fsync failed"),
        }
    }
    for dir in dirs {
        match sync(shared, &dir) {
            Ok(()) => {}
            Err(e) => {
                for target in targets.iter().filter(|t| parent(t) == dir) {
                    tracing::error!(file = %target.display(), error = %e,
                        "a withdrawn message file may reappear after a power loss: its folder fsync failed twice");
                }
            }
        }
    }
}

/// Applies one change (blocking).
fn apply(shared: &Shared, change: &Change) -> Result<Applied, MailboxError> {
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
                    // The target folder is made for its first file.
                    make_folder(shared, parent(to))
                        .and_then(|()| rename(from, to))
                        .map(|()| Applied::Done)
                        .map_err(|e| MailboxError::io(to, e))
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

/// Makes the mailbox folder `dir` (`<data>/<mailbox>/<folder>`) and, if
/// needed, its mailbox's folder, fsyncing the parent of each, so that the
/// folder is durable before any file in it is (blocking). The parent is
/// fsynced also when the folder already exists: whoever made it a moment
/// ago may not have fsynced yet.
fn make_folder(shared: &Shared, dir: &Path) -> io::Result<()> {
    let mailbox = parent(dir);
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            made(std::fs::create_dir(mailbox))?;
            sync(shared, parent(mailbox))?;
            made(std::fs::create_dir(dir))?;
        }
        other => made(other)?,
    }
    sync(shared, mailbox)
}

/// A folder creation that found the folder there already succeeded.
fn made(created: io::Result<()>) -> io::Result<()> {
    match created {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// Makes a directory's entries as they are now durable (blocking): an
/// fsync of it begun after this call, shared with whoever else needs one
/// ([`Rounds`]), counted by whoever made it.
fn sync(shared: &Shared, dir: &Path) -> io::Result<()> {
    sync_round(shared, dir).result
}

/// [`sync`], telling whether this caller made the fsync.
fn sync_round(shared: &Shared, dir: &Path) -> Synced {
    let synced = shared.rounds.sync(dir, |dir| (shared.dir_sync)(dir));
    if synced.led && synced.result.is_ok() {
        shared.dir_fsyncs.fetch_add(1, Ordering::Relaxed);
    }
    synced
}

/// The directories whose entries a change alters.
fn dirs_of(change: &Change) -> impl Iterator<Item = &Path> {
    let (first, second) = match change {
        Change::Publish { target, .. } => (target, None),
        Change::Move { from, to } => (from, Some(to)),
        Change::Delete { path } => (path, None),
    };
    std::iter::once(parent(first)).chain(second.map(|p| parent(p)))
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
    use std::sync::Mutex;

    use super::*;

    fn in_flight(s: &Syncer) -> usize {
        s.shared.in_flight.load(Ordering::SeqCst)
    }

    fn syncer(config: SyncConfig) -> Syncer {
        Syncer::start(config, Arc::new(fsync_dir))
    }

    fn ignore() -> Settle {
        Settle::new(|_| {})
    }

    #[tokio::test]
    async fn tickets_are_released_by_submit_and_by_drop() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = syncer(SyncConfig::default());
        let ticket = syncer.ticket();
        assert_eq!(in_flight(&syncer), 1);
        drop(ticket);
        assert_eq!(in_flight(&syncer), 0);

        let gone = dir.path().join("gone");
        let applied = syncer
            .ticket()
            .submit(Change::Delete { path: gone }, ignore())
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
        let syncer = syncer(SyncConfig {
            max_batch: 8,
            linger: Duration::from_millis(1),
            ..SyncConfig::default()
        });
        let silent = syncer.ticket();
        let applied = syncer
            .ticket()
            .submit(
                Change::Delete {
                    path: dir.path().join("x"),
                },
                ignore(),
            )
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
        let syncer = syncer(SyncConfig::default());
        let temp = dir.path().join(".t.tmp");
        std::fs::write(&temp, b"{}").unwrap();
        let (told, fate) = std::sync::mpsc::channel();
        let err = syncer
            .ticket()
            .submit(
                Change::Publish {
                    temp: temp.clone(),
                    target: file.join("m.msg"),
                },
                Settle::new(move |f| told.send(f).unwrap()),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, MailboxError::Storage { .. }), "{err}");
        assert!(!temp.exists(), "the temporary file is removed");
        assert_eq!(fate.try_recv(), Ok(Fate::Failed));
    }

    #[tokio::test]
    async fn a_publish_whose_folder_fsync_failed_is_withdrawn_durably() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("m.msg");
        let temp = dir.path().join(".m.msg.tmp");
        std::fs::write(&temp, b"{}").unwrap();
        // The first fsync of the folder fails; each call notes whether the
        // published file was there when the folder was fsynced.
        let calls: Arc<Mutex<Vec<bool>>> = Arc::default();
        let seen = Arc::clone(&calls);
        let probe = target.clone();
        let dir_sync: DirSync = Arc::new(move |d: &Path| {
            let mut calls = seen.lock().unwrap();
            calls.push(probe.exists());
            if calls.len() == 1 {
                Err(io::Error::other("injected fsync failure"))
            } else {
                fsync_dir(d)
            }
        });
        let syncer = Syncer::start(SyncConfig::default(), dir_sync);
        let err = syncer
            .ticket()
            .submit(
                Change::Publish {
                    temp,
                    target: target.clone(),
                },
                ignore(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, MailboxError::Storage { .. }), "{err}");
        assert!(!target.exists(), "the file is withdrawn");
        // Fsynced with the file in place (failed), then again without it.
        assert_eq!(*calls.lock().unwrap(), vec![true, false]);
    }

    #[tokio::test]
    async fn a_move_makes_its_target_folder_durably() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("db-a").join("Messages");
        std::fs::create_dir_all(&from).unwrap();
        std::fs::write(from.join("m.msg"), b"{}").unwrap();
        let synced: Arc<Mutex<Vec<PathBuf>>> = Arc::default();
        let seen = Arc::clone(&synced);
        let dir_sync: DirSync = Arc::new(move |d: &Path| {
            seen.lock().unwrap().push(d.to_owned());
            fsync_dir(d)
        });
        let syncer = Syncer::start(SyncConfig::default(), dir_sync);
        let to = dir.path().join("db-a").join("Log");
        let applied = syncer
            .ticket()
            .submit(
                Change::Move {
                    from: from.join("m.msg"),
                    to: to.join("m.msg"),
                },
                ignore(),
            )
            .await
            .unwrap();
        assert_eq!(applied, Applied::Done);
        assert!(to.join("m.msg").is_file());
        let mut synced = synced.lock().unwrap().clone();
        // The new folder's entry first, then both folders of the move.
        assert_eq!(synced.remove(0), dir.path().join("db-a"));
        synced.sort();
        assert_eq!(synced, vec![to, from]);
    }

    #[tokio::test]
    async fn a_dropped_settle_is_told_failed() {
        let (told, fate) = std::sync::mpsc::channel();
        drop(Settle::new(move |f| told.send(f).unwrap()));
        assert_eq!(fate.try_recv(), Ok(Fate::Failed));
    }
}
