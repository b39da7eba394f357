//! [`AppState`]: what every handler shares: the exchange, readiness, the
//! HTTP settings, the request counters, the alerts (as the event log shows
//! them, and the notifier that delivers them), push notifications, the
//! dashboard's login sessions and when each client last called.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use estafeta_exchange::Exchange;

use crate::alerts::AlertBook;
use crate::config::HttpSettings;
use crate::dashboard::auth::Sessions;
use crate::last_seen::LastSeen;
use crate::metrics::Metrics;
use crate::notify::{Notifier, Pusher};

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
    alerts: AlertBook,
    sessions: Sessions,
    last_seen: LastSeen,
    /// Alert delivery, once [`crate::run_with`] has started it (the
    /// dashboard lists its open alerts).
    notifier: OnceLock<Notifier>,
    /// Push notifications, once [`crate::run_with`] has started them.
    pusher: OnceLock<Pusher>,
}

impl AppState {
    /// State around an opened exchange; not ready until [`AppState::set_ready`].
    pub fn new(exchange: Exchange, http: HttpSettings) -> Self {
        AppState {
            inner: Arc::new(Inner {
                http,
                ready: AtomicBool::new(false),
                metrics: Metrics::default(),
                alerts: AlertBook::open(exchange.data_dir()).unwrap_or_else(|e| {
                    tracing::error!(error = %e, "reading alert acknowledgements failed; starting with none");
                    AlertBook::empty(exchange.data_dir())
                }),
                sessions: Sessions::default(),
                last_seen: LastSeen::default(),
                exchange,
                notifier: OnceLock::new(),
                pusher: OnceLock::new(),
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

    /// The alerts and their acknowledgements.
    pub fn alerts(&self) -> &AlertBook {
        &self.inner.alerts
    }

    /// The dashboard's login sessions.
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    /// When each database and device last called.
    pub fn last_seen(&self) -> &LastSeen {
        &self.inner.last_seen
    }

    /// Alert delivery, when the server runs one.
    pub fn notifier(&self) -> Option<&Notifier> {
        self.inner.notifier.get()
    }

    /// Records the server's alert delivery (once; later calls are ignored).
    pub fn set_notifier(&self, notifier: Notifier) {
        let _ = self.inner.notifier.set(notifier);
    }

    /// Push notifications, when the server runs them.
    pub fn pusher(&self) -> Option<&Pusher> {
        self.inner.pusher.get()
    }

    /// Records the server's push notifications (once; later calls are ignored).
    pub fn set_pusher(&self, pusher: Pusher) {
        let _ = self.inner.pusher.set(pusher);
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
