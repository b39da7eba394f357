//! Three `estafeta serve` nodes over one throwaway PostgreSQL, and what
//! happens to the cluster when one of them dies or freezes:
//!
//! - calls for one database spread over the nodes run the whole process
//!   cycle, BUSY is cluster-wide, and one idempotency key sent through every
//!   node at once makes one message;
//! - a node killed with `kill -9` under load loses nothing it acknowledged,
//!   its process goes on through another node, and the deadlines of the
//!   processes it began are acted on by a live node;
//! - a node paused (SIGSTOP) inside a step blocks its database only until
//!   the server ends its transaction (`idle_in_transaction_session_timeout`),
//!   and once resumed it cannot undo what the others did meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::cluster::{
    Node, assert_retryable, eventually, folder_ids, retrying, start_nodes, with_params,
};
use crate::common::{id, message, prepare_all, process_all, start_ok, start_request};
use estafeta_client::{Client, ClientError, Upload};
use estafeta_exchange::wire::{Body, CallStatus, Folder, Message, ProcessState, StartStatus};
use estafeta_exchange::{MessageId, ProcessId};
use estafeta_postgres::testing::Postgres;

/// The tokens of the tenancy the tests use: enterprise `acme` with
/// subsystem `sales`, databases `db-a` and `db-b`, device `phone-1`.
struct Tokens {
    admin: String,
    db_a: String,
    db_b: String,
    phone: String,
}

async fn provision(admin: &Client, admin_token: &str) -> Tokens {
    admin.create_enterprise(&id("acme")).await.unwrap();
    admin
        .create_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();
    let db_a = admin.create_database(&id("acme"), &id("db-a")).await;
    let db_b = admin.create_database(&id("acme"), &id("db-b")).await;
    let phone = admin
        .create_device(&id("acme"), &id("phone-1"), &id("sales"))
        .await;
    Tokens {
        admin: admin_token.to_owned(),
        db_a: db_a.unwrap().token,
        db_b: db_b.unwrap().token,
        phone: phone.unwrap().token,
    }
}

fn ids(messages: &[Message]) -> BTreeSet<MessageId> {
    messages.iter().map(|m| m.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_take_turns_on_one_database() {
    const ROUNDS: usize = 12;
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (nodes, admin) = start_nodes(dir.path(), &pg.url(), 3, &[]).await;
    let t = provision(&nodes[0].client(&admin), &admin).await;
    let mut uploaded = BTreeSet::new();
    for round in 0..ROUNDS {
        // The k-th node of this round: every call moves on to the next node.
        let node = |k: usize| &nodes[(round + k) % nodes.len()];
        let mut sent = BTreeSet::new();
        for k in 0..3 {
            let body = format!(r#"{{"round":{round},"k":{k}}}"#);
            let s = node(k)
                .client(&t.phone)
                .send(&message("db-a", &body, None))
                .await
                .unwrap();
            sent.insert(s.accepted.id);
        }
        let started = start_ok(&node(1).client(&t.db_a), "db-a").await;
        let pid = started.process_id.unwrap();
        let messages = started.messages.unwrap();
        assert_eq!(
            ids(&messages),
            sent,
            "round {round}: the messages just sent"
        );
        for k in [2, 0] {
            let other = node(k)
                .client(&t.db_a)
                .start(&start_request("db-a"))
                .await
                .unwrap();
            assert_eq!(other.status, StartStatus::Busy, "round {round}, node {k}");
        }
        let reply = format!(r#"{{"round":{round}}}"#);
        let prepared = node(2)
            .client(&t.db_a)
            .prepare(&pid, &prepare_all(messages.iter().map(|m| m.id), &reply))
            .await
            .unwrap();
        assert_eq!(prepared.status, CallStatus::Ok);
        let committed = node(0).client(&t.db_a).commit(&pid).await.unwrap();
        assert_eq!(committed.status, CallStatus::Ok);
        let state = node(1).client(&t.db_a).process(&pid).await.unwrap();
        assert_eq!(state.state, ProcessState::Done);

        let inbox = node(1).client(&t.phone).inbox(None).await.unwrap();
        assert_eq!(inbox.messages.len(), 1, "round {round}: one reply");
        assert_eq!(
            inbox.messages[0].body,
            Body::from_json(&reply).unwrap(),
            "round {round}"
        );
        let acked = node(2)
            .client(&t.phone)
            .ack(&[inbox.messages[0].id])
            .await
            .unwrap();
        assert_eq!(acked.acked, 1);
        uploaded.extend(sent);
    }
    let idle = nodes[0]
        .client(&t.db_a)
        .start(&start_request("db-a"))
        .await
        .unwrap();
    assert_eq!(idle.status, StartStatus::Idle);
    let admin = nodes[1].client(&t.admin);
    assert_eq!(folder_ids(&admin, "db-a", Folder::Log).await, uploaded);
    assert!(
        folder_ids(&admin, "db-a", Folder::Messages)
            .await
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sent_at_once_through_three_nodes_act_once() {
    // At most the ten messages a start hands out by default.
    const KEYS: usize = 10;
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (nodes, admin) = start_nodes(dir.path(), &pg.url(), 3, &[]).await;
    let t = provision(&nodes[0].client(&admin), &admin).await;
    let phones: Vec<Client> = nodes.iter().map(|n| n.client(&t.phone)).collect();

    // One key sent through the three nodes at once: one message, the same
    // id in every answer, made by one of the three uploads.
    let mut made = BTreeSet::new();
    for k in 0..KEYS {
        let key = format!("key-{k}");
        let upload = message("db-a", &format!(r#"{{"k":{k}}}"#), Some(&key));
        let (a, b, c) = tokio::join!(
            phones[0].send(&upload),
            phones[1].send(&upload),
            phones[2].send(&upload)
        );
        let answers = [a.unwrap(), b.unwrap(), c.unwrap()];
        let id = answers[0].accepted.id;
        assert!(answers.iter().all(|s| s.accepted.id == id), "key {key}");
        let created = answers
            .iter()
            .filter(|s| s.upload == Upload::Created)
            .count();
        assert_eq!(created, 1, "key {key}: one upload made the message");
        made.insert(id);
    }
    let admin = nodes[0].client(&t.admin);
    assert_eq!(folder_ids(&admin, "db-a", Folder::Messages).await, made);

    // Three starts at once through the three nodes: one process, two BUSY.
    let dbs: Vec<Client> = nodes.iter().map(|n| n.client(&t.db_a)).collect();
    for round in 0..4 {
        let start = start_request("db-a");
        let (a, b, c) = tokio::join!(
            dbs[0].start(&start),
            dbs[1].start(&start),
            dbs[2].start(&start)
        );
        let answers = [a.unwrap(), b.unwrap(), c.unwrap()];
        let winners: Vec<_> = answers
            .iter()
            .filter(|s| s.status == StartStatus::Ok)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {answers:?}");
        assert_eq!(
            answers
                .iter()
                .filter(|s| s.status == StartStatus::Busy)
                .count(),
            2
        );
        let winner = winners[0];
        assert_eq!(ids(winner.messages.as_ref().unwrap()), made);
        let pid = winner.process_id.unwrap();
        let rolled = dbs[round % 3].rollback(&pid, "again").await.unwrap();
        assert_eq!(rolled.status, CallStatus::Ok);
    }
    assert_eq!(folder_ids(&admin, "db-a", Folder::Messages).await, made);
}

/// What a processor working through one node saw before the node died.
#[derive(Default)]
struct Processed {
    /// Processes whose commit answered OK, with their messages.
    committed: Vec<(ProcessId, BTreeSet<MessageId>)>,
    /// The process that was under way when a call failed, if any.
    in_flight: Option<ProcessId>,
}

/// Cycles start → prepare → commit for `db-a` through `db` until a call
/// fails (the node died); every answer before that must be right.
async fn process_until_failure(db: Client, seen: Arc<Mutex<Processed>>) {
    for round in 0.. {
        let started = match db.start(&start_request("db-a")).await {
            Ok(s) => s,
            Err(_) => return,
        };
        if started.status != StartStatus::Ok {
            assert_eq!(started.status, StartStatus::Idle);
            continue;
        }
        let pid = started.process_id.unwrap();
        seen.lock().unwrap().in_flight = Some(pid);
        let messages = started.messages.unwrap();
        let reply = format!(r#"{{"round":{round}}}"#);
        match db
            .prepare(&pid, &prepare_all(messages.iter().map(|m| m.id), &reply))
            .await
        {
            Ok(p) => assert_eq!(p.status, CallStatus::Ok),
            Err(_) => return,
        }
        match db.commit(&pid).await {
            Ok(c) => assert_eq!(c.status, CallStatus::Ok),
            Err(_) => return,
        }
        let mut seen = seen.lock().unwrap();
        seen.in_flight = None;
        seen.committed.push((pid, ids(&messages)));
    }
}

/// Uploads with keys `{task}-0`, `{task}-1`, … through `phone` until one
/// gets no answer (the node died); returns what was acknowledged and the
/// key left without an answer.
async fn upload_until_failure(
    phone: Client,
    task: usize,
) -> (BTreeMap<String, MessageId>, Option<String>) {
    let mut acked = BTreeMap::new();
    for i in 0.. {
        let key = format!("{task}-{i}");
        let body = format!(r#"{{"task":{task},"i":{i}}}"#);
        match phone.send(&message("db-a", &body, Some(&key))).await {
            Ok(s) => {
                acked.insert(key, s.accepted.id);
            }
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                return (acked, Some(key));
            }
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_load_loses_nothing_it_acknowledged() {
    const UPLOADERS: usize = 3;
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let env = [("ESTAFETA_STARTED_TIMEOUT", "3s")];
    let (mut nodes, admin) = start_nodes(dir.path(), &pg.url(), 3, &env).await;
    let t = provision(&nodes[0].client(&admin), &admin).await;
    let victim = nodes.remove(0);

    // A process made READY_TO_COMMIT on db-b through the victim, to be
    // committed through a survivor once the victim is dead.
    let to_b = victim
        .client(&t.phone)
        .send(&message("db-b", "{}", None))
        .await
        .unwrap()
        .accepted
        .id;
    let on_b = victim
        .client(&t.db_b)
        .start(&start_request("db-b"))
        .await
        .unwrap();
    let ready_pid = on_b.process_id.unwrap();
    let prepare = prepare_all(on_b.messages.unwrap().iter().map(|m| m.id), "{}");
    let p = victim.client(&t.db_b).prepare(&ready_pid, &prepare).await;
    assert_eq!(p.unwrap().status, CallStatus::Ok);
    // And one left STARTED on db-c, to be rolled back through a survivor.
    let db_c = nodes[0]
        .client(&admin)
        .create_database(&id("acme"), &id("db-c"))
        .await
        .unwrap()
        .token;
    let to_c = victim
        .client(&t.phone)
        .send(&message("db-c", "{}", None))
        .await
        .unwrap()
        .accepted
        .id;
    let on_c = victim.client(&db_c).start(&start_request("db-c")).await;
    let started_pid = on_c.unwrap().process_id.unwrap();

    let uploads: Vec<_> = (0..UPLOADERS)
        .map(|task| tokio::spawn(upload_until_failure(victim.client(&t.phone), task)))
        .collect();
    let seen = Arc::new(Mutex::new(Processed::default()));
    let processor = tokio::spawn(process_until_failure(victim.client(&t.db_a), seen.clone()));
    // Kill it once it has committed some processes, with uploads and a
    // process under way.
    let admin = nodes[0].client(&t.admin);
    eventually("two commits through the victim", || async {
        (seen.lock().unwrap().committed.len() >= 2).then_some(())
    })
    .await;
    victim.kill9().await;
    processor.await.unwrap();

    let (survivor, other) = (&nodes[0], &nodes[1]);
    let mut acked = BTreeMap::new();
    for upload in uploads {
        let (done, unanswered) = upload.await.unwrap();
        acked.extend(done);
        // The upload that got no answer is sent again through a survivor,
        // with the same key: one message whether or not the victim stored it.
        if let Some(key) = unanswered {
            let phone = survivor.client(&t.phone);
            let upload = message("db-a", r#"{"again":true}"#, Some(&key));
            let again = retrying("upload again", || phone.send(&upload))
                .await
                .unwrap();
            acked.insert(key, again.accepted.id);
        }
    }
    let uploaded: BTreeSet<MessageId> = acked.values().copied().collect();
    assert_eq!(uploaded.len(), acked.len(), "one message per key");

    let (committed, in_flight) = {
        let seen = seen.lock().unwrap();
        (seen.committed.clone(), seen.in_flight)
    };
    let mut done = committed.len();
    // The process under way when the victim died goes on through another
    // node: a commit if it got as far as its prepare (the victim may have
    // died inside its commit, between the intent record and the moves:
    // CLEANUP, which a commit finishes), else a rollback.
    if let Some(pid) = in_flight {
        let other_db = other.client(&t.db_a);
        let state = retrying("process state", || other_db.process(&pid))
            .await
            .unwrap()
            .state;
        let db = survivor.client(&t.db_a);
        if matches!(state, ProcessState::Started | ProcessState::TimedOut) {
            let rolled = retrying("rollback", || db.rollback(&pid, "node died"))
                .await
                .unwrap();
            assert_eq!(rolled.status, CallStatus::Ok);
        } else {
            assert!(
                matches!(
                    state,
                    ProcessState::ReadyToCommit
                        | ProcessState::Cleanup
                        | ProcessState::Failed
                        | ProcessState::Done
                ),
                "{state:?}"
            );
            let c = retrying("commit", || db.commit(&pid)).await.unwrap();
            assert_eq!(c.status, CallStatus::Ok);
            done += 1;
        }
        let end = other.client(&t.db_a).process(&pid).await.unwrap().state;
        assert!(
            matches!(
                end,
                ProcessState::Done | ProcessState::RolledBack | ProcessState::TimedOut
            ),
            "{end:?}"
        );
    }
    // Whatever is left is processed through the survivors. A start the
    // victim committed without getting to answer it left a process no one
    // knows: BUSY until its STARTED timeout, which a survivor acts on.
    let other_db = other.client(&t.db_a);
    loop {
        let started = eventually("db-a not BUSY", || async {
            let s = other_db.start(&start_request("db-a")).await.unwrap();
            (s.status != StartStatus::Busy).then_some(s)
        })
        .await;
        if started.status == StartStatus::Idle {
            break;
        }
        let pid = started.process_id.unwrap();
        let messages = started.messages.unwrap();
        let db = survivor.client(&t.db_a);
        process_all(
            &db,
            &pid,
            messages.iter().map(|m| m.id),
            r#"{"after":true}"#,
        )
        .await;
        done += 1;
    }
    let db_b = survivor.client(&t.db_b);
    let c = retrying("commit on db-b", || db_b.commit(&ready_pid)).await;
    assert_eq!(c.unwrap().status, CallStatus::Ok);
    let state = other.client(&t.db_b).process(&ready_pid).await.unwrap();
    assert_eq!(state.state, ProcessState::Done);
    assert_eq!(
        folder_ids(&admin, "db-b", Folder::Log).await,
        BTreeSet::from([to_b])
    );
    done += 1;
    // The rollback answers OK whether it came first or the STARTED
    // timeout did; the message waits again either way.
    let c = survivor.client(&db_c);
    let rolled = retrying("rollback on db-c", || c.rollback(&started_pid, "node died")).await;
    assert_eq!(rolled.unwrap().status, CallStatus::Ok);
    let state = other.client(&db_c).process(&started_pid).await.unwrap();
    assert!(
        matches!(
            state.state,
            ProcessState::RolledBack | ProcessState::TimedOut
        ),
        "{:?}",
        state.state
    );
    assert_eq!(
        folder_ids(&admin, "db-c", Folder::Messages).await,
        BTreeSet::from([to_c])
    );
    // Every acknowledged upload was processed exactly once, and every
    // process that ended DONE left its one reply.
    assert_eq!(folder_ids(&admin, "db-a", Folder::Log).await, uploaded);
    for (pid, messages) in &committed {
        assert!(messages.is_subset(&uploaded), "{pid}");
    }
    assert_eq!(
        folder_ids(&admin, "phone-1", Folder::Messages).await.len(),
        done
    );
    eprintln!(
        "killed after {} acknowledged uploads and {} commits",
        acked.len(),
        committed.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_of_a_dead_nodes_processes_are_met_by_a_live_node() {
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("ESTAFETA_STARTED_TIMEOUT", "2s"),
        ("ESTAFETA_READY_TIMEOUT", "2s"),
    ];
    let (mut nodes, admin) = start_nodes(dir.path(), &pg.url(), 3, &env).await;
    let t = provision(&nodes[0].client(&admin), &admin).await;
    let victim = nodes.remove(0);

    let phone = nodes[0].client(&t.phone);
    let to_a = phone
        .send(&message("db-a", r#"{"n":1}"#, None))
        .await
        .unwrap();
    let to_b = phone
        .send(&message("db-b", r#"{"n":2}"#, None))
        .await
        .unwrap();
    // On the victim: a process left STARTED on db-a, one READY_TO_COMMIT on db-b.
    let started = victim
        .client(&t.db_a)
        .start(&start_request("db-a"))
        .await
        .unwrap();
    let started_pid = started.process_id.unwrap();
    let ready = victim
        .client(&t.db_b)
        .start(&start_request("db-b"))
        .await
        .unwrap();
    let ready_pid = ready.process_id.unwrap();
    let prepared = victim
        .client(&t.db_b)
        .prepare(
            &ready_pid,
            &prepare_all(ready.messages.unwrap().iter().map(|m| m.id), "{}"),
        )
        .await
        .unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);
    victim.kill9().await;

    let state = |node: &Node, token: &str, pid: ProcessId| {
        let c = node.client(token);
        async move { c.process(&pid).await.map(|s| s.state) }
    };
    eventually("the STARTED process to time out", || async {
        let s = state(&nodes[0], &t.db_a, started_pid).await.unwrap();
        (s == ProcessState::TimedOut).then_some(())
    })
    .await;
    eventually("the READY_TO_COMMIT process to be in doubt", || async {
        let s = state(&nodes[1], &t.db_b, ready_pid).await.unwrap();
        (s == ProcessState::InDoubt).then_some(())
    })
    .await;

    // Timed out once: its message is back in the queue once, and a start
    // through another node hands it out.
    let admin = nodes[1].client(&t.admin);
    let queued = folder_ids(&admin, "db-a", Folder::Messages).await;
    assert_eq!(queued, BTreeSet::from([to_a.accepted.id]));
    let again = start_ok(&nodes[1].client(&t.db_a), "db-a").await;
    assert_ne!(again.process_id, Some(started_pid));
    assert_eq!(
        ids(&again.messages.unwrap()),
        BTreeSet::from([to_a.accepted.id])
    );

    // In doubt once: the message waits in Unknown, the reply reached no one;
    // the late commit through a live node settles it.
    assert!(
        folder_ids(&admin, "db-b", Folder::Unknown)
            .await
            .contains(&to_b.accepted.id)
    );
    assert!(
        folder_ids(&admin, "db-b", Folder::Messages)
            .await
            .is_empty()
    );
    assert!(
        folder_ids(&admin, "phone-1", Folder::Messages)
            .await
            .is_empty()
    );
    let late = nodes[0].client(&t.db_b).commit(&ready_pid).await.unwrap();
    assert_eq!(late.status, CallStatus::Ok);
    assert_eq!(
        folder_ids(&admin, "db-b", Folder::Log).await,
        BTreeSet::from([to_b.accepted.id])
    );
    assert_eq!(
        folder_ids(&admin, "phone-1", Folder::Messages).await.len(),
        1
    );
}

/// What one processor working through the node that is paused was told.
#[derive(Default)]
struct Told {
    /// Processes whose commit answered OK.
    committed: BTreeSet<ProcessId>,
    /// Uploads that were acknowledged.
    uploaded: BTreeSet<MessageId>,
    /// The process it works on now.
    current: Option<ProcessId>,
    /// Commits answered OK, to see it make progress.
    steps: usize,
    /// Calls refused as retryable (503), each a step that lost its lock.
    refused: usize,
}

/// Upload → start → prepare → commit for `db-a` through one node until
/// `stop`; a retryable failure (a 503 after the node's transaction was
/// ended under it) abandons the process, which is aborted.
async fn cycle(phone: Client, db: Client, told: Arc<Mutex<Told>>, stop: Arc<AtomicBool>) {
    let retryable = |e: ClientError| {
        assert_retryable(&e);
        told.lock().unwrap().refused += 1;
    };
    while !stop.load(Ordering::Relaxed) {
        match phone.send(&message("db-a", "{}", None)).await {
            Ok(s) => {
                told.lock().unwrap().uploaded.insert(s.accepted.id);
            }
            Err(e) => retryable(e),
        }
        let started = match db.start(&start_request("db-a")).await {
            Ok(s) => s,
            Err(e) => {
                retryable(e);
                continue;
            }
        };
        let pid = match started.status {
            StartStatus::Ok => started.process_id.unwrap(),
            StartStatus::Idle => continue,
            StartStatus::Busy => {
                // Its own process, left behind by a failed call: abort it
                // and go on. One whose start was refused after all, so its
                // id is unknown, ends at the STARTED timeout.
                let live = told.lock().unwrap().current;
                if let Some(pid) = live
                    && let Err(e) = db.abort(&pid, "abandoned").await
                {
                    retryable(e);
                }
                continue;
            }
        };
        told.lock().unwrap().current = Some(pid);
        let prepare = prepare_all(started.messages.unwrap().iter().map(|m| m.id), "{}");
        match db.prepare(&pid, &prepare).await {
            Ok(p) if p.status == CallStatus::Ok => {}
            Ok(p) => {
                // Another node ended it meanwhile.
                assert_eq!(p.status, CallStatus::Cancelled);
                continue;
            }
            Err(e) => {
                retryable(e);
                continue;
            }
        }
        match db.commit(&pid).await {
            Ok(c) if c.status == CallStatus::Ok => {
                let mut told = told.lock().unwrap();
                told.committed.insert(pid);
                told.steps += 1;
            }
            Ok(c) => assert_eq!(c.status, CallStatus::Cancelled),
            Err(e) => retryable(e),
        }
    }
}

/// Sessions of `application` holding a transaction id (a row lock or a
/// write) in an open transaction.
fn holding(pg: &Postgres, application: &str) -> usize {
    pg.psql(&format!(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE application_name = '{application}' AND backend_xid IS NOT NULL"
    ))
    .unwrap()
    .trim()
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_blocks_its_database_only_until_the_hold_limit() {
    // 1.5 s instead of the default 10 s: the server ends a transaction left
    // idle longer than that, and with it the paused node's row lock.
    let hold = "options=-c%20idle_in_transaction_session_timeout%3D1500";
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url_a = with_params(&pg.url(), &["application_name=node-a", hold]);
    let url_b = with_params(&pg.url(), &["application_name=node-b", hold]);
    let env = [("ESTAFETA_STARTED_TIMEOUT", "3s")];
    let b = Node::start(dir.path(), "node-b", &url_b, &env).await;
    let admin = b.printed_token.clone().unwrap();
    let a = Node::start(dir.path(), "node-a", &url_a, &env).await;
    let t = provision(&b.client(&admin), &admin).await;

    let told = Arc::new(Mutex::new(Told::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(cycle(
        a.client(&t.phone),
        a.client(&t.db_a),
        told.clone(),
        stop.clone(),
    ));
    let steps = || told.lock().unwrap().steps;

    // Pause A until it is caught inside a step (holding db-a's row lock).
    let tries = AtomicUsize::new(0);
    eventually("node A paused inside a step", || async {
        let before = steps();
        eventually("node A to make progress", || async {
            (steps() > before).then_some(())
        })
        .await;
        a.pause();
        tries.fetch_add(1, Ordering::Relaxed);
        if holding(&pg, "node-a") > 0 {
            return Some(());
        }
        a.resume();
        None
    })
    .await;

    // B's calls for db-a wait at most for the server to end A's
    // transaction; they are answered while A is still frozen, and B takes
    // the database over: it aborts A's process and processes the queue.
    let db = b.client(&t.db_a);
    let admin = b.client(&t.admin);
    let mut aborted = BTreeSet::new();
    let mut committed_by_b = BTreeSet::new();
    for round in 0.. {
        assert!(round < 100, "B could not take db-a over");
        let start = start_request("db-a");
        let started = retrying("start through B", || db.start(&start))
            .await
            .unwrap();
        match started.status {
            StartStatus::Idle => break,
            StartStatus::Busy => {
                // A's live process: the one its processor knows, or one
                // whose start A committed without getting to answer it.
                let mut live: BTreeSet<ProcessId> =
                    told.lock().unwrap().current.into_iter().collect();
                let list = retrying("process list", || admin.processes())
                    .await
                    .unwrap();
                live.extend(
                    list.processes
                        .iter()
                        .filter(|p| p.db_id == id("db-a"))
                        .map(|p| p.process_id),
                );
                for pid in live {
                    // A commit A decided (CLEANUP) is finished, as its
                    // processor's retry would; anything else is aborted.
                    let state = db.process(&pid).await.unwrap().state;
                    if matches!(state, ProcessState::Cleanup | ProcessState::Failed) {
                        let c = retrying("commit through B", || db.commit(&pid))
                            .await
                            .unwrap();
                        assert_eq!(c.status, CallStatus::Ok);
                        continue;
                    }
                    let a = retrying("abort through B", || db.abort(&pid, "A is frozen"))
                        .await
                        .unwrap();
                    let state = db.process(&pid).await.unwrap().state;
                    if a.status == CallStatus::Ok && state == ProcessState::Aborted {
                        aborted.insert(pid);
                    }
                }
            }
            StartStatus::Ok => {
                let pid = started.process_id.unwrap();
                let messages = started.messages.unwrap();
                process_all(&db, &pid, messages.iter().map(|m| m.id), "{}").await;
                committed_by_b.insert(pid);
            }
        }
    }
    assert!(a.frozen(), "A stayed paused while B worked");
    eventually("the server to end A's transactions", || async {
        (holding(&pg, "node-a") == 0).then_some(())
    })
    .await;

    // A resumes: its step in flight fails (or answers what is true), and it
    // serves again.
    a.resume();
    let before = steps();
    eventually("node A to commit again", || async {
        (steps() > before + 2).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();

    // No answer A gave was wrong: what it said it committed is DONE, and no
    // process B aborted was committed.
    let told = Arc::try_unwrap(told).ok().unwrap().into_inner().unwrap();
    for pid in &told.committed {
        let s = db.process(pid).await.unwrap().state;
        assert_eq!(s, ProcessState::Done, "{pid}");
        assert!(!aborted.contains(pid), "{pid} was aborted by B");
    }
    for pid in &aborted {
        let s = db.process(pid).await.unwrap().state;
        assert_eq!(s, ProcessState::Aborted, "{pid}");
    }
    // Every acknowledged upload is in exactly one place: processed, or
    // still waiting.
    let log = folder_ids(&admin, "db-a", Folder::Log).await;
    let waiting = folder_ids(&admin, "db-a", Folder::Messages).await;
    assert!(log.is_disjoint(&waiting));
    let everywhere: BTreeSet<_> = log.union(&waiting).copied().collect();
    assert!(told.uploaded.is_subset(&everywhere));
    eprintln!(
        "paused after {} tries; B aborted {} and committed {}; A committed {}, refused {}",
        tries.load(Ordering::Relaxed),
        aborted.len(),
        committed_by_b.len(),
        told.committed.len(),
        told.refused
    );
}
