//! Push notifications reach real webhooks on loopback: the notification's
//! JSON (and no message body), coalescing of a burst, retries of a failed
//! POST, a host that is down and comes back, a pending push across a
//! restart, and the admin API that sets webhooks. Time is the test's
//! (a clock it moves); waits are for something the server shows (a POST
//! arriving, a figure of `/metrics`), never for a fixed time.
//!
//! Every test runs on both stores (`name::embedded`, `name::postgres`): a
//! cluster node writes an arrival's notification through its own
//! scheduler, which it wakes, so nothing waits for the clock to move.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::common;
use crate::common::clock::ManualClock;
use crate::common::restartable::{Server, started_notified};
use crate::common::webhook::{self, Post, Script};
use crate::common::{
    ADMIN_TOKEN, PATIENCE, Store, both_stores, committed_process, message, next, quick_retry,
    wait_metric,
};
use estafeta_exchange::Timestamp;
use estafeta_exchange::wire::ResultStatus;
use estafeta_server::notify::NotifySettings;
use serde_json::{Value, json};

/// Far past any retry wait of these tests (the first is a second).
const AN_HOUR: Duration = Duration::from_secs(3600);

/// How often a webhook host marked down is probed, in the tests of one.
const PROBE: Duration = Duration::from_millis(50);

/// Notifications with a one-second first retry and webhook hosts probed
/// every `probe`.
fn settings(data: &Path, probe: Duration) -> NotifySettings {
    NotifySettings {
        probe,
        ..quick_retry(data)
    }
}

/// `PUT` (with `Some(body)`) or `DELETE` a webhook; status and answer.
async fn webhook_call(base: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
    let http = reqwest::Client::new();
    let url = format!("{base}/v1/admin/{path}/webhook");
    let req = match body {
        Some(b) => http.put(url).json(&b),
        None => http.delete(url),
    };
    let answer = req.bearer_auth(token).send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// Points `path` (`databases/db-a`, `devices/phone-1`) at `url`.
async fn set_webhook(server: &Server, path: &str, url: &str) {
    let body = json!({"version": 1, "url": url});
    let (status, answer) = webhook_call(&server.base, path, ADMIN_TOKEN, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["url"], url);
}

/// Waits until the one push notification waits for its retry after
/// `attempts` failed attempts: one entry, none due. Over PostgreSQL (`url`)
/// also until its stored attempts say so: a claimed entry, its attempt
/// under way, is not due either.
async fn wait_retrying(server: &Server, url: Option<&str>, attempts: i32) {
    wait_pushes(server, 1.0).await;
    wait_metric(
        &server.base,
        r#"estafeta_repeat_backlog{source="push"}"#,
        0.0,
    )
    .await;
    let Some(url) = url else { return };
    let db = estafeta_postgres::Store::connect(url).unwrap();
    let polled = async {
        loop {
            let client = db.client().await.unwrap();
            let rows = client
                .query(
                    "SELECT attempt FROM repeat_entries WHERE source = 'push'",
                    &[],
                )
                .await
                .unwrap();
            if rows.iter().map(|r| r.get::<_, i32>(0)).eq([attempts]) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PATIENCE, polled)
        .await
        .unwrap_or_else(|_| panic!("the push never waited after {attempts} attempts"));
}

/// Waits until `pending` push notifications are stored (waiting, due or
/// under way).
async fn wait_pushes(server: &Server, pending: f64) {
    wait_metric(
        &server.base,
        r#"estafeta_repeat_entries{source="push"}"#,
        pending,
    )
    .await;
}

/// Points `path`'s webhook at `uri` on a closed loopback port: no POST
/// gets through until [`come_up`]. The port.
async fn unreachable_webhook(server: &Server, path: &str, uri: &str) -> SocketAddr {
    let addr = common::recorder::closed_port();
    set_webhook(server, path, &format!("http://{addr}{uri}")).await;
    addr
}

/// A webhook that comes up at `addr`, a port that was closed.
async fn come_up(addr: SocketAddr) -> webhook::Hook {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    webhook::serve(listener, Script::default())
}

/// Asserts the notification for `recipient` of `kind`: exactly the small
/// JSON, no message body.
fn assert_notification(post: &Post, recipient: &str, kind: &str, clock: &ManualClock) {
    use estafeta_session::Clock;
    let at = Timestamp::from_millis(i64::try_from(clock.now().0).unwrap()).to_string();
    assert_eq!(
        post.json,
        json!({
            "version": 1,
            "event": "messages_waiting",
            "recipient": recipient,
            "kind": kind,
            "at": at,
        })
    );
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    arrivals_are_pushed_to_database_and_device_webhooks_without_bodies
);
async fn arrivals_are_pushed_to_database_and_device_webhooks_without_bodies(store: Store) {
    let (_data, _, clock, server, t) =
        started_notified(store, |data| settings(data, Duration::ZERO)).await;
    let (addr, mut hook) = webhook::start(Script::default()).await;
    set_webhook(&server, "databases/db-b", &format!("http://{addr}/db")).await;
    set_webhook(&server, "devices/phone-1", &format!("http://{addr}/phone")).await;
    set_webhook(&server, "databases/db-x", &format!("http://{addr}/later")).await;

    // A device's upload lands in db-b's queue.
    t.phone1
        .send(&message("db-b", r#"{"secret":"do not push me"}"#, None))
        .await
        .unwrap();
    let post = next(&mut hook.posts).await;
    assert_eq!(post.uri, "/db");
    assert_notification(&post, "db-b", "database", &clock);
    assert!(!post.json.to_string().contains("secret"));

    // A committed reply lands in phone-1's inbox (db-a has no webhook).
    committed_process(&t, ResultStatus::Processed).await;
    let post = next(&mut hook.posts).await;
    assert_eq!(post.uri, "/phone");
    assert_notification(&post, "phone-1", "device", &clock);

    // A message for later is scheduled; it is pushed when it enters the
    // queue at its time.
    let mut later = message("db-x", "{}", None);
    use estafeta_session::Clock;
    let due = clock.now().after(AN_HOUR);
    later.deliver_at = Some(Timestamp::from_millis(i64::try_from(due.0).unwrap()));
    t.phone_x.send(&later).await.unwrap();
    wait_metric(
        &server.base,
        r#"estafeta_repeat_entries{source="deliver_at"}"#,
        1.0,
    )
    .await;
    assert!(hook.posts.try_recv().is_err(), "pushed before its time");
    clock.advance(AN_HOUR + Duration::from_secs(1));
    let post = next(&mut hook.posts).await;
    assert_eq!(post.uri, "/later");
    assert_notification(&post, "db-x", "database", &clock);
    server.stop().await;
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fifty_arrivals_while_the_webhook_is_slow_make_two_posts
);
async fn fifty_arrivals_while_the_webhook_is_slow_make_two_posts(store: Store) {
    let (_data, _, clock, server, t) =
        started_notified(store, |data| settings(data, Duration::ZERO)).await;
    let (addr, mut hook) = webhook::start(Script {
        held: true,
        ..Script::default()
    })
    .await;
    set_webhook(&server, "databases/db-a", &format!("http://{addr}/db")).await;

    t.phone1.send(&message("db-a", "{}", None)).await.unwrap();
    // The first notification is out and unanswered while 49 more arrive.
    next(&mut hook.posts).await;
    for n in 1..50 {
        let body = format!(r#"{{"n":{n}}}"#);
        t.phone1.send(&message("db-a", &body, None)).await.unwrap();
    }
    // One more is pending: a mark in memory, or in the cluster's store a
    // second entry (the first one's `again`).
    let pending = match store {
        Store::Embedded => 1.0,
        Store::Postgres => 2.0,
    };
    wait_pushes(&server, pending).await;
    hook.open();
    let second = next(&mut hook.posts).await;
    assert_notification(&second, "db-a", "database", &clock);
    // Settled: nothing is pending, so nothing more can come.
    wait_pushes(&server, 0.0).await;
    assert!(hook.posts.try_recv().is_err(), "a third POST was sent");
    server.stop().await;
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_webhook_failing_twice_gets_the_push_on_the_third_try
);
async fn a_webhook_failing_twice_gets_the_push_on_the_third_try(store: Store) {
    let (_data, url, clock, server, t) =
        started_notified(store, |data| settings(data, Duration::ZERO)).await;
    let (addr, mut hook) = webhook::start(Script {
        statuses: vec![500, 500],
        ..Script::default()
    })
    .await;
    set_webhook(&server, "databases/db-a", &format!("http://{addr}/db")).await;

    t.phone1.send(&message("db-a", "{}", None)).await.unwrap();
    for attempts in 1..=2 {
        next(&mut hook.posts).await;
        // Answered 500: the push waits for its retry (backoff), not sent
        // again before the clock moves.
        wait_retrying(&server, url.as_deref(), attempts).await;
        assert!(hook.posts.try_recv().is_err());
        clock.advance(AN_HOUR);
    }
    let third = next(&mut hook.posts).await;
    assert_notification(&third, "db-a", "database", &clock);
    wait_pushes(&server, 0.0).await;
    assert!(hook.posts.try_recv().is_err());
    server.stop().await;
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_webhook_host_that_is_down_gets_the_waiting_push_once_it_is_up
);
async fn a_webhook_host_that_is_down_gets_the_waiting_push_once_it_is_up(store: Store) {
    let (_data, url, clock, server, t) =
        started_notified(store, |data| settings(data, PROBE)).await;
    let addr = unreachable_webhook(&server, "databases/db-a", "/db").await;

    t.phone1.send(&message("db-a", "{}", None)).await.unwrap();
    // The first try meets a closed port; the host's probes fail and mark it down.
    wait_retrying(&server, url.as_deref(), 1).await;
    // The one webhook host is down; `/metrics`, which answers anyone, does
    // not name it.
    let down = r#"estafeta_sendq_hosts_down{queue="http"}"#;
    wait_metric(&server.base, down, 1.0).await;
    let exposed = common::scrape(&server.base).await;
    assert!(!exposed.contains(&addr.to_string()), "{exposed}");
    // The retry finds the host down: queued, not failed.
    clock.advance(AN_HOUR);
    let queued = r#"estafeta_sendq_queued{queue="http",type="push"}"#;
    wait_metric(&server.base, queued, 1.0).await;

    let mut hook = come_up(addr).await;
    let post = next(&mut hook.posts).await;
    assert_eq!(post.uri, "/db");
    assert_notification(&post, "db-a", "database", &clock);
    wait_metric(&server.base, down, 0.0).await;
    wait_pushes(&server, 0.0).await;
    server.stop().await;
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_push_waiting_out_its_backoff_goes_as_soon_as_its_host_is_up
);
/// The first retry waits an hour: longer than a cluster node's claim on a
/// notification, so that a node (which leaves alone what waits less, as
/// another node may be sending it) hurries it too.
async fn a_push_waiting_out_its_backoff_goes_as_soon_as_its_host_is_up(store: Store) {
    let notify = |data: &Path| NotifySettings {
        retry: AN_HOUR,
        ..settings(data, PROBE)
    };
    let (_data, url, clock, server, t) = started_notified(store, notify).await;
    let addr = unreachable_webhook(&server, "devices/phone-1", "/phone").await;

    committed_process(&t, ResultStatus::Processed).await;
    wait_retrying(&server, url.as_deref(), 1).await;
    let down = r#"estafeta_sendq_hosts_down{queue="http"}"#;
    wait_metric(&server.base, down, 1.0).await;

    // The clock stands still: only the host coming back can send it now.
    let mut hook = come_up(addr).await;
    let post = next(&mut hook.posts).await;
    assert_notification(&post, "phone-1", "device", &clock);
    wait_pushes(&server, 0.0).await;
    server.stop().await;
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_pending_push_survives_a_restart
);
async fn a_pending_push_survives_a_restart(store: Store) {
    let (data, url, clock, server, t) =
        started_notified(store, |data| settings(data, Duration::ZERO)).await;
    let addr = unreachable_webhook(&server, "devices/phone-1", "/phone").await;

    // A reply for phone-1 while its webhook is unreachable.
    committed_process(&t, ResultStatus::Processed).await;
    wait_retrying(&server, url.as_deref(), 1).await;
    server.stop().await;

    // The webhook comes up and the retry falls due while the server is
    // down; the restarted server (the webhook read back from phone-1's
    // session, or the cluster's registry) sends what was pending.
    let mut hook = come_up(addr).await;
    clock.advance(AN_HOUR);
    let (data, url) = (data.path(), url.as_deref());
    let notify = settings(data, Duration::ZERO);
    let server = Server::start_notified_on(data, url, &clock, notify).await;
    let post = next(&mut hook.posts).await;
    assert_eq!(post.uri, "/phone");
    assert_notification(&post, "phone-1", "device", &clock);
    server.stop().await;
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    the_webhook_admin_api_checks_its_input
);
async fn the_webhook_admin_api_checks_its_input(store: Store) {
    let data = tempfile::tempdir().unwrap();
    let store = store.setting();
    let clock = ManualClock::now();
    let server = Server::start_notified_on(
        data.path(),
        store.as_deref(),
        &clock,
        settings(data.path(), Duration::ZERO),
    )
    .await;
    let (db_token, phone_token) = common::provision_one(&server.admin).await;
    let base = server.base.as_str();
    let put = |url: Value| Some(json!({"version": 1, "url": url}));

    let (status, answer) = webhook_call(
        base,
        "databases/db-a",
        ADMIN_TOKEN,
        put(json!("https://hooks.example.org/a?b=c")),
    )
    .await;
    assert_eq!(
        (status, answer.clone()),
        (
            200,
            json!({"version": 1, "url": "https://hooks.example.org/a?b=c"})
        )
    );
    for bad in [
        "ftp://example.org/",
        "http://",
        "not a url",
        "http://example.org:99999/",
    ] {
        let (status, answer) =
            webhook_call(base, "databases/db-a", ADMIN_TOKEN, put(json!(bad))).await;
        assert_eq!(status, 400, "{bad}: {answer}");
        assert_eq!(answer["error"]["code"], "bad_webhook_url");
    }
    let (status, answer) = webhook_call(
        base,
        "databases/db-a",
        ADMIN_TOKEN,
        Some(json!({"url": "http://a.b/"})),
    )
    .await;
    assert_eq!(status, 400, "a body without its version: {answer}");
    for path in [
        "databases/nope",
        "devices/nope",
        "devices/db-a",
        "databases/phone-1",
    ] {
        let (status, _) = webhook_call(base, path, ADMIN_TOKEN, put(json!("http://a.b/"))).await;
        assert_eq!(status, 404, "{path}");
    }
    for token in [&db_token, &phone_token] {
        let (status, _) =
            webhook_call(base, "databases/db-a", token, put(json!("http://a.b/"))).await;
        assert_eq!(status, 403);
        let (status, _) = webhook_call(base, "devices/phone-1", token, None).await;
        assert_eq!(status, 403);
    }
    let (status, _) = webhook_call(base, "databases/db-a", "", put(json!("http://a.b/"))).await;
    assert_eq!(status, 401);
    let (status, answer) = webhook_call(
        base,
        "devices/phone-1",
        ADMIN_TOKEN,
        put(json!("http://[::1]:8080/x")),
    )
    .await;
    assert_eq!(
        (status, &answer["url"]),
        (200, &json!("http://[::1]:8080/x"))
    );
    let (status, answer) =
        webhook_call(base, "devices/phone-1", ADMIN_TOKEN, put(Value::Null)).await;
    assert_eq!((status, answer), (200, json!({"version": 1, "url": null})));
    let (status, answer) = webhook_call(base, "databases/db-a", ADMIN_TOKEN, None).await;
    assert_eq!((status, answer), (200, json!({"version": 1, "url": null})));

    let doc: Value = reqwest::get(format!("{base}/v1/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for path in [
        "/v1/admin/databases/{db}/webhook",
        "/v1/admin/devices/{dev}/webhook",
    ] {
        assert!(
            doc["paths"][path]["put"]["responses"]["404"].is_object(),
            "{path}"
        );
        assert!(
            doc["paths"][path]["delete"]["responses"]["200"].is_object(),
            "{path}"
        );
    }
    assert!(doc["components"]["schemas"]["Webhook"].is_object());
    server.stop().await;
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_webhook_name_is_resolved_and_its_addresses_checked_before_connecting
);
async fn a_webhook_name_is_resolved_and_its_addresses_checked_before_connecting(store: Store) {
    use estafeta_server::notify::targets::PrivateTargets;
    let (addr, mut hook) = webhook::start(Script::default()).await;
    let webhook = format!("http://localhost:{}/db", addr.port());
    for private in [PrivateTargets::Deny, PrivateTargets::Allow] {
        let notify = |data: &Path| NotifySettings {
            webhook_private: private,
            ..settings(data, Duration::ZERO)
        };
        let (_data, _, _, server, t) = started_notified(store, notify).await;
        match private {
            // localhost resolves to loopback, a private range: refused
            // when set, so it is never stored, sent to or probed.
            PrivateTargets::Deny => {
                let body = json!({"version": 1, "url": webhook});
                let (status, answer) =
                    webhook_call(&server.base, "databases/db-b", ADMIN_TOKEN, Some(body)).await;
                assert_eq!(status, 400, "{answer}");
                assert_eq!(answer["error"]["code"], "bad_webhook_url", "{answer}");
                t.phone1.send(&message("db-b", "{}", None)).await.unwrap();
                assert!(hook.posts.try_recv().is_err(), "a refused host got a POST");
            }
            PrivateTargets::Allow => {
                set_webhook(&server, "databases/db-b", &webhook).await;
                t.phone1.send(&message("db-b", "{}", None)).await.unwrap();
                let post = next(&mut hook.posts).await;
                assert_eq!(post.uri, "/db");
            }
        }
        server.stop().await;
    }
}
