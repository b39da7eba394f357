//! A real process is killed with SIGKILL while entries are in flight; after
//! restart every entry whose handler had not finished is handed out again,
//! and none whose handler finished is.
//!
//! The test re-runs its own executable as the child, selected by an
//! environment variable.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{Probe, entry};
use estafeta_repeat::{Clock, Options, Outcome, RedbStore, Scheduler, SystemClock, TestClock};

const CHILD_DIR: &str = "ESTAFETA_REPEAT_CRASH_CHILD_DIR";
const DONE: usize = 10;
const HANG: usize = 12;
const WORKERS: usize = 8;
/// The child's signal; libtest may print its own text before it on the line.
const READY: &str = "CRASH-CHILD-READY";

#[test]
fn entries_in_flight_when_killed_are_handed_out_again() {
    if let Ok(dir) = std::env::var(CHILD_DIR) {
        child(&dir);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("repeat.redb");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let now = SystemClock.now_secs();

    runtime.block_on(async {
        let s = Scheduler::new(
            RedbStore::open(&path).unwrap(),
            SystemClock,
            Options::default(),
        );
        let mut entries: Vec<_> = (0..DONE)
            .map(|i| entry("s", now - 10, &format!("done-{i:02}")))
            .collect();
        entries.extend((0..HANG).map(|i| entry("s", now - 10, &format!("hang-{i:02}"))));
        s.schedule_all(entries).await.unwrap();
        s.close().await;
    });

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash::entries_in_flight_when_killed_are_handed_out_again",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.ends_with(READY));
    assert!(ready, "the child did not get entries in flight");
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success(), "killed, not exited: {status:?}");

    runtime.block_on(async {
        let clock = TestClock::new(SystemClock.now_secs());
        let s = Scheduler::new(
            RedbStore::open(&path).unwrap(),
            clock.clone(),
            Options::default(),
        );
        let before = s.stats().await.unwrap();
        assert_eq!(
            before.sources["s"].entries, HANG as u64,
            "finished deliveries stayed removed"
        );
        let (probe, running) = Probe::start(&s, &clock, WORKERS, Duration::ZERO, |_| Outcome::Done);
        probe.wait_for(HANG).await;
        running.stop().await;
        let per_id = probe.per_id();
        assert_eq!(per_id.len(), HANG);
        assert!(
            per_id
                .iter()
                .all(|(id, n)| id.starts_with("hang-") && *n == 1),
            "{per_id:?}"
        );
        assert_eq!(s.stats().await.unwrap().sources["s"].entries, 0);
    });
}

/// The child: finishes the `done-` entries, keeps `hang-` entries in flight
/// forever, says READY once that is durable, and waits to be killed.
fn child(dir: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let path = std::path::Path::new(dir).join("repeat.redb");
        let s = Scheduler::new(
            RedbStore::open(path).unwrap(),
            SystemClock,
            Options::default(),
        );
        let (started, mut hanging) = tokio::sync::mpsc::unbounded_channel();
        let handler = move |e: estafeta_repeat::Entry| {
            let started = started.clone();
            async move {
                if e.id.starts_with("hang-") {
                    let _ = started.send(e.id);
                    std::future::pending::<()>().await;
                }
                Outcome::Done
            }
        };
        let runner = s.clone();
        tokio::spawn(async move {
            runner
                .run(
                    estafeta_repeat::WorkerPool::new(WORKERS),
                    handler,
                    std::future::pending(),
                )
                .await
        });
        for _ in 0..WORKERS {
            hanging.recv().await.unwrap();
        }
        // Wait (bounded) until the finished deliveries are committed.
        for _ in 0..2_000 {
            if s.stats().await.unwrap().sources["s"].entries == HANG as u64 {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{READY}").unwrap();
                out.flush().unwrap();
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("finished deliveries were not committed");
    });
}
