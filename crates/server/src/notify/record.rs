//! [`Recorder`]: raising and ending alerts in the [`AlertStore`] so that
//! none is dropped when the store cannot take it for a while (the cluster's
//! database out of reach or failing over, a full disk).
//!
//! An operation is tried at once; if it fails it is tried again in the
//! background, with a pause that grows from [`FIRST_RETRY`] to
//! [`MAX_RETRY`], until it succeeds. The operations keep their order: each
//! waits for the ones before it to be done, so an alert raised while the
//! store was away and ended before it came back is recorded as raised and
//! then ended, not left ongoing.

use std::sync::Arc;
use std::time::Duration;

use estafeta_exchange::{Alert, Timestamp};
use estafeta_repeat::Entry;
use estafeta_session::BoxFuture;
use tokio::sync::Mutex;

use super::raised::{AlertStore, RaisedError};

/// The first pause before a failed operation is tried again; it doubles.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest pause between two tries.
pub const MAX_RETRY: Duration = Duration::from_secs(10);

/// One operation on the store, made again for each try.
type Op = Box<dyn Fn(Arc<dyn AlertStore>) -> BoxFuture<'static, Result<(), RaisedError>> + Send>;

/// Writes raised and ended alerts to a store, in order, until each is done.
#[derive(Clone)]
pub struct Recorder {
    store: Arc<dyn AlertStore>,
    /// Held by the operation under way (and by its retries): the next one
    /// waits for it. Tokio's mutex is fair, so they go in the order they
    /// asked.
    order: Arc<Mutex<()>>,
}

impl Recorder {
    /// A recorder writing to `store`.
    pub fn new(store: Arc<dyn AlertStore>) -> Recorder {
        Recorder {
            store,
            order: Arc::new(Mutex::new(())),
        }
    }

    /// The store (to read the alerts and acknowledge them).
    pub fn store(&self) -> &Arc<dyn AlertStore> {
        &self.store
    }

    /// Records `alert` as ongoing with its `deliveries` (nothing when its
    /// condition is ongoing already).
    pub async fn raise(&self, alert: Alert, deliveries: Vec<Entry>) {
        let key = alert.key.clone();
        let op: Op = Box::new(move |store| {
            let (alert, deliveries) = (alert.clone(), deliveries.clone());
            Box::pin(async move { store.raise(&alert, deliveries).await.map(drop) })
        });
        self.run("recording an alert", key, op).await;
    }

    /// Records that the condition `key` ended at `at`.
    pub async fn close(&self, key: String, at: Timestamp) {
        let op_key = key.clone();
        let op: Op = Box::new(move |store| {
            let key = op_key.clone();
            Box::pin(async move {
                if store.close(&key, at).await? {
                    tracing::info!(key, "alert condition ended");
                }
                Ok(())
            })
        });
        self.run("clearing an open alert", key, op).await;
    }

    /// Runs `op` once its turn comes; if it fails, goes on trying in a
    /// task of its own, keeping the turn, and returns.
    async fn run(&self, what: &'static str, key: String, op: Op) {
        let turn = Arc::clone(&self.order).lock_owned().await;
        let error = match op(Arc::clone(&self.store)).await {
            Ok(()) => return,
            Err(e) => e,
        };
        tracing::error!(error = %error, key, "{what} failed; trying again until it succeeds");
        let store = Arc::clone(&self.store);
        tokio::spawn(async move {
            let mut pause = FIRST_RETRY;
            let mut tries = 1u32;
            loop {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RETRY);
                tries += 1;
                match op(Arc::clone(&store)).await {
                    Ok(()) => {
                        tracing::warn!(key, tries, "{what} succeeded after failing");
                        break;
                    }
                    Err(e) => tracing::debug!(error = %e, key, tries, "{what} failed again"),
                }
            }
            drop(turn);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::raised::AlertRecord;
    use estafeta_exchange::AlertKind;
    use std::sync::Mutex as StdMutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A store whose first `failures` calls fail; it logs the calls that
    /// succeed.
    #[derive(Default)]
    struct Flaky {
        failures: AtomicU32,
        done: StdMutex<Vec<String>>,
    }

    impl Flaky {
        fn attempt(&self, what: String) -> Result<(), RaisedError> {
            if self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(RaisedError::Store("the database is away".into()));
            }
            self.done.lock().unwrap().push(what);
            Ok(())
        }
    }

    impl AlertStore for Flaky {
        fn raise<'a>(
            &'a self,
            alert: &'a Alert,
            _: Vec<Entry>,
        ) -> BoxFuture<'a, Result<bool, RaisedError>> {
            Box::pin(async move { self.attempt(format!("raise {}", alert.key)).map(|()| true) })
        }

        fn close<'a>(
            &'a self,
            key: &'a str,
            _: Timestamp,
        ) -> BoxFuture<'a, Result<bool, RaisedError>> {
            Box::pin(async move { self.attempt(format!("close {key}")).map(|()| true) })
        }

        fn acknowledge(&self, _: u64, _: Timestamp) -> BoxFuture<'_, Result<(), RaisedError>> {
            Box::pin(async { Ok(()) })
        }

        fn list(&self, _: usize) -> BoxFuture<'_, Result<Vec<AlertRecord>, RaisedError>> {
            Box::pin(async { Ok(Vec::new()) })
        }

        fn unacknowledged(&self) -> BoxFuture<'_, Result<u64, RaisedError>> {
            Box::pin(async { Ok(0) })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_alert_the_store_refuses_for_a_while_is_recorded_and_then_ended_in_order() {
        let flaky = Arc::new(Flaky {
            failures: AtomicU32::new(5),
            ..Flaky::default()
        });
        let recorder = Recorder::new(flaky.clone());
        let t = Timestamp::from_millis(1);
        recorder
            .raise(
                Alert::new(AlertKind::InDoubt, "p1", "in doubt", t),
                Vec::new(),
            )
            .await;
        assert!(
            flaky.done.lock().unwrap().is_empty(),
            "the first try failed"
        );
        // Ended while the raise is still being tried: it waits its turn.
        recorder.close("in_doubt:p1".to_owned(), t).await;
        assert_eq!(
            *flaky.done.lock().unwrap(),
            ["raise in_doubt:p1", "close in_doubt:p1"]
        );
    }
}
