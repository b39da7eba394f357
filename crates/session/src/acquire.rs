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
use crate::shard::{self, Entered};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

type Slow<K, S> = Pin<Box<dyn Future<Output = Result<Option<SessionGuard<K, S>>, Error>> + Send>>;

/// Exclusive access to a session, once it is free: see
/// [`Engine::get`](crate::Engine::get).
#[must_use = "a future does nothing unless awaited"]
pub struct Acquire<'a, K: SessionKey, S: State> {
    shared: &'a Shared<K, S>,
    /// Key, whether to wait, whether to create; taken by the first step.
    request: Option<(K, bool, bool)>,
    /// The slow path, boxed so that the common case stays small: waiting
    /// in the key's queue, loading, finalizing.
    slow: Option<Slow<K, S>>,
}

impl<'a, K: SessionKey, S: State> Acquire<'a, K, S> {
    pub(crate) fn new(shared: &'a Shared<K, S>, key: K, wait: bool, create: bool) -> Self {
        Acquire {
            shared,
            request: Some((key, wait, create)),
            slow: None,
        }
    }
}

// Nothing in it is pinned in place: the key is moved out, and the slow
// path is boxed.
impl<K: SessionKey, S: State> Unpin for Acquire<'_, K, S> {}

impl<K: SessionKey, S: State> Future for Acquire<'_, K, S> {
    type Output = Result<Option<SessionGuard<K, S>>, Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some((key, wait, create)) = this.request.take() {
            let coop = match tokio::task::coop::poll_proceed(cx) {
                Poll::Ready(coop) => coop,
                Poll::Pending => {
                    this.request = Some((key, wait, create));
                    return Poll::Pending;
                }
            };
            coop.made_progress();
            match this.shared.enter(key, wait) {
                Err(e) => return Poll::Ready(Err(e)),
                Ok(Entered::Ready(guard)) if !this.shared.core().needs_ready(&guard) => {
                    return Poll::Ready(Ok(Some(guard)));
                }
                Ok(entered) => this.slow = Some(Box::pin(shard::complete(entered, create))),
            }
        }
        let Some(slow) = this.slow.as_mut() else {
            // Polled again after it finished.
            return Poll::Ready(Err(Error::Lost));
        };
        let result = ready!(slow.as_mut().poll(cx));
        this.slow = None;
        Poll::Ready(result)
    }
}
