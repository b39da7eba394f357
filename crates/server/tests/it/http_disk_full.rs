//! A real full disk at start: the real binary killed with `kill -9`, its
//! data folder's file system (a small tmpfs, mounted by the test, which
//! needs root, as CI runs; elsewhere it fails) filled up, and the binary
//! started again. The stores must repair themselves on open, which writes,
//! so the open fails; the server waits for free space instead of exiting,
//! and once the disk is freed it serves everything it had accepted.

use std::process::Stdio;

use crate::common::{Binary, estafeta, id, message, provision_one, wait_ready};
use estafeta_client::Client;
use estafeta_exchange::mailbox::Folder;
use estafeta_test_support::tmpfs::{Tmpfs, fill};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test]
async fn a_restart_on_a_full_disk_waits_for_space_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let _unmount = Tmpfs::mount(&mnt, "16m");
    let data = mnt.join("data");
    let env = [
        (
            "ESTAFETA_ADMIN_TOKEN",
            "disk-admin-0123456789abcdef0123456789",
        ),
        ("ESTAFETA_DISK_ALERT_MB", "1"),
    ];

    let server = Binary::serve(dir.path(), &data, &[], &env).await;
    let admin = Client::new(&server.base, "disk-admin-0123456789abcdef0123456789").unwrap();
    wait_ready(&admin).await;
    let (_db, phone) = provision_one(&admin).await;
    let mut sent = Vec::new();
    for n in 0..3 {
        let body = format!(r#"{{"n":{n}}}"#);
        let ok = admin
            .with_token(&phone)
            .send(&message("db-a", &body, None))
            .await
            .unwrap();
        sent.push(ok.accepted.id);
    }
    server.kill9().await;
    let ballast = mnt.join("ballast");
    fill(&ballast);

    let mut cmd = estafeta(dir.path());
    cmd.arg("serve")
        .env("ESTAFETA_LISTEN", "127.0.0.1:0")
        .env("ESTAFETA_DATA_DIR", &data)
        .env("ESTAFETA_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    // The start must wait, not exit and not listen.
    loop {
        tokio::select! {
            line = stderr.next_line() => {
                let line = line.unwrap().expect("the server exited on a full disk");
                if line.contains("waiting for free space") {
                    break;
                }
            }
            line = stdout.next_line() => {
                let line = line.unwrap().expect("the server exited on a full disk");
                assert!(!line.starts_with("listening on"), "opened on a full disk: {line}");
            }
        }
    }
    std::fs::remove_file(&ballast).unwrap();
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    let addr = loop {
        let line = stdout
            .next_line()
            .await
            .unwrap()
            .expect("the server exited after the disk was freed");
        if let Some(addr) = line.strip_prefix("listening on ") {
            break addr.to_owned();
        }
    };
    let admin = Client::new(
        &format!("http://{addr}"),
        "disk-admin-0123456789abcdef0123456789",
    )
    .unwrap();
    wait_ready(&admin).await;
    let queued: Vec<_> = admin
        .folder(&id("db-a"), Folder::Messages)
        .await
        .unwrap()
        .files
        .into_iter()
        .map(|f| f.id)
        .collect();
    assert_eq!(queued, sent);
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}
