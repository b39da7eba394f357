//! The dashboard end to end in a real headless Chromium (Debian's
//! `chromium` and `chromium-driver`), driven over WebDriver by fantoccini,
//! against the real `estafeta serve` binary: log in, see a process
//! READY_TO_COMMIT, watch it go IN_DOUBT on the server's real clock (a
//! short ready timeout), settle it from the `Unknown` page, acknowledge the
//! alert; requests without a login or without the CSRF token are refused;
//! the event log names each step's request and fits the window.
//! And on the `Error` browser: a discard asks for confirmation (cancelled,
//! then confirmed), ticked messages are requeued together, and the whole
//! folder is discarded after its confirmation.
//! Every page is screenshotted (under the target's test temp folder) and
//! checked for JavaScript errors. If Chromium cannot run, the test fails.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common;
use crate::common::{Binary, Tenancy, committed_process, ready_process};
use estafeta_client::Client as ApiClient;
use estafeta_exchange::wire::{ProcessState, ResultStatus};
use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE};
use tokio::process::{Child, Command};

const TOKEN: &str = "browser-test-admin-token-0123456789";
/// How often a page is looked at again while waiting for the server.
const POLL: Duration = Duration::from_millis(250);
/// How many looks before giving up (the ready timeout is a few seconds).
const POLLS: usize = 240;

/// chromedriver on a free loopback port, killed when dropped.
struct Driver {
    _child: Child,
    url: String,
}

async fn start_driver() -> Driver {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("chromedriver cannot start ({e}): install Debian's chromium and chromium-driver")
        });
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..POLLS {
        if http.get(format!("{url}/status")).send().await.is_ok() {
            return Driver { _child: child, url };
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("chromedriver did not answer on {url}");
}

async fn browser(driver: &Driver, profile: &Path) -> Client {
    let caps = serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--window-size=1280,1000",
                format!("--user-data-dir={}", profile.display()),
            ],
        },
    });
    let serde_json::Value::Object(caps) = caps else {
        unreachable!()
    };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .unwrap_or_else(|e| panic!("headless Chromium did not start through chromedriver: {e}"))
}

/// Saves a screenshot of the page and fails on any JavaScript error the
/// page's script recorded (or if the script did not run at all).
async fn check_page(c: &Client, shots: &Path, name: &str) {
    let errors = c
        .execute(
            "return window.__estafetaErrors === undefined ? ['app.js did not run'] : window.__estafetaErrors;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(errors, serde_json::json!([]), "JavaScript errors on {name}");
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
    std::fs::write(shots.join(format!("{name}.png")), png).unwrap();
}

/// Waits (polling) until the browser shows `path`: a click that submits a
/// form may return before the next page has loaded.
async fn wait_path(c: &Client, path: &str) {
    let mut last = String::new();
    for _ in 0..POLLS {
        last = c.current_url().await.unwrap().path().to_owned();
        if last == path {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("the browser never reached {path}; it is on {last}");
}

/// Waits (polling) for an element of the next page and returns its text.
/// An element found on the page being left goes stale under the lookup:
/// that is polled over too.
async fn wait_text(c: &Client, id: &str) -> String {
    text(c, &format!("#{id}")).await
}

/// Waits (polling) until the element `id` says `want`: the page left
/// behind may show the same element with its own text for a moment.
async fn wait_contains(c: &Client, id: &str, want: &str) {
    let mut last = String::new();
    for _ in 0..POLLS {
        if let Ok(element) = c.find(Locator::Id(id)).await
            && let Ok(text) = element.text().await
        {
            if text.contains(want) {
                return;
            }
            last = text;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("#{id} never said {want:?}; it says {last:?}");
}

/// The text of the element `css` on the current page. The page may still
/// be replacing itself (a form's answer loading, its own refresh), which
/// makes an element found a moment ago stale: that is polled over.
async fn text(c: &Client, css: &str) -> String {
    for _ in 0..POLLS {
        if let Ok(element) = c.find(Locator::Css(css)).await
            && let Ok(text) = element.text().await
        {
            return text;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("{css} never had a text");
}

/// The `data-state` of a process row, reloading the page until `want`.
async fn wait_for_state(c: &Client, base: &str, pid: &str, want: &str) {
    let row = format!("#process-{pid}");
    let mut last = None;
    for _ in 0..POLLS {
        goto(c, base, "/admin/processes").await;
        if let Ok(el) = c.find(Locator::Css(&row)).await
            && let Ok(state) = el.attr("data-state").await
        {
            last = state;
            if last.as_deref() == Some(want) {
                return;
            }
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("process {pid} never showed {want}; last seen {last:?}");
}

/// The real binary with the admin token [`TOKEN`] (and `env`), its
/// tenancy provisioned, and a headless Chromium to look at its dashboard.
struct Dashboard {
    _work: tempfile::TempDir,
    server: Binary,
    admin: ApiClient,
    tenancy: Tenancy,
    shots: PathBuf,
    driver: Driver,
    c: Client,
}

impl Dashboard {
    /// Starts the binary with `env` added, provisions it and opens the
    /// browser.
    async fn start(env: &[(&str, &str)]) -> Dashboard {
        let work = tempfile::tempdir().unwrap();
        let data = work.path().join("data");
        let env = [&[("ESTAFETA_ADMIN_TOKEN", TOKEN)], env].concat();
        let server = Binary::serve(work.path(), &data, &[], &env).await;
        let admin = ApiClient::new(&server.base, TOKEN).unwrap();
        common::wait_ready(&admin).await;
        let tenancy = Tenancy::provision(&admin).await;
        let shots = screenshots();
        let driver = start_driver().await;
        let c = browser(&driver, &work.path().join("chromium-profile")).await;
        Dashboard {
            _work: work,
            server,
            admin,
            tenancy,
            shots,
            driver,
            c,
        }
    }

    /// Closes the browser and stops the server, which exits cleanly.
    async fn finish(self) {
        self.c.close().await.unwrap();
        drop(self.driver);
        assert_eq!(self.server.terminate().await, Some(0));
    }
}

fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_settles_an_in_doubt_process_in_a_real_browser() {
    let d = Dashboard::start(&[("ESTAFETA_READY_TIMEOUT", "5s")]).await;
    let (c, base, shots, tenancy) = (&d.c, d.server.base.as_str(), &d.shots, &d.tenancy);

    // Not logged in: the dashboard sends the browser to the login form.
    goto(c, base, "/admin/processes").await;
    assert!(
        c.current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/admin/login")
    );
    check_page(c, shots, "login").await;
    submit_login(c, "wrong").await;
    wait_contains(c, "login-error", "not the admin token").await;
    submit_login(c, TOKEN).await;
    wait_path(c, "/admin").await;
    assert_eq!(text(c, "#health").await, "ready");
    check_page(c, shots, "overview").await;

    // A process READY_TO_COMMIT shows, marked; then it goes IN_DOUBT.
    let (pid, _) = ready_process(tenancy, ResultStatus::Processed).await;
    let pid_text = pid.to_string();
    goto(c, base, "/admin/processes").await;
    let row = c
        .find(Locator::Css(&format!("#process-{pid_text}")))
        .await
        .unwrap();
    let seen = row.attr("data-state").await.unwrap();
    assert!(
        seen.as_deref() == Some("READY_TO_COMMIT") || seen.as_deref() == Some("IN_DOUBT"),
        "{seen:?}"
    );
    if seen.as_deref() == Some("READY_TO_COMMIT") {
        assert_eq!(row.attr("class").await.unwrap().as_deref(), Some("warn"));
        check_page(c, shots, "processes-ready-to-commit").await;
    }
    assert_eq!(
        seen.as_deref(),
        Some("READY_TO_COMMIT"),
        "the page was too slow to see READY_TO_COMMIT within the 5 s ready timeout"
    );
    wait_for_state(c, base, &pid_text, "IN_DOUBT").await;
    let row = c
        .find(Locator::Css(&format!("#process-{pid_text}")))
        .await
        .unwrap();
    assert_eq!(row.attr("class").await.unwrap().as_deref(), Some("bad"));
    check_page(c, shots, "processes-in-doubt").await;

    // The overview counts the open alert.
    goto(c, base, "/admin").await;
    assert_eq!(text(c, "#alerts-open").await, "1");
    check_page(c, shots, "overview-alert").await;

    // Settle it from the Unknown page, as committed.
    goto(c, base, "/admin/browse/Unknown").await;
    assert_eq!(
        c.find_all(Locator::Css("#files tr")).await.unwrap().len(),
        3,
        "header, message, reply"
    );
    check_page(c, shots, "unknown-in-doubt").await;
    // One message of the process, shown: it is the process's to move.
    c.find(Locator::Css("#files a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(wait_text(c, "message-body").await.contains("\"from\""));
    assert!(c.find(Locator::Id("settle-commit")).await.is_ok());
    assert!(c.find(Locator::Id("requeue")).await.is_err());
    check_page(c, shots, "message").await;
    goto(c, base, "/admin/browse/Unknown").await;
    click(c, &format!("settle-commit-{pid_text}")).await;
    wait_contains(c, "notice", "settled as committed").await;
    assert!(c.find(Locator::Id("no-doubt")).await.is_ok());
    assert!(c.find(Locator::Id("no-files")).await.is_ok());
    check_page(c, shots, "unknown-settled").await;
    assert_eq!(
        d.admin.process(&pid).await.unwrap().state,
        ProcessState::Done
    );
    let inbox = tenancy.phone1.inbox(None).await.unwrap();
    assert_eq!(inbox.messages.len(), 1, "the reply reached the device");

    // Acknowledge the alert.
    goto(c, base, "/admin/alerts").await;
    let ack = format!("//tr[td[text()='{pid_text}']]//button[contains(@class,'ack')]");
    let button = c.find(Locator::XPath(&ack)).await.unwrap();
    let alert_id = button
        .attr("id")
        .await
        .unwrap()
        .unwrap()
        .trim_start_matches("ack-")
        .to_owned();
    check_page(c, shots, "alerts-open").await;

    // Refused: the same action without a login, and without the CSRF token.
    let session = c
        .get_named_cookie("estafeta_admin")
        .await
        .unwrap()
        .value()
        .to_owned();
    let http = common::http();
    let action = format!("{base}/admin/alerts/{alert_id}/ack");
    let anonymous = http
        .post(&action)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body("csrf=x")
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::FORBIDDEN);
    let no_csrf = http
        .post(&action)
        .header(COOKIE, format!("estafeta_admin={session}"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body("")
        .send()
        .await
        .unwrap();
    assert_eq!(no_csrf.status(), StatusCode::FORBIDDEN);
    let page = http
        .get(format!("{base}/admin/alerts"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::SEE_OTHER);

    // In the browser too: the form with its CSRF field removed is refused.
    c.execute(
        "document.querySelector('button.ack').form.querySelector('input[name=csrf]').remove(); document.querySelector('button.ack').click();",
        vec![],
    )
    .await
    .unwrap();
    let mut refused = false;
    for _ in 0..POLLS {
        if c.source().await.unwrap().contains("403 Forbidden") {
            refused = true;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(refused, "the form without its CSRF token was not refused");
    goto(c, base, "/admin/alerts").await;
    assert!(
        c.find(Locator::Css("span.acked")).await.is_err(),
        "nothing was acknowledged"
    );

    c.find(Locator::XPath(&ack))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(wait_text(c, "notice").await, "acknowledged");
    let acked = format!("//tr[td[text()='{pid_text}']]//span[@class='acked']");
    assert!(c.find(Locator::XPath(&acked)).await.is_ok());
    check_page(c, shots, "alerts-acknowledged").await;
    goto(c, base, "/admin").await;
    assert_eq!(text(c, "#alerts-open").await, "0");

    // The other pages render without script errors.
    for (path, name) in [
        ("/admin/databases", "databases"),
        ("/admin/devices", "devices"),
        ("/admin/browse/Error", "error"),
        ("/admin/queues", "queues"),
        ("/admin/deliveries", "deliveries"),
    ] {
        goto(c, base, path).await;
        check_page(c, shots, name).await;
    }
    // The event log is written off the request path: looked at until the
    // settle's event is there.
    let mut log = String::new();
    for _ in 0..POLLS {
        goto(c, base, "/admin/events?db=db-a").await;
        log = text(c, "#events").await;
        if log.contains("the operator settles a process in doubt") {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(log.contains("process READY_TO_COMMIT (prepare)"), "{log}");
    assert!(log.contains("process in doubt"), "{log}");
    assert!(
        log.contains("the operator settles a process in doubt"),
        "{log}"
    );
    // Each protocol step names the request it happened in, its kind is a
    // word, and the page fits the window.
    let steps = c
        .execute(
            "return [...document.querySelectorAll('#events tr')]
                .filter(r => r.textContent.includes('process READY_TO_COMMIT'))
                .map(r => [r.cells[2].textContent, r.querySelector('td.request').textContent]);",
            vec![],
        )
        .await
        .unwrap();
    let steps = steps.as_array().unwrap();
    assert!(!steps.is_empty(), "{log}");
    for step in steps {
        assert_eq!(step[0], "step", "{step}");
        assert!(
            !step[1].as_str().unwrap().is_empty(),
            "no request id: {step}"
        );
    }
    let widths = c
        .execute(
            "return [document.documentElement.scrollWidth, window.innerWidth];",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        widths[0].as_u64() <= widths[1].as_u64(),
        "the event log is wider than the window: {widths}"
    );
    check_page(c, shots, "events").await;
    // The overview's live refresh runs (a few seconds) without errors.
    goto(c, base, "/admin").await;
    let mut refreshed = false;
    for _ in 0..POLLS {
        let stale = c
            .find(Locator::Css("[data-live]"))
            .await
            .unwrap()
            .attr("data-stale")
            .await
            .unwrap();
        assert_eq!(stale, None, "the live refresh failed");
        let requests: u64 = text(c, "#requests").await.parse().unwrap();
        if requests > 0 && c.execute("return performance.getEntriesByType('resource').filter(e => e.initiatorType === 'fetch').length", vec![]).await.unwrap().as_u64().unwrap_or(0) > 0 {
            refreshed = true;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(refreshed, "the overview never refreshed itself");
    check_page(c, shots, "overview-refreshed").await;

    click(c, "logout").await;
    wait_path(c, "/admin/login").await;
    d.finish().await;
}

/// Logs the browser in with the admin token.
async fn log_in(c: &Client, base: &str) {
    goto(c, base, "/admin/login").await;
    submit_login(c, TOKEN).await;
    wait_path(c, "/admin").await;
}

/// Types `token` into the login form and submits it.
async fn submit_login(c: &Client, token: &str) {
    c.find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    click(c, "login").await;
}

/// Opens `path` of the server at `base`.
async fn goto(c: &Client, base: &str, path: &str) {
    c.goto(&format!("{base}{path}")).await.unwrap();
}

async fn click(c: &Client, id: &str) {
    c.find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("no #{id}: {e}"))
        .click()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_asks_for_confirmation_and_bulk_actions_work_in_a_real_browser() {
    use estafeta_exchange::mailbox::Folder;
    let d = Dashboard::start(&[]).await;
    let (c, base, shots, tenancy) = (&d.c, d.server.base.as_str(), &d.shots, &d.tenancy);
    // Three messages processed incorrectly: three in db-a's Error.
    for _ in 0..3 {
        committed_process(tenancy, ResultStatus::ProcessedIncorrect).await;
    }
    let db_a = common::id("db-a");
    let in_folder = |folder| {
        let admin = &d.admin;
        let db_a = &db_a;
        async move {
            let files = admin.folder(db_a, folder).await.unwrap().files;
            files.iter().map(|f| f.id.to_string()).collect::<Vec<_>>()
        }
    };
    let errors = in_folder(Folder::Error).await;
    assert_eq!(errors.len(), 3);
    log_in(c, base).await;

    // One discard: a confirmation page first; cancelling keeps the message.
    goto(c, base, "/admin/browse/Error").await;
    assert_eq!(text(c, "#folder-total").await, "3");
    check_page(c, shots, "error-three").await;
    let first = &errors[0];
    goto(c, base, &format!("/admin/browse/Error/db-a/{first}")).await;
    click(c, "discard").await;
    wait_contains(c, "confirm-what", first.as_str()).await;
    check_page(c, shots, "discard-confirm").await;
    assert_eq!(
        in_folder(Folder::Error).await.len(),
        3,
        "not before the confirmation"
    );
    click(c, "cancel").await;
    wait_path(c, "/admin/browse/Error").await;
    assert_eq!(text(c, "#folder-total").await, "3");
    goto(c, base, &format!("/admin/browse/Error/db-a/{first}")).await;
    click(c, "discard").await;
    wait_text(c, "confirm-what").await;
    click(c, "confirm-yes").await;
    wait_contains(c, "notice", "discarded").await;
    assert_eq!(text(c, "#folder-total").await, "2");
    assert_eq!(in_folder(Folder::Error).await, errors[1..]);

    // Bulk: the ticked message is requeued, the other stays.
    let second = &errors[1];
    click(c, &format!("pick-{second}")).await;
    check_page(c, shots, "error-ticked").await;
    click(c, "bulk-requeue").await;
    wait_contains(c, "notice", "requeued 1 of 1 ticked").await;
    assert_eq!(text(c, "#folder-total").await, "1");
    assert_eq!(in_folder(Folder::Error).await, errors[2..]);
    assert_eq!(
        in_folder(Folder::Messages).await,
        std::slice::from_ref(second)
    );

    // Bulk on the whole folder: a discard, confirmed.
    click(c, "pick-all").await;
    click(c, "bulk-discard").await;
    wait_contains(c, "confirm-what", "every message of Error").await;
    assert_eq!(
        in_folder(Folder::Error).await.len(),
        1,
        "not before the confirmation"
    );
    click(c, "confirm-yes").await;
    wait_contains(c, "notice", "discarded 1 of every message").await;
    assert!(c.find(Locator::Id("no-files")).await.is_ok());
    assert!(in_folder(Folder::Error).await.is_empty());
    check_page(c, shots, "error-emptied").await;

    // A device's token rotated after its confirmation: shown once, the
    // old one refused at once, the new one taken.
    goto(c, base, "/admin/devices?q=phone-2").await;
    click(c, "rotate-phone-2").await;
    wait_contains(c, "confirm-what", "Rotate the token of device phone-2").await;
    tenancy
        .phone2
        .inbox(None)
        .await
        .expect("not before the confirmation");
    click(c, "confirm-yes").await;
    let token = wait_text(c, "new-token").await;
    check_page(c, shots, "token-rotated").await;
    assert!(
        tenancy.phone2.inbox(None).await.is_err(),
        "the old token still works"
    );
    ApiClient::new(base, token.trim())
        .unwrap()
        .inbox(None)
        .await
        .expect("the new token works");
    // And the device deleted after its confirmation.
    goto(c, base, "/admin/devices?q=phone-2").await;
    click(c, "delete-phone-2").await;
    wait_text(c, "confirm-what").await;
    click(c, "confirm-yes").await;
    wait_contains(c, "notice", "device phone-2 deleted").await;
    assert!(c.find(Locator::Id("device-phone-2")).await.is_err());
    check_page(c, shots, "device-deleted").await;

    d.finish().await;
}
