//! Alerts reach administrators: a real SMTP server, SMS gateway and webhook
//! on loopback; a gateway that is down gets its alert once it is back, also
//! across a restart of the real `estafeta` binary.

use std::path::Path;
use std::time::Duration;

use crate::common;
use crate::common::broken_folder::BrokenFolder;
use crate::common::recorder::{self, Hit};
use crate::common::{
    Binary, PATIENCE, Store, Tenancy, TestServer, message, next, processed, quick_retry,
    start_request,
};
use estafeta_client::Client;
use estafeta_exchange::wire::{CallStatus, PrepareRequest, ProcessState, Version};
use estafeta_exchange::{Alert, AlertKind, ProcessId};
use estafeta_sendq::{SmsConfig, SmtpConfig};
use estafeta_server::HttpSettings;
use estafeta_server::notify::{EmailChannel, NotifySettings, SmsChannel};
use estafeta_test_support::smtp_server::{self, Received};

/// Puts a process of `db-a` in READY_TO_COMMIT (which the short ready
/// timeout of these tests then turns into IN_DOUBT); its id.
async fn ready_to_commit(t: &Tenancy) -> ProcessId {
    t.phone1
        .send(&message("db-a", r#"{"n":1}"#, None))
        .await
        .unwrap();
    let started = t.db_a.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let messages = started.messages.unwrap();
    let prepare = PrepareRequest {
        version: Version,
        results: messages.iter().map(|m| processed(m.id)).collect(),
        replies: vec![],
    };
    assert_eq!(
        t.db_a.prepare(&pid, &prepare).await.unwrap().status,
        CallStatus::Ok
    );
    pid
}

/// An SMS channel through the gateway at `url` to one number, +15550100.
fn sms_to(url: String) -> Option<SmsChannel> {
    let gateway = SmsConfig {
        url,
        ..SmsConfig::default()
    };
    Some(SmsChannel {
        gateway,
        to: vec!["+15550100".into()],
    })
}

/// A ready server on `store` whose alerts go out as `notify` (given the
/// data folder) says.
async fn start_alerting(store: Store, notify: impl FnOnce(&Path) -> NotifySettings) -> TestServer {
    TestServer::start_notified(store, HttpSettings::default(), |_| {}, notify).await
}

/// The JSON body of a request the recorder received.
fn json_body(hit: &Hit) -> serde_json::Value {
    serde_json::from_str(&hit.body).unwrap()
}

/// Waits until the process is IN_DOUBT (the alert is scheduled durably by then).
async fn wait_in_doubt(client: &Client, pid: &ProcessId) {
    for _ in 0..6000 {
        if client.process(pid).await.unwrap().state == ProcessState::InDoubt {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the process did not go in doubt");
}

async fn an_in_doubt_process_alerts_by_email_once_and_by_sms_and_webhook(store: Store) {
    let mut smtp = smtp_server::start(smtp_server::Options::default()).await;
    let (sms_addr, mut sms) = recorder::start().await;
    let (hook_addr, mut hook) = recorder::start().await;
    let smtp_addr = smtp.addr;
    let server = TestServer::start_notified(
        store,
        HttpSettings::default(),
        |c| c.ready_timeout = Duration::from_secs(1),
        |data| NotifySettings {
            email: Some(EmailChannel {
                smtp: SmtpConfig {
                    url: format!("smtp://{smtp_addr}"),
                    root_certificate_pem: None,
                    from: "estafeta@localhost".into(),
                    timeout: Duration::from_secs(10),
                },
                to: vec!["ops@example.org".into()],
            }),
            sms: sms_to(format!("http://{sms_addr}/send")),
            webhook: Some(format!("http://{hook_addr}/alerts")),
            ..quick_retry(data)
        },
    )
    .await;
    let t = Tenancy::provision(&server.admin).await;
    let pid = ready_to_commit(&t).await;

    let mail: Received = next(&mut smtp.received).await;
    assert_eq!(mail.to, vec!["ops@example.org"]);
    assert!(
        mail.data.contains(&format!("in_doubt:{pid}")),
        "{}",
        mail.data
    );
    let text: Hit = next(&mut sms).await;
    assert_eq!(text.uri, "/send");
    let body = json_body(&text);
    assert_eq!(body["to"], "+15550100");
    assert!(body["text"].as_str().unwrap().contains(&pid.to_string()));
    let call = next(&mut hook).await;
    assert_eq!(call.uri, "/alerts");
    let body = json_body(&call);
    assert_eq!(body["alert"]["key"], format!("in_doubt:{pid}"));
    assert_eq!(body["alert"]["kind"], "in_doubt");

    // The same condition again (as a second detection would raise it) is
    // not news; a marker alert raised after it shows the mail queue has
    // drained past where a duplicate would be.
    let now = server.exchange.now();
    let again = Alert::new(AlertKind::InDoubt, pid, "again", now);
    server.exchange.raise_alert(again).await;
    let marker = Alert::new(AlertKind::DiskLow, "marker", "marker", now);
    server.exchange.raise_alert(marker).await;
    let second = next(&mut smtp.received).await;
    assert!(second.data.contains("disk_low:marker"), "{}", second.data);
    assert!(smtp.received.try_recv().is_err(), "a second e-mail arrived");

    // Settled, the condition ends: the same key would alert again.
    assert_eq!(t.db_a.commit(&pid).await.unwrap().status, CallStatus::Ok);
    let again = Alert::new(
        AlertKind::InDoubt,
        pid,
        "back in doubt",
        server.exchange.now(),
    );
    server.exchange.raise_alert(again).await;
    let third = next(&mut smtp.received).await;
    assert!(third.data.contains("back in doubt"), "{}", third.data);
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    an_in_doubt_process_alerts_by_email_once_and_by_sms_and_webhook
);

async fn a_gateway_that_is_down_gets_the_alert_once_it_is_back(store: Store) {
    let gateway = recorder::closed_port();
    let server = start_alerting(store, |data| NotifySettings {
        sms: sms_to(format!("http://{gateway}/send?to={{recipient}}")),
        ..quick_retry(data)
    })
    .await;
    let alert = Alert::new(
        AlertKind::DiskLow,
        "data",
        "disk is low",
        server.exchange.now(),
    );
    server.exchange.raise_alert(alert).await;
    // The first attempt meets a closed port and fails; the gateway comes up
    // and a retry reaches it.
    let listener = tokio::net::TcpListener::bind(gateway).await.unwrap();
    let mut sms = recorder::serve(listener);
    let hit = next(&mut sms).await;
    assert!(hit.body.contains("disk is low"), "{}", hit.body);
    assert!(hit.uri.contains("15550100"), "{}", hit.uri);
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_gateway_that_is_down_gets_the_alert_once_it_is_back
);

async fn a_pending_alert_survives_a_restart_of_the_binary(store: Store) {
    let store = store.setting();
    let cwd = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let hook = recorder::closed_port();
    let url = format!("http://{hook}/hook");
    let env = [
        ("ESTAFETA_ADMIN_TOKEN", common::ADMIN_TOKEN),
        ("ESTAFETA_READY_TIMEOUT", "1s"),
        ("ESTAFETA_ALERT_RETRY", "1s"),
        ("ESTAFETA_DISK_ALERT_MB", "0"),
        ("ESTAFETA_ALERT_WEBHOOK", url.as_str()),
    ];
    let first = Binary::serve_on(store.as_deref(), cwd.path(), data.path(), &[], &env).await;
    let admin = Client::new(&first.base, common::ADMIN_TOKEN).unwrap();
    common::wait_ready(&admin).await;
    let t = Tenancy::provision(&admin).await;
    let pid = ready_to_commit(&t).await;
    wait_in_doubt(&admin, &pid).await;
    assert_eq!(first.terminate().await, Some(0));

    // The webhook comes up while the server is down; the restarted server
    // delivers what was pending.
    let mut hits = recorder::serve(tokio::net::TcpListener::bind(hook).await.unwrap());
    let second = Binary::serve_on(store.as_deref(), cwd.path(), data.path(), &[], &env).await;
    // The server's health probes (on by default) GET the origin, `/`.
    let hit = loop {
        let hit = next(&mut hits).await;
        if hit.uri != "/" {
            break hit;
        }
    };
    assert_eq!(hit.uri, "/hook");
    let body = json_body(&hit);
    assert_eq!(body["alert"]["key"], format!("in_doubt:{pid}"));
    assert_eq!(second.terminate().await, Some(0));
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_pending_alert_survives_a_restart_of_the_binary
);

async fn free_disk_under_the_threshold_alerts(store: Store) {
    let (hook_addr, mut hook) = recorder::start().await;
    let server = start_alerting(store, |data| NotifySettings {
        webhook: Some(format!("http://{hook_addr}/")),
        disk_alert_bytes: u64::MAX,
        ..quick_retry(data)
    })
    .await;
    let call = next(&mut hook).await;
    let body = json_body(&call);
    assert_eq!(body["alert"]["kind"], "disk_low");
    assert_eq!(body["alert"]["key"], "disk_low:data");
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    free_disk_under_the_threshold_alerts
);

/// Embedded only: it breaks a mailbox folder of the data folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_storage_write_alerts_once_until_writes_succeed_again() {
    let (hook_addr, mut hook) = recorder::start().await;
    let server = start_alerting(Store::Embedded, |data| NotifySettings {
        webhook: Some(format!("http://{hook_addr}/")),
        ..quick_retry(data)
    })
    .await;
    let t = Tenancy::provision(&server.admin).await;
    // db-a's queue folder (made with its first file) is a file instead:
    // every write there fails.
    let queue = server.data.path().join("db-a/Messages");
    let upload = message("db-a", "{}", None);
    let broken = BrokenFolder::new(&queue);
    for _ in 0..2 {
        assert!(t.phone1.send(&upload).await.is_err());
    }
    let call = next(&mut hook).await;
    let body = json_body(&call);
    assert_eq!(body["alert"]["key"], "storage_write:data");

    // A good write ends the condition; the next failure is news again, and
    // a marker raised before it shows that the second failed upload above
    // sent nothing.
    broken.mend();
    t.phone1.send(&upload).await.unwrap();
    let marker = Alert::new(
        AlertKind::DiskLow,
        "marker",
        "marker",
        server.exchange.now(),
    );
    server.exchange.raise_alert(marker).await;
    let call = next(&mut hook).await;
    assert!(call.body.contains("disk_low:marker"), "{}", call.body);
    let broken = BrokenFolder::new(&queue);
    assert!(t.phone1.send(&upload).await.is_err());
    let call = next(&mut hook).await;
    assert!(call.body.contains("storage_write:data"), "{}", call.body);
    assert!(hook.try_recv().is_err());
    broken.mend();
    server.stop().await.unwrap();
}

/// Whether the alert `key` is open, as the admin API lists the alerts.
async fn open_alert(admin: &Client, key: &str) -> bool {
    let alerts = admin.alerts().await.unwrap().alerts;
    alerts.iter().any(|a| a.key == key && a.ended_at.is_none())
}

/// The real binary killed (`kill -9`) while its storage-write alert is
/// open: the next run closes it at its first good write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_write_alert_left_open_by_a_killed_run_ends_at_the_next_good_write() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Binary::serve(dir.path(), &data, &[], &[]).await;
    let token = server.printed_token.clone().unwrap();
    let admin = Client::new(&server.base, &token).unwrap();
    let (_, phone) = common::provision_one(&admin).await;
    let upload = message("db-a", "{}", None);
    let phone1 = Client::new(&server.base, &phone).unwrap();
    phone1.send(&upload).await.unwrap();
    // db-a's queue folder is a file instead: every write there fails.
    let broken = BrokenFolder::new(&data.join("db-a/Messages"));
    assert!(phone1.send(&upload).await.is_err());
    assert!(open_alert(&admin, "storage_write:data").await);
    server.kill9().await;

    broken.mend();
    let server = Binary::serve(dir.path(), &data, &[], &[]).await;
    let admin = Client::new(&server.base, &token).unwrap();
    common::wait_ready(&admin).await;
    let phone1 = Client::new(&server.base, &phone).unwrap();
    assert!(open_alert(&admin, "storage_write:data").await, "still open");
    phone1.send(&upload).await.unwrap();
    assert!(
        !open_alert(&admin, "storage_write:data").await,
        "closed by the good write"
    );
    server.terminate().await;
}

/// Waits (at most [`PATIENCE`]) until alert `key` is open or not, as `open`.
async fn until_alert(admin: &Client, key: &str, open: bool) {
    tokio::time::timeout(PATIENCE, async {
        while open_alert(admin, key).await != open {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{key} open: {}, wanted {open}", !open));
}

/// The real binary killed (`kill -9`) while its disk-space alert is open:
/// the next run, finding enough space, closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_alert_left_open_by_a_killed_run_ends_when_the_next_finds_space() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let low = [
        ("ESTAFETA_DISK_ALERT_MB", "100000000"),
        ("ESTAFETA_DISK_CHECK", "1s"),
    ];
    let server = Binary::serve(dir.path(), &data, &[], &low).await;
    let token = server.printed_token.clone().unwrap();
    let admin = Client::new(&server.base, &token).unwrap();
    until_alert(&admin, "disk_low:data", true).await;
    server.kill9().await;

    let enough = [
        ("ESTAFETA_DISK_ALERT_MB", "1"),
        ("ESTAFETA_DISK_CHECK", "1s"),
    ];
    let server = Binary::serve(dir.path(), &data, &[], &enough).await;
    let admin = Client::new(&server.base, &token).unwrap();
    until_alert(&admin, "disk_low:data", false).await;
    server.terminate().await;
}

async fn a_gateway_failing_its_probes_raises_a_host_down_alert(store: Store) {
    let gateway = recorder::closed_port();
    let (hook_addr, mut hook) = recorder::start().await;
    let server = start_alerting(store, |data| NotifySettings {
        sms: sms_to(format!("http://{gateway}/send")),
        webhook: Some(format!("http://{hook_addr}/alerts")),
        probe: Duration::from_millis(50),
        ..quick_retry(data)
    })
    .await;
    // The webhook host answers its probes (GETs) too; wait for the alert.
    let key = format!("host_down:http://{gateway}");
    let began = std::time::Instant::now();
    loop {
        assert!(began.elapsed() < PATIENCE, "no host_down alert");
        let hit = next(&mut hook).await;
        if hit.body.contains("host_down") {
            let body = json_body(&hit);
            assert_eq!(body["alert"]["key"], key);
            break;
        }
    }
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_gateway_failing_its_probes_raises_a_host_down_alert
);
