//! Scheduled delivery (`deliver_at`): a message due later is kept aside in
//! the repeat scheduler (`<data>/.estafeta/scheduled.redb`, durable before
//! the upload is answered) with its file bytes as the entry's payload, and
//! enters its recipient's `Messages` when the exchange's clock reaches the
//! time. The entry is removed only after the file is durable there; a crash
//! in between writes it again, and a message already in any folder of its
//! recipient is not written twice.

use super::core::Core;
use super::error::ExchangeError;
use crate::Timestamp;
use crate::store::{FileName, Folder};
use crate::wire::ErrorCode;
use crate::wire::Message;
use estafeta_repeat::store::{Applied, Op, Scan, SourceCount, Store};
use estafeta_repeat::{Entry, Outcome, Position, RedbStore, Scheduler, StoreError};
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
pub(crate) type Deferred = Scheduler<Listed<RedbStore>, WallClock>;

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

fn storage(e: impl std::fmt::Display) -> ExchangeError {
    ExchangeError::unavailable(ErrorCode::StorageError, e.to_string())
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
) -> Result<(), ExchangeError> {
    let bytes = message.to_file_bytes().map_err(storage)?;
    deferred
        .schedule(SOURCE, due_second(at), &message.id.to_string(), &bytes)
        .await
        .map_err(storage)?;
    tracing::info!(target: "estafeta::event", message = %message.id, to = %message.to, deliver_at = %at, "message scheduled");
    Ok(())
}

impl Core {
    /// Write `message` into its recipient's `Messages` now, or keep it
    /// aside until `deliver_at` when that is later than now.
    pub(crate) async fn place(
        &self,
        message: &Message,
        deliver_at: Option<Timestamp>,
    ) -> Result<(), ExchangeError> {
        match deliver_at.filter(|at| *at > self.now()) {
            None => {
                let queue = self.location(&message.to, Folder::Messages);
                self.store.put(&queue, message).await?;
                self.arrived(&message.to);
            }
            Some(at) => keep_aside(&self.deferred, message, at).await?,
        }
        Ok(())
    }

    /// A kept-aside message came due: into `Messages`, durably, unless a
    /// delivery before a crash got there but not to removing its entry.
    pub(crate) async fn deliver_due(&self, entry: Entry) -> Outcome {
        let message: Message = match serde_json::from_slice(&entry.payload) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(id = entry.id, error = %e, "unreadable scheduled message dropped");
                return Outcome::Done;
            }
        };
        if self
            .store
            .delivered(&FileName::of(&message))
            .await
            .unwrap_or(false)
        {
            return Outcome::Done;
        }
        let queue = self.location(&message.to, Folder::Messages);
        match self.store.put(&queue, &message).await {
            Ok(_) => {
                self.arrived(&message.to);
                tracing::info!(target: "estafeta::event", message = %message.id, to = %message.to, "scheduled message delivered");
                Outcome::Done
            }
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
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
