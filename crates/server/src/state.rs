//! [`AppState`]: what every handler shares: the exchange, readiness, the
//! HTTP settings, the request counters and the alert notifier.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use estafeta_exchange::Exchange;

use crate::config::HttpSettings;
use crate::metrics::Metrics;
use crate::notify::Notifier;

/// The shared state of the router. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    exchange: Exchange,
    http: HttpSettings,
    /// Set when start-up recovery succeeded; cleared when stopping.
    ready: AtomicBool,
    metrics: Metrics,
    /// Alert delivery, once [`crate::run_with`] has started it (the
    /// dashboard lists its open alerts).
    notifier: OnceLock<Notifier>,
}

impl AppState {
    /// State around an opened exchange; not ready until [`AppState::set_ready`].
    pub fn new(exchange: Exchange, http: HttpSettings) -> Self {
        AppState {
            inner: Arc::new(Inner {
                exchange,
                http,
                ready: AtomicBool::new(false),
                metrics: Metrics::default(),
                notifier: OnceLock::new(),
            }),
        }
    }

    /// The exchange service.
    pub fn exchange(&self) -> &Exchange {
        &self.inner.exchange
    }

    /// The HTTP settings.
    pub fn http(&self) -> &HttpSettings {
        &self.inner.http
    }

    /// The request counters.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Alert delivery, when the server runs one.
    pub fn notifier(&self) -> Option<&Notifier> {
        self.inner.notifier.get()
    }

    /// Records the server's alert delivery (once; later calls are ignored).
    pub fn set_notifier(&self, notifier: Notifier) {
        let _ = self.inner.notifier.set(notifier);
    }

    /// Whether `/readyz` answers 200: recovery done, not stopping.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire) && self.inner.exchange.is_ready()
    }

    /// Marks recovery done (`true`) or the server stopping (`false`).
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
    }
}
