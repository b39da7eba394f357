//! The send queue handle and its background tasks: the manager that hands
//! ready entries to the send workers, the workers, the deadline watcher and
//! the single finalizer that runs completions one at a time.

use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::{Kind, QueueConfig};
use crate::error::{ConfigError, SendError, TransportError};
use crate::state::{Completion, Done, Finished, Job, State, TypeStats, Verdict};
use crate::transport::{Parking, Reply, ReplySink, Transport};

/// Outbound requests per remote host and per request type, each type with a
/// window of entries in flight. Cloning gives another handle to the same
/// queue; dropping the last handle shuts it down.
pub struct SendQueue<H, P, T: Transport<H, P>> {
    shared: Arc<Shared<H, P, T>>,
    owner: Arc<Owner<H, P, T>>,
}

impl<H, P, T: Transport<H, P>> Clone for SendQueue<H, P, T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            owner: Arc::clone(&self.owner),
        }
    }
}

impl<H, P, T: Transport<H, P>> std::fmt::Debug for SendQueue<H, P, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendQueue").finish_non_exhaustive()
    }
}

/// What the background tasks share with the handles.
struct Shared<H, P, T: Transport<H, P>> {
    state: Mutex<State<H, P, T::Answer>>,
    transport: T,
    manager: Notify,
    expiry: Notify,
    finalizer: Mutex<Option<JoinHandle<()>>>,
}

/// Shuts the queue down when the last handle goes, so the tasks never outlive it.
struct Owner<H, P, T: Transport<H, P>> {
    shared: Arc<Shared<H, P, T>>,
}

impl<H, P, T: Transport<H, P>> Drop for Owner<H, P, T> {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl<H, P, T: Transport<H, P>> Shared<H, P, T> {
    fn lock(&self) -> MutexGuard<'_, State<H, P, T::Answer>> {
        // Nothing panics while holding the lock; recover the state if a bug ever does.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn close(&self) {
        self.lock().close();
        self.manager.notify_one();
        self.expiry.notify_one();
    }

    /// Wakes the manager if the state says it has something to do.
    fn wake_if(&self, work: bool) {
        if work {
            self.manager.notify_one();
        }
    }
}

impl<H, P, T> ReplySink<T::Answer> for Shared<H, P, T>
where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
{
    fn settle(&self, id: u64, result: Result<T::Answer, SendError>, abandoned: bool) {
        let work = {
            let mut st = self.lock();
            st.answer(id, result, abandoned);
            st.has_work()
        };
        self.wake_if(work);
    }
}

impl<H, P, T> SendQueue<H, P, T>
where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
{
    /// Builds the queue and starts its tasks on the current Tokio runtime.
    pub fn new(config: QueueConfig, transport: T) -> Result<Self, ConfigError> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| ConfigError::Invalid {
            what: "runtime",
            reason: e.to_string(),
        })?;
        let config = Arc::new(config);
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(Arc::clone(&config), done_tx)),
            transport,
            manager: Notify::new(),
            expiry: Notify::new(),
            finalizer: Mutex::new(None),
        });
        let finalizer = runtime.spawn(finalize(done_rx));
        *shared
            .finalizer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(finalizer);
        let mut workers = Vec::with_capacity(config.workers);
        for index in 0..config.workers {
            let (tx, rx) = mpsc::unbounded_channel();
            workers.push(tx);
            runtime.spawn(work(index, Arc::clone(&shared), rx));
        }
        runtime.spawn(manage(Arc::clone(&shared), workers));
        runtime.spawn(watch_deadlines(Arc::clone(&shared)));
        let owner = Arc::new(Owner {
            shared: Arc::clone(&shared),
        });
        Ok(Self { shared, owner })
    }

    /// Adds an entry; `on_done` runs on the finalizer task when it ends.
    ///
    /// Never waits. A refused entry (`Err`) was not added and `on_done` is not
    /// run. The payload may be a `P` or the `Arc<P>` of a finished entry's
    /// [`Done`], so a completion can add its entry again without a copy.
    pub fn add(
        &self,
        host: H,
        kind: Kind,
        payload: impl Into<Arc<P>>,
        on_done: impl FnOnce(Done<H, P, T::Answer>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.add_with(host, kind, payload, Completion::Callback(Box::new(on_done)))
    }

    /// Adds an entry and returns a future of its outcome.
    ///
    /// Never waits. A refused entry (`Err`) was not added.
    pub fn submit(
        &self,
        host: H,
        kind: Kind,
        payload: impl Into<Arc<P>>,
    ) -> Result<Pending<H, P, T::Answer>, SendError> {
        let (tx, rx) = oneshot::channel();
        self.add_with(host, kind, payload, Completion::Channel(tx))?;
        Ok(Pending { rx })
    }

    fn add_with(
        &self,
        host: H,
        kind: Kind,
        payload: impl Into<Arc<P>>,
        completion: Completion<H, P, T::Answer>,
    ) -> Result<(), SendError> {
        // Allocate before taking the lock: it is shared with every worker.
        let payload = payload.into();
        let (earliest, work) = {
            let mut st = self.shared.lock();
            let earliest = st.add(host, kind, payload, completion, Instant::now())?;
            (earliest, st.has_work())
        };
        if earliest {
            self.shared.expiry.notify_one();
        }
        self.shared.wake_if(work);
        Ok(())
    }

    /// Marks a host down: ready entries fail with [`SendError::ConnectionAborted`],
    /// queued entries of types that are not queueable fail with
    /// [`SendError::HostDown`], queueable ones stay for when it is up.
    pub fn host_down(&self, host: &H) {
        let work = {
            let mut st = self.shared.lock();
            st.host_down(host);
            st.has_work()
        };
        self.shared.wake_if(work);
    }

    /// Marks a host up: its queued entries go out, in order.
    pub fn host_up(&self, host: &H) {
        let work = {
            let mut st = self.shared.lock();
            st.host_up(host);
            st.has_work()
        };
        self.shared.wake_if(work);
    }

    /// Removes a host: every entry not yet handed to a send worker fails with
    /// [`SendError::HostRemoved`]; entries already sent are settled by their transport.
    pub fn remove_host(&self, host: &H) {
        let work = {
            let mut st = self.shared.lock();
            st.remove_host(host);
            st.has_work()
        };
        self.shared.wake_if(work);
    }

    /// Whether the host is down; `None` if the queue does not know it.
    pub fn is_down(&self, host: &H) -> Option<bool> {
        self.shared.lock().is_down(host)
    }

    /// Whether the type's window at this host is full, so a caller can hold
    /// back work it would only queue.
    pub fn window_is_full(&self, host: &H, kind: Kind) -> bool {
        self.shared.lock().window_is_full(host, kind)
    }

    /// Queue depth, entries in flight, the window and the oldest queued
    /// entry's age for one host and type; `None` if unknown.
    pub fn stats(&self, host: &H, kind: Kind) -> Option<TypeStats> {
        self.shared.lock().stats(host, kind, Instant::now())
    }

    /// Shuts down: every unfinished entry fails with [`SendError::ShuttingDown`],
    /// new entries are refused, and this returns once the finalizer has run
    /// every completion.
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

/// The manager: hands ready entries of hosts with a free send slot to idle workers.
async fn manage<H, P, T>(
    shared: Arc<Shared<H, P, T>>,
    workers: Vec<mpsc::UnboundedSender<Job<H, P>>>,
) where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
{
    loop {
        let jobs = {
            let mut st = shared.lock();
            if st.is_closed() {
                return;
            }
            st.dispatch()
        };
        for (worker, job) in jobs {
            // A worker only stops when this sender is dropped, so this cannot fail.
            let _ = workers[worker].send(job);
        }
        shared.manager.notified().await;
    }
}

/// One send worker: writes one entry at a time through the transport. After
/// each write it takes the next ready host itself ([`State::sent`]); with
/// nothing ready it goes idle and waits for the manager.
async fn work<H, P, T>(
    index: usize,
    shared: Arc<Shared<H, P, T>>,
    mut jobs: mpsc::UnboundedReceiver<Job<H, P>>,
) where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
{
    // The worker's own parking spot; replies clone this rather than the
    // shared queue, whose reference count every worker would fight over.
    let sink: Arc<dyn ReplySink<T::Answer>> = shared.clone();
    let parking = Arc::new(Parking::new(sink));
    while let Some(job) = jobs.recv().await {
        let mut next = Some(job);
        let mut handed = true;
        while let Some(Job {
            id,
            host_key,
            request,
            gone,
        }) = next.take()
        {
            // A job from the manager waited in a channel; a job the worker
            // picked itself needs a look only if its host changed since.
            if (handed || gone.load(Ordering::Acquire))
                && let Verdict::Skip = shared.lock().before_write(index, id, host_key)
            {
                break;
            }
            handed = false;
            parking.open(id);
            let reply = Reply::new(id, Arc::clone(&parking));
            let result = CatchPanic(pin!(shared.transport.send(request, reply))).await;
            let parked = parking.close();
            let work;
            (next, work) = {
                let mut st = shared.lock();
                let next = st.sent(index, id, host_key, result, parked);
                (next, st.has_work())
            };
            shared.wake_if(work);
            // A transport that never waits would otherwise keep this thread
            // from every other task (the finalizer among them) while work lasts.
            tokio::task::consume_budget().await;
        }
        let work = shared.lock().has_work();
        shared.wake_if(work);
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

/// Fails queued entries whose deadline passed, sleeping on Tokio time until the next one.
async fn watch_deadlines<H, P, T>(shared: Arc<Shared<H, P, T>>)
where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
{
    loop {
        let (next, work) = {
            let mut st = shared.lock();
            if st.is_closed() {
                return;
            }
            let next = st.expire_due(Instant::now());
            (next, st.has_work())
        };
        shared.wake_if(work);
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

/// The finalizer: runs completions one at a time, outside every lock.
async fn finalize<H, P, A>(mut done: mpsc::UnboundedReceiver<Finished<H, P, A>>) {
    let mut batch = Vec::with_capacity(64);
    while done.recv_many(&mut batch, 64).await > 0 {
        for Finished { completion, done } in batch.drain(..) {
            match completion {
                Completion::Callback(callback) => {
                    if std::panic::catch_unwind(AssertUnwindSafe(|| callback(done))).is_err() {
                        tracing::error!("a send queue completion callback panicked");
                    }
                }
                Completion::Channel(tx) => {
                    // The caller may have stopped waiting; that is its choice.
                    let _ = tx.send(done);
                }
            }
        }
    }
}
