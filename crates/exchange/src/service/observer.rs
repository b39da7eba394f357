//! Telling the server's metrics of the exchange's durable commits: the
//! [`CommitObserver`] the server gives (in [`super::Quiesce::observed`]),
//! told by the message store's writes ([`Messages`]) and the session
//! stores' commits (`sessions::Namespace`, with [`TimedStep`] for a
//! shared store's steps).

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use estafeta_session::storage::{Pending, Step, Write};

use crate::error::MailboxError;
use crate::store::{Applied, FileEntry, Folder, Location, MessageStore, Op, Outcome};
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
    /// A durable commit of `what` took `took` (a backup's pause included).
    fn committed(&self, what: Durable, took: Duration);
    /// `n` messages arrived in their recipients' `Messages` folders
    /// (uploads, replies on commit, scheduled deliveries).
    fn delivered(&self, n: u64);
    /// A process ended in `state`, or went in doubt (`IN_DOUBT`).
    fn ended(&self, state: crate::wire::ProcessState);
}

/// Tells `observer`, if there is one, that a commit of `what` begun at
/// `started` ended.
pub(crate) fn committed(
    observer: Option<&Arc<dyn CommitObserver>>,
    what: Durable,
    started: Instant,
) {
    if let Some(o) = observer {
        o.committed(what, started.elapsed());
    }
}

/// The message store as the exchange writes it: each write's commit, and
/// the messages it brought into `Messages` folders, told to the observer.
/// Reads go straight to the store.
pub(crate) struct Messages {
    store: Arc<dyn MessageStore>,
    observer: Option<Arc<dyn CommitObserver>>,
}

impl Deref for Messages {
    type Target = dyn MessageStore;

    fn deref(&self) -> &Self::Target {
        &*self.store
    }
}

impl Messages {
    /// `store`, its writes told to `observer`.
    pub(crate) fn new(
        store: Arc<dyn MessageStore>,
        observer: Option<Arc<dyn CommitObserver>>,
    ) -> Messages {
        Messages { store, observer }
    }

    /// Tells the observer of a write begun at `started` that brought `n`
    /// messages into `Messages` folders.
    fn wrote(&self, started: Instant, n: usize) {
        committed(self.observer.as_ref(), Durable::Messages, started);
        if let (Some(o), 1..) = (&self.observer, n) {
            o.delivered(n as u64);
        }
    }

    /// Tells the observer of `n` messages a session's step brought into
    /// `Messages` folders, durable with its commit (timed with the step's
    /// commit, not here).
    pub(crate) fn delivered_in_step(&self, n: u64) {
        if let Some(o) = &self.observer {
            o.delivered(n);
        }
    }

    /// [`MessageSteps::put`](crate::store::MessageSteps::put), observed.
    pub(crate) async fn put(
        &self,
        at: &Location,
        message: &Message,
    ) -> Result<FileEntry, MailboxError> {
        let started = Instant::now();
        let put = self.store.put(at, message).await;
        self.wrote(
            started,
            usize::from(put.is_ok() && at.folder == Folder::Messages),
        );
        put
    }

    /// [`MessageSteps::put_when`](crate::store::MessageSteps::put_when), observed.
    pub(crate) async fn put_when(
        &self,
        at: &Location,
        message: &Message,
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Option<FileEntry>, MailboxError> {
        let started = Instant::now();
        let put = self.store.put_when(at, message, when).await;
        let arrived = matches!(put, Ok(Some(_))) && at.folder == Folder::Messages;
        self.wrote(started, usize::from(arrived));
        put
    }

    /// [`MessageSteps::put_all`](crate::store::MessageSteps::put_all), observed.
    pub(crate) async fn put_all(
        &self,
        at: &Location,
        messages: &[Message],
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let started = Instant::now();
        let put = self.store.put_all(at, messages, when).await;
        let arrived = match (&put, at.folder) {
            (Ok(entries), Folder::Messages) => entries.len(),
            _ => 0,
        };
        self.wrote(started, arrived);
        put
    }

    /// [`MessageSteps::apply`](crate::store::MessageSteps::apply), observed: the moves into a `Messages`
    /// folder made by this call count as arrivals (not the ones a
    /// repeated step finds done already).
    pub(crate) async fn apply(&self, step: Option<&mut dyn Step>, ops: &[Op]) -> Applied {
        let started = Instant::now();
        let applied = self.store.apply(step, ops).await;
        let arrived = ops
            .iter()
            .zip(&applied.results)
            .filter(|(op, result)| {
                matches!(op, Op::Move { to, from, .. }
                    if to.folder == Folder::Messages && from.folder != Folder::Messages)
                    && matches!(result, Ok(Outcome::Done))
            })
            .count();
        self.wrote(started, arrived);
        applied
    }
}

/// A step of a shared store whose commits with a write (a save, a final
/// write) are told to the observer as session commits, as the embedded
/// store's write batches are. A save's time includes taking the key again
/// after its commit, which the command waits for too.
pub(crate) struct TimedStep {
    pub(crate) inner: Box<dyn Step>,
    pub(crate) observer: Arc<dyn CommitObserver>,
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
                committed(Some(&self.observer), Durable::Sessions, started);
            }
            saved
        })
    }

    fn held(&self) -> bool {
        self.inner.held()
    }

    fn finish<'a>(self: Box<Self>, write: Option<&'a Write>) -> Pending<'a, ()> {
        let TimedStep { inner, observer } = *self;
        Box::pin(async move {
            let started = Instant::now();
            let finished = inner.finish(write).await;
            if finished.is_ok() && write.is_some() {
                committed(Some(&observer), Durable::Sessions, started);
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
