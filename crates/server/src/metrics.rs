//! [`Metrics`]: what the HTTP layer counts (requests and their latency by
//! route and status, uploads per minute), and [`Snapshot`]: the figures
//! gathered at scrape time (messages in `Messages`, `Unknown` and `Error`
//! summed over all mailboxes and processes by state, both read from the
//! exchange's running totals; the session engine, the send queues, the
//! repeat schedulers' backlogs, alerts, disk). Together they are `/metrics` in the
//! Prometheus text format (written by `prometheus-client`), names after the
//! Prometheus conventions (base units, `_total` counters).
//!
//! No series is per mailbox unless the `metrics_per_database` setting asks
//! for the messages waiting of a capped number of databases: a scrape has
//! the same size with ten mailboxes or ten thousand, and costs the same
//! (nothing is counted per mailbox at scrape time). Per-mailbox figures are
//! the admin API's and the dashboard's.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::http::Method;
use estafeta_exchange::mailbox::{COUNTED, Folder};
use estafeta_exchange::store::SCHEDULED_SOURCE;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::ProcessState;
use estafeta_exchange::{CommitObserver, Durable, Exchange, Verdicts};
use prometheus_client::encoding::{EncodeLabelSet, prometheus_text};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::notify::outbound::{HTTP_QUEUE, HostFigures};
use crate::notify::{Backlog, Notifier, Pusher, push};
use crate::throttle::AuthThrottle;

/// Upper bounds (seconds) of the request latency histogram buckets: from a
/// cached read (1 ms) through a group-committed upload (tens of ms) to a
/// call held up by a slow disk (10 s).
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

/// The two kinds of mailbox, the `kind` label of the mailbox series.
pub const KINDS: [&str; 2] = ["database", "device"];

/// The labels of one request series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

/// Label pairs of a series drawn at scrape time.
type Labels = Vec<(&'static str, String)>;

/// Upper bounds (seconds) of the storage-commit latency buckets: from a
/// page-cache write (0.5 ms) to a stalled disk (5 s).
pub const COMMIT_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// The states a process is counted in when it ends (or goes in doubt).
pub const OUTCOMES: [ProcessState; 6] = [
    ProcessState::Done,
    ProcessState::RolledBack,
    ProcessState::Aborted,
    ProcessState::TimedOut,
    ProcessState::InDoubt,
    ProcessState::Failed,
];

/// The label of a storage-commit series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabel {
    store: &'static str,
}

/// The label of a process-outcome series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

fn commit_histogram() -> Histogram {
    Histogram::new(COMMIT_BUCKETS)
}

/// What the exchange tells of its commits (it is given this as its
/// [`CommitObserver`] when it opens): their latency by store, messages
/// delivered, processes ended by final state. Every series exists from the
/// start, zero or not.
pub struct Commits {
    latency: Family<StoreLabel, Histogram, fn() -> Histogram>,
    delivered: Counter,
    outcomes: Family<StateLabel, Counter>,
}

impl Default for Commits {
    fn default() -> Self {
        let commits = Commits {
            latency: Family::new_with_constructor(commit_histogram),
            delivered: Counter::default(),
            outcomes: Family::default(),
        };
        for store in [Durable::Sessions, Durable::Messages] {
            drop(commits.latency.get_or_create(&StoreLabel {
                store: store.as_str(),
            }));
        }
        for state in OUTCOMES {
            drop(commits.outcomes.get_or_create(&StateLabel {
                state: state_name(state),
            }));
        }
        commits
    }
}

impl CommitObserver for Commits {
    fn committed(&self, what: Durable, took: Duration) {
        self.latency
            .get_or_create(&StoreLabel {
                store: what.as_str(),
            })
            .observe(took.as_secs_f64());
    }

    fn delivered(&self, n: u64) {
        self.delivered.inc_by(n);
    }

    fn ended(&self, state: ProcessState) {
        self.outcomes
            .get_or_create(&StateLabel {
                state: state_name(state),
            })
            .inc();
    }
}

/// Counters of the HTTP layer.
pub struct Metrics {
    /// What the exchange tells of its commits.
    commits: Arc<Commits>,
    requests: Family<RequestLabels, Counter>,
    durations: Family<RequestLabels, Histogram, fn() -> Histogram>,
    /// Requests answered, all routes together (the dashboard's figure).
    answered: AtomicU64,
    /// Requests answered 503 because a store could not be reached.
    store_unavailable: Counter,
    /// (minute since the epoch, uploads in it), oldest first.
    uploads: Mutex<VecDeque<(u64, u64)>>,
    /// In cluster mode, the database's clock the node runs on: how far
    /// the node's own clock is off from it.
    database_clock: Option<estafeta_postgres::DatabaseClock>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(Arc::default(), None)
    }
}

impl Metrics {
    /// Counters of the HTTP layer beside `commits`, the exchange's
    /// observer, and in cluster mode the node's `database_clock`.
    pub fn new(
        commits: Arc<Commits>,
        database_clock: Option<estafeta_postgres::DatabaseClock>,
    ) -> Self {
        Metrics {
            database_clock,
            commits,
            requests: Family::default(),
            durations: Family::new_with_constructor(latency_histogram),
            answered: AtomicU64::new(0),
            store_unavailable: Counter::default(),
            uploads: Mutex::new(VecDeque::new()),
        }
    }

    /// Counts one request answered 503 because a store could not be
    /// reached ([`StoreUnavailable`](crate::error::StoreUnavailable)).
    pub fn record_store_unavailable(&self) {
        self.store_unavailable.inc();
    }

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
        let labels = RequestLabels {
            method: method.to_owned(),
            route: route.to_owned(),
            status,
        };
        self.requests.get_or_create(&labels).inc();
        self.durations
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        self.answered.fetch_add(1, Ordering::Relaxed);
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
        self.answered.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of these counters and of `snapshot`.
    pub fn render(&self, snapshot: &Snapshot) -> String {
        let mut out = Exposition::default();
        out.registry.register(
            "estafeta_build",
            "The running server's version (always 1)",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        out.gauge(
            "estafeta_ready",
            "Whether start-up recovery is done and the server is not stopping (1) or not (0)",
            u64::from(snapshot.ready),
        );
        out.registry.register(
            "estafeta_http_requests",
            "HTTP requests answered, by method, route template and status",
            self.requests.clone(),
        );
        out.registry.register(
            "estafeta_http_request_duration_seconds",
            "Time from a request's arrival to its answer, by method, route template and status",
            self.durations.clone(),
        );
        out.registry.register(
            "estafeta_store_unavailable",
            "Requests answered 503 storage_error because a store could not be reached (a database server down or handing over), not because storage failed",
            self.store_unavailable.clone(),
        );
        out.registry.register(
            "estafeta_storage_commit_duration_seconds",
            "Time of the exchange's durable commits: session saves (a save batch, or a cluster step's commit) and message store writes (an upload, a protocol step's moves)",
            self.commits.latency.clone(),
        );
        out.registry.register(
            "estafeta_messages_delivered",
            "Messages that arrived in their recipients' Messages folders (uploads, replies on commit, scheduled deliveries) since the start",
            self.commits.delivered.clone(),
        );
        out.registry.register(
            "estafeta_process_outcomes",
            "Processes ended since the start, by final state (IN_DOUBT: went in doubt)",
            self.commits.outcomes.clone(),
        );
        if let Some(clock) = &self.database_clock {
            out.gauge_f64(
                "estafeta_clock_offset_seconds",
                "How far this node's own clock is from the database server's, whose time the node runs on (positive: ahead); past a second the node logs a warning",
                clock.offset_seconds(),
            );
        }
        snapshot.render(&mut out);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut text, &out.registry);
        text
    }
}

fn minute_of(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

/// The registry of one scrape: the figures of the moment as constant
/// metrics, beside the HTTP layer's live ones.
#[derive(Default)]
struct Exposition {
    registry: Registry,
}

impl Exposition {
    fn gauge(&mut self, name: &str, help: &str, value: u64) {
        self.registry.register(name, help, ConstGauge::new(value));
    }

    fn gauge_f64(&mut self, name: &str, help: &str, value: f64) {
        self.registry.register(name, help, ConstGauge::new(value));
    }

    /// `name` without its `_total`, which the encoder adds.
    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.registry.register(name, help, ConstCounter::new(value));
    }

    /// Counters with labels; `name` without its `_total`, which the
    /// encoder adds.
    fn counters(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let family = Family::<Labels, Counter<u64, AtomicU64>>::default();
        for (labels, v) in series {
            family.get_or_create(&labels).inc_by(v);
        }
        self.registry.register(name, help, family);
    }

    fn gauges(&mut self, name: &str, help: &str, series: impl IntoIterator<Item = (Labels, u64)>) {
        let family = Family::<Labels, Gauge<u64, AtomicU64>>::default();
        for (labels, v) in series {
            family.get_or_create(&labels).set(v);
        }
        self.registry.register(name, help, family);
    }
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
    /// Mailboxes of each kind of [`KINDS`].
    pub mailboxes: BTreeMap<&'static str, u64>,
    /// Message files per (kind of mailbox, counted folder), summed over
    /// the mailboxes of that kind; every pair present, zero or not.
    pub messages: BTreeMap<(&'static str, &'static str), u64>,
    /// Messages waiting per database, for the first `metrics_per_database`
    /// databases by id (none by default).
    pub per_database: BTreeMap<String, u64>,
    /// Seconds the oldest message waiting in a database's `Messages` has
    /// waited since its creation (0 when none waits).
    pub oldest_waiting_secs: f64,
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
    /// The verdicts on the messages of committed processes, summed over
    /// every database.
    pub verdicts: Option<Verdicts>,
    /// Wrong tokens and the throttle's figures.
    pub auth: crate::throttle::Figures,
}

/// Milliseconds since the epoch of `t` (0 before it).
fn epoch_millis(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Seconds from `since_ms` to `now_ms` (0 when `since_ms` is later).
fn age_secs(now_ms: i64, since_ms: i64) -> f64 {
    now_ms.saturating_sub(since_ms).max(0) as f64 / 1000.0
}

/// The running server's parts a scrape reads its figures from.
pub struct Parts<'a> {
    /// Mailboxes, processes, sessions and scheduled messages.
    pub exchange: &'a Exchange,
    /// Alert deliveries and the send queues.
    pub notifier: &'a Notifier,
    /// Push notifications.
    pub pusher: &'a Pusher,
    /// Wrong tokens by client address.
    pub auth: &'a AuthThrottle,
    /// How many databases get a waiting-messages series of their own (the
    /// `metrics_per_database` setting).
    pub per_database: usize,
}

impl Snapshot {
    /// Gathers the figures of `parts` at `now` (the caller's clock). A part
    /// that cannot be read is left out rather than failing the scrape.
    pub async fn gather(parts: &Parts<'_>, now: SystemTime) -> Snapshot {
        let exchange = parts.exchange;
        let admin = Principal::Admin;
        let now_ms = epoch_millis(now);
        let mut s = Snapshot {
            ready: exchange.is_ready(),
            sessions: Some(exchange.session_stats()),
            auth: parts.auth.figures(tokio::time::Instant::now()),
            ..Snapshot::default()
        };
        for kind in KINDS {
            s.mailboxes.insert(kind, 0);
            for folder in COUNTED {
                s.messages.insert((kind, folder.as_str()), 0);
            }
        }
        if let Ok((dbs, devices)) = exchange.mailbox_ids(&admin) {
            s.mailboxes.insert(KINDS[0], dbs.len() as u64);
            s.mailboxes.insert(KINDS[1], devices.len() as u64);
            // The first databases by id, as many as the setting allows.
            let mut detailed = dbs;
            detailed.sort();
            detailed.truncate(parts.per_database);
            for db in detailed {
                if let Ok((n, _)) = exchange
                    .folder_page(&admin, &db, Folder::Messages, 0, 0)
                    .await
                {
                    s.per_database.insert(db.to_string(), n);
                }
            }
        }
        if let Ok(t) = exchange.tallies(&admin).await {
            for (kind, totals) in KINDS.into_iter().zip([t.databases, t.devices]) {
                for (folder, n) in
                    COUNTED
                        .into_iter()
                        .zip([totals.messages, totals.unknown, totals.error])
                {
                    s.messages.insert((kind, folder.as_str()), n);
                }
            }
            if let Some(oldest) = t.databases.oldest_message {
                s.oldest_waiting_secs = age_secs(now_ms, oldest.as_millis());
            }
        }
        for st in OPEN_STATES {
            s.processes.insert(state_name(st), 0);
        }
        if let Ok(t) = exchange.process_totals(&admin).await {
            for st in OPEN_STATES {
                s.processes.insert(state_name(st), t.count(st));
            }
            if let Some(since) = t.oldest_ready {
                s.oldest_ready_secs = age_secs(now_ms, since.as_millis());
            }
            s.verdicts = Some(t.verdicts);
        }
        s.backlogs = backlogs(parts).await;
        let n = parts.notifier;
        s.queues = n.outbound().figures();
        s.alerts_open = n.unacknowledged().await.unwrap_or(0);
        let dir = exchange.data_dir().to_path_buf();
        s.disk = tokio::task::spawn_blocking(move || disk_space(&dir))
            .await
            .ok()
            .flatten();
        s
    }

    fn render(&self, out: &mut Exposition) {
        out.gauges(
            "estafeta_mailboxes",
            "Mailboxes, by kind (database or device)",
            self.mailboxes
                .iter()
                .map(|(kind, n)| (vec![("kind", (*kind).to_owned())], *n)),
        );
        out.gauges(
            "estafeta_mailbox_messages",
            "Message files in Messages, Unknown and Error, summed over all mailboxes of a kind (database or device)",
            self.messages.iter().map(|((kind, folder), n)| {
                (
                    vec![("kind", (*kind).to_owned()), ("folder", (*folder).to_owned())],
                    *n,
                )
            }),
        );
        if !self.per_database.is_empty() {
            out.gauges(
                "estafeta_database_waiting_messages",
                "Messages waiting in a database's Messages folder, for the first databases by id (setting metrics_per_database)",
                self.per_database
                    .iter()
                    .map(|(db, n)| (vec![("db", db.clone())], *n)),
            );
        }
        out.gauge_f64(
            "estafeta_oldest_waiting_message_age_seconds",
            "Age (since its creation) of the oldest message waiting in any database's Messages folder (0 when none waits)",
            self.oldest_waiting_secs,
        );
        if let Some(v) = self.verdicts {
            out.counters(
                "estafeta_device_messages",
                "Devices' messages in committed processes, by verdict (summed over every database's counters)",
                [
                    ("processed", v.processed),
                    ("deadlocked", v.deadlocked),
                    ("incorrect", v.incorrect),
                ]
                .into_iter()
                .map(|(outcome, n)| (vec![("outcome", outcome.to_owned())], n)),
            );
        }
        out.gauges(
            "estafeta_processes",
            "Processes not ended, by state",
            self.processes
                .iter()
                .map(|(st, n)| (vec![("state", st.clone())], *n)),
        );
        out.gauge_f64(
            "estafeta_oldest_ready_to_commit_age_seconds",
            "How long the oldest READY_TO_COMMIT process has waited (0 when none)",
            self.oldest_ready_secs,
        );
        if let Some(st) = &self.sessions {
            out.gauge(
                "estafeta_sessions_in_memory",
                "Sessions held in memory",
                st.in_memory,
            );
            out.gauge(
                "estafeta_session_commands_queued",
                "Commands waiting in session queues",
                st.queued,
            );
            let counters = [
                (
                    "estafeta_session_loads",
                    "Sessions read from storage",
                    st.loads,
                ),
                (
                    "estafeta_session_saves",
                    "Session records written to storage",
                    st.saves,
                ),
                (
                    "estafeta_session_save_batches",
                    "Durable write transactions of the session engine",
                    st.save_batches,
                ),
                (
                    "estafeta_session_flushes",
                    "Idle sessions flushed out of memory",
                    st.flushes,
                ),
                (
                    "estafeta_session_expiries",
                    "Sessions that ended",
                    st.expiries,
                ),
                (
                    "estafeta_session_finalize_calls",
                    "Calls of the session finalize hook",
                    st.finalize_calls,
                ),
                (
                    "estafeta_session_storage_errors",
                    "Session storage operations that failed",
                    st.storage_errors,
                ),
                (
                    "estafeta_session_quarantined",
                    "Session records set aside as undecodable",
                    st.quarantined,
                ),
            ];
            for (name, help, v) in counters {
                out.counter(name, help, v);
            }
        }
        self.render_queues(out);
        self.render_backlogs(out);
        self.render_auth(out);
        out.gauge(
            "estafeta_alerts_open",
            "Alerts not acknowledged",
            self.alerts_open,
        );
        if let Some((free, total)) = self.disk {
            out.gauge(
                "estafeta_disk_free_bytes",
                "Bytes available to the server on the data folder's file system",
                free,
            );
            out.gauge(
                "estafeta_disk_size_bytes",
                "Size of the data folder's file system in bytes",
                total,
            );
        }
    }

    /// The send queues by queue and type, summed over their hosts. No
    /// host is named: `/metrics` answers anyone, and webhook hosts are the
    /// tenants' (the dashboard's Queues page names each, with its figures).
    fn render_queues(&self, out: &mut Exposition) {
        let mut hosts: BTreeMap<&str, (u64, u64)> = BTreeMap::from([(HTTP_QUEUE, (0, 0))]);
        let mut types: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
        for h in &self.queues {
            let (known, down) = hosts.entry(h.queue).or_default();
            *known += 1;
            *down += u64::from(h.down);
            for t in &h.types {
                let (queued, in_flight) = types.entry((h.queue, t.name)).or_default();
                *queued += t.queued as u64;
                *in_flight += t.in_flight as u64;
            }
        }
        let queue = |q: &str| vec![("queue", q.to_owned())];
        out.gauges(
            "estafeta_sendq_hosts",
            "Hosts a send queue sends to (webhooks, the SMS gateway, the SMTP relay), by queue",
            hosts.iter().map(|(q, (known, _))| (queue(q), *known)),
        );
        out.gauges(
            "estafeta_sendq_hosts_down",
            "Hosts of a send queue that its health probes marked down, by queue (the dashboard's Queues page names them)",
            hosts.iter().map(|(q, (_, down))| (queue(q), *down)),
        );
        let typed = |q: &str, t: &str| vec![("queue", q.to_owned()), ("type", t.to_owned())];
        out.gauges(
            "estafeta_sendq_queued",
            "Send queue entries waiting for their window or for their host, by queue and type, summed over the hosts",
            types.iter().map(|((q, t), (queued, _))| (typed(q, t), *queued)),
        );
        out.gauges(
            "estafeta_sendq_in_flight",
            "Send queue entries being sent or unanswered, by queue and type, summed over the hosts",
            types
                .iter()
                .map(|((q, t), (_, in_flight))| (typed(q, t), *in_flight)),
        );
    }

    fn render_auth(&self, out: &mut Exposition) {
        let t = self.auth.totals;
        out.counters(
            "estafeta_auth_failures",
            "Wrong tokens given to this server, by where: bearer (the API's Authorization header) or dashboard (its login form)",
            [
                (crate::throttle::Via::Bearer, t.bearer),
                (crate::throttle::Via::Dashboard, t.dashboard),
            ]
            .map(|(via, n)| (vec![("via", via.as_str().to_owned())], n)),
        );
        out.counter(
            "estafeta_auth_throttled",
            "Tries from a client address that had to wait after wrong tokens, answered 429 without their token being looked at",
            t.throttled,
        );
        out.gauge(
            "estafeta_auth_failing_addresses",
            "Client addresses (an IPv6 client by its /64) with wrong tokens in the last hour that this server knows of (in a cluster, those of every node)",
            self.auth.addresses,
        );
    }

    fn render_backlogs(&self, out: &mut Exposition) {
        let source = |s: &str| vec![("source", s.to_owned())];
        out.gauges(
            "estafeta_repeat_entries",
            "Entries held by a repeat scheduler (scheduled or retrying), by source",
            self.backlogs.iter().map(|(s, b)| (source(s), b.entries)),
        );
        out.gauges(
            "estafeta_repeat_backlog",
            "Repeat entries due now and not yet done, by source",
            self.backlogs.iter().map(|(s, b)| (source(s), b.due)),
        );
        out.gauges(
            "estafeta_repeat_lag_seconds",
            "Age of the oldest due repeat entry past its due time (0 when none is due), by source",
            self.backlogs.iter().map(|(s, b)| (source(s), b.lag_secs)),
        );
    }
}

/// The backlog of each repeat source the server runs: alert deliveries,
/// push notifications and scheduled messages. A source that cannot be
/// read is left out.
pub async fn backlogs(parts: &Parts<'_>) -> Vec<(&'static str, Backlog)> {
    let mut out = Vec::new();
    if let Ok(b) = parts.notifier.backlog().await {
        out.push((crate::notify::SOURCE, b));
    }
    if let Ok(b) = parts.pusher.backlog().await {
        out.push((push::SOURCE, b));
    }
    let ex = parts.exchange;
    if let (Ok(stats), Ok(first)) = (ex.scheduled_stats().await, ex.scheduled(1).await) {
        let now = u64::try_from(ex.now().as_millis() / 1000).unwrap_or(0);
        let counts = stats
            .sources
            .get(SCHEDULED_SOURCE)
            .cloned()
            .unwrap_or_default();
        let oldest = first.first().map(|e| e.due).filter(|d| *d <= now);
        out.push((
            SCHEDULED_SOURCE,
            Backlog::new(counts.entries, counts.due, oldest, now),
        ));
    }
    out
}

/// Free (for unprivileged users) and total bytes of the file system of `dir`.
pub fn disk_space(dir: &std::path::Path) -> Option<(u64, u64)> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some((
        st.f_bavail.saturating_mul(st.f_frsize),
        st.f_blocks.saturating_mul(st.f_frsize),
    ))
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
        let version = env!("CARGO_PKG_VERSION");
        assert!(text.contains(&format!("estafeta_build_info{{version=\"{version}\"}} 1\n")));
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
        assert_eq!(m.requests_total(), 3);
        assert!(text.contains("estafeta_store_unavailable_total 0\n"));
        m.record_store_unavailable();
        let text = m.render(&Snapshot::default());
        assert!(text.contains("estafeta_store_unavailable_total 1\n"));
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
