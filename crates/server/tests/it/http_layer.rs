//! The HTTP layer itself: authentication, the error JSON for every kind of
//! bad request, size limit, request timeout, readiness, the OpenAPI
//! document and the metrics. Through real HTTP on a port-0 listener.

use std::time::Duration;

use crate::common::{
    ADMIN_TOKEN, Store, TestServer, both_stores, id, listed, open_server_on, provision_one,
};
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use estafeta_exchange::mailbox::Folder;
use estafeta_server::notify::NotifySettings;
use estafeta_server::{HttpSettings, app};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

/// Status and error JSON of a raw request.
async fn raw(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let resp = req.send().await.unwrap();
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}"));
    (status, json)
}

/// Sends `req` and asserts that it is refused with `status` and the error
/// JSON of `code`.
async fn assert_refused(req: reqwest::RequestBuilder, status: StatusCode, code: &str) {
    let (client, req) = req.build_split();
    let req = req.unwrap();
    let what = format!("{} {}", req.method(), req.url());
    let (got, json) = raw(reqwest::RequestBuilder::from_parts(client, req)).await;
    assert_eq!(got, status, "{what}: {json}");
    assert_error(&json, code);
}

/// Asserts that `json` is the error JSON of `code`, with a message.
fn assert_error(json: &Value, code: &str) {
    assert_eq!(json["version"], 1, "{json}");
    assert_eq!(json["error"]["code"], code, "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{json}"
    );
}

/// Every route of the HTTP API that needs a token, with a well-formed body.
fn authenticated_routes() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "POST",
            "/v1/admin/enterprises",
            json!({"version":1,"id":"acme"}),
        ),
        (
            "POST",
            "/v1/admin/enterprises/acme/subsystems",
            json!({"version":1,"id":"sales"}),
        ),
        (
            "POST",
            "/v1/admin/enterprises/acme/databases",
            json!({"version":1,"id":"db-a"}),
        ),
        (
            "POST",
            "/v1/admin/enterprises/acme/devices",
            json!({"version":1,"id":"p","subsystem":"sales"}),
        ),
        ("GET", "/v1/admin/processes", Value::Null),
        ("GET", "/v1/admin/stats", Value::Null),
        ("GET", "/v1/admin/databases/db-a/folders/Log", Value::Null),
        (
            "POST",
            "/v1/messages",
            json!({"version":1,"to":"db-a","body":{}}),
        ),
        ("GET", "/v1/inbox?limit=3", Value::Null),
        ("POST", "/v1/inbox/ack", json!({"version":1,"ids":[]})),
        ("POST", "/v1/processes", json!({"version":1,"db_id":"db-a"})),
        (
            "GET",
            "/v1/processes/01JD6Y0000000000000000000A",
            Value::Null,
        ),
        (
            "POST",
            "/v1/processes/01JD6Y0000000000000000000A/accept",
            json!({"version":1,"message_ids":[]}),
        ),
        (
            "POST",
            "/v1/processes/01JD6Y0000000000000000000A/prepare",
            json!({"version":1,"results":[],"replies":[]}),
        ),
        (
            "POST",
            "/v1/processes/01JD6Y0000000000000000000A/commit",
            json!({"version":1}),
        ),
        (
            "POST",
            "/v1/processes/01JD6Y0000000000000000000A/rollback",
            json!({"version":1,"error_text":"x"}),
        ),
        (
            "POST",
            "/v1/processes/01JD6Y0000000000000000000A/abort",
            json!({"version":1,"message":"x"}),
        ),
    ]
}

both_stores!(every_call_needs_a_known_bearer_token);
async fn every_call_needs_a_known_bearer_token(store: Store) {
    let server = TestServer::start_on(store).await;
    let http = reqwest::Client::new();
    for (method, path, body) in authenticated_routes() {
        for auth in [
            None,
            Some("Bearer not-a-token"),
            Some("Basic YWRtaW4="),
            Some("Bearer "),
        ] {
            let mut req = http.request(method.parse().unwrap(), server.url(path));
            if let Some(auth) = auth {
                req = req.header("authorization", auth);
            }
            if !body.is_null() {
                req = req.json(&body);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 401, "{method} {path} {auth:?}");
            assert_eq!(resp.headers()["www-authenticate"], "Bearer");
            let json: Value = resp.json().await.unwrap();
            assert_error(&json, "unauthorized");
            // The admin token from the same address starts it afresh, so
            // that the throttle of wrong tokens lets the next one through.
            server.admin.stats().await.unwrap();
        }
    }
    // Nothing was created by any of those calls.
    assert!(server.admin.stats().await.unwrap().databases.is_empty());
    server.stop().await.unwrap();
}

both_stores!(malformed_bodies_are_400_with_the_error_json_and_change_nothing);
async fn malformed_bodies_are_400_with_the_error_json_and_change_nothing(store: Store) {
    let server = TestServer::start_on(store).await;
    let http = reqwest::Client::new();
    let post = |body: &'static str, content_type: Option<&'static str>| {
        let mut req = http
            .post(server.url("/v1/admin/enterprises"))
            .bearer_auth(ADMIN_TOKEN)
            .body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        req
    };
    let json_ct = Some("application/json");
    let cases = [
        (post(r#"{"version":1,"id":"acme""#, json_ct), "bad_json"),
        (post("not json", json_ct), "bad_json"),
        (post(r#"{"version":2,"id":"acme"}"#, json_ct), "bad_request"),
        (post(r#"{"id":"acme"}"#, json_ct), "bad_request"),
        (post(r#"{"version":1}"#, json_ct), "bad_request"),
        (post(r#"{"version":1,"id":17}"#, json_ct), "bad_request"),
        (
            post(r#"{"version":1,"id":"../etc"}"#, json_ct),
            "bad_request",
        ),
        (
            post(r#"{"version":1,"id":"acme"}"#, Some("text/plain")),
            "bad_content_type",
        ),
        (
            post(r#"{"version":1,"id":"acme"}"#, None),
            "bad_content_type",
        ),
    ];
    for (req, code) in cases {
        assert_refused(req, StatusCode::BAD_REQUEST, code).await;
    }
    // Unknown fields are ignored.
    let (status, _) = raw(post(r#"{"version":1,"id":"acme","colour":"red"}"#, json_ct)).await;
    assert_eq!(status, StatusCode::CREATED);
    // Only that one enterprise exists: creating it again is 409.
    let again = post(r#"{"version":1,"id":"acme"}"#, json_ct);
    assert_refused(again, StatusCode::CONFLICT, "already_exists").await;
    server.stop().await.unwrap();
}

both_stores!(bad_ids_and_folders_in_paths_are_400);
async fn bad_ids_and_folders_in_paths_are_400(store: Store) {
    let server = TestServer::start_on(store).await;
    let http = reqwest::Client::new();
    let sub = json!({"version":1,"id":"sales"});
    for ent in ["a_b", "-a", "a%2Fb", ".estafeta", "a%20b", &"a".repeat(65)] {
        let req = http
            .post(server.url(&format!("/v1/admin/enterprises/{ent}/subsystems")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&sub);
        assert_refused(req, StatusCode::BAD_REQUEST, "bad_id").await;
    }
    for (path, code) in [
        ("/v1/admin/databases/a_b/folders/Log", "bad_id"),
        ("/v1/admin/databases/db-a/folders/Bogus", "bad_folder"),
        ("/v1/admin/databases/db-a/folders/log", "bad_folder"),
        ("/v1/inbox?limit=many", "bad_query"),
    ] {
        let req = http.get(server.url(path)).bearer_auth(ADMIN_TOKEN);
        assert_refused(req, StatusCode::BAD_REQUEST, code).await;
    }
    server.stop().await.unwrap();
}

both_stores!(unknown_routes_and_methods_answer_the_error_json);
async fn unknown_routes_and_methods_answer_the_error_json(store: Store) {
    let server = TestServer::start_on(store).await;
    let http = reqwest::Client::new();
    let req = http.get(server.url("/v1/nothing"));
    assert_refused(req, StatusCode::NOT_FOUND, "not_found").await;
    let req = http
        .delete(server.url("/v1/messages"))
        .bearer_auth(ADMIN_TOKEN);
    assert_refused(req, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;
    server.stop().await.unwrap();
}

both_stores!(a_body_over_the_limit_is_413_and_nothing_is_stored);
async fn a_body_over_the_limit_is_413_and_nothing_is_stored(store: Store) {
    let server = TestServer::start_with(store, |h| h.max_body_bytes = 64 * 1024).await;
    let (_, phone) = provision_one(&server.admin).await;
    let big = format!(
        r#"{{"version":1,"to":"db-a","body":"{}"}}"#,
        "x".repeat(200 * 1024)
    );
    let http = reqwest::Client::new();
    let send = |body: String| {
        http.post(server.url("/v1/messages"))
            .bearer_auth(&phone)
            .header("content-type", "application/json")
            .body(body)
    };
    assert_refused(send(big), StatusCode::PAYLOAD_TOO_LARGE, "body_too_large").await;
    // Just under the limit is fine.
    let fits = format!(
        r#"{{"version":1,"to":"db-a","body":"{}"}}"#,
        "x".repeat(60 * 1024)
    );
    let (status, _) = raw(send(fits)).await;
    assert_eq!(status, StatusCode::CREATED);
    let queue = listed(&server.admin, "db-a", Folder::Messages).await;
    assert_eq!(queue.len(), 1);
    server.stop().await.unwrap();
}

/// A server on `store` that gives a request 200 ms, and a connection to it.
async fn impatient_server(store: Store) -> (TestServer, tokio::net::TcpStream) {
    let server = TestServer::start_with(store, |h| {
        h.request_timeout = Duration::from_millis(200);
    })
    .await;
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    (server, tcp)
}

both_stores!(a_body_that_does_not_arrive_in_time_is_408);
async fn a_body_that_does_not_arrive_in_time_is_408(store: Store) {
    let (server, mut tcp) = impatient_server(store).await;
    let head = format!(
        "POST /v1/admin/enterprises HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"version\":1,",
        server.addr
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    // The rest never comes; the server answers on its own.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tcp.read(&mut buf).await.unwrap();
        answer.extend_from_slice(&buf[..n]);
        if n == 0 || answer.windows(4).any(|w| w == b"}}\r\n") || answer.ends_with(b"}}") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains(r#""code":"request_timeout""#), "{text}");
    server.stop().await.unwrap();
}

both_stores!(readyz_is_503_until_recovery_is_done);
async fn readyz_is_503_until_recovery_is_done(store: Store) {
    let data = tempfile::tempdir().unwrap();
    let store = store.setting();
    let notify = NotifySettings::log_only(data.path());
    let http = HttpSettings::default();
    let server = open_server_on(data.path(), store.as_deref(), http, |_| {}, notify).await;
    let exchange = server.exchange().clone();
    let router = app(server.state().clone());
    let get = |path: &'static str| Request::get(path).body(Body::empty()).unwrap();

    assert_eq!(
        router
            .clone()
            .oneshot(get("/healthz"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        router
            .clone()
            .oneshot(get("/readyz"))
            .await
            .unwrap()
            .status(),
        503
    );
    // Provisioning works before recovery; protocol calls answer 503 with
    // Retry-After until it has run.
    let admin = estafeta_exchange::tenancy::Principal::Admin;
    exchange
        .create_enterprise(&admin, id("acme"))
        .await
        .unwrap();
    let token = exchange
        .create_database(&admin, id("acme"), id("db-a"))
        .await
        .unwrap();
    let req = Request::post("/v1/processes")
        .header("authorization", format!("Bearer {}", token.expose()))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"version":1,"db_id":"db-a"}"#))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().contains_key("retry-after"));
    let body = to_bytes(resp.into_body(), 4096).await.unwrap();
    assert_error(&serde_json::from_slice(&body).unwrap(), "not_ready");

    exchange.recover().await.unwrap();
    assert_eq!(
        router
            .clone()
            .oneshot(get("/readyz"))
            .await
            .unwrap()
            .status(),
        200
    );
    exchange.begin_stopping();
    assert_eq!(router.oneshot(get("/readyz")).await.unwrap().status(), 503);
    exchange.shutdown().await.unwrap();
}

/// Every path of the HTTP API, as the OpenAPI document writes it.
const API_PATHS: [(&str, &str); 26] = [
    ("/healthz", "get"),
    ("/readyz", "get"),
    ("/metrics", "get"),
    ("/v1/openapi.json", "get"),
    ("/v1/admin/enterprises", "post"),
    ("/v1/admin/enterprises/{ent}/subsystems", "post"),
    ("/v1/admin/enterprises/{ent}/databases", "post"),
    ("/v1/admin/enterprises/{ent}/devices", "post"),
    ("/v1/admin/processes", "get"),
    ("/v1/admin/stats", "get"),
    ("/v1/admin/alerts", "get"),
    ("/v1/admin/databases/{db}/folders/{folder}", "get"),
    ("/v1/admin/databases/{db}/webhook", "put"),
    ("/v1/admin/databases/{db}/webhook", "delete"),
    ("/v1/admin/devices/{dev}/webhook", "put"),
    ("/v1/admin/devices/{dev}/webhook", "delete"),
    ("/v1/messages", "post"),
    ("/v1/inbox", "get"),
    ("/v1/inbox/ack", "post"),
    ("/v1/processes", "post"),
    ("/v1/processes/{pid}", "get"),
    ("/v1/processes/{pid}/accept", "post"),
    ("/v1/processes/{pid}/prepare", "post"),
    ("/v1/processes/{pid}/commit", "post"),
    ("/v1/processes/{pid}/rollback", "post"),
    ("/v1/processes/{pid}/abort", "post"),
];

both_stores!(openapi_json_describes_every_path_with_bearer_security);
async fn openapi_json_describes_every_path_with_bearer_security(store: Store) {
    let server = TestServer::start_on(store).await;
    let doc = server.client("").openapi().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in API_PATHS {
        let op = &paths.get(path).unwrap_or_else(|| panic!("{path} missing"))[method];
        assert!(op.is_object(), "{method} {path}");
        let open = ["/healthz", "/readyz", "/metrics", "/v1/openapi.json"].contains(&path);
        assert_eq!(op["security"].is_null(), open, "{path}");
        if method == "post" || method == "put" {
            let schema = &op["requestBody"]["content"]["application/json"]["schema"]["$ref"];
            assert!(schema.as_str().is_some(), "{path}: {op}");
        }
    }
    // Beyond the contract's paths, only admin tools (which need the admin
    // token) are described.
    let contract: std::collections::BTreeSet<_> = API_PATHS.iter().map(|(p, _)| *p).collect();
    for (path, item) in paths {
        if !contract.contains(path.as_str()) {
            assert!(path.starts_with("/v1/admin/"), "{path}");
            for op in item.as_object().unwrap().values() {
                assert!(!op["security"].is_null(), "{path}");
            }
        }
    }
    // Every referenced schema is there.
    let text = doc.to_string();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for part in text.split("#/components/schemas/").skip(1) {
        let name = part.split('"').next().unwrap();
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    server.stop().await.unwrap();
}

both_stores!(metrics_count_requests_by_route_and_status);
async fn metrics_count_requests_by_route_and_status(store: Store) {
    let server = TestServer::start_on(store).await;
    let anonymous = server.client("");
    anonymous.healthz().await.unwrap();
    assert!(anonymous.processes().await.is_err());
    assert!(anonymous.processes().await.is_err());
    let text = anonymous.metrics().await.unwrap();
    assert!(text.contains("estafeta_ready 1\n"), "{text}");
    assert!(
        text.contains(r#"estafeta_http_requests_total{method="GET",route="/v1/admin/processes",status="401"} 2"#),
        "{text}"
    );
    assert!(text.contains(r#"route="/healthz",status="200"}"#), "{text}");
    server.stop().await.unwrap();
}

both_stores!(a_request_head_that_never_ends_is_dropped_and_does_not_hold_shutdown);
async fn a_request_head_that_never_ends_is_dropped_and_does_not_hold_shutdown(store: Store) {
    let (server, mut tcp) = impatient_server(store).await;
    tcp.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    // The server closes the connection by itself once the head is late.
    let mut rest = Vec::new();
    let _ = tcp.read_to_end(&mut rest).await;
    let text = String::from_utf8_lossy(&rest);
    assert!(
        rest.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
    // A second stalled client does not keep the server from stopping.
    let mut stalled = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stalled
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    // A generous guard against a hang, not a timing assertion.
    tokio::time::timeout(Duration::from_secs(60), server.stop())
        .await
        .expect("shutdown waited for a stalled client")
        .unwrap();
}
