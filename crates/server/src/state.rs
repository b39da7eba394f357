//! [`AppState`]: what every handler shares: the exchange, readiness, the
//! HTTP settings, the request counters, the notifier (which delivers and
//! keeps the alerts), push notifications, the dashboard's login sessions
//! and failed logins, and when each client last called.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use estafeta_exchange::Exchange;

use crate::config::HttpSettings;
use crate::dashboard::auth::Sessions;
use crate::dashboard::throttle::LoginThrottle;
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
    sessions: Sessions,
    login_throttle: LoginThrottle,
    last_seen: LastSeen,
    /// Alert delivery, once [`crate::run_with`] has started it (its store
    /// is the dashboard's list of alerts and their acknowledgements).
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
                sessions: Sessions::default(),
                login_throttle: LoginThrottle::default(),
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

    /// The dashboard's login sessions.
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    /// The dashboard's failed logins by client address.
    pub fn login_throttle(&self) -> &LoginThrottle {
        &self.inner.login_throttle
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
