//! The six-call protocol through the service facade, transition by
//! transition, on a controlled clock.

use crate::common::{send_request, start_request};
use crate::world::*;
use estafeta_exchange::ErrorKind;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::*;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn full_cycle_with_mixed_results() {
    let w = World::new().await;
    let (s, pid) = w.started(3).await;
    assert_eq!(s.status, StartStatus::Ok);
    let msgs = s.messages.clone().unwrap();
    assert_eq!(msgs.len(), 3);
    assert_eq!(w.state(&pid).await, ProcessState::Started);
    let statuses = [
        ResultStatus::Processed,
        ResultStatus::ProcessedDeadlock,
        ResultStatus::ProcessedIncorrect,
    ];
    let results = msgs
        .iter()
        .zip(statuses)
        .map(|(m, st)| MessageResult {
            message_id: m.id,
            status: st,
            error_code: Some(7),
            error_text: None,
        })
        .collect();
    assert_eq!(w.prepare(&pid, results, 2).await, CallStatus::Ok);
    assert_eq!(w.state(&pid).await, ProcessState::ReadyToCommit);
    assert_eq!(w.files("db-a", Folder::Prepared), 2);
    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
    assert_eq!(w.state(&pid).await, ProcessState::Done);
    assert_eq!(w.files("db-a", Folder::Log), 1);
    assert_eq!(w.files("db-a", Folder::Error), 1);
    assert_eq!(
        w.files("db-a", Folder::Messages),
        1,
        "the deadlocked one stays"
    );
    assert_eq!(w.files("db-a", Folder::Prepared), 0);
    assert_eq!(w.inbox().await.messages.len(), 2);
    // Commit again: OK again.
    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
    // The deadlocked message comes again.
    let again = w.start().await;
    assert_eq!(again.messages.unwrap()[0].id, msgs[1].id);
}

#[tokio::test(start_paused = true)]
async fn idle_busy_and_accept_narrowing() {
    let w = World::new().await;
    assert_eq!(w.start().await.status, StartStatus::Idle);
    let (s, pid) = w.started(3).await;
    assert_eq!(w.start().await.status, StartStatus::Busy);
    let first = s.messages.unwrap()[0].id;
    let r =
        w.ex.accept(
            &w.db,
            &pid,
            AcceptRequest {
                version: Version,
                message_ids: vec![first],
            },
        )
        .await
        .unwrap();
    assert_eq!(r.status, CallStatus::Ok);
    // Results must now name exactly the accepted one.
    let bad =
        w.ex.prepare(
            &w.db,
            &pid,
            PrepareRequest {
                version: Version,
                results: vec![],
                replies: vec![],
            },
        )
        .await;
    assert_eq!(bad.unwrap_err().kind(), ErrorKind::Unprocessable);
    let one = vec![MessageResult {
        message_id: first,
        status: ResultStatus::Processed,
        error_code: None,
        error_text: None,
    }];
    assert_eq!(w.prepare(&pid, one, 0).await, CallStatus::Ok);
    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
    assert_eq!(
        w.files("db-a", Folder::Messages),
        2,
        "the others stay and come again"
    );
    assert_eq!(w.files("db-a", Folder::Log), 1);
}

#[tokio::test(start_paused = true)]
async fn started_timeout_then_late_prepare_is_cancelled() {
    let w = World::new().await;
    let (s, pid) = w.started(1).await;
    tokio::time::sleep(STARTED_TIMEOUT + Duration::from_secs(2)).await;
    assert_eq!(w.state(&pid).await, ProcessState::TimedOut);
    let results = World::results(&s, ResultStatus::Processed);
    assert_eq!(w.prepare(&pid, results, 1).await, CallStatus::Cancelled);
    assert_eq!(w.files("db-a", Folder::Prepared), 0, "nothing written");
    assert_eq!(w.commit(&pid).await, CallStatus::Cancelled);
    assert_eq!(w.rollback(&pid).await, CallStatus::Ok);
    assert_eq!(
        w.start().await.status,
        StartStatus::Ok,
        "the message comes again"
    );
}

#[tokio::test(start_paused = true)]
async fn ready_timeout_in_doubt_then_late_commit() {
    let w = World::new().await;
    let pid = w.prepared_with_an_incorrect().await;
    tokio::time::sleep(READY_TIMEOUT + Duration::from_secs(2)).await;
    assert_eq!(w.state(&pid).await, ProcessState::InDoubt);
    assert_eq!(
        w.files("db-a", Folder::Unknown),
        2,
        "processed message and reply"
    );
    assert_eq!(w.files("db-a", Folder::Error), 1);
    assert_eq!(
        w.start().await.status,
        StartStatus::Idle,
        "in doubt does not block"
    );
    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
    assert_eq!(w.state(&pid).await, ProcessState::Done);
    assert_eq!(w.files("db-a", Folder::Unknown), 0);
    assert_eq!(w.files("db-a", Folder::Log), 1);
    assert_eq!(w.inbox().await.messages.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn ready_timeout_in_doubt_then_late_rollback() {
    let w = World::new().await;
    let pid = w.prepared_with_an_incorrect().await;
    tokio::time::sleep(READY_TIMEOUT + Duration::from_secs(2)).await;
    assert_eq!(w.rollback(&pid).await, CallStatus::Ok);
    assert_eq!(w.state(&pid).await, ProcessState::RolledBack);
    assert_eq!(
        w.files("db-a", Folder::Messages),
        2,
        "both back in the queue"
    );
    assert_eq!(
        w.files("db-a", Folder::Unknown) + w.files("db-a", Folder::Error),
        0
    );
    assert!(w.inbox().await.messages.is_empty());
    assert_eq!(w.commit(&pid).await, CallStatus::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn ready_timeout_in_doubt_then_late_abort_ends_aborted() {
    let w = World::new().await;
    let pid = w.prepared(1, 2).await;
    tokio::time::sleep(READY_TIMEOUT + Duration::from_secs(2)).await;
    assert_eq!(w.state(&pid).await, ProcessState::InDoubt);
    assert_eq!(w.abort(&pid, "the processor gave up").await, CallStatus::Ok);
    assert_eq!(w.state(&pid).await, ProcessState::Aborted);
    assert_eq!(w.files("db-a", Folder::Messages), 1, "back in the queue");
    assert_eq!(w.files("db-a", Folder::Unknown), 0, "the reply is deleted");
    assert!(w.inbox().await.messages.is_empty());
    assert_eq!(w.commit(&pid).await, CallStatus::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn rollback_and_abort_delete_replies() {
    let w = World::new().await;
    let pid = w.prepared(1, 2).await;
    assert_eq!(w.rollback(&pid).await, CallStatus::Ok);
    assert_eq!(w.files("db-a", Folder::Prepared), 0);
    assert_eq!(w.files("db-a", Folder::Messages), 1);
    assert_eq!(w.rollback(&pid).await, CallStatus::Ok, "again: still OK");
    assert_eq!(w.commit(&pid).await, CallStatus::Cancelled);
    let pid = w.start().await.process_id.unwrap().to_string();
    assert_eq!(w.abort(&pid, "user stop").await, CallStatus::Ok);
    assert_eq!(w.state(&pid).await, ProcessState::Aborted);
    // Never issued.
    assert_eq!(
        w.commit("01ARZ3NDEKTSV4RRFFQ69G5FAV").await,
        CallStatus::Cancelled
    );
    assert_eq!(
        w.ex.process_status(&w.db, "01ARZ3NDEKTSV4RRFFQ69G5FAV")
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
}

#[tokio::test(start_paused = true)]
async fn idempotent_upload_and_ack() {
    let w = World::new().await;
    let req = |k: &str| send_request("db-a", "{}", Some(k));
    let (a, first) = w.ex.send(&w.phone, req("k1")).await.unwrap();
    let (b, second) = w.ex.send(&w.phone, req("k1")).await.unwrap();
    assert_eq!(a.id, b.id);
    assert_eq!(
        (first, second),
        (
            estafeta_exchange::Upload::Created,
            estafeta_exchange::Upload::Repeated
        )
    );
    assert_eq!(w.files("db-a", Folder::Messages), 1);
    // Another device's same key is its own.
    w.ex.send(&w.phone2, req("k1")).await.unwrap();
    assert_eq!(w.files("db-a", Folder::Messages), 2);
    // A reply, then ack.
    let s = w.start().await;
    let pid = s.process_id.unwrap().to_string();
    w.prepare(&pid, World::results(&s, ResultStatus::Processed), 1)
        .await;
    w.commit(&pid).await;
    let inbox = w.inbox().await;
    let ids = inbox.messages.iter().map(|m| m.id).collect::<Vec<_>>();
    assert_eq!(w.ack(ids.clone()).await, 1);
    assert_eq!(w.ack(ids).await, 0, "already acknowledged: not counted");
    assert!(w.inbox().await.messages.is_empty());
}

#[tokio::test(start_paused = true)]
async fn authorization() {
    let w = World::new().await;
    let (_, pid) = w.started(1).await;
    // Another database's token cannot touch this process.
    let e =
        w.ex.commit(&w.db2, &pid, CommitRequest { version: Version })
            .await
            .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Forbidden);
    assert_eq!(
        w.ex.process_status(&w.db2, &pid).await.unwrap_err().kind(),
        ErrorKind::Forbidden
    );
    // Enterprise isolation: a device cannot send to another enterprise's database.
    let req = send_request("db-x", "{}", None);
    assert_eq!(
        w.ex.send(&w.phone, req).await.unwrap_err().kind(),
        ErrorKind::Forbidden
    );
    // Role checks.
    assert_eq!(
        w.ex.processes(&w.phone).await.unwrap_err().kind(),
        ErrorKind::Forbidden
    );
    assert_eq!(
        w.ex.inbox(&w.db, None).await.unwrap_err().kind(),
        ErrorKind::Forbidden
    );
    let start = start_request("db-a");
    assert_eq!(
        w.ex.start(&w.other_db, start).await.unwrap_err().kind(),
        ErrorKind::Forbidden
    );
    let _ = &w.other_phone;
}

#[tokio::test(start_paused = true)]
async fn restart_puts_ready_to_commit_in_doubt_and_finishes_cleanup() {
    let w = World::new().await;
    let pid = w.prepared(2, 1).await;
    let w = w
        .restart(estafeta_session::Timestamp(1_800_000_100_000))
        .await;
    let (ex, db, dir) = (&w.ex, &w.db, &w.dir);
    let files = |f: Folder| {
        std::fs::read_dir(dir.path().join("data/db-a").join(f.as_str()))
            .unwrap()
            .count()
    };
    let st = ex.process_status(db, &pid).await.unwrap();
    assert_eq!(st.state, ProcessState::InDoubt);
    assert_eq!(files(Folder::Unknown), 3);
    let r = ex
        .commit(db, &pid, CommitRequest { version: Version })
        .await
        .unwrap();
    assert_eq!(r.status, CallStatus::Ok);
    assert_eq!(files(Folder::Log), 2);
}

#[tokio::test(start_paused = true)]
async fn commit_failed_then_retried_with_backoff_and_at_once() {
    let alerts = Alerts::default();
    let w = World::with_sinks(|_| alerts.sinks()).await;
    let pid = w.prepared(2, 1).await;
    // The Log folder (not made yet) cannot take files: the moves fail.
    let log = w.data().join("db-a/Log");
    std::fs::write(&log, b"not a folder").unwrap();
    assert_eq!(w.commit(&pid).await, CallStatus::Failed);
    assert_eq!(w.state(&pid).await, ProcessState::Failed);
    let failed_key = format!("failed:{pid}");
    assert!(
        alerts.raised().iter().any(|(key, _)| *key == failed_key),
        "a FAILED commit alerts: {:?}",
        alerts.raised()
    );
    assert!(alerts.open(&failed_key));
    assert_eq!(
        w.start().await.status,
        StartStatus::Busy,
        "FAILED has not ended"
    );
    // Still failing: the server's own retries keep it FAILED.
    tokio::time::advance(Duration::from_secs(10)).await;
    tokio::task::yield_now().await;
    assert_eq!(w.state(&pid).await, ProcessState::Failed);
    // The folder is back: the next retry with backoff finishes the moves.
    std::fs::remove_file(&log).unwrap();
    std::fs::create_dir(&log).unwrap();
    tokio::time::sleep(Duration::from_secs(400)).await;
    assert_eq!(w.state(&pid).await, ProcessState::Done);
    assert!(
        !alerts.open(&failed_key),
        "the alert ends when the retries succeed: {:?}",
        alerts.cleared()
    );
    assert_eq!(w.files("db-a", Folder::Log), 2);
    assert_eq!(w.inbox().await.messages.len(), 1);
    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
}

/// How many times the alert with `key` was raised.
fn raises(alerts: &Alerts, key: &str) -> usize {
    alerts.raised().iter().filter(|(k, _)| k == key).count()
}

#[tokio::test(start_paused = true)]
async fn late_commit_in_doubt_whose_moves_fail_is_retried_with_backoff() {
    let alerts = Alerts::default();
    let w = World::with_sinks(|_| alerts.sinks()).await;
    let pid = w.prepared(2, 1).await;
    tokio::time::sleep(READY_TIMEOUT + Duration::from_secs(2)).await;
    assert_eq!(w.state(&pid).await, ProcessState::InDoubt);
    // The Log folder (not made yet) cannot take files: the settlement's
    // moves fail part-way (the reply is delivered, the messages stay).
    let log = w.data().join("db-a/Log");
    std::fs::write(&log, b"not a folder").unwrap();
    assert_eq!(w.commit(&pid).await, CallStatus::Failed);
    assert_eq!(w.state(&pid).await, ProcessState::InDoubt);
    let failed_key = format!("failed:{pid}");
    assert_eq!(raises(&alerts, &failed_key), 1, "{:?}", alerts.raised());
    assert_eq!(
        w.start().await.status,
        StartStatus::Busy,
        "no new process while the settlement is unfinished"
    );
    // The server tries again by itself, with a growing backoff: not within
    // the first second, a few times within ten.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(raises(&alerts, &failed_key), 1);
    tokio::time::sleep(Duration::from_secs(9)).await;
    let retries = raises(&alerts, &failed_key);
    assert!((2..=4).contains(&retries), "{retries} attempts in 10 s");
    assert!(alerts.open(&failed_key));
    // The folder is back: the next retry settles the process.
    std::fs::remove_file(&log).unwrap();
    std::fs::create_dir(&log).unwrap();
    tokio::time::sleep(Duration::from_secs(400)).await;
    assert_eq!(w.state(&pid).await, ProcessState::Done);
    assert!(!alerts.open(&failed_key), "{:?}", alerts.cleared());
    let cleared = alerts.cleared();
    assert!(cleared.contains(&format!("in_doubt:{pid}")), "{cleared:?}");
    assert_eq!(w.files("db-a", Folder::Unknown), 0);
    assert_eq!(w.files("db-a", Folder::Log), 2);
    assert_eq!(w.inbox().await.messages.len(), 1);
    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
}

#[tokio::test(start_paused = true)]
async fn moves_into_doubt_failing_part_way_then_a_late_commit_leave_nothing_in_unknown() {
    let alerts = Alerts::default();
    let w = World::with_sinks(|_| alerts.sinks()).await;
    let pid = w.prepared_with_an_incorrect().await;
    // The Error folder (not made yet) cannot take files: of the moves into
    // doubt, the reply's and the processed message's are done, the
    // incorrect message's fails.
    let error = w.data().join("db-a/Error");
    std::fs::write(&error, b"not a folder").unwrap();
    // The deadline saves the moves into doubt; they run when it fires
    // again, about a second later.
    tokio::time::sleep(READY_TIMEOUT + Duration::from_secs(3)).await;
    assert_eq!(w.files("db-a", Folder::Unknown), 2);
    // The processor's late commit comes while the moves are unfinished.
    assert_eq!(w.commit(&pid).await, CallStatus::Failed);
    std::fs::remove_file(&error).unwrap();
    std::fs::create_dir(&error).unwrap();
    tokio::time::sleep(Duration::from_secs(400)).await;
    assert_eq!(w.state(&pid).await, ProcessState::Done);
    assert_eq!(w.files("db-a", Folder::Unknown), 0, "nothing left in doubt");
    assert_eq!(w.files("db-a", Folder::Log), 1);
    assert_eq!(w.files("db-a", Folder::Error), 1);
    assert_eq!(w.inbox().await.messages.len(), 1, "the reply is delivered");
    let raised = alerts.raised();
    assert!(
        raised.iter().all(|(k, _)| !k.starts_with("missing_file:")),
        "every file was found: {raised:?}"
    );
    let cleared = alerts.cleared();
    assert!(cleared.contains(&format!("failed:{pid}")), "{cleared:?}");
    assert!(cleared.contains(&format!("in_doubt:{pid}")), "{cleared:?}");
}

#[tokio::test(start_paused = true)]
async fn a_later_commit_retries_failed_moves_at_once() {
    let w = World::new().await;
    let pid = w.prepared(1, 0).await;
    let log = w.data().join("db-a/Log");
    std::fs::write(&log, b"x").unwrap();
    assert_eq!(w.commit(&pid).await, CallStatus::Failed);
    std::fs::remove_file(&log).unwrap();
    std::fs::create_dir(&log).unwrap();
    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
    assert_eq!(w.state(&pid).await, ProcessState::Done);
}

#[tokio::test(start_paused = true)]
async fn start_filters_and_limits() {
    let w = World::new().await;
    let send = |who: &estafeta_exchange::tenancy::Principal, body: String| {
        let req = send_request("db-a", &body, None);
        let ex = w.ex.clone();
        let who = who.clone();
        async move { ex.send(&who, req).await.unwrap().0.id }
    };
    // phone-1: three small messages and one of 1.5 MB; phone-2: one.
    let mut from_phone1 = Vec::new();
    for i in 0..3 {
        from_phone1.push(send(&w.phone, format!(r#"{{"n":{i}}}"#)).await);
    }
    let big = send(
        &w.phone,
        format!(r#"{{"pad":"{}"}}"#, "x".repeat(1_500_000)),
    )
    .await;
    let other = send(&w.phone2, r#"{"n":9}"#.into()).await;
    let start =
        |senders: Option<Vec<&str>>, max_files: Option<u64>, max_mb: Option<f64>| StartRequest {
            version: Version,
            db_id: "db-a".parse().unwrap(),
            subsystems: Some(vec!["sales".parse().unwrap()]),
            senders: senders.map(|v| v.into_iter().map(|s| s.parse().unwrap()).collect()),
            max_files,
            max_mb,
        };
    let run = |req: StartRequest| {
        let ex = w.ex.clone();
        let db = w.db.clone();
        async move {
            let s: StartResponse =
                serde_json::from_slice(&ex.start(&db, req).await.unwrap()).unwrap();
            let ids: Vec<_> = s
                .messages
                .clone()
                .unwrap_or_default()
                .iter()
                .map(|m| m.id)
                .collect();
            if let Some(pid) = s.process_id {
                let r = ex
                    .abort(
                        &db,
                        &pid.to_string(),
                        AbortRequest {
                            version: Version,
                            message: "look only".into(),
                        },
                    )
                    .await;
                assert_eq!(r.unwrap().status, CallStatus::Ok);
            }
            ids
        }
    };
    // The caller's file limit is smaller than the server's.
    assert_eq!(
        run(start(None, Some(2), None)).await,
        from_phone1[..2].to_vec()
    );
    // Sender filter.
    assert_eq!(
        run(start(Some(vec!["phone-2"]), None, None)).await,
        vec![other]
    );
    // Megabyte limit: the big one does not fit behind the small ones...
    assert_eq!(
        run(start(Some(vec!["phone-1"]), None, Some(1.0))).await,
        from_phone1
    );
    // ...and alone at the head of the queue it is still sent by itself.
    let s = w.start().await;
    let pid = s.process_id.unwrap().to_string();
    let mut results = World::results(&s, ResultStatus::Processed);
    results.retain(|r| r.message_id != big);
    let keep: Vec<_> = results.iter().map(|r| r.message_id).collect();
    w.ex.accept(
        &w.db,
        &pid,
        AcceptRequest {
            version: Version,
            message_ids: keep,
        },
    )
    .await
    .unwrap();
    w.prepare(&pid, results, 0).await;
    w.commit(&pid).await;
    let req = start(Some(vec!["phone-1"]), None, Some(1.0));
    assert_eq!(run(req).await, vec![big]);
    // A subsystem that has no messages: IDLE.
    let mut none = start(None, None, None);
    none.subsystems = Some(vec!["hr".parse().unwrap()]);
    assert!(run(none).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_for_one_database_never_interleave() {
    let w = World::new().await;
    w.upload(3).await;
    // Twenty simultaneous starts for db-a: exactly one process, the rest BUSY.
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (ex, db, r) = (w.ex.clone(), w.db.clone(), start_request("db-a"));
        calls.spawn(async move {
            serde_json::from_slice::<StartResponse>(&ex.start(&db, r).await.unwrap())
                .unwrap()
                .status
        });
    }
    // Meanwhile db-b, with nothing waiting, answers at once.
    let idle: StartResponse =
        serde_json::from_slice(&w.ex.start(&w.db2, start_request("db-b")).await.unwrap()).unwrap();
    assert_eq!(idle.status, StartStatus::Idle);
    let mut ok = 0;
    while let Some(s) = calls.join_next().await {
        match s.unwrap() {
            StartStatus::Ok => ok += 1,
            StartStatus::Busy => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ok, 1);
    let list = w.ex.processes(&w.admin).await.unwrap();
    assert_eq!(list.processes.len(), 1);
}

/// The alerts an exchange raised (key and text) and the keys it cleared,
/// in the order it did so.
#[derive(Clone, Default)]
struct Alerts {
    raised: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
    cleared: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Every raise (`true`) and clear, by key.
    events: std::sync::Arc<std::sync::Mutex<Vec<(bool, String)>>>,
}

impl Alerts {
    fn raised(&self) -> Vec<(String, String)> {
        self.raised.lock().unwrap().clone()
    }
    fn cleared(&self) -> Vec<String> {
        self.cleared.lock().unwrap().clone()
    }
    /// Whether the alert `key` is open: raised, and not cleared since.
    fn open(&self, key: &str) -> bool {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .rev()
            .find(|(_, k)| k == key)
            .is_some_and(|(raised, _)| *raised)
    }
}

impl Alerts {
    /// Sinks that record alerts here (and push nothing).
    fn sinks(&self) -> estafeta_exchange::Sinks {
        estafeta_exchange::Sinks {
            alerts: std::sync::Arc::new(self.clone()),
            ..Default::default()
        }
    }
}

impl estafeta_exchange::AlertSink for Alerts {
    fn raise(&self, alert: estafeta_exchange::Alert) -> estafeta_session::BoxFuture<'_, ()> {
        self.events.lock().unwrap().push((true, alert.key.clone()));
        self.raised.lock().unwrap().push((alert.key, alert.text));
        Box::pin(async {})
    }
    fn clear(&self, key: String) -> estafeta_session::BoxFuture<'_, ()> {
        self.events.lock().unwrap().push((false, key.clone()));
        self.cleared.lock().unwrap().push(key);
        Box::pin(async {})
    }
}

#[tokio::test(start_paused = true)]
async fn a_commit_whose_message_vanished_alerts_naming_the_file() {
    let alerts = Alerts::default();
    let w = World::with_sinks(|_| alerts.sinks()).await;
    let pid = w.prepared(1, 1).await;
    let queue = w.data().join("db-a").join(Folder::Messages.as_str());
    let file = std::fs::read_dir(&queue)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| !n.starts_with('.'))
        .unwrap();
    std::fs::remove_file(queue.join(&file)).unwrap();

    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
    let raised = alerts.raised();
    assert_eq!(raised.len(), 1, "{raised:?}");
    let (key, text) = &raised[0];
    assert_eq!(key, &format!("missing_file:{file}"));
    assert!(text.contains(&file), "{text}");
}

/// The committed verdicts on `device`'s messages: processed, deadlocked,
/// incorrect.
async fn device_verdicts(w: &World, device: &str) -> (u64, u64, u64) {
    let stats = w.ex.stats(&w.admin).await.unwrap();
    let d = stats
        .devices
        .iter()
        .find(|d| d.id.as_str() == device)
        .unwrap();
    (d.processed, d.deadlocks, d.incorrect)
}

#[tokio::test(start_paused = true)]
async fn verdicts_are_counted_per_sending_device_when_a_commit_lands_and_kept() {
    let w = World::new().await;
    let (s, pid) = w.started(3).await;
    let mut results = World::results(&s, ResultStatus::Processed);
    results[1].status = ResultStatus::ProcessedDeadlock;
    results[2].status = ResultStatus::ProcessedIncorrect;
    assert_eq!(w.prepare(&pid, results, 1).await, CallStatus::Ok);
    assert_eq!(
        device_verdicts(&w, "phone-1").await,
        (0, 0, 0),
        "not before the commit"
    );
    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
    assert_eq!(device_verdicts(&w, "phone-1").await, (1, 1, 1));
    assert_eq!(device_verdicts(&w, "phone-2").await, (0, 0, 0));
    // A process rolled back counts nothing.
    let s = w.start().await;
    let pid = s.process_id.unwrap().to_string();
    let results = World::results(&s, ResultStatus::Processed);
    assert_eq!(w.prepare(&pid, results, 0).await, CallStatus::Ok);
    assert_eq!(w.rollback(&pid).await, CallStatus::Ok);
    assert_eq!(device_verdicts(&w, "phone-1").await, (1, 1, 1));
    // Durable: the same after a restart.
    let w = w
        .restart(estafeta_session::Timestamp(1_800_000_100_000))
        .await;
    assert_eq!(device_verdicts(&w, "phone-1").await, (1, 1, 1));
}
