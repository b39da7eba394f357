//! Two `estafeta serve` nodes over one throwaway PostgreSQL: the state a
//! node of the embedded store keeps in its data folder is shared. A
//! process that goes in doubt is one alert and one e-mail (a real SMTP
//! server on loopback) though both nodes run their notifiers, an arrival
//! is one push notification though both nodes run their pushers, a
//! dashboard login made through one node is valid on the other, each
//! node's event log shows the other's events, and wrong tokens given to
//! one node count on the other.

use std::time::Duration;

use crate::common;
use crate::common::cluster::{pushed_once, set_webhook, two_nodes, wait_count};
use crate::common::{Binary, Tenancy, http, next, ready_process, recorder};
use estafeta_exchange::wire::{ProcessState, ResultStatus};
use estafeta_postgres::testing::Postgres;
use estafeta_test_support::smtp_server;
use reqwest::StatusCode;
use reqwest::header::COOKIE;

/// Logs in on `node`'s dashboard; the session cookie header.
async fn login(node: &Binary) -> String {
    let dashboard = format!("{}/admin", node.base);
    common::dashboard_session(&dashboard, common::ADMIN_TOKEN).await
}

/// `path` of `node`'s dashboard with `cookie`: its status and page.
async fn page(node: &Binary, path: &str, cookie: &str) -> (StatusCode, String) {
    let r = http()
        .get(format!("{}{path}", node.base))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    (r.status(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_is_sent_once_by_two_nodes_and_logins_and_events_are_shared() {
    let pg = Postgres::start().unwrap();
    let mut smtp = smtp_server::start(smtp_server::Options::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let smtp_url = format!("smtp://{}", smtp.addr);
    let env = [
        ("ESTAFETA_READY_TIMEOUT", "1s"),
        ("ESTAFETA_ALERT_RETRY", "1s"),
        ("ESTAFETA_ALERT_EMAIL", "ops@example.org"),
        ("ESTAFETA_SMTP_URL", smtp_url.as_str()),
    ];
    let [(a, admin_a), (b, admin_b)] = two_nodes(&pg, dir.path(), &env).await;

    // A process left READY_TO_COMMIT goes in doubt at its deadline,
    // whichever node acts on it.
    let t = Tenancy::provision(&admin_a).await;
    let (pid, _) = ready_process(&t, ResultStatus::Processed).await;
    let mut in_doubt = false;
    for _ in 0..6000 {
        if admin_b.process(&pid).await.unwrap().state == ProcessState::InDoubt {
            in_doubt = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(in_doubt, "the process did not go in doubt");

    let mail = next(&mut smtp.received).await;
    assert!(
        mail.data.contains(&format!("in_doubt:{pid}")),
        "{}",
        mail.data
    );
    // Once the delivery is gone from the store, no node can send it again:
    // one e-mail in all.
    let db = estafeta_postgres::Store::connect(&pg.url()).unwrap();
    wait_count(
        &db,
        "SELECT count(*) FROM repeat_entries WHERE source = 'alerts'",
        0,
    )
    .await;
    assert!(smtp.received.try_recv().is_err(), "a second e-mail arrived");
    let client = db.client().await.unwrap();
    let recorded: i64 = client
        .query_one(
            "SELECT count(*) FROM alerts WHERE key = $1",
            &[&format!("in_doubt:{pid}")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, 1);

    // A login through A is a login on B, which lists the alert.
    let cookie = login(&a).await;
    let (status, alerts) = page(&b, "/admin/alerts", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(alerts.contains(&pid.to_string()), "{alerts}");
    let (status, _) = page(&b, "/admin/alerts", "estafeta_admin=unknown").await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "no session: to the login form"
    );
    // The event log is the cluster's: B's events page shows A's login.
    let mut shown = false;
    for _ in 0..6000 {
        let (status, events) = page(&b, "/admin/events", &cookie).await;
        assert_eq!(status, StatusCode::OK);
        if events.contains("dashboard login") {
            shown = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(shown, "A's login is not in B's event log");

    a.terminate().await;
    b.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrival_is_pushed_once_by_two_nodes() {
    let pg = Postgres::start().unwrap();
    let (hook, mut hits) = recorder::start().await;
    let dir = tempfile::tempdir().unwrap();
    let [(a, admin_a), (b, _)] = two_nodes(&pg, dir.path(), &[]).await;
    let t = Tenancy::provision(&admin_a).await;
    // Set through A, which also takes the uploads; either node sends.
    set_webhook(&a, "db-a", Some(format!("http://{hook}/hook"))).await;

    // Once the notification is gone from the store, no node can send it
    // again: one POST per arrival.
    let db = estafeta_postgres::Store::connect(&pg.url()).unwrap();
    for _ in 1..=2 {
        let hit = pushed_once(&t.phone1, "db-a", &mut hits, &db).await;
        assert_eq!(hit.uri, "/hook");
    }
    a.terminate().await;
    b.terminate().await;
}

/// `GET /v1/admin/stats` on `base` with `token`, from `client` behind the
/// proxy the nodes trust (the test itself, on 127.0.0.1).
async fn stats_from(base: &str, client: &str, token: &str) -> StatusCode {
    http()
        .get(format!("{base}/v1/admin/stats"))
        .header("x-forwarded-for", client)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_gave_wrong_tokens_to_one_node_waits_on_the_other() {
    use estafeta_server::throttle::FREE_FAILURES;
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let proxy = [("ESTAFETA_TRUSTED_PROXIES", "127.0.0.1")];
    let [(a, _), (b, _)] = two_nodes(&pg, dir.path(), &proxy).await;

    let attacker = "203.0.113.1";
    for _ in 0..FREE_FAILURES {
        assert_eq!(
            stats_from(&a.base, attacker, "guess").await,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        stats_from(&a.base, attacker, "guess").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let failures = r#"estafeta_auth_failures_total{via="bearer"}"#;
    assert_eq!(
        common::metric(&a.base, failures).await,
        Some(f64::from(FREE_FAILURES))
    );
    // B has seen no wrong token itself; once it has learned A's counts, the
    // address has no free tries left there either: at most one more wrong
    // token is looked at (when A's wait has run out meanwhile) before B
    // makes it wait. On its own, B would look at `FREE_FAILURES` of them.
    common::wait_metric(&b.base, "estafeta_auth_failing_addresses", 1.0).await;
    assert_eq!(common::metric(&b.base, failures).await, Some(0.0));
    let mut looked_at = 0;
    loop {
        match stats_from(&b.base, attacker, "guess").await {
            StatusCode::UNAUTHORIZED => looked_at += 1,
            StatusCode::TOO_MANY_REQUESTS => break,
            other => panic!("{other}"),
        }
        assert!(looked_at < FREE_FAILURES, "B gave the address free tries");
    }
    // Other addresses are not affected.
    assert_eq!(
        stats_from(&b.base, "198.51.100.7", common::ADMIN_TOKEN).await,
        StatusCode::OK
    );
    a.terminate().await;
    b.terminate().await;
}
