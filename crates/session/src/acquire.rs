//! The future of [`Engine::get`](crate::Engine::get) and
//! [`Engine::try_get`](crate::Engine::try_get).
//!
//! Written by hand rather than as an `async fn`: the common case (the
//! session is free and ready) is one synchronous step on the first poll,
//! and the future then holds only the request. It spends the task's
//! cooperative budget the way Tokio's own locks do: when the budget is
//! spent it yields before taking the key, so that a task acquiring free
//! sessions in a loop still lets others run (among them a waiter it handed
//! a key to, and everyone queued behind that waiter).

use crate::engine::{Shared, State};
use crate::error::Error;
use crate::guard::SessionGuard;
use crate::key::SessionKey;
use crate::shard::{self, Entered, Held};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::oneshot;

type Slow<K, S> = Pin<Box<dyn Future<Output = Result<Option<SessionGuard<K, S>>, Error>> + Send>>;
type Handed<K, S> = oneshot::Receiver<Result<Held<K, S>, Error>>;

/// Where an acquire is.
enum Step<K: SessionKey, S: State> {
    /// Not polled yet: key, whether to wait, whether to create.
    Start(K, bool, bool),
    /// In the key's queue, until the key is handed over (and whether to
    /// create). Kept unboxed: under contention this is the common case.
    Queued(Handed<K, S>, bool),
    /// Loading, finalizing or recovering, boxed so that the future stays
    /// small.
    Slow(Slow<K, S>),
    Done,
}

/// Exclusive access to a session, once it is free: see
/// [`Engine::get`](crate::Engine::get).
#[must_use = "a future does nothing unless awaited"]
pub struct Acquire<'a, K: SessionKey, S: State> {
    shared: &'a Shared<K, S>,
    step: Step<K, S>,
}

impl<'a, K: SessionKey, S: State> Acquire<'a, K, S> {
    pub(crate) fn new(shared: &'a Shared<K, S>, key: K, wait: bool, create: bool) -> Self {
        Acquire {
            shared,
            step: Step::Start(key, wait, create),
        }
    }
}

// Nothing in it is pinned in place: the key is moved out, the queue's
// receiver is `Unpin`, and the slow path is boxed.
impl<K: SessionKey, S: State> Unpin for Acquire<'_, K, S> {}

impl<K: SessionKey, S: State> Future for Acquire<'_, K, S> {
    type Output = Result<Option<SessionGuard<K, S>>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match std::mem::replace(&mut this.step, Step::Done) {
                Step::Start(key, wait, create) => {
                    let coop = match tokio::task::coop::poll_proceed(cx) {
                        Poll::Ready(coop) => coop,
                        Poll::Pending => {
                            this.step = Step::Start(key, wait, create);
                            return Poll::Pending;
                        }
                    };
                    coop.made_progress();
                    this.step = match this.shared.enter(key, wait) {
                        Err(e) => return Poll::Ready(Err(e)),
                        Ok(Entered::Ready(guard)) if !this.shared.core().needs_ready(&guard) => {
                            return Poll::Ready(Ok(Some(guard)));
                        }
                        Ok(Entered::Queued(rx)) => Step::Queued(rx, create),
                        Ok(entered) => Step::Slow(Box::pin(shard::complete(entered, create))),
                    };
                }
                Step::Queued(mut rx, create) => {
                    let held = match Pin::new(&mut rx).poll(cx) {
                        Poll::Pending => {
                            this.step = Step::Queued(rx, create);
                            return Poll::Pending;
                        }
                        Poll::Ready(Err(_)) => return Poll::Ready(Err(Error::Stopping)),
                        Poll::Ready(Ok(Err(e))) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(Ok(held))) => held,
                    };
                    let core = this.shared.core();
                    if held.session().is_some_and(|s| !core.needs_ready(s)) {
                        return Poll::Ready(Ok(held.into_guard()));
                    }
                    this.step = Step::Slow(Box::pin(shard::complete(Entered::Held(held), create)));
                }
                Step::Slow(mut slow) => match slow.as_mut().poll(cx) {
                    Poll::Pending => {
                        this.step = Step::Slow(slow);
                        return Poll::Pending;
                    }
                    Poll::Ready(result) => return Poll::Ready(result),
                },
                // Polled again after it finished.
                Step::Done => return Poll::Ready(Err(Error::Lost)),
            }
        }
    }
}
