//! A send worker: under one lock acquisition it records the sent events of
//! its last batch and takes the next batch of jobs (runs of one host's ready
//! entries, hosts round-robin); it then writes them one after another outside
//! the lock. Per entry that leaves a few field moves, one call of the
//! transport and no task wake-up while the queue is busy.
//!
//! A transport that makes the worker wait (a real network write) must not
//! hold back the rest of the batch, so the worker hands the rest back to the
//! queue, where other workers take it, and its next batch is a single job; a
//! batch whose every write finished at once lets the next one double, up to
//! [`MAX_BATCH`].
//!
//! A job owns its entry's host and payload while the worker writes it (the
//! transport borrows them) and returns them with the sent event. Shutting
//! down drops a send that is still waiting on its transport, so every entry
//! comes back, and is finalized, without waiting on a host.

use std::collections::VecDeque;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use crate::completion::Completion;
use crate::error::{SendError, TransportError};
use crate::shared::{Closing, Shared};
use crate::state::Written;
use crate::transport::{Parking, Reply, ReplySink, Transport};

/// Most jobs a worker takes under one lock acquisition.
const MAX_BATCH: usize = 128;

/// One send worker; see the module documentation.
pub(crate) async fn work<H, P, T, C>(index: usize, shared: Arc<Shared<H, P, T, C>>)
where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
    C: Completion<H, P, T::Answer>,
{
    // The worker's own parking spot; replies clone this rather than the
    // shared queue, whose reference count every worker would fight over.
    let sink: Arc<dyn ReplySink<T::Answer>> = shared.clone();
    let parking = Arc::new(Parking::new(sink));
    let mut jobs = VecDeque::new();
    let mut written = Vec::new();
    let mut limit = 1;
    // Idle from the start: the first work wakes it.
    shared.workers[index].notified().await;
    loop {
        let (mut seen, idle) = {
            let mut st = shared.lock();
            st.written(&mut written);
            if st.is_closed() {
                // The finalizer may be waiting for the entries just written.
                shared.release(st);
                return;
            }
            st.absorb();
            st.pick(&mut jobs, limit);
            let idle = jobs.is_empty() && st.idle(index);
            // Read under the lock, so a later change is one these jobs have not seen.
            let seen = shared.changes.load(Ordering::Acquire);
            shared.release(st);
            (seen, idle)
        };
        if idle {
            shared.workers[index].notified().await;
            continue;
        }
        if jobs.is_empty() {
            // Entries came in after this lock's look at the intake.
            continue;
        }
        let mut waited = false;
        while let Some(mut job) = jobs.pop_front() {
            if shared.changes.load(Ordering::Acquire) != seen {
                let mut st = shared.lock();
                seen = shared.changes.load(Ordering::Acquire);
                let checked = st.before_write(job);
                shared.release(st);
                match checked {
                    Some(checked) => job = checked,
                    None => continue,
                }
            }
            parking.open(job.id);
            let result = {
                let reply = Reply::new(job.id, Arc::clone(&parking));
                let mut send = CatchPanic(pin!(shared.transport.send(job.request(), reply)));
                match std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut send).poll(cx))).await {
                    Poll::Ready(result) => result,
                    Poll::Pending => {
                        waited = true;
                        if !jobs.is_empty() || !written.is_empty() {
                            let mut st = shared.lock();
                            st.written(&mut written);
                            st.hand_back(&mut jobs);
                            shared.release(st);
                        }
                        until_closed(&shared.closing, send).await
                    }
                }
            };
            // The send (and with it an unanswered reply) is gone: whatever
            // answer came is parked.
            written.push(Written {
                job,
                result,
                parked: parking.close(),
            });
        }
        limit = if waited {
            1
        } else {
            (limit * 2).min(MAX_BATCH)
        };
        // Lets the finalizer (woken on this thread) and every other task run
        // between batches, however busy the queue is.
        tokio::task::yield_now().await;
    }
}

/// Waits for a send that did not finish at once, unless the queue shuts down
/// first: the send is then dropped and its entry fails with
/// [`SendError::ShuttingDown`], so shutting down never waits on a transport.
async fn until_closed<F>(closing: &Closing, send: F) -> Result<(), SendError>
where
    F: Future<Output = Result<(), SendError>>,
{
    let mut closed = pin!(closing.notify.notified());
    closed.as_mut().enable();
    if closing.done.load(Ordering::Acquire) {
        return Err(SendError::ShuttingDown);
    }
    tokio::select! {
        result = send => result,
        () = closed => Err(SendError::ShuttingDown),
    }
}

/// Turns a panic inside a transport's send into an error for that entry, so
/// a transport bug costs one entry, not a send worker.
struct CatchPanic<F>(F);

impl<F: Future<Output = Result<(), SendError>> + Unpin> Future for CatchPanic<F> {
    type Output = Result<(), SendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(poll) => poll,
            Err(_) => {
                tracing::error!("a send queue transport panicked while sending");
                Poll::Ready(Err(
                    TransportError::Other("the transport panicked".into()).into()
                ))
            }
        }
    }
}
