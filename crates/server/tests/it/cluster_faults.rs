//! Cluster mode under partial failure, with the real binary built with its
//! failpoints (`--features failpoints`): what a node writes after it lost
//! its database's lock, and a `COMMIT` whose answer was lost.
//!
//! - A node stalls between the save that decides a step's moves and the
//!   moves (a long pause, as under a stop-the-world pause or a swap storm);
//!   the server ends its transaction at the hold limit, another node takes
//!   the database over and finishes the step, and the processor's late
//!   rollback through that node puts the message back in the queue. When
//!   the stalled node goes on, none of its writes lands: the message stays
//!   in the queue, and no alert is raised again.
//! - The answer to the `COMMIT` that makes a prepare READY_TO_COMMIT is lost
//!   (a proxy between the node and PostgreSQL cuts the connection once the
//!   server has committed): the node finds out that it committed, answers
//!   OK, and the commit delivers the reply. The same for a registry
//!   change: a device created answers with its token.
//! - A starting node reads a database's record and stalls, holding its key,
//!   before its look for orphans in `Prepared`; the server ends its
//!   transaction at the hold limit and another node prepares a process
//!   with a reply meanwhile. When the stalled node goes on, the live
//!   prepare's reply is not taken for an orphan: it stays, and the commit
//!   delivers it.
//! - A starting node finds a commit's moves due (the node that decided
//!   them died before making them) and makes them in its step, whose save
//!   fails: its start-up processing fails and is tried again from the
//!   stored record, and the reply is not taken for an orphan (moved to
//!   `Unknown` from what was never saved).
//! - The same save is made but its answer lost, so the node no longer holds
//!   the key, and another node prepares a process with a reply meanwhile:
//!   the starting node moves nothing from what it read before, and the
//!   live reply stays.
#![cfg(feature = "failpoints")]

use crate::common;
use crate::common::cluster::{Node, eventually, folder_ids, retrying, with_params};
use crate::common::{Tenancy, id, prepare_all, provision_one, start_request};
use estafeta_client::Client;
use estafeta_exchange::wire::{CallStatus, Folder, PrepareRequest, ProcessState, StartStatus};
use estafeta_exchange::{MessageId, ProcessId};
use estafeta_postgres::testing::{CommitLoss, Postgres};

/// One message of `phone` to db-a, started and prepared through `db` as
/// processed with a reply: the process and the message.
async fn ready(db: &Client, phone: &Client) -> (ProcessId, MessageId) {
    let sent = phone
        .send(&common::message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();
    let started = db.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let prepared = db.prepare(&pid, &prepare(sent.accepted.id)).await.unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);
    (pid, sent.accepted.id)
}

/// A prepare of `message` as processed, with one reply to phone-1.
fn prepare(message: MessageId) -> PrepareRequest {
    prepare_all([message], r#"{"ok":true}"#)
}

/// Waits until the node `admin` calls is ready; `what` names it.
async fn until_ready(admin: &Client, what: &str) {
    eventually(what, || async { admin.readyz().await.ok()?.then_some(()) }).await;
}

/// Nothing of db-a taken for an orphan, as `admin` sees it: its `Unknown`
/// is empty and no `orphans` alert was raised.
async fn no_orphans(admin: &Client) {
    assert!(
        folder_ids(admin, "db-a", Folder::Unknown).await.is_empty(),
        "nothing taken for an orphan"
    );
    let alerts = admin.alerts().await.unwrap().alerts;
    assert!(
        !alerts.iter().any(|a| a.kind == "orphans"),
        "no orphans alert: {alerts:?}"
    );
}

/// Sessions of `application` left idle inside a transaction that holds a
/// lock (a transaction id) for longer than a step takes.
fn stalled(pg: &Postgres, application: &str) -> bool {
    let n: usize = pg
        .psql(&format!(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = '{application}' AND backend_xid IS NOT NULL \
               AND state = 'idle in transaction' \
               AND now() - state_change > interval '300 milliseconds'"
        ))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    n > 0
}

/// The URLs of nodes `node-a` and `node-b` on `pg`, whose server ends a
/// transaction left idle for a second: a stalled node's lock goes then.
fn idle_limited(pg: &Postgres) -> [String; 2] {
    let hold = "options=-c%20idle_in_transaction_session_timeout%3D1000";
    ["node-a", "node-b"]
        .map(|node| with_params(&pg.url(), &[&format!("application_name={node}"), hold]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_lock_writes_nothing_after_another_took_over() {
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let [url_a, url_b] = idle_limited(&pg);
    let timeout = ("ESTAFETA_READY_TIMEOUT", "2s");
    // A's first batch of moves waits 15 s before it is handed to the store.
    let stall = ("ESTAFETA_FAILPOINTS", "messages::apply=1*sleep(15000)");
    let a = Node::start(dir.path(), "node-a", &url_a, &[timeout, stall]).await;
    let admin_token = a.printed_token.clone().unwrap();
    let (db_token, phone_token) = provision_one(&a.client(&admin_token)).await;
    let (pid, message) = ready(&a.client(&db_token), &a.client(&phone_token)).await;

    // A alone is running: the READY_TO_COMMIT timeout passes, A decides the
    // moves into doubt and stalls before making them, holding db-a's lock.
    eventually("node A stalled inside db-a's step", || async {
        stalled(&pg, "node-a").then_some(())
    })
    .await;

    // B takes the database over once the server ended A's transaction: it
    // puts the process in doubt, and the processor's late rollback through
    // B puts the message back in the queue.
    let b = Node::start(dir.path(), "node-b", &url_b, &[timeout]).await;
    let admin_b = b.client(&admin_token);
    let db_b = b.client(&db_token);
    eventually("the process in doubt through B", || async {
        let state = db_b.process(&pid).await.ok()?.state;
        (state == ProcessState::InDoubt).then_some(())
    })
    .await;
    let rolled = retrying("late rollback through B", || {
        db_b.rollback(&pid, "the processor's transaction did not commit")
    })
    .await
    .unwrap();
    assert_eq!(rolled.status, CallStatus::Ok);
    assert_eq!(
        folder_ids(&admin_b, "db-a", Folder::Messages).await,
        [message].into()
    );

    // A goes on with what it decided before the stall: it finds it lost
    // the lock and writes nothing.
    eventually("node A done with its stalled step", || async {
        let log = a.log();
        (log.contains("process deadline handling failed")
            || log.contains("saving a finalized session failed"))
        .then_some(())
    })
    .await;
    assert_eq!(
        folder_ids(&admin_b, "db-a", Folder::Messages).await,
        [message].into(),
        "the rolled-back message stays in the queue"
    );
    assert!(
        folder_ids(&admin_b, "db-a", Folder::Unknown)
            .await
            .is_empty()
    );
    let alerts = admin_b.alerts().await.unwrap().alerts;
    let open: Vec<_> = alerts
        .iter()
        .filter(|alert| alert.ended_at.is_none() && alert.key.contains(&pid.to_string()))
        .collect();
    assert!(open.is_empty(), "an alert left open: {open:?}");
    assert_eq!(
        db_b.process(&pid).await.unwrap().state,
        ProcessState::RolledBack
    );
    let request = start_request("db-a");
    let started = retrying("start through B", || db_b.start(&request))
        .await
        .unwrap();
    assert_eq!(started.status, StartStatus::Ok);
    let offered: Vec<_> = started.messages.unwrap().iter().map(|m| m.id).collect();
    assert_eq!(offered, [message], "offered again");
}

/// A node over a throwaway PostgreSQL reached through a proxy that can
/// lose the answers to its COMMITs.
async fn behind_commit_loss(dir: &std::path::Path) -> (Postgres, CommitLoss, Node) {
    let pg = Postgres::start().unwrap();
    let proxy = CommitLoss::start(format!("127.0.0.1:{}", pg.port()).parse().unwrap())
        .await
        .unwrap();
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
        proxy.port()
    );
    let node = Node::start(dir, "node", &url, &[]).await;
    (pg, proxy, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_whose_commit_answer_was_lost_is_ready_and_its_reply_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let (_pg, proxy, node) = behind_commit_loss(dir.path()).await;
    let admin: Client = node.client(node.printed_token.as_deref().unwrap());
    let t = Tenancy::provision(&admin).await;
    let sent = t
        .phone1
        .send(&common::message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();
    let started = t.db_a.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    // A prepare's steps commit twice: the reply names (and the replies),
    // then READY_TO_COMMIT. The answer to the second is lost.
    proxy.arm("estafeta steps", 2);
    let prepared = t
        .db_a
        .prepare(&pid, &prepare(sent.accepted.id))
        .await
        .unwrap();
    assert_eq!(proxy.dropped(), 1, "the COMMIT's answer was lost");
    assert_eq!(prepared.status, CallStatus::Ok);
    assert_eq!(
        t.db_a.process(&pid).await.unwrap().state,
        ProcessState::ReadyToCommit
    );
    let committed = t.db_a.commit(&pid).await.unwrap();
    assert_eq!(committed.status, CallStatus::Ok);
    let inbox = t.phone1.inbox(None).await.unwrap();
    assert_eq!(inbox.messages.len(), 1, "the reply is delivered");
    assert_eq!(
        inbox.messages[0].body.get(),
        r#"{"ok":true}"#,
        "the prepared reply"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_created_whose_commit_answer_was_lost_gets_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let (_pg, proxy, node) = behind_commit_loss(dir.path()).await;
    let admin: Client = node.client(node.printed_token.as_deref().unwrap());
    let (db_token, _) = provision_one(&admin).await;
    // The registry change's COMMIT is made and its answer lost: the device
    // exists, and its token is only ever shown in this answer.
    proxy.arm("estafeta registry", 1);
    let created = admin
        .create_device(&id("acme"), &id("phone-2"), &id("sales"))
        .await
        .expect("the change was made: its answer says so");
    assert_eq!(proxy.dropped(), 1, "the COMMIT's answer was lost");
    let sent = admin
        .with_token(&created.token)
        .send(&common::message("db-a", r#"{"order":1}"#, None))
        .await
        .expect("the answered token is the device's");
    let started = node
        .client(&db_token)
        .start(&start_request("db-a"))
        .await
        .unwrap();
    let offered: Vec<_> = started.messages.unwrap().iter().map(|m| m.id).collect();
    assert_eq!(offered, [sent.accepted.id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_node_that_lost_its_lock_takes_no_live_reply_for_an_orphan() {
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let [url_a, url_b] = idle_limited(&pg);
    let b = Node::start(dir.path(), "node-b", &url_b, &[]).await;
    let admin_token = b.printed_token.clone().unwrap();
    let (db_token, phone_token) = provision_one(&b.client(&admin_token)).await;
    let db_b = b.client(&db_token);
    let sent = b
        .client(&phone_token)
        .send(&common::message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();
    let started = db_b.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();

    // A starts: it reads db-a's record (a process with no reply yet) and
    // stalls with the key held, past the hold limit.
    let stall = ("ESTAFETA_FAILPOINTS", "recovery::orphans=1*sleep(6000)");
    let a = Node::start(dir.path(), "node-a", &url_a, &[stall]).await;
    eventually("node A stalled holding db-a's key", || async {
        stalled(&pg, "node-a").then_some(())
    })
    .await;

    // B prepares once the server ended A's transaction: the reply is in
    // db-a's Prepared, named by the READY_TO_COMMIT process.
    let request = prepare(sent.accepted.id);
    let prepared = retrying("prepare through B", || db_b.prepare(&pid, &request))
        .await
        .unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);

    // A goes on with the record it read before the stall, then looks again
    // and becomes ready.
    let admin_a = a.client(&admin_token);
    until_ready(&admin_a, "node A ready").await;
    no_orphans(&admin_a).await;
    let committed = db_b.commit(&pid).await.unwrap();
    assert_eq!(committed.status, CallStatus::Ok);
    assert_eq!(db_b.process(&pid).await.unwrap().state, ProcessState::Done);
    assert_eq!(
        folder_ids(&admin_a, "phone-1", Folder::Messages)
            .await
            .len(),
        1,
        "the reply reached its device"
    );
}

/// What a test starts from in [`crashed_with_moves_due`].
struct Crashed {
    admin_token: String,
    db_token: String,
    phone_token: String,
    /// The process whose commit's moves are due.
    pid: ProcessId,
}

/// A cluster whose only node died once a commit's moves were decided and
/// saved, before it made them: db-a's record asks for them, due now.
async fn crashed_with_moves_due(dir: &std::path::Path) -> (Postgres, Crashed) {
    let pg = Postgres::start().unwrap();
    let crash = ("ESTAFETA_CRASH_AT", "messages::apply");
    let a = Node::start(dir, "node-a", &pg.url(), &[crash]).await;
    let admin_token = a.printed_token.clone().unwrap();
    let (db_token, phone_token) = provision_one(&a.client(&admin_token)).await;
    let (pid, _) = ready(&a.client(&db_token), &a.client(&phone_token)).await;
    let _ = a.client(&db_token).commit(&pid).await;
    eventually("node A killed at its moves", || async {
        (!a.alive()).then_some(())
    })
    .await;
    eventually("db-a's moves due", || async {
        let due = pg
            .psql(
                "SELECT count(*) FROM sessions WHERE expires_at <= \
                 (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            )
            .ok()?;
        (due.trim() != "0").then_some(())
    })
    .await;
    let crashed = Crashed {
        admin_token,
        db_token,
        phone_token,
        pid,
    };
    (pg, crashed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_node_whose_finalize_could_not_save_moves_no_reply_aside() {
    let dir = tempfile::tempdir().unwrap();
    let (
        pg,
        Crashed {
            admin_token,
            db_token,
            pid,
            ..
        },
    ) = crashed_with_moves_due(dir.path()).await;

    // B starts: its start-up processing finds the deadline due and makes
    // the moves in its step, whose save fails. B must neither go on from
    // what it did not save (the reply is no orphan) nor lose the reply.
    let fail = ("ESTAFETA_FAILPOINTS", "session::commit=1*return");
    let b = Node::start(dir.path(), "node-b", &pg.url(), &[fail]).await;
    let admin_b = b.client(&admin_token);
    until_ready(&admin_b, "node B ready").await;
    let db_b = b.client(&db_token);
    eventually("the process done through B", || async {
        let state = db_b.process(&pid).await.ok()?.state;
        (state == ProcessState::Done).then_some(())
    })
    .await;
    assert!(
        b.log().contains("saving a finalized session failed"),
        "the failpoint failed the finalization's save"
    );
    assert_eq!(
        folder_ids(&admin_b, "phone-1", Folder::Messages)
            .await
            .len(),
        1,
        "the reply reached its device"
    );
    assert!(
        folder_ids(&admin_b, "db-a", Folder::Unknown)
            .await
            .is_empty(),
        "nothing taken for an orphan"
    );
    let alerts = admin_b.alerts().await.unwrap().alerts;
    assert!(
        !alerts
            .iter()
            .any(|a| a.kind == "orphans" || a.kind == "missing_file"),
        "no orphans or missing file: {alerts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_node_whose_finalize_lost_the_key_takes_no_later_reply_for_an_orphan() {
    let dir = tempfile::tempdir().unwrap();
    let (
        pg,
        Crashed {
            admin_token,
            db_token,
            phone_token,
            ..
        },
    ) = crashed_with_moves_due(dir.path()).await;

    // B starts behind a proxy that loses the answer to its first COMMIT of
    // a session record: its start-up processing makes the moves and saves,
    // learns that the save was made, and no longer holds db-a's key. It
    // stalls before its look for orphans.
    let proxy = CommitLoss::start(format!("127.0.0.1:{}", pg.port()).parse().unwrap())
        .await
        .unwrap();
    proxy.arm_writing("estafeta steps", "sessions", 1);
    let url_b = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
        proxy.port()
    );
    let stall = ("ESTAFETA_FAILPOINTS", "recovery::orphans=1*sleep(8000)");
    let b = Node::start(dir.path(), "node-b", &url_b, &[stall]).await;
    proxy.wait_dropped(0).await;

    // C takes db-a meanwhile and prepares a second process with a reply.
    let c = Node::start(dir.path(), "node-c", &pg.url(), &[]).await;
    let admin_c = c.client(&admin_token);
    until_ready(&admin_c, "node C ready").await;
    let db_c = c.client(&db_token);
    let (second, _) = ready(&db_c, &c.client(&phone_token)).await;

    // B goes on once it holds the key again, from the stored record: what
    // it read before it lost the key is not that any more, and it moves
    // nothing from it.
    let admin_b = b.client(&admin_token);
    until_ready(&admin_b, "node B ready").await;
    no_orphans(&admin_b).await;
    let committed = db_c.commit(&second).await.unwrap();
    assert_eq!(committed.status, CallStatus::Ok);
    assert_eq!(
        folder_ids(&admin_b, "phone-1", Folder::Messages)
            .await
            .len(),
        2,
        "both replies reached their device"
    );
    assert!(
        b.log().contains("holding it again from the stored record"),
        "B's start-up processing found it lost the key"
    );
}
