//! The simulators against a real server over loopback: every uploaded
//! message is applied exactly once or moved to `Error`, every final verdict
//! reaches its device exactly once, and a processor that dies at any step
//! of its cycle settles its process when it comes back.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use crate::common::{TestServer, id, provision};
use estafeta_client::Client;
use estafeta_sim::{Cycle, Device, Processor, ProcessorConfig, Step};
use estafeta_wire::{Folder, MessageId, ProcessState};

/// A processor on `path` for `db-a` with the given rates.
fn processor(path: &Path, client: &Client, seed: u64, faulty: bool) -> Processor {
    let mut config = ProcessorConfig::new(id("db-a"));
    config.seed = seed;
    config.max_files = Some(4);
    if faulty {
        config.reject_rate = 0.2;
        config.deadlock_rate = 0.2;
        config.incorrect_rate = 0.1;
        config.commit_failure_rate = 0.2;
    }
    Processor::open(path, client.clone(), config).unwrap()
}

/// Devices upload `per_device` messages each; their ids.
async fn upload(devices: &mut [Device], per_device: usize) -> Vec<MessageId> {
    for d in devices.iter_mut() {
        for _ in 0..per_device {
            d.compose(&id("db-a")).unwrap();
        }
        assert_eq!(d.flush().await.unwrap(), per_device);
    }
    devices.iter().flat_map(|d| d.sent().to_vec()).collect()
}

/// A server with `db-a` provisioned: its client, and its devices.
async fn provisioned() -> (TestServer, Client, Vec<Device>) {
    let server = TestServer::start(|_| {}).await;
    let (db, phones) = provision(&server.admin).await;
    let devices = phones
        .into_iter()
        .map(|(name, c)| Device::new(c, name, "t1"))
        .collect();
    (server, db, devices)
}

/// Runs `p` until the queue is empty (deadlocked messages come back).
async fn drain(p: &mut Processor, server: &TestServer) {
    for _ in 0..200 {
        p.run_until_idle().await.unwrap();
        if server.folder("db-a", Folder::Messages).await.is_empty() {
            return;
        }
    }
    panic!("the queue did not drain");
}

/// The invariants of issue 7 for `sent`: applied once and in `Log`, or in
/// `Error`; nothing left in `Prepared`, `Unknown` or `Messages`; one reply
/// per message at its device.
async fn check(server: &TestServer, p: &Processor, devices: &mut [Device], sent: &[MessageId]) {
    let applied: HashSet<MessageId> = p.applied().unwrap().into_iter().collect();
    assert!(p.duplicates().unwrap().is_empty());
    assert_eq!(p.unsettled().unwrap(), 0);
    let log: HashSet<_> = server
        .folder("db-a", Folder::Log)
        .await
        .into_iter()
        .collect();
    let error: HashSet<_> = server
        .folder("db-a", Folder::Error)
        .await
        .into_iter()
        .collect();
    for m in sent {
        let done = applied.contains(m) && log.contains(m) && !error.contains(m);
        let incorrect = error.contains(m) && !applied.contains(m) && !log.contains(m);
        assert!(
            done ^ incorrect,
            "message {m}: applied, Log and Error disagree"
        );
    }
    assert_eq!(applied.len() + error.len(), sent.len());
    for folder in [Folder::Prepared, Folder::Unknown, Folder::Messages] {
        assert!(server.folder("db-a", folder).await.is_empty(), "{folder:?}");
    }
    let mut replies: HashMap<String, usize> = HashMap::new();
    for d in devices.iter_mut() {
        while d.poll(100).await.unwrap() > 0 {}
        for m in d.received() {
            let body: serde_json::Value = m.body.parse().unwrap();
            *replies
                .entry(body["re"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    for m in sent {
        assert_eq!(replies.get(&m.to_string()), Some(&1), "replies to {m}");
    }
    assert_eq!(replies.len(), sent.len());
    let processes = server.admin.processes().await.unwrap().processes;
    assert!(
        processes
            .iter()
            .all(|p| !p.state.is_live() && p.state != ProcessState::InDoubt)
    );
}

#[tokio::test]
async fn every_message_is_applied_once_or_incorrect_and_answered_once() {
    let (server, db, mut devices) = provisioned().await;
    let sent = upload(&mut devices, 15).await;
    let sqlite = server.data.path().join("db-a.sqlite");
    let mut p = processor(&sqlite, &db, 7, true);
    drain(&mut p, &server).await;
    check(&server, &p, &mut devices, &sent).await;
    server.stop().await;
}

#[tokio::test]
async fn an_idle_queue_answers_idle_and_an_upload_retried_with_its_key_is_one_message() {
    let server = TestServer::start(|_| {}).await;
    let (db, phones) = provision(&server.admin).await;
    let sqlite = server.data.path().join("db-a.sqlite");
    let mut p = processor(&sqlite, &db, 1, false);
    assert_eq!(p.run_once().await.unwrap(), Cycle::Idle);

    let (name, phone) = phones.into_iter().next().unwrap();
    let mut device = Device::new(phone.clone(), name.clone(), "t2");
    // A second device object with the same session makes the same key,
    // as the same device would after a lost 201.
    let mut again = Device::new(phone, name, "t2");
    device.compose(&id("db-a")).unwrap();
    again.compose(&id("db-a")).unwrap();
    device.flush().await.unwrap();
    again.flush().await.unwrap();
    assert_eq!(device.sent(), again.sent());
    assert_eq!(again.repeated_uploads(), 1);
    assert_eq!(server.folder("db-a", Folder::Messages).await.len(), 1);
    server.stop().await;
}

/// A processor that dies right after `step` (its task ends and its
/// connection closes without a commit, as after `kill -9`), then a fresh
/// processor on the same file.
async fn crash_at(step: Step, ready_timeout: Option<Duration>) {
    let server = TestServer::start(|c| {
        // A crash right after `start` leaves a process the processor never
        // recorded: only the STARTED timeout frees the database.
        c.started_timeout = Duration::from_millis(500);
        if let Some(t) = ready_timeout {
            c.ready_timeout = t;
        }
    })
    .await;
    let (db, phones) = provision(&server.admin).await;
    let mut devices: Vec<Device> = phones
        .into_iter()
        .map(|(name, c)| Device::new(c, name, "t3"))
        .collect();
    let sent = upload(&mut devices, 3).await;
    let sqlite = server.data.path().join("db-a.sqlite");

    let mut doomed = processor(&sqlite, &db, 3, false);
    doomed.set_step_hook(Box::new(move |at, _| {
        if at == step {
            panic!("simulated crash at {at:?}");
        }
    }));
    let crashed = tokio::spawn(async move { doomed.run_once().await }).await;
    assert!(crashed.unwrap_err().is_panic());

    if ready_timeout.is_some() && step >= Step::Prepared && step < Step::Settled {
        // The server puts the process in doubt before the processor returns.
        let mut in_doubt = false;
        for _ in 0..1000 {
            let ps = server.admin.processes().await.unwrap().processes;
            if ps.iter().any(|p| p.state == ProcessState::InDoubt) {
                in_doubt = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(in_doubt, "the process did not go in doubt");
        assert!(!server.folder("db-a", Folder::Unknown).await.is_empty());
    }

    let mut p = processor(&sqlite, &db, 4, false);
    drain(&mut p, &server).await;
    check(&server, &p, &mut devices, &sent).await;
    server.stop().await;
}

#[tokio::test]
async fn a_processor_killed_at_any_step_settles_when_it_comes_back() {
    for step in Step::ALL {
        crash_at(step, None).await;
    }
}

#[tokio::test]
async fn a_processor_back_after_the_ready_timeout_settles_the_doubt() {
    for step in [Step::Prepared, Step::CommittedLocally] {
        crash_at(step, Some(Duration::from_millis(300))).await;
    }
}

/// A processor that schedules its replies (`deliver_at`, an hour ahead):
/// its cycles complete as usual, no reply reaches a device before its
/// time, and the server's scheduler keeps every one of them meanwhile.
#[tokio::test]
async fn scheduled_replies_are_kept_for_their_time() {
    let (server, db, mut devices) = provisioned().await;
    let sent = upload(&mut devices, 5).await;
    let mut config = ProcessorConfig::new(id("db-a"));
    config.scheduled_reply_rate = 1.0;
    config.reply_delay = Duration::from_secs(3_600);
    let sqlite = server.data.path().join("db-a.sqlite");
    let mut p = Processor::open(&sqlite, db.clone(), config).unwrap();
    drain(&mut p, &server).await;
    assert_eq!(p.applied().unwrap().len(), sent.len());
    for d in devices.iter_mut() {
        assert_eq!(d.poll(100).await.unwrap(), 0, "no reply before its time");
    }
    let scheduled = server.admin.scheduled_messages().await.unwrap();
    assert_eq!(scheduled, Some(sent.len() as u64));
    server.stop().await;
}
