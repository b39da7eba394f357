//! The writer task: every change to the store goes through it, so changes
//! that arrive together share one durable commit (group commit), and the
//! dispatcher learns about every entry placed behind its read cursor.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};

use crate::StoreError;
use crate::entry::Position;
use crate::stats::Counters;
use crate::store::{Applied, Op, Store};

/// The most ops committed in one transaction.
const MAX_OPS: usize = 8192;

/// State the writer and the callers share with the dispatcher.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// News for the dispatcher, drained on each of its wake-ups.
    pub(crate) inbox: Mutex<Inbox>,
    /// The earliest due second the idle dispatcher waits for; a placed entry
    /// due at or before it wakes the dispatcher early.
    pub(crate) deadline: AtomicU64,
    /// Wakes the dispatcher.
    pub(crate) wake: Notify,
    /// Counters for stats.
    pub(crate) counters: Counters,
}

/// What happened in the store since the dispatcher last looked.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    /// Per source, the earliest position where an entry was placed.
    pub(crate) placed: HashMap<String, Position>,
    /// Handed-out entries whose outcome is now durable.
    pub(crate) settled: Vec<(String, Position)>,
}

impl Inbox {
    /// Records an entry placed at `at` in `source`; returns whether it is
    /// due by `deadline` (the dispatcher should wake).
    fn place(&mut self, source: &str, at: &Position, deadline: u64) -> bool {
        match self.placed.get_mut(source) {
            Some(p) => {
                if *at < *p {
                    *p = at.clone();
                }
            }
            None => {
                self.placed.insert(source.to_owned(), at.clone());
            }
        }
        at.due <= deadline
    }
}

impl Shared {
    /// The dispatcher is about to sleep until `next_due`: publishes that
    /// deadline, so that a placement due by then wakes it. Returns `false`
    /// (and withdraws the deadline) if something was placed since the
    /// dispatcher last read the inbox: it must look at that first.
    pub(crate) fn may_sleep(&self, next_due: u64) -> bool {
        self.deadline.store(next_due, Ordering::SeqCst);
        if self.inbox().placed.is_empty() {
            return true;
        }
        self.awake();
        false
    }

    /// The dispatcher is awake and reads the inbox anyway: placements need
    /// not wake it.
    pub(crate) fn awake(&self) {
        self.deadline.store(0, Ordering::SeqCst);
    }

    pub(crate) fn inbox(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Who is waiting for a write.
#[derive(Debug)]
pub(crate) enum Waiter {
    /// A caller, told the result.
    Caller(oneshot::Sender<Result<Vec<Applied>, StoreError>>),
    /// The dispatcher's record of finished deliveries: retried until it
    /// succeeds, then the handed-out entries its removals and moves name
    /// are settled.
    Background,
}

/// A batch of ops that must be applied together.
#[derive(Debug)]
pub(crate) struct WriteRequest {
    pub(crate) ops: Vec<Op>,
    pub(crate) waiter: Waiter,
}

/// Runs until every sender is gone; background writes still failing then
/// are tried once more and dropped. With at-least-once delivery their
/// entries stay stored as they were and are handed out again. With
/// at-most-once delivery an entry was removed before its handler ran, so a
/// `Failed` or `Reschedule` outcome that cannot be put back is lost, as in
/// a crash at that moment: it is logged and counted in `Stats::lost`.
pub(crate) async fn run<S: Store>(
    store: Arc<S>,
    shared: Arc<Shared>,
    mut requests: mpsc::UnboundedReceiver<WriteRequest>,
    backoff: Duration,
    backoff_max: Duration,
) {
    let mut retry: Vec<WriteRequest> = Vec::new();
    let mut failures = 0u32;
    let mut open = true;
    while open || !retry.is_empty() {
        let mut batch = Vec::new();
        if retry.is_empty() {
            match requests.recv().await {
                Some(request) => batch.push(request),
                None => break,
            }
        } else {
            let delay = backoff
                .saturating_mul(1 << failures.min(16))
                .min(backoff_max);
            if open {
                tokio::select! {
                    request = requests.recv() => match request {
                        Some(request) => batch.push(request),
                        None => open = false,
                    },
                    () = tokio::time::sleep(delay) => {}
                }
            }
            batch.append(&mut retry);
        }
        let mut ops: usize = batch.iter().map(|r| r.ops.len()).sum();
        while ops < MAX_OPS {
            match requests.try_recv() {
                Ok(request) => {
                    ops += request.ops.len();
                    batch.push(request);
                }
                Err(_) => break,
            }
        }
        let failed = commit(&store, &shared, batch).await;
        if failed.is_empty() {
            failures = 0;
        } else {
            failures = failures.saturating_add(1);
            if !open {
                // Last try after close: what still fails is dropped.
                for request in commit(&store, &shared, failed).await {
                    lost(&shared, &request.ops);
                }
                break;
            }
            retry = failed;
        }
    }
}

/// Reports the at-most-once entries among dropped ops: removed before
/// their handler ran and not put back, they are gone. (Dropped removals and
/// moves leave their entry stored, to be handed out again.)
fn lost(shared: &Shared, ops: &[Op]) {
    for op in ops {
        if let Op::Restore(entry) = op {
            Counters::bump(&shared.counters.lost, 1);
            tracing::error!(source = %entry.source, id = %entry.id, "putting back a handed-out entry failed until the scheduler closed; it is lost");
        }
    }
}

/// Applies `ops` on a blocking thread, handing the ops back for a retry.
async fn apply<S: Store>(
    store: &Arc<S>,
    ops: Vec<Op>,
) -> (Vec<Op>, Result<Vec<Applied>, StoreError>) {
    let store = Arc::clone(store);
    let blocking = tokio::task::spawn_blocking(move || {
        // A panicking store must not take the ops with it: they are retried.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| store.apply(&ops)))
            .unwrap_or_else(|_| Err(StoreError::Backend("the store panicked".into())));
        (ops, result)
    });
    match blocking.await {
        Ok(done) => done,
        // Only cancellation of the runtime gets here; nothing was applied.
        Err(e) => (Vec::new(), Err(StoreError::Backend(e.to_string().into()))),
    }
}

/// Commits a batch in one transaction; if that fails, each request on its
/// own so one bad request cannot fail the others. Returns the background
/// requests that failed.
async fn commit<S: Store>(
    store: &Arc<S>,
    shared: &Shared,
    batch: Vec<WriteRequest>,
) -> Vec<WriteRequest> {
    let lens: Vec<usize> = batch.iter().map(|r| r.ops.len()).collect();
    let mut waiters = Vec::with_capacity(batch.len());
    let mut all = Vec::new();
    for request in batch {
        all.extend(request.ops);
        waiters.push(request.waiter);
    }
    let (all, result) = apply(store, all).await;
    let mut failed = Vec::new();
    match result {
        Ok(applied) => {
            let mut applied = applied.into_iter();
            let mut start = 0;
            for (waiter, n) in waiters.into_iter().zip(lens) {
                let ops = &all[start..start + n];
                finish(shared, waiter, ops, applied.by_ref().take(n).collect());
                start += n;
            }
        }
        Err(e) if waiters.len() == 1 => {
            if let Some(waiter) = waiters.pop() {
                fail(shared, WriteRequest { ops: all, waiter }, e, &mut failed);
            }
        }
        Err(_) => {
            let mut rest = all.into_iter();
            for (waiter, n) in waiters.into_iter().zip(lens) {
                let (ops, result) = apply(store, rest.by_ref().take(n).collect()).await;
                match result {
                    Ok(applied) => finish(shared, waiter, &ops, applied),
                    Err(e) => fail(shared, WriteRequest { ops, waiter }, e, &mut failed),
                }
            }
        }
    }
    failed
}

/// Tells the dispatcher what was placed and settled, then the waiter.
pub(crate) fn finish(shared: &Shared, waiter: Waiter, ops: &[Op], applied: Vec<Applied>) {
    let mut wake = false;
    let reply = {
        let mut inbox = shared.inbox();
        // Read under the inbox lock: a dispatcher that published its
        // deadline after this read checks the inbox after this placement.
        let deadline = shared.deadline.load(Ordering::SeqCst);
        for a in &applied {
            if let Applied::Placed { source, at } = a {
                wake |= inbox.place(source, at, deadline);
            }
        }
        match waiter {
            Waiter::Background => {
                for (op, a) in ops.iter().zip(&applied) {
                    let (Op::Remove(entry) | Op::Move { entry, .. }) = op else {
                        continue;
                    };
                    let at = entry.position();
                    if *a == Applied::Unchanged {
                        // A caller moved, removed or replaced the entry while
                        // it was handled: a replacement at the same place was
                        // passed over as in flight, so read from there again.
                        wake |= inbox.place(&entry.source, &at, deadline);
                    }
                    inbox.settled.push((entry.source.clone(), at));
                }
                None
            }
            Waiter::Caller(reply) => Some(reply),
        }
    };
    if wake {
        shared.wake.notify_one();
    }
    if let Some(reply) = reply {
        // The caller may have stopped waiting; the write stands either way.
        let _ = reply.send(Ok(applied));
    }
}

/// A store's hold ended without its outcomes (`ops`, each naming its
/// entry as it was read): the entries are due again as they were, so the
/// dispatcher reads them again.
pub(crate) fn unsettled(shared: &Shared, ops: &[Op], e: &StoreError) {
    Counters::bump(&shared.counters.write_errors, 1);
    tracing::warn!(error = %e, entries = ops.len(), "recording finished deliveries in their claim failed; they are due again");
    finish(
        shared,
        Waiter::Background,
        ops,
        vec![Applied::Unchanged; ops.len()],
    );
}

/// Reports a failed write: to its caller, or queues a background one for retry.
fn fail(shared: &Shared, request: WriteRequest, e: StoreError, failed: &mut Vec<WriteRequest>) {
    match request.waiter {
        Waiter::Caller(reply) => {
            let _ = reply.send(Err(e));
        }
        Waiter::Background => {
            Counters::bump(&shared.counters.write_errors, 1);
            tracing::warn!(error = %e, "recording finished deliveries failed; will retry");
            failed.push(request);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Waker};

    use super::*;

    /// A pseudo-random busy wait, so that the two sides meet at every offset.
    fn spin(seed: &mut u64) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        for _ in 0..*seed % 256 {
            std::hint::spin_loop();
        }
    }

    /// Waits until `counter` reaches `n`, busy at first (so both threads
    /// leave the barrier within nanoseconds of each other), then giving the
    /// core away (the other thread may be waiting for it).
    fn reach(counter: &AtomicUsize, n: usize) {
        let mut spins = 0u32;
        while counter.load(Ordering::Acquire) < n {
            spins += 1;
            if spins < 20_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The writer reports an entry placed for second 5 while the dispatcher
    /// goes to sleep until second 10, on two threads at random offsets: in
    /// every round the dispatcher either sees the placement before it
    /// sleeps or finds a wake-up waiting.
    #[test]
    fn a_placement_racing_the_dispatcher_going_to_sleep_always_wakes_it() {
        const ROUNDS: usize = 5_000;
        let rounds: Arc<Vec<Shared>> = Arc::new((0..ROUNDS).map(|_| Shared::default()).collect());
        let go = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (rounds, go, done) = (Arc::clone(&rounds), Arc::clone(&go), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
                for (n, shared) in rounds.iter().enumerate() {
                    reach(&go, n + 1);
                    spin(&mut seed);
                    let placed = Applied::Placed {
                        source: "a".into(),
                        at: Position {
                            due: 5,
                            id: "x".into(),
                        },
                    };
                    finish(shared, Waiter::Background, &[], vec![placed]);
                    done.store(n + 1, Ordering::Release);
                }
            })
        };
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut missed = 0;
        for (n, shared) in rounds.iter().enumerate() {
            go.store(n + 1, Ordering::Release);
            spin(&mut seed);
            let sleeps = shared.may_sleep(10);
            reach(&done, n + 1);
            let mut woken = pin!(shared.wake.notified());
            let woken = woken
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_ready();
            if sleeps && !woken {
                missed += 1;
            }
        }
        writer.join().unwrap();
        assert_eq!(
            missed, 0,
            "of {ROUNDS} rounds, sleeps that missed a placement due sooner"
        );
    }
}
