//! Request ids and the log lines of a request, over real HTTP on a
//! loopback port-0 listener: the id a client sends (or one made for it)
//! comes back in `x-request-id` and is on every log line written while the
//! request runs, in text and in JSON, the form `ESTAFETA_LOG_FORMAT`
//! chooses.

use std::io::Write;
use std::sync::{Arc, LazyLock, Mutex};

use crate::common;
use crate::common::{ADMIN_TOKEN, Store, TestServer, both_stores, id, open_server_on};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use estafeta_server::app;
use estafeta_server::config::{LogFilter, LogFormat, Settings, Value};
use estafeta_server::logging::stderr_lines;
use estafeta_server::notify::NotifySettings;
use estafeta_server::trace::MAX_REQUEST_ID;
use serde_json::{Value as Json, json};
use tower::ServiceExt;
use tracing::Dispatch;
use tracing::subscriber::{DefaultGuard, NoSubscriber, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;

/// Log lines written into memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> MakeWriter<'w> for Captured {
    type Writer = Captured;

    fn make_writer(&'w self) -> Captured {
        self.clone()
    }
}

/// Makes `subscriber` this thread's default while the guard lives.
///
/// Tests of other modules run meanwhile on other threads of this process,
/// with no subscriber. While one dispatcher is the only one alive,
/// tracing-core takes the interest of a call site reached for the first
/// time from the default of the thread that reached it, and keeps it: a
/// line first written by another test (a request's `finished` at DEBUG,
/// reached only while a subscriber wants DEBUG) would stay off here too. A
/// second dispatcher, alive as long as the process, makes it ask every live
/// dispatcher instead.
fn capture(subscriber: impl Subscriber + Send + Sync + 'static) -> DefaultGuard {
    static SECOND: LazyLock<Dispatch> = LazyLock::new(|| Dispatch::new(NoSubscriber::default()));
    LazyLock::force(&SECOND);
    tracing::subscriber::set_default(subscriber)
}

/// Logging settings as `ESTAFETA_LOG` and `ESTAFETA_LOG_FORMAT` give them.
fn logging(filter: &str, format: &str) -> Settings {
    Settings {
        log: LogFilter::parse(filter).unwrap(),
        log_format: LogFormat::parse(format).unwrap(),
        ..Settings::default()
    }
}

/// The `x-request-id` of an answer.
fn request_id(response: &reqwest::Response) -> String {
    let mut ids = response.headers().get_all("x-request-id").iter();
    let first = ids.next().expect("no x-request-id in the answer");
    assert!(ids.next().is_none(), "more than one x-request-id");
    first.to_str().unwrap().to_owned()
}

/// Creates database `db` in enterprise `acme` over raw HTTP, with
/// `x-request-id: request` when given; the answer.
async fn create_database(
    server: &TestServer,
    db: &str,
    request: Option<&str>,
) -> reqwest::Response {
    let mut call = reqwest::Client::new()
        .post(server.url("/v1/admin/enterprises/acme/databases"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"version": 1, "id": db}));
    if let Some(request) = request {
        call = call.header("x-request-id", request);
    }
    let response = call.send().await.unwrap();
    assert_eq!(response.status(), 201, "{db}");
    response
}

both_stores!(the_clients_request_id_comes_back_and_one_is_made_when_absent_or_unfit);
async fn the_clients_request_id_comes_back_and_one_is_made_when_absent_or_unfit(store: Store) {
    let server = TestServer::start_on(store).await;
    server.admin.create_enterprise(&id("acme")).await.unwrap();

    let given = create_database(&server, "db-a", Some("req-0001.client:a")).await;
    assert_eq!(request_id(&given), "req-0001.client:a");

    let mut made = Vec::new();
    let too_long = "x".repeat(MAX_REQUEST_ID + 1);
    for (db, request) in [
        ("db-b", None),
        ("db-c", Some(too_long.as_str())),
        ("db-d", Some("two words")),
    ] {
        let made_id = request_id(&create_database(&server, db, request).await);
        assert_eq!(made_id.len(), 36, "not a UUID: {made_id}");
        assert_eq!(&made_id[14..15], "7", "not a time-ordered UUID: {made_id}");
        assert_ne!(Some(made_id.as_str()), request);
        made.push(made_id);
    }
    made.sort();
    made.dedup();
    assert_eq!(made.len(), 3, "each request its own id: {made:?}");

    // Answers the router makes itself (no route, a probe) carry one too.
    let http = reqwest::Client::new();
    for path in ["/no/such/route", "/healthz", "/readyz"] {
        let response = http
            .get(server.url(path))
            .header("x-request-id", "probe-1")
            .send()
            .await
            .unwrap();
        assert_eq!(request_id(&response), "probe-1", "{path}");
    }
    server.stop().await.unwrap();
}

/// Runs one provisioning request with `x-request-id: request` under a
/// subscriber writing `format` lines into memory, on a server over
/// `store`; the lines.
async fn lines_of_one_request(store: Store, format: &str, request: &str) -> Vec<String> {
    let captured = Captured::default();
    // The test's runtime has one thread, which runs the server's tasks too:
    // a subscriber set for this thread sees every line of the request.
    let settings = logging("info,estafeta_server::trace=debug", format);
    let subscriber =
        tracing_subscriber::registry().with(stderr_lines(&settings, captured.clone(), false));
    let _guard = capture(subscriber);
    let server = TestServer::start_on(store).await;
    server.admin.create_enterprise(&id("acme")).await.unwrap();
    create_database(&server, "db-a", Some(request)).await;
    server.stop().await.unwrap();
    captured.lines()
}

both_stores!(every_text_line_of_a_request_carries_its_id);
async fn every_text_line_of_a_request_carries_its_id(store: Store) {
    let lines = lines_of_one_request(store, "text", "req-text-1").await;
    let of_request: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("request_id=req-text-1"))
        .collect();
    // The exchange's own line, written inside the handler, and the
    // request's last line.
    assert!(
        of_request.iter().any(|l| l.contains("database created")),
        "{lines:#?}"
    );
    let finished = of_request
        .iter()
        .find(|l| l.contains("finished"))
        .unwrap_or_else(|| panic!("no finished line: {lines:#?}"));
    assert!(finished.contains("status=201"), "{finished}");
    assert!(finished.contains("method=POST"), "{finished}");
    assert!(
        finished.contains("path=/v1/admin/enterprises/acme/databases"),
        "{finished}"
    );
}

/// A `POST` of `body` to `path` with `token` and `x-request-id: request`;
/// the answer's JSON.
async fn post(server: &TestServer, path: &str, token: &str, request: &str, body: &Json) -> Json {
    let response = reqwest::Client::new()
        .post(server.url(path))
        .bearer_auth(token)
        .header("x-request-id", request)
        .json(body)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    response.json().await.unwrap()
}

both_stores!(the_protocols_events_carry_the_request_they_happened_in);
async fn the_protocols_events_carry_the_request_they_happened_in(store: Store) {
    let captured = Captured::default();
    let settings = logging("info", "text");
    let subscriber =
        tracing_subscriber::registry().with(stderr_lines(&settings, captured.clone(), false));
    let _guard = capture(subscriber);
    let server = TestServer::start_on(store).await;
    let (db, phone) = common::provision_one(&server.admin).await;
    let sent = post(
        &server,
        "/v1/messages",
        &phone,
        "req-upload",
        &json!({"version": 1, "to": "db-a", "body": {"order": 1}}),
    )
    .await;
    let started = post(
        &server,
        "/v1/processes",
        &db,
        "req-start",
        &json!({"version": 1, "db_id": "db-a"}),
    )
    .await;
    let pid = started["process_id"].as_str().unwrap().to_owned();
    let prepare = json!({
        "version": 1,
        "results": [{"message_id": sent["id"], "status": "PROCESSED"}],
        "replies": [{"to": "phone-1", "body": {"ok": true}}],
    });
    let path = format!("/v1/processes/{pid}/prepare");
    post(&server, &path, &db, "req-prepare", &prepare).await;
    let path = format!("/v1/processes/{pid}/commit");
    post(&server, &path, &db, "req-commit", &json!({"version": 1})).await;
    server.stop().await.unwrap();

    let lines = captured.lines();
    for (request, event) in [
        ("req-upload", "message received"),
        ("req-start", "process started"),
        ("req-prepare", "process READY_TO_COMMIT"),
        ("req-commit", "process ended"),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(event) && l.contains(&format!("request_id={request}"))),
            "no {event:?} line with {request}: {lines:#?}"
        );
    }
}

both_stores!(json_lines_parse_and_carry_the_request_id);
async fn json_lines_parse_and_carry_the_request_id(store: Store) {
    let lines = lines_of_one_request(store, "json", "req-json-1").await;
    assert!(!lines.is_empty());
    let records: Vec<Json> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for record in &records {
        for field in ["timestamp", "level", "target", "message"] {
            assert!(record[field].is_string(), "no {field}: {record}");
        }
    }
    let of_request: Vec<_> = records
        .iter()
        .filter(|r| r["span"]["request_id"] == "req-json-1")
        .collect();
    let created = of_request
        .iter()
        .find(|r| r["message"] == "database created")
        .unwrap_or_else(|| panic!("no creation line: {records:#?}"));
    assert_eq!(created["db"], "db-a");
    let finished = of_request
        .iter()
        .find(|r| r["message"] == "finished")
        .unwrap_or_else(|| panic!("no finished line: {records:#?}"));
    assert_eq!(finished["status"], 201);
    assert!(finished["latency_s"].as_f64().is_some_and(|s| s >= 0.0));
    assert_eq!(finished["span"]["name"], "request");
    assert_eq!(finished["span"]["method"], "POST");
    assert_eq!(finished["level"], "DEBUG");
}

both_stores!(readiness_503s_during_start_up_are_logged_at_debug_only);
async fn readiness_503s_during_start_up_are_logged_at_debug_only(store: Store) {
    let captured = Captured::default();
    let settings = logging("info,estafeta_server::trace=debug", "json");
    let subscriber =
        tracing_subscriber::registry().with(stderr_lines(&settings, captured.clone(), false));
    let _guard = capture(subscriber);
    let data = tempfile::tempdir().unwrap();
    let store = store.setting();
    let notify = NotifySettings::log_only(data.path());
    let http = estafeta_server::HttpSettings::default();
    // Recovery not done yet: `/readyz` and every protocol call answer 503.
    let server = open_server_on(data.path(), store.as_deref(), http, |_| {}, notify).await;
    let router = app(server.state().clone());
    for request in ["probe-1", "probe-2", "probe-3"] {
        let response = router
            .clone()
            .oneshot(
                Request::get("/readyz")
                    .header("x-request-id", request)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let call = Request::post("/v1/processes")
        .header("x-request-id", "call-1")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"version":1,"db_id":"db-a"}"#))
        .unwrap();
    let response = router.oneshot(call).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);

    let records: Vec<Json> = captured
        .lines()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let level_of = |request: &str| -> Vec<String> {
        records
            .iter()
            .filter(|r| r["span"]["request_id"] == request && r["message"] == "finished")
            .map(|r| r["level"].as_str().unwrap().to_owned())
            .collect()
    };
    for probe in ["probe-1", "probe-2", "probe-3"] {
        assert_eq!(level_of(probe), ["DEBUG"], "{records:#?}");
    }
    // A refused call is worth a line at the default filter, not a warning.
    assert_eq!(level_of("call-1"), ["INFO"], "{records:#?}");
}
