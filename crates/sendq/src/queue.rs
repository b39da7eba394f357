//! The send queue handle and its background tasks: the send workers (in
//! [`crate::worker`]), the deadline watcher and the single finalizer that
//! runs completions one at a time.

use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::admission::{Admission, Intake};
use crate::body::Body;
use crate::completion::{Completion, OnDone};
use crate::config::{Kind, QueueConfig};
use crate::error::{ConfigError, SendError};
use crate::shared::{Closing, Shared};
use crate::state::{Done, Finished, State, TypeStats};
use crate::transport::Transport;
use crate::worker::work;

/// Outbound requests per remote host and per request type, each type with a
/// window of entries in flight. Cloning gives another handle to the same
/// queue; dropping the last handle shuts it down.
pub struct SendQueue<H, P, T: Transport<H, P>, C = OnDone<H, P, <T as Transport<H, P>>::Answer>> {
    shared: Arc<Shared<H, P, T, C>>,
    owner: Arc<Owner<H, P, T, C>>,
}

impl<H, P, T: Transport<H, P>, C> Clone for SendQueue<H, P, T, C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            owner: Arc::clone(&self.owner),
        }
    }
}

impl<H, P, T: Transport<H, P>, C> std::fmt::Debug for SendQueue<H, P, T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendQueue").finish_non_exhaustive()
    }
}

/// Shuts the queue down when the last handle goes, so the tasks never outlive it.
struct Owner<H, P, T: Transport<H, P>, C> {
    shared: Arc<Shared<H, P, T, C>>,
}

impl<H, P, T: Transport<H, P>, C> Drop for Owner<H, P, T, C> {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl<H, P, T> SendQueue<H, P, T>
where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
{
    /// Builds the queue, with [`OnDone`] completions (callbacks and
    /// [`SendQueue::submit`]), and starts its tasks on the current Tokio runtime.
    pub fn new(config: QueueConfig, transport: T) -> Result<Self, ConfigError> {
        Self::with_completion(config, transport)
    }

    /// Adds an entry; `on_done` runs on the finalizer task when it ends.
    ///
    /// Never waits. A refused entry (`Err`) was not added and `on_done` is not
    /// run. [`Done`] gives the payload back, so a completion can add its
    /// entry again without a copy.
    pub fn add(
        &self,
        host: H,
        kind: Kind,
        payload: P,
        on_done: impl FnOnce(Done<H, P, T::Answer>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.add_with(host, kind, payload, OnDone::callback(on_done))
    }

    /// Adds an entry and returns a future of its outcome.
    ///
    /// Never waits. A refused entry (`Err`) was not added.
    pub fn submit(
        &self,
        host: H,
        kind: Kind,
        payload: P,
    ) -> Result<Pending<H, P, T::Answer>, SendError> {
        let (tx, rx) = oneshot::channel();
        self.add_with(host, kind, payload, OnDone::channel(tx))?;
        Ok(Pending { rx })
    }
}

impl<H, P, T, C> SendQueue<H, P, T, C>
where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
    C: Completion<H, P, T::Answer>,
{
    /// Builds a queue whose entries finish through completions of type `C`,
    /// stored inline in each entry (so adding allocates nothing for them),
    /// and starts its tasks on the current Tokio runtime.
    pub fn with_completion(config: QueueConfig, transport: T) -> Result<Self, ConfigError> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| ConfigError::Invalid {
            what: "runtime",
            reason: e.to_string(),
        })?;
        let config = Arc::new(config);
        let changes = Arc::new(AtomicU64::new(0));
        let admission = Arc::new(Mutex::new(Admission::new(config.workers)));
        let shared = Arc::new(Shared {
            config: Arc::clone(&config),
            state: Mutex::new(State::new(
                Arc::clone(&config),
                Arc::clone(&admission),
                Arc::clone(&changes),
            )),
            admission,
            transport,
            workers: (0..config.workers).map(|_| Notify::new()).collect(),
            finalizer_wake: Notify::new(),
            expiry: Notify::new(),
            closing: Closing::default(),
            changes,
            finalizer: Mutex::new(None),
        });
        let finalizer = runtime.spawn(finalize(Arc::clone(&shared)));
        *shared
            .finalizer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(finalizer);
        for index in 0..config.workers {
            runtime.spawn(work(index, Arc::clone(&shared)));
        }
        runtime.spawn(watch_deadlines(Arc::clone(&shared)));
        let owner = Arc::new(Owner {
            shared: Arc::clone(&shared),
        });
        Ok(Self { shared, owner })
    }

    /// Adds an entry; `completion` receives its outcome on the finalizer
    /// task when it ends.
    ///
    /// Never waits. A refused entry (`Err`) was not added and `completion`
    /// is dropped unused.
    pub fn add_with(
        &self,
        host: H,
        kind: Kind,
        payload: P,
        completion: C,
    ) -> Result<(), SendError> {
        let body = Body { host, payload };
        let Some(tc) = self.shared.config.types.get(kind.0) else {
            return Err(ConfigError::UnknownKind(kind.0).into());
        };
        if !tc.prior_one_shot && tc.deadline.is_none() {
            // A plain entry: accepted under the admission lock alone.
            let shared = &*self.shared;
            let mut admission = shared.admit();
            let may_go_down = tc.queueable_if_down || tc.probe.is_some();
            let host_key = admission.check(&body.host, may_go_down)?;
            let entry = Intake {
                body,
                host_key,
                kind: kind.0,
                completion,
                added: admission.stamp(),
            };
            admission.push(entry, |worker| shared.workers[worker].notify_one());
            return Ok(());
        }
        let now = Instant::now();
        let mut st = self.shared.lock();
        let earliest = st.add(body, kind, completion, now);
        self.shared.release(st);
        if earliest? {
            self.shared.expiry.notify_one();
        }
        Ok(())
    }

    /// Marks a host down: ready entries fail with [`SendError::ConnectionAborted`],
    /// queued entries of types that are not queueable fail with
    /// [`SendError::HostDown`], queueable ones stay for when it is up.
    pub fn host_down(&self, host: &H) {
        let mut st = self.shared.lock();
        st.host_down(host);
        self.shared.release(st);
    }

    /// Marks a host up: its queued entries go out, in order.
    pub fn host_up(&self, host: &H) {
        let mut st = self.shared.lock();
        st.host_up(host);
        self.shared.release(st);
    }

    /// Removes a host: every entry not yet handed to a send worker fails with
    /// [`SendError::HostRemoved`]; entries already sent are settled by their transport.
    pub fn remove_host(&self, host: &H) {
        let mut st = self.shared.lock();
        st.remove_host(host);
        self.shared.release(st);
    }

    /// Whether the host is down; `None` if the queue does not know it.
    pub fn is_down(&self, host: &H) -> Option<bool> {
        self.shared.admit().is_down(host)
    }

    /// Whether the type's window at this host is full, so a caller can hold
    /// back work it would only queue.
    pub fn window_is_full(&self, host: &H, kind: Kind) -> bool {
        let mut st = self.shared.lock();
        let full = st.window_is_full(host, kind);
        self.shared.release(st);
        full
    }

    /// Queue depth, entries in flight, the window and the oldest queued
    /// entry's age for one host and type; `None` if unknown.
    pub fn stats(&self, host: &H, kind: Kind) -> Option<TypeStats> {
        let mut st = self.shared.lock();
        let stats = st.stats(host, kind, Instant::now());
        self.shared.release(st);
        stats
    }

    /// Shuts down: every unfinished entry fails with [`SendError::ShuttingDown`],
    /// new entries are refused, and this returns once the finalizer has run
    /// every completion. A send still waiting on its transport is dropped
    /// (its entry fails the same way), so shutting down never waits on a host.
    pub async fn shutdown(&self) {
        self.shared.close();
        let finalizer = self
            .shared
            .finalizer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(finalizer) = finalizer
            && let Err(e) = finalizer.await
        {
            tracing::error!(error = %e, "send queue finalizer ended abnormally");
        }
    }
}

/// The outcome of an entry added with [`SendQueue::submit`].
#[derive(Debug)]
pub struct Pending<H, P, A> {
    rx: oneshot::Receiver<Done<H, P, A>>,
}

impl<H, P, A> Future for Pending<H, P, A> {
    type Output = Result<A, SendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|done| match done {
            Ok(done) => done.result,
            // Only a runtime that is going away drops the finalizer unfinished.
            Err(_) => Err(SendError::ShuttingDown),
        })
    }
}

/// Fails queued entries whose deadline passed, sleeping on Tokio time until the next one.
async fn watch_deadlines<H, P, T, C>(shared: Arc<Shared<H, P, T, C>>)
where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
    C: Completion<H, P, T::Answer>,
{
    loop {
        let next = {
            let mut st = shared.lock();
            if st.is_closed() {
                return;
            }
            let next = st.expire_due(Instant::now());
            shared.release(st);
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = shared.expiry.notified() => {}
                }
            }
            None => shared.expiry.notified().await,
        }
    }
}

/// The finalizer: takes the finished entries a batch at a time and runs
/// their completions one at a time, outside every lock. It ends once the
/// queue is closed and nothing is left.
async fn finalize<H, P, T, C>(shared: Arc<Shared<H, P, T, C>>)
where
    T: Transport<H, P>,
    C: Completion<H, P, T::Answer>,
{
    let mut batch: Vec<Finished<H, P, T::Answer, C>> = Vec::new();
    loop {
        let closed = {
            let mut st = shared.lock();
            st.take_done(&mut batch);
            st.is_drained()
        };
        if batch.is_empty() {
            if closed {
                return;
            }
            shared.finalizer_wake.notified().await;
            continue;
        }
        for Finished { completion, done } in batch.drain(..) {
            if std::panic::catch_unwind(AssertUnwindSafe(|| completion.complete(done))).is_err() {
                tracing::error!("a send queue completion panicked");
            }
        }
    }
}
