//! The future of [`Engine::get`](crate::Engine::get) and
//! [`Engine::try_get`](crate::Engine::try_get).
//!
//! Written by hand rather than as an `async fn`: the common case (the
//! session is free and ready) is one synchronous step on the first poll,
//! and the future then holds only the request. It spends the task's
//! cooperative budget the way Tokio's own locks do: when the budget is
//! spent it yields before taking the key, so that a task acquiring free
//! sessions in a loop still lets others run (among them a waiter it handed
//! a key to, and everyone queued behind that waiter). And right after its
//! thread handed a key to a waiter, it yields before taking another key, so
//! that the waiter, which holds the key from then on, runs at once.

use crate::data::State;
use crate::error::Error;
use crate::guard::{SessionGuard, complete};
use crate::key::SessionKey;
use crate::shard::{self, Entered, Held};
use crate::shared::Shared;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::oneshot;

type Slow<K, S> = Pin<Box<dyn Future<Output = Result<Option<SessionGuard<K, S>>, Error>> + Send>>;
type Handed<K, S> = oneshot::Receiver<Result<Held<K, S>, Error>>;
type Yield = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Exclusive access to a session, once it is free: see
/// [`Engine::get`](crate::Engine::get).
#[must_use = "a future does nothing unless awaited"]
pub struct Acquire<'a, K: SessionKey, S: State> {
    shared: &'a Shared<K, S>,
    wait: bool,
    create: bool,
    step: Step<K, S>,
}

/// Where an [`Acquire`] is. One field rather than one per step, so that
/// the finished future (the common case: done at the first poll) drops by
/// looking at one tag.
enum Step<K: SessionKey, S: State> {
    /// Not polled yet.
    Start(K),
    /// Letting the task that this thread just handed a key to run first
    /// (see [`shard::handed_over`]); boxed, as only a hand-over needs it.
    Yield(K, Yield),
    /// The yield is over: take the key now.
    Enter(K),
    /// In the key's queue, until the key is handed over. Kept unboxed:
    /// under contention this is the common case.
    Queued(Handed<K, S>),
    /// Loading, finalizing or recovering, boxed so that the future stays
    /// small.
    Slow(Slow<K, S>),
    /// Finished.
    Done,
}

impl<'a, K: SessionKey, S: State> Acquire<'a, K, S> {
    pub(crate) fn new(shared: &'a Shared<K, S>, key: K, wait: bool, create: bool) -> Self {
        Acquire {
            shared,
            wait,
            create,
            step: Step::Start(key),
        }
    }
}

/// The slow path's future, built out of line so that the fast path's
/// stack frame stays small.
#[cold]
#[inline(never)]
fn slow<K: SessionKey, S: State>(entered: Entered<K, S>, create: bool) -> Slow<K, S> {
    Box::pin(complete(entered, create))
}

/// The yield after a hand-over, built out of line like [`slow`].
#[cold]
#[inline(never)]
fn yield_now() -> Yield {
    Box::pin(tokio::task::yield_now())
}

// Nothing in it is pinned in place: the key is moved out, the queue's
// receiver is `Unpin`, and the futures it polls are boxed.
impl<K: SessionKey, S: State> Unpin for Acquire<'_, K, S> {}

impl<K: SessionKey, S: State> Future for Acquire<'_, K, S> {
    type Output = Result<Option<SessionGuard<K, S>>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            this.step = match std::mem::replace(&mut this.step, Step::Done) {
                Step::Start(key) if shard::handed_over() => Step::Yield(key, yield_now()),
                Step::Start(key) | Step::Enter(key) => {
                    let coop = match tokio::task::coop::poll_proceed(cx) {
                        Poll::Ready(coop) => coop,
                        Poll::Pending => {
                            this.step = Step::Enter(key);
                            return Poll::Pending;
                        }
                    };
                    coop.made_progress();
                    match this.shared.enter(key, this.wait) {
                        Err(e) => return Poll::Ready(Err(e)),
                        Ok(Entered::Ready(held))
                            if held
                                .session()
                                .is_some_and(|s| !this.shared.core().needs_ready(s)) =>
                        {
                            return Poll::Ready(Ok(SessionGuard::from_held(held)));
                        }
                        Ok(Entered::Queued(rx)) => Step::Queued(rx),
                        Ok(entered) => Step::Slow(slow(entered, this.create)),
                    }
                }
                Step::Yield(key, mut y) => match y.as_mut().poll(cx) {
                    Poll::Ready(()) => Step::Enter(key),
                    Poll::Pending => {
                        this.step = Step::Yield(key, y);
                        return Poll::Pending;
                    }
                },
                Step::Queued(mut rx) => {
                    let held = match Pin::new(&mut rx).poll(cx) {
                        Poll::Pending => {
                            this.step = Step::Queued(rx);
                            return Poll::Pending;
                        }
                        Poll::Ready(Err(_)) => return Poll::Ready(Err(Error::Stopping)),
                        Poll::Ready(Ok(Err(e))) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(Ok(held))) => held,
                    };
                    let core = this.shared.core();
                    if held.session().is_some_and(|s| !core.needs_ready(s)) {
                        return Poll::Ready(Ok(SessionGuard::from_held(held)));
                    }
                    Step::Slow(slow(Entered::Held(held), this.create))
                }
                Step::Slow(mut f) => match f.as_mut().poll(cx) {
                    Poll::Ready(result) => return Poll::Ready(result),
                    Poll::Pending => {
                        this.step = Step::Slow(f);
                        return Poll::Pending;
                    }
                },
                // Polled again after it finished.
                Step::Done => return Poll::Ready(Err(Error::Lost)),
            };
        }
    }
}
