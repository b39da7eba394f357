//! Pausing every durable write of the data folder, so that a copy taken
//! during the pause is a state a crash could have left (an online backup).
//!
//! Every store of the data folder is wrapped in [`Gated`], which holds the
//! [`Quiesce`]'s read side for the length of each write; [`Quiesce::pause`]
//! takes the write side, so it waits for the writes under way and holds
//! back new ones until the [`Paused`] guard is dropped. A write is one
//! durable step (a redb transaction, a message file written, moved or
//! deleted, a protocol step's batch of moves), so during the pause the files
//! on disk are exactly what a crash at that moment would leave, which
//! start-up recovery already handles. Reads go on.
//!
//! Two locks, always taken in the same order: the message store's
//! (`files`) and the redb stores' (`stores`). A batch of moves can schedule a
//! message in the scheduled store while it holds `files`, so it takes
//! `stores` inside `files`; nothing takes `files` inside `stores`, and the
//! pause takes `files` first, then `stores`.

use std::collections::HashSet;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use estafeta_session::storage::{Pending, Shared, Step, StorageError, Write};
use tokio::sync::{OwnedRwLockWriteGuard, RwLock};

use crate::error::{MailboxError, TenancyError};
use crate::id::Id;
use crate::keys::{KeyedUpload, KeysError, UploadKeys};
use crate::store::{
    Applied, Change, FileEntry, FileName, Filter, Folder, Limits, Location, MessageStore, Op,
    Outcome, RawArray, RegistryStore, Snapshot,
};
use crate::timestamp::Timestamp;
use crate::token::{Token, TokenHash};
use crate::ulid_ids::MessageId;
use crate::wire::Message;

/// The durable commits that a [`CommitObserver`] is told of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Durable {
    /// A batch of session saves (one redb transaction, group-committed),
    /// or a save of a shared store's step (its transaction's commit).
    Sessions,
    /// A message store write: an upload, or a protocol step's batch of moves.
    Messages,
}

impl Durable {
    /// The name, as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Durable::Sessions => "sessions",
            Durable::Messages => "messages",
        }
    }
}

/// Told of the exchange's durable commits and of what they did (for
/// metrics); called on the writing thread, so it must be quick.
pub trait CommitObserver: Send + Sync {
    /// A durable commit of `what` took `took` (not counting a backup's pause).
    fn committed(&self, what: Durable, took: Duration);
    /// `n` messages arrived in their recipients' `Messages` folders
    /// (uploads, replies on commit, scheduled deliveries).
    fn delivered(&self, n: u64);
    /// A process ended in `state`, or went in doubt (`IN_DOUBT`).
    fn ended(&self, state: crate::wire::ProcessState);
}

/// The pause that backups take, shared by every store of one data folder
/// (the exchange's and the server's own), and the observer of the
/// exchange's commits. Cheap to clone.
#[derive(Clone, Default)]
pub struct Quiesce {
    inner: Arc<Locks>,
}

#[derive(Default)]
struct Locks {
    files: Arc<RwLock<()>>,
    stores: Arc<RwLock<()>>,
    observer: Option<Arc<dyn CommitObserver>>,
}

impl std::fmt::Debug for Quiesce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quiesce").finish_non_exhaustive()
    }
}

/// Writes are held back while this lives.
pub struct Paused {
    _stores: OwnedRwLockWriteGuard<()>,
    _files: OwnedRwLockWriteGuard<()>,
}

impl Quiesce {
    /// A pause whose stores tell `observer` of their commits.
    pub fn observed(observer: Arc<dyn CommitObserver>) -> Self {
        Quiesce {
            inner: Arc::new(Locks {
                observer: Some(observer),
                ..Locks::default()
            }),
        }
    }

    /// The observer of the exchange's commits, if there is one.
    pub(crate) fn observer(&self) -> Option<&dyn CommitObserver> {
        self.inner.observer.as_deref()
    }

    /// Tells the observer that a commit of `what` begun at `started` ended.
    fn committed(&self, what: Durable, started: Instant) {
        if let Some(o) = self.observer() {
            o.committed(what, started.elapsed());
        }
    }

    /// Tells the observer that `n` messages arrived in `Messages` folders.
    fn delivered(&self, n: usize) {
        if let (Some(o), 1..) = (self.observer(), n) {
            o.delivered(n as u64);
        }
    }

    /// Waits for the writes under way to end and holds back new ones until
    /// the guard is dropped.
    pub async fn pause(&self) -> Paused {
        let files = self.inner.files.clone().write_owned().await;
        let stores = self.inner.stores.clone().write_owned().await;
        Paused {
            _stores: stores,
            _files: files,
        }
    }

    /// Runs `write`, one durable write of a redb store of the data folder,
    /// outside any pause. Blocks: call it on a blocking thread, as the
    /// stores' callers do.
    pub fn store_write<T>(&self, write: impl FnOnce() -> T) -> T {
        let _writing = self.inner.stores.blocking_read();
        write()
    }
}

/// A store whose writes wait out a [`Quiesce::pause`]; reads pass through.
pub struct Gated<S> {
    inner: S,
    quiesce: Quiesce,
}

impl<S> Gated<S> {
    /// `inner`, its writes paused by `quiesce`.
    pub fn new(inner: S, quiesce: Quiesce) -> Self {
        Gated { inner, quiesce }
    }
}

impl<S: estafeta_repeat::store::Store> estafeta_repeat::store::Store for Gated<S> {
    fn apply(
        &self,
        ops: &[estafeta_repeat::store::Op],
    ) -> Result<Vec<estafeta_repeat::store::Applied>, estafeta_repeat::StoreError> {
        self.quiesce.store_write(|| self.inner.apply(ops))
    }
    fn sources(&self) -> Result<Vec<String>, estafeta_repeat::StoreError> {
        self.inner.sources()
    }
    fn scan(
        &self,
        source: &str,
        from: Bound<&estafeta_repeat::Position>,
        now: u64,
        limit: usize,
        skip: &dyn Fn(&estafeta_repeat::Position) -> bool,
    ) -> Result<estafeta_repeat::store::Scan, estafeta_repeat::StoreError> {
        self.inner.scan(source, from, now, limit, skip)
    }
    fn scan_sources(
        &self,
        reads: &[estafeta_repeat::store::Read<'_>],
        now: u64,
        skip: &dyn Fn(&str, &estafeta_repeat::Position) -> bool,
    ) -> Vec<Result<estafeta_repeat::store::Scan, estafeta_repeat::StoreError>> {
        self.inner.scan_sources(reads, now, skip)
    }
    fn count(
        &self,
        source: &str,
        now: u64,
    ) -> Result<estafeta_repeat::store::SourceCount, estafeta_repeat::StoreError> {
        self.inner.count(source, now)
    }
}

impl<S: estafeta_session::storage::Storage> estafeta_session::storage::Storage for Gated<S> {
    fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, estafeta_session::storage::StorageError> {
        self.inner.load(key)
    }
    fn write(
        &self,
        batch: &[estafeta_session::storage::Write],
    ) -> Result<(), estafeta_session::storage::StorageError> {
        self.quiesce.store_write(|| {
            let started = Instant::now();
            let written = self.inner.write(batch);
            self.quiesce.committed(Durable::Sessions, started);
            written
        })
    }
    fn deadlines(
        &self,
    ) -> Result<Vec<(Vec<u8>, estafeta_session::Timestamp)>, estafeta_session::storage::StorageError>
    {
        self.inner.deadlines()
    }
    fn quarantine(
        &self,
        key: &[u8],
        reason: &str,
    ) -> Result<(), estafeta_session::storage::StorageError> {
        self.quiesce
            .store_write(|| self.inner.quarantine(key, reason))
    }
    fn quarantined(&self) -> Result<Vec<Vec<u8>>, estafeta_session::storage::StorageError> {
        self.inner.quarantined()
    }
    fn generation(&self) -> u64 {
        self.inner.generation()
    }
    // A shared store's steps commit through their own transactions, which
    // a backup of the embedded store never has to wait for; their commits
    // are told to the observer ([`TimedStep`]).
    fn shared(&self) -> Option<&dyn Shared> {
        self.inner.shared().map(|_| self as &dyn Shared)
    }
}

/// The inner store's steps, each told to the observer as it commits.
impl<S: estafeta_session::storage::Storage> Shared for Gated<S> {
    fn begin<'a>(&'a self, key: &'a [u8]) -> Pending<'a, Box<dyn Step>> {
        Box::pin(async move {
            let shared = self.inner.shared().ok_or(StorageError::Conflict)?;
            Ok(Box::new(TimedStep {
                inner: shared.begin(key).await?,
                quiesce: self.quiesce.clone(),
            }) as Box<dyn Step>)
        })
    }

    fn due<'a>(
        &'a self,
        prefix: &'a [u8],
        now: estafeta_session::Timestamp,
        limit: usize,
    ) -> Pending<'a, Vec<Vec<u8>>> {
        match self.inner.shared() {
            Some(shared) => shared.due(prefix, now, limit),
            None => Box::pin(std::future::ready(Ok(Vec::new()))),
        }
    }
}

/// A step of a shared store whose commits with a write (a save, a final
/// write) are told to the observer as session commits, as the embedded
/// store's write batches are. A save's time includes taking the key again
/// after its commit, which the command waits for too.
struct TimedStep {
    inner: Box<dyn Step>,
    quiesce: Quiesce,
}

impl Step for TimedStep {
    fn record(&self) -> Option<&[u8]> {
        self.inner.record()
    }

    fn save<'a>(&'a mut self, write: &'a Write) -> Pending<'a, ()> {
        Box::pin(async move {
            let started = Instant::now();
            let saved = self.inner.save(write).await;
            if saved.is_ok() {
                self.quiesce.committed(Durable::Sessions, started);
            }
            saved
        })
    }

    fn held(&self) -> bool {
        self.inner.held()
    }

    fn finish<'a>(self: Box<Self>, write: Option<&'a Write>) -> Pending<'a, ()> {
        let TimedStep { inner, quiesce } = *self;
        Box::pin(async move {
            let started = Instant::now();
            let finished = inner.finish(write).await;
            if finished.is_ok() && write.is_some() {
                quiesce.committed(Durable::Sessions, started);
            }
            finished
        })
    }
    fn abandon(&mut self) {
        self.inner.abandon();
    }
    fn put_beside(&mut self, write: Write, if_absent: bool) -> bool {
        self.inner.put_beside(write, if_absent)
    }
    fn joint(&mut self) -> Option<&mut (dyn std::any::Any + Send + Sync)> {
        self.inner.joint()
    }
}

impl<K: UploadKeys> UploadKeys for Gated<K> {
    fn get(
        &self,
        device: &Id,
        key: &str,
        now: Timestamp,
    ) -> Result<Option<KeyedUpload>, KeysError> {
        self.inner.get(device, key, now)
    }
    fn put_all(&self, entries: &[(Id, String, KeyedUpload)]) -> Result<(), KeysError> {
        self.quiesce.store_write(|| self.inner.put_all(entries))
    }
    // Written by the step's commit, which a backup of the embedded store
    // never has to wait for (see `shared` above).
    fn put_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        device: &Id,
        key: &str,
        upload: &KeyedUpload,
    ) -> bool {
        self.inner.put_in_step(step, device, key, upload)
    }
    fn remove_device(&self, device: &Id) -> Result<u64, KeysError> {
        self.quiesce
            .store_write(|| self.inner.remove_device(device))
    }
    fn expire(&self, now: Timestamp, max: usize) -> Result<usize, KeysError> {
        self.quiesce.store_write(|| self.inner.expire(now, max))
    }
    fn len(&self) -> Result<u64, KeysError> {
        self.inner.len()
    }
}

#[async_trait::async_trait]
impl<R: RegistryStore> RegistryStore for Gated<R> {
    async fn load(&self) -> Result<Snapshot, TenancyError> {
        self.inner.load().await
    }
    async fn admin(&self) -> Result<Option<TokenHash>, TenancyError> {
        self.inner.admin().await
    }
    async fn apply(&self, change: &Change) -> Result<(), TenancyError> {
        let _writing = self.quiesce.inner.stores.read().await;
        self.inner.apply(change).await
    }
    async fn set_first_admin(&self, token: &Token) -> Result<bool, TenancyError> {
        let _writing = self.quiesce.inner.stores.read().await;
        self.inner.set_first_admin(token).await
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    async fn version(&self) -> Result<u64, TenancyError> {
        self.inner.version().await
    }
    fn version_in_step(&self, step: &mut dyn estafeta_session::storage::Step) -> Option<u64> {
        self.inner.version_in_step(step)
    }
}

#[async_trait::async_trait]
impl<M: MessageStore> MessageStore for Gated<M> {
    async fn create_mailbox(&self, owner: &Id) -> Result<(), MailboxError> {
        let _writing = self.quiesce.inner.files.read().await;
        self.inner.create_mailbox(owner).await
    }
    async fn create_mailboxes(&self, owners: &[Id]) -> Vec<Result<(), MailboxError>> {
        let _writing = self.quiesce.inner.files.read().await;
        self.inner.create_mailboxes(owners).await
    }
    async fn remove_mailbox(&self, owner: &Id) -> Result<u64, MailboxError> {
        let _writing = self.quiesce.inner.files.read().await;
        self.inner.remove_mailbox(owner).await
    }
    async fn scheduled_for(&self, owner: &Id) -> Result<u64, MailboxError> {
        self.inner.scheduled_for(owner).await
    }
    // Scheduled in the scheduler's store, whose writes wait out a pause.
    async fn schedule(&self, message: &Message, until: Timestamp) -> Result<(), MailboxError> {
        self.inner.schedule(message, until).await
    }
    async fn put(&self, at: &Location, message: &Message) -> Result<FileEntry, MailboxError> {
        let _writing = self.quiesce.inner.files.read().await;
        let started = Instant::now();
        let put = self.inner.put(at, message).await;
        self.quiesce.committed(Durable::Messages, started);
        if put.is_ok() && at.folder == Folder::Messages {
            self.quiesce.delivered(1);
        }
        put
    }
    async fn put_when(
        &self,
        at: &Location,
        message: &Message,
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Option<FileEntry>, MailboxError> {
        let _writing = self.quiesce.inner.files.read().await;
        let started = Instant::now();
        let put = self.inner.put_when(at, message, when).await;
        self.quiesce.committed(Durable::Messages, started);
        if matches!(put, Ok(Some(_))) && at.folder == Folder::Messages {
            self.quiesce.delivered(1);
        }
        put
    }
    // Written by the step's commit, which a backup of the embedded store
    // never has to wait for; the caller tells the observer of the delivery
    // once that commit is made.
    fn put_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        at: &Location,
        message: &Message,
    ) -> Result<Option<FileEntry>, MailboxError> {
        self.inner.put_in_step(step, at, message)
    }
    async fn put_all(
        &self,
        at: &Location,
        messages: &[Message],
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let _writing = self.quiesce.inner.files.read().await;
        let started = Instant::now();
        let put = self.inner.put_all(at, messages, when).await;
        self.quiesce.committed(Durable::Messages, started);
        if let (Ok(entries), Folder::Messages) = (&put, at.folder) {
            self.quiesce.delivered(entries.len());
        }
        put
    }
    fn put_all_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        at: &Location,
        messages: &[Message],
    ) -> Result<Option<Vec<FileEntry>>, MailboxError> {
        self.inner.put_all_in_step(step, at, messages)
    }
    async fn apply(
        &self,
        step: Option<&mut dyn estafeta_session::storage::Step>,
        ops: &[Op],
    ) -> Applied {
        let _writing = self.quiesce.inner.files.read().await;
        let started = Instant::now();
        let applied = self.inner.apply(step, ops).await;
        self.quiesce.committed(Durable::Messages, started);
        // Moves into a Messages folder made by this call (not the ones a
        // repeated step finds done already).
        let arrived = ops
            .iter()
            .zip(&applied.results)
            .filter(|(op, result)| {
                matches!(op, Op::Move { to, from, .. }
                    if to.folder == Folder::Messages && from.folder != Folder::Messages)
                    && matches!(result, Ok(Outcome::Done))
            })
            .count();
        self.quiesce.delivered(arrived);
        applied
    }
    async fn delete_all(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Vec<Result<Outcome, MailboxError>> {
        let _writing = self.quiesce.inner.files.read().await;
        self.inner.delete_all(at, names).await
    }
    async fn select(
        &self,
        at: &Location,
        filter: &Filter,
        limits: Limits,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        self.inner.select(at, filter, limits).await
    }
    async fn read_array(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Result<RawArray, MailboxError> {
        self.inner.read_array(at, names).await
    }
    async fn count(&self, at: &Location) -> Result<usize, MailboxError> {
        self.inner.count(at).await
    }
    async fn oldest(&self, at: &Location, n: usize) -> Result<Vec<FileName>, MailboxError> {
        self.inner.oldest(at, n).await
    }
    async fn oldest_array(&self, at: &Location, n: usize) -> Result<RawArray, MailboxError> {
        self.inner.oldest_array(at, n).await
    }
    async fn oldest_array_and_registry(
        &self,
        at: &Location,
        n: usize,
    ) -> Result<(RawArray, Option<u64>), MailboxError> {
        self.inner.oldest_array_and_registry(at, n).await
    }
    // Written by the step's commit, as `put_in_step`.
    async fn move_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        from: &Location,
        to: &Location,
        ids: &HashSet<MessageId>,
    ) -> Result<Option<Vec<MessageId>>, MailboxError> {
        self.inner.move_in_step(step, from, to, ids).await
    }
    async fn find(&self, at: &Location, id: MessageId) -> Result<Option<FileName>, MailboxError> {
        self.inner.find(at, id).await
    }
    async fn find_all(
        &self,
        at: &Location,
        ids: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError> {
        self.inner.find_all(at, ids).await
    }
    async fn delivered(&self, name: &FileName) -> Result<bool, MailboxError> {
        self.inner.delivered(name).await
    }
    async fn list(&self, at: &Location) -> Result<Vec<FileEntry>, MailboxError> {
        self.inner.list(at).await
    }
    async fn remove_older_than(
        &self,
        at: &Location,
        cutoff: Timestamp,
        keep: &HashSet<MessageId>,
    ) -> Result<usize, MailboxError> {
        let _writing = self.quiesce.inner.files.read().await;
        self.inner.remove_older_than(at, cutoff, keep).await
    }
    async fn recover_writes(&self, owner: &Id) -> Result<(), MailboxError> {
        let _writing = self.quiesce.inner.files.read().await;
        self.inner.recover_writes(owner).await
    }
    async fn orphans(
        &self,
        db: &Id,
        referenced: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError> {
        self.inner.orphans(db, referenced).await
    }
    fn count_as(&self, owner: &Id, kind: crate::store::MailboxKind) {
        self.inner.count_as(owner, kind);
    }
    async fn tallies(&self) -> Option<crate::store::Tallies> {
        self.inner.tallies().await
    }
    async fn holding(
        &self,
        folder: crate::store::Folder,
    ) -> Option<Vec<(crate::store::MailboxKind, Id)>> {
        self.inner.holding(folder).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pause_holds_back_writes_until_it_ends() {
        let quiesce = Quiesce::default();
        let paused = quiesce.pause().await;
        assert!(quiesce.inner.files.try_read().is_err());
        assert!(quiesce.inner.stores.try_read().is_err());
        drop(paused);
        let wrote = tokio::task::spawn_blocking({
            let quiesce = quiesce.clone();
            move || quiesce.store_write(|| "written")
        });
        assert_eq!(wrote.await.unwrap(), "written");
        assert!(quiesce.inner.files.try_read().is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pause_waits_for_the_write_under_way() {
        let quiesce = Quiesce::default();
        let writing = quiesce.inner.files.clone().read_owned().await;
        let pause = tokio::spawn({
            let quiesce = quiesce.clone();
            async move { drop(quiesce.pause().await) }
        });
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!pause.is_finished());
        drop(writing);
        pause.await.unwrap();
    }
}
