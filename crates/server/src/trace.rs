//! [`traced`]: a request id on every request and a `tracing` span around
//! it, so that every log line written while the request runs says which
//! request it belongs to.
//!
//! The id is the client's `x-request-id` when it sent a fit one (at most
//! [`MAX_REQUEST_ID`] visible ASCII characters), else a new time-ordered
//! UUID (version 7, [`TimeOrderedIds`]); the answer carries it back in
//! `x-request-id`. The span is named `request` and has
//! the fields `request_id`, `method` and `path`; `/healthz` and `/readyz`
//! get a span named `probe` with the same fields.
//!
//! When a request finishes, one line with `status` and `latency_s` (in
//! seconds) is logged under this module's target: at DEBUG (an access log
//! with `ESTAFETA_LOG=info,estafeta_server::trace=debug`), at INFO for a
//! 503 (recovering, stopping, storage failing: its cause is logged where
//! it happens), at WARN for any other 5xx. Probes always log at DEBUG: a
//! load balancer asking `/readyz` every second during start-up gets 503
//! each time, which is the answer it asked for, not a fault.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, Response, StatusCode};
use axum::middleware::map_request;
use axum::routing::Route;
use tower::{Layer, Service, ServiceBuilder};
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;
use tracing::Span;

/// The header that carries the request id, both ways.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest request id taken from a client, in bytes.
pub const MAX_REQUEST_ID: usize = 128;

/// The paths whose requests get a `probe` span and quiet lines.
const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// `router` with request ids and the request span around every route,
/// outside the layers `within`. All of them are one layer, put on the
/// routes once: each `Router::layer` wraps every route in a box of its
/// own, and a request clones each box inside every one it passes: seven
/// layers put one by one cost a request some fifty boxes copied.
pub fn traced<S, L>(router: Router<S>, within: L) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    // The first layer added is the first to see a request.
    router.layer(
        ServiceBuilder::new()
            .layer(map_request(drop_unfit_id))
            .layer(SetRequestIdLayer::new(REQUEST_ID, TimeOrderedIds))
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(span_of)
                    .on_request(())
                    .on_response(finished::<Body>)
                    .on_body_chunk(())
                    .on_eos(())
                    .on_failure(()),
            )
            .layer(PropagateRequestIdLayer::new(REQUEST_ID))
            .layer(within),
    )
}

/// Makes the id of a request that came without a fit one: a UUID of
/// version 7, whose leading bits are the time in milliseconds. The event
/// log indexes its records by request id; ids that grow with time are
/// added at the end of that index, where random ones would each dirty a
/// page of their own in every batch the log writes.
#[derive(Clone, Copy, Debug)]
pub struct TimeOrderedIds;

impl MakeRequestId for TimeOrderedIds {
    fn make_request_id<B>(&mut self, _request: &axum::http::Request<B>) -> Option<RequestId> {
        let id = uuid::Uuid::now_v7().to_string();
        axum::http::HeaderValue::from_str(&id)
            .ok()
            .map(RequestId::new)
    }
}

/// Removes a client's `x-request-id` that is too long, not visible ASCII,
/// or given more than once: one is made in its place. An id goes into
/// every log line of its request, so a client must not choose a huge or
/// misleading one.
async fn drop_unfit_id(mut request: Request) -> Request {
    let given = request.headers().get_all(&REQUEST_ID);
    let mut values = given.iter();
    let fit = match (values.next(), values.next()) {
        (None, _) => true,
        (Some(id), None) => {
            let bytes = id.as_bytes();
            !bytes.is_empty()
                && bytes.len() <= MAX_REQUEST_ID
                && bytes.iter().all(u8::is_ascii_graphic)
        }
        (Some(_), Some(_)) => false,
    };
    if !fit {
        request.headers_mut().remove(&REQUEST_ID);
    }
    request
}

/// The span of one request. At ERROR level so that it is kept under any
/// log filter that keeps any line of the request: a warning must say whose
/// request it was even when only warnings are shown.
fn span_of(request: &Request) -> Span {
    let request_id = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|id| id.to_str().ok())
        .unwrap_or_default();
    let method = request.method().as_str();
    let path = request.uri().path();
    if PROBES.contains(&path) {
        tracing::error_span!("probe", request_id = %request_id, method = %method, path = %path)
    } else {
        tracing::error_span!("request", request_id = %request_id, method = %method, path = %path)
    }
}

/// The line that ends a request (inside its span).
fn finished<B>(response: &Response<B>, latency: Duration, span: &Span) {
    let status = response.status().as_u16();
    let latency_s = latency.as_secs_f64();
    let probe = span.metadata().is_some_and(|m| m.name() == "probe");
    match response.status() {
        _ if probe => tracing::debug!(status, latency_s, "finished"),
        StatusCode::SERVICE_UNAVAILABLE => tracing::info!(status, latency_s, "finished"),
        s if s.is_server_error() => tracing::warn!(status, latency_s, "finished"),
        _ => tracing::debug!(status, latency_s, "finished"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_are_uuids_of_version_7_in_the_order_made() {
        let request = axum::http::Request::new(());
        let made: Vec<String> = (0..1000)
            .map(|_| {
                let id = TimeOrderedIds.make_request_id(&request).unwrap();
                id.header_value().to_str().unwrap().to_owned()
            })
            .collect();
        for id in &made {
            let uuid = uuid::Uuid::parse_str(id).unwrap();
            assert_eq!(uuid.get_version_num(), 7, "{id}");
        }
        let mut sorted = made.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted, made,
            "each id unique and after the one made before it"
        );
    }
}
