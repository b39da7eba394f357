//! The transport contract: how the queue hands one entry to a real protocol.
//!
//! "Sent" and "answered" are separate events, as in the seed: the future
//! returned by [`Transport::send`] resolving is the *sent* event (the request
//! is written out and the host may take its next send), and the [`Reply`] is
//! how the *answer* comes back, at any later time and from any task. Only the
//! answer (or an error) frees the entry's window slot.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::Kind;
use crate::error::SendError;

/// One entry as handed to a transport: borrowed from the send worker that
/// holds the entry while it is written, so handing it over copies nothing.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a, H, P> {
    /// The host the entry is for.
    pub host: &'a H,
    /// The entry's request type.
    pub kind: Kind,
    /// The entry's payload.
    pub payload: &'a P,
}

/// Sends entries to hosts over one protocol.
pub trait Transport<H, P>: Send + Sync + 'static {
    /// What a successful answer carries back to the entry's completion.
    type Answer: Send + 'static;

    /// Writes `request` out. Resolving `Ok(())` is the *sent* event; the answer
    /// goes through `reply`, which may be answered before this resolves (the
    /// queue then completes the entry after the sent event, exactly once).
    /// Resolving `Err` means the request could not be written; the entry fails
    /// with that error unless `reply` already answered it.
    fn send(
        &self,
        request: Request<'_, H, P>,
        reply: Reply<Self::Answer>,
    ) -> impl Future<Output = Result<(), SendError>> + Send;
}

/// Where a [`Reply`] delivers its answer: the queue, behind a trait object so
/// that `Reply` carries only the answer type.
pub(crate) trait ReplySink<A>: Send + Sync {
    /// Records the outcome of entry `id`; `abandoned` when the reply was
    /// dropped unanswered rather than answered.
    fn settle(&self, id: u64, result: Result<A, SendError>, abandoned: bool);
}

/// The way back for one entry's answer. Answer it once; dropping it unanswered
/// fails the entry with [`SendError::ConnectionAborted`], so no entry is lost
/// by a transport that forgets it.
pub struct Reply<A: Send + 'static> {
    id: u64,
    parking: Option<Arc<Parking<A>>>,
}

/// An answer that came while the transport's send was still running: the
/// answer and whether the reply was only dropped.
pub(crate) type EarlyAnswer<A> = (Result<A, SendError>, bool);

/// Where an answer given while its worker is still inside
/// [`Transport::send`] waits for the worker, so the common "answered at once"
/// case takes no queue lock of its own.
pub(crate) struct Parking<A> {
    slot: Mutex<(u64, Option<EarlyAnswer<A>>)>,
    sink: Arc<dyn ReplySink<A>>,
}

impl<A> Parking<A> {
    pub(crate) fn new(sink: Arc<dyn ReplySink<A>>) -> Self {
        Self {
            slot: Mutex::new((0, None)),
            sink,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Option<EarlyAnswer<A>>)> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The worker is about to call the transport for entry `id`.
    pub(crate) fn open(&self, id: u64) {
        *self.lock() = (id, None);
    }

    /// The transport's send returned: later answers go to the queue itself.
    pub(crate) fn close(&self) -> Option<EarlyAnswer<A>> {
        let mut slot = self.lock();
        slot.0 = 0;
        slot.1.take()
    }

    /// Parks the answer if entry `id`'s send is still running; gives it back otherwise.
    fn park(&self, id: u64, answer: EarlyAnswer<A>) -> Option<EarlyAnswer<A>> {
        let mut slot = self.lock();
        if slot.0 == id && slot.1.is_none() {
            slot.1 = Some(answer);
            None
        } else {
            Some(answer)
        }
    }
}

impl<A: Send + 'static> Reply<A> {
    pub(crate) fn new(id: u64, parking: Arc<Parking<A>>) -> Self {
        Self {
            id,
            parking: Some(parking),
        }
    }

    fn settle(&mut self, result: Result<A, SendError>, abandoned: bool) {
        if let Some(parking) = self.parking.take()
            && let Some((result, abandoned)) = parking.park(self.id, (result, abandoned))
        {
            parking.sink.settle(self.id, result, abandoned);
        }
    }

    /// Delivers the answer (or the error) for this entry.
    pub fn answer(mut self, result: Result<A, SendError>) {
        self.settle(result, false);
    }
}

impl<A: Send + 'static> Drop for Reply<A> {
    fn drop(&mut self) {
        self.settle(Err(SendError::ConnectionAborted), true);
    }
}

impl<A: Send + 'static> std::fmt::Debug for Reply<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply").field("id", &self.id).finish()
    }
}
