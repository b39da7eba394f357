//! How the service raises and clears alerts: now, or as part of a
//! session's step when the sink writes in the step's store (durable with
//! the step's save, or not at all); and the storage-write condition,
//! raised by a failed write and cleared by the next good one.

use super::alerts::{Alert, AlertKind, AlertSink, Condition, key};
use super::basics::{Held, now};
use crate::wire::ErrorCode;
use estafeta_session::Clock;
use std::fmt;
use std::sync::Arc;

/// The service's alerts: where they go, and the one condition it watches
/// itself (storage writes).
pub(crate) struct Alerting {
    /// Where alerts go.
    sink: Arc<dyn AlertSink>,
    /// Whether the storage-write alert is open (closed by the next good
    /// write).
    storage_write: Condition,
    /// The time an alert is raised at.
    clock: Arc<dyn Clock>,
}

impl Alerting {
    /// Alerts raised into `sink` at `clock`'s time.
    pub(crate) fn new(sink: Arc<dyn AlertSink>, clock: Arc<dyn Clock>) -> Alerting {
        Alerting {
            sink,
            storage_write: Condition::default(),
            clock,
        }
    }

    /// Raise an alert of `kind` for `subject` with the current time.
    pub(crate) async fn raise_now(
        &self,
        kind: AlertKind,
        subject: impl fmt::Display,
        text: impl Into<String>,
    ) {
        let alert = Alert::new(kind, subject, text, now(self.clock.as_ref()));
        self.sink.raise(alert).await;
    }

    /// Raise `alert` on its own.
    pub(crate) async fn raise(&self, alert: Alert) {
        self.sink.raise(alert).await;
    }

    /// The condition `key` ended.
    pub(crate) async fn clear(&self, key: String) {
        self.sink.clear(key).await;
    }

    /// Raise a storage-write alert when `result` failed on storage and none
    /// is open, and clear the open one when a write succeeds again. While
    /// it is open a failed write has nothing new to tell the sink, and is
    /// not held up by it: a sink that records alerts in the store that
    /// failed goes on retrying its first record, and a second raise would
    /// wait for that to end (a call answered only once the store is back,
    /// instead of 503 at once).
    pub(crate) async fn watch_storage<T>(
        &self,
        what: &str,
        result: Result<T, super::ExchangeError>,
    ) -> Result<T, super::ExchangeError> {
        match &result {
            Err(e)
                if matches!(e.code(), ErrorCode::StorageError | ErrorCode::StorageFull)
                    && self.storage_write.holds() =>
            {
                tracing::error!(target: "estafeta::alert", what, error = %e, "storage write failed");
                self.raise_now(
                    AlertKind::StorageWrite,
                    "data",
                    format!("a storage write failed ({what}): {e}"),
                )
                .await;
            }
            Ok(_) if self.storage_write.ended() => {
                self.clear(key(AlertKind::StorageWrite, "data")).await;
            }
            _ => {}
        }
        result
    }

    /// Raise `alert` as part of `held` when the alert sink writes in the
    /// step's store (durable with the step's save, or not at all), else on
    /// its own.
    pub(crate) async fn raise_in(&self, held: Held<'_>, alert: Alert) {
        if let Some(step) = held
            && self.sink.raise_in_step(step, &alert)
        {
            return;
        }
        self.sink.raise(alert).await;
    }

    /// The condition `key` ended, as part of `held` when the sink can (as
    /// [`raise_in`](Self::raise_in)).
    pub(crate) async fn clear_in(&self, held: Held<'_>, key: String) {
        if let Some(step) = held
            && self.sink.clear_in_step(step, &key)
        {
            return;
        }
        self.sink.clear(key).await;
    }
}
