//! The settings as an operator meets them through the real binary: `--help`
//! against the settings the server reads, bare-number durations, unknown
//! names refused with the nearest one, `serve --listen/--data-dir`,
//! `ESTAFETA_CONFIG`, and `estafeta config` (listing and `--check`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;

use crate::common::{Binary, estafeta, outcome, stderr_of, wait_ready};
use estafeta_client::Client;
use estafeta_server::config::{CONFIG_VARIABLE, SETTINGS, Setting};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Runs the binary with `args` and `env` in `cwd`: (success, stdout, stderr).
async fn run(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = estafeta(cwd)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    outcome(out)
}

/// Starts `estafeta serve` in `cwd` with `env` and expects it to refuse to
/// start: fails if it ever prints "listening on". Returns its stderr.
async fn serve_refused(cwd: &Path, env: &[(&str, &str)]) -> String {
    let mut child = estafeta(cwd)
        .arg("serve")
        .env("ESTAFETA_LISTEN", "127.0.0.1:0")
        .env("ESTAFETA_DATA_DIR", cwd.join("data"))
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while stdout.read_line(&mut line).await.unwrap() > 0 {
        assert!(
            !line.starts_with("listening on"),
            "the server started with {env:?}"
        );
        line.clear();
    }
    let status = child.wait().await.unwrap();
    let stderr = stderr_of(&mut child).await;
    assert!(!status.success(), "{env:?}: {stderr}");
    stderr
}

/// Every `ESTAFETA_*` name in `text`.
fn variables(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c == '_'))
        .filter(|w| w.starts_with("ESTAFETA_") && w.len() > "ESTAFETA_".len())
        .map(str::to_owned)
        .collect()
}

/// A value each setting takes, as text: its default, or a sample.
fn sample(setting: &Setting) -> &'static str {
    match (setting.default, setting.key) {
        (Some(default), _) => default,
        (None, "admin_token") => "sample-admin-token-0123456789abcdef",
        (None, "alert_email") => "ops@example.org",
        (None, "smtp_url") => "smtp://127.0.0.1:2525",
        (None, "alert_sms_url") => "http://127.0.0.1:1/send",
        (None, "alert_sms_to") => "+100",
        (None, "alert_webhook") => "http://127.0.0.1:2/hook",
        (None, "trusted_proxies") => "10.0.0.0/8",
        (None, _) => "x",
    }
}

#[tokio::test]
async fn help_lists_exactly_the_settings_the_server_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut read: BTreeSet<String> = SETTINGS.iter().map(Setting::env).collect();
    // Each declared variable is read: `estafeta config` says it came from there.
    let env: Vec<(String, &str)> = SETTINGS.iter().map(|s| (s.env(), sample(s))).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let (ok, listing, err) = run(dir.path(), &["config"], &env).await;
    assert!(ok, "{err}");
    for setting in SETTINGS {
        let line = listing
            .lines()
            .find(|l| {
                l.trim_start_matches("# ")
                    .starts_with(&format!("{} ", setting.key))
            })
            .unwrap_or_else(|| panic!("{} is not listed:\n{listing}", setting.key));
        assert!(line.ends_with(&format!("# {}", setting.env())), "{line}");
    }
    read.insert(CONFIG_VARIABLE.to_owned());
    for args in [&["--help"][..], &["serve", "--help"], &["config", "--help"]] {
        let (ok, help, _) = run(dir.path(), args, &[]).await;
        assert!(ok, "{args:?}");
        assert_eq!(variables(&help), read, "{args:?}:\n{help}");
        for setting in SETTINGS {
            if let Some(default) = setting.default {
                assert!(help.contains(&format!("[default: {default}")), "{help}");
            }
        }
    }
}

#[tokio::test]
async fn durations_may_be_bare_numbers_of_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let server = Binary::serve(
        dir.path(),
        &dir.path().join("data"),
        &[],
        &[
            (
                "ESTAFETA_ADMIN_TOKEN",
                "op-token-0123456789abcdef0123456789",
            ),
            ("ESTAFETA_ALERT_PROBE", "0"),
            ("ESTAFETA_READY_TIMEOUT", "5"),
        ],
    )
    .await;
    wait_ready(&Client::new(&server.base, "op-token-0123456789abcdef0123456789").unwrap()).await;
    assert_eq!(server.terminate().await, Some(0));

    let (ok, listing, err) = run(
        dir.path(),
        &["config"],
        &[
            ("ESTAFETA_ALERT_PROBE", "0"),
            ("ESTAFETA_READY_TIMEOUT", "5"),
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(listing.contains("ready_timeout = \"5s\""), "{listing}");
    assert!(listing.contains("alert_probe = \"0s\""), "{listing}");

    // Zero where the help gives it no meaning, and a bad duration, are
    // refused with a message saying what to write.
    let err = serve_refused(dir.path(), &[("ESTAFETA_READY_TIMEOUT", "0")]).await;
    assert!(
        err.contains("ESTAFETA_READY_TIMEOUT = \"0\": must be more than 0"),
        "{err}"
    );
    let err = serve_refused(dir.path(), &[("ESTAFETA_DISK_CHECK", "soon")]).await;
    assert!(
        err.contains("write a duration like 30s, 10m or 90d, or a number of seconds"),
        "{err}"
    );
}

#[tokio::test]
async fn unknown_variables_and_keys_are_refused_with_the_nearest_name() {
    let dir = tempfile::tempdir().unwrap();
    let err = serve_refused(dir.path(), &[("ESTAFETA_READY_TIMOUT", "5m")]).await;
    assert!(
        err.contains("unknown environment variable ESTAFETA_READY_TIMOUT; did you mean ESTAFETA_READY_TIMEOUT?"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("estafeta.toml"),
        "retention = \"30d\"\nmax_file = 3\n",
    )
    .unwrap();
    let err = serve_refused(dir.path(), &[]).await;
    assert!(
        err.contains("unknown setting \"max_file\"; did you mean \"max_files\"?"),
        "{err}"
    );
}

#[tokio::test]
async fn flags_override_the_environment_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("flag-data");
    std::fs::write(
        dir.path().join("estafeta.toml"),
        "listen = \"not an address\"\ndata_dir = \"file-data\"\n",
    )
    .unwrap();
    let server = Binary::serve(
        dir.path(),
        &dir.path().join("env-data"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[
            (
                "ESTAFETA_ADMIN_TOKEN",
                "op-token-0123456789abcdef0123456789",
            ),
            ("ESTAFETA_LISTEN", "not an address either"),
        ],
    )
    .await;
    wait_ready(&Client::new(&server.base, "op-token-0123456789abcdef0123456789").unwrap()).await;
    assert!(data.join(".estafeta").is_dir());
    assert!(!dir.path().join("env-data").exists());
    assert!(!dir.path().join("file-data").exists());
    assert_eq!(server.terminate().await, Some(0));
}

#[tokio::test]
async fn config_lists_the_effective_settings_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("named.toml"), "max_files = 2\n").unwrap();
    std::fs::write(dir.path().join("estafeta.toml"), "max_files = 3\n").unwrap();
    let (ok, listing, err) = run(
        dir.path(),
        &["config", "--listen", "0.0.0.0:9000"],
        &[
            (CONFIG_VARIABLE, "named.toml"),
            (
                "ESTAFETA_ADMIN_TOKEN",
                "s3cret-token-0123456789abcdef01234567",
            ),
            ("ESTAFETA_SMTP_URL", "smtp://ops:pa55@mail.example.org"),
            ("ESTAFETA_ALERT_EMAIL", "ops@example.org"),
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        !listing.contains("s3cret") && !listing.contains("pa55"),
        "{listing}"
    );
    let line = |key: &str| {
        listing
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key}:\n{listing}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    // ESTAFETA_CONFIG names the file, in place of ./estafeta.toml.
    assert_eq!(line("max_files"), "max_files = 2 # named.toml");
    assert_eq!(line("listen"), "listen = \"0.0.0.0:9000\" # --listen");
    assert_eq!(
        line("# admin_token"),
        "# admin_token = <redacted> # ESTAFETA_ADMIN_TOKEN"
    );
    assert_eq!(
        line("# smtp_url"),
        "# smtp_url = \"smtp://***@mail.example.org\" # ESTAFETA_SMTP_URL"
    );
    assert_eq!(line("max_mb"), "max_mb = 20.0 # default");

    // A bad setting: the error, and a non-zero exit.
    let (ok, _, err) = run(dir.path(), &["config"], &[("ESTAFETA_MAX_MB", "lots")]).await;
    assert!(!ok);
    assert!(
        err.contains("ESTAFETA_MAX_MB = \"lots\": expected a number"),
        "{err}"
    );
}

#[tokio::test]
async fn config_check_reads_a_file_as_serve_would() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("good.toml"),
        "listen = \"0.0.0.0:8080\"\nready_timeout = 300\nalert_probe = 0\n",
    )
    .unwrap();
    let (ok, out, err) = run(dir.path(), &["config", "--check", "good.toml"], &[]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "good.toml: ok\n");

    std::fs::write(
        dir.path().join("typo.toml"),
        "alert_probe = 0\nready_timout = 300\n",
    )
    .unwrap();
    let (ok, _, err) = run(dir.path(), &["config", "--check", "typo.toml"], &[]).await;
    assert!(!ok);
    assert!(
        err.contains(
            "typo.toml: unknown setting \"ready_timout\"; did you mean \"ready_timeout\"?"
        ),
        "{err}"
    );

    std::fs::write(dir.path().join("broken.toml"), "max_files = [\n").unwrap();
    let (ok, _, err) = run(dir.path(), &["config", "--check", "broken.toml"], &[]).await;
    assert!(!ok);
    assert!(
        err.contains("broken.toml") && err.contains("line 1"),
        "{err}"
    );

    let (ok, _, err) = run(dir.path(), &["config", "--check", "missing.toml"], &[]).await;
    assert!(!ok);
    assert!(err.contains("missing.toml"), "{err}");

    // Checked with the environment, as serve reads it: an e-mail channel
    // whose relay (with its password) is kept in the environment.
    std::fs::write(
        dir.path().join("alerts.toml"),
        "alert_email = \"ops@example.org\"\n",
    )
    .unwrap();
    let (ok, _, err) = run(dir.path(), &["config", "--check", "alerts.toml"], &[]).await;
    assert!(!ok);
    assert!(
        err.contains("alert_email and smtp_url must be given together"),
        "{err}"
    );
    let (ok, _, err) = run(
        dir.path(),
        &["config", "--check", "alerts.toml"],
        &[("ESTAFETA_SMTP_URL", "smtp://ops:pa55@127.0.0.1:2525")],
    )
    .await;
    assert!(ok, "{err}");
}

#[tokio::test]
async fn a_store_that_is_not_postgres_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let err = serve_refused(
        dir.path(),
        &[("ESTAFETA_STORE", "mysql://db.example/estafeta")],
    )
    .await;
    assert!(
        err.contains("the store setting must be a postgres:// (or postgresql://) URL"),
        "{err}"
    );
    assert!(!dir.path().join("data").exists(), "nothing was made: {err}");
}
