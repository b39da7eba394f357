//! `/metrics` parses as the Prometheus text exposition format (a strict
//! parser below) and its figures move with traffic.

use std::collections::{BTreeMap, HashSet};

use crate::common;
use crate::common::clock::ManualClock;
use crate::common::restartable::Server;
use crate::common::webhook::{self, Script};
use crate::common::{
    Store, Tenancy, TestServer, both_stores, committed_process, message, ready_process,
};
use estafeta_exchange::Timestamp;
use estafeta_exchange::wire::ResultStatus;
use estafeta_server::notify::NotifySettings;

/// One sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the text format strictly: every sample belongs to a family
/// declared by `# TYPE` before it (histograms through `_bucket`, `_sum`,
/// `_count`), names and labels are well formed, no series twice, counters
/// end in `_total`, histogram buckets are cumulative and end in `+Inf`
/// equal to `_count`.
fn parse(text: &str) -> Vec<Sample> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut seen = HashSet::new();
    let mut samples = Vec::new();
    assert!(text.ends_with('\n'), "the exposition ends with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(valid_name(name), "bad name in {line:?}");
            match kind {
                "HELP" => assert!(parts.next().is_some_and(|h| !h.is_empty()), "{line:?}"),
                "TYPE" => {
                    let t = parts.next().unwrap();
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&t),
                        "{line:?}"
                    );
                    assert!(
                        types.insert(name.to_owned(), t.to_owned()).is_none(),
                        "TYPE twice: {line:?}"
                    );
                    if t == "counter" {
                        assert!(name.ends_with("_total"), "counter {name} ends in _total");
                    }
                }
                _ => panic!("unknown comment {line:?}"),
            }
            continue;
        }
        assert!(!line.is_empty(), "no blank lines");
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => (
                name,
                labels(rest.strip_suffix('}').unwrap_or_else(|| panic!("{line:?}"))),
            ),
        };
        assert!(valid_name(name), "bad name in {line:?}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "no TYPE before {line:?}");
        assert!(seen.insert(series.to_owned()), "series twice: {line:?}");
        samples.push((name.to_owned(), labels, value));
    }
    check_histograms(&samples, &types);
    samples
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn labels(mut text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while !text.is_empty() {
        let (key, rest) = text
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad labels {text:?}"));
        assert!(
            valid_name(key) && !key.starts_with("__"),
            "bad label name {key:?}"
        );
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => panic!("bad escape {other:?} in {text:?}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {text:?}"),
            }
        };
        assert!(out.insert(key.to_owned(), value).is_none(), "label twice");
        text = &rest[end + 1..];
        text = text.strip_prefix(',').unwrap_or(text);
    }
    out
}

fn check_histograms(samples: &[Sample], types: &BTreeMap<String, String>) {
    for (family, _) in types.iter().filter(|(_, t)| *t == "histogram") {
        let mut series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for (name, labels, value) in samples
            .iter()
            .filter(|(n, _, _)| *n == format!("{family}_bucket"))
        {
            let _ = name;
            let mut key = labels.clone();
            let le = key.remove("le").expect("a bucket has le");
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            series.entry(key).or_default().push((le, *value));
        }
        for (key, buckets) in series {
            assert!(
                buckets
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
                "cumulative: {buckets:?}"
            );
            assert_eq!(buckets.last().unwrap().0, f64::INFINITY);
            let count = value(
                samples,
                &format!("{family}_count"),
                &key.iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect::<Vec<_>>(),
            );
            assert_eq!(buckets.last().unwrap().1, count);
        }
    }
}

/// The value of the one sample with this name and these labels, if the
/// scrape has it.
fn sample(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let found: Vec<_> = samples
        .iter()
        .filter(|(n, l, _)| n == name && *l == want)
        .collect();
    assert!(found.len() <= 1);
    found.first().map(|(_, _, v)| *v)
}

/// The value of the one sample with this name and these labels; a check
/// of a series the scrape does not have fails.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(samples, name, labels)
        .unwrap_or_else(|| panic!("no series {name} {labels:?} in the scrape"))
}

#[test]
fn the_parser_refuses_what_is_not_exposition_format() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\\\"\"} 3\n";
    assert_eq!(parse(ok)[0].1["x"], "1\"");
    for bad in [
        "a_total 1\n",
        "# TYPE a_total counter\na_total{x=\"1} 3\n",
        "# TYPE a counter\na 1\n",
        "# TYPE a_total counter\na_total one\n",
        "# TYPE a_total counter\na_total 1\na_total 2\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
    ] {
        assert!(
            std::panic::catch_unwind(|| parse(bad)).is_err(),
            "{bad:?} accepted"
        );
    }
}

both_stores!(metrics_parse_and_move_with_traffic);
async fn metrics_parse_and_move_with_traffic(store: Store) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    let before = parse(&server.admin.metrics().await.unwrap());
    let uploads = [
        ("method", "POST"),
        ("route", "/v1/messages"),
        ("status", "201"),
    ];
    assert_eq!(
        sample(&before, "estafeta_http_requests_total", &uploads),
        None,
        "no upload answered yet: no series"
    );
    assert_eq!(value(&before, "estafeta_ready", &[]), 1.0);
    assert!(value(&before, "estafeta_disk_free_bytes", &[]) > 0.0);

    for i in 0..3 {
        t.phone2
            .send(&message("db-b", &format!("{{\"n\":{i}}}"), None))
            .await
            .unwrap();
    }
    let (_pid, _) = ready_process(&t, ResultStatus::Processed).await;

    let after = parse(&server.admin.metrics().await.unwrap());
    assert_eq!(value(&after, "estafeta_http_requests_total", &uploads), 4.0);
    assert_eq!(
        value(
            &after,
            "estafeta_http_request_duration_seconds_count",
            &uploads
        ),
        4.0
    );
    assert!(
        value(
            &after,
            "estafeta_http_request_duration_seconds_sum",
            &uploads
        ) > 0.0
    );
    let folder = |kind, folder| {
        value(
            &after,
            "estafeta_mailbox_messages",
            &[("kind", kind), ("folder", folder)],
        )
    };
    assert_eq!(
        folder("database", "Messages"),
        4.0,
        "three in db-b, one in db-a's process, still in Messages"
    );
    assert!(
        after
            .iter()
            .all(|(n, l, _)| n != "estafeta_mailbox_messages"
                || !matches!(
                    l.get("folder").map(String::as_str),
                    Some("Prepared" | "Log")
                )),
        "Prepared and Log are not counted (counting Log would index every file it keeps)"
    );
    assert_eq!(folder("device", "Messages"), 0.0);
    assert_eq!(
        value(&after, "estafeta_mailboxes", &[("kind", "database")]),
        3.0
    );
    assert_eq!(
        value(&after, "estafeta_mailboxes", &[("kind", "device")]),
        3.0
    );
    assert!(value(&after, "estafeta_oldest_waiting_message_age_seconds", &[]) >= 0.0);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        value(&after, "estafeta_build_info", &[("version", version)]),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "estafeta_processes",
            &[("state", "READY_TO_COMMIT")]
        ),
        1.0
    );
    assert_eq!(
        value(&after, "estafeta_processes", &[("state", "IN_DOUBT")]),
        0.0
    );
    assert!(value(&after, "estafeta_oldest_ready_to_commit_age_seconds", &[]) >= 0.0);
    assert!(
        value(&after, "estafeta_session_saves_total", &[])
            > value(&before, "estafeta_session_saves_total", &[])
    );
    assert_eq!(value(&after, "estafeta_alerts_open", &[]), 0.0);
    let scrapes = [("method", "GET"), ("route", "/metrics"), ("status", "200")];
    assert_eq!(value(&after, "estafeta_http_requests_total", &scrapes), 1.0);
    server.stop().await.unwrap();
}

/// A push that is due and unanswered while the clock moves on: the send
/// queue shows it in flight at its host, and the push source shows a
/// backlog whose lag is how long it has been due; a message scheduled for
/// later is an entry but no backlog. Once answered, all of it is gone.
/// That scrape, with a send queue host, is the one the shipped Grafana
/// dashboard and alert rules are checked against ([`check_packaging`]).
/// Embedded only: a cluster node writes an arrival's push into the shared
/// queue without waking its scheduler, which finds it a second later by
/// the server's clock, and this test's clock does not move by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_queue_and_repeat_backlog_figures_move_with_pushes() {
    use estafeta_session::Clock;
    let data = tempfile::tempdir().unwrap();
    let clock = ManualClock::now();
    let notify = NotifySettings::log_only(data.path());
    let server = Server::start_notified(data.path(), &clock, notify).await;
    let t = Tenancy::provision(&server.admin).await;
    let (addr, mut hook) = webhook::start(Script {
        held: true,
        ..Script::default()
    })
    .await;
    let http = reqwest::Client::new();
    let answer = http
        .put(format!("{}/v1/admin/databases/db-a/webhook", server.base))
        .bearer_auth(common::ADMIN_TOKEN)
        .json(&serde_json::json!({"version": 1, "url": format!("http://{addr}/db")}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);

    let mut later = message("db-b", "{}", None);
    let due = clock.now().after(std::time::Duration::from_secs(7200));
    later.deliver_at = Some(Timestamp::from_millis(i64::try_from(due.0).unwrap()));
    t.phone1.send(&later).await.unwrap();
    t.phone1.send(&message("db-a", "{}", None)).await.unwrap();
    hook.posts.recv().await.unwrap();
    clock.advance(std::time::Duration::from_secs(3600));

    let push = [("queue", "http"), ("type", "push")];
    let held_text = server.admin.metrics().await.unwrap();
    check_packaging(&held_text);
    assert!(
        !held_text.contains(&addr.to_string()),
        "/metrics answers anyone: it names no webhook host"
    );
    let held = parse(&held_text);
    assert_eq!(value(&held, "estafeta_sendq_in_flight", &push), 1.0);
    assert_eq!(value(&held, "estafeta_sendq_queued", &push), 0.0);
    let http = [("queue", "http")];
    assert_eq!(value(&held, "estafeta_sendq_hosts", &http), 1.0);
    assert_eq!(value(&held, "estafeta_sendq_hosts_down", &http), 0.0);
    let source = |s| [("source", s)];
    assert_eq!(
        value(&held, "estafeta_repeat_entries", &source("push")),
        1.0
    );
    assert_eq!(
        value(&held, "estafeta_repeat_backlog", &source("push")),
        1.0
    );
    assert!(value(&held, "estafeta_repeat_lag_seconds", &source("push")) >= 3600.0);
    assert_eq!(
        value(&held, "estafeta_repeat_entries", &source("deliver_at")),
        1.0
    );
    assert_eq!(
        value(&held, "estafeta_repeat_backlog", &source("deliver_at")),
        0.0
    );
    assert_eq!(
        value(&held, "estafeta_repeat_lag_seconds", &source("deliver_at")),
        0.0
    );
    assert_eq!(
        value(&held, "estafeta_repeat_entries", &source("alerts")),
        0.0
    );

    hook.open();
    let settle = async {
        loop {
            let now = parse(&server.admin.metrics().await.unwrap());
            if value(&now, "estafeta_repeat_entries", &source("push")) == 0.0 {
                return now;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    let settled = tokio::time::timeout(std::time::Duration::from_secs(60), settle)
        .await
        .expect("the push did not settle");
    assert_eq!(value(&settled, "estafeta_sendq_in_flight", &push), 0.0);
    assert_eq!(
        value(&settled, "estafeta_repeat_backlog", &source("push")),
        0.0
    );
    assert_eq!(
        value(&settled, "estafeta_repeat_lag_seconds", &source("push")),
        0.0
    );
    server.stop().await;
}

/// The number of series in a scrape (sample lines).
fn series(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#')).count()
}

/// Devices made by [`scrape_does_not_grow_with_mailboxes`], and a tenth as
/// many databases: `ESTAFETA_METRICS_DEVICES` (default 2,000).
fn devices_to_make() -> usize {
    std::env::var("ESTAFETA_METRICS_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// The most series a scrape of a server without send queue hosts has,
/// however many mailboxes it holds.
const MOST_SERIES: usize = 400;

/// The most bytes of such a scrape.
const MOST_BYTES: usize = 64 * 1024;

/// Thousands of mailboxes, made through the exchange, add no series: the
/// scrape before and after has as many, under a fixed bound, and its
/// mailbox figures count them all. Prints the scrape's size and time.
/// Embedded only: the series do not depend on the store, and making the
/// mailboxes one by one over PostgreSQL takes over a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_does_not_grow_with_mailboxes() {
    use estafeta_exchange::tenancy::Principal;
    let server = TestServer::start().await;
    let t = Tenancy::provision(&server.admin).await;
    t.phone1.send(&message("db-a", "{}", None)).await.unwrap();
    server.admin.metrics().await.unwrap();
    let small = server.admin.metrics().await.unwrap();

    let devices = devices_to_make();
    let ex = &server.exchange;
    let admin = Principal::Admin;
    let made = std::time::Instant::now();
    ex.create_enterprise(&admin, common::id("big"))
        .await
        .unwrap();
    ex.create_subsystem(&admin, common::id("big"), common::id("app"))
        .await
        .unwrap();
    for i in 0..devices / 10 {
        ex.create_database(&admin, common::id("big"), common::id(&format!("bdb-{i}")))
            .await
            .unwrap();
    }
    for i in 0..devices {
        ex.create_device(
            &admin,
            common::id("big"),
            common::id(&format!("bdev-{i}")),
            common::id("app"),
        )
        .await
        .unwrap();
    }
    let made = made.elapsed();

    // The first scrape builds the new folders' indexes; the next is the
    // steady state.
    let started = std::time::Instant::now();
    let first = server.admin.metrics().await.unwrap();
    let first_took = started.elapsed();
    let started = std::time::Instant::now();
    let big = server.admin.metrics().await.unwrap();
    let took = started.elapsed();
    assert_eq!(series(&first), series(&big));
    let samples = parse(&big);
    assert_eq!(
        value(&samples, "estafeta_mailboxes", &[("kind", "device")]),
        (devices + 3) as f64
    );
    assert_eq!(
        value(&samples, "estafeta_mailboxes", &[("kind", "database")]),
        (devices / 10 + 3) as f64
    );
    assert_eq!(
        value(
            &samples,
            "estafeta_mailbox_messages",
            &[("kind", "database"), ("folder", "Messages")]
        ),
        1.0
    );
    assert_eq!(series(&big), series(&small), "{small}\n----\n{big}");
    assert!(series(&big) <= MOST_SERIES, "{} series", series(&big));
    assert!(big.len() <= MOST_BYTES, "{} bytes", big.len());
    println!(
        "{} devices and {} databases (made in {made:.1?}): scrape {} bytes, {} series, \
         {first_took:.1?} the first time, {took:.1?} the next",
        devices + 3,
        devices / 10 + 3,
        big.len(),
        series(&big),
    );
    server.stop().await.unwrap();
}

/// The metric names a PromQL expression uses: its identifiers that start
/// with `estafeta_`.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("estafeta_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    out
}

/// Every `expr` string anywhere in a JSON value.
fn json_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => json_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_exprs(v, out)),
        _ => {}
    }
}

/// The names a scrape declares: each family of a `# TYPE` line, and for a
/// histogram its `_bucket`, `_sum` and `_count`.
fn declared(text: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            out.insert(name.to_owned());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    out
}

/// The shipped Grafana dashboard is JSON and the Prometheus alert rules are
/// YAML of the rule-file shape (each rule named, with an expression, a
/// severity and a summary), and every metric either uses is one that
/// `scrape`, a real server's, declares.
fn check_packaging(scrape: &str) {
    use yaml_rust2::{Yaml, YamlLoader};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging");
    let known = declared(scrape);
    let grafana: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("grafana/estafeta.json")).unwrap())
            .expect("the Grafana dashboard is JSON");
    assert!(grafana["title"].is_string() && grafana["panels"].is_array());
    let mut exprs = Vec::new();
    json_exprs(&grafana, &mut exprs);
    assert!(exprs.len() >= 8, "the dashboard's queries: {exprs:?}");

    let rules = std::fs::read_to_string(root.join("prometheus/alerts.yml")).unwrap();
    let docs = YamlLoader::load_from_str(&rules).expect("the alert rules are YAML");
    let groups = docs[0]["groups"].as_vec().expect("a list of groups");
    let mut alerts = Vec::new();
    for group in groups {
        assert!(group["name"].as_str().is_some());
        for rule in group["rules"].as_vec().expect("a list of rules") {
            let name = rule["alert"].as_str().expect("each rule is an alert");
            let expr = rule["expr"].as_str().expect("each rule has an expression");
            assert!(
                ["critical", "warning"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{name}: severity"
            );
            assert!(
                rule["annotations"]["summary"].as_str().is_some(),
                "{name}: summary"
            );
            assert!(
                matches!(rule["for"], Yaml::String(_) | Yaml::BadValue),
                "{name}: for"
            );
            alerts.push(name.to_owned());
            exprs.push(expr.to_owned());
        }
    }
    for wanted in [
        "EstafetaNotReady",
        "EstafetaStorageErrors",
        "EstafetaDiskLow",
        "EstafetaProcessInDoubt",
        "EstafetaReadyToCommitTooLong",
        "EstafetaOutboundHostDown",
    ] {
        assert!(alerts.iter().any(|a| a == wanted), "no alert {wanted}");
    }
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{expr:?} uses no estafeta metric");
        for name in names {
            assert!(known.contains(&name), "{name} (in {expr:?}) is not served");
        }
    }
}

both_stores!(devices_verdicts_are_totals_in_metrics_and_per_device_in_admin_stats);
async fn devices_verdicts_are_totals_in_metrics_and_per_device_in_admin_stats(store: Store) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    committed_process(&t, ResultStatus::ProcessedIncorrect).await;
    committed_process(&t, ResultStatus::Processed).await;
    let samples = parse(&server.admin.metrics().await.unwrap());
    let total = |outcome| {
        value(
            &samples,
            "estafeta_device_messages_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(total("processed"), 1.0);
    assert_eq!(total("deadlocked"), 0.0);
    assert_eq!(total("incorrect"), 1.0);
    // One series per verdict, none per device.
    let series = samples
        .iter()
        .filter(|(n, _, _)| n == "estafeta_device_messages_total")
        .count();
    assert_eq!(series, 3);
    let stats = server.admin.stats().await.unwrap();
    let phone = stats
        .devices
        .iter()
        .find(|d| d.id.as_str() == "phone-1")
        .unwrap();
    assert_eq!(
        (phone.processed, phone.deadlocks, phone.incorrect),
        (1, 0, 1)
    );
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    process_outcomes_deliveries_and_commit_latency_are_counted
);
/// The exchange tells the metrics of its commits: a committed process
/// counts as DONE, an aborted one as ABORTED, the upload and the reply as
/// delivered, and the commits of sessions and messages land in the
/// latency histogram, on either store.
async fn process_outcomes_deliveries_and_commit_latency_are_counted(store: Store) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    let before = parse(&server.admin.metrics().await.unwrap());
    for state in [
        "DONE",
        "ROLLED_BACK",
        "ABORTED",
        "TIMED_OUT",
        "IN_DOUBT",
        "FAILED",
    ] {
        let n = value(
            &before,
            "estafeta_process_outcomes_total",
            &[("state", state)],
        );
        assert_eq!(n, 0.0, "{state}");
    }
    assert_eq!(
        value(&before, "estafeta_messages_delivered_total", &[]),
        0.0
    );

    committed_process(&t, ResultStatus::Processed).await;
    t.phone1
        .send(&message("db-a", r#"{"n":2}"#, None))
        .await
        .unwrap();
    let started = t.db_a.start(&common::start_request("db-a")).await.unwrap();
    t.db_a
        .abort(&started.process_id.unwrap(), "gave up")
        .await
        .unwrap();

    let after = parse(&server.admin.metrics().await.unwrap());
    let outcome = |state| {
        value(
            &after,
            "estafeta_process_outcomes_total",
            &[("state", state)],
        )
    };
    assert_eq!(outcome("DONE"), 1.0);
    assert_eq!(outcome("ABORTED"), 1.0);
    assert_eq!(outcome("ROLLED_BACK"), 0.0);
    // Two uploads and the reply.
    assert_eq!(value(&after, "estafeta_messages_delivered_total", &[]), 3.0);
    // On both stores: a cluster node's session saves commit in the
    // transactions of their steps, which are counted as they commit.
    for store in ["sessions", "messages"] {
        let commits = |samples: &[Sample]| {
            value(
                samples,
                "estafeta_storage_commit_duration_seconds_count",
                &[("store", store)],
            )
        };
        let (was, is) = (commits(&before), commits(&after));
        assert!(is > was, "{store}: {was} then {is}");
    }
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    per_database_series_only_when_asked_and_capped
);
/// Per-database series only behind `metrics_per_database`, capped by it:
/// none by default, at most N (the first databases by id) when set.
async fn per_database_series_only_when_asked_and_capped(store: Store) {
    let per_db = |text: &str| {
        parse(text)
            .into_iter()
            .filter(|(name, _, _)| name == "estafeta_database_waiting_messages")
            .map(|(_, labels, v)| (labels["db"].clone(), v))
            .collect::<BTreeMap<_, _>>()
    };
    let plain = TestServer::start_on(store).await;
    Tenancy::provision(&plain.admin).await;
    assert!(per_db(&plain.admin.metrics().await.unwrap()).is_empty());

    let capped = TestServer::start_with(store, |h| h.metrics_per_database = 2).await;
    let t = Tenancy::provision(&capped.admin).await;
    t.phone1.send(&message("db-a", "{}", None)).await.unwrap();
    t.phone1.send(&message("db-a", "{}", None)).await.unwrap();
    // Three databases (db-a, db-b, db-x): the first two by id.
    let series = per_db(&capped.admin.metrics().await.unwrap());
    let expected = BTreeMap::from([("db-a".to_owned(), 2.0), ("db-b".to_owned(), 0.0)]);
    assert_eq!(series, expected);
}
