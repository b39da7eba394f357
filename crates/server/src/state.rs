//! [`AppState`]: what every handler shares: the exchange (whose phase is
//! the server's readiness), the HTTP settings, the request counters, the
//! notifier (which delivers and keeps the alerts), push notifications, the
//! dashboard's login sessions, the wrong tokens by client address, the event log it reads,
//! and when each client last called.

use std::sync::Arc;

use estafeta_exchange::Exchange;

use crate::body_room::BodyRoom;
use crate::config::HttpSettings;
use crate::dashboard::logins::Logins;
use crate::events::EventLogStore;
use crate::last_seen::LastSeen;
use crate::metrics::{Metrics, Parts};
use crate::notify::{Notifier, Pusher};
use crate::readiness::Readiness;
use crate::throttle::AuthThrottle;

/// The shared state of the router. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    exchange: Exchange,
    http: HttpSettings,
    /// Room for the message bodies held at once.
    body_room: BodyRoom,
    metrics: Metrics,
    logins: Logins,
    /// Wrong tokens by client address (bearer tokens and dashboard logins),
    /// in a cluster shared with the other nodes.
    auth_throttle: AuthThrottle,
    /// What `/readyz` checks storage with.
    readiness: Readiness,
    last_seen: LastSeen,
    /// Alert delivery (its store is the dashboard's list of alerts and
    /// their acknowledgements): the exchange's alert sink.
    notifier: Notifier,
    /// Push notifications: the exchange's push sink.
    pusher: Pusher,
    /// The event log the dashboard's events page reads (this node's file,
    /// or the cluster's table).
    events: Arc<dyn EventLogStore>,
}

impl AppState {
    /// State around an exchange opened with `notifier` and `pusher` as its
    /// sinks and `metrics`' commits as its observer, the dashboard's logins
    /// kept in `logins`, the event log read from `events`, wrong tokens
    /// counted by `auth_throttle`, storage checked by `readiness`
    /// ([`crate::Server::open`] builds them in that order).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        exchange: Exchange,
        http: HttpSettings,
        notifier: Notifier,
        pusher: Pusher,
        logins: Logins,
        events: Arc<dyn EventLogStore>,
        metrics: Metrics,
        auth_throttle: AuthThrottle,
        readiness: Readiness,
    ) -> Self {
        AppState {
            inner: Arc::new(Inner {
                body_room: BodyRoom::new(http.bodies_in_flight_bytes),
                http,
                metrics,
                logins,
                auth_throttle,
                readiness,
                last_seen: LastSeen::default(),
                exchange,
                notifier,
                pusher,
                events,
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

    /// Room for the message bodies held at once.
    pub fn body_room(&self) -> &BodyRoom {
        &self.inner.body_room
    }

    /// The request counters.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The event log the dashboard reads.
    pub fn events(&self) -> &Arc<dyn EventLogStore> {
        &self.inner.events
    }

    /// The dashboard's login sessions.
    pub fn logins(&self) -> &Logins {
        &self.inner.logins
    }

    /// Wrong tokens by client address: bearer tokens and dashboard logins.
    pub fn auth_throttle(&self) -> &AuthThrottle {
        &self.inner.auth_throttle
    }

    /// When each database and device last called.
    pub fn last_seen(&self) -> &LastSeen {
        &self.inner.last_seen
    }

    /// Alert delivery.
    pub fn notifier(&self) -> &Notifier {
        &self.inner.notifier
    }

    /// Push notifications.
    pub fn pusher(&self) -> &Pusher {
        &self.inner.pusher
    }

    /// The parts `/metrics` and the dashboard read their figures from.
    pub fn metric_parts(&self) -> Parts<'_> {
        Parts {
            exchange: &self.inner.exchange,
            notifier: &self.inner.notifier,
            pusher: &self.inner.pusher,
            auth: &self.inner.auth_throttle,
            per_database: self.inner.http.metrics_per_database,
        }
    }

    /// What `/readyz` checks storage with.
    pub fn readiness(&self) -> &Readiness {
        &self.inner.readiness
    }

    /// Whether `/readyz` may answer 200: the phase is
    /// [`estafeta_exchange::Phase::Ready`] (recovery done, not stopping).
    pub fn is_ready(&self) -> bool {
        self.inner.exchange.is_ready()
    }
}
