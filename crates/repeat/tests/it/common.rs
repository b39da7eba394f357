//! Shared harness for the integration tests: a probe handler that records
//! every hand-out and the concurrency, and a running dispatcher that can be
//! stopped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use estafeta_repeat::{
    Clock, Entry, Error, Handler, Outcome, Scheduler, Store, TestClock, WorkerPool,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// A wall-clock second far from zero, so lateness arithmetic never saturates.
pub(crate) const T0: u64 = 1_700_000_000;

/// One hand-out as the handler saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fired {
    pub(crate) source: String,
    pub(crate) id: String,
    pub(crate) due: u64,
    pub(crate) attempt: u32,
    /// Wall-clock time when the handler started.
    pub(crate) at: Duration,
}

/// Records hand-outs and how many handlers run at once.
pub(crate) struct Probe {
    clock: TestClock,
    log: Mutex<Vec<Fired>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
    count: watch::Sender<usize>,
}

impl Probe {
    pub(crate) fn new(clock: TestClock) -> Arc<Self> {
        Arc::new(Self {
            clock,
            log: Mutex::new(Vec::new()),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
            count: watch::channel(0).0,
        })
    }

    /// A handler that records the entry, holds its worker for `hold` of
    /// (virtual) time, then returns what `decide` says.
    pub(crate) fn handler(
        self: &Arc<Self>,
        hold: Duration,
        decide: impl Fn(&Entry) -> Outcome + Send + Sync + 'static,
    ) -> impl Handler {
        let probe = Arc::clone(self);
        let decide = Arc::new(decide);
        move |entry: Entry| {
            let probe = Arc::clone(&probe);
            let decide = Arc::clone(&decide);
            async move {
                probe.enter(&entry);
                tokio::time::sleep(hold).await;
                let outcome = decide(&entry);
                probe.running.fetch_sub(1, Ordering::SeqCst);
                outcome
            }
        }
    }

    fn enter(&self, entry: &Entry) {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        let mut log = self.log.lock().unwrap();
        log.push(Fired {
            source: entry.source.clone(),
            id: entry.id.clone(),
            due: entry.due,
            attempt: entry.attempt,
            at: self.clock.now(),
        });
        self.count.send_replace(log.len());
    }

    /// Waits until at least `n` hand-outs happened.
    pub(crate) async fn wait_for(&self, n: usize) {
        let mut rx = self.count.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    pub(crate) fn log(&self) -> Vec<Fired> {
        self.log.lock().unwrap().clone()
    }

    pub(crate) fn max_running(&self) -> usize {
        self.max_running.load(Ordering::SeqCst)
    }

    /// Hand-outs per id.
    pub(crate) fn per_id(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for f in self.log() {
            *counts.entry(f.id).or_insert(0) += 1;
        }
        counts
    }
}

/// A dispatcher running in its own task.
pub(crate) struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), Error>>,
}

impl Running {
    pub(crate) fn start<S: Store, C: Clock, H: Handler>(
        scheduler: &Scheduler<S, C>,
        workers: usize,
        handler: H,
    ) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let scheduler = scheduler.clone();
        let task = tokio::spawn(async move {
            scheduler
                .run(WorkerPool::new(workers), handler, async move {
                    let _ = stopped.await;
                })
                .await
        });
        Self { stop, task }
    }

    /// Stops the dispatcher and waits until it returned.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

/// An entry in `source`, due at `due`, with an empty payload.
pub(crate) fn entry(source: &str, due: u64, id: &str) -> Entry {
    Entry {
        source: source.to_owned(),
        due,
        id: id.to_owned(),
        payload: id.as_bytes().to_vec(),
        attempt: 0,
    }
}
