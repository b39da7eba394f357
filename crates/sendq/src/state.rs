//! The queue's bookkeeping, behind one lock: hosts, their per-type queues and
//! windows, the ready queues, the round-robin list of hosts to serve, idle
//! workers and deadlines.
//!
//! Everything here is synchronous and never waits; the tasks in
//! [`crate::queue`] call into it and do their waiting outside the lock.
//! Finished entries leave through an unbounded channel to the finalizer, so
//! no completion runs while the lock is held. Entries and hosts live in slabs
//! and refer to each other by key, so the host's own key is hashed only when
//! a caller names it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::config::{Kind, QueueConfig};
use crate::error::{ConfigError, SendError};
use crate::slab::Slab;
use crate::transport::{EarlyAnswer, Request};
use crate::window::Window;

/// How an entry ended, handed to its completion.
#[derive(Debug)]
pub struct Done<H, P, A> {
    /// The entry's host.
    pub host: H,
    /// The entry's request type.
    pub kind: Kind,
    /// The entry's payload, returned so that a caller can add it again.
    pub payload: Arc<P>,
    /// The transport's answer, or why the entry failed.
    pub result: Result<A, SendError>,
}

/// A boxed completion callback.
pub(crate) type Callback<H, P, A> = Box<dyn FnOnce(Done<H, P, A>) + Send>;

/// Where an entry's outcome goes.
pub(crate) enum Completion<H, P, A> {
    /// Run by the finalizer task.
    Callback(Callback<H, P, A>),
    /// Sent by the finalizer task to a waiting caller.
    Channel(oneshot::Sender<Done<H, P, A>>),
}

/// A finished entry on its way to the finalizer.
pub(crate) struct Finished<H, P, A> {
    pub(crate) completion: Completion<H, P, A>,
    pub(crate) done: Done<H, P, A>,
}

/// Where an entry is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// In its type queue, window closed (or host down).
    Waiting,
    /// In the host's ready queue; counts as in flight.
    Ready,
    /// Handed to a send worker, not yet written.
    Sending,
    /// Written; waiting for the answer.
    Sent,
}

struct Entry<H, P, A> {
    host: H,
    /// The host's slab key; a removed host's key finds nothing.
    host_key: u64,
    kind: usize,
    payload: Arc<P>,
    completion: Completion<H, P, A>,
    added: Instant,
    deadline: Option<Instant>,
    stage: Stage,
    /// An answer that arrived before the sent event, and whether it only
    /// says that the transport dropped its reply.
    /// Boxed: rare since answers usually park with the worker, and an entry
    /// should stay small (they are many and touched once per step).
    early: Option<Box<EarlyAnswer<A>>>,
    /// When a worker took the entry, for the adaptive window's latency.
    started: Option<Instant>,
}

struct TypeQueue {
    /// Keys of waiting entries in order of adding; keys of entries that left
    /// early (expired) are skipped when met.
    waiting: VecDeque<u64>,
    waiting_live: usize,
    in_flight: usize,
    window: Window,
    one_shot_busy: bool,
}

struct HostQueue {
    types: Vec<TypeQueue>,
    /// Entry keys in the order their windows opened (prior one-shots in front).
    ready: VecDeque<u64>,
    sending: usize,
    in_hostq: bool,
    down: bool,
    /// Set while the host is down, and for good once it is removed or the
    /// queue closes: lets a worker see without the lock whether a job it
    /// picked needs a second look before writing.
    gone: Arc<AtomicBool>,
    probe_failures: u32,
}

/// A send handed to a worker.
pub(crate) struct Job<H, P> {
    pub(crate) id: u64,
    pub(crate) host_key: u64,
    pub(crate) request: Request<H, P>,
    /// The host's [`HostQueue::gone`] flag.
    pub(crate) gone: Arc<AtomicBool>,
}

/// What a worker should do with a job it received.
pub(crate) enum Verdict {
    /// Write it.
    Send,
    /// It already finished (host down or removed, shutdown); skip it.
    Skip,
}

/// Per host and type numbers, for dashboards and for callers that shed load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeStats {
    /// Entries waiting for the window to open (or for the host to come up).
    pub queued: usize,
    /// Entries counted against the window: ready, being written, or sent and unanswered.
    pub in_flight: usize,
    /// The current window.
    pub window: usize,
    /// Age of the oldest entry not yet handed to a send worker.
    pub oldest_queued: Option<Duration>,
}

/// The queue's state; see the module documentation.
pub(crate) struct State<H, P, A> {
    config: Arc<QueueConfig>,
    names: HashMap<H, u64>,
    hosts: Slab<HostQueue>,
    entries: Slab<Entry<H, P, A>>,
    /// Keys of hosts with ready entries and a free send slot, served round-robin.
    hostq: VecDeque<u64>,
    idle_workers: Vec<usize>,
    deadlines: BTreeSet<(Instant, u64)>,
    finalizer: Option<mpsc::UnboundedSender<Finished<H, P, A>>>,
}

impl<H, P, A> State<H, P, A>
where
    H: Clone + Eq + Hash,
{
    pub(crate) fn new(
        config: Arc<QueueConfig>,
        finalizer: mpsc::UnboundedSender<Finished<H, P, A>>,
    ) -> Self {
        let idle_workers = (0..config.workers).rev().collect();
        Self {
            config,
            names: HashMap::new(),
            hosts: Slab::new(),
            entries: Slab::new(),
            hostq: VecDeque::new(),
            idle_workers,
            deadlines: BTreeSet::new(),
            finalizer: Some(finalizer),
        }
    }

    fn host_key(&mut self, host: &H) -> u64 {
        if let Some(&key) = self.names.get(host) {
            return key;
        }
        let hq = HostQueue {
            types: self
                .config
                .types
                .iter()
                .map(|t| TypeQueue {
                    waiting: VecDeque::new(),
                    waiting_live: 0,
                    in_flight: 0,
                    window: Window::new(t.window, t.adaptive.clone()),
                    one_shot_busy: false,
                })
                .collect(),
            ready: VecDeque::new(),
            sending: 0,
            in_hostq: false,
            gone: Arc::new(AtomicBool::new(false)),
            down: false,
            probe_failures: 0,
        };
        let key = self.hosts.insert(hq);
        self.names.insert(host.clone(), key);
        key
    }

    /// Adds an entry. Returns whether the entry set the earliest deadline (the
    /// expiry task should wake).
    pub(crate) fn add(
        &mut self,
        host: H,
        kind: Kind,
        payload: Arc<P>,
        completion: Completion<H, P, A>,
        now: Instant,
    ) -> Result<bool, SendError> {
        if self.is_closed() {
            return Err(SendError::ShuttingDown);
        }
        let Some(tc) = self.config.types.get(kind.0) else {
            return Err(ConfigError::UnknownKind(kind.0).into());
        };
        let (one_shot, may_go_down, deadline) = (
            tc.prior_one_shot,
            tc.queueable_if_down || tc.probe.is_some(),
            tc.deadline.map(|d| now + d),
        );
        let host_key = self.host_key(&host);
        let hq = self.hosts.get_mut(host_key).ok_or(SendError::HostRemoved)?;
        if hq.down && !may_go_down {
            return Err(SendError::HostDown);
        }
        let tq = &mut hq.types[kind.0];
        if one_shot && tq.one_shot_busy {
            return Err(SendError::Busy);
        }
        let id = self.entries.insert(Entry {
            host,
            host_key,
            kind: kind.0,
            payload,
            completion,
            added: now,
            deadline,
            stage: Stage::Waiting,
            early: None,
            started: None,
        });
        if one_shot && tq.in_flight < tq.window.limit() {
            tq.one_shot_busy = true;
            tq.in_flight += 1;
            hq.ready.push_front(id);
            if let Some(e) = self.entries.get_mut(id) {
                e.stage = Stage::Ready;
            }
        } else {
            tq.one_shot_busy |= one_shot;
            tq.waiting_live += 1;
            if one_shot {
                tq.waiting.push_front(id);
            } else {
                tq.waiting.push_back(id);
            }
            self.promote(host_key, kind.0);
        }
        let mut earliest = false;
        if let Some(d) = deadline {
            earliest = self.deadlines.first().is_none_or(|(first, _)| d < *first);
            self.deadlines.insert((d, id));
        }
        self.schedule(host_key);
        Ok(earliest)
    }

    /// Moves waiting entries of one type into the ready queue while its window is open.
    fn promote(&mut self, host_key: u64, kind: usize) {
        let tc = &self.config.types[kind];
        let Some(hq) = self.hosts.get_mut(host_key) else {
            return;
        };
        if hq.down && tc.probe.is_none() {
            return;
        }
        let tq = &mut hq.types[kind];
        while tq.in_flight < tq.window.limit() {
            let Some(id) = tq.waiting.pop_front() else {
                break;
            };
            let Some(e) = self.entries.get_mut(id) else {
                continue;
            };
            if e.stage != Stage::Waiting {
                continue;
            }
            e.stage = Stage::Ready;
            tq.waiting_live -= 1;
            tq.in_flight += 1;
            if tc.prior_one_shot {
                hq.ready.push_front(id);
            } else {
                hq.ready.push_back(id);
            }
        }
    }

    /// Puts a host on the manager's list if it has ready entries and a free send slot.
    fn schedule(&mut self, host_key: u64) {
        let Some(hq) = self.hosts.get_mut(host_key) else {
            return;
        };
        if hq.in_hostq || hq.ready.is_empty() || hq.sending >= self.config.per_host_sends {
            return;
        }
        hq.in_hostq = true;
        self.hostq.push_back(host_key);
    }

    /// Whether the manager has something to do: a host to serve and a worker to serve it.
    pub(crate) fn has_work(&self) -> bool {
        !self.hostq.is_empty() && !self.idle_workers.is_empty()
    }

    /// Hands ready entries to idle workers, one per host in turn.
    pub(crate) fn dispatch(&mut self) -> Vec<(usize, Job<H, P>)> {
        let mut jobs = Vec::new();
        while let Some(&worker) = self.idle_workers.last() {
            let Some(job) = self.pick() else {
                break;
            };
            self.idle_workers.pop();
            jobs.push((worker, job));
        }
        jobs
    }

    /// Takes the next entry to write: the first ready entry of the host at
    /// the head of the round-robin list; the host goes to the back of the list.
    fn pick(&mut self) -> Option<Job<H, P>> {
        // Read the clock at most once, and only for entries that need it.
        let mut clock = None;
        let mut now = || *clock.get_or_insert_with(Instant::now);
        loop {
            let host_key = self.hostq.pop_front()?;
            let Some(hq) = self.hosts.get_mut(host_key) else {
                continue;
            };
            hq.in_hostq = false;
            if hq.sending >= self.config.per_host_sends {
                continue;
            }
            let mut picked = None;
            while let Some(id) = hq.ready.pop_front() {
                let Some(e) = self.entries.get(id) else {
                    continue;
                };
                if e.stage != Stage::Ready || e.host_key != host_key {
                    continue;
                }
                if e.deadline.is_some_and(|d| d <= now()) {
                    self.expire(id);
                    // `expire` may have promoted entries of this host; look again.
                    break;
                }
                picked = Some(id);
                break;
            }
            let Some(id) = picked else {
                self.schedule(host_key);
                continue;
            };
            let Some(e) = self.entries.get_mut(id) else {
                continue;
            };
            e.stage = Stage::Sending;
            if self.config.types[e.kind].adaptive.is_some() {
                e.started = Some(now());
            }
            if let Some(d) = e.deadline {
                self.deadlines.remove(&(d, id));
            }
            let request = Request {
                host: e.host.clone(),
                kind: Kind(e.kind),
                payload: Arc::clone(&e.payload),
            };
            let Some(hq) = self.hosts.get_mut(host_key) else {
                continue;
            };
            hq.sending += 1;
            let gone = Arc::clone(&hq.gone);
            self.schedule(host_key);
            return Some(Job {
                id,
                host_key,
                request,
                gone,
            });
        }
    }

    /// Called by a worker before writing a job whose host may have changed
    /// since it was picked: fails the entry with "host down" if its host went
    /// down (or "host removed" if it is gone) and frees its slot.
    pub(crate) fn before_write(&mut self, worker: usize, id: u64, host_key: u64) -> Verdict {
        let Some(e) = self.entries.get(id) else {
            self.after_write(worker, host_key);
            return Verdict::Skip;
        };
        let probe = self.config.types[e.kind].probe.is_some();
        let refusal = match self.hosts.get(host_key) {
            Some(hq) => (hq.down && !probe).then_some(SendError::HostDown),
            None => Some(SendError::HostRemoved),
        };
        if let Some(err) = refusal {
            self.finish(id, Err(err));
            self.after_write(worker, host_key);
            return Verdict::Skip;
        }
        Verdict::Send
    }

    /// Frees the worker and the host's send slot.
    fn after_write(&mut self, worker: usize, host_key: u64) {
        self.idle_workers.push(worker);
        self.release_host(host_key);
    }

    fn release_host(&mut self, host_key: u64) {
        if let Some(hq) = self.hosts.get_mut(host_key) {
            hq.sending -= 1;
            self.schedule(host_key);
        }
    }

    /// The sent event: the transport's send future resolved with `result`.
    ///
    /// Returns the worker's next job if a host is ready, so a busy queue does
    /// not pay two task wake-ups (worker to manager and back) per entry;
    /// otherwise the worker goes idle and waits for the manager.
    pub(crate) fn sent(
        &mut self,
        worker: usize,
        id: u64,
        host_key: u64,
        result: Result<(), SendError>,
        parked: Option<EarlyAnswer<A>>,
    ) -> Option<Job<H, P>> {
        self.release_host(host_key);
        if let Some(e) = self.entries.get_mut(id) {
            match (result, parked.or_else(|| e.early.take().map(|b| *b))) {
                // A write error explains a reply dropped on the way out better
                // than "connection aborted" does.
                (Err(err), Some((_, true)) | None) => self.finish(id, Err(err)),
                (_, Some((answer, _))) => self.finish(id, answer),
                (Ok(()), None) => e.stage = Stage::Sent,
            }
        }
        let next = self.pick();
        if next.is_none() {
            self.idle_workers.push(worker);
        }
        next
    }

    /// The answer event, from a [`crate::Reply`].
    pub(crate) fn answer(&mut self, id: u64, result: Result<A, SendError>, abandoned: bool) {
        let Some(e) = self.entries.get_mut(id) else {
            return;
        };
        match e.stage {
            Stage::Sending => {
                if e.early.is_none() {
                    e.early = Some(Box::new((result, abandoned)));
                }
            }
            Stage::Sent => self.finish(id, result),
            Stage::Waiting | Stage::Ready => {}
        }
    }

    /// Finishes an entry that was handed to a worker or is queued: frees its
    /// window slot, feeds the adaptive window and the probe policy, and sends
    /// it to the finalizer.
    fn finish(&mut self, id: u64, result: Result<A, SendError>) {
        let Some(e) = self.entries.remove(id) else {
            return;
        };
        if let Some(d) = e.deadline {
            self.deadlines.remove(&(d, id));
        }
        let tc = &self.config.types[e.kind];
        let probe = tc.probe.clone();
        if let Some(hq) = self.hosts.get_mut(e.host_key) {
            let tq = &mut hq.types[e.kind];
            let written = matches!(e.stage, Stage::Sending | Stage::Sent);
            match e.stage {
                Stage::Waiting => tq.waiting_live -= 1,
                Stage::Ready | Stage::Sending | Stage::Sent => tq.in_flight -= 1,
            }
            if written && tc.adaptive.is_some() {
                let latency = match (&result, e.started) {
                    (Ok(_), Some(started)) => Some(Instant::now() - started),
                    _ => None,
                };
                tq.window.record(latency);
            }
            if tc.prior_one_shot {
                tq.one_shot_busy = false;
            }
            if let Some(policy) = probe
                && written
            {
                if result.is_ok() {
                    hq.probe_failures = 0;
                    if hq.down {
                        self.up(e.host_key);
                    }
                } else {
                    hq.probe_failures += 1;
                    if hq.probe_failures >= policy.failure_threshold && !hq.down {
                        self.down(e.host_key);
                    }
                }
            }
            self.promote(e.host_key, e.kind);
            self.schedule(e.host_key);
        }
        self.deliver(e, result);
    }

    fn expire(&mut self, id: u64) {
        if let Some(e) = self.entries.get(id)
            && matches!(e.stage, Stage::Waiting | Stage::Ready)
        {
            self.finish(id, Err(SendError::Expired));
        }
    }

    /// Fails every queued entry whose deadline has passed. Returns the next deadline.
    pub(crate) fn expire_due(&mut self, now: Instant) -> Option<Instant> {
        while let Some(&(d, id)) = self.deadlines.first() {
            if d > now {
                break;
            }
            self.deadlines.pop_first();
            self.expire(id);
        }
        self.deadlines.first().map(|(d, _)| *d)
    }

    /// Marks a host down: its ready queue fails with "connection aborted",
    /// waiting entries of types that are not queueable fail with "host down".
    pub(crate) fn host_down(&mut self, host: &H) {
        if let Some(&key) = self.names.get(host) {
            self.down(key);
        }
    }

    fn down(&mut self, host_key: u64) {
        let Some(hq) = self.hosts.get_mut(host_key) else {
            return;
        };
        hq.down = true;
        hq.gone.store(true, Ordering::Release);
        let ready: Vec<u64> = hq.ready.drain(..).collect();
        let mut refused = Vec::new();
        for (kind, tq) in hq.types.iter_mut().enumerate() {
            let tc = &self.config.types[kind];
            if !tc.queueable_if_down && tc.probe.is_none() {
                refused.extend(tq.waiting.drain(..));
            }
        }
        for id in ready {
            if self
                .entries
                .get(id)
                .is_some_and(|e| e.stage == Stage::Ready)
            {
                self.finish(id, Err(SendError::ConnectionAborted));
            }
        }
        for id in refused {
            if self
                .entries
                .get(id)
                .is_some_and(|e| e.stage == Stage::Waiting)
            {
                self.finish(id, Err(SendError::HostDown));
            }
        }
    }

    /// Marks a host up and lets its queued entries go, in order.
    pub(crate) fn host_up(&mut self, host: &H) {
        if let Some(&key) = self.names.get(host) {
            self.up(key);
        }
    }

    fn up(&mut self, host_key: u64) {
        let Some(hq) = self.hosts.get_mut(host_key) else {
            return;
        };
        hq.down = false;
        hq.gone.store(false, Ordering::Release);
        hq.probe_failures = 0;
        for kind in 0..self.config.types.len() {
            self.promote(host_key, kind);
        }
        self.schedule(host_key);
    }

    /// Removes a host: every entry not yet handed to a worker fails with
    /// "host removed"; entries being written or sent are settled by their transport.
    pub(crate) fn remove_host(&mut self, host: &H) {
        let Some(host_key) = self.names.get(host).copied() else {
            return;
        };
        let Some(hq) = self.hosts.get_mut(host_key) else {
            return;
        };
        hq.gone.store(true, Ordering::Release);
        let mut unsent: Vec<u64> = hq.ready.drain(..).collect();
        for tq in &mut hq.types {
            unsent.extend(tq.waiting.drain(..));
        }
        for id in unsent {
            if self
                .entries
                .get(id)
                .is_some_and(|e| matches!(e.stage, Stage::Waiting | Stage::Ready))
            {
                self.finish(id, Err(SendError::HostRemoved));
            }
        }
        self.names.remove(host);
        self.hosts.remove(host_key);
    }

    fn host(&self, host: &H) -> Option<&HostQueue> {
        self.names.get(host).and_then(|&key| self.hosts.get(key))
    }

    /// Whether the host is down (`None` for an unknown host).
    pub(crate) fn is_down(&self, host: &H) -> Option<bool> {
        self.host(host).map(|hq| hq.down)
    }

    pub(crate) fn window_is_full(&self, host: &H, kind: Kind) -> bool {
        self.host(host)
            .and_then(|hq| hq.types.get(kind.0))
            .is_some_and(|tq| tq.in_flight >= tq.window.limit())
    }

    pub(crate) fn stats(&self, host: &H, kind: Kind, now: Instant) -> Option<TypeStats> {
        let hq = self.host(host)?;
        let tq = hq.types.get(kind.0)?;
        let queued_at = |id: &u64, stage| {
            self.entries
                .get(*id)
                .filter(|e| e.stage == stage && e.kind == kind.0)
                .map(|e| e.added)
        };
        let oldest = [
            tq.waiting
                .iter()
                .find_map(|id| queued_at(id, Stage::Waiting)),
            hq.ready.iter().find_map(|id| queued_at(id, Stage::Ready)),
        ]
        .into_iter()
        .flatten()
        .min();
        Some(TypeStats {
            queued: tq.waiting_live,
            in_flight: tq.in_flight,
            window: tq.window.limit(),
            oldest_queued: oldest.map(|t| now - t),
        })
    }
}

/// Shutting down and delivering need nothing of the host key, so `Drop` can use them.
impl<H, P, A> State<H, P, A> {
    /// True once [`State::close`] ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.finalizer.is_none()
    }

    fn deliver(&mut self, e: Entry<H, P, A>, result: Result<A, SendError>) {
        let finished = Finished {
            completion: e.completion,
            done: Done {
                host: e.host,
                kind: Kind(e.kind),
                payload: e.payload,
                result,
            },
        };
        if let Some(tx) = &self.finalizer {
            // The finalizer outlives the state's sender, so this cannot fail
            // while the sender is here; a failure would mean the runtime is gone.
            let _ = tx.send(finished);
        }
    }

    /// Shuts down: every entry not yet finished fails with "shutting down",
    /// and the finalizer's channel closes once they are delivered.
    pub(crate) fn close(&mut self) {
        self.names.clear();
        for key in self.hosts.keys() {
            if let Some(hq) = self.hosts.remove(key) {
                hq.gone.store(true, Ordering::Release);
            }
        }
        self.hostq.clear();
        self.deadlines.clear();
        for id in self.entries.keys() {
            if let Some(e) = self.entries.remove(id) {
                self.deliver(e, Err(SendError::ShuttingDown));
            }
        }
        self.finalizer = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TypeConfig;

    type TestState = State<&'static str, u32, u32>;

    fn state(
        types: Vec<TypeConfig>,
    ) -> (
        TestState,
        mpsc::UnboundedReceiver<Finished<&'static str, u32, u32>>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        (State::new(Arc::new(QueueConfig::new(types)), tx), rx)
    }

    fn add(st: &mut TestState, host: &'static str, payload: u32) {
        let (tx, _rx) = oneshot::channel();
        st.add(
            host,
            Kind(0),
            Arc::new(payload),
            Completion::Channel(tx),
            Instant::now(),
        )
        .unwrap();
    }

    fn pick(st: &mut TestState) -> Job<&'static str, u32> {
        let mut jobs = st.dispatch();
        assert_eq!(jobs.len(), 1);
        jobs.pop().unwrap().1
    }

    #[tokio::test]
    async fn an_entry_whose_host_goes_down_after_being_picked_fails_with_host_down() {
        let (mut st, mut done) = state(vec![TypeConfig::new("a", 2).queueable_if_down()]);
        add(&mut st, "h", 1);
        let job = pick(&mut st);
        assert!(!job.gone.load(Ordering::Acquire));
        st.host_down(&"h");
        // The worker sees the change without the lock and takes a second look.
        assert!(job.gone.load(Ordering::Acquire));
        assert!(matches!(
            st.before_write(0, job.id, job.host_key),
            Verdict::Skip
        ));
        let finished = done.try_recv().unwrap();
        assert!(matches!(finished.done.result, Err(SendError::HostDown)));
        // The slot is free again and the worker is idle.
        assert!(!st.window_is_full(&"h", Kind(0)));
        assert_eq!(st.idle_workers.len(), st.config.workers);
        assert_eq!(
            st.stats(&"h", Kind(0), Instant::now()).unwrap().in_flight,
            0
        );
    }

    #[tokio::test]
    async fn an_entry_whose_host_is_removed_after_being_picked_fails_with_host_removed() {
        let (mut st, mut done) = state(vec![TypeConfig::new("a", 2)]);
        add(&mut st, "h", 1);
        let job = pick(&mut st);
        st.remove_host(&"h");
        assert!(job.gone.load(Ordering::Acquire));
        add(&mut st, "h", 2);
        assert!(matches!(
            st.before_write(0, job.id, job.host_key),
            Verdict::Skip
        ));
        let finished = done.try_recv().unwrap();
        assert!(matches!(finished.done.result, Err(SendError::HostRemoved)));
        // The new host of the same name is untouched by the old entry's slot.
        assert_eq!(
            st.stats(&"h", Kind(0), Instant::now()).unwrap().in_flight,
            1
        );
    }
}
