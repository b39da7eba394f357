//! A durable repeat scheduler: entries come due at a wall-clock second and
//! are handed to a bounded worker pool, a few per worker taken ahead.
//!
//! Estafeta uses it for delivery retries with backoff, scheduled delivery and
//! periodic jobs; it also stands alone.
//!
//! # Model
//!
//! * An [`Entry`] is `(due second, id, payload)` in a *source* (partition).
//!   Each source is read in [`Position`] order (due, then id). Ids are unique
//!   across a store; scheduling an existing id replaces it. A handler's
//!   outcome applies only to the version of the entry it was handed (same
//!   place, payload and attempt count): if a caller replaced, moved or
//!   cancelled the entry while the handler ran, the outcome changes nothing
//!   and a replacement is handed out in its turn, even one at the very same
//!   place (`tests/it/replace.rs`, both stores, both delivery modes).
//! * A [`Store`] keeps entries durably: [`RedbStore`] (one redb file, a table
//!   per source plus an id index) by default, [`MemoryStore`] for tests.
//!   [`Scheduler::schedule`], [`Scheduler::cancel`] and
//!   [`Scheduler::reschedule`] return after a durable commit; concurrent
//!   writes share a commit.
//! * [`Scheduler::run`] is the dispatcher loop. It knows the earliest due
//!   second; before it, it sleeps to the next second (woken early when an
//!   entry due sooner is scheduled, also when that happens just as the loop
//!   goes to sleep: checked on two threads at random offsets). At or after it, it takes due entries —
//!   overdue ones included — for the free workers of the [`WorkerPool`]
//!   and, with at-least-once delivery, ahead of them up to
//!   [`Options::prefetch`] per worker in all, waiting without spinning
//!   while none is free (and, while handlers run, up to 2 ms for the rest
//!   of the workers: each pass is a store read), and starts the
//!   [`Handler`] on them, each on a worker of its own, in the order taken.
//!   On shutdown, entries taken but not started stay stored for the next
//!   run. It tracks each source's next due time as it reads.
//! * Sources are read in [`SourceOrder::Fair`] order (round-robin shares, the
//!   default) or [`SourceOrder::NearestFirst`] (nearest due source first).
//! * [`Delivery::AtLeastOnce`] (default) removes an entry only when its
//!   handler finished or rescheduled it, so entries in flight when the
//!   process dies are handed out again after a restart;
//!   [`Delivery::AtMostOnce`] removes it before hand-out.
//!   Nothing is written when an entry is handed out: the dispatcher keeps
//!   the set of entries in flight in memory and reads past them, and only
//!   the outcome (remove, move) is committed, batched with other outcomes.
//!   After a crash that set is gone and every stored entry is due again,
//!   which is the re-delivery. (redb locks its file, so no second process
//!   can be handing out the same entries.) An outcome whose write keeps
//!   failing is retried until the scheduler closes; then, with
//!   at-least-once delivery, the entry stays stored as it was and is handed
//!   out again, while with at-most-once delivery a `Failed` or `Reschedule`
//!   outcome cannot put the entry back and it is lost, as in a crash, and
//!   counted in [`Stats::lost`] (`tests/it/close.rs`).
//!   A store shared by several processes may instead hold what a read
//!   returns ([`store::Held`], [`Store::hold_sources`]: a database
//!   transaction left open on the rows): the outcomes of those entries are
//!   applied through their hold, in its transaction, once the last of them
//!   is known; a hold that fails to settle leaves its entries due again
//!   (`tests/it/held.rs`).
//! * Late entries follow the [`Misfire`] policy.
//! * A source whose reads fail is retried with backoff and reported in
//!   [`Stats`]; the other sources go on.
//!
//! # Time and wall-clock steps
//!
//! Due times are wall-clock seconds from the injected [`Clock`]; the loop
//! sleeps on Tokio's monotonic timer. The rule:
//!
//! 1. An entry is handed out only when the wall clock, read at that moment,
//!    is at or past its due second. No entry ever fires before the wall
//!    clock says it is due, whatever the monotonic clock did.
//! 2. The loop never sleeps longer than to the next wall-clock second
//!    boundary as computed when it went to sleep (at most one second of
//!    monotonic time), and re-reads the wall clock on every wake-up.
//!
//! So a **backward** step (the clock set back) cannot stall the loop: it
//! keeps waking every second and fires entries when the wall clock reaches
//! them again; nothing already handed out fires again (it was removed, or is
//! in flight). A **forward** step makes the entries in the skipped interval
//! overdue at the next wake-up, exactly like a downtime of that length: they
//! go through the misfire policy and the worker limit, and entries after
//! the new wall time stay put.
//!
//! # Example
//!
//! ```
//! use estafeta_repeat::{Clock, MemoryStore, Options, Outcome, Scheduler, TestClock, WorkerPool};
//! use tokio::sync::mpsc;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), estafeta_repeat::Error> {
//! let clock = TestClock::new(1_000);
//! let scheduler = Scheduler::new(MemoryStore::new(), clock, Options::default());
//! scheduler.schedule("retries", 1_005, "msg-1", b"hello").await?;
//!
//! let (fired, mut seen) = mpsc::unbounded_channel();
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let run = scheduler.run(
//!     WorkerPool::new(4),
//!     move |entry: estafeta_repeat::Entry| {
//!         let fired = fired.clone();
//!         async move {
//!             let _ = fired.send((entry.id, entry.due));
//!             Outcome::Done
//!         }
//!     },
//!     async move {
//!         let _ = stopped.await;
//!     },
//! );
//! let check = async {
//!     assert_eq!(seen.recv().await, Some(("msg-1".to_owned(), 1_005)));
//!     assert!(scheduler.clock().now_secs() >= 1_005);
//!     let _ = stop.send(());
//! };
//! let (ran, ()) = tokio::join!(run, check);
//! ran?;
//! assert_eq!(scheduler.stats().await?.done, 1);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

#[cfg(feature = "test-support")]
pub mod bench;
mod clock;
mod dispatcher;
mod entry;
mod error;
mod handler;
mod options;
mod pool;
mod scheduler;
mod sources;
mod stats;
pub mod store;
mod writer;

pub use crate::clock::{Clock, SystemClock, TestClock};
pub use crate::entry::{Entry, MAX_ID, MAX_PAYLOAD, MAX_SOURCE, Position};
pub use crate::error::{Error, StoreError};
pub use crate::handler::{Handler, Outcome};
pub use crate::options::{Delivery, Misfire, Options, RetryPolicy, SourceOrder};
pub use crate::pool::{Worker, WorkerPool};
pub use crate::scheduler::Scheduler;
pub use crate::stats::{LAG_BOUNDS_MS, LagHistogram, SourceStats, Stats};
pub use crate::store::{MemoryStore, RedbStore, Store};
