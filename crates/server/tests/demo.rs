//! `estafeta demo` as a real process: it serves, prints the dashboard
//! address and the admin token, runs its simulators (which upload
//! messages), logs only warnings, and exits 0 at the end of `--duration`,
//! or on SIGTERM or SIGINT, removing its data folder either way.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdout};

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

/// Reads the demo's stdout until its `data folder:` line; the folder and
/// the rest of stdout (kept open: the demo prints its last line there).
async fn data_folder(child: &mut Child) -> (PathBuf, BufReader<ChildStdout>) {
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stdout.read_line(&mut line).await.unwrap() > 0,
            "the demo ended before printing its data folder"
        );
        if let Some(rest) = line.strip_prefix("data folder: ") {
            let path = rest.split(" (").next().unwrap();
            return (PathBuf::from(path), stdout);
        }
    }
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

#[tokio::test]
async fn the_demo_logs_only_warnings_by_default() {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = demo(cwd.path(), &["--listen", "127.0.0.1:0", "--duration", "2s"])
        .spawn()
        .unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
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
