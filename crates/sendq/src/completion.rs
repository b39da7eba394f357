//! Where an entry's outcome goes: the [`Completion`] the finalizer hands
//! each finished entry to.
//!
//! The queue stores the completion inline in the entry, so the queue is
//! generic over its type: a caller adding many entries picks a small type of
//! its own and adds without allocating, while [`OnDone`] (the default) takes
//! any callback, boxed, or the channel behind [`crate::SendQueue::submit`].

use tokio::sync::oneshot;

use crate::state::Done;

/// Receives an entry's outcome, once, on the finalizer task.
///
/// Implemented for every `FnOnce(Done<H, P, A>) + Send + 'static`, so a
/// closure of one named type (or a function) can be the queue's completion.
pub trait Completion<H, P, A>: Send + 'static {
    /// Takes the finished entry. Runs on the finalizer, one at a time and
    /// outside every lock of the queue; it should not wait.
    fn complete(self, done: Done<H, P, A>);
}

impl<H, P, A, F> Completion<H, P, A> for F
where
    F: FnOnce(Done<H, P, A>) + Send + 'static,
{
    fn complete(self, done: Done<H, P, A>) {
        self(done);
    }
}

/// The default completion: a boxed callback of any type (from
/// [`crate::SendQueue::add`]) or the channel a [`crate::Pending`] waits on
/// (from [`crate::SendQueue::submit`]).
pub struct OnDone<H, P, A>(Inner<H, P, A>);

/// A boxed completion callback.
type Callback<H, P, A> = Box<dyn FnOnce(Done<H, P, A>) + Send>;

enum Inner<H, P, A> {
    Callback(Callback<H, P, A>),
    Channel(oneshot::Sender<Done<H, P, A>>),
}

impl<H, P, A> OnDone<H, P, A> {
    /// Runs `callback` with the outcome.
    pub fn callback(callback: impl FnOnce(Done<H, P, A>) + Send + 'static) -> Self {
        Self(Inner::Callback(Box::new(callback)))
    }

    /// Sends the outcome on `tx`; a receiver that is gone is no error, the
    /// caller stopped waiting.
    pub fn channel(tx: oneshot::Sender<Done<H, P, A>>) -> Self {
        Self(Inner::Channel(tx))
    }
}

impl<H, P, A> Completion<H, P, A> for OnDone<H, P, A>
where
    H: Send + 'static,
    P: Send + Sync + 'static,
    A: Send + 'static,
{
    fn complete(self, done: Done<H, P, A>) {
        match self.0 {
            Inner::Callback(callback) => callback(done),
            Inner::Channel(tx) => {
                let _ = tx.send(done);
            }
        }
    }
}

impl<H, P, A> std::fmt::Debug for OnDone<H, P, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Inner::Callback(_) => "OnDone::Callback",
            Inner::Channel(_) => "OnDone::Channel",
        })
    }
}
