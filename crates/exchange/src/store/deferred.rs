//! Messages kept aside until their `deliver_at`: entries of the repeat
//! scheduler (embedded: `<data>/.estafeta/scheduled.redb`) with the
//! message's bytes as the payload, due at the first whole second at or
//! after the time.

use crate::Timestamp;
use crate::wire::Message;
use estafeta_repeat::store::{Applied, Op, Scan, SourceCount, Store};
use estafeta_repeat::{Entry, Position, RedbStore, Scheduler, StoreError};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

/// The repeat source of scheduled messages.
pub(crate) const SOURCE: &str = "deliver_at";

/// The exchange's clock as the repeat scheduler's wall clock, so a test
/// that controls one controls both.
pub(crate) struct WallClock(pub(crate) Arc<dyn estafeta_session::Clock>);

impl estafeta_repeat::Clock for WallClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.now().0)
    }
}

/// The store of messages kept aside.
pub(crate) type Deferred = Scheduler<crate::service::Gated<Listed<RedbStore>>, WallClock>;

/// A repeat store shared between its scheduler and readers that list its
/// entries (the dashboard's page of scheduled and retrying deliveries):
/// the scheduler owns its store, so it is given this handle and the reader
/// keeps another.
#[derive(Debug)]
pub struct Listed<S>(pub Arc<S>);

impl<S: Store> Listed<S> {
    /// The first `limit` entries of `source`, due or not, soonest first.
    pub fn entries(&self, source: &str, limit: usize) -> Result<Vec<Entry>, StoreError> {
        Ok(self
            .0
            .scan(source, Bound::Unbounded, u64::MAX, limit, &|_| false)?
            .entries)
    }
}

impl<S: Store> Store for Listed<S> {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        self.0.apply(ops)
    }
    fn sources(&self) -> Result<Vec<String>, StoreError> {
        self.0.sources()
    }
    fn scan(
        &self,
        source: &str,
        from: Bound<&Position>,
        now: u64,
        limit: usize,
        skip: &dyn Fn(&Position) -> bool,
    ) -> Result<Scan, StoreError> {
        self.0.scan(source, from, now, limit, skip)
    }
    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        self.0.count(source, now)
    }
}

/// Why a message could not be kept aside.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeepAsideError {
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

/// Keeps `message` aside in `deferred` until `at`, durably.
pub(crate) async fn keep_aside(
    deferred: &Deferred,
    message: &Message,
    at: Timestamp,
) -> Result<(), KeepAsideError> {
    let bytes = message.to_file_bytes()?;
    deferred
        .schedule(SOURCE, due_second(at), &message.id.to_string(), &bytes)
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
