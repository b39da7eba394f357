//! [`DatabaseClock`]: one time for the whole cluster, PostgreSQL's.
//!
//! Everything nodes compare with each other (a process's deadlines, the
//! due time of a scheduled message, a queue entry's lease, an alert's
//! time) is stamped by one node and read by another. On each node's own
//! wall clock, a node whose clock runs minutes ahead would time out the
//! processes the others start, and one behind would claim again what
//! another is still sending. So a node reads the time of the database
//! server instead: it asks for it now and then
//! (`clock_timestamp()`, the midpoint of the round trip taken as the
//! moment it was read) and counts on from there with its own monotonic
//! clock, which a wall-clock skew or a step of the system time does not
//! move. Between two readings the error is half a round trip plus the
//! drift of the monotonic clock: milliseconds. The time never goes back
//! (a reading that would move it back leaves it where it is until the
//! monotonic count catches up).
//!
//! The node's own wall clock is read only to report how far it is off
//! ([`DatabaseClock::offset`]): logged once it exceeds [`SKEW_WARNING`],
//! and in the server's metrics. A clock given in its place that is not the
//! system's (a test's, which the test moves) is the time itself: the
//! database's is then only compared with it.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use estafeta_session::{Clock, Timestamp};
use tokio::time::Instant;

use crate::{Error, Store};

/// The database server's time now, in milliseconds since the Unix epoch.
const NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";
/// How far the node's own clock may be off before it says so.
pub const SKEW_WARNING: Duration = Duration::from_secs(1);

/// The cluster's clock: the database server's time, read now and then and
/// counted on with the node's monotonic clock. Cheap to clone.
#[derive(Clone)]
pub struct DatabaseClock {
    inner: Arc<Inner>,
}

struct Inner {
    /// The last reading: the monotonic instant it was taken at and the
    /// database's time then (milliseconds since the epoch).
    reading: Mutex<(Instant, u64)>,
    /// Whether the given clock is not the system's, and so is the time.
    followed: bool,
    /// The latest time handed out: the clock never goes back.
    latest: AtomicU64,
    /// The node's own wall clock, compared with the database's.
    local: Arc<dyn Clock>,
    /// The node's clock minus the database's at the last reading, in ms.
    offset: AtomicI64,
    /// Whether the offset is past [`SKEW_WARNING`] (said once per crossing).
    skewed: AtomicBool,
    store: Store,
}

impl DatabaseClock {
    /// Reads the time of `store`'s database server, then reads it again
    /// every `every` on a task of its own for as long as a clone of the
    /// clock lives. `local` is the node's own wall clock (the system's),
    /// read only to report the offset.
    pub async fn start(
        store: Store,
        local: Arc<dyn Clock>,
        every: Duration,
    ) -> Result<DatabaseClock, Error> {
        let (at, db) = read(&store).await?;
        let followed = !local.is_system();
        let inner = Arc::new(Inner {
            reading: Mutex::new((at, db)),
            followed,
            latest: AtomicU64::new(0),
            local,
            offset: AtomicI64::new(0),
            skewed: AtomicBool::new(false),
            store,
        });
        inner.compare(at, db);
        if !inner.followed {
            tokio::spawn(resync(Arc::downgrade(&inner), every));
        }
        Ok(DatabaseClock { inner })
    }

    /// How far the node's own wall clock was from the database's at the
    /// last reading: positive when the node's runs ahead.
    pub fn offset(&self) -> Duration {
        Duration::from_millis(self.inner.offset.load(Ordering::Relaxed).unsigned_abs())
    }

    /// [`offset`](Self::offset) with its sign, in seconds (for metrics).
    pub fn offset_seconds(&self) -> f64 {
        self.inner.offset.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

impl Inner {
    fn reading(&self) -> std::sync::MutexGuard<'_, (Instant, u64)> {
        self.reading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes how far the node's clock is from the database's `db` ms,
    /// read at `at`.
    fn compare(&self, at: Instant, db: u64) {
        let db_now = db.saturating_add(millis(at.elapsed()));
        let local = self.local.now().0;
        let offset =
            i64::try_from(local).unwrap_or(i64::MAX) - i64::try_from(db_now).unwrap_or(i64::MAX);
        self.offset.store(offset, Ordering::Relaxed);
        let skewed = offset.unsigned_abs() > millis(SKEW_WARNING);
        if self.skewed.swap(skewed, Ordering::Relaxed) != skewed {
            match skewed {
                true => tracing::warn!(
                    offset_ms = offset,
                    "this node's clock is off from the database server's by more than a second; \
                     the node runs on the database server's time (fix the node's time sync)"
                ),
                false => tracing::info!(
                    offset_ms = offset,
                    "this node's clock agrees with the database server's again"
                ),
            }
        }
    }
}

impl Clock for DatabaseClock {
    fn now(&self) -> Timestamp {
        if self.inner.followed {
            return self.inner.local.now();
        }
        let (at, db) = *self.inner.reading();
        let now = db.saturating_add(millis(at.elapsed()));
        let latest = self.inner.latest.fetch_max(now, Ordering::Relaxed);
        Timestamp(now.max(latest))
    }
}

/// One reading of the database server's time: the monotonic instant at
/// the middle of the round trip, and the time it answered.
async fn read(store: &Store) -> Result<(Instant, u64), Error> {
    let client = store.client().await?;
    let statement = client.prepare_cached(NOW).await?;
    let sent = Instant::now();
    let ms: i64 = client.query_one(&statement, &[]).await?.get(0);
    let back = Instant::now();
    let at = sent + (back - sent) / 2;
    Ok((at, u64::try_from(ms).unwrap_or(0)))
}

/// Reads the time again every `every` while the clock lives. A failed
/// reading keeps counting on from the last one.
async fn resync(clock: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = clock.upgrade() else {
            return;
        };
        match read(&inner.store).await {
            Ok((at, db)) => {
                *inner.reading() = (at, db);
                inner.compare(at, db);
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the database server's time failed; counting on")
            }
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
