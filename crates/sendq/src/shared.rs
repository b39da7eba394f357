//! What a queue's handles and its background tasks (send workers, the
//! finalizer, the expiry task) share: the state behind one lock, the
//! transport and the wake-ups.

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::admission::Admission;
use crate::completion::Completion;
use crate::config::QueueConfig;
use crate::error::SendError;
use crate::state::State;
use crate::transport::{ReplySink, Transport};

/// What the background tasks share with the handles.
pub(crate) struct Shared<H, P, T: Transport<H, P>, C> {
    pub(crate) config: Arc<QueueConfig>,
    pub(crate) state: Mutex<State<H, P, T::Answer, C>>,
    /// Also held by the state; see [`crate::admission`].
    pub(crate) admission: Arc<Mutex<Admission<H, P, C>>>,
    pub(crate) transport: T,
    /// One per send worker: woken when it is idle and work arrives.
    pub(crate) workers: Vec<Notify>,
    /// Woken when the finalizer's batch goes from empty to non-empty.
    pub(crate) finalizer_wake: Notify,
    pub(crate) expiry: Notify,
    /// Stops workers waiting on a transport when the queue shuts down.
    pub(crate) closing: Closing,
    /// The state's count of host-down, removal and shutdown events, readable
    /// without the lock.
    pub(crate) changes: Arc<AtomicU64>,
    pub(crate) finalizer: Mutex<Option<JoinHandle<()>>>,
}

impl<H, P, T: Transport<H, P>, C> Shared<H, P, T, C> {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State<H, P, T::Answer, C>> {
        // Nothing panics while holding the lock; recover the state if a bug ever does.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn admit(&self) -> MutexGuard<'_, Admission<H, P, C>> {
        self.admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases the lock and wakes whoever the state says has something to do.
    pub(crate) fn release(&self, mut st: MutexGuard<'_, State<H, P, T::Answer, C>>) {
        let wakes = st.wakes(|worker| self.workers[worker].notify_one());
        drop(st);
        if wakes.finalizer {
            self.finalizer_wake.notify_one();
        }
    }

    pub(crate) fn close(&self) {
        let mut st = self.lock();
        for worker in st.close() {
            self.workers[worker].notify_one();
        }
        self.release(st);
        self.closing.close();
        self.expiry.notify_one();
    }
}

impl<H, P, T, C> ReplySink<T::Answer> for Shared<H, P, T, C>
where
    H: Clone + Eq + Hash + Send + Sync + 'static,
    P: Send + Sync + 'static,
    T: Transport<H, P>,
    C: Completion<H, P, T::Answer>,
{
    fn settle(&self, id: u64, result: Result<T::Answer, SendError>, abandoned: bool) {
        let mut st = self.lock();
        st.answer(id, result, abandoned);
        self.release(st);
    }
}

/// Tells workers that are waiting on a transport that the queue is closing.
#[derive(Default)]
pub(crate) struct Closing {
    pub(crate) done: AtomicBool,
    pub(crate) notify: Notify,
}

impl Closing {
    /// Marks the queue closing and wakes every worker waiting on a send.
    pub(crate) fn close(&self) {
        self.done.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
}
