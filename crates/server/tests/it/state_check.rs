//! Damaged state files through the real binary: `estafeta serve` refuses
//! to start on a truncated or overwritten redb file with a message that
//! names it and says what to do, and `estafeta check` reports on every
//! state file (after a `kill -9` too), exiting non-zero on damage; in
//! cluster mode it reports on the database instead.

use std::path::Path;
use std::time::Duration;

use crate::common;
use crate::common::{Binary, estafeta, provision_one, wait_ready};
use estafeta_client::Client;
use estafeta_exchange::DataLayout;

const TOKEN: &str = "check-admin-0123456789abcdef0123456789";

/// Runs the binary with `args` in `cwd` on the data folder `data`:
/// (success, stdout, stderr). A start that does not end fails the test.
async fn run(cwd: &Path, data: &Path, args: &[&str]) -> (bool, String, String) {
    run_with(cwd, data, args, &[]).await
}

/// [`run`] with `env` added.
async fn run_with(
    cwd: &Path,
    data: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (bool, String, String) {
    let out = estafeta(cwd)
        .args(args)
        .envs(env.iter().copied())
        .env("ESTAFETA_DATA_DIR", data)
        .env("ESTAFETA_LISTEN", "127.0.0.1:0")
        .env("ESTAFETA_ADMIN_TOKEN", TOKEN)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("the command ends")
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A data folder with a provisioned database, left by a `kill -9`.
async fn crashed(cwd: &Path, data: &Path) {
    let server = Binary::serve(cwd, data, &[], &[("ESTAFETA_ADMIN_TOKEN", TOKEN)]).await;
    let admin = Client::new(&server.base, TOKEN).unwrap();
    wait_ready(&admin).await;
    provision_one(&admin).await;
    server.kill9().await;
}

fn line<'a>(out: &'a str, file: &Path) -> &'a str {
    let file = file.display().to_string();
    out.lines()
        .find(|l| l.starts_with(&file))
        .unwrap_or_else(|| panic!("no line for {file} in {out}"))
}

#[tokio::test]
async fn check_after_a_crash_finds_every_file_fit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    crashed(dir.path(), &data).await;
    let (ok, out, err) = run(dir.path(), &data, &["check"]).await;
    assert!(ok, "{out}{err}");
    let layout = DataLayout::new(&data);
    for file in [layout.registry(), layout.sessions(), layout.scheduled()] {
        let l = line(&out, &file);
        assert!(l.ends_with(": ok") || l.ends_with(": repaired"), "{l}");
    }
}

#[tokio::test]
async fn a_truncated_or_overwritten_state_file_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    crashed(dir.path(), &data).await;
    let layout = DataLayout::new(&data);
    let cases: [(&Path, Damage); 3] = [
        (&layout.sessions(), |p| truncate(p, 100)),
        (&layout.registry(), |p| truncate(p, 5000)),
        (&layout.scheduled(), |p| overwrite_head(p)),
    ];
    for (file, damage) in cases {
        let saved = std::fs::read(file).unwrap();
        damage(file);
        let (ok, out, err) = run(dir.path(), &data, &["serve"]).await;
        assert!(!ok, "served on a damaged {}: {out}{err}", file.display());
        assert!(!out.contains("listening on"), "{out}");
        assert!(err.contains(&file.display().to_string()), "{err}");
        assert!(err.contains("estafeta check --data-dir"), "{err}");
        assert!(err.contains("restore it from a backup"), "{err}");
        assert!(!err.contains("failed to fill whole buffer"), "{err}");

        let (ok, out, _) = run(dir.path(), &data, &["check"]).await;
        assert!(!ok, "check exits non-zero on damage: {out}");
        assert!(line(&out, file).contains("DAMAGED"), "{out}");
        let damaged = out.lines().filter(|l| l.contains("DAMAGED")).count();
        assert_eq!(damaged, 1, "only the damaged file: {out}");

        std::fs::write(file, saved).unwrap();
        let (ok, out, _) = run(dir.path(), &data, &["check"]).await;
        assert!(ok, "whole again: {out}");
    }
}

/// A way to damage a file.
type Damage = fn(&Path);

fn truncate(file: &Path, len: u64) {
    std::fs::File::options()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn overwrite_head(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    for b in bytes.iter_mut().take(512) {
        *b = 0x5a;
    }
    std::fs::write(file, bytes).unwrap();
}

/// In cluster mode `estafeta check` looks at the database, not the data
/// folder: empty before the first start, its schema version after it, not
/// fit when it cannot be reached or its schema is newer than this build.
#[tokio::test]
async fn check_in_cluster_mode_reports_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let url = common::postgres::database();
    let store = [("ESTAFETA_STORE", url.as_str())];
    let (ok, out, err) = run_with(dir.path(), &data, &["check"], &store).await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("empty (the schema is made at the next start)"),
        "{out}"
    );
    assert!(!data.join(".estafeta").exists(), "check made files: {out}");

    let node = Binary::serve_on(
        Some(&url),
        dir.path(),
        &data,
        &[],
        &[("ESTAFETA_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    wait_ready(&Client::new(&node.base, TOKEN).unwrap()).await;
    node.kill9().await;
    let (ok, out, _) = run_with(dir.path(), &data, &["check"], &store).await;
    assert!(ok, "{out}");
    assert!(out.contains(": ok, schema version "), "{out}");
    assert!(!out.contains("events.redb"), "{out}");
    // The test's instance has no standby: commits survive its crash, not
    // its loss.
    assert!(
        out.contains("WARNING no synchronous standby is configured"),
        "{out}"
    );

    let db = estafeta_postgres::Store::connect(&url).unwrap();
    db.client()
        .await
        .unwrap()
        .execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) \
             VALUES (9999, 'from_a_newer_build', '', '0')",
            &[],
        )
        .await
        .unwrap();
    let (ok, out, _) = run_with(dir.path(), &data, &["check"], &store).await;
    assert!(!ok, "a newer schema is not fit: {out}");
    assert!(out.contains("schema version 9999 is NEWER"), "{out}");

    let away = format!(
        "postgres://postgres@{}/estafeta?connect_timeout=2",
        common::recorder::closed_port()
    );
    let (ok, out, _) = run_with(
        dir.path(),
        &data,
        &["check"],
        &[("ESTAFETA_STORE", away.as_str())],
    )
    .await;
    assert!(!ok, "an unreachable database is not fit: {out}");
    assert!(out.contains("UNREACHABLE"), "{out}");
}
