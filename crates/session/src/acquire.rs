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

/// Exclusive access to a session, once it is free: see
/// [`Engine::get`](crate::Engine::get).
#[must_use = "a future does nothing unless awaited"]
pub struct Acquire<'a, K: SessionKey, S: State> {
    shared: &'a Shared<K, S>,
    /// The key, until the first step takes it.
    key: Option<K>,
    wait: bool,
    create: bool,
    /// In the key's queue, until the key is handed over. Kept unboxed:
    /// under contention this is the common case.
    queued: Option<Handed<K, S>>,
    /// Loading, finalizing or recovering, boxed so that the future stays
    /// small.
    slow: Option<Slow<K, S>>,
    /// Letting the task that this thread just handed a key to run first
    /// (see [`shard::handed_over`]); boxed, as only a hand-over needs it.
    yielding: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<'a, K: SessionKey, S: State> Acquire<'a, K, S> {
    pub(crate) fn new(shared: &'a Shared<K, S>, key: K, wait: bool, create: bool) -> Self {
        Acquire {
            shared,
            key: Some(key),
            wait,
            create,
            queued: None,
            slow: None,
            yielding: None,
        }
    }
}

/// The slow path's future, built out of line so that the fast path's
/// stack frame stays small.
#[cold]
#[inline(never)]
fn slow<K: SessionKey, S: State>(entered: Entered<K, S>, create: bool) -> Slow<K, S> {
    Box::pin(shard::complete(entered, create))
}

// Nothing in it is pinned in place: the key is moved out, the queue's
// receiver is `Unpin`, and the slow path is boxed.
impl<K: SessionKey, S: State> Unpin for Acquire<'_, K, S> {}

impl<K: SessionKey, S: State> Future for Acquire<'_, K, S> {
    type Output = Result<Option<SessionGuard<K, S>>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.key.is_some() && this.yielding.is_none() && shard::handed_over() {
            this.yielding = Some(Box::pin(tokio::task::yield_now()));
        }
        if let Some(y) = this.yielding.as_mut() {
            std::task::ready!(y.as_mut().poll(cx));
            this.yielding = None;
        }
        if let Some(key) = this.key.take() {
            let coop = match tokio::task::coop::poll_proceed(cx) {
                Poll::Ready(coop) => coop,
                Poll::Pending => {
                    this.key = Some(key);
                    return Poll::Pending;
                }
            };
            coop.made_progress();
            match this.shared.enter(key, this.wait) {
                Err(e) => return Poll::Ready(Err(e)),
                Ok(Entered::Ready(guard)) if !this.shared.core().needs_ready(&guard) => {
                    return Poll::Ready(Ok(Some(guard)));
                }
                Ok(Entered::Queued(rx)) => this.queued = Some(rx),
                Ok(entered) => this.slow = Some(slow(entered, this.create)),
            }
        }
        if let Some(rx) = this.queued.as_mut() {
            let held = match Pin::new(rx).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => Err(Error::Stopping),
                Poll::Ready(Ok(result)) => result,
            };
            this.queued = None;
            let held = match held {
                Ok(held) => held,
                Err(e) => return Poll::Ready(Err(e)),
            };
            let core = this.shared.core();
            if held.session().is_some_and(|s| !core.needs_ready(s)) {
                return Poll::Ready(Ok(held.into_guard()));
            }
            this.slow = Some(slow(Entered::Held(held), this.create));
        }
        match this.slow.as_mut() {
            Some(f) => {
                let result = std::task::ready!(f.as_mut().poll(cx));
                this.slow = None;
                Poll::Ready(result)
            }
            // Polled again after it finished.
            None => Poll::Ready(Err(Error::Lost)),
        }
    }
}
