//! The transport contract: how the queue hands one entry to a real protocol.
//!
//! "Sent" and "answered" are separate events: the future
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

impl<'a, H, P> Request<'a, H, P> {
    /// The same entry with another payload: a part of this one, for a
    /// transport that dispatches each kind of payload to its own transport.
    pub fn with_payload<Q>(self, payload: &'a Q) -> Request<'a, H, Q> {
        Request {
            host: self.host,
            kind: self.kind,
            payload,
        }
    }
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
    slot: Mutex<Slot<A>>,
    sink: Arc<dyn ReplySink<A>>,
}

/// The parking slot of one worker.
struct Slot<A> {
    /// The entry whose send is running; `None` between sends. Every `u64`
    /// is a possible entry key, so "no send" is not a key value.
    sending: Option<u64>,
    answer: Option<EarlyAnswer<A>>,
}

impl<A> Parking<A> {
    pub(crate) fn new(sink: Arc<dyn ReplySink<A>>) -> Self {
        Self {
            slot: Mutex::new(Slot {
                sending: None,
                answer: None,
            }),
            sink,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot<A>> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The worker is about to call the transport for entry `id`.
    pub(crate) fn open(&self, id: u64) {
        *self.lock() = Slot {
            sending: Some(id),
            answer: None,
        };
    }

    /// The transport's send returned: later answers go to the queue itself.
    pub(crate) fn close(&self) -> Option<EarlyAnswer<A>> {
        let mut slot = self.lock();
        slot.sending = None;
        slot.answer.take()
    }

    /// Parks the answer if entry `id`'s send is still running; gives it back otherwise.
    fn park(&self, id: u64, answer: EarlyAnswer<A>) -> Option<EarlyAnswer<A>> {
        let mut slot = self.lock();
        if slot.sending == Some(id) && slot.answer.is_none() {
            slot.answer = Some(answer);
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

#[cfg(test)]
mod tests {
    use super::*;

    type Settled = (u64, Result<u32, SendError>, bool);

    /// Records what reaches the queue.
    #[derive(Default)]
    struct Sink(Mutex<Vec<Settled>>);

    impl ReplySink<u32> for Sink {
        fn settle(&self, id: u64, result: Result<u32, SendError>, abandoned: bool) {
            self.0.lock().unwrap().push((id, result, abandoned));
        }
    }

    fn parking() -> (Arc<Sink>, Arc<Parking<u32>>) {
        let sink = Arc::new(Sink::default());
        let parking = Arc::new(Parking::new(Arc::clone(&sink) as Arc<dyn ReplySink<u32>>));
        (sink, parking)
    }

    #[test]
    fn an_answer_during_the_send_is_parked_for_the_worker() {
        let (sink, parking) = parking();
        parking.open(7);
        Reply::new(7, Arc::clone(&parking)).answer(Ok(1));
        assert!(matches!(parking.close(), Some((Ok(1), false))));
        assert!(sink.0.lock().unwrap().is_empty());
    }

    /// Entry keys carry a 32-bit generation that wraps, so slot 0 of the
    /// entry slab hands out key 0 once in every 2^32 uses of that slot.
    #[test]
    fn a_late_answer_for_key_0_reaches_the_queue() {
        let (sink, parking) = parking();
        parking.open(0);
        let reply = Reply::new(0, Arc::clone(&parking));
        assert!(parking.close().is_none());
        reply.answer(Ok(5));
        let settled = sink.0.lock().unwrap();
        assert!(
            matches!(settled.as_slice(), [(0, Ok(5), false)]),
            "{settled:?}"
        );
    }
}
