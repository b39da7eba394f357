//! [`Metrics`]: what the HTTP layer counts (requests and their latency by
//! route and status, uploads per minute), and [`Snapshot`]: the figures
//! gathered at scrape time (messages per folder, processes by state, the
//! session engine, the send queues, the repeat schedulers' backlogs,
//! alerts, disk). Together they are `/metrics` in the
//! Prometheus text format, names after the Prometheus conventions (base
//! units, `_total` counters).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use estafeta_exchange::Id;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::ProcessState;

use crate::notify::outbound::{HostFigures, TypeFigures};
use crate::notify::{Backlog, push};
use crate::state::AppState;

/// Upper bounds (seconds) of the request latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 11] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Minutes of uploads kept for the dashboard's chart.
pub const MINUTES_KEPT: usize = 60;

/// The states a process is in before it ends, reported even when zero.
pub const OPEN_STATES: [ProcessState; 5] = [
    ProcessState::Started,
    ProcessState::ReadyToCommit,
    ProcessState::Cleanup,
    ProcessState::Failed,
    ProcessState::InDoubt,
];

/// One request series: a count and a latency histogram.
#[derive(Clone, Debug, Default)]
struct Series {
    count: u64,
    sum: f64,
    /// Non-cumulative counts per bucket of [`LATENCY_BUCKETS`].
    buckets: [u64; LATENCY_BUCKETS.len()],
}

/// Counters of the HTTP layer.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), Series>>,
    /// (minute since the epoch, uploads in it), oldest first.
    uploads: Mutex<VecDeque<(u64, u64)>>,
}

impl Metrics {
    /// Counts one answered request that took `elapsed`, at `now` (the
    /// caller's clock; it places uploads in their minute).
    pub fn record(
        &self,
        method: &str,
        route: &str,
        status: u16,
        elapsed: Duration,
        now: SystemTime,
    ) {
        let secs = elapsed.as_secs_f64();
        {
            let mut map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            let s = map
                .entry((method.to_owned(), route.to_owned(), status))
                .or_default();
            s.count += 1;
            s.sum += secs;
            if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
                s.buckets[i] += 1;
            }
        }
        if method == "POST" && route == "/v1/messages" && status == 201 {
            let minute = minute_of(now);
            let mut up = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
            match up.back_mut() {
                Some((m, n)) if *m == minute => *n += 1,
                _ => up.push_back((minute, 1)),
            }
            while up
                .front()
                .is_some_and(|(m, _)| *m + MINUTES_KEPT as u64 <= minute)
            {
                up.pop_front();
            }
        }
    }

    /// Uploads in each of the last [`MINUTES_KEPT`] minutes up to `now`,
    /// oldest first.
    pub fn uploads_per_minute(&self, now: SystemTime) -> Vec<u64> {
        let last = minute_of(now);
        let first = last.saturating_sub(MINUTES_KEPT as u64 - 1);
        let up = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        (first..=last)
            .map(|m| up.iter().find(|(k, _)| *k == m).map_or(0, |(_, n)| *n))
            .collect()
    }

    /// Requests answered so far, all routes together.
    pub fn requests_total(&self) -> u64 {
        let map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        map.values().map(|s| s.count).sum()
    }

    /// The Prometheus text exposition of these counters and of `snapshot`.
    pub fn render(&self, snapshot: &Snapshot) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "estafeta_ready",
            "gauge",
            "Whether start-up recovery is done and the server is not stopping.",
        );
        let _ = writeln!(out, "estafeta_ready {}", u8::from(snapshot.ready));
        self.render_requests(&mut out);
        snapshot.render(&mut out);
        out
    }

    fn render_requests(&self, out: &mut String) {
        let map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        header(
            out,
            "estafeta_http_requests_total",
            "counter",
            "HTTP requests answered, by method, route and status.",
        );
        for ((method, route, status), s) in map.iter() {
            let labels = format!(
                "method=\"{method}\",route=\"{}\",status=\"{status}\"",
                escape(route)
            );
            let _ = writeln!(out, "estafeta_http_requests_total{{{labels}}} {}", s.count);
        }
        let name = "estafeta_http_request_duration_seconds";
        header(
            out,
            name,
            "histogram",
            "Time from a request's arrival to its answer, by method, route and status.",
        );
        for ((method, route, status), s) in map.iter() {
            let labels = format!(
                "method=\"{method}\",route=\"{}\",status=\"{status}\"",
                escape(route)
            );
            let mut cumulative = 0;
            for (bound, n) in LATENCY_BUCKETS.iter().zip(s.buckets) {
                cumulative += n;
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", s.count);
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", s.sum);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", s.count);
        }
    }
}

fn minute_of(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Label values escape `\`, `"` and newlines (Prometheus text format).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The wire name of a process state (`READY_TO_COMMIT`).
pub fn state_name(state: ProcessState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Figures gathered when `/metrics` is scraped (or the dashboard shown).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Whether `/readyz` answers 200.
    pub ready: bool,
    /// Files per mailbox and folder.
    pub folders: Vec<(Id, Folder, u64)>,
    /// Processes not ended, by state (every state of [`OPEN_STATES`]).
    pub processes: BTreeMap<String, u64>,
    /// Seconds the oldest READY_TO_COMMIT process has waited.
    pub oldest_ready_secs: f64,
    /// The session engine's figures.
    pub sessions: Option<estafeta_session::Stats>,
    /// Alerts nobody acknowledged.
    pub alerts_open: u64,
    /// The send queues' hosts and types.
    pub queues: Vec<HostFigures>,
    /// Each repeat source's backlog (`alerts`, `push`, `deliver_at`).
    pub backlogs: Vec<(&'static str, Backlog)>,
    /// Bytes free for the server on the data folder's file system, and its size.
    pub disk: Option<(u64, u64)>,
    /// The committed verdicts on devices' messages, summed over every
    /// device: processed, deadlocked, incorrect.
    pub device_messages: Option<[u64; 3]>,
}

impl Snapshot {
    /// Gathers the figures at `now` (the caller's clock). A part that
    /// cannot be read is left out rather than failing the scrape.
    pub async fn gather(state: &AppState, now: SystemTime) -> Snapshot {
        let exchange = state.exchange();
        let admin = Principal::Admin;
        let mut s = Snapshot {
            ready: state.is_ready(),
            folders: exchange.folder_counts(&admin).await.unwrap_or_default(),
            sessions: exchange.session_stats(),
            ..Snapshot::default()
        };
        for st in OPEN_STATES {
            s.processes.insert(state_name(st), 0);
        }
        if let Ok(list) = exchange.processes(&admin).await {
            let now_ms = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            for p in &list.processes {
                if let Some(n) = s.processes.get_mut(&state_name(p.state)) {
                    *n += 1;
                }
                if p.state == ProcessState::ReadyToCommit {
                    let since = p.ready_at.unwrap_or(p.started_at).as_millis();
                    let age = now_ms.saturating_sub(since).max(0) as f64 / 1000.0;
                    s.oldest_ready_secs = s.oldest_ready_secs.max(age);
                }
            }
        }
        s.backlogs = backlogs(state).await;
        if let Ok(stats) = exchange.stats(&admin).await {
            s.device_messages = Some(stats.devices.iter().fold([0; 3], |[p, d, i], dev| {
                [p + dev.processed, d + dev.deadlocks, i + dev.incorrect]
            }));
        }
        if let Some(n) = state.notifier() {
            s.queues = n.outbound().figures();
            s.alerts_open = n.unacknowledged().await.unwrap_or(0);
        }
        let dir = exchange.data_dir().to_path_buf();
        s.disk = tokio::task::spawn_blocking(move || disk_space(&dir))
            .await
            .ok()
            .flatten();
        s
    }

    fn render(&self, out: &mut String) {
        let name = "estafeta_mailbox_messages";
        header(
            out,
            name,
            "gauge",
            "Message files in each folder of each mailbox.",
        );
        for (id, folder, n) in &self.folders {
            let _ = writeln!(
                out,
                "{name}{{mailbox=\"{}\",folder=\"{}\"}} {n}",
                escape(id.as_str()),
                folder.as_str()
            );
        }
        if let Some(totals) = self.device_messages {
            let name = "estafeta_device_messages_total";
            header(
                out,
                name,
                "counter",
                "Devices' messages in committed processes, by verdict (summed over every device).",
            );
            for (outcome, n) in ["processed", "deadlocked", "incorrect"].iter().zip(totals) {
                let _ = writeln!(out, "{name}{{outcome=\"{outcome}\"}} {n}");
            }
        }
        let name = "estafeta_processes";
        header(out, name, "gauge", "Processes not ended, by state.");
        for (st, n) in &self.processes {
            let _ = writeln!(out, "{name}{{state=\"{st}\"}} {n}");
        }
        let name = "estafeta_oldest_ready_to_commit_age_seconds";
        header(
            out,
            name,
            "gauge",
            "How long the oldest READY_TO_COMMIT process has waited (0 when none).",
        );
        let _ = writeln!(out, "{name} {}", self.oldest_ready_secs);
        if let Some(st) = &self.sessions {
            let gauges = [
                (
                    "estafeta_sessions_in_memory",
                    "Sessions held in memory.",
                    st.in_memory,
                ),
                (
                    "estafeta_session_commands_queued",
                    "Commands waiting in session queues.",
                    st.queued,
                ),
            ];
            for (name, help, v) in gauges {
                header(out, name, "gauge", help);
                let _ = writeln!(out, "{name} {v}");
            }
            let counters = [
                (
                    "estafeta_session_loads_total",
                    "Sessions read from storage.",
                    st.loads,
                ),
                (
                    "estafeta_session_saves_total",
                    "Session records written to storage.",
                    st.saves,
                ),
                (
                    "estafeta_session_save_batches_total",
                    "Durable write transactions of the session engine.",
                    st.save_batches,
                ),
                (
                    "estafeta_session_flushes_total",
                    "Idle sessions flushed out of memory.",
                    st.flushes,
                ),
                (
                    "estafeta_session_expiries_total",
                    "Sessions that ended.",
                    st.expiries,
                ),
                (
                    "estafeta_session_finalize_calls_total",
                    "Calls of the session finalize hook.",
                    st.finalize_calls,
                ),
                (
                    "estafeta_session_storage_errors_total",
                    "Session storage operations that failed.",
                    st.storage_errors,
                ),
                (
                    "estafeta_session_quarantined_total",
                    "Session records set aside as undecodable.",
                    st.quarantined,
                ),
            ];
            for (name, help, v) in counters {
                header(out, name, "counter", help);
                let _ = writeln!(out, "{name} {v}");
            }
        }
        self.render_queues(out);
        self.render_backlogs(out);
        header(
            out,
            "estafeta_alerts_open",
            "gauge",
            "Alerts not acknowledged.",
        );
        let _ = writeln!(out, "estafeta_alerts_open {}", self.alerts_open);
        if let Some((free, total)) = self.disk {
            header(
                out,
                "estafeta_disk_free_bytes",
                "gauge",
                "Bytes available to the server on the data folder's file system.",
            );
            let _ = writeln!(out, "estafeta_disk_free_bytes {free}");
            header(
                out,
                "estafeta_disk_size_bytes",
                "gauge",
                "Size of the data folder's file system.",
            );
            let _ = writeln!(out, "estafeta_disk_size_bytes {total}");
        }
    }
}

/// A gauge drawn from each of some figures: name, help, value.
type Gauge<T, V> = (&'static str, &'static str, fn(&T) -> V);

impl Snapshot {
    fn render_queues(&self, out: &mut String) {
        let name = "estafeta_sendq_host_up";
        header(
            out,
            name,
            "gauge",
            "Whether a send queue host is up (0: its health probes marked it down).",
        );
        for h in &self.queues {
            let _ = writeln!(
                out,
                "{name}{{queue=\"{}\",host=\"{}\"}} {}",
                h.queue,
                escape(&h.host),
                u8::from(!h.down)
            );
        }
        let series: [Gauge<TypeFigures, usize>; 3] = [
            (
                "estafeta_sendq_queued",
                "Send queue entries waiting for their window or for the host, by host and type.",
                |t| t.queued,
            ),
            (
                "estafeta_sendq_in_flight",
                "Send queue entries being sent or unanswered, by host and type.",
                |t| t.in_flight,
            ),
            (
                "estafeta_sendq_window",
                "Send queue window (most entries in flight), by host and type.",
                |t| t.window,
            ),
        ];
        for (name, help, value) in series {
            header(out, name, "gauge", help);
            for h in &self.queues {
                for t in &h.types {
                    let _ = writeln!(
                        out,
                        "{name}{{queue=\"{}\",host=\"{}\",type=\"{}\"}} {}",
                        h.queue,
                        escape(&h.host),
                        t.name,
                        value(t)
                    );
                }
            }
        }
    }

    fn render_backlogs(&self, out: &mut String) {
        let series: [Gauge<Backlog, u64>; 3] = [
            (
                "estafeta_repeat_entries",
                "Entries held by a repeat scheduler (scheduled or retrying), by source.",
                |b| b.entries,
            ),
            (
                "estafeta_repeat_backlog",
                "Repeat entries due now and not yet done, by source.",
                |b| b.due,
            ),
            (
                "estafeta_repeat_lag_seconds",
                "Age of the oldest due repeat entry past its due time (0 when none is due), by source.",
                |b| b.lag_secs,
            ),
        ];
        for (name, help, value) in series {
            header(out, name, "gauge", help);
            for (source, b) in &self.backlogs {
                let _ = writeln!(out, "{name}{{source=\"{source}\"}} {}", value(b));
            }
        }
    }
}

/// The backlog of each repeat source the server runs: alert deliveries,
/// push notifications and scheduled messages. A source that cannot be
/// read is left out.
pub async fn backlogs(state: &AppState) -> Vec<(&'static str, Backlog)> {
    let mut out = Vec::new();
    if let Some(n) = state.notifier()
        && let Ok(b) = n.backlog().await
    {
        out.push((crate::notify::SOURCE, b));
    }
    if let Some(p) = state.pusher()
        && let Ok(b) = p.backlog().await
    {
        out.push((push::SOURCE, b));
    }
    let ex = state.exchange();
    if let (Ok(stats), Ok(first)) = (ex.scheduled_stats().await, ex.scheduled(1).await) {
        let now = u64::try_from(ex.now().as_millis() / 1000).unwrap_or(0);
        let counts = stats.sources.get(SCHEDULED).cloned().unwrap_or_default();
        let oldest = first.first().map(|e| e.due).filter(|d| *d <= now);
        out.push((
            SCHEDULED,
            Backlog::new(counts.entries, counts.due, oldest, now),
        ));
    }
    out
}

/// The repeat source of messages kept aside until their `deliver_at`.
pub const SCHEDULED: &str = "deliver_at";

/// Free (for unprivileged users) and total bytes of the file system of `dir`.
pub fn disk_space(dir: &std::path::Path) -> Option<(u64, u64)> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some((
        st.f_bavail.saturating_mul(st.f_frsize),
        st.f_blocks.saturating_mul(st.f_frsize),
    ))
}

/// Middleware: counts every answer and its latency by method and route.
/// Both labels come from closed sets, so no request can add series without
/// bound: the method is one of HTTP's own (else `other`), the route is the
/// matched template, never the raw path (`unmatched` when none matched).
/// Refused and failed requests are counted here and not written to the
/// event log one by one: a burst of bad requests must neither grow what
/// the server keeps nor push the log's history out.
pub async fn count(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    let response = next.run(request).await;
    state.metrics().record(
        method,
        &route,
        response.status().as_u16(),
        started.elapsed(),
        SystemTime::now(),
    );
    response
}

/// The metric label of a request method: HTTP's own methods by name,
/// anything made up as `other`.
pub fn method_label(method: &Method) -> &'static str {
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::DELETE, "DELETE"),
        (Method::PATCH, "PATCH"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::TRACE, "TRACE"),
        (Method::CONNECT, "CONNECT"),
    ];
    KNOWN
        .iter()
        .find(|(m, _)| m == method)
        .map_or("other", |(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Duration = Duration::from_secs(1_800_000_000);

    #[test]
    fn renders_counters_and_histograms_by_route_and_status() {
        let m = Metrics::default();
        let now = SystemTime::UNIX_EPOCH + T0;
        m.record("GET", "/v1/inbox", 200, Duration::from_millis(3), now);
        m.record("GET", "/v1/inbox", 200, Duration::from_millis(300), now);
        m.record(
            "POST",
            "/v1/processes/{pid}/commit",
            401,
            Duration::ZERO,
            now,
        );
        let text = m.render(&Snapshot {
            ready: true,
            ..Snapshot::default()
        });
        assert!(text.contains("estafeta_ready 1\n"));
        let inbox = "method=\"GET\",route=\"/v1/inbox\",status=\"200\"";
        assert!(text.contains(&format!("estafeta_http_requests_total{{{inbox}}} 2\n")));
        assert!(text.contains(&format!(
            "estafeta_http_request_duration_seconds_bucket{{{inbox},le=\"0.001\"}} 0\n"
        )));
        assert!(text.contains(&format!(
            "estafeta_http_request_duration_seconds_bucket{{{inbox},le=\"0.005\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "estafeta_http_request_duration_seconds_bucket{{{inbox},le=\"0.5\"}} 2\n"
        )));
        assert!(text.contains(&format!(
            "estafeta_http_request_duration_seconds_bucket{{{inbox},le=\"+Inf\"}} 2\n"
        )));
        assert!(text.contains(&format!(
            "estafeta_http_request_duration_seconds_count{{{inbox}}} 2\n"
        )));
        assert!(text.contains(
            "estafeta_http_requests_total{method=\"POST\",route=\"/v1/processes/{pid}/commit\",status=\"401\"} 1\n"
        ));
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(m.requests_total(), 3);
    }

    #[test]
    fn uploads_fall_into_their_minute_and_old_minutes_drop_out() {
        let m = Metrics::default();
        let at = |secs: u64| SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(secs);
        let upload = |t| m.record("POST", "/v1/messages", 201, Duration::ZERO, t);
        upload(at(0));
        upload(at(1));
        upload(at(61));
        m.record("POST", "/v1/messages", 200, Duration::ZERO, at(62));
        let series = m.uploads_per_minute(at(61));
        assert_eq!(series.len(), MINUTES_KEPT);
        assert_eq!(series[MINUTES_KEPT - 2..], [2, 1]);
        upload(at(61 + 60 * 60));
        let series = m.uploads_per_minute(at(61 + 60 * 60));
        assert_eq!(series.iter().sum::<u64>(), 1, "the old minutes are gone");
    }

    #[test]
    fn made_up_methods_share_one_label() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(method_label(&Method::OPTIONS), "OPTIONS");
        let made_up = Method::from_bytes("X".repeat(1000).as_bytes()).unwrap();
        assert_eq!(method_label(&made_up), "other");
        assert_eq!(method_label(&Method::from_bytes(b"get").unwrap()), "other");
    }

    #[test]
    fn disk_space_of_a_real_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (free, total) = disk_space(dir.path()).unwrap();
        assert!(total > 0 && free <= total);
        assert_eq!(disk_space(&dir.path().join("missing")), None);
    }
}
