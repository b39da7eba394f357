//! [`Metrics`]: request counters by route and status, served as Prometheus
//! text on `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::state::AppState;

/// Counts of answered requests, keyed by method, route template and status.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
}

impl Metrics {
    /// Counts one answered request.
    pub fn record(&self, method: &str, route: &str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((method.to_owned(), route.to_owned(), status))
            .or_default() += 1;
    }

    /// The Prometheus text exposition of the counters and of readiness.
    pub fn render(&self, ready: bool) -> String {
        let mut out = String::new();
        out.push_str("# HELP estafeta_ready Whether start-up recovery is done and the server is not stopping.\n");
        out.push_str("# TYPE estafeta_ready gauge\n");
        let _ = writeln!(out, "estafeta_ready {}", u8::from(ready));
        out.push_str("# HELP estafeta_http_requests_total HTTP requests answered, by method, route and status.\n");
        out.push_str("# TYPE estafeta_http_requests_total counter\n");
        let map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        for ((method, route, status), n) in map.iter() {
            let _ = writeln!(
                out,
                "estafeta_http_requests_total{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {n}",
                escape(route)
            );
        }
        out
    }
}

/// Label values escape `\`, `"` and newlines (Prometheus text format).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Middleware: counts every answer under its route template (not the raw
/// path, so that ids do not make the label set grow without bound).
pub async fn count(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    let response = next.run(request).await;
    state
        .metrics()
        .record(&method, &route, response.status().as_u16());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_by_route_and_status() {
        let m = Metrics::default();
        m.record("GET", "/v1/inbox", 200);
        m.record("GET", "/v1/inbox", 200);
        m.record("POST", "/v1/processes/{pid}/commit", 401);
        let text = m.render(true);
        assert!(text.contains("estafeta_ready 1\n"));
        assert!(text.contains(
            "estafeta_http_requests_total{method=\"GET\",route=\"/v1/inbox\",status=\"200\"} 2\n"
        ));
        assert!(text.contains(
            "estafeta_http_requests_total{method=\"POST\",route=\"/v1/processes/{pid}/commit\",status=\"401\"} 1\n"
        ));
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
