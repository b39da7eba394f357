//! The embedded message store: one file per message under the data
//! folder (`<data>/<id>/<Folder>/<name>.msg`), written, moved and deleted
//! through the [`Mailboxes`] engine (temporary file, fsync, rename, folder
//! fsync, group-committed), with messages due later scheduled in the
//! repeat scheduler (`<data>/.estafeta/scheduled.redb`).
//!
//! Files cannot move together atomically, so every op is idempotent: a
//! move whose file is already in its target, or a delete whose file is
//! gone, is done. What a crash can leave half-way is cleared at start-up:
//! temporary files of unfinished writes ([`MessageUpkeep::recover_writes`]),
//! uploads written and not yet under their names
//! ([`MessageUpkeep::unconfirmed_written`]) and replies written to
//! `Prepared` but never recorded ([`MessageUpkeep::orphans`]).
//!
//! Finding the uploads a crash left unpublished takes a read of every
//! database's queue folder before the server is ready. A clean stop that
//! leaves nothing to find says so with a marker
//! ([`DataLayout::clean_stop`](crate::DataLayout::clean_stop)), and the
//! next start, finding it, skips those reads.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Arc;

use super::removal::Removals;
use super::scheduled::{self, DeliveryScheduler, Listed, SCHEDULED_SOURCE, Scheduled};
use super::{Applied, MessageReads, MessageSteps, MessageUpkeep, Op};
use crate::error::MailboxError;
use crate::id::Id;
use crate::mailbox::{
    FileEntry, FileName, Filter, Folder, Limits, Location, MailboxKind, Mailboxes, Outcome,
    RawArray, SyncConfig, Tallies, blocking,
};
use crate::timestamp::Timestamp;
use crate::ulid_ids::MessageId;
use crate::wire::Message;
use estafeta_durable::WriteGate;

/// Messages as files under the data folder. Cheap to clone.
#[derive(Clone)]
pub(crate) struct FileStore {
    mailboxes: Mailboxes,
    /// Where a message due later is kept until its time.
    scheduled: Arc<DeliveryScheduler>,
    /// The entries of `scheduled`, read to find a mailbox's, and to ask
    /// whether a message is waiting there.
    kept: Arc<dyn estafeta_repeat::store::Store>,
    /// Orders writes into a mailbox from outside its owner's session with
    /// the mailbox's removal.
    removals: Arc<Removals>,
    /// What an online backup closes to hold back the writes.
    gate: WriteGate,
    /// The start found the clean stop's marker: no upload of an earlier
    /// run is waiting to be published.
    left_clean: bool,
}

/// The recipient of a scheduled message, read from its entry's payload.
#[derive(serde::Deserialize)]
struct Recipient {
    to: Id,
}

impl FileStore {
    /// Opens the message files under the data folder `root` (group commit
    /// with its default settings), keeping messages due later in
    /// `scheduled`; every write passes `gate`.
    pub(crate) async fn open(
        root: &Path,
        scheduled: &Scheduled,
        gate: WriteGate,
    ) -> Result<Self, MailboxError> {
        let layout = crate::DataLayout::new(root);
        let removals = Removals::open(layout.removed()).await?;
        let left_clean = blocking(move || took_clean_stop(&layout.clean_stop())).await?;
        Ok(Self {
            mailboxes: Mailboxes::open(root, SyncConfig::default()).await?,
            scheduled: scheduled.scheduler.clone(),
            kept: scheduled.store.clone(),
            removals: Arc::new(removals),
            gate,
            left_clean,
        })
    }

    /// The ids of the messages scheduled for `owner` (every entry is read:
    /// a deletion's cost, not an upload's).
    async fn kept_for(&self, owner: &Id) -> Result<Vec<String>, MailboxError> {
        let kept = Listed(self.kept.clone());
        let owner = owner.clone();
        let scheduled = crate::DataLayout::new(self.mailboxes.root()).scheduled();
        tokio::task::spawn_blocking(move || {
            let entries = kept
                .entries(SCHEDULED_SOURCE, usize::MAX)
                .map_err(|e| MailboxError::io(&scheduled, std::io::Error::other(e)))?;
            Ok(entries
                .into_iter()
                .filter(|e| {
                    serde_json::from_slice::<Recipient>(&e.payload).is_ok_and(|r| r.to == owner)
                })
                .map(|e| e.id)
                .collect())
        })
        .await
        .map_err(|e| MailboxError::Join(e.to_string()))?
    }

    /// Whether the message `name`, no longer where a batch schedules it
    /// from, is where an earlier run of the batch put it: waiting in the
    /// scheduler, or delivered. Asked in that order: the scheduler writes a
    /// due message into its recipient's `Messages` before it removes the
    /// entry, so one of the two holds it throughout.
    async fn scheduled_before(&self, name: &FileName) -> Result<bool, MailboxError> {
        let kept = self.kept.clone();
        let id = name.id.to_string();
        let waiting = tokio::task::spawn_blocking(move || kept.contains(&id))
            .await
            .map_err(|e| MailboxError::Join(e.to_string()))?
            .map_err(|e| {
                MailboxError::io(
                    crate::DataLayout::new(self.mailboxes.root()).scheduled(),
                    std::io::Error::other(e),
                )
            })?;
        Ok(waiting || self.delivered(name).await?)
    }

    /// The exchange's clock now (the scheduler runs on it).
    fn now(&self) -> Timestamp {
        let ms = self.scheduled.clock().0.now().0;
        Timestamp::from_millis(i64::try_from(ms).unwrap_or(i64::MAX))
    }

    /// [`Op::Schedule`]: the message read from `from`, scheduled for
    /// `until` (or written into its recipient's `Messages` if that time has
    /// passed, noted in `arrivals`), then removed from `from`. Run again
    /// after a crash, it schedules the same entry again (same id, replaced)
    /// or, the file gone from `from`, finds the message where the earlier
    /// run put it ([`scheduled_before`](Self::scheduled_before)).
    async fn schedule(
        &self,
        name: &FileName,
        from: &Location,
        until: Timestamp,
        arrivals: &mut BTreeSet<Id>,
    ) -> Result<Outcome, MailboxError> {
        let path = || self.mailboxes.path(from).join(name.to_string());
        let raw = self
            .mailboxes
            .read_array(from, std::slice::from_ref(name))
            .await?;
        if raw.names.is_empty() {
            if self.scheduled_before(name).await? {
                return Ok(Outcome::AlreadyDone);
            }
            return Err(MailboxError::NotFound {
                name: name.to_string(),
                from: self.mailboxes.path(from),
                to: crate::DataLayout::new(self.mailboxes.root()).scheduled(),
            });
        }
        let mut messages: Vec<Message> =
            serde_json::from_slice(&raw.json).map_err(|_| MailboxError::Corrupt(path()))?;
        let Some(message) = messages.pop() else {
            return Ok(Outcome::Done);
        };
        let entered = self.removals.enter([&message.to]).await;
        if entered.is_removed(&message.to) {
            tracing::warn!(target: "estafeta::event", message = %message.id, to = %message.to, "a message for a deleted mailbox discarded");
            return self.mailboxes.delete(from, name).await;
        }
        let kept = if until > self.now() {
            scheduled::schedule(&self.scheduled, &message, until)
                .await
                .map_err(|e| e.to_string())
        } else {
            let queue = Location::new(message.to.clone(), Folder::Messages);
            match self.mailboxes.write(&queue, &message).await {
                Ok(_) => {
                    arrivals.insert(message.to.clone());
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            }
        };
        drop(entered);
        if let Err(e) = kept {
            return Err(MailboxError::io(path(), std::io::Error::other(e)));
        }
        self.mailboxes.delete(from, name).await
    }
}

#[async_trait::async_trait]
impl MessageSteps for FileStore {
    /// The files are not written in a session store's transactions.
    fn put_in_step(
        &self,
        _step: &mut dyn estafeta_session::storage::Step,
        _at: &Location,
        _message: &Message,
    ) -> Result<Option<FileEntry>, MailboxError> {
        Ok(None)
    }

    async fn put(&self, at: &Location, message: &Message) -> Result<FileEntry, MailboxError> {
        let _writing = self.gate.enter().await;
        let entered = self.removals.enter([&at.mailbox]).await;
        if entered.is_removed(&at.mailbox) {
            return Err(MailboxError::NoMailbox(at.mailbox.clone()));
        }
        self.mailboxes.write(at, message).await
    }

    /// The file is written and fsynced while `when` is awaited, holding the
    /// mailbox against its removal as [`put`](MessageSteps::put) does.
    async fn put_when(
        &self,
        at: &Location,
        message: &Message,
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Option<FileEntry>, MailboxError> {
        let _writing = self.gate.enter().await;
        let entered = self.removals.enter([&at.mailbox]).await;
        if entered.is_removed(&at.mailbox) {
            return Err(MailboxError::NoMailbox(at.mailbox.clone()));
        }
        self.mailboxes.write_when(at, message, when).await
    }

    async fn settle(&self, at: &Location) -> Result<(), MailboxError> {
        self.mailboxes.settle(at).await
    }

    async fn schedule(&self, message: &Message, until: Timestamp) -> Result<(), MailboxError> {
        let entered = self.removals.enter([&message.to]).await;
        if entered.is_removed(&message.to) {
            return Err(MailboxError::NoMailbox(message.to.clone()));
        }
        scheduled::schedule(&self.scheduled, message, until)
            .await
            .map_err(|e| {
                MailboxError::io(
                    crate::DataLayout::new(self.mailboxes.root()).scheduled(),
                    std::io::Error::other(e),
                )
            })
    }

    async fn put_all(
        &self,
        at: &Location,
        messages: &[Message],
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let _writing = self.gate.enter().await;
        self.mailboxes.write_all_when(at, messages, when).await
    }

    /// The files are not written in a session store's transactions.
    fn put_all_in_step(
        &self,
        _step: &mut dyn estafeta_session::storage::Step,
        _at: &Location,
        _messages: &[Message],
    ) -> Result<Option<Vec<FileEntry>>, MailboxError> {
        Ok(None)
    }

    /// Moves first, all in one group commit (they share fsyncs), then the
    /// schedules, then the deletes; the files are not written in a session
    /// store's transactions (`step` is not used).
    async fn apply(
        &self,
        _step: Option<&mut dyn estafeta_session::storage::Step>,
        ops: &[Op],
    ) -> Applied {
        let _writing = self.gate.enter().await;
        let mut results: Vec<Option<Result<Outcome, MailboxError>>> =
            ops.iter().map(|_| None).collect();
        let mut arrivals = BTreeSet::new();
        // Moves into another mailbox (a reply delivered) hold it against
        // its removal; one into a removed mailbox deletes the message.
        let targets: BTreeSet<&Id> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Move { from, to, .. } if from.mailbox != to.mailbox => Some(&to.mailbox),
                _ => None,
            })
            .collect();
        let entered = self.removals.enter(targets.iter().copied()).await;
        let gone: HashSet<&Id> = targets
            .into_iter()
            .filter(|id| entered.is_removed(id))
            .collect();
        let (moved, moves): (Vec<usize>, Vec<_>) = ops
            .iter()
            .enumerate()
            .filter_map(|(i, op)| match op {
                Op::Move { name, from, to } if !gone.contains(&to.mailbox) => {
                    Some((i, (name.clone(), from.clone(), to.clone())))
                }
                _ => None,
            })
            .unzip();
        for (i, op) in ops.iter().enumerate() {
            if let Op::Move { name, from, to } = op
                && from.mailbox != to.mailbox
                && gone.contains(&to.mailbox)
            {
                tracing::warn!(target: "estafeta::event", message = %name.id, to = %to.mailbox, "a message for a deleted mailbox discarded");
                results[i] = Some(self.mailboxes.delete(from, name).await);
            }
        }
        let outcomes = self.mailboxes.move_all(&moves).await;
        drop(entered);
        for ((i, (_, _, to)), r) in moved.into_iter().zip(&moves).zip(outcomes) {
            if r.is_ok() && to.folder == Folder::Messages {
                arrivals.insert(to.mailbox.clone());
            }
            results[i] = Some(r);
        }
        for (i, op) in ops.iter().enumerate() {
            if let Op::Schedule { name, from, until } = op {
                results[i] = Some(self.schedule(name, from, *until, &mut arrivals).await);
            }
        }
        for (i, op) in ops.iter().enumerate() {
            if let Op::Delete { name, at } = op {
                results[i] = Some(self.mailboxes.delete(at, name).await);
            }
        }
        Applied {
            results: results.into_iter().flatten().collect(),
            arrivals,
        }
    }

    async fn delete_all(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Vec<Result<Outcome, MailboxError>> {
        let _writing = self.gate.enter().await;
        self.mailboxes.delete_all(at, names).await
    }
}

#[async_trait::async_trait]
impl MessageReads for FileStore {
    async fn select(
        &self,
        at: &Location,
        filter: &Filter,
        limits: Limits,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        self.mailboxes.select(at, filter, limits).await
    }

    async fn read_array(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Result<RawArray, MailboxError> {
        self.mailboxes.read_array(at, names).await
    }

    async fn count(&self, at: &Location) -> Result<usize, MailboxError> {
        self.mailboxes.count(at).await
    }

    async fn oldest(&self, at: &Location, n: usize) -> Result<Vec<FileName>, MailboxError> {
        self.mailboxes.oldest(at, n).await
    }

    async fn find(&self, at: &Location, id: MessageId) -> Result<Option<FileName>, MailboxError> {
        self.mailboxes.find(at, id).await
    }

    async fn find_all(
        &self,
        at: &Location,
        ids: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError> {
        let mut names = self.mailboxes.list_names(at).await?;
        names.retain(|n| ids.contains(&n.id));
        Ok(names)
    }

    /// Looks at the files themselves, not the folder indexes: a file put
    /// there by hand counts too.
    async fn delivered(&self, name: &FileName) -> Result<bool, MailboxError> {
        let paths: Vec<_> = [
            Folder::Messages,
            Folder::Log,
            Folder::Error,
            Folder::Unknown,
        ]
        .into_iter()
        .map(|f| {
            self.mailboxes
                .path(&Location::new(name.to.clone(), f))
                .join(name.to_string())
        })
        .collect();
        tokio::task::spawn_blocking(move || paths.iter().any(|p| p.exists()))
            .await
            .map_err(|e| MailboxError::Join(e.to_string()))
    }

    async fn list(&self, at: &Location) -> Result<Vec<FileEntry>, MailboxError> {
        self.mailboxes.list(at).await
    }
}

#[async_trait::async_trait]
impl MessageUpkeep for FileStore {
    async fn create_mailbox(&self, owner: &Id) -> Result<(), MailboxError> {
        let _writing = self.gate.enter().await;
        self.removals.restore(owner).await?;
        self.mailboxes.create_mailbox(owner).await
    }

    async fn remove_mailbox(&self, owner: &Id) -> Result<u64, MailboxError> {
        let _writing = self.gate.enter().await;
        self.removals.remove(owner).await?;
        let mut discarded = 0;
        for id in self.kept_for(owner).await? {
            if self
                .scheduled
                .cancel(&id)
                .await
                .map_err(|e| MailboxError::io(self.mailboxes.root(), std::io::Error::other(e)))?
            {
                discarded += 1;
            }
        }
        for folder in Folder::ALL {
            let at = Location::new(owner.clone(), folder);
            let names = self.mailboxes.list_names(&at).await?;
            for outcome in self.mailboxes.delete_all(&at, &names).await {
                outcome?;
            }
            discarded += names.len() as u64;
        }
        // The folder goes whole (temporary files of writes a crash cut
        // included, and spares). A spare made as the folder is emptied
        // fails its removal once: it is tried again.
        self.mailboxes.forget_spares(owner);
        let base = self.mailboxes.root().join(owner.as_str());
        let root = self.mailboxes.root().to_path_buf();
        let remove = move || {
            let mut tries = 0;
            loop {
                tries += 1;
                match std::fs::remove_dir_all(&base) {
                    Ok(()) => {
                        return estafeta_durable::sync_dir(&root)
                            .map_err(|e| MailboxError::io(&root, e));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && tries < 3 => {}
                    Err(e) => return Err(MailboxError::io(&base, e)),
                }
            }
        };
        tokio::task::spawn_blocking(remove)
            .await
            .map_err(|e| MailboxError::Join(e.to_string()))??;
        Ok(discarded)
    }

    /// Removes the spares, then makes every write durable (renames from
    /// spares need no folder fsync as they go) and leaves the clean stop's
    /// marker; if any step fails, no marker: the next start looks.
    async fn close(&self) {
        if !self.mailboxes.remove_spares().await {
            tracing::warn!(
                "a spare file was left at the stop: the next start looks for unpublished uploads"
            );
            return;
        }
        let layout = crate::DataLayout::new(self.mailboxes.root());
        if let Err(e) = blocking(move || leave_clean_stop(&layout)).await {
            tracing::warn!(error = %e, "the clean stop's marker was not made: the next start looks for unpublished uploads");
        }
    }

    async fn scheduled_for(&self, owner: &Id) -> Result<u64, MailboxError> {
        Ok(self.kept_for(owner).await?.len() as u64)
    }

    async fn remove_older_than(
        &self,
        at: &Location,
        cutoff: Timestamp,
        keep: &HashSet<MessageId>,
    ) -> Result<usize, MailboxError> {
        let _writing = self.gate.enter().await;
        self.mailboxes.remove_older_than(at, cutoff, keep).await
    }

    async fn recover_writes(&self, owner: &Id) -> Result<(), MailboxError> {
        let _writing = self.gate.enter().await;
        self.mailboxes.sweep_temp_files(owner).await.map(|_| ())
    }

    async fn unconfirmed_written(&self, owner: &Id) -> Result<Vec<Message>, MailboxError> {
        if self.left_clean {
            return Ok(Vec::new());
        }
        self.mailboxes.unconfirmed_written(owner).await
    }

    async fn publish_written(
        &self,
        owner: &Id,
        confirmed: &HashSet<MessageId>,
    ) -> Result<(), MailboxError> {
        if self.left_clean {
            return Ok(());
        }
        self.mailboxes.publish_written(owner, confirmed).await
    }

    async fn orphans(
        &self,
        db: &Id,
        referenced: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError> {
        let prepared = Location::new(db.clone(), Folder::Prepared);
        let mut names = self.mailboxes.list_names(&prepared).await?;
        names.retain(|n| !referenced.contains(&n.id));
        Ok(names)
    }

    fn count_as(&self, owner: &Id, kind: MailboxKind) {
        self.mailboxes.count_as(owner, kind);
    }

    async fn tallies(&self) -> Option<Tallies> {
        Some(self.mailboxes.tallies().await)
    }

    async fn holding(&self, folder: Folder) -> Option<Vec<(MailboxKind, Id)>> {
        Some(self.mailboxes.holding(folder).await)
    }
}

/// Whether the clean stop's `marker` is there; if so it is removed, and
/// its removal made durable, before anything of this run is written (a
/// crash later in the run must not find it).
fn took_clean_stop(marker: &Path) -> Result<bool, MailboxError> {
    match std::fs::remove_file(marker) {
        Ok(()) => {
            estafeta_durable::sync_parent(marker).map_err(|e| MailboxError::io(marker, e))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(MailboxError::io(marker, e)),
    }
}

/// Makes everything under the data folder durable, then the clean stop's
/// marker.
fn leave_clean_stop(layout: &crate::DataLayout) -> Result<(), MailboxError> {
    let root = layout.root();
    estafeta_durable::sync_file_system(root).map_err(|e| MailboxError::io(root, e))?;
    let marker = layout.clean_stop();
    let io = |e| MailboxError::io(&marker, e);
    std::fs::File::create(&marker)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    estafeta_durable::sync_parent(&marker).map_err(io)
}
