//! The dispatcher ([`Scheduler::run`]): a loop that sleeps until the
//! earliest due second, then takes due entries for its workers (a few per
//! worker ahead, [`Options::prefetch`](crate::Options::prefetch)), starts
//! their handlers as workers are free and records what they decided.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::Instant;

use crate::scheduler::Scheduler;
use crate::sources::Sources;
use crate::stats::Counters;
use crate::store::{Applied, Held, Op, Store};
use crate::writer::{Waiter, WriteRequest, finish, unsettled};
use crate::{
    Clock, Delivery, Entry, Error, Handler, Misfire, Outcome, Position, StoreError, WorkerPool,
};

/// How long a pass waits for running handlers to end, so as to read for
/// the whole pool, before it reads for the workers it has.
const GATHER: Duration = Duration::from_millis(2);

/// A handed-out entry, remembered until its handler returns.
struct InFlight {
    /// The entry as it was handed out: the handler's outcome applies to
    /// this version only.
    entry: Entry,
    /// With at-most-once delivery: the id was handed out again (a caller
    /// scheduled it anew) while this handler ran, so this outcome is not
    /// put back.
    superseded: bool,
    /// The store's hold its outcome is settled through, if any.
    claim: Option<u64>,
}

/// A store's hold on handed-out entries (see [`Held`]), until every one of
/// them has its outcome.
struct Claim {
    held: Box<dyn Held>,
    /// Entries still with their handler.
    left: usize,
    /// The outcomes known so far.
    ops: Vec<Op>,
}

/// The dispatcher's running state.
struct Dispatcher<'a, S, C, H> {
    scheduler: &'a Scheduler<S, C>,
    pool: WorkerPool,
    handler: Arc<H>,
    sources: Option<Sources>,
    tasks: JoinSet<Outcome>,
    in_flight: HashMap<Id, InFlight>,
    /// With at-most-once delivery: the latest hand-out of each id in flight.
    latest: HashMap<String, Id>,
    /// The store's holds whose entries are with their handlers, by number.
    claims: HashMap<u64, Claim>,
    /// The number the next hold gets.
    next_claim: u64,
    /// Holds being settled.
    settling: JoinSet<()>,
    /// Entries taken beyond the free workers ([`Options::prefetch`]), with
    /// their hold, in the order taken: each starts on the next free worker,
    /// before any new pass.
    ///
    /// [`Options::prefetch`]: crate::Options::prefetch
    waiting: VecDeque<(Entry, Option<u64>)>,
}

impl<S: Store, C: Clock> Scheduler<S, C> {
    /// Runs the dispatcher until `shutdown` completes: due entries are handed
    /// to `handler` on workers of `pool`. On shutdown no new entries are
    /// taken; the call returns once running handlers finished and their
    /// outcomes were written. Dropping the returned future instead stops at
    /// once; entries in flight are then handed out again by the next run
    /// (with [`Delivery::AtLeastOnce`]).
    ///
    /// On a multi-threaded runtime, run it on a task of its own
    /// (`tokio::spawn`), not in `block_on`: the handlers it starts then go
    /// to its worker thread's own queue rather than waking another worker
    /// through the runtime's shared one (in the crate's dispatch bench,
    /// about a fifth more entries a second).
    pub async fn run<H: Handler>(
        &self,
        pool: WorkerPool,
        handler: H,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        if self.inner.running.swap(true, Ordering::SeqCst) {
            return Err(Error::AlreadyRunning);
        }
        let _running = RunningGuard(&self.inner.running);
        run(self, pool, handler, shutdown).await
    }
}

/// Clears the running flag however `run` ends, even if its future is dropped.
struct RunningGuard<'a>(&'a AtomicBool);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// See [`Scheduler::run`].
async fn run<S: Store, C: Clock, H: Handler>(
    scheduler: &Scheduler<S, C>,
    pool: WorkerPool,
    handler: H,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    let store = Arc::clone(&scheduler.inner.store);
    let names = tokio::task::spawn_blocking(move || store.sources())
        .await
        .map_err(|e| StoreError::Backend(e.to_string().into()))??;
    let mut dispatcher = Dispatcher {
        scheduler,
        pool,
        handler: Arc::new(handler),
        sources: Some(Sources::new(names)),
        tasks: JoinSet::new(),
        in_flight: HashMap::new(),
        latest: HashMap::new(),
        claims: HashMap::new(),
        next_claim: 0,
        settling: JoinSet::new(),
        waiting: VecDeque::new(),
    };
    let result = dispatcher.run(shutdown).await;
    dispatcher.drain().await;
    result
}

impl<S: Store, C: Clock, H: Handler> Dispatcher<'_, S, C, H> {
    fn counters(&self) -> &Counters {
        &self.scheduler.inner.shared.counters
    }

    async fn run(&mut self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let mut shutdown = pin!(shutdown);
        let inner = Arc::clone(&self.scheduler.inner);
        let shared = &inner.shared;
        let options = inner.options;
        loop {
            Counters::bump(&self.counters().wakeups, 1);
            self.absorb()?;
            let mut finished = Vec::new();
            while let Some(result) = self.tasks.try_join_next_with_id() {
                finished.push(result);
            }
            self.record(finished)?;
            while self.settling.try_join_next().is_some() {}

            if !self.waiting.is_empty() {
                let mut workers = Vec::new();
                self.take_free(&mut workers, self.waiting.len());
                self.start(workers);
                if !self.waiting.is_empty() {
                    // Taken entries go before a new pass: wait for a worker.
                    tokio::select! {
                        biased;
                        () = &mut shutdown => return Ok(()),
                        result = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                            self.record(result.into_iter().collect())?;
                        }
                        worker = self.pool.acquire() => self.start(vec![worker]),
                    }
                    continue;
                }
            }

            let now = inner.clock.now();
            let now_secs = now.as_secs();
            let mono = Instant::now();
            let sources = self.sources.as_ref().ok_or(Error::Closed)?;
            if sources.any_ready(now_secs, mono) {
                let mut workers = Vec::new();
                self.take_free(&mut workers, options.max_batch);
                // A pass costs a store read (a round trip; a hold on a
                // database) whatever it takes: while handlers still run,
                // give them a moment to end, so that a pass takes the whole
                // pool's worth, not the entries whose handlers ended first.
                let enough = self.pool.size().clamp(1, options.max_batch.max(1));
                if !workers.is_empty() && workers.len() < enough && !self.tasks.is_empty() {
                    let mut gather = pin!(tokio::time::sleep(GATHER));
                    while workers.len() < enough && !self.tasks.is_empty() {
                        tokio::select! {
                            biased;
                            () = &mut shutdown => return Ok(()),
                            result = self.tasks.join_next_with_id() => {
                                self.record(result.into_iter().collect())?;
                            }
                            () = &mut gather => break,
                        }
                        self.take_free(&mut workers, options.max_batch);
                    }
                }
                if workers.is_empty() {
                    // Due entries but no free worker: sleep until one is free.
                    tokio::select! {
                        biased;
                        () = &mut shutdown => return Ok(()),
                        result = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                            self.record(result.into_iter().collect())?;
                        }
                        worker = self.pool.acquire() => drop(worker),
                    }
                    continue;
                }
                self.dispatch(now, mono, workers).await?;
                // Let the handlers just started run before counting free
                // workers again, so passes take many entries, not one.
                tokio::task::yield_now().await;
                continue;
            }

            // Nothing due: sleep to the next wall-clock second, or until a
            // failing source may be retried, or until an earlier entry is
            // scheduled.
            if !shared.may_sleep(sources.next_due().unwrap_or(u64::MAX)) {
                continue;
            }
            let to_next_second =
                Duration::from_secs(1) - Duration::from_nanos(u64::from(now.subsec_nanos()));
            let mut wake_at = mono + to_next_second;
            if let Some(retry) = sources.next_retry() {
                wake_at = wake_at.min(retry.max(mono));
            }
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                () = shared.wake.notified() => {}
                result = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    self.record(result.into_iter().collect())?;
                }
                () = tokio::time::sleep_until(wake_at) => {}
            }
            shared.awake();
        }
    }

    /// Adds free workers to `workers`, up to `max_batch` in all.
    fn take_free(&self, workers: &mut Vec<crate::pool::Worker>, max_batch: usize) {
        while workers.len() < max_batch.max(1) {
            match self.pool.try_acquire() {
                Some(worker) => workers.push(worker),
                None => break,
            }
        }
    }

    /// How many entries a pass with `free` workers takes: up to
    /// [`Options::prefetch`] × the pool's size handed out in all, and never
    /// fewer than the free workers.
    fn room(&self, free: usize, options: &crate::Options) -> usize {
        if options.delivery == Delivery::AtMostOnce {
            return free;
        }
        let most = self
            .pool
            .size()
            .saturating_mul(options.prefetch.max(1))
            .min(options.max_batch.max(1));
        most.saturating_sub(self.tasks.len()).max(free)
    }

    /// Applies what the writer reported since the last look.
    fn absorb(&mut self) -> Result<(), Error> {
        let (placed, settled) = {
            let mut inbox = self.scheduler.inner.shared.inbox();
            (
                std::mem::take(&mut inbox.placed),
                std::mem::take(&mut inbox.settled),
            )
        };
        let sources = self.sources.as_mut().ok_or(Error::Closed)?;
        for (source, at) in placed {
            sources.placed(source, at);
        }
        for (source, at) in settled {
            sources.settled(&source, &at);
        }
        Ok(())
    }

    /// Takes due entries for the `workers` and starts their handlers.
    async fn dispatch(
        &mut self,
        now: Duration,
        mono: Instant,
        workers: Vec<crate::pool::Worker>,
    ) -> Result<(), Error> {
        let inner = Arc::clone(&self.scheduler.inner);
        let options = inner.options;
        let mut sources = self.sources.take().ok_or(Error::Closed)?;
        let store = Arc::clone(&inner.store);
        let limit = self.room(workers.len(), &options);
        let now_secs = now.as_secs();
        let read = tokio::task::spawn_blocking(move || {
            let taken = sources.take(&*store, now_secs, mono, limit, &options);
            (sources, taken)
        })
        .await;
        let (sources, pass) = match read {
            Ok(read) => read,
            // The source state went with the panicking store; stop rather
            // than hand entries out twice.
            Err(e) => {
                return Err(
                    StoreError::Backend(format!("reading sources failed: {e}").into()).into(),
                );
            }
        };
        self.sources = Some(sources);
        {
            let mut health = self
                .counters()
                .health
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for name in pass.recovered {
                tracing::info!(source = %name, "source readable again");
                health.remove(&name);
            }
            for failure in pass.failed {
                tracing::warn!(source = %failure.source, failures = failure.failures, error = %failure.error, "reading a source failed; retrying with backoff");
                health.insert(
                    failure.source,
                    (failure.failures, failure.error.to_string()),
                );
            }
        }
        // Each entry with the number of the hold it came in, if any.
        let mut claim_of = vec![None; pass.entries.len()];
        let mut claims = Vec::new();
        for hold in pass.holds {
            let number = self.next_claim;
            self.next_claim += 1;
            for at in hold.entries {
                if let Some(claim) = claim_of.get_mut(at) {
                    *claim = Some(number);
                }
            }
            claims.push((
                number,
                Claim {
                    held: hold.held,
                    left: 0,
                    ops: Vec::new(),
                },
            ));
        }
        self.claims.extend(claims);

        let (run, skip): (Vec<_>, Vec<_>) =
            pass.entries
                .into_iter()
                .zip(claim_of)
                .partition(|(e, _)| match options.misfire {
                    Misfire::Skip { threshold } => {
                        now.saturating_sub(Duration::from_secs(e.due)) <= threshold
                    }
                    Misfire::FireNow | Misfire::Coalesce => true,
                });
        Counters::bump(&self.counters().skipped, skip.len() as u64);
        let run = match options.delivery {
            Delivery::AtLeastOnce => {
                let mut removals = Vec::new();
                for (entry, claim) in skip {
                    match claim.and_then(|c| self.claims.get_mut(&c)) {
                        Some(claim) => claim.ops.push(Op::Remove(entry)),
                        None => removals.push(Op::Remove(entry)),
                    }
                }
                if !removals.is_empty() {
                    self.scheduler.submit(WriteRequest {
                        ops: removals,
                        waiter: Waiter::Background,
                    })?;
                }
                for (_, claim) in &run {
                    if let Some(claim) = claim.and_then(|c| self.claims.get_mut(&c)) {
                        claim.left += 1;
                    }
                }
                // A hold none of whose entries runs is settled now.
                let idle: Vec<u64> = self
                    .claims
                    .iter()
                    .filter(|(_, c)| c.left == 0)
                    .map(|(n, _)| *n)
                    .collect();
                for number in idle {
                    self.settle(number);
                }
                run
            }
            Delivery::AtMostOnce => {
                let (run, skip): (Vec<Entry>, Vec<Entry>) = (
                    run.into_iter().map(|(e, _)| e).collect(),
                    skip.into_iter().map(|(e, _)| e).collect(),
                );
                let places: Vec<(String, Position)> = skip
                    .iter()
                    .chain(&run)
                    .map(|e| (e.source.clone(), e.position()))
                    .collect();
                let skipped = skip.len();
                let ops = skip
                    .into_iter()
                    .chain(run.iter().cloned())
                    .map(Op::Remove)
                    .collect();
                let result = self.scheduler.write(ops).await;
                let sources = self.sources.as_mut().ok_or(Error::Closed)?;
                match result {
                    Ok(applied) => {
                        for (source, at) in &places {
                            sources.settled(source, at);
                        }
                        // An entry a caller moved, removed or replaced since
                        // it was read is not handed out; a replacement is
                        // read in its turn.
                        run.into_iter()
                            .zip(&applied[skipped..])
                            .filter(|(_, a)| **a == Applied::Removed)
                            .map(|(e, _)| (e, None))
                            .collect()
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "removing entries before hand-out failed; they stay scheduled");
                        Counters::bump(&inner.shared.counters.write_errors, 1);
                        for (source, at) in places {
                            sources.unsettle(&source, at);
                        }
                        // Let the store recover before the next attempt.
                        tokio::time::sleep(options.source_backoff).await;
                        return Ok(());
                    }
                }
            }
        };

        let counters = &inner.shared.counters;
        {
            let mut lag = counters.lag.lock().unwrap_or_else(|e| e.into_inner());
            for (entry, _) in &run {
                lag.record(now.saturating_sub(Duration::from_secs(entry.due)));
            }
        }
        Counters::bump(&counters.dispatched, run.len() as u64);
        Counters::bump(&counters.in_flight, run.len() as u64);
        self.waiting.extend(run);
        self.start(workers);
        Ok(())
    }

    /// Starts the handlers of waiting entries, in the order taken, one on
    /// each of `workers`; a worker left over goes back to the pool.
    fn start(&mut self, workers: Vec<crate::pool::Worker>) {
        let delivery = self.scheduler.inner.options.delivery;
        for worker in workers {
            let Some((entry, claim)) = self.waiting.pop_front() else {
                return;
            };
            let handler = Arc::clone(&self.handler);
            let meta = InFlight {
                entry: entry.clone(),
                superseded: false,
                claim,
            };
            let task = self.tasks.spawn(async move {
                let _worker = worker;
                handler.handle(entry).await
            });
            if delivery == Delivery::AtMostOnce
                && let Some(older) = self.latest.insert(meta.entry.id.clone(), task.id())
                && let Some(older) = self.in_flight.get_mut(&older)
            {
                older.superseded = true;
            }
            self.in_flight.insert(task.id(), meta);
        }
    }

    /// At shutdown: entries still waiting for a worker are not started.
    /// They stay stored as they were (the next run hands them out); a hold
    /// waiting for nothing else settles the outcomes it has.
    fn release_waiting(&mut self) {
        let released = std::mem::take(&mut self.waiting);
        self.counters()
            .in_flight
            .fetch_sub(released.len() as u64, Ordering::Relaxed);
        for number in released.into_iter().filter_map(|(_, claim)| claim) {
            self.leave(number);
        }
    }

    /// Turns finished handlers into store changes, sent to the writer.
    fn record(&mut self, finished: Vec<Result<(Id, Outcome), JoinError>>) -> Result<(), Error> {
        if finished.is_empty() {
            return Ok(());
        }
        let inner = Arc::clone(&self.scheduler.inner);
        let options = inner.options;
        let counters = &inner.shared.counters;
        let now = inner.clock.now_secs();
        let mut ops = Vec::with_capacity(finished.len());
        for result in finished {
            let (id, outcome) = match result {
                Ok(done) => done,
                Err(e) => (
                    e.id(),
                    Outcome::Failed(format!("handler ended abnormally: {e}")),
                ),
            };
            let Some(job) = self.in_flight.remove(&id) else {
                continue;
            };
            if self.latest.get(&job.entry.id) == Some(&id) {
                self.latest.remove(&job.entry.id);
            }
            counters.in_flight.fetch_sub(1, Ordering::Relaxed);
            let (due, attempt) = match outcome {
                Outcome::Done => {
                    Counters::bump(&counters.done, 1);
                    if options.delivery == Delivery::AtLeastOnce {
                        self.outcome(job.claim, Op::Remove(job.entry), &mut ops);
                    }
                    continue;
                }
                Outcome::Reschedule(due) => {
                    Counters::bump(&counters.rescheduled, 1);
                    let due = match options.misfire {
                        Misfire::Coalesce => coalesce(job.entry.due, due, now),
                        Misfire::FireNow | Misfire::Skip { .. } => due,
                    };
                    (due, 0)
                }
                Outcome::Failed(reason) => {
                    Counters::bump(&counters.failed, 1);
                    let attempt = job.entry.attempt.saturating_add(1);
                    tracing::debug!(id = %job.entry.id, attempt, %reason, "handler failed; retrying");
                    (
                        now.saturating_add(options.retry.delay_secs(attempt)),
                        attempt,
                    )
                }
            };
            match options.delivery {
                Delivery::AtLeastOnce => self.outcome(
                    job.claim,
                    Op::Move {
                        entry: job.entry,
                        due,
                        attempt,
                    },
                    &mut ops,
                ),
                Delivery::AtMostOnce if job.superseded => {}
                Delivery::AtMostOnce => ops.push(Op::Restore(Entry {
                    due,
                    attempt,
                    ..job.entry
                })),
            }
        }
        if !ops.is_empty() {
            self.scheduler.submit(WriteRequest {
                ops,
                waiter: Waiter::Background,
            })?;
        }
        Ok(())
    }

    /// Files one entry's outcome: with its hold, settled once the hold's
    /// last entry has its outcome, or with the `ops` for the writer.
    fn outcome(&mut self, claim: Option<u64>, op: Op, ops: &mut Vec<Op>) {
        let Some(number) = claim else {
            ops.push(op);
            return;
        };
        let Some(claim) = self.claims.get_mut(&number) else {
            ops.push(op);
            return;
        };
        claim.ops.push(op);
        self.leave(number);
    }

    /// One entry of hold `number` is through (its outcome filed, or it was
    /// never started): the hold settles once none is left.
    fn leave(&mut self, number: u64) {
        let Some(claim) = self.claims.get_mut(&number) else {
            return;
        };
        claim.left = claim.left.saturating_sub(1);
        if claim.left == 0 {
            self.settle(number);
        }
    }

    /// Applies a hold's outcomes through it on a blocking thread, then
    /// tells the dispatcher, as the writer does for its own writes.
    fn settle(&mut self, number: u64) {
        let Some(Claim { held, ops, .. }) = self.claims.remove(&number) else {
            return;
        };
        let shared = Arc::clone(&self.scheduler.inner.shared);
        self.settling.spawn(async move {
            let settled = tokio::task::spawn_blocking(move || {
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| held.settle(&ops)))
                    .unwrap_or_else(|_| Err(StoreError::Backend("the store panicked".into())));
                (ops, result)
            })
            .await;
            match settled {
                Ok((ops, Ok(applied))) => finish(&shared, Waiter::Background, &ops, applied),
                Ok((ops, Err(e))) => unsettled(&shared, &ops, &e),
                // Only cancellation of the runtime gets here; the hold ended
                // with its thread, and its entries are due again.
                Err(_) => {}
            }
        });
    }

    /// After shutdown: waits for running handlers and records their outcomes
    /// durably before returning.
    async fn drain(&mut self) {
        self.release_waiting();
        while let Some(result) = self.tasks.join_next_with_id().await {
            if self.record(vec![result]).is_err() {
                return;
            }
        }
        while self.settling.join_next().await.is_some() {}
        // An empty caller write returns once every write queued before it
        // was tried; background writes that failed are retried until the
        // scheduler closes.
        let _ = self.scheduler.write(Vec::new()).await;
    }
}

/// The [`Misfire::Coalesce`] rule: a reschedule to a time still in the past
/// moves forward by whole periods to the first second after `now`.
fn coalesce(old: u64, new: u64, now: u64) -> u64 {
    if new > now || new <= old {
        return new;
    }
    let period = new - old;
    let periods = (now - new) / period + 1;
    new.saturating_add(periods.saturating_mul(period))
}

#[cfg(test)]
mod tests {
    use super::coalesce;

    #[test]
    fn coalesce_skips_missed_periods() {
        assert_eq!(coalesce(100, 160, 3_700), 3_760);
        assert_eq!(coalesce(100, 160, 159), 160);
        assert_eq!(coalesce(100, 160, 160), 220);
        assert_eq!(coalesce(100, 50, 3_700), 50);
    }
}
