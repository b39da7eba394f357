//! Shared harness for the integration tests: a probe handler that records
//! every hand-out and the concurrency, a running dispatcher that can be
//! stopped, and a memory store whose writes or reads can be made to fail.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use estafeta_repeat::store::{Applied, Op, Read, Scan, Skip, SourceCount};
use estafeta_repeat::{
    Clock, Entry, Error, Handler, MemoryStore, Options, Outcome, Scheduler, Store, StoreError,
    TestClock, WorkerPool,
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

    /// A probe, and a dispatcher of `scheduler` with `workers` workers
    /// running the probe's [`handler`](Self::handler) of `hold` and `decide`.
    pub(crate) fn start<S: Store, C: Clock>(
        scheduler: &Scheduler<S, C>,
        clock: &TestClock,
        workers: usize,
        hold: Duration,
        decide: impl Fn(&Entry) -> Outcome + Send + Sync + 'static,
    ) -> (Arc<Self>, Running) {
        let probe = Self::new(clock.clone());
        let running = Running::start(scheduler, workers, probe.handler(hold, decide));
        (probe, running)
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

/// A clock at [`T0`], and a scheduler of `options` over a memory store on it.
pub(crate) fn memory_scheduler(options: Options) -> (TestClock, Scheduler<MemoryStore, TestClock>) {
    let clock = TestClock::new(T0);
    let s = Scheduler::new(MemoryStore::new(), clock.clone(), options);
    (clock, s)
}

pub(crate) use estafeta_repeat::store::conformance::entry;

/// The calls of a [`BreakableStore`] that fail while it is broken.
#[derive(Clone, Copy)]
pub(crate) enum Breaks {
    /// The writes recording a handler's outcome (a move, or putting an
    /// entry back).
    Outcomes,
    /// The reads of this source.
    Reads(&'static str),
}

/// A memory store whose calls that `breaks` names fail while `broken` is
/// set (it starts broken): how the scheduler bears a failing store.
#[derive(Clone)]
pub(crate) struct BreakableStore {
    pub(crate) inner: MemoryStore,
    pub(crate) broken: Arc<AtomicBool>,
    breaks: Breaks,
    /// How many reads of the source of [`Breaks::Reads`] were asked for.
    pub(crate) reads: Arc<AtomicUsize>,
}

impl BreakableStore {
    /// An empty store, broken.
    pub(crate) fn new(breaks: Breaks) -> Self {
        Self {
            inner: MemoryStore::default(),
            broken: Arc::new(AtomicBool::new(true)),
            breaks,
            reads: Arc::default(),
        }
    }

    /// A backend error while broken.
    fn check(&self) -> Result<(), StoreError> {
        match self.broken.load(Ordering::SeqCst) {
            true => Err(StoreError::Backend("disk on fire".into())),
            false => Ok(()),
        }
    }
}

impl Store for BreakableStore {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        if let Breaks::Outcomes = self.breaks
            && ops
                .iter()
                .any(|op| matches!(op, Op::Move { .. } | Op::Restore(_)))
        {
            self.check()?;
        }
        self.inner.apply(ops)
    }

    fn sources(&self) -> Result<Vec<String>, StoreError> {
        self.inner.sources()
    }

    fn scan(&self, read: Read<'_>, now: u64, skip: Skip<'_>) -> Result<Scan, StoreError> {
        if let Breaks::Reads(failing) = self.breaks
            && read.source == failing
        {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.check()?;
        }
        self.inner.scan(read, now, skip)
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.inner.count(source, now)
    }

    fn contains(&self, id: &str) -> Result<bool, StoreError> {
        self.inner.contains(id)
    }
}
