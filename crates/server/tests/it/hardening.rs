//! Bad and hostile input from anonymous clients: body limits and read
//! timeouts, values that could grow what the server keeps, login
//! throttling, deeply nested JSON; what error pages and `/metrics` show of
//! the server's own failures. Through real HTTP on a port-0 listener,
//! mostly as raw bytes on a socket, since the point is what the server does
//! before a request is complete.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common;
use crate::common::raw::{Answer, head, send_raw};
use crate::common::{
    ADMIN_TOKEN, Binary, PATIENCE, Store, Tenancy, TestServer, both_stores, committed_process, id,
    provision_one, wait_ready,
};
use estafeta_client::Client;
use estafeta_exchange::DataLayout;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::ResultStatus;
use estafeta_postgres::testing::Postgres;
use estafeta_server::body_limit::FORM_LIMIT;
use estafeta_server::config::MIN_ADMIN_TOKEN_LEN;
use estafeta_server::dashboard::page::SERVER_FAILED;
use estafeta_server::extract::MAX_JSON_DEPTH;
use estafeta_server::throttle::{FIRST_DELAY, FREE_FAILURES, MAX_ADDRESSES};
use serde_json::Value;

/// The head of a form POST to the login page, its body framed by
/// `framing` (a `content-length` or `transfer-encoding` header).
fn login_form_head(framing: &str) -> String {
    let form = "content-type: application/x-www-form-urlencoded".to_owned();
    head("POST", "/admin/login", &[form, framing.to_owned()])
}

/// Sends `request` to `server` as raw bytes and asserts that it answers
/// `status` with the error JSON of `code`; the answer.
async fn assert_raw_error(server: &TestServer, request: &[u8], status: u16, code: &str) -> Answer {
    let answer = send_raw(server.addr, request).await;
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.error_code(), code);
    answer
}

both_stores!(a_form_declared_over_its_limit_is_413_before_its_body_is_sent);
async fn a_form_declared_over_its_limit_is_413_before_its_body_is_sent(store: Store) {
    let server = TestServer::start_on(store).await;
    // Well under the API's 32 MB, well over a form's limit. Only the head
    // goes out: an answer can only come from the declared length.
    let request = login_form_head("content-length: 1000000");
    let answer = assert_raw_error(&server, request.as_bytes(), 413, "body_too_large").await;
    assert_eq!(answer.header("content-type"), Some("application/json"));
    server.stop().await.unwrap();
}

both_stores!(an_api_body_declared_over_the_limit_is_413_before_it_is_sent);
async fn an_api_body_declared_over_the_limit_is_413_before_it_is_sent(store: Store) {
    let server = TestServer::start_with(store, |h| h.max_body_bytes = 64 * 1024).await;
    let request = head(
        "POST",
        "/v1/admin/enterprises",
        &[
            format!("authorization: Bearer {ADMIN_TOKEN}"),
            "content-type: application/json".to_owned(),
            "content-length: 1000000".to_owned(),
        ],
    );
    assert_raw_error(&server, request.as_bytes(), 413, "body_too_large").await;
    server.stop().await.unwrap();
}

both_stores!(a_chunked_form_over_its_limit_is_413);
async fn a_chunked_form_over_its_limit_is_413(store: Store) {
    let server = TestServer::start_on(store).await;
    let mut request = login_form_head("transfer-encoding: chunked").into_bytes();
    // No declared length: the limit bites while the body is read.
    let chunk = "a".repeat(1024);
    for _ in 0..(FORM_LIMIT / 1024 + 2) {
        request.extend_from_slice(format!("400\r\n{chunk}\r\n").as_bytes());
    }
    request.extend_from_slice(b"0\r\n\r\n");
    assert_raw_error(&server, &request, 413, "body_too_large").await;
    server.stop().await.unwrap();
}

both_stores!(a_form_body_that_does_not_arrive_in_time_is_408);
async fn a_form_body_that_does_not_arrive_in_time_is_408(store: Store) {
    let server = TestServer::start_with(store, |h| {
        h.request_timeout = Duration::from_millis(300);
    })
    .await;
    let mut request = login_form_head("content-length: 100");
    request.push_str("token=abc");
    // The rest never comes; the server answers on its own.
    assert_raw_error(&server, request.as_bytes(), 408, "request_timeout").await;
    server.stop().await.unwrap();
}

/// Every record of the event log under `data`, as JSON, oldest first
/// (the server that writes it must have stopped: one process opens it).
fn event_lines(data: &std::path::Path) -> Vec<String> {
    let path = estafeta_server::events::events_file(data);
    let store = estafeta_server::events::EventStore::open(&path).unwrap();
    let page = store.query(&Default::default(), None, usize::MAX).unwrap();
    page.records
        .iter()
        .rev()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect()
}

/// The real binary in `dir` over `data` with the test admin token, ready;
/// its admin client.
async fn ready_binary(dir: &std::path::Path, data: &std::path::Path) -> (Binary, Client) {
    let env = [("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN)];
    let server = Binary::serve(dir, data, &[], &env).await;
    let admin = Client::new(&server.base, ADMIN_TOKEN).unwrap();
    wait_ready(&admin).await;
    (server, admin)
}

// Embedded only: the event log's file.
#[tokio::test]
async fn a_damaged_event_log_is_set_aside_and_the_server_starts_with_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (server, _) = ready_binary(dir.path(), &data).await;
    assert_eq!(server.terminate().await, Some(0));

    let events = estafeta_server::events::events_file(&data);
    let length = std::fs::metadata(&events).unwrap().len();
    let damaged: Vec<u8> = (0..length).map(|i| (i % 251) as u8).collect();
    std::fs::write(&events, &damaged).unwrap();
    let (server, admin) = ready_binary(dir.path(), &data).await;
    provision_one(&admin).await;
    assert_eq!(server.terminate().await, Some(0));

    let state = DataLayout::new(&data).state_dir();
    let aside: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.redb.damaged-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        std::fs::read(&aside[0]).unwrap() == damaged,
        "kept as it was"
    );
    let lines = event_lines(&data);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("the event log was damaged")),
        "the new log says so: {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("database created")),
        "{lines:?}"
    );
}

// Embedded only: it reads the event log's file, which a cluster node does
// not write (its events are in the cluster's database).
#[tokio::test]
async fn made_up_methods_and_paths_grow_neither_metrics_nor_the_event_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // What one start and stop log: the baseline.
    let server = Binary::serve(dir.path(), &data, &[], &[]).await;
    wait_ready(&Client::new(&server.base, "").unwrap()).await;
    server.terminate().await;
    let lines_before = event_lines(&data).len();
    let server = Binary::serve(dir.path(), &data, &[], &[]).await;
    wait_ready(&Client::new(&server.base, "").unwrap()).await;
    const BURST: usize = 40;
    for i in 0..BURST {
        let method = format!("M{i}{}", "X".repeat(20_000));
        let path = format!("/{}{i}", "p".repeat(5_000));
        let answer = send_raw(server.addr, head(&method, &path, &[]).as_bytes()).await;
        assert_eq!(answer.status, 404, "{answer:?}");
        let answer = send_raw(server.addr, head(&method, "/v1/inbox", &[]).as_bytes()).await;
        assert_eq!(answer.status, 405, "{answer:?}");
    }
    let metrics = common::scrape(&server.base).await;
    assert!(!metrics.contains("XXXX") && !metrics.contains("pppp"));
    let other = |route: &str, status: u16| {
        format!(
            "estafeta_http_requests_total{{method=\"other\",route=\"{route}\",status=\"{status}\"}} {BURST}\n"
        )
    };
    assert!(metrics.contains(&other("unmatched", 404)), "{metrics}");
    assert!(metrics.contains(&other("/v1/inbox", 405)), "{metrics}");
    assert!(
        metrics.len() < 64 * 1024,
        "{} bytes of metrics",
        metrics.len()
    );

    server.terminate().await;
    let lines = event_lines(&data);
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("XXXX") && !l.contains("pppp"))
    );
    // The second start logs what the first did, and the refused requests
    // add fewer records than there were requests.
    assert!(
        lines.len() < 2 * lines_before + BURST,
        "{} event records for one start and {} refused requests",
        lines.len() - lines_before,
        2 * BURST
    );
}

both_stores!(two_authorization_headers_are_400);
async fn two_authorization_headers_are_400(store: Store) {
    let server = TestServer::start_on(store).await;
    for (first, second) in [
        (ADMIN_TOKEN, "not-a-token"),
        ("not-a-token", ADMIN_TOKEN),
        (ADMIN_TOKEN, ADMIN_TOKEN),
    ] {
        let request = head(
            "GET",
            "/v1/admin/stats",
            &[
                format!("authorization: Bearer {first}"),
                format!("authorization: Bearer {second}"),
            ],
        );
        let answer = send_raw(server.addr, request.as_bytes()).await;
        assert_eq!(answer.status, 400, "{answer:?}");
        assert_eq!(answer.error_code(), "bad_request");
    }
    let one = head(
        "GET",
        "/v1/admin/stats",
        &[format!("authorization: Bearer {ADMIN_TOKEN}")],
    );
    assert_eq!(send_raw(server.addr, one.as_bytes()).await.status, 200);
    server.stop().await.unwrap();
}

/// A dashboard login with `token` (the form's nonce in the field and the
/// cookie, as the login page sets them).
/// Asserts that `r` (a 429) asks its client to wait through `Retry-After`
/// for a second at least and the first delay at most.
fn assert_first_wait(r: &reqwest::Response) {
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=FIRST_DELAY.as_secs()).contains(&retry), "{retry}");
}

async fn try_login(base: &str, token: &str) -> reqwest::Response {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{base}/admin/login"))
        .header("cookie", "estafeta_login=nonce-1")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}&nonce=nonce-1"))
        .send()
        .await
        .unwrap()
}

both_stores!(wrong_logins_from_one_address_must_wait_before_the_next_try);
async fn wrong_logins_from_one_address_must_wait_before_the_next_try(store: Store) {
    let server = TestServer::start_on(store).await;
    for _ in 0..FREE_FAILURES {
        assert_eq!(try_login(&server.base, "guess").await.status(), 401);
    }
    // Even the right token is not looked at before the wait is over.
    let r = try_login(&server.base, ADMIN_TOKEN).await;
    assert_eq!(r.status(), 429);
    assert_first_wait(&r);
    assert!(
        r.headers()
            .get("set-cookie")
            .is_none_or(|c| !c.to_str().unwrap().starts_with("estafeta_admin="))
    );
    assert!(r.text().await.unwrap().contains("Too many wrong tokens"));
    server.stop().await.unwrap();
}

both_stores!(a_short_admin_token_is_refused_at_start);
async fn a_short_admin_token_is_refused_at_start(store: Store) {
    let short = "x".repeat(MIN_ADMIN_TOKEN_LEN - 1);
    let err = token_refused_at_start(store.setting(), &short).await;
    assert!(err.contains("ESTAFETA_ADMIN_TOKEN"), "{err}");
    assert!(
        err.contains(&format!("at least {MIN_ADMIN_TOKEN_LEN}")),
        "{err}"
    );
}

/// Starts `estafeta serve` over `store` (none: the embedded store) with
/// the admin token `token`, which it must refuse: it exits with a failure
/// and creates no data folder. What it wrote to stderr.
async fn token_refused_at_start(store: Option<String>, token: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut serve = common::estafeta(dir.path());
    serve
        .arg("serve")
        .env("ESTAFETA_LISTEN", "127.0.0.1:0")
        .env("ESTAFETA_DATA_DIR", dir.path().join("data"))
        .env("ESTAFETA_ADMIN_TOKEN", token);
    if let Some(url) = store {
        serve.env("ESTAFETA_STORE", url);
    }
    let out = tokio::time::timeout(PATIENCE, serve.output())
        .await
        .unwrap_or_else(|_| panic!("the server started with the admin token {token}"))
        .unwrap();
    assert!(!out.status.success());
    assert!(!dir.path().join("data").exists(), "nothing was created");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// JSON arrays nested `depth` levels deep.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

both_stores!(json_nested_deeper_than_the_limit_is_400_bad_json_and_stores_nothing);
async fn json_nested_deeper_than_the_limit_is_400_bad_json_and_stores_nothing(store: Store) {
    let server = TestServer::start_on(store).await;
    let (db, phone) = provision_one(&server.admin).await;
    let http = reqwest::Client::new();
    let upload = |body: String| {
        http.post(server.url("/v1/messages"))
            .bearer_auth(&phone)
            .header("content-type", "application/json")
            .body(format!(r#"{{"version":1,"to":"db-a","body":{body}}}"#))
            .send()
    };
    // The envelope is one level: a body at the limit minus one fits.
    for depth in [100_000, MAX_JSON_DEPTH] {
        let r = upload(nested(depth)).await.unwrap();
        assert_eq!(r.status(), 400, "depth {depth}");
        let json: Value = r.json().await.unwrap();
        assert_eq!(json["error"]["code"], "bad_json", "{json}");
    }
    let queue = server.admin.folder(&id("db-a"), Folder::Messages).await;
    assert!(queue.unwrap().files.is_empty(), "nothing stored");
    let r = upload(nested(MAX_JSON_DEPTH - 1)).await.unwrap();
    assert_eq!(r.status(), 201);

    // What the processor gets parses with a parser's default depth limit.
    let started = http
        .post(server.url("/v1/processes"))
        .bearer_auth(&db)
        .header("content-type", "application/json")
        .body(r#"{"version":1,"db_id":"db-a"}"#)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let started: Value = serde_json::from_str(&started).unwrap();
    assert_eq!(started["status"], "OK");
    server.stop().await.unwrap();
}

/// The status of `GET /readyz`.
async fn readyz(base: &str) -> u16 {
    reqwest::get(format!("{base}/readyz"))
        .await
        .unwrap()
        .status()
        .as_u16()
}

// Embedded only: a full disk under the data folder's store.
#[tokio::test]
async fn readyz_is_503_while_storage_is_full_or_read_only_and_200_again_after() {
    use estafeta_test_support::tmpfs::{Tmpfs, fill};
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let _unmount = Tmpfs::mount(&mnt, "16m");
    let server = Binary::serve(dir.path(), &mnt.join("data"), &[], &[]).await;
    wait_ready(&Client::new(&server.base, "").unwrap()).await;
    assert_eq!(readyz(&server.base).await, 200);

    let ballast = mnt.join("ballast");
    fill(&ballast);
    assert_eq!(readyz(&server.base).await, 503, "disk full");
    std::fs::remove_file(&ballast).unwrap();
    assert_eq!(readyz(&server.base).await, 200, "space again");

    // Read-only: the server's folder of state behind a read-only bind mount
    // (the files it holds open stay writable; a remount of the whole file
    // system would be refused while they are open).
    let state = mnt.join("data").join(".estafeta");
    let run = |program: &str, args: &[&str]| {
        let ok = std::process::Command::new(program)
            .args(args)
            .status()
            .unwrap();
        assert!(ok.success(), "{program} {args:?}");
    };
    let state_arg = state.to_str().unwrap();
    run("mount", &["--bind", state_arg, state_arg]);
    run("mount", &["-o", "remount,bind,ro", state_arg]);
    assert_eq!(readyz(&server.base).await, 503, "read-only");
    run("umount", &[state_arg]);
    assert_eq!(readyz(&server.base).await, 200, "writable again");
    server.terminate().await;
}

/// Mode bits of a file or folder.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

// Embedded only: the modes of the message files and the event log's file.
#[tokio::test]
async fn files_are_private_and_webhook_credentials_stay_out_of_the_event_log() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A data folder made beforehand, and the most permissive umask: the
    // server must rely on neither.
    std::fs::create_dir(&data).unwrap();
    let mut child = common::estafeta_after(dir.path(), "umask 000")
        .arg("serve")
        .env("ESTAFETA_LISTEN", "127.0.0.1:0")
        .env("ESTAFETA_DATA_DIR", &data)
        .env("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = stdout
            .next_line()
            .await
            .unwrap()
            .expect("the server exited");
        if let Some(addr) = line.strip_prefix("listening on ") {
            break format!("http://{addr}");
        }
    };
    let admin = Client::new(&base, ADMIN_TOKEN).unwrap();
    wait_ready(&admin).await;
    let (_db, phone) = provision_one(&admin).await;
    admin
        .with_token(&phone)
        .send(&common::message("db-a", "{}", None))
        .await
        .unwrap();
    let r = reqwest::Client::new()
        .put(format!("{base}/v1/admin/databases/db-a/webhook"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({"version":1,"url":"http://hook-user:hook-secret@127.0.0.1:9/hook-path-secret?key=hook-key"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let state = data.join(".estafeta");
    assert_eq!(mode(&state), 0o700, ".estafeta");
    let events = estafeta_server::events::events_file(&data);
    assert_eq!(events.parent(), Some(state.as_path()), "event log");
    let queue = data.join("db-a").join("Messages");
    let files: Vec<_> = std::fs::read_dir(&queue)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let messages = files
        .iter()
        .filter(|f| !f.file_name().unwrap().as_encoded_bytes().starts_with(b"."))
        .count();
    assert_eq!(messages, 1, "{files:?}");
    // The message, and the spares made ahead of the next writes.
    for file in &files {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    for folder in [data.join("db-a"), queue.clone()] {
        assert_eq!(mode(&folder), 0o700, "{}", folder.display());
    }
    for entry in std::fs::read_dir(&state).unwrap() {
        let path = entry.unwrap().path();
        let want = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(&path), want, "{}", path.display());
    }

    // A clean stop writes the event log's last records; then it is read.
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    child.wait().await.unwrap();
    let lines = event_lines(&data);
    assert!(lines.iter().any(|l| l.contains("webhook set")), "{lines:?}");
    for secret in ["hook-secret", "hook-path-secret", "hook-key"] {
        assert!(lines.iter().all(|l| !l.contains(secret)), "{lines:?}");
    }
}

both_stores!(webhooks_to_malformed_hosts_or_link_local_addresses_are_400);
async fn webhooks_to_malformed_hosts_or_link_local_addresses_are_400(store: Store) {
    let server = TestServer::start_on(store).await;
    provision_one(&server.admin).await;
    let http = reqwest::Client::new();
    for url in [
        "http://\"evil\"<x>/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]:8080/",
    ] {
        let r = http
            .put(server.url("/v1/admin/databases/db-a/webhook"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&serde_json::json!({"version":1,"url":url}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{url}");
        let json: Value = r.json().await.unwrap();
        assert_eq!(json["error"]["code"], "bad_webhook_url", "{json}");
        assert_eq!(server.exchange.webhook(&id("db-a")), None, "{url}");
    }
    server.stop().await.unwrap();
}

/// The peak resident memory of process `pid`, in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

// Embedded only: the memory of one server process.
#[tokio::test]
async fn acknowledgements_are_sized_to_their_route_and_parsed_without_copies() {
    use estafeta_server::body_limit::SMALL_BODY;
    let dir = tempfile::tempdir().unwrap();
    let (server, admin) = ready_binary(dir.path(), &dir.path().join("data")).await;
    let phone = common::reply_waiting(&admin, r#"{"ok":true}"#).await;
    let waiting = admin.with_token(&phone).inbox(None).await.unwrap().messages;
    assert_eq!(waiting.len(), 1);

    // An acknowledgement of a thousand ids (one of them real) is far
    // within its route's limit.
    let mut ids: Vec<String> = (0..999).map(|i| format!("01JD6Y{i:020}")).collect();
    ids.push(waiting[0].id.to_string());
    let body = serde_json::json!({"version": 1, "ids": ids}).to_string();
    assert!(body.len() < SMALL_BODY / 4, "{} bytes", body.len());
    let r = reqwest::Client::new()
        .post(format!("{}/v1/inbox/ack", server.base))
        .bearer_auth(&phone)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["acked"], 1);

    // Declared past the route's limit: 413 before the body is sent.
    let declared = head(
        "POST",
        "/v1/inbox/ack",
        &[
            format!("authorization: Bearer {phone}"),
            "content-type: application/json".to_owned(),
            format!("content-length: {}", 30 << 20),
        ],
    );
    let answer = send_raw(server.addr, declared.as_bytes()).await;
    assert_eq!(answer.status, 413, "{answer:?}");
    assert_eq!(answer.error_code(), "body_too_large");

    // Two 30 MB acknowledgements of small values, without a length: each is
    // cut off at the limit, and the server's memory stays far below what
    // parsing them would take.
    let before = peak_memory(server.child.id().unwrap());
    let chunked = || {
        let mut request = head(
            "POST",
            "/v1/inbox/ack",
            &[
                format!("authorization: Bearer {phone}"),
                "content-type: application/json".to_owned(),
                "transfer-encoding: chunked".to_owned(),
            ],
        )
        .into_bytes();
        let piece = "0,".repeat(512 * 1024);
        let mut chunk = |text: &str| {
            request.extend_from_slice(format!("{:x}\r\n{text}\r\n", text.len()).as_bytes());
        };
        chunk(r#"{"version":1,"ids":["#);
        for _ in 0..30 {
            chunk(&piece);
        }
        chunk("0]}");
        request.extend_from_slice(b"0\r\n\r\n");
        request
    };
    let (one, two) = (chunked(), chunked());
    let (a, b) = tokio::join!(
        common::raw::send_while_answered(server.addr, &one),
        common::raw::send_while_answered(server.addr, &two)
    );
    for answer in [a, b] {
        assert_eq!(answer.status, 413, "{answer:?}");
    }
    let grown = peak_memory(server.child.id().unwrap()).saturating_sub(before);
    assert!(grown < 64 << 20, "peak memory grew by {} MB", grown >> 20);
    assert_eq!(server.terminate().await, Some(0));
}

/// A webhook on loopback that answers every POST with a redirect to
/// `to`, and tells of each POST.
async fn redirecting_hook(to: String) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let (tx, posts) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().fallback(move |method: axum::http::Method| {
        let (tx, to) = (tx.clone(), to.clone());
        async move {
            if method == axum::http::Method::POST {
                let _ = tx.send(());
            }
            (
                axum::http::StatusCode::FOUND,
                [(axum::http::header::LOCATION, to)],
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, posts)
}

/// A listener that tells of every connection made to it.
async fn connection_counter() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let (tx, connections) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tx.send(());
            drop(tcp);
        }
    });
    (addr, connections)
}

// Embedded only: the webhook client is the same whatever the store.
#[tokio::test]
async fn webhook_redirects_are_not_followed_and_refused_targets_are_not_stored() {
    use tokio::sync::mpsc::error::TryRecvError;
    let (elsewhere, mut reached) = connection_counter().await;
    let (hook, mut posts) = redirecting_hook(format!("http://{elsewhere}/stolen")).await;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN),
        ("ESTAFETA_ALERT_RETRY", "1s"),
        ("ESTAFETA_ALERT_PROBE", "1s"),
    ];
    let server = Binary::serve(dir.path(), &dir.path().join("data"), &[], &env).await;
    let admin = Client::new(&server.base, ADMIN_TOKEN).unwrap();
    wait_ready(&admin).await;
    let (_db, phone) = provision_one(&admin).await;
    let put_webhook = |base: String, url: String| async move {
        reqwest::Client::new()
            .put(format!("{base}/v1/admin/databases/db-a/webhook"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&serde_json::json!({"version": 1, "url": url}))
            .send()
            .await
            .unwrap()
    };
    let r = put_webhook(server.base.clone(), format!("http://{hook}/hook")).await;
    assert_eq!(r.status(), 200);
    admin
        .with_token(&phone)
        .send(&common::message("db-a", "{}", None))
        .await
        .unwrap();
    // The redirect is an answer, not a way elsewhere: the push fails and is
    // tried again; a redirect followed would have reached `elsewhere`
    // before the first try ended.
    for _ in 0..2 {
        common::next(&mut posts).await;
    }
    assert_eq!(reached.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(server.terminate().await, Some(0));

    // With private targets denied, one is refused when set (a name that
    // resolves to one as well), so it is never stored, sent to or probed.
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN),
        ("ESTAFETA_WEBHOOK_PRIVATE", "deny"),
    ];
    let server = Binary::serve(dir.path(), &dir.path().join("data"), &[], &env).await;
    let admin = Client::new(&server.base, ADMIN_TOKEN).unwrap();
    wait_ready(&admin).await;
    provision_one(&admin).await;
    for url in [
        format!("http://localhost:{}/", elsewhere.port()),
        format!("http://{elsewhere}/"),
    ] {
        let r = put_webhook(server.base.clone(), url.clone()).await;
        assert_eq!(r.status(), 400, "{url}");
        let json: Value = r.json().await.unwrap();
        assert_eq!(json["error"]["code"], "bad_webhook_url", "{json}");
    }
    assert_eq!(server.terminate().await, Some(0));
    assert_eq!(reached.try_recv(), Err(TryRecvError::Empty));
}

/// A dashboard login with `token` at `base`: the session cookie, or the
/// status of the refusal.
async fn dashboard_login(base: &str, token: &str) -> Result<String, u16> {
    let r = try_login(base, token).await;
    r.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|c| c.to_str().ok())
        .find(|c| c.starts_with("estafeta_admin=") && !c.starts_with("estafeta_admin=;"))
        .map(|c| c.split(';').next().unwrap().to_owned())
        .ok_or(r.status().as_u16())
}

/// The status and text of the dashboard's page `path` with the session
/// `cookie`.
async fn dashboard_page(base: &str, path: &str, cookie: &str) -> (u16, String) {
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{base}{path}"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The status of the dashboard's overview with the session `cookie`.
async fn overview(base: &str, cookie: &str) -> u16 {
    dashboard_page(base, "/admin", cookie).await.0
}

/// Fails if `shown` (a page, an answer, a scrape) names one of `secrets`
/// (a folder, a host of the server) or quotes an operating system's error.
fn assert_no_detail(what: &str, shown: &str, secrets: &[&str]) {
    for secret in secrets.iter().chain(&["os error", "Not a directory"]) {
        assert!(!shown.contains(secret), "{what} shows {secret:?}: {shown}");
    }
}

/// A folder of the data folder that cannot be read under a page, an action
/// and the admin API: each says so in general terms; the path and the
/// operating system's error are in the event log only.
// Embedded only: a folder of the data folder.
#[tokio::test]
async fn a_storage_failure_shows_its_path_only_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (server, admin) = ready_binary(dir.path(), &data).await;
    let t = Tenancy::provision(&admin).await;
    let (_, failed) = committed_process(&t, ResultStatus::ProcessedIncorrect).await;
    let cookie = dashboard_login(&server.base, ADMIN_TOKEN).await.unwrap();
    let message = format!("/admin/browse/Error/db-a/{failed}");
    assert_eq!(dashboard_page(&server.base, &message, &cookie).await.0, 200);

    // db-a's Error folder becomes a file: reading it fails at its path.
    let folder = data.join("db-a").join("Error");
    std::fs::rename(&folder, data.join("db-a").join("Error.aside")).unwrap();
    std::fs::write(&folder, b"").unwrap();
    let secrets = [data.to_str().unwrap()];
    let (status, page) = dashboard_page(&server.base, &message, &cookie).await;
    assert_eq!(status, 503, "{page}");
    assert!(page.contains(SERVER_FAILED), "{page}");
    assert_no_detail(&message, &page, &secrets);
    // An action fails the same way.
    let (_, overview) = dashboard_page(&server.base, "/admin", &cookie).await;
    let csrf = overview
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the overview's forms carry the CSRF token");
    let requeued = reqwest::Client::new()
        .post(format!("{}{message}/requeue", server.base))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}"))
        .send()
        .await
        .unwrap();
    assert_eq!(requeued.status(), 503);
    let page = requeued.text().await.unwrap();
    assert!(page.contains(SERVER_FAILED), "{page}");
    assert_no_detail("requeue", &page, &secrets);
    for path in ["/admin", "/admin/databases", "/admin/browse/Error"] {
        let (status, page) = dashboard_page(&server.base, path, &cookie).await;
        assert!(
            status == 200 || page.contains(SERVER_FAILED),
            "{path}: {page}"
        );
        assert_no_detail(path, &page, &secrets);
    }
    let api = format!("{}/v1/admin/databases/db-a/folders/Error", server.base);
    for url in [api.clone(), format!("{api}/{failed}")] {
        let r = reqwest::Client::new()
            .get(&url)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 503, "{url}");
        let body = r.text().await.unwrap();
        let json: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"]["code"], "storage_error", "{body}");
        assert_no_detail(&url, &body, &secrets);
    }
    let metrics = admin.metrics().await.unwrap();
    assert_no_detail("/metrics", &metrics, &secrets);
    assert_eq!(server.terminate().await, Some(0));

    // The log says why.
    let lines = event_lines(&data);
    let folder = folder.to_str().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("dashboard") && l.contains(folder)),
        "{lines:?}"
    );
}

/// A cluster node whose database stops: its pages, its login form and the
/// admin API say so in general terms, and neither they nor `/metrics` name
/// the database's host or the connection's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_names_its_database_neither_on_its_pages_nor_in_its_metrics() {
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = pg.url();
    let env = common::cluster::node_env(&url, &[]);
    let node = Binary::serve(dir.path(), &dir.path().join("data"), &[], &env).await;
    let admin = Client::new(&node.base, ADMIN_TOKEN).unwrap();
    wait_ready(&admin).await;
    provision_one(&admin).await;
    let cookie = dashboard_login(&node.base, ADMIN_TOKEN).await.unwrap();
    let host = pg.host_port();
    let secrets = [host.as_str(), "postgres", "refused"];
    assert_no_detail("/metrics", &admin.metrics().await.unwrap(), &secrets);

    pg.stop().unwrap();
    for path in ["/admin", "/admin/databases", "/admin/events"] {
        let (status, page) = dashboard_page(&node.base, path, &cookie).await;
        assert_eq!(status, 503, "{path}: {page}");
        assert_no_detail(path, &page, &secrets);
    }
    let login = try_login(&node.base, ADMIN_TOKEN).await;
    assert_eq!(login.status(), 503);
    let page = login.text().await.unwrap();
    assert!(page.contains(SERVER_FAILED), "{page}");
    assert_no_detail("a login", &page, &secrets);
    let r = reqwest::Client::new()
        .get(format!("{}/v1/admin/databases", node.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body = r.text().await.unwrap();
    assert!(body.contains("storage_error"), "{body}");
    assert_no_detail("the admin API", &body, &secrets);
    let metrics = common::scrape(&node.base).await;
    assert_no_detail("/metrics", &metrics, &secrets);
    node.kill9().await;
}

// Embedded only: the admin token kept in the data folder.
#[tokio::test]
async fn a_rotated_admin_token_ends_dashboard_logins_and_is_kept_only_as_a_hash() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Binary::serve(dir.path(), &data, &[], &[]).await;
    let first = server
        .printed_token
        .clone()
        .expect("printed at first start");
    let admin = Client::new(&server.base, &first).unwrap();
    wait_ready(&admin).await;
    let kept_file = data.join(".estafeta").join("admin-token");
    let kept = || std::fs::read_to_string(&kept_file).unwrap();
    assert!(
        !kept().contains(&first),
        "the token itself is kept: {}",
        kept()
    );

    let cookie = dashboard_login(&server.base, &first).await.unwrap();
    assert_eq!(overview(&server.base, &cookie).await, 200);
    let rotated = admin.rotate_admin_token().await.unwrap().token;
    // The login made with the old token is over; the new token logs in.
    assert_eq!(overview(&server.base, &cookie).await, 303);
    assert_eq!(dashboard_login(&server.base, &first).await, Err(401));
    let cookie = dashboard_login(&server.base, &rotated).await.unwrap();
    assert_eq!(overview(&server.base, &cookie).await, 200);
    for token in [&first, &rotated] {
        assert!(!kept().contains(token.as_str()), "kept: {}", kept());
    }
    assert_eq!(server.terminate().await, Some(0));

    // Restarted: nothing is printed again, and the rotated token holds.
    let server = Binary::serve(dir.path(), &data, &[], &[]).await;
    assert_eq!(server.printed_token, None);
    wait_ready(&Client::new(&server.base, &rotated).unwrap()).await;
    Client::new(&server.base, &rotated)
        .unwrap()
        .stats()
        .await
        .unwrap();
    assert_eq!(server.terminate().await, Some(0));
}

// Embedded only: the event log's file.
#[tokio::test]
async fn wrong_tokens_are_throttled_per_client_address_and_logged_in_aggregate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The test's own connections come through a "proxy": 127.0.0.1.
    let env = [
        ("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN),
        ("ESTAFETA_TRUSTED_PROXIES", "127.0.0.1"),
    ];
    let server = Binary::serve(dir.path(), &data, &[], &env).await;
    wait_ready(&Client::new(&server.base, "").unwrap()).await;
    let http = reqwest::Client::new();
    let stats = |from: String, token: String| {
        let request = http
            .clone()
            .get(format!("{}/v1/admin/stats", server.base))
            .header("x-forwarded-for", from)
            .bearer_auth(token);
        async move { request.send().await.unwrap() }
    };
    let operator = "198.51.100.7".to_owned();
    assert_eq!(
        stats(operator.clone(), ADMIN_TOKEN.into()).await.status(),
        200
    );
    let admin = Client::new(&server.base, ADMIN_TOKEN).unwrap();
    let (_db, phone) = provision_one(&admin).await;

    let attacker = "203.0.113.1".to_owned();
    for _ in 0..FREE_FAILURES {
        let r = stats(attacker.clone(), "guess".into()).await;
        assert_eq!(r.status(), 401);
    }
    // Throttled: neither a guess nor the admin token is looked at.
    for token in ["guess", ADMIN_TOKEN] {
        let r = stats(attacker.clone(), token.into()).await;
        assert_eq!(r.status(), 429, "{token}");
        assert_first_wait(&r);
        let json: Value = r.json().await.unwrap();
        assert_eq!(json["error"]["code"], "too_many_attempts");
    }
    // A device behind the same address goes on working.
    let inbox = http
        .get(format!("{}/v1/inbox", server.base))
        .header("x-forwarded-for", &attacker)
        .bearer_auth(&phone)
        .send()
        .await
        .unwrap();
    assert_eq!(inbox.status(), 200);

    // Wrong tokens from more addresses than are remembered do not free the
    // locked one, nor lock out the operator's.
    let flood: Vec<_> = (0..MAX_ADDRESSES + 100)
        .map(|i| format!("198.18.{}.{}", i / 250, i % 250 + 1))
        .collect();
    // Wrong tokens looked at and refused (401), counted here.
    let mut refused = u64::from(FREE_FAILURES);
    for chunk in flood.chunks(64) {
        let mut answers = tokio::task::JoinSet::new();
        for from in chunk {
            answers.spawn(stats(from.clone(), "guess".into()));
        }
        while let Some(r) = answers.join_next().await {
            let status = r.unwrap().status().as_u16();
            assert!(matches!(status, 401 | 429), "{status}");
            refused += u64::from(status == 401);
        }
    }
    // The locked address's count goes on where it was (had it been
    // forgotten, this would be its first failure of three free ones).
    assert_eq!(stats(attacker.clone(), "guess".into()).await.status(), 401);
    refused += 1;
    assert_eq!(stats(attacker, ADMIN_TOKEN.into()).await.status(), 429);
    assert_eq!(stats(operator, ADMIN_TOKEN.into()).await.status(), 200);
    // The metrics count every wrong token, whichever address gave it.
    let failures = r#"estafeta_auth_failures_total{via="bearer"}"#;
    assert_eq!(
        common::metric(&server.base, failures).await,
        Some(refused as f64)
    );
    assert_eq!(server.terminate().await, Some(0));

    // One summary line, not one per wrong token.
    let lines = event_lines(&data);
    let summaries: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("wrong tokens"))
        .collect();
    assert!(
        !summaries.is_empty() && summaries.len() <= 2,
        "{summaries:?}"
    );
    assert!(lines.len() < 1000, "{} event records", lines.len());
}

#[tokio::test]
async fn an_admin_token_that_is_long_but_easy_to_guess_is_refused_at_start() {
    let err = token_refused_at_start(None, &"x".repeat(MIN_ADMIN_TOKEN_LEN)).await;
    assert!(err.contains("easy to guess"), "{err}");
}

/// The systemd unit and README, as shipped.
fn shipped(file: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(file)).unwrap()
}

#[test]
fn the_unit_confines_the_server_and_agrees_with_readme_on_where_backups_go() {
    let unit = shipped("packaging/estafeta.service");
    let settings: Vec<&str> = unit.lines().filter(|l| !l.starts_with('#')).collect();
    for wanted in [
        "CapabilityBoundingSet=",
        "SystemCallFilter=@system-service",
        "MemoryDenyWriteExecute=yes",
        "RestrictNamespaces=yes",
        "ProtectKernelLogs=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
    ] {
        assert!(settings.contains(&wanted), "the unit lacks {wanted}");
    }
    // The file with the admin token is made private, never with touch.
    assert!(unit.contains("install -m 0600 /dev/null /etc/estafeta/env"));
    assert!(!unit.contains("touch /etc/estafeta/env"));
    // README's backup goes where the unit lets the server write.
    let writable: Vec<&str> = settings
        .iter()
        .filter_map(|l| l.strip_prefix("ReadWritePaths="))
        .map(|p| p.trim_start_matches('-'))
        .collect();
    let readme = shipped("README.md");
    let backup = readme
        .lines()
        .find_map(|l| l.split("estafeta backup ").nth(1))
        .expect("README gives a backup command");
    let dir = backup.split_whitespace().next().unwrap();
    assert!(
        writable.iter().any(|w| dir.starts_with(&format!("{w}/"))),
        "README backs up into {dir}, the unit lets the server write {writable:?}"
    );
    assert!(
        unit.contains(&format!(
            "install -d -o estafeta -g estafeta -m 0700 {}",
            writable[0]
        )),
        "the install steps make the backup folder"
    );
}
