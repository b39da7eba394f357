//! Cluster mode: an acknowledgement's moves (the device's `Messages` to its
//! `Log`) and the device's session are written by one commit, the device
//! step's. When that commit fails after the moves were made in its
//! transaction (the database refuses the step's save, through a trigger),
//! the client gets an error and every message is still in the inbox; the
//! retry acknowledges them once.

use crate::common;
use crate::common::{Store, Tenancy, TestServer, committed_process};
use estafeta_client::ClientError;
use estafeta_exchange::wire::ResultStatus;

/// How many messages `phone-1`'s `place` holds.
async fn in_place(db: &estafeta_postgres::Store, place: &str) -> i64 {
    let client = db.client().await.unwrap();
    client
        .query_one(
            "SELECT count(*) FROM messages WHERE owner = 'phone-1' AND place = $1",
            &[&place],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_whose_step_fails_to_commit_moves_nothing_and_its_retry_acks_once() {
    let server = TestServer::start_on(Store::Postgres).await;
    let db = estafeta_postgres::Store::connect(server.store.as_deref().unwrap()).unwrap();
    let t = Tenancy::provision(&server.admin).await;
    committed_process(&t, ResultStatus::Processed).await;
    let inbox = t.phone1.inbox(None).await.unwrap();
    let ids: Vec<_> = inbox.messages.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 1);

    common::cluster::refuse_device_saves(&db, true).await;
    let failed = t.phone1.ack(&ids).await.unwrap_err();
    assert!(
        matches!(&failed, ClientError::Api { status, .. } if status.is_server_error()),
        "{failed}"
    );
    assert_eq!(in_place(&db, "Messages").await, 1);
    assert_eq!(in_place(&db, "Log").await, 0);
    common::cluster::refuse_device_saves(&db, false).await;

    let again = t.phone1.inbox(None).await.unwrap();
    assert_eq!(again.messages.len(), 1);
    assert_eq!(again.messages[0].id, ids[0]);
    assert_eq!(t.phone1.ack(&ids).await.unwrap().acked, 1);
    assert_eq!(t.phone1.ack(&ids).await.unwrap().acked, 0);
    assert_eq!(in_place(&db, "Messages").await, 0);
    assert_eq!(in_place(&db, "Log").await, 1);
    assert!(t.phone1.inbox(None).await.unwrap().messages.is_empty());
}
