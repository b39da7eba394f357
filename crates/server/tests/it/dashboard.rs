//! The dashboard over real HTTP: login into a session cookie and its
//! flags, no page or action without a session, no action without the CSRF
//! token, every page renders, the operator actions on `Error`, and the
//! send queue and delivery pages showing a push that waits for its host.

use crate::common;
use crate::common::{
    ADMIN_TOKEN, Store, Tenancy, TestServer, committed_process, http, listed, ready_process,
    set_cookie,
};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{ProcessState, ResultStatus};
use estafeta_exchange::{MessageId, ProcessId};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION};

/// Every page of the dashboard.
const PAGES: [&str; 11] = [
    "/admin",
    "/admin/processes",
    "/admin/databases",
    "/admin/devices",
    "/admin/browse/Unknown",
    "/admin/browse/Error",
    "/admin/alerts",
    "/admin/events",
    "/admin/events?level=WARN&db=db-a",
    "/admin/queues",
    "/admin/deliveries",
];

/// The value of the first hidden field `name` in a page.
fn field(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} field"))
        + marker.len();
    html[start..].split('"').next().unwrap().to_owned()
}

/// A logged-in session: its cookie header value and CSRF token.
struct Session {
    cookie: String,
    csrf: String,
}

impl Session {
    /// `GET path` on `server` in this session.
    async fn get(&self, server: &TestServer, path: &str) -> reqwest::Response {
        http()
            .get(server.url(path))
            .header(COOKIE, &self.cookie)
            .send()
            .await
            .unwrap()
    }

    /// The HTML of `path` on `server` in this session.
    async fn page(&self, server: &TestServer, path: &str) -> String {
        self.get(server, path).await.text().await.unwrap()
    }

    /// Posts to `path` on `server` in this session the form of its CSRF
    /// token followed by `more` (`&outcome=commit`).
    async fn act(&self, server: &TestServer, path: &str, more: &str) -> reqwest::Response {
        let body = format!("csrf={}{more}", self.csrf);
        post(server, path, Some(&self.cookie), &body).await
    }
}

async fn login_with(server: &TestServer, token: &str, extra: &[(&str, &str)]) -> reqwest::Response {
    let http = http();
    let form = http.get(server.url("/admin/login")).send().await.unwrap();
    assert_eq!(form.status(), StatusCode::OK);
    let (nonce, _) = set_cookie(&form, "estafeta_login").unwrap();
    let html = form.text().await.unwrap();
    assert_eq!(field(&html, "nonce"), nonce);
    let mut req = http
        .post(server.url("/admin/login"))
        .header(COOKIE, format!("estafeta_login={nonce}"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("token={token}&nonce={nonce}"));
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

async fn login(server: &TestServer) -> Session {
    let r = login_with(server, ADMIN_TOKEN, &[]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let (id, _) = set_cookie(&r, "estafeta_admin").unwrap();
    let cookie = format!("estafeta_admin={id}");
    let page = http()
        .get(server.url("/admin"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let csrf = field(&page.text().await.unwrap(), "csrf");
    Session { cookie, csrf }
}

async fn post(
    server: &TestServer,
    path: &str,
    cookie: Option<&str>,
    body: &str,
) -> reqwest::Response {
    let mut req = http()
        .post(server.url(path))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(body.to_owned());
    if let Some(c) = cookie {
        req = req.header(COOKIE, c);
    }
    req.send().await.unwrap()
}

async fn nothing_admin_only_is_reachable_without_a_login(store: Store) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    let (pid, _) = ready_process(&t, ResultStatus::Processed).await;
    for page in PAGES
        .iter()
        .chain(&["/admin/browse/Error/db-a/01JD6Y0000000000000000000A"])
    {
        let r = http().get(server.url(page)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{page}");
        assert_eq!(r.headers()[LOCATION], "/admin/login", "{page}");
        let forged = http()
            .get(server.url(page))
            .header(COOKIE, "estafeta_admin=not-a-session")
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), StatusCode::SEE_OTHER, "{page}");
    }
    let actions = [
        format!("/admin/processes/{pid}/settle"),
        "/admin/alerts/1-1/ack".to_owned(),
        "/admin/browse/Error/db-a/01JD6Y0000000000000000000A/requeue".to_owned(),
        "/admin/logout".to_owned(),
    ];
    for action in &actions {
        let r = post(&server, action, None, "csrf=x&outcome=commit").await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{action}");
    }
    // The admin token as a bearer header is not a dashboard session.
    let r = http()
        .get(server.url("/admin/processes"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    // Nothing was settled.
    let p = server.admin.process(&pid).await.unwrap();
    assert_eq!(
        p.state,
        estafeta_exchange::wire::ProcessState::ReadyToCommit
    );
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test]
    nothing_admin_only_is_reachable_without_a_login
);

async fn login_opens_a_strict_http_only_session(store: Store) {
    let server = TestServer::start_on(store).await;
    let wrong = login_with(&server, "not-the-token", &[]).await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(set_cookie(&wrong, "estafeta_admin").is_none());
    assert!(wrong.text().await.unwrap().contains("not the admin token"));

    // Without the form's nonce (a cross-site login attempt): refused.
    let r = post(
        &server,
        "/admin/login",
        None,
        &format!("token={ADMIN_TOKEN}"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(set_cookie(&r, "estafeta_admin").is_none());

    let ok = login_with(&server, ADMIN_TOKEN, &[]).await;
    assert_eq!(ok.status(), StatusCode::SEE_OTHER);
    assert_eq!(ok.headers()[LOCATION], "/admin");
    let (id, header) = set_cookie(&ok, "estafeta_admin").unwrap();
    assert!(id.len() >= 32, "a random session id: {id}");
    assert!(header.contains("HttpOnly"), "{header}");
    assert!(header.contains("SameSite=Strict"), "{header}");
    assert!(header.contains("Path=/admin"), "{header}");
    assert!(!header.contains("Secure"), "plain HTTP: {header}");
    assert!(!header.contains(ADMIN_TOKEN));

    let tls = login_with(&server, ADMIN_TOKEN, &[("x-forwarded-proto", "https")]).await;
    let (other, header) = set_cookie(&tls, "estafeta_admin").unwrap();
    assert!(header.contains("; Secure"), "{header}");
    assert_ne!(other, id, "each login its own session");
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test]
    login_opens_a_strict_http_only_session
);

async fn every_page_renders_with_protective_headers(store: Store) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    ready_process(&t, ResultStatus::ProcessedIncorrect).await;
    let s = login(&server).await;
    for page in PAGES {
        let r = s.get(&server, page).await;
        assert_eq!(r.status(), StatusCode::OK, "{page}");
        let csp = r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert_eq!(r.headers()["x-frame-options"], "DENY");
        let html = r.text().await.unwrap();
        assert!(html.contains("/admin/static/app.js"), "{page}");
        assert_eq!(field(&html, "csrf"), s.csrf, "{page}");
    }
    let processes = s.page(&server, "/admin/processes").await;
    assert!(
        processes.contains("class=\"warn\""),
        "READY_TO_COMMIT stands out"
    );
    assert!(processes.contains("READY_TO_COMMIT"));
    let devices = s.page(&server, "/admin/devices").await;
    let row = |html: &str, id: &str| {
        let start = html.find(&format!("id=\"{id}\"")).unwrap();
        html[start..html[start..].find("</tr>").unwrap() + start].to_owned()
    };
    assert!(
        row(&devices, "device-phone-1").contains(" ago"),
        "{devices}"
    );
    assert!(
        row(&devices, "device-phone-x").contains("not since"),
        "{devices}"
    );
    let databases = s.page(&server, "/admin/databases").await;
    // db-a: one message in Messages (in the process), one reply in Prepared.
    let db_a = row(&databases, "db-db-a");
    assert!(db_a.contains("<td>db-a</td><td>1</td><td>1</td>"), "{db_a}");
    let bad = s.get(&server, "/admin/browse/Messages").await;
    assert_eq!(bad.status(), StatusCode::NOT_FOUND);
    let bad = s.get(&server, "/admin/events?since=yesterday").await;
    assert!(bad.text().await.unwrap().contains("filter-error"));
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test]
    every_page_renders_with_protective_headers
);

/// A server on `store` where `db-a` committed a process that marked its
/// one message PROCESSED_INCORRECT, which is now in `Error`; the process,
/// the message and a logged-in session.
async fn message_in_error(store: Store) -> (TestServer, ProcessId, MessageId, Session) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    let (pid, incorrect) = committed_process(&t, ResultStatus::ProcessedIncorrect).await;
    let s = login(&server).await;
    (server, pid, incorrect, s)
}

async fn actions_without_the_csrf_token_are_refused_and_change_nothing(store: Store) {
    let (server, pid, incorrect, s) = message_in_error(store).await;
    let requeue = format!("/admin/browse/Error/db-a/{incorrect}/requeue");
    for body in ["", "csrf=", "csrf=wrong"] {
        let r = post(&server, &requeue, Some(&s.cookie), body).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{body:?}");
        let r = post(&server, "/admin/logout", Some(&s.cookie), body).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{body:?}");
    }
    let error = listed(&server.admin, "db-a", Folder::Error).await;
    assert_eq!(error.len(), 1, "still in Error");

    // With the token: requeued into Messages.
    let r = s.act(&server, &requeue, "").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(
        r.headers()[LOCATION]
            .to_str()
            .unwrap()
            .starts_with("/admin/browse/Error?notice=")
    );
    let error = listed(&server.admin, "db-a", Folder::Error).await;
    assert!(error.is_empty());
    let queue = listed(&server.admin, "db-a", Folder::Messages).await;
    assert_eq!(queue, [incorrect]);

    // Settling a process that is not in doubt is refused with a reason.
    let r = s
        .act(
            &server,
            &format!("/admin/processes/{pid}/settle"),
            "&outcome=commit",
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("not in doubt"));

    // Logout ends the session.
    let r = s.act(&server, "/admin/logout", "").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = s.get(&server, "/admin").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test]
    actions_without_the_csrf_token_are_refused_and_change_nothing
);

async fn a_message_in_error_is_shown_and_discarded(store: Store) {
    let (server, _, incorrect, s) = message_in_error(store).await;
    let view = format!("/admin/browse/Error/db-a/{incorrect}");
    let r = s.get(&server, &view).await;
    assert_eq!(r.status(), StatusCode::OK);
    let html = r.text().await.unwrap();
    assert!(
        html.contains("&quot;order&quot;: 1") || html.contains("&#34;order&#34;: 1"),
        "{html}"
    );
    // Unconfirmed: a confirmation page, nothing deleted.
    let r = s.act(&server, &format!("{view}/discard"), "").await;
    assert_eq!(r.status(), StatusCode::OK);
    let confirm = r.text().await.unwrap();
    assert!(confirm.contains("id=\"confirm-yes\""), "{confirm}");
    assert!(
        confirm.contains("name=\"confirm\" value=\"yes\""),
        "{confirm}"
    );
    let error = listed(&server.admin, "db-a", Folder::Error).await;
    assert_eq!(error.len(), 1, "still in Error until confirmed");
    let r = s
        .act(&server, &format!("{view}/discard"), "&confirm=yes")
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let notice = r.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(
        notice.ends_with(&format!("{incorrect}+discarded")),
        "{notice}"
    );
    for folder in [Folder::Error, Folder::Messages] {
        assert!(listed(&server.admin, "db-a", folder).await.is_empty());
    }
    let r = s.get(&server, &view).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test]
    a_message_in_error_is_shown_and_discarded
);

async fn an_in_doubt_process_is_settled_as_rolled_back_not_moved_by_hand(store: Store) {
    let server = TestServer::start_custom(store, estafeta_server::HttpSettings::default(), |c| {
        c.ready_timeout = std::time::Duration::from_millis(200);
    })
    .await;
    let t = Tenancy::provision(&server.admin).await;
    let (pid, mid) = ready_process(&t, ResultStatus::Processed).await;
    let mut state = None;
    for _ in 0..500 {
        state = Some(server.admin.process(&pid).await.unwrap().state);
        if state == Some(ProcessState::InDoubt) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(state, Some(ProcessState::InDoubt));
    let s = login(&server).await;

    // Its files are the process's: no requeue or discard by hand.
    let view = format!("/admin/browse/Unknown/db-a/{mid}");
    let html = s.page(&server, &view).await;
    assert!(
        html.contains(&format!("Held by process in doubt <code>{pid}</code>")),
        "{html}"
    );
    for action in ["requeue", "discard"] {
        let r = s
            .act(&server, &format!("{view}/{action}"), "&confirm=yes")
            .await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{action}");
    }
    assert_eq!(
        listed(&server.admin, "db-a", Folder::Unknown).await.len(),
        2
    );

    let settle = format!("/admin/processes/{pid}/settle");
    let r = s.act(&server, &settle, "&outcome=maybe").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = s.act(&server, &settle, "&outcome=rollback").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        server.admin.process(&pid).await.unwrap().state,
        ProcessState::RolledBack
    );
    assert!(
        listed(&server.admin, "db-a", Folder::Unknown)
            .await
            .is_empty()
    );
    let queue = listed(&server.admin, "db-a", Folder::Messages).await;
    assert_eq!(queue, [mid], "back in the queue");
    assert!(
        t.phone1.inbox(None).await.unwrap().messages.is_empty(),
        "the reply was deleted"
    );
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test]
    an_in_doubt_process_is_settled_as_rolled_back_not_moved_by_hand
);

/// Fetches `path` until `done` holds for its HTML (the figures are live).
async fn wait_page(
    server: &TestServer,
    s: &Session,
    path: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let poll = async {
        loop {
            let html = s.page(server, path).await;
            if done(&html) {
                return html;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), poll)
        .await
        .unwrap_or_else(|_| panic!("{path} did not show what was expected"))
}

/// The `<tr>` holding `marker`.
fn row_with<'a>(html: &'a str, marker: &str) -> &'a str {
    let at = html.find(marker).unwrap_or_else(|| panic!("no {marker}"));
    let start = html[..at].rfind("<tr").unwrap();
    let end = at + html[at..].find("</tr>").unwrap();
    &html[start..end]
}

async fn queue_and_delivery_pages_show_a_push_waiting_for_its_host(store: Store) {
    use estafeta_server::notify::NotifySettings;
    let server = TestServer::start_notified(
        store,
        estafeta_server::HttpSettings::default(),
        |_| {},
        |data| NotifySettings {
            retry: std::time::Duration::from_secs(3600),
            probe: std::time::Duration::from_millis(50),
            ..NotifySettings::log_only(data)
        },
    )
    .await;
    let t = Tenancy::provision(&server.admin).await;
    let s = login(&server).await;
    let empty = wait_page(&server, &s, "/admin/deliveries", |_| true).await;
    assert!(empty.contains("id=\"no-deliveries\""), "{empty}");
    assert!(
        wait_page(&server, &s, "/admin/queues", |_| true)
            .await
            .contains("id=\"no-hosts\"")
    );

    let hook = common::recorder::closed_port();
    let answer = http()
        .put(server.url("/v1/admin/databases/db-a/webhook"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({"version": 1, "url": format!("http://{hook}/db")}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    t.phone1
        .send(&common::message("db-a", "{}", None))
        .await
        .unwrap();
    let mut later = common::message("db-b", "{}", None);
    let tomorrow = server.exchange.now().as_millis() + 86_400_000;
    later.deliver_at = Some(estafeta_exchange::Timestamp::from_millis(tomorrow));
    t.phone1.send(&later).await.unwrap();

    // The push failed once (connection refused) and waits for its retry.
    // The failure's text is noted as the push fails, its retry once the
    // scheduler's move of the entry is written: the page is read until it
    // shows both.
    let page = wait_page(&server, &s, "/admin/deliveries", |html| {
        html.contains("data-source=\"push\"") && {
            let push = row_with(html, "data-source=\"push\"");
            !push.contains("<td class=\"last-error\"></td>")
                && push.contains("<td class=\"attempts\">1</td>")
        }
    })
    .await;
    let push = row_with(&page, "data-source=\"push\"");
    assert!(push.contains("<td class=\"attempts\">1</td>"), "{push}");
    assert!(push.contains("retrying"), "{push}");
    assert!(push.contains("database/db-a"), "{push}");
    let scheduled = row_with(&page, "data-source=\"deliver_at\"");
    assert!(scheduled.contains("scheduled"), "{scheduled}");
    assert!(row_with(&page, "id=\"source-push\"").contains("<td class=\"entries\">1</td>"));
    assert!(page.contains("data-live"), "the figures refresh live");

    // Its host fails its probes: down, in the send queue page.
    let host = format!("http://{hook}");
    let queues = wait_page(&server, &s, "/admin/queues", |html| {
        html.contains(&format!("data-host=\"{host}\" data-type=\"push\""))
            && row_with(html, &format!("data-host=\"{host}\" data-type=\"push\""))
                .contains(">down<")
    })
    .await;
    let probe = row_with(
        &queues,
        &format!("data-host=\"{host}\" data-type=\"probe\""),
    );
    assert!(probe.contains("class=\"bad\""), "{probe}");
    assert!(queues.contains("data-live"), "the figures refresh live");
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    queue_and_delivery_pages_show_a_push_waiting_for_its_host
);

/// The overview's open count, the `estafeta_alerts_open` metric and the
/// alerts page read the notifier's one store: acknowledging moves all of
/// them, a condition that goes on is not a new alert (acknowledged or
/// not), and once it ended the same condition is news again.
async fn acknowledging_and_the_open_count_read_one_alert_store(store: Store) {
    use estafeta_exchange::{Alert, AlertKind};
    let server = TestServer::start_on(store).await;
    let s = login(&server).await;
    let open_count = || async {
        let overview = s.page(&server, "/admin").await;
        let at = overview.find("id=\"alerts-open\">").unwrap() + "id=\"alerts-open\">".len();
        let shown: u64 = overview[at..].split('<').next().unwrap().parse().unwrap();
        let metrics = server.admin.metrics().await.unwrap();
        let metric: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("estafeta_alerts_open "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(shown, metric, "the overview and /metrics agree");
        shown
    };
    let raise = |text: &'static str| {
        let alert = Alert::new(
            AlertKind::HostDown,
            "http://gw:80",
            text,
            server.exchange.now(),
        );
        server.exchange.raise_alert(alert)
    };
    assert_eq!(open_count().await, 0);

    raise("the gateway is down").await;
    assert_eq!(open_count().await, 1);
    let alerts = s.page(&server, "/admin/alerts").await;
    assert!(alerts.contains("<td>http://gw:80</td>"), "{alerts}");
    let r = s.act(&server, "/admin/alerts/1/ack", "").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(open_count().await, 0);
    let r = s.act(&server, "/admin/alerts/99/ack", "").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // Still down: the same condition again is neither sent nor listed again.
    raise("still down").await;
    assert_eq!(open_count().await, 0);
    let alerts = s.page(&server, "/admin/alerts").await;
    assert!(!alerts.contains("still down"), "{alerts}");
    assert!(alerts.contains("going on"), "{alerts}");

    // It ended; when it happens again it is a new alert.
    server
        .exchange
        .clear_alert("host_down:http://gw:80".to_owned())
        .await;
    raise("down again").await;
    assert_eq!(open_count().await, 1);
    let alerts = s.page(&server, "/admin/alerts").await;
    assert!(alerts.contains("id=\"alert-2\""), "{alerts}");
    assert!(row_with(&alerts, "id=\"alert-1\"").contains("<span class=\"acked\">"));
    assert!(
        !row_with(&alerts, "id=\"alert-1\"").contains("going on"),
        "alert 1 ended"
    );

    // The admin API lists the same store, newest first.
    let listed = server.admin.alerts().await.unwrap().alerts;
    let summary: Vec<_> = listed
        .iter()
        .map(|a| {
            (
                a.id,
                a.key.as_str(),
                a.ended_at.is_some(),
                a.acknowledged_at.is_some(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (2, "host_down:http://gw:80", false, false),
            (1, "host_down:http://gw:80", true, true),
        ]
    );
    assert_eq!(listed[1].text, "the gateway is down");
    let refused = server.client("not-a-token").alerts().await.unwrap_err();
    assert!(refused.to_string().contains("401"), "{refused}");
    server.stop().await.unwrap();
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    acknowledging_and_the_open_count_read_one_alert_store
);

/// The event log page reads the event store: filtered by database,
/// message and request id, a page at a time with a link to older events,
/// and each event shows the request it happened in. Embedded only: it
/// writes the records into the file the server reads (the cluster's log
/// is read across nodes in `cluster_alerts`).
#[tokio::test]
async fn the_event_log_page_filters_and_pages_the_event_store() {
    use estafeta_server::events::{EventRecord, Retention};
    let server = TestServer::start().await;
    let s = login(&server).await;
    let store = &server.events;
    let now = chrono::Utc::now();
    let t0 = now.timestamp_nanos_opt().unwrap() as u64 - 3_600_000_000_000;
    let records: Vec<EventRecord> = (0..150u64)
        .map(|i| EventRecord {
            id: format!("{}-{i}", t0 + i * 1_000_000_000),
            ts: chrono::DateTime::from_timestamp_nanos((t0 + i * 1_000_000_000) as i64)
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            level: "INFO".to_owned(),
            target: "estafeta::event".to_owned(),
            text: format!("step-{i}"),
            db: Some(if i.is_multiple_of(2) { "db-a" } else { "db-b" }.to_owned()),
            device: None,
            process: None,
            message: Some(format!("msg-{i}")),
            request: Some(format!("req-{}", i / 10)),
            fields: Default::default(),
        })
        .collect();
    store
        .append(
            &records,
            &Retention::default(),
            now.timestamp_nanos_opt().unwrap() as u64,
        )
        .unwrap();
    let get = |path: String| {
        let req = http().get(server.url(&path)).header(COOKIE, &s.cookie);
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            r.text().await.unwrap()
        }
    };
    let steps = |html: &str| -> Vec<u64> {
        html.split("<td>step-")
            .skip(1)
            .map(|rest| rest.split('<').next().unwrap().parse().unwrap())
            .collect()
    };

    // Newest first, 100 a page, then the older ones behind the link.
    let first = get("/admin/events".to_owned()).await;
    let shown = steps(&first);
    assert_eq!(shown.len(), 100);
    assert_eq!((shown[0], shown[99]), (149, 50));
    let marker = "id=\"older\" href=\"";
    let at = first.find(marker).expect("a link to older events") + marker.len();
    let older = first[at..].split('"').next().unwrap().replace("&amp;", "&");
    let second = get(older).await;
    assert_eq!(steps(&second), (0..50).rev().collect::<Vec<u64>>());

    // By database, message and request; the request id is shown.
    let db_b = steps(&get("/admin/events?db=db-b".to_owned()).await);
    assert_eq!(db_b.len(), 75);
    assert!(db_b.iter().all(|i| i % 2 == 1));
    let one = get("/admin/events?message=msg-42".to_owned()).await;
    assert_eq!(steps(&one), [42]);
    assert!(one.contains("<td class=\"request\">req-4</td>"), "{one}");
    let request = steps(&get("/admin/events?request=req-3&db=db-a".to_owned()).await);
    assert_eq!(request, [38, 36, 34, 32, 30]);
    server.stop().await.unwrap();
}
