//! `estafeta demo` as a real process: it serves, prints the dashboard
//! address and the admin token, runs its simulators (which upload
//! messages), and exits 0 at the end of `--duration`.

use std::process::Stdio;

#[tokio::test]
async fn demo_prints_address_and_token_and_exits_cleanly() {
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_estafeta"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ESTAFETA_") {
            cmd.env_remove(key);
        }
    }
    let out = cmd
        .args(["demo", "--listen", "127.0.0.1:0", "--duration", "3s"])
        .current_dir(cwd.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
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
