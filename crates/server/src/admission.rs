//! [`Admission`]: which connections the accept loop serves. At most
//! `max_connections` are served at once, never more than half the
//! process's open-file limit minus the reserve, so that the server's own
//! files (stores, message files, outbound connections) always have room.
//! Past that, [`RESERVED`] more connections are taken for the operator:
//! each serves one request, and only `/healthz`, `/readyz`, the admin API
//! and the dashboard ([`reserved_routes_only`]); a reserved connection that
//! has not sent a request yet gives way to a newer one, so connections that
//! never finish their request head cannot hold the reserve. Past the
//! reserve, a connection is closed at once. Refusals are logged in
//! aggregate ([`Admission::refusals`]), never one line per connection.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use estafeta_exchange::wire::ErrorCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;

/// Connections kept for `/healthz`, `/readyz`, the admin API and the
/// dashboard once `max_connections` are open.
pub const RESERVED: usize = 32;

/// How a connection was admitted; dropping it frees its place.
pub enum Admitted {
    /// One of the `max_connections`: every route, kept alive between requests.
    General(OwnedSemaphorePermit),
    /// One of the [`RESERVED`]: one request, operator routes only.
    Reserved(ReservedSlot),
}

/// The connections open and the places left.
pub struct Admission {
    /// The places of the general connections.
    general: Arc<Semaphore>,
    /// How many there are.
    places: usize,
    /// The reserved connections open, oldest first.
    reserved: Arc<Mutex<VecDeque<Entry>>>,
    /// Numbers the reserved connections, to find one again.
    next_id: AtomicU64,
    /// Connections closed at once since the last [`Admission::refusals`].
    refused: AtomicU64,
    /// Reserved connections closed for a newer one since the last
    /// [`Admission::refusals`].
    evicted: AtomicU64,
}

/// A reserved connection.
struct Entry {
    id: u64,
    /// Whether its request has begun (it is not given way then).
    started: Arc<AtomicBool>,
    /// Cancelled when it must give way to a newer connection.
    evict: CancellationToken,
}

/// The place of a reserved connection, freed when dropped.
pub struct ReservedSlot {
    id: u64,
    started: Arc<AtomicBool>,
    evict: CancellationToken,
    reserved: Arc<Mutex<VecDeque<Entry>>>,
}

impl ReservedSlot {
    /// What the connection's requests carry, so that the router serves
    /// only the operator's routes on it and it is not given way once its
    /// request has begun.
    pub fn marker(&self) -> ReservedConnection {
        ReservedConnection {
            started: self.started.clone(),
        }
    }

    /// Resolves when the connection must close for a newer one.
    pub async fn evicted(&self) {
        self.evict.cancelled().await
    }
}

impl Drop for ReservedSlot {
    fn drop(&mut self) {
        let mut reserved = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        reserved.retain(|e| e.id != self.id);
    }
}

/// The request extension of a reserved connection's requests.
#[derive(Clone)]
pub struct ReservedConnection {
    started: Arc<AtomicBool>,
}

/// Connections refused and given way since the last look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusals {
    /// Closed at once: every place taken.
    pub refused: u64,
    /// Reserved connections without a request yet, closed for newer ones.
    pub evicted: u64,
}

impl Admission {
    /// Places for `max_connections` general connections, fewer when the
    /// open-file limit `open_files` (`None`: unlimited) is too low for them
    /// (half of it goes to connections, the reserve included).
    pub fn new(max_connections: usize, open_files: Option<u64>) -> Admission {
        let places = general_places(max_connections, open_files);
        Admission {
            general: Arc::new(Semaphore::new(places)),
            places,
            reserved: Arc::default(),
            next_id: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    /// How many general connections may be open at once.
    pub fn places(&self) -> usize {
        self.places
    }

    /// A place for a new connection: a general one while any is free, else
    /// a reserved one (making room by closing the oldest reserved
    /// connection whose request has not begun); `None` when every place is
    /// taken (the caller closes the connection).
    pub fn admit(&self) -> Option<Admitted> {
        if let Ok(permit) = self.general.clone().try_acquire_owned() {
            return Some(Admitted::General(permit));
        }
        let mut reserved = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        if reserved.len() >= RESERVED {
            match reserved
                .iter()
                .position(|e| !e.started.load(Ordering::Acquire))
            {
                Some(i) => {
                    if let Some(idle) = reserved.remove(i) {
                        idle.evict.cancel();
                        self.evicted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
        let slot = ReservedSlot {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            started: Arc::default(),
            evict: CancellationToken::new(),
            reserved: self.reserved.clone(),
        };
        reserved.push_back(Entry {
            id: slot.id,
            started: slot.started.clone(),
            evict: slot.evict.clone(),
        });
        Some(Admitted::Reserved(slot))
    }

    /// The connections refused and given way since the last call.
    pub fn refusals(&self) -> Refusals {
        Refusals {
            refused: self.refused.swap(0, Ordering::Relaxed),
            evicted: self.evicted.swap(0, Ordering::Relaxed),
        }
    }
}

/// The general places for `max_connections` under the open-file limit
/// `open_files`: half of the limit for connections, less the reserve, at
/// least one.
pub fn general_places(max_connections: usize, open_files: Option<u64>) -> usize {
    let budget = open_files
        .map(|n| usize::try_from(n / 2).unwrap_or(usize::MAX))
        .unwrap_or(usize::MAX);
    max_connections.min(budget.saturating_sub(RESERVED)).max(1)
}

/// Whether `path` is served on a reserved connection: liveness, readiness,
/// the admin API and the dashboard.
pub fn is_reserved_route(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/admin")
        || path.starts_with("/v1/admin/")
        || path.starts_with("/admin/")
}

/// Middleware: on a reserved connection, marks its request begun and
/// answers anything but the operator's routes 503 `too_busy`.
pub async fn reserved_routes_only(request: Request, next: Next) -> Response {
    if let Some(reserved) = request.extensions().get::<ReservedConnection>() {
        reserved.started.store(true, Ordering::Release);
        if !is_reserved_route(request.uri().path()) {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::TooBusy,
                "the server serves as many connections as it may; retry later",
            )
            .into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limit_bounds_the_places() {
        assert_eq!(general_places(4096, None), 4096);
        assert_eq!(general_places(4096, Some(65536)), 4096);
        assert_eq!(general_places(4096, Some(256)), 128 - RESERVED);
        assert_eq!(general_places(4096, Some(10)), 1);
    }

    #[test]
    fn past_the_places_the_reserve_gives_way_to_newer_connections_until_requests_begin() {
        let admission = Admission::new(1, None);
        let Some(Admitted::General(general)) = admission.admit() else {
            panic!("the first connection is a general one");
        };
        let mut slots: Vec<ReservedSlot> = (0..RESERVED)
            .map(|_| match admission.admit() {
                Some(Admitted::Reserved(slot)) => slot,
                _ => panic!("a reserved place was free"),
            })
            .collect();
        // Full: the oldest reserved connection without a request gives way.
        let Some(Admitted::Reserved(newer)) = admission.admit() else {
            panic!("the oldest idle reserved connection gives way");
        };
        assert!(slots[0].evict.is_cancelled());
        assert!(!slots[1].evict.is_cancelled());
        drop(slots.remove(0));
        // Once every request has begun, nothing gives way.
        for slot in slots.iter().chain([&newer]) {
            slot.started.store(true, Ordering::Release);
        }
        assert!(admission.admit().is_none());
        assert_eq!(
            admission.refusals(),
            Refusals {
                refused: 1,
                evicted: 1
            }
        );
        assert_eq!(
            admission.refusals(),
            Refusals {
                refused: 0,
                evicted: 0
            }
        );
        // A closed connection frees its place.
        drop(slots.pop());
        assert!(matches!(admission.admit(), Some(Admitted::Reserved(_))));
        drop(general);
        assert!(matches!(admission.admit(), Some(Admitted::General(_))));
    }

    #[test]
    fn the_reserve_serves_the_operators_routes() {
        for path in [
            "/healthz",
            "/readyz",
            "/admin",
            "/admin/login",
            "/v1/admin/stats",
        ] {
            assert!(is_reserved_route(path), "{path}");
        }
        for path in [
            "/v1/messages",
            "/v1/inbox",
            "/metrics",
            "/administrator",
            "/v1/adminx",
        ] {
            assert!(!is_reserved_route(path), "{path}");
        }
    }
}
