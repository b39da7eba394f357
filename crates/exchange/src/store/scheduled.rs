//! Messages scheduled for their `deliver_at`: entries of the repeat
//! scheduler (embedded: `<data>/.estafeta/scheduled.redb`) with the
//! message's bytes as the payload, due at the first whole second at or
//! after the time.

use crate::Timestamp;
use crate::ulid_ids::MessageId;
use crate::wire::Message;
use estafeta_repeat::store::{Applied, Op, Read, Scan, Skip, SourceCount, Store};
use estafeta_repeat::{Entry, Scheduler, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// The repeat source of messages scheduled for their `deliver_at`.
pub const SCHEDULED_SOURCE: &str = "deliver_at";

/// A session clock (the exchange's) as a repeat scheduler's wall clock,
/// so that whoever controls one controls both (a test's clock, a
/// cluster's database time).
pub struct WallClock(pub Arc<dyn estafeta_session::Clock>);

impl estafeta_repeat::Clock for WallClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.now().0)
    }
}

/// The scheduler of messages due later.
pub(crate) type DeliveryScheduler = Scheduler<Listed<dyn Store>, WallClock>;

/// Where messages wait for their `deliver_at`: a repeat store
/// (embedded: `scheduled.redb`) and the one scheduler over it, running on
/// the exchange's clock. The message store hands due-later messages to the
/// scheduler, and the exchange runs its deliveries and lists its entries.
#[derive(Clone)]
pub struct Scheduled {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) scheduler: Arc<DeliveryScheduler>,
}

impl Scheduled {
    /// The scheduler over `store`, on `clock` (the clock the exchange is
    /// opened with).
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn estafeta_session::Clock>) -> Scheduled {
        let scheduler = Arc::new(Scheduler::new(
            Listed(store.clone()),
            WallClock(clock),
            estafeta_repeat::Options::default(),
        ));
        Scheduled { store, scheduler }
    }

    /// The scheduler over `dispatch`, on `clock`, with listings read from
    /// `listing` (the same entries): for a store whose reads claim what
    /// they return, as a cluster's does so that one node delivers each due
    /// message, and which a listing must therefore not read.
    pub fn with_listing(
        dispatch: Arc<dyn Store>,
        listing: Arc<dyn Store>,
        clock: Arc<dyn estafeta_session::Clock>,
    ) -> Scheduled {
        Scheduled {
            store: listing,
            ..Scheduled::new(dispatch, clock)
        }
    }
}

/// A repeat store shared between its scheduler and readers that list its
/// entries (the dashboard's page of scheduled and retrying deliveries):
/// the scheduler owns its store, so it is given this handle and the reader
/// keeps another.
#[derive(Debug)]
pub struct Listed<S: ?Sized>(pub Arc<S>);

impl<S: Store + ?Sized> Listed<S> {
    /// The first `limit` entries of `source`, due or not, soonest first.
    pub fn entries(&self, source: &str, limit: usize) -> Result<Vec<Entry>, StoreError> {
        Ok(self
            .0
            .scan(Read::first(source, limit), u64::MAX, &|_| false)?
            .entries)
    }
}

impl<S: Store + ?Sized> Store for Listed<S> {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        self.0.apply(ops)
    }
    fn sources(&self) -> Result<Vec<String>, StoreError> {
        self.0.sources()
    }
    fn scan(&self, read: Read<'_>, now: u64, skip: Skip<'_>) -> Result<Scan, StoreError> {
        self.0.scan(read, now, skip)
    }
    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.0.count(source, now)
    }

    fn contains(&self, id: &str) -> Result<bool, StoreError> {
        self.0.contains(id)
    }
}

/// Why a message could not be scheduled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScheduleError {
    /// The message could not be serialized.
    #[error(transparent)]
    Serialize(#[from] serde_json::Error),
    /// The scheduler refused or failed to store it.
    #[error(transparent)]
    Schedule(#[from] estafeta_repeat::Error),
}

/// The first whole second at or after `t`.
fn due_second(t: Timestamp) -> u64 {
    let ms = u64::try_from(t.as_millis()).unwrap_or(0);
    ms.div_ceil(1000)
}

/// The repeat entry that schedules the message `id`, stored as `bytes` (its
/// file bytes), for `at`: what the exchange schedules, and what a
/// transactional message store writes itself when a batch schedules a
/// message in the same transaction.
pub fn scheduled_entry(id: MessageId, bytes: Vec<u8>, at: Timestamp) -> Entry {
    Entry {
        source: SCHEDULED_SOURCE.to_owned(),
        due: due_second(at),
        id: id.to_string(),
        payload: bytes,
        attempt: 0,
    }
}

/// Schedules `message` in `scheduler` for `at`, durably.
pub(crate) async fn schedule(
    scheduler: &DeliveryScheduler,
    message: &Message,
    at: Timestamp,
) -> Result<(), ScheduleError> {
    let entry = scheduled_entry(message.id, message.to_file_bytes()?, at);
    scheduler
        .schedule(&entry.source, entry.due, &entry.id, &entry.payload)
        .await?;
    tracing::info!(target: "estafeta::event", message = %message.id, to = %message.to, deliver_at = %at, "message scheduled");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_seconds_round_up() {
        assert_eq!(due_second(Timestamp::from_millis(5_000)), 5);
        assert_eq!(due_second(Timestamp::from_millis(5_001)), 6);
        assert_eq!(due_second(Timestamp::from_millis(-1)), 0);
    }
}
