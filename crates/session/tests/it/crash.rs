//! Durability against a real `kill -9`: the test re-runs its own executable
//! as a child process, which saves sessions and is then killed.

use crate::common::*;
use estafeta_session::{Config, RedbStorage};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

const CHILD_ENV: &str = "ESTAFETA_SESSION_CRASH_CHILD";

/// The child's part: only does something when started by the parent.
#[tokio::test]
async fn crash_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let storage = Arc::new(RedbStorage::open(&path).unwrap());
    let engine = engine_with(storage, Recorder::new(), Config::default()).await;
    for i in 0..100 {
        let mut s = engine.get(format!("k{i}"), true).await.unwrap().unwrap();
        s.persistent_mut().n = i;
        s.release().await.unwrap();
    }
    // A change that is not persistent: must not survive.
    let mut s = engine.get("k1".to_string(), false).await.unwrap().unwrap();
    s.state_mut().note = "volatile".into();
    s.release().await.unwrap();
    println!("READY");
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn persistent_state_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.redb");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "crash::crash_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("READY"));
    assert!(ready, "child did not get ready");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let storage = Arc::new(RedbStorage::open(&path).unwrap());
    let engine = engine_with(storage, Recorder::new(), Config::default()).await;
    for i in 0..100 {
        let c = read(&engine, &format!("k{i}"))
            .await
            .expect("saved session survives");
        assert_eq!(
            c,
            Counter {
                n: i,
                note: String::new()
            }
        );
    }
}
