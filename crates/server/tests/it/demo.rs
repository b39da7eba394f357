//! `estafeta demo` as a real process: it serves, prints the dashboard
//! address and the admin token, runs its simulators (which upload
//! messages), logs only warnings on stderr while its dashboard's event log
//! shows its events, and exits 0 at the end of `--duration`, or on SIGTERM
//! or SIGINT, removing its data folder either way.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdout};

use crate::common;

/// `estafeta demo ARGS` in `cwd`, with no `ESTAFETA_*` variable of the
/// test's environment.
fn demo(cwd: &std::path::Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_estafeta"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ESTAFETA_") {
            cmd.env_remove(key);
        }
    }
    cmd.arg("demo")
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// What the demo prints before it runs its simulators.
struct Shown {
    /// The dashboard's address (`http://…/admin`).
    dashboard: String,
    /// The admin token.
    token: String,
    /// The data folder.
    folder: PathBuf,
}

/// Reads the demo's stdout until its `data folder:` line; what it showed
/// and the rest of stdout (kept open: the demo prints its last line there).
async fn shown(child: &mut Child) -> (Shown, BufReader<ChildStdout>) {
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let (mut dashboard, mut token) = (String::new(), String::new());
    loop {
        line.clear();
        assert!(
            stdout.read_line(&mut line).await.unwrap() > 0,
            "the demo ended before printing its data folder"
        );
        let line = line.trim_end();
        if let Some(rest) = line.strip_prefix("dashboard: ") {
            dashboard = rest.to_owned();
        }
        if let Some(rest) = line.strip_prefix("admin token: ") {
            token = rest.to_owned();
        }
        if let Some(rest) = line.strip_prefix("data folder: ") {
            let folder = PathBuf::from(rest.split(" (").next().unwrap());
            let shown = Shown {
                dashboard,
                token,
                folder,
            };
            return (shown, stdout);
        }
    }
}

/// Reads the demo's stdout until its `data folder:` line; the folder and
/// the rest of stdout.
async fn data_folder(child: &mut Child) -> (PathBuf, BufReader<ChildStdout>) {
    let (shown, stdout) = shown(child).await;
    (shown.folder, stdout)
}

/// Sends `signal` to the demo and checks that it stops cleanly.
async fn stop(child: &mut Child, signal: &str, stdout: &mut BufReader<ChildStdout>) {
    let pid = child.id().unwrap().to_string();
    let kill = tokio::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .await
        .unwrap();
    assert!(kill.success());
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).await.unwrap();
    assert!(rest.contains("demo stopped: "), "{signal}: {rest}");
    let status = child.wait().await.unwrap();
    assert!(status.success(), "{signal}: {status:?}");
}

/// Starts a demo without `--duration`, sends it `signal` once it serves,
/// and checks that it stops cleanly and removes its data folder.
async fn stopped_by(signal: &str) {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = demo(cwd.path(), &["--listen", "127.0.0.1:0"])
        .spawn()
        .unwrap();
    let (folder, mut stdout) = data_folder(&mut child).await;
    assert!(folder.is_dir(), "{}", folder.display());
    stop(&mut child, signal, &mut stdout).await;
    assert!(
        !folder.exists(),
        "{signal}: {} left behind",
        folder.display()
    );
}

#[tokio::test]
async fn sigterm_stops_the_demo_and_removes_its_folder() {
    stopped_by("-TERM").await;
}

#[tokio::test]
async fn sigint_stops_the_demo_and_removes_its_folder() {
    stopped_by("-INT").await;
}

/// The provisioning's events are in the event log when the demo shows its
/// address, so the dashboard's event log page lists them (its stderr stays
/// quiet all the same).
#[tokio::test]
async fn the_demos_event_log_page_shows_its_events() {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = demo(cwd.path(), &["--listen", "127.0.0.1:0"])
        .spawn()
        .unwrap();
    let (shown, mut stdout) = shown(&mut child).await;
    let session = common::dashboard_session(&shown.dashboard, &shown.token).await;
    let page = common::http()
        .get(format!("{}/events", shown.dashboard))
        .header(reqwest::header::COOKIE, &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), reqwest::StatusCode::OK);
    let html = page.text().await.unwrap();
    for event in [
        "database created",
        "device created",
        "db-north",
        "db-south",
        "phone-4",
    ] {
        assert!(
            html.contains(event),
            "no {event:?} in the event log:\n{html}"
        );
    }
    stop(&mut child, "-TERM", &mut stdout).await;
}

#[tokio::test]
async fn the_demo_logs_only_warnings_by_default() {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = demo(cwd.path(), &["--listen", "127.0.0.1:0", "--duration", "2s"])
        .spawn()
        .unwrap();
    let stderr = common::stderr_of(&mut child).await;
    assert!(child.wait().await.unwrap().success());
    for level in [" INFO ", " DEBUG ", " TRACE "] {
        assert!(!stderr.contains(level), "{level} lines:\n{stderr}");
    }
}

#[tokio::test]
async fn the_demos_default_port_is_not_serves() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_estafeta"))
        .args(["demo", "--help"])
        .output()
        .await
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("[default: 127.0.0.1:8081]"), "{help}");
}

#[tokio::test]
async fn demo_prints_address_and_token_and_exits_cleanly() {
    let cwd = tempfile::tempdir().unwrap();
    let out = demo(cwd.path(), &["--listen", "127.0.0.1:0", "--duration", "3s"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let text = String::from_utf8(out.stdout).unwrap();
    let dashboard = text
        .lines()
        .find_map(|l| l.strip_prefix("dashboard: "))
        .expect("no dashboard line");
    assert!(dashboard.starts_with("http://127.0.0.1:"), "{dashboard}");
    assert!(dashboard.ends_with("/admin"), "{dashboard}");
    let token = text
        .lines()
        .find_map(|l| l.strip_prefix("admin token: "))
        .expect("no token line");
    assert!(token.len() >= 16, "{token}");
    let stopped = text
        .lines()
        .find_map(|l| l.strip_prefix("demo stopped: "))
        .expect("no final line");
    let uploaded: usize = stopped.split_whitespace().next().unwrap().parse().unwrap();
    assert!(
        uploaded > 0,
        "the simulated devices uploaded nothing: {stopped}"
    );
}
