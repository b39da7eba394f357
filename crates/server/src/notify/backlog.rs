//! What the repeat schedulers hold, read for people: the rows of the
//! dashboard's page of scheduled and retrying deliveries ([`Row`]) and the
//! backlog figures of `/metrics` ([`Backlog`]).
//!
//! The repeat store keeps each entry's due time and attempt count but not
//! why it failed, so the last error of each retrying entry is kept here in
//! memory ([`LastErrors`]): after a restart it is empty until the next
//! failure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use estafeta_exchange::service::Listed;
use estafeta_repeat::store::Store;
use estafeta_repeat::{Entry, StoreError};

/// One pending entry of a repeat scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The repeat source (`alerts`, `push`, `deliver_at`).
    pub source: String,
    /// The entry's id.
    pub id: String,
    /// When it is due, in wall-clock seconds since the epoch.
    pub due_secs: u64,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Why the last attempt failed, if this run saw it fail.
    pub last_error: Option<String>,
}

impl Row {
    /// A row for `entry` with the error this run saw last.
    pub fn of(entry: &Entry, errors: &LastErrors) -> Row {
        Row {
            source: entry.source.clone(),
            id: entry.id.clone(),
            due_secs: entry.due,
            attempts: entry.attempt,
            last_error: errors.get(&entry.id),
        }
    }
}

/// The backlog of one repeat source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Entries stored, due or not.
    pub entries: u64,
    /// Entries due now (overdue or being handled).
    pub due: u64,
    /// How far behind the oldest due entry is, in seconds (0 when none is due).
    pub lag_secs: u64,
}

impl Backlog {
    /// The backlog from counts and the oldest entry's due second, at `now`.
    pub fn new(entries: u64, due: u64, oldest_due: Option<u64>, now: u64) -> Backlog {
        Backlog {
            entries,
            due,
            lag_secs: oldest_due.map_or(0, |d| now.saturating_sub(d)),
        }
    }
}

/// The last error of each entry that failed, by entry id.
#[derive(Clone, Debug, Default)]
pub struct LastErrors(Arc<Mutex<HashMap<String, String>>>);

impl LastErrors {
    /// The attempt of entry `id` failed with `error` (kept with the
    /// credentials of any URL in it masked: the dashboard shows it).
    pub fn set(&self, id: &str, error: String) {
        let error = crate::events::layer::redact_urls(&error).into_owned();
        self.lock().insert(id.to_owned(), error);
    }

    /// Entry `id` is done: forget its error.
    pub fn clear(&self, id: &str) {
        self.lock().remove(id);
    }

    /// The last error of entry `id`.
    pub fn get(&self, id: &str) -> Option<String> {
        self.lock().get(id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The first `limit` entries of `source` in `store`, soonest first.
pub async fn rows(
    store: &Arc<dyn Store>,
    source: &'static str,
    limit: usize,
    errors: &LastErrors,
) -> Result<Vec<Row>, StoreError> {
    let listed = Listed(store.clone());
    let entries = tokio::task::spawn_blocking(move || listed.entries(source, limit))
        .await
        .map_err(|e| StoreError::Backend(e.to_string().into()))??;
    Ok(entries.iter().map(|e| Row::of(e, errors)).collect())
}

/// The backlog of `source` in `store` at wall-clock second `now`.
pub async fn backlog(
    store: &Arc<dyn Store>,
    source: &'static str,
    now: u64,
) -> Result<Backlog, StoreError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        let count = store.count(source, now)?;
        let oldest = store
            .scan(estafeta_repeat::store::Read::first(source, 1), now, &|_| {
                false
            })?
            .entries
            .first()
            .map(|e| e.due);
        Ok(Backlog::new(count.entries, count.due, oldest, now))
    })
    .await
    .map_err(|e| StoreError::Backend(e.to_string().into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_the_age_of_the_oldest_due_entry() {
        assert_eq!(Backlog::new(3, 0, None, 100).lag_secs, 0);
        assert_eq!(Backlog::new(3, 2, Some(40), 100).lag_secs, 60);
        assert_eq!(Backlog::new(1, 1, Some(100), 100).lag_secs, 0);
    }

    #[test]
    fn errors_are_kept_until_cleared() {
        let e = LastErrors::default();
        e.set("a", "refused".into());
        assert_eq!(e.get("a").as_deref(), Some("refused"));
        e.clear("a");
        assert_eq!(e.get("a"), None);
    }

    #[test]
    fn errors_shown_on_the_dashboard_mask_url_credentials_and_paths() {
        let e = LastErrors::default();
        e.set(
            "push/phone-1/1-0",
            "error sending request for url (https://hook:s3cret@example.net/x)".into(),
        );
        let shown = e.get("push/phone-1/1-0").unwrap();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("https://***@example.net/***"), "{shown}");
    }
}
