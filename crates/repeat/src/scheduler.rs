//! The scheduler handle: schedule, cancel, reschedule and stats (its
//! dispatcher, `run`, is in `dispatcher.rs`).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::entry::{check_id, check_payload, check_source};
use crate::stats::Stats;
use crate::store::{Applied, Op, Store};
use crate::writer::{self, Shared, Waiter, WriteRequest};
use crate::{Clock, Entry, Error, Options, StoreError};

/// A handle to a repeat scheduler over a store. Clones share everything.
///
/// Writes (`schedule`, `cancel`, `reschedule`) are durable when they return
/// `Ok`; writes made at the same time share one commit.
pub struct Scheduler<S, C> {
    pub(crate) inner: Arc<Inner<S, C>>,
}

impl<S, C> Clone for Scheduler<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S, C> std::fmt::Debug for Scheduler<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// Everything a scheduler's handles, writer and dispatcher share.
pub(crate) struct Inner<S, C> {
    pub(crate) store: Arc<S>,
    pub(crate) clock: C,
    pub(crate) options: Options,
    pub(crate) shared: Arc<Shared>,
    writes: Mutex<Option<mpsc::UnboundedSender<WriteRequest>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    pub(crate) running: AtomicBool,
}

impl<S: Store, C: Clock> Scheduler<S, C> {
    /// A scheduler over `store`, reading wall time from `clock`.
    ///
    /// # Panics
    ///
    /// Must be called inside a Tokio runtime (it starts the writer task).
    pub fn new(store: S, clock: C, options: Options) -> Self {
        let store = Arc::new(store);
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(writer::run(
            Arc::clone(&store),
            Arc::clone(&shared),
            rx,
            options.source_backoff,
            options.source_backoff_max,
        ));
        Self {
            inner: Arc::new(Inner {
                store,
                clock,
                options,
                shared,
                writes: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(writer)),
                running: AtomicBool::new(false),
            }),
        }
    }

    /// Schedules `payload` under `id` in `source`, due at wall-clock second
    /// `due`. An entry with the same id (in any source) is replaced; if a
    /// handler is running for the entry it replaces, that handler's outcome
    /// applies to the old version only, and the replacement is handed out
    /// in its turn.
    pub async fn schedule(
        &self,
        source: &str,
        due: u64,
        id: &str,
        payload: &[u8],
    ) -> Result<(), Error> {
        let entry = new_entry(source, due, id, payload)?;
        self.write(vec![Op::Put(entry)]).await.map(drop)
    }

    /// Schedules `payload` under `id` in `source`, due at wall-clock second
    /// `due`, unless an entry with that id exists (in any source), which
    /// stays as it is; whether it was scheduled. An entry scheduled wakes
    /// the dispatcher as one [`schedule`](Self::schedule)d does.
    pub async fn schedule_if_absent(
        &self,
        source: &str,
        due: u64,
        id: &str,
        payload: &[u8],
    ) -> Result<bool, Error> {
        let entry = new_entry(source, due, id, payload)?;
        let applied = self.write(vec![Op::Restore(entry)]).await?;
        Ok(matches!(applied.first(), Some(Applied::Placed { .. })))
    }

    /// Schedules many entries in one durable commit (ids replace existing
    /// entries as with [`schedule`](Self::schedule)); all or nothing.
    pub async fn schedule_all(&self, entries: Vec<Entry>) -> Result<(), Error> {
        for entry in &entries {
            check_source(&entry.source)?;
            check_id(&entry.id)?;
            check_payload(&entry.payload)?;
        }
        self.write(entries.into_iter().map(Op::Put).collect())
            .await
            .map(drop)
    }

    /// Cancels the entry with `id`; `false` if there was none. A handler
    /// already running for it is not interrupted.
    pub async fn cancel(&self, id: &str) -> Result<bool, Error> {
        check_id(id)?;
        let applied = self.write(vec![Op::Cancel { id: id.to_owned() }]).await?;
        Ok(applied.first() == Some(&Applied::Removed))
    }

    /// Moves the entry with `id` to wall-clock second `due`; `false` if there
    /// was none. If a handler is running for it, that handler's outcome no
    /// longer applies to the moved entry, which will be handed out again.
    pub async fn reschedule(&self, id: &str, due: u64) -> Result<bool, Error> {
        check_id(id)?;
        let applied = self
            .write(vec![Op::Reschedule {
                id: id.to_owned(),
                due,
            }])
            .await?;
        Ok(matches!(applied.first(), Some(Applied::Placed { .. })))
    }

    /// Counts per source (read from the store) and the dispatcher's counters.
    pub async fn stats(&self) -> Result<Stats, Error> {
        let store = Arc::clone(&self.inner.store);
        let now = self.inner.clock.now_secs();
        let counts = tokio::task::spawn_blocking(move || {
            let mut counts = Vec::new();
            for name in store.sources()? {
                let count = store.count(&name, now)?;
                counts.push((name, count));
            }
            Ok::<_, StoreError>(counts)
        })
        .await
        .map_err(|e| StoreError::Backend(e.to_string().into()))??;
        let mut stats = Stats::default();
        for (name, count) in counts {
            let source = stats.sources.entry(name).or_default();
            source.entries = count.entries;
            source.due = count.due;
        }
        self.inner.shared.counters.snapshot(&mut stats);
        Ok(stats)
    }

    /// Stops accepting writes and waits until the writer has finished the
    /// ones already made; later calls fail with [`Error::Closed`]. The store
    /// is released when the last handle is dropped.
    pub async fn close(&self) {
        let sender = self
            .inner
            .writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(sender);
        let writer = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(writer) = writer {
            // The writer does not panic; if it did, there is nothing left to wait for.
            let _ = writer.await;
        }
    }

    /// The clock the scheduler reads.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// Sends ops to the writer and waits until they are durable.
    pub(crate) async fn write(&self, ops: Vec<Op>) -> Result<Vec<Applied>, Error> {
        let (reply, answer) = oneshot::channel();
        self.submit(WriteRequest {
            ops,
            waiter: Waiter::Caller(reply),
        })?;
        match answer.await {
            Ok(result) => Ok(result?),
            Err(_) => Err(Error::Closed),
        }
    }

    /// Queues ops for the writer without waiting.
    pub(crate) fn submit(&self, request: WriteRequest) -> Result<(), Error> {
        let writes = self.inner.writes.lock().unwrap_or_else(|e| e.into_inner());
        match writes.as_ref() {
            Some(tx) => tx.send(request).map_err(|_| Error::Closed),
            None => Err(Error::Closed),
        }
    }
}

/// A new entry (no attempt yet), its source, id and payload checked.
fn new_entry(source: &str, due: u64, id: &str, payload: &[u8]) -> Result<Entry, Error> {
    check_source(source)?;
    check_id(id)?;
    check_payload(payload)?;
    Ok(Entry {
        source: source.to_owned(),
        due,
        id: id.to_owned(),
        payload: payload.to_vec(),
        attempt: 0,
    })
}
