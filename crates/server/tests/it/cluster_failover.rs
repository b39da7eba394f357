//! The PostgreSQL primary of a cluster killed (`kill -9`) with a
//! synchronous standby, which is then promoted: two `estafeta serve` nodes
//! started once with the multi-host URL (`target_session_attrs=read-write`)
//! answer 503 with `Retry-After` while there is no primary, never a wrong
//! answer, find the promoted server by themselves, and every acknowledged
//! message and process state is there.

use std::collections::BTreeSet;

use crate::common::cluster::{assert_retryable, eventually, folder_ids, retrying, start_nodes};
use crate::common::{id, message, prepare_all, start_request};
use estafeta_client::{Client, ClientError};
use estafeta_exchange::MessageId;
use estafeta_exchange::wire::{CallStatus, Folder, ProcessState, StartStatus};
use estafeta_postgres::testing::Postgres;

/// An answer during the switch: what the call should give, or a failure
/// the client may retry (503 with `Retry-After`, or no answer).
fn during_switch<T>(answer: Result<T, ClientError>) -> Option<T> {
    match answer {
        Ok(v) => Some(v),
        Err(e) => {
            assert_retryable(&e);
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_carry_on_through_a_primary_failover() {
    let primary = Postgres::start().unwrap();
    let standby = primary.standby().unwrap();
    let url = format!(
        "postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
        primary.host_port(),
        standby.host_port()
    );
    let dir = tempfile::tempdir().unwrap();
    let (nodes, admin) = start_nodes(dir.path(), &url, 2, &[]).await;
    let pids: Vec<i32> = nodes.iter().map(|n| n.pid()).collect();
    let admin_client = nodes[0].client(&admin);
    admin_client.create_enterprise(&id("acme")).await.unwrap();
    admin_client
        .create_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();
    let db_token = admin_client
        .create_database(&id("acme"), &id("db-a"))
        .await
        .unwrap()
        .token;
    let phone_token = admin_client
        .create_device(&id("acme"), &id("phone-1"), &id("sales"))
        .await
        .unwrap()
        .token;
    let dbs: Vec<Client> = nodes.iter().map(|n| n.client(&db_token)).collect();
    let phones: Vec<Client> = nodes.iter().map(|n| n.client(&phone_token)).collect();

    // Before the failover: uploads through both nodes, one process DONE and
    // one READY_TO_COMMIT, all acknowledged.
    let mut uploaded = BTreeSet::new();
    for i in 0..10 {
        let key = format!("before-{i}");
        let s = phones[i % 2]
            .send(&message("db-a", "{}", Some(&key)))
            .await
            .unwrap();
        uploaded.insert(s.accepted.id);
    }
    let limited = |n: u64| {
        let mut r = start_request("db-a");
        r.max_files = Some(n);
        r
    };
    let done = dbs[0].start(&limited(4)).await.unwrap();
    let done_pid = done.process_id.unwrap();
    let done_ids: Vec<MessageId> = done.messages.unwrap().iter().map(|m| m.id).collect();
    let p = dbs[1]
        .prepare(
            &done_pid,
            &prepare_all(done_ids.iter().copied(), r#"{"ok":true}"#),
        )
        .await
        .unwrap();
    assert_eq!(p.status, CallStatus::Ok);
    let c = dbs[0].commit(&done_pid).await.unwrap();
    assert_eq!(c.status, CallStatus::Ok);
    let ready = dbs[1].start(&limited(3)).await.unwrap();
    let ready_pid = ready.process_id.unwrap();
    let ready_ids: Vec<MessageId> = ready.messages.unwrap().iter().map(|m| m.id).collect();
    let p = dbs[0]
        .prepare(
            &ready_pid,
            &prepare_all(ready_ids.iter().copied(), r#"{"ok":true}"#),
        )
        .await
        .unwrap();
    assert_eq!(p.status, CallStatus::Ok);

    primary.kill().unwrap();

    // No primary: every call is refused as retryable, and nothing is
    // answered wrong. Uploads keep their keys for the retries after.
    for node in 0..2 {
        eventually("a 503 while there is no primary", || async {
            let answer = phones[node]
                .send(&message("db-a", "{}", Some("during-0")))
                .await;
            during_switch(answer).is_none().then_some(())
        })
        .await;
        let state = during_switch(dbs[node].process(&ready_pid).await);
        if let Some(s) = state {
            assert_eq!(s.state, ProcessState::ReadyToCommit);
        }
        during_switch(phones[node].inbox(None).await);
        // Nothing can be made durable: these calls are refused, not answered.
        let refused = [
            dbs[node].commit(&ready_pid).await.err(),
            dbs[node].start(&start_request("db-a")).await.err(),
            nodes[node]
                .client(&admin)
                .create_database(&id("acme"), &id("db-late"))
                .await
                .err(),
        ];
        for e in refused {
            let e = e.expect("a call answered while there is no primary");
            assert_retryable(&e);
            eprintln!("without a primary: {e}");
        }
    }

    standby.promote().unwrap();

    // Each node finds the promoted server by itself (no restart), its calls
    // failing only as retryable until then.
    let mut during = BTreeSet::new();
    for (node, phone) in phones.iter().enumerate() {
        let key = format!("during-{node}");
        let s = eventually("the node to write to the promoted server", || async {
            during_switch(phone.send(&message("db-a", "{}", Some(&key))).await)
        })
        .await;
        during.insert(s.accepted.id);
    }
    for (node, pid) in nodes.iter().zip(&pids) {
        assert!(node.alive(), "node {pid} still runs");
        assert_eq!(node.pid(), *pid);
    }

    // Everything acknowledged before the failover is there: the DONE
    // process and its messages, the READY_TO_COMMIT one, which commits
    // through the other node now, and every waiting upload.
    let s = retrying("state", || dbs[1].process(&done_pid))
        .await
        .unwrap();
    assert_eq!(s.state, ProcessState::Done);
    let s = retrying("state", || dbs[1].process(&ready_pid))
        .await
        .unwrap();
    assert_eq!(s.state, ProcessState::ReadyToCommit);
    let c = retrying("commit", || dbs[1].commit(&ready_pid))
        .await
        .unwrap();
    assert_eq!(c.status, CallStatus::Ok);
    let admin_client = nodes[1].client(&admin);
    let log = folder_ids(&admin_client, "db-a", Folder::Log).await;
    let expected_log: BTreeSet<MessageId> = done_ids.iter().chain(&ready_ids).copied().collect();
    assert_eq!(log, expected_log);
    let waiting = folder_ids(&admin_client, "db-a", Folder::Messages).await;
    let expected_waiting: BTreeSet<MessageId> = uploaded
        .difference(&expected_log)
        .chain(&during)
        .copied()
        .collect();
    assert_eq!(waiting, expected_waiting);
    let inbox = retrying("inbox", || phones[0].inbox(None)).await.unwrap();
    assert_eq!(inbox.messages.len(), 2, "one reply per committed process");
    // And the cluster goes on: the rest is processed through the nodes.
    let start = start_request("db-a");
    let started = retrying("start", || dbs[0].start(&start)).await.unwrap();
    assert_eq!(started.status, StartStatus::Ok);
    let rest: BTreeSet<MessageId> = started.messages.unwrap().iter().map(|m| m.id).collect();
    assert_eq!(rest, expected_waiting);
}
