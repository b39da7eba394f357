//! Cluster mode: a reply in a database's `Prepared` that no process record
//! names. A prepare stores its replies in the transaction that saves the
//! record naming them (a node that lost the database's key stores nothing:
//! `cluster_faults.rs`), so such a file comes from outside the protocol; a
//! node's start-up processing, holding the database's key, moves it to
//! `Unknown` for the operator with an `orphans` alert, as the embedded store
//! does, and the replies of a live process stay.

use crate::common;
use crate::common::clock::ManualClock;
use crate::common::restartable::Server as Node;
use crate::common::{Store, TestServer, id, listed, message, prepare_all, start_request};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::store::{Location, MessageSteps};
use estafeta_exchange::wire::{Body, CallStatus, Message, ProcessState, Version};
use estafeta_exchange::{MessageId, Timestamp};
use estafeta_postgres::PgMessages;

/// Stores a reply of db-a to phone-1 in db-a's `Prepared` as a prepare
/// stores its replies, for a process no record names any more.
async fn late_reply(messages: &PgMessages, seq: u128) -> MessageId {
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let reply = Message {
        version: Version,
        id: MessageId::from_parts(u64::try_from(now.as_millis()).unwrap(), seq),
        from: id("db-a"),
        to: id("phone-1"),
        subsystem: id("sales"),
        created_at: now,
        body: Body::from_json(r#"{"late":true}"#).unwrap(),
    };
    let prepared = Location::new(id("db-a"), Folder::Prepared);
    messages
        .put_all(&prepared, std::slice::from_ref(&reply), go())
        .await
        .unwrap();
    reply.id
}

/// A go-ahead already given.
fn go() -> tokio::sync::oneshot::Receiver<bool> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tx.send(true).unwrap();
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_reply_in_prepared_goes_to_unknown_with_an_alert_and_a_live_processs_replies_stay()
 {
    let server = TestServer::start_on(Store::Postgres).await;
    let url = server.store.clone().unwrap();
    let messages = PgMessages::new(estafeta_postgres::Store::connect(&url).unwrap());
    let t = common::Tenancy::provision(&server.admin).await;
    let sent = t
        .phone1
        .send(&message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();

    // A process rolled back, then a reply stored in Prepared by hand.
    let first = t.db_a.start(&start_request("db-a")).await.unwrap();
    let first = first.process_id.unwrap();
    let rolled = t.db_a.rollback(&first, "try again").await.unwrap();
    assert_eq!(rolled.status, CallStatus::Ok);
    let orphan = late_reply(&messages, 1).await;

    // A live process on the same database, READY_TO_COMMIT with a reply.
    let second = t.db_a.start(&start_request("db-a")).await.unwrap();
    let second = second.process_id.unwrap();
    let prepare = prepare_all([sent.accepted.id], r#"{"ok":true}"#);
    let prepared = t.db_a.prepare(&second, &prepare).await.unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);
    let mut before = listed(&server.admin, "db-a", Folder::Prepared).await;
    assert_eq!(before.len(), 2);
    before.retain(|m| *m != orphan);
    let live = before[0];

    // Another node's start-up processing looks under each database's key.
    let data = tempfile::tempdir().unwrap();
    let node = Node::start_on(data.path(), Some(&url), &ManualClock::now()).await;
    assert_eq!(
        listed(&server.admin, "db-a", Folder::Prepared).await,
        vec![live]
    );
    assert_eq!(
        listed(&server.admin, "db-a", Folder::Unknown).await,
        vec![orphan]
    );
    node.stop().await;
    let alerts = server.admin.alerts().await.unwrap().alerts;
    assert!(
        alerts
            .iter()
            .any(|a| a.kind == "orphans" && a.key.contains("db-a") && a.ended_at.is_none()),
        "{alerts:?}"
    );
    assert!(
        !listed(&server.admin, "phone-1", Folder::Messages)
            .await
            .contains(&orphan)
    );

    // The live process commits its reply, untouched.
    let committed = t.db_a.commit(&second).await.unwrap();
    assert_eq!(committed.status, CallStatus::Ok);
    let state = t.db_a.process(&second).await.unwrap().state;
    assert_eq!(state, ProcessState::Done);
    assert_eq!(
        listed(&server.admin, "phone-1", Folder::Messages).await,
        vec![live]
    );
    assert!(
        listed(&server.admin, "db-a", Folder::Prepared)
            .await
            .is_empty()
    );
    assert_eq!(
        listed(&server.admin, "db-a", Folder::Log).await,
        vec![sent.accepted.id]
    );
    server.stop().await.unwrap();
}
