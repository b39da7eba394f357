//! The exchange's storage, behind traits: the protocol code reaches
//! messages only through [`MessageStore`] and the registry's records only
//! through [`RegistryStore`]; the session engine's storage
//! (`estafeta_session::Storage`) and the scheduler's
//! (`estafeta_repeat::store::Store`) are traits of their own crates.
//!
//! The embedded implementations are `FileStore` (one file per message
//! under the data folder, written through the [`mailbox`](crate::mailbox)
//! engine's group commit) and [`RedbRegistry`] (`registry.redb`). The traits
//! speak of places and messages, not of files, so that a transactional
//! backend (a SQL database) can implement them with rows: a batch of
//! [`Op`]s is then one transaction, and what the files need to survive a
//! crash half-way (temporary files swept, orphans moved to `Unknown`,
//! folder indexes checked against their directories) stays inside
//! `FileStore`.

#[cfg(any(test, feature = "test-support"))]
pub mod conformance;
mod files;
mod redb_registry;
mod registry;
mod removal;
pub(crate) mod scheduled;

pub(crate) use files::FileStore;
pub use redb_registry::RedbRegistry;
pub use registry::{Change, RegistryStore, Snapshot};
pub use scheduled::{Listed, SCHEDULED_SOURCE, Scheduled, WallClock, scheduled_entry};

pub use crate::mailbox::{
    FileEntry, FileName, Filter, Folder, KindTotals, Limits, Location, MailboxKind, Outcome,
    RawArray, Tallies, take_within,
};

use std::collections::{BTreeSet, HashSet};

use crate::error::MailboxError;
use crate::id::Id;
use crate::timestamp::Timestamp;
use crate::ulid_ids::MessageId;
use crate::wire::Message;

/// One change of a batch a protocol step makes. Idempotent: run again
/// (after a crash), an op finds itself done. A database's session record
/// keeps the batch of its step until the batch has run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// The message leaves `from` for `to`.
    Move {
        /// The message.
        name: FileName,
        /// Where it is.
        from: Location,
        /// Where it goes.
        to: Location,
    },
    /// The message is removed from `at`.
    Delete {
        /// The message.
        name: FileName,
        /// Where it is.
        at: Location,
    },
    /// The message leaves `from` and is scheduled for `until` (scheduled
    /// delivery); if that time has passed it goes into its recipient's
    /// `Messages` at once.
    Schedule {
        /// The message.
        name: FileName,
        /// Where it is.
        from: Location,
        /// When it is due.
        #[serde(rename = "at")]
        until: Timestamp,
    },
}

impl Op {
    /// `name` moved from one folder to another.
    pub(crate) fn mv(name: &FileName, from: (&Id, Folder), to: (&Id, Folder)) -> Op {
        Op::Move {
            name: name.clone(),
            from: Location::new(from.0.clone(), from.1),
            to: Location::new(to.0.clone(), to.1),
        }
    }

    /// `name` removed from a folder.
    pub(crate) fn delete(name: &FileName, at: (&Id, Folder)) -> Op {
        Op::Delete {
            name: name.clone(),
            at: Location::new(at.0.clone(), at.1),
        }
    }
}

/// What a batch of [`Op`]s did.
#[derive(Debug, Default)]
pub struct Applied {
    /// One result per op, in order. [`MailboxError::NotFound`] means the
    /// message was in none of the places the op names (lost, removed by
    /// hand or by retention); the caller counts the op as done.
    pub results: Vec<Result<Outcome, MailboxError>>,
    /// The recipients whose `Messages` received a message, or already held
    /// it when a move is run again (for push notifications).
    pub arrivals: BTreeSet<Id>,
}

/// Where messages live: the places (`Messages`, `Prepared`, `Log`,
/// `Unknown`, `Error`) of each database and device, and the messages scheduled
/// for their `deliver_at`. One store, seen through three ports by use: a
/// call's writes ([`MessageSteps`]), reads ([`MessageReads`]) and the
/// upkeep of mailboxes, start-up recovery, retention and totals
/// ([`MessageUpkeep`]); a type that implements the three is a
/// `MessageStore`.
///
/// Every write is durable when its call returns. A batch of [`Op`]s is the
/// changes of one protocol step: a transactional backend applies it
/// atomically (all or nothing); `FileStore` applies it op by op, each op
/// idempotent (an op already done counts as done), so that the lifecycle,
/// which records the batch before running it, can run it again after a
/// crash. Reads see every write that returned.
pub trait MessageStore: MessageSteps + MessageReads + MessageUpkeep {}

impl<S: MessageSteps + MessageReads + MessageUpkeep + ?Sized> MessageStore for S {}

/// The writes of a call or a protocol step: new messages (on their own,
/// or in a shared session store's step), batches of [`Op`]s, removals.
#[async_trait::async_trait]
pub trait MessageSteps: Send + Sync {
    /// Puts a new message into `at` ([`MailboxError::NoMailbox`] if its
    /// mailbox was removed).
    async fn put(&self, at: &Location, message: &Message) -> Result<FileEntry, MailboxError>;

    /// [`put`](Self::put), the message appearing only once `when` answers
    /// `true`: a store that can make it durable before it appears does so
    /// meanwhile (so that the caller's own durable step overlaps it). If
    /// `when` answers `false` or is dropped, nothing appears and the answer
    /// is `None`.
    ///
    /// A store may leave a message put into a `Messages` folder written
    /// but unpublished by a crash after its go-ahead: the next start asks
    /// the caller which such messages had their go-ahead
    /// ([`MessageUpkeep::unconfirmed_written`]). So the caller must be able
    /// to tell that from the message until it has [`settle`](Self::settle)d
    /// the folder.
    async fn put_when(
        &self,
        at: &Location,
        message: &Message,
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Option<FileEntry>, MailboxError> {
        match when.await {
            Ok(true) => self.put(at, message).await.map(Some),
            _ => Ok(None),
        }
    }

    /// Makes every message [`put_when`](Self::put_when) published into
    /// `at` so far durable under its name, so that no start asks about it
    /// again. Nothing to do for a store that publishes durably.
    async fn settle(&self, _at: &Location) -> Result<(), MailboxError> {
        Ok(())
    }

    /// Schedules a new message for `until`, when it enters its
    /// recipient's `Messages` ([`MailboxError::NoMailbox`] if the
    /// recipient's mailbox was removed).
    async fn schedule(&self, message: &Message, until: Timestamp) -> Result<(), MailboxError>;

    /// Puts a new message into `at` as part of `step`, the step a command
    /// holds in a shared session store (see
    /// [`Step::joint`](estafeta_session::storage::Step::joint)), when this
    /// store writes into that store's transactions: the message is then
    /// written with the step's next save or its end, and exists only once
    /// that succeeded (`Some`, its entry). `None`: this store cannot;
    /// nothing was done, and [`put`](Self::put) is the way.
    fn put_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        at: &Location,
        message: &Message,
    ) -> Result<Option<FileEntry>, MailboxError>;

    /// Puts several new messages into `at`, all or none, once `when`
    /// answers `true`: they are made durable meanwhile (so that the caller's
    /// own durable step overlaps them) and appear only then. If `when`
    /// answers `false` or is dropped, none appears and the answer is empty.
    async fn put_all(
        &self,
        at: &Location,
        messages: &[Message],
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Vec<FileEntry>, MailboxError>;

    /// Applies a protocol step's batch (see the trait's doc for atomicity).
    /// With `step`, the step a command holds in a shared session store
    /// (see [`Step::joint`](estafeta_session::storage::Step::joint)), a
    /// store that writes in that store's transactions applies the batch in
    /// the step's transaction: it takes effect with the step's next save or
    /// end, or not at all, and a step that lost its key changes nothing (a
    /// failure then answers for every op). Any other store, or no step,
    /// applies it on its own.
    async fn apply(
        &self,
        step: Option<&mut dyn estafeta_session::storage::Step>,
        ops: &[Op],
    ) -> Applied;

    /// Puts several new messages into `at` as part of `step` (as
    /// [`put_in_step`](Self::put_in_step)): `Some`, their entries; `None`:
    /// this store cannot, nothing was done, and
    /// [`put_all`](Self::put_all) is the way.
    fn put_all_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        at: &Location,
        messages: &[Message],
    ) -> Result<Option<Vec<FileEntry>>, MailboxError>;

    /// Removes messages of one place, each on its own (a message already
    /// gone counts as removed); one result per name, in order.
    async fn delete_all(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Vec<Result<Outcome, MailboxError>>;

    /// Moves those of `ids` that are in `from` to `to` as part of `step`
    /// (as [`put_in_step`](Self::put_in_step)): `Some`, the ids moved,
    /// which stay where they were unless the step's next save or its end
    /// succeeds. `None`: this store cannot; nothing was done, and
    /// [`apply`](Self::apply) is the way.
    async fn move_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        from: &Location,
        to: &Location,
        ids: &HashSet<MessageId>,
    ) -> Result<Option<Vec<MessageId>>, MailboxError> {
        let _ = (step, from, to, ids);
        Ok(None)
    }
}

/// What a call reads: a place's messages, their bodies, counts and
/// lookups.
#[async_trait::async_trait]
pub trait MessageReads: Send + Sync {
    /// The oldest messages of `at` that pass `filter`, within `limits`
    /// (a process start's choice).
    async fn select(
        &self,
        at: &Location,
        filter: &Filter,
        limits: Limits,
    ) -> Result<Vec<FileEntry>, MailboxError>;

    /// The bodies of `names` in `at` as one JSON array (`[m1,m2,…]`), built
    /// from the stored bytes; a message no longer there is left out.
    async fn read_array(&self, at: &Location, names: &[FileName])
    -> Result<RawArray, MailboxError>;

    /// How many messages `at` holds.
    async fn count(&self, at: &Location) -> Result<usize, MailboxError>;

    /// The `n` oldest messages of `at`.
    async fn oldest(&self, at: &Location, n: usize) -> Result<Vec<FileName>, MailboxError>;

    /// The `n` oldest messages of `at` as one JSON array, as
    /// [`read_array`](Self::read_array) builds it (a device's inbox). A
    /// store that reads names and bodies in one go overrides it.
    async fn oldest_array(&self, at: &Location, n: usize) -> Result<RawArray, MailboxError> {
        let names = self.oldest(at, n).await?;
        self.read_array(at, &names).await
    }

    /// [`oldest_array`](Self::oldest_array), with the change counter of a
    /// registry kept in the same shared store, read in the same round trip
    /// (as a session step's lock reads it,
    /// [`RegistryStore::version_in_step`]): a caller checks its token
    /// against it, with no read of its own. `None` (the default): the
    /// store reads no such counter.
    async fn oldest_array_and_registry(
        &self,
        at: &Location,
        n: usize,
    ) -> Result<(RawArray, Option<u64>), MailboxError> {
        Ok((self.oldest_array(at, n).await?, None))
    }

    /// The message `id` in `at`, if it is there.
    async fn find(&self, at: &Location, id: MessageId) -> Result<Option<FileName>, MailboxError>;

    /// Those of `ids` that are in `at`.
    async fn find_all(
        &self,
        at: &Location,
        ids: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError>;

    /// Whether the message is in `Messages`, `Log`, `Unknown` or `Error` of
    /// its recipient (delivered before: an upload or a scheduled delivery
    /// repeated after a crash is not delivered twice).
    async fn delivered(&self, name: &FileName) -> Result<bool, MailboxError>;

    /// Every message of `at`, oldest first (the operator's folder listing).
    async fn list(&self, at: &Location) -> Result<Vec<FileEntry>, MailboxError>;
}

/// Mailboxes made and removed, what start-up recovery and retention do,
/// and the running totals the administrator reads.
#[async_trait::async_trait]
pub trait MessageUpkeep: Send + Sync {
    /// Makes room for a new database or device (and checks, at start-up,
    /// that its places can be used). Doing it again is not an error.
    async fn create_mailbox(&self, owner: &Id) -> Result<(), MailboxError>;

    /// [`create_mailbox`](Self::create_mailbox) for each of `owners` (a
    /// start-up's check of every mailbox), one result each, in order. A
    /// store that makes many in one go overrides it.
    async fn create_mailboxes(&self, owners: &[Id]) -> Vec<Result<(), MailboxError>> {
        let mut made = Vec::with_capacity(owners.len());
        for owner in owners {
            made.push(self.create_mailbox(owner).await);
        }
        made
    }

    /// Removes everything of a deleted database or device, the messages
    /// scheduled for it included; how many messages there were. Called
    /// while the caller holds the owner's session. From then on nothing is
    /// written into the mailbox until it is made again
    /// ([`create_mailbox`](Self::create_mailbox)): a new message for it is
    /// refused ([`MailboxError::NoMailbox`]) and a message moved or scheduled
    /// for it by a batch is discarded. A write under way when the
    /// removal began either finishes first (and is removed with the rest)
    /// or finds the mailbox gone.
    async fn remove_mailbox(&self, owner: &Id) -> Result<u64, MailboxError>;

    /// How many messages are scheduled for their `deliver_at` for
    /// `owner`.
    async fn scheduled_for(&self, owner: &Id) -> Result<u64, MailboxError>;

    /// Removes the messages of `at` that arrived before `cutoff` (by the
    /// time in their id), except those in `keep`; how many were removed.
    async fn remove_older_than(
        &self,
        at: &Location,
        cutoff: Timestamp,
        keep: &HashSet<MessageId>,
    ) -> Result<usize, MailboxError>;

    /// Once after start-up, while the server serves: clears what writes
    /// interrupted by a crash left in the mailbox of `owner` (none was
    /// acknowledged), leaving this run's writes alone. Nothing to do for a
    /// transactional backend.
    async fn recover_writes(&self, owner: &Id) -> Result<(), MailboxError>;

    /// At start-up, before [`publish_written`](Self::publish_written):
    /// the messages [`put_when`](MessageSteps::put_when) wrote into the
    /// queue of database `owner` before a crash and did not publish,
    /// whether or not their go-ahead was given. The caller tells which
    /// were (the file store's written confirmed spares). None for a
    /// transactional backend.
    async fn unconfirmed_written(&self, _owner: &Id) -> Result<Vec<Message>, MailboxError> {
        Ok(Vec::new())
    }

    /// At start-up, before anything moves the messages of database
    /// `owner` (its recovery repeats the moves its processes recorded):
    /// makes every message whose write was acknowledged before a crash
    /// visible under its name (the file store's written durable spares),
    /// the [`unconfirmed_written`](Self::unconfirmed_written) ones only if
    /// their ids are in `confirmed` (the others are removed). Nothing to
    /// do for a transactional backend.
    async fn publish_written(
        &self,
        _owner: &Id,
        _confirmed: &HashSet<MessageId>,
    ) -> Result<(), MailboxError> {
        Ok(())
    }

    /// At a clean stop, once nothing more is written: lets go of what the
    /// store keeps ready for writes (the file store's spare files, so that
    /// a clean stop leaves none behind). Nothing to do for a transactional
    /// backend.
    async fn close(&self) {}

    /// The messages in the `Prepared` of database `db` that none of its
    /// processes refers to (`referenced`), asked for while the caller
    /// holds the database's session: left by a crash between writing a
    /// prepare's replies and recording them, or, with a store shared by
    /// several servers, stored by one that had lost the database's key.
    /// The caller moves or removes them.
    async fn orphans(
        &self,
        db: &Id,
        referenced: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError>;

    /// Counts the places of `owner` in the running totals
    /// ([`tallies`](Self::tallies)) as a mailbox of `kind`, from now on.
    /// Nothing to do for a store that keeps no running totals.
    fn count_as(&self, owner: &Id, kind: MailboxKind);

    /// Files in `Messages`, `Unknown` and `Error` over the mailboxes told
    /// to [`count_as`](Self::count_as), by kind, and the oldest waiting,
    /// kept as messages come and go; `None` for a store that keeps no
    /// running totals (the caller counts place by place).
    async fn tallies(&self) -> Option<Tallies>;

    /// The mailboxes told to [`count_as`](Self::count_as) whose `folder`
    /// (`Messages`, `Unknown` or `Error`) holds files, databases first, each
    /// kind in id order; `None` for a store that keeps no running totals
    /// (the caller looks at every mailbox).
    async fn holding(&self, folder: Folder) -> Option<Vec<(MailboxKind, Id)>>;
}
