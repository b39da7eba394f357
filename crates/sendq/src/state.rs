//! The queue's bookkeeping, behind one lock: hosts, their per-type queues and
//! windows, the ready queues, the round-robin list of hosts to serve, idle
//! workers, deadlines, and the batches that pass between the tasks.
//!
//! Everything here is synchronous and never waits; the tasks in
//! [`crate::queue`] and [`crate::worker`] call into it and do their waiting
//! outside the lock. Work moves in batches, so that one lock acquisition
//! serves many entries:
//!
//! - `add` checks a plain entry (no deadline, not a one-shot) under the
//!   admission lock alone ([`crate::admission`]) and appends it to the
//!   *intake*; the next holder of this lock that needs an exact picture (a
//!   worker, `stats`, `host_down`, …) files the intake into the queues first.
//!   The adding thread then writes one contiguous buffer instead of slab
//!   slots and queues that a worker on another core touched last, and never
//!   waits for a worker's batch.
//! - A worker takes a batch of jobs (runs of one host's ready entries, hosts
//!   round-robin) and hands back the results of its previous batch under the
//!   same lock acquisition.
//! - Finished entries collect in the *done* batch, which the finalizer takes
//!   whole; it is woken only when that batch goes from empty to non-empty.

use std::collections::{BTreeSet, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::admission::{Admission, Intake};
use crate::body::Body;
use crate::config::{Kind, QueueConfig};
use crate::error::{ConfigError, SendError};
use crate::slab::{Mirror, Slab};
use crate::transport::{EarlyAnswer, Request};
use crate::window::Window;

/// Most entries of one host a worker takes in a row; they are written one
/// after another, which keeps within the host's send concurrency.
const HOST_RUN: usize = 32;

/// How an entry ended, handed to its completion.
#[derive(Debug)]
pub struct Done<H, P, A> {
    /// The entry's host.
    pub host: H,
    /// The entry's request type.
    pub kind: Kind,
    /// The entry's payload, returned so that a caller can add it again.
    pub payload: P,
    /// The transport's answer, or why the entry failed.
    pub result: Result<A, SendError>,
}

/// A finished entry on its way to the finalizer.
pub(crate) struct Finished<H, P, A, C> {
    pub(crate) completion: C,
    pub(crate) done: Done<H, P, A>,
}

/// Where an entry is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// In its type queue, window closed (or host down).
    Waiting,
    /// In the host's ready queue; counts as in flight.
    Ready,
    /// Held by a send worker, which writes it or gives it back (then it is
    /// `Ready` again); still `Sending` when handed back written, until the
    /// sent event is recorded.
    Sending,
    /// Written; waiting for the answer.
    Sent,
}

struct Entry<H, P, A, C> {
    /// `None` while a send worker holds it: from being picked until the
    /// worker hands it back with the sent event (or unwritten).
    body: Option<Body<H, P>>,
    /// The host's slab key; a removed host's key finds nothing.
    host_key: u64,
    kind: usize,
    completion: C,
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

/// An entry waiting for its type's window. Plain entries wait inline, so
/// the slab holds only entries that are in flight (few, and hot in cache)
/// and a long queue is read front to back.
enum Waiter<H, P, C> {
    Plain(Intake<H, P, C>),
    /// An entry with a deadline or a prior one-shot, in the slab so the
    /// deadline watcher can find it by key.
    Keyed(u64),
}

/// A waiting queue longer than this gives its memory back once it empties.
const WAITING_KEEP: usize = 1024;

struct TypeQueue<H, P, C> {
    /// Waiting entries in order of adding; keys of entries that left early
    /// (expired) are skipped when met.
    waiting: VecDeque<Waiter<H, P, C>>,
    waiting_live: usize,
    in_flight: usize,
    window: Window,
    one_shot_busy: bool,
}

struct HostQueue<H, P, C> {
    types: Vec<TypeQueue<H, P, C>>,
    /// Entry keys in the order their windows opened (prior one-shots in front).
    ready: VecDeque<u64>,
    /// Entries of this host held by workers and not yet written. A worker
    /// starts taking a host's entries only while this is below the host's
    /// send concurrency, and writes the ones it holds one at a time, so at
    /// most that many are ever being written at once.
    sending: usize,
    in_hostq: bool,
    down: bool,
    probe_failures: u32,
}

impl<H, P, C> HostQueue<H, P, C> {
    /// Whether entries of a type go no further than their type queue now:
    /// while the host is down, all but probes (which find out when it is up).
    fn holds_back(&self, probe: bool) -> bool {
        self.down && !probe
    }
}

/// A send handed to a worker.
pub(crate) struct Job<H, P> {
    pub(crate) id: u64,
    pub(crate) host_key: u64,
    pub(crate) kind: Kind,
    pub(crate) body: Body<H, P>,
}

impl<H, P> Job<H, P> {
    /// The entry as its transport sees it, borrowed from the job.
    pub(crate) fn request(&self) -> Request<'_, H, P> {
        Request {
            host: &self.body.host,
            kind: self.kind,
            payload: &self.body.payload,
        }
    }
}

/// A job a worker has written (or failed to write), for [`State::written`].
pub(crate) struct Written<H, P, A> {
    pub(crate) job: Job<H, P>,
    pub(crate) result: Result<(), SendError>,
    /// The answer given while the transport was still writing, if any.
    pub(crate) parked: Option<EarlyAnswer<A>>,
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
    /// Age of the oldest entry not yet handed to a send worker. Entries of
    /// types without a deadline that are added in a burst share the time the
    /// burst began (the clock is read once per batch the workers take), so
    /// an age may be overstated by as long as every worker was busy writing.
    pub oldest_queued: Option<Duration>,
}

/// Tasks to wake once the lock is released; see [`State::wakes`].
pub(crate) struct Wakes {
    /// The finalizer has a batch waiting.
    pub(crate) finalizer: bool,
}

/// The queue's state; see the module documentation.
pub(crate) struct State<H, P, A, C> {
    config: Arc<QueueConfig>,
    /// Host names and keys, down flags, the intake and the idle workers.
    admission: Arc<Mutex<Admission<H, P, C>>>,
    /// Per host key (handed out by the admission).
    hosts: Mirror<HostQueue<H, P, C>>,
    entries: Slab<Entry<H, P, A, C>>,
    /// The intake's other buffer, kept so filing allocates nothing.
    intake_spare: Vec<Intake<H, P, C>>,
    /// Keys of hosts with ready entries and a free send slot, served round-robin.
    hostq: VecDeque<u64>,
    deadlines: BTreeSet<(Instant, u64)>,
    /// Finished entries for the finalizer, in the order they finished.
    done: Vec<Finished<H, P, A, C>>,
    /// `done` went from empty to non-empty since the last [`State::wakes`].
    wake_finalizer: bool,
    /// Counts host-down, host-removed and shutdown events, so a worker holding
    /// picked jobs sees without the lock whether they need a second look.
    changes: Arc<AtomicU64>,
    closed: bool,
}

impl<H, P, A, C> State<H, P, A, C>
where
    H: Clone + Eq + Hash,
{
    pub(crate) fn new(
        config: Arc<QueueConfig>,
        admission: Arc<Mutex<Admission<H, P, C>>>,
        changes: Arc<AtomicU64>,
    ) -> Self {
        Self {
            config,
            admission,
            hosts: Mirror::new(),
            entries: Slab::new(),
            intake_spare: Vec::new(),
            hostq: VecDeque::new(),
            deadlines: BTreeSet::new(),
            done: Vec::new(),
            wake_finalizer: false,
            changes,
            closed: false,
        }
    }

    /// The host's queues, made on first use of a key the admission handed out.
    fn host_mut(&mut self, host_key: u64) -> Option<&mut HostQueue<H, P, C>> {
        if self.hosts.get(host_key).is_none() {
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
                down: false,
                probe_failures: 0,
            };
            self.hosts.insert(host_key, hq);
        }
        self.hosts.get_mut(host_key)
    }

    /// Adds an entry of a type with a deadline or a prior one-shot (plain
    /// entries go to the admission's intake). Returns whether the entry set
    /// the earliest deadline (the expiry task should wake).
    pub(crate) fn add(
        &mut self,
        body: Body<H, P>,
        kind: Kind,
        completion: C,
        now: Instant,
    ) -> Result<bool, SendError> {
        let Some(tc) = self.config.types.get(kind.0) else {
            return Err(ConfigError::UnknownKind(kind.0).into());
        };
        let (one_shot, probe, may_go_down, deadline) = (
            tc.prior_one_shot,
            tc.probe.is_some(),
            tc.queueable_if_down || tc.probe.is_some(),
            tc.deadline.map(|d| now + d),
        );
        let host_key = self.admit().check(&body.host, may_go_down)?;
        if one_shot
            && self
                .hosts
                .get(host_key)
                .is_some_and(|hq| hq.types[kind.0].one_shot_busy)
        {
            return Err(SendError::Busy);
        }
        // Entries added before this one are filed first, so order holds.
        self.absorb();
        let id = self.entries.insert(Entry {
            body: Some(body),
            host_key,
            kind: kind.0,
            completion,
            added: now,
            deadline,
            stage: Stage::Waiting,
            early: None,
            started: None,
        });
        let Some(hq) = self.host_mut(host_key) else {
            return Err(SendError::HostRemoved);
        };
        let held_back = hq.holds_back(probe);
        let tq = &mut hq.types[kind.0];
        if one_shot && !held_back && tq.in_flight < tq.window.limit() {
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
                tq.waiting.push_front(Waiter::Keyed(id));
            } else {
                tq.waiting.push_back(Waiter::Keyed(id));
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

    /// Files the intake into the type queues, in order of adding.
    pub(crate) fn absorb(&mut self) {
        let mut batch = std::mem::take(&mut self.intake_spare);
        self.admit().take_intake(&mut batch);
        self.file(&mut batch);
        self.intake_spare = batch;
    }

    fn file(&mut self, batch: &mut Vec<Intake<H, P, C>>) {
        for new in batch.drain(..) {
            let (host_key, kind) = (new.host_key, new.kind);
            if let Some(hq) = self.host_mut(host_key) {
                let tq = &mut hq.types[kind];
                tq.waiting_live += 1;
                tq.waiting.push_back(Waiter::Plain(new));
                self.promote(host_key, kind);
                self.schedule(host_key);
            }
        }
    }

    /// Moves waiting entries of one type into the ready queue while its window is open.
    fn promote(&mut self, host_key: u64, kind: usize) {
        let tc = &self.config.types[kind];
        let Some(hq) = self.hosts.get_mut(host_key) else {
            return;
        };
        if hq.holds_back(tc.probe.is_some()) {
            return;
        }
        let tq = &mut hq.types[kind];
        while tq.in_flight < tq.window.limit() {
            let Some(waiter) = tq.waiting.pop_front() else {
                if tq.waiting.capacity() > WAITING_KEEP {
                    tq.waiting.shrink_to_fit();
                }
                break;
            };
            let id = match waiter {
                Waiter::Plain(new) => self.entries.insert(Entry {
                    body: Some(new.body),
                    host_key: new.host_key,
                    kind: new.kind,
                    completion: new.completion,
                    added: new.added,
                    deadline: None,
                    stage: Stage::Ready,
                    early: None,
                    started: None,
                }),
                Waiter::Keyed(id) => {
                    let Some(e) = self.entries.get_mut(id) else {
                        continue;
                    };
                    if e.stage != Stage::Waiting {
                        continue;
                    }
                    e.stage = Stage::Ready;
                    id
                }
            };
            tq.waiting_live -= 1;
            tq.in_flight += 1;
            if tc.prior_one_shot {
                hq.ready.push_front(id);
            } else {
                hq.ready.push_back(id);
            }
        }
    }

    /// Puts a host on the round-robin list if it has ready entries and a free send slot.
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

    /// Fills `jobs` with up to `limit` entries to write: from the host at the
    /// head of the round-robin list, a run of its first ready entries (at most
    /// [`HOST_RUN`]); the host then goes to the back of the list.
    pub(crate) fn pick(&mut self, jobs: &mut VecDeque<Job<H, P>>, limit: usize) {
        // Read the clock at most once, and only for entries that need it.
        let mut clock = None;
        let mut now = || *clock.get_or_insert_with(Instant::now);
        while jobs.len() < limit {
            let Some(host_key) = self.hostq.pop_front() else {
                break;
            };
            let Some(hq) = self.hosts.get_mut(host_key) else {
                continue;
            };
            hq.in_hostq = false;
            if hq.sending >= self.config.per_host_sends {
                continue;
            }
            let mut run = 0;
            while run < HOST_RUN && jobs.len() < limit {
                let Some(hq) = self.hosts.get_mut(host_key) else {
                    break;
                };
                let Some(id) = hq.ready.pop_front() else {
                    break;
                };
                let Some(e) = self.entries.get_mut(id) else {
                    continue;
                };
                if e.stage != Stage::Ready || e.host_key != host_key {
                    continue;
                }
                if e.deadline.is_some_and(|d| d <= now()) {
                    // May promote more entries of this host; the run goes on.
                    self.expire(id);
                    continue;
                }
                // A ready entry always has its body; the worker holds it now.
                let Some(body) = e.body.take() else {
                    continue;
                };
                e.stage = Stage::Sending;
                if self.config.types[e.kind].adaptive.is_some() {
                    e.started = Some(now());
                }
                if let Some(d) = e.deadline {
                    self.deadlines.remove(&(d, id));
                }
                hq.sending += 1;
                jobs.push_back(Job {
                    id,
                    host_key,
                    kind: Kind(e.kind),
                    body,
                });
                run += 1;
            }
            self.schedule(host_key);
        }
    }

    /// Called by a worker before writing a job whose host may have changed
    /// since it was picked: fails the entry with "host down" if its host went
    /// down (or "host removed" if it is gone) and frees its slot.
    /// Returns the job if it should still be written.
    pub(crate) fn before_write(&mut self, job: Job<H, P>) -> Option<Job<H, P>> {
        let Some(err) = self.refusal(job.kind.0, job.host_key) else {
            return Some(job);
        };
        let (id, host_key) = (job.id, job.host_key);
        self.restore(job);
        self.finish(id, Err(err));
        self.release_host(host_key);
        None
    }

    /// Gives back the body of a job a worker did not hand to its transport:
    /// the entry is ready again, as if it had never been picked.
    fn restore(&mut self, job: Job<H, P>) {
        if let Some(e) = self.entries.get_mut(job.id) {
            e.body = Some(job.body);
            e.stage = Stage::Ready;
            e.started = None;
        }
    }

    /// Why an entry of `kind` may not be written to this host now, if it may not.
    fn refusal(&self, kind: usize, host_key: u64) -> Option<SendError> {
        if self.closed {
            return Some(SendError::ShuttingDown);
        }
        let probe = self.config.types[kind].probe.is_some();
        match self.hosts.get(host_key) {
            Some(hq) => hq.holds_back(probe).then_some(SendError::HostDown),
            None => Some(SendError::HostRemoved),
        }
    }

    /// Takes back jobs a worker picked but will not write now (its transport
    /// made it wait): they return to the front of their host's ready queue,
    /// in order, behind any prior one-shot that arrived meanwhile.
    pub(crate) fn hand_back(&mut self, jobs: &mut VecDeque<Job<H, P>>) {
        while let Some(job) = jobs.pop_back() {
            let (id, host_key, kind) = (job.id, job.host_key, job.kind.0);
            self.restore(job);
            if let Some(err) = self.refusal(kind, host_key) {
                self.finish(id, Err(err));
                self.release_host(host_key);
                continue;
            }
            if let Some(d) = self.entries.get(id).and_then(|e| e.deadline) {
                self.deadlines.insert((d, id));
            }
            if let Some(hq) = self.hosts.get_mut(host_key) {
                let entries = &self.entries;
                let types = &self.config.types;
                let front = hq
                    .ready
                    .iter()
                    .take_while(|&&r| entries.get(r).is_some_and(|e| types[e.kind].prior_one_shot))
                    .count();
                hq.ready.insert(front, id);
            }
            self.release_host(host_key);
        }
    }

    fn release_host(&mut self, host_key: u64) {
        if let Some(hq) = self.hosts.get_mut(host_key) {
            hq.sending -= 1;
            self.schedule(host_key);
        }
    }

    /// The sent events of a worker's batch: each transport's send future
    /// resolved with its result.
    pub(crate) fn written(&mut self, batch: &mut Vec<Written<H, P, A>>) {
        for Written {
            job,
            result,
            parked,
        } in batch.drain(..)
        {
            let (id, host_key) = (job.id, job.host_key);
            self.release_host(host_key);
            let Some(e) = self.entries.get_mut(id) else {
                continue;
            };
            e.body = Some(job.body);
            match (result, parked.or_else(|| e.early.take().map(|b| *b))) {
                // A write error explains a reply dropped on the way out better
                // than "connection aborted" does.
                (Err(err), Some((_, true)) | None) => self.finish(id, Err(err)),
                (_, Some((answer, _))) => self.finish(id, answer),
                // Nothing will wait for the answer of a queue that is shutting down.
                (Ok(()), None) if self.closed => self.finish(id, Err(SendError::ShuttingDown)),
                (Ok(()), None) => e.stage = Stage::Sent,
            }
        }
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
        // An entry a worker holds finishes when the worker hands it back.
        if self.entries.get(id).is_none_or(|e| e.body.is_none()) {
            return;
        }
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
            // Only an entry its transport was given says something about
            // the host (an entry refused before its write is ready again).
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
        let key = self.admit().find(host);
        if let Some(key) = key {
            self.down(key);
        }
    }

    fn down(&mut self, host_key: u64) {
        // Entries accepted before the host went down are filed first, so
        // they meet the same fate as if they had been filed at once.
        let mut batch = std::mem::take(&mut self.intake_spare);
        {
            let mut admission = self.admit();
            admission.set_down(host_key, true);
            admission.take_intake(&mut batch);
        }
        self.file(&mut batch);
        self.intake_spare = batch;
        let Some(hq) = self.hosts.get_mut(host_key) else {
            return;
        };
        hq.down = true;
        self.changes.fetch_add(1, Ordering::Release);
        let ready: Vec<u64> = hq.ready.drain(..).collect();
        let mut refused = Vec::new();
        for (kind, tq) in hq.types.iter_mut().enumerate() {
            let tc = &self.config.types[kind];
            if !tc.queueable_if_down && tc.probe.is_none() {
                refused.extend(tq.waiting.drain(..));
            }
        }
        let refused = self.unfile(host_key, refused);
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
        self.absorb();
        let key = self.admit().find(host);
        if let Some(key) = key {
            self.up(key);
        }
    }

    fn up(&mut self, host_key: u64) {
        self.admit().set_down(host_key, false);
        let Some(hq) = self.hosts.get_mut(host_key) else {
            return;
        };
        hq.down = false;
        hq.probe_failures = 0;
        for kind in 0..self.config.types.len() {
            self.promote(host_key, kind);
        }
        self.schedule(host_key);
    }

    /// Removes a host: every entry not yet handed to a worker fails with
    /// "host removed"; entries being written or sent are settled by their transport.
    pub(crate) fn remove_host(&mut self, host: &H) {
        // Entries accepted before the removal are filed first, so they fail with the rest.
        let mut batch = std::mem::take(&mut self.intake_spare);
        let key = {
            let mut admission = self.admit();
            admission.take_intake(&mut batch);
            admission.remove(host)
        };
        self.file(&mut batch);
        self.intake_spare = batch;
        let Some(host_key) = key else {
            return;
        };
        let Some(hq) = self.hosts.get_mut(host_key) else {
            return;
        };
        self.changes.fetch_add(1, Ordering::Release);
        let mut unsent: Vec<u64> = hq.ready.drain(..).collect();
        let mut waiting = Vec::new();
        for tq in &mut hq.types {
            waiting.extend(tq.waiting.drain(..));
        }
        unsent.extend(self.unfile(host_key, waiting));
        for id in unsent {
            if self
                .entries
                .get(id)
                .is_some_and(|e| matches!(e.stage, Stage::Waiting | Stage::Ready))
            {
                self.finish(id, Err(SendError::HostRemoved));
            }
        }
        self.hosts.remove(host_key);
    }

    /// Fails nothing yet: takes waiting entries out of their queue, files
    /// the plain ones in the slab (as waiting) and returns every key, so the
    /// caller can fail them all alike.
    fn unfile(&mut self, host_key: u64, waiters: Vec<Waiter<H, P, C>>) -> Vec<u64> {
        let mut keys = Vec::with_capacity(waiters.len());
        for waiter in waiters {
            keys.push(match waiter {
                Waiter::Keyed(id) => id,
                Waiter::Plain(new) => self.entries.insert(Entry {
                    body: Some(new.body),
                    host_key,
                    kind: new.kind,
                    completion: new.completion,
                    added: new.added,
                    deadline: None,
                    stage: Stage::Waiting,
                    early: None,
                    started: None,
                }),
            });
        }
        keys
    }

    fn host(&self, host: &H) -> Option<&HostQueue<H, P, C>> {
        let key = self.admit().find(host)?;
        self.hosts.get(key)
    }

    pub(crate) fn window_is_full(&mut self, host: &H, kind: Kind) -> bool {
        self.absorb();
        self.host(host)
            .and_then(|hq| hq.types.get(kind.0))
            .is_some_and(|tq| tq.in_flight >= tq.window.limit())
    }

    pub(crate) fn stats(&mut self, host: &H, kind: Kind, now: Instant) -> Option<TypeStats> {
        self.absorb();
        let hq = self.host(host)?;
        let tq = hq.types.get(kind.0)?;
        let queued_at = |id: &u64, stage| {
            self.entries
                .get(*id)
                .filter(|e| e.stage == stage && e.kind == kind.0)
                .map(|e| e.added)
        };
        let oldest = [
            tq.waiting.iter().find_map(|w| match w {
                Waiter::Plain(new) => Some(new.added),
                Waiter::Keyed(id) => queued_at(id, Stage::Waiting),
            }),
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
impl<H, P, A, C> State<H, P, A, C> {
    /// True once [`State::close`] ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// True once the queue is closed and every entry has gone to the finalizer.
    pub(crate) fn is_drained(&self) -> bool {
        self.closed && self.entries.is_empty()
    }

    /// Sends a finished entry to the finalizer; `finish` and `close` never
    /// take an entry whose body a worker holds.
    fn deliver(&mut self, e: Entry<H, P, A, C>, result: Result<A, SendError>) {
        if let Some(body) = e.body {
            self.push_done(Finished {
                completion: e.completion,
                done: Done {
                    host: body.host,
                    kind: Kind(e.kind),
                    payload: body.payload,
                    result,
                },
            });
        }
    }

    fn push_done(&mut self, finished: Finished<H, P, A, C>) {
        self.wake_finalizer |= self.done.is_empty();
        self.done.push(finished);
    }

    fn admit(&self) -> MutexGuard<'_, Admission<H, P, C>> {
        self.admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A worker found nothing to do: it is registered as idle, unless
    /// entries came in meanwhile. Returns whether it is idle.
    pub(crate) fn idle(&mut self, worker: usize) -> bool {
        self.admit().idle(worker)
    }

    /// Which tasks to wake now: every idle worker if a host is ready (they
    /// leave the idle list, so each is woken once; the intake wakes them
    /// itself), and the finalizer if its batch went from empty to non-empty.
    pub(crate) fn wakes(&mut self, wake_worker: impl FnMut(usize)) -> Wakes {
        if !self.hostq.is_empty() {
            self.admit().wake_idle(wake_worker);
        }
        Wakes {
            finalizer: std::mem::take(&mut self.wake_finalizer),
        }
    }

    /// Swaps the finalizer's empty buffer with the batch of finished entries.
    pub(crate) fn take_done(&mut self, batch: &mut Vec<Finished<H, P, A, C>>) {
        std::mem::swap(&mut self.done, batch);
    }

    /// Shuts down: every entry not yet finished fails with "shutting down",
    /// new entries are refused, and the finalizer ends once it has run the
    /// last batch. Returns the idle workers, which should be woken to end.
    pub(crate) fn close(&mut self) -> Vec<usize> {
        self.closed = true;
        self.changes.fetch_add(1, Ordering::Release);
        let (mut intake, idle) = self
            .admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .close();
        for key in self.hosts.keys() {
            if let Some(hq) = self.hosts.remove(key) {
                for tq in hq.types {
                    intake.extend(tq.waiting.into_iter().filter_map(|w| match w {
                        Waiter::Plain(new) => Some(new),
                        Waiter::Keyed(_) => None,
                    }));
                }
            }
        }
        self.hostq.clear();
        self.deadlines.clear();
        // Entries a worker holds finish when it hands them back, which
        // closing makes it do at once (see `crate::worker`).
        for id in self.entries.keys() {
            if self.entries.get(id).is_some_and(|e| e.body.is_some())
                && let Some(e) = self.entries.remove(id)
            {
                self.deliver(e, Err(SendError::ShuttingDown));
            }
        }
        for new in intake.drain(..) {
            self.push_done(Finished {
                completion: new.completion,
                done: Done {
                    host: new.body.host,
                    kind: Kind(new.kind),
                    payload: new.body.payload,
                    result: Err(SendError::ShuttingDown),
                },
            });
        }
        // The finalizer must look once more even with nothing left, to end.
        self.wake_finalizer = true;
        idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TypeConfig;

    type TestState = State<&'static str, u32, u32, ()>;

    fn state(types: Vec<TypeConfig>) -> TestState {
        let config = Arc::new(QueueConfig::new(types));
        let admission = Arc::new(Mutex::new(Admission::new(config.workers)));
        State::new(config, admission, Arc::new(AtomicU64::new(0)))
    }

    /// Adds a plain entry the way `SendQueue::add` does: through the intake.
    fn add(st: &mut TestState, host: &'static str, payload: u32) {
        let mut admission = st.admit();
        let host_key = admission.check(&host, true).unwrap();
        let entry = Intake {
            body: Body { host, payload },
            host_key,
            kind: 0,
            completion: (),
            added: Instant::now(),
        };
        admission.push(entry, |_| {});
    }

    fn pick(st: &mut TestState, limit: usize) -> VecDeque<Job<&'static str, u32>> {
        st.absorb();
        let mut jobs = VecDeque::new();
        st.pick(&mut jobs, limit);
        jobs
    }

    fn payloads(jobs: &VecDeque<Job<&'static str, u32>>) -> Vec<(&'static str, u32)> {
        jobs.iter().map(|j| (j.body.host, j.body.payload)).collect()
    }

    fn done(st: &mut TestState) -> Vec<Finished<&'static str, u32, u32, ()>> {
        let mut batch = Vec::new();
        st.take_done(&mut batch);
        batch
    }

    /// The sent event of `job`, answered while it was being written.
    fn answered(job: Job<&'static str, u32>) -> Written<&'static str, u32, u32> {
        let answer = job.body.payload;
        Written {
            job,
            result: Ok(()),
            parked: Some((Ok(answer), false)),
        }
    }

    #[tokio::test]
    async fn an_entry_whose_host_goes_down_after_being_picked_fails_with_host_down() {
        let mut st = state(vec![TypeConfig::new("a", 2).queueable_if_down()]);
        add(&mut st, "h", 1);
        let job = pick(&mut st, 8).pop_front().unwrap();
        let seen = st.changes.load(Ordering::Acquire);
        st.host_down(&"h");
        // The worker sees the change without the lock and takes a second look.
        assert_ne!(st.changes.load(Ordering::Acquire), seen);
        assert!(st.before_write(job).is_none());
        let finished = done(&mut st);
        assert_eq!(finished.len(), 1);
        assert!(matches!(finished[0].done.result, Err(SendError::HostDown)));
        // The slot is free again.
        assert!(!st.window_is_full(&"h", Kind(0)));
        let stats = st.stats(&"h", Kind(0), Instant::now()).unwrap();
        assert_eq!(stats.in_flight, 0);
    }

    /// Jobs refused before they were handed to the transport (their host
    /// went down after they were picked) were never written: they say
    /// nothing about the host, so the adaptive window keeps its size.
    #[tokio::test]
    async fn jobs_refused_before_their_write_leave_the_adaptive_window_alone() {
        let adaptive = crate::config::Adaptive {
            min: 1,
            max: 8,
            latency_target: Duration::from_secs(1),
        };
        let mut st = state(vec![
            TypeConfig::new("a", 4)
                .queueable_if_down()
                .adaptive(adaptive),
        ]);
        for i in 1..=3 {
            add(&mut st, "h", i);
        }
        let mut jobs = pick(&mut st, 8);
        assert_eq!(jobs.len(), 3);
        st.host_down(&"h");
        // One job checked before its write, the others handed back after
        // the first write made the worker wait.
        let first = jobs.pop_front().unwrap();
        assert!(st.before_write(first).is_none());
        st.hand_back(&mut jobs);
        let finished = done(&mut st);
        assert_eq!(finished.len(), 3);
        assert!(
            finished
                .iter()
                .all(|f| matches!(f.done.result, Err(SendError::HostDown)))
        );
        let stats = st.stats(&"h", Kind(0), Instant::now()).unwrap();
        assert_eq!((stats.in_flight, stats.window), (0, 4));
    }

    #[tokio::test]
    async fn an_entry_whose_host_is_removed_after_being_picked_fails_with_host_removed() {
        let mut st = state(vec![TypeConfig::new("a", 2)]);
        add(&mut st, "h", 1);
        let job = pick(&mut st, 8).pop_front().unwrap();
        st.remove_host(&"h");
        add(&mut st, "h", 2);
        assert!(st.before_write(job).is_none());
        let finished = done(&mut st);
        assert_eq!(finished.len(), 1);
        assert!(matches!(
            finished[0].done.result,
            Err(SendError::HostRemoved)
        ));
        // The new host of the same name is untouched by the old entry's slot.
        let stats = st.stats(&"h", Kind(0), Instant::now()).unwrap();
        assert_eq!(stats.in_flight, 1);
    }

    #[tokio::test]
    async fn a_batch_takes_runs_of_each_hosts_entries_and_the_hosts_wait_for_them() {
        let mut st = state(vec![TypeConfig::new("a", 3)]);
        for i in 1..=4 {
            add(&mut st, "h", i);
        }
        add(&mut st, "g", 10);
        let jobs = pick(&mut st, 16);
        // The window of 3 lets three of h's entries be ready; a run takes them in order.
        assert_eq!(
            payloads(&jobs),
            vec![("h", 1), ("h", 2), ("h", 3), ("g", 10)]
        );
        // Both hosts are sending: nothing more until the batch is written.
        assert!(pick(&mut st, 16).is_empty());
        let mut written: Vec<_> = jobs.into_iter().map(answered).collect();
        st.written(&mut written);
        assert_eq!(payloads(&pick(&mut st, 16)), vec![("h", 4)]);
        assert_eq!(done(&mut st).len(), 4);
    }

    #[tokio::test]
    async fn a_batch_stops_at_its_limit_and_the_rest_stays_ready() {
        let mut st = state(vec![TypeConfig::new("a", 10)]);
        for i in 1..=5 {
            add(&mut st, "h", i);
        }
        let jobs = pick(&mut st, 2);
        assert_eq!(payloads(&jobs), vec![("h", 1), ("h", 2)]);
        let mut written: Vec<_> = jobs.into_iter().map(answered).collect();
        st.written(&mut written);
        assert_eq!(
            payloads(&pick(&mut st, 8)),
            vec![("h", 3), ("h", 4), ("h", 5)]
        );
    }

    #[tokio::test]
    async fn handed_back_jobs_return_in_order_behind_a_probe_that_came_meanwhile() {
        let mut st = state(vec![TypeConfig::new("a", 10), TypeConfig::probe("p", 3)]);
        for i in 1..=3 {
            add(&mut st, "h", i);
        }
        let mut jobs = pick(&mut st, 8);
        assert_eq!(payloads(&jobs), vec![("h", 1), ("h", 2), ("h", 3)]);
        // The first write waits on the network; meanwhile a probe arrives.
        let first = jobs.pop_front().unwrap();
        let probe = Body {
            host: "h",
            payload: 99,
        };
        st.add(probe, Kind(1), (), Instant::now()).unwrap();
        st.hand_back(&mut jobs);
        assert!(jobs.is_empty());
        // The host is still sending the first entry.
        assert!(pick(&mut st, 8).is_empty());
        let stats = st.stats(&"h", Kind(0), Instant::now()).unwrap();
        assert_eq!((stats.in_flight, stats.queued), (3, 0));
        st.written(&mut vec![answered(first)]);
        assert_eq!(
            payloads(&pick(&mut st, 8)),
            vec![("h", 99), ("h", 2), ("h", 3)]
        );
    }

    #[tokio::test]
    async fn closing_fails_entries_in_the_intake_and_in_the_queues() {
        let mut st = state(vec![TypeConfig::new("a", 1)]);
        add(&mut st, "h", 1);
        add(&mut st, "h", 2);
        let mut jobs = pick(&mut st, 8);
        assert_eq!(jobs.len(), 1);
        add(&mut st, "h", 3);
        // The first add woke (and so unlisted) every idle worker.
        assert!(st.close().is_empty());
        let fates = |st: &mut TestState| -> Vec<u32> {
            let mut finished: Vec<u32> = done(st)
                .into_iter()
                .map(|f| {
                    assert!(matches!(f.done.result, Err(SendError::ShuttingDown)));
                    f.done.payload
                })
                .collect();
            finished.sort_unstable();
            finished
        };
        // Waiting inline (2) and never filed (3).
        assert_eq!(fates(&mut st), vec![2, 3]);
        // Being written (1): it fails once its worker hands it back.
        assert!(!st.is_drained());
        let job = jobs.pop_front().unwrap();
        assert!(st.before_write(job).is_none());
        assert_eq!(fates(&mut st), vec![1]);
        assert!(st.is_drained());
    }
}
