//! Admission: what `add` needs to accept a plain entry, behind a lock of its
//! own, so that adding never waits while a worker files or picks a batch
//! under the state's lock. It holds the host names and their keys, whether
//! each host is down, the intake of accepted entries not yet filed, the idle
//! workers, and whether the queue is closed.
//!
//! Lock order: the state's lock first, then this one. The state changes the
//! down flags, the names and the closed flag only while holding both, so
//! either lock alone sees them consistent.

use std::collections::HashMap;
use std::hash::Hash;

use tokio::time::Instant;

use crate::body::Body;
use crate::error::SendError;
use crate::slab::Slab;

/// An entry `add` accepted but did not file yet: a plain type (no deadline,
/// not a one-shot), so nothing but its queue position depends on filing it.
pub(crate) struct Intake<H, P, C> {
    pub(crate) body: Body<H, P>,
    pub(crate) host_key: u64,
    pub(crate) kind: usize,
    pub(crate) completion: C,
    pub(crate) added: Instant,
}

/// See the module documentation.
pub(crate) struct Admission<H, P, C> {
    names: HashMap<H, u64>,
    /// Hands out host keys; the value is whether the host is down.
    down: Slab<bool>,
    /// Accepted plain entries not filed yet, in order of adding.
    intake: Vec<Intake<H, P, C>>,
    /// When the first entry of the intake was added; see [`Admission::stamp`].
    intake_since: Instant,
    /// Workers waiting for work.
    idle_workers: Vec<usize>,
    closed: bool,
}

impl<H: Clone + Eq + Hash, P, C> Admission<H, P, C> {
    pub(crate) fn new(workers: usize) -> Self {
        Self {
            names: HashMap::new(),
            down: Slab::new(),
            intake: Vec::new(),
            intake_since: Instant::now(),
            idle_workers: (0..workers).rev().collect(),
            closed: false,
        }
    }

    /// The host's key if the queue knows the host.
    pub(crate) fn find(&self, host: &H) -> Option<u64> {
        self.names.get(host).copied()
    }

    /// Checks that an entry for `host` may be added now and returns the
    /// host's key (a new host gets one). `may_go_down`: the type is kept or
    /// sent while the host is down.
    pub(crate) fn check(&mut self, host: &H, may_go_down: bool) -> Result<u64, SendError> {
        if self.closed {
            return Err(SendError::ShuttingDown);
        }
        let key = match self.names.get(host) {
            Some(&key) => key,
            None => {
                let key = self.down.insert(false);
                self.names.insert(host.clone(), key);
                key
            }
        };
        if !may_go_down && self.down.get(key).copied().unwrap_or(false) {
            return Err(SendError::HostDown);
        }
        Ok(key)
    }

    /// Whether the host is down; `None` if the queue does not know it.
    pub(crate) fn is_down(&self, host: &H) -> Option<bool> {
        self.find(host).and_then(|key| self.down.get(key).copied())
    }

    /// Forgets a host; returns its key if it was known.
    pub(crate) fn remove(&mut self, host: &H) -> Option<u64> {
        let key = self.names.remove(host)?;
        self.down.remove(key);
        Some(key)
    }
}

impl<H, P, C> Admission<H, P, C> {
    /// The time an entry added now is stamped with, for its age in
    /// [`crate::TypeStats::oldest_queued`]: the clock is read only for the
    /// first entry of an intake, and the entries that join it before a worker
    /// (or any call that needs an exact picture) files it share that stamp.
    /// Workers file the intake each time they take work, so a busy queue reads
    /// the clock once per batch rather than once per entry; an age may be
    /// overstated by at most the time the intake waited to be filed.
    pub(crate) fn stamp(&mut self) -> Instant {
        if self.intake.is_empty() {
            self.intake_since = Instant::now();
        }
        self.intake_since
    }

    /// Appends an accepted entry to the intake and wakes every idle worker.
    pub(crate) fn push(&mut self, entry: Intake<H, P, C>, wake_worker: impl FnMut(usize)) {
        self.intake.push(entry);
        self.wake_idle(wake_worker);
    }

    /// Swaps `spare` (empty) with the intake, so the caller files the
    /// entries and the buffers are reused rather than allocated.
    pub(crate) fn take_intake(&mut self, spare: &mut Vec<Intake<H, P, C>>) {
        std::mem::swap(&mut self.intake, spare);
    }

    pub(crate) fn set_down(&mut self, key: u64, down: bool) {
        if let Some(flag) = self.down.get_mut(key) {
            *flag = down;
        }
    }

    /// Registers a worker that found nothing to do, unless entries came in
    /// meanwhile (then it should look again); returns whether it is idle.
    pub(crate) fn idle(&mut self, worker: usize) -> bool {
        if !self.intake.is_empty() {
            return false;
        }
        self.idle_workers.push(worker);
        true
    }

    /// Wakes every idle worker; they leave the idle list, so each is woken once.
    pub(crate) fn wake_idle(&mut self, wake_worker: impl FnMut(usize)) {
        self.idle_workers.drain(..).for_each(wake_worker);
    }

    /// Closes admission: returns the entries never filed and the idle workers.
    pub(crate) fn close(&mut self) -> (Vec<Intake<H, P, C>>, Vec<usize>) {
        self.closed = true;
        self.names.clear();
        (
            std::mem::take(&mut self.intake),
            std::mem::take(&mut self.idle_workers),
        )
    }
}
