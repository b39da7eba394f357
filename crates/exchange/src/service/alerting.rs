//! How the service raises and clears alerts: now, or as part of a
//! session's step when the sink writes in the step's store (durable with
//! the step's save, or not at all); and the storage-write condition,
//! raised by a failed write and cleared by the next good one.

use super::alerts::{Alert, AlertKind, key};
use super::core::{Core, Held};
use crate::wire::ErrorCode;
use std::fmt;

impl Core {
    /// Raise an alert of `kind` for `subject` with the current time.
    pub(crate) async fn raise_alert(
        &self,
        kind: AlertKind,
        subject: impl fmt::Display,
        text: impl Into<String>,
    ) {
        let alert = Alert::new(kind, subject, text, self.now());
        self.alerts.raise(alert).await;
    }

    /// The condition `kind` of `subject` ended.
    pub(crate) async fn clear_alert(&self, kind: AlertKind, subject: impl fmt::Display) {
        self.alerts.clear(key(kind, subject)).await;
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
                    && self.storage_alert.holds() =>
            {
                tracing::error!(target: "estafeta::alert", what, error = %e, "storage write failed");
                self.raise_alert(
                    AlertKind::StorageWrite,
                    "data",
                    format!("a storage write failed ({what}): {e}"),
                )
                .await;
            }
            Ok(_) if self.storage_alert.ended() => {
                self.clear_alert(AlertKind::StorageWrite, "data").await;
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
            && self.alerts.raise_in_step(step, &alert)
        {
            return;
        }
        self.alerts.raise(alert).await;
    }

    /// The condition `key` ended, as part of `held` when the sink can (as
    /// [`raise_in`](Self::raise_in)).
    pub(crate) async fn clear_in(&self, held: Held<'_>, key: String) {
        if let Some(step) = held
            && self.alerts.clear_in_step(step, &key)
        {
            return;
        }
        self.alerts.clear(key).await;
    }
}
