//! Cluster mode: an upload's message, its idempotency key and the device's
//! session are written by one commit, the device step's. When that commit
//! fails after the message's insert was sent (the database refuses the
//! step's save, through a trigger), the client gets an error and neither
//! the message nor the key exists; the retry makes exactly one message.
//! An upload checks its token against the registry's change counter read
//! by the device step's lock: a database created through another node takes
//! its uploads at once, and a token changed or a device deleted through
//! another node is refused at once, with nothing written. So do an
//! acknowledgement (the device's step), the processor's calls (the
//! database's step) and an inbox (the counter read beside its messages).

use crate::common;
use crate::common::{
    ADMIN_TOKEN, Store, TestServer, id, message, on_loopback, open_server_on, prepare_all,
    process_all, provision_one, start_ok, start_request, wait_ready,
};
use estafeta_client::{Client, ClientError};
use estafeta_exchange::wire::{CallStatus, ProcessState};
use estafeta_server::HttpSettings;
use estafeta_server::notify::NotifySettings;

/// Rows of `table` (the whole cluster's).
async fn rows(db: &estafeta_postgres::Store, table: &str) -> i64 {
    let client = db.client().await.unwrap();
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_step_fails_to_commit_leaves_nothing_and_its_retry_one_message() {
    let server = TestServer::start_on(Store::Postgres).await;
    let db = estafeta_postgres::Store::connect(server.store.as_deref().unwrap()).unwrap();
    let (db_token, phone_token) = provision_one(&server.admin).await;
    let phone = server.client(&phone_token);

    common::cluster::refuse_device_saves(&db, true).await;
    for key in [Some("k-1"), None] {
        let failed = phone
            .send(&message("db-a", r#"{"order":1}"#, key))
            .await
            .unwrap_err();
        assert!(
            matches!(&failed, ClientError::Api { status, .. } if status.is_server_error()),
            "{failed}"
        );
        assert_eq!(rows(&db, "messages").await, 0, "key {key:?}");
        assert_eq!(rows(&db, "idempotency_keys").await, 0, "key {key:?}");
    }
    common::cluster::refuse_device_saves(&db, false).await;

    let first = phone
        .send(&message("db-a", r#"{"order":1}"#, Some("k-1")))
        .await
        .unwrap();
    let again = phone
        .send(&message("db-a", r#"{"order":1}"#, Some("k-1")))
        .await
        .unwrap();
    assert_eq!(again.accepted.id, first.accepted.id);
    assert_eq!(rows(&db, "messages").await, 1);
    assert_eq!(rows(&db, "idempotency_keys").await, 1);
    let started = server
        .client(&db_token)
        .start(&start_request("db-a"))
        .await
        .unwrap();
    let messages = started.messages.unwrap();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].id, first.accepted.id);
}

/// A second node on `url`, its data folder in `data`; its base URL. It runs
/// until the test ends.
async fn second_node(data: &std::path::Path, url: &str) -> String {
    let server = open_server_on(
        data,
        Some(url),
        HttpSettings::default(),
        |_| {},
        NotifySettings::log_only(data),
    )
    .await;
    let (_, base, _, _) = on_loopback(server).await;
    wait_ready(&Client::new(&base, ADMIN_TOKEN).unwrap()).await;
    base
}

fn unauthorized(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { status, .. } if status.as_u16() == 401)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_change_through_one_node_holds_for_the_next_upload_through_another() {
    let a = TestServer::start_on(Store::Postgres).await;
    let url = a.store.clone().unwrap();
    let data = tempfile::tempdir().unwrap();
    let b = second_node(data.path(), &url).await;
    let db = estafeta_postgres::Store::connect(&url).unwrap();
    let (_, old_token) = provision_one(&a.admin).await;
    let through_b = |token: &str| Client::new(&b, token).unwrap();

    // B learns the device at its first upload, and knows it at the next.
    for n in 0..2 {
        through_b(&old_token)
            .send(&message("db-a", r#"{"order":1}"#, None))
            .await
            .unwrap();
        assert_eq!(rows(&db, "messages").await, n + 1);
    }
    // A database created through A takes B's uploads at once.
    a.admin
        .create_database(&id("acme"), &id("db-b"))
        .await
        .unwrap();
    through_b(&old_token)
        .send(&message("db-b", r#"{"order":1}"#, None))
        .await
        .unwrap();
    assert_eq!(rows(&db, "messages").await, 3);

    // The token changed through A: B's copy still has the old one, and its
    // next upload with it is refused, nothing written.
    let new_token = a
        .admin
        .rotate_device_token(&id("phone-1"))
        .await
        .unwrap()
        .token;
    let refused = through_b(&old_token)
        .send(&message("db-a", r#"{"order":2}"#, Some("k-2")))
        .await
        .unwrap_err();
    assert!(unauthorized(&refused), "{refused}");
    assert_eq!(rows(&db, "messages").await, 3);
    assert_eq!(rows(&db, "idempotency_keys").await, 0);
    through_b(&new_token)
        .send(&message("db-a", r#"{"order":2}"#, Some("k-2")))
        .await
        .unwrap();
    assert_eq!(rows(&db, "messages").await, 4);

    // An inbox, then an acknowledgement, with the token B's copy knows but
    // A changed since: refused (B learns the change only in the call); the
    // acknowledgement moves nothing.
    let reply = reply_to_phone(&a, &db).await;
    let mut known = new_token;
    let newer = rotated_device(&a).await;
    let refused = through_b(&known).inbox(None).await.unwrap_err();
    assert!(unauthorized(&refused), "{refused}");
    known = newer;
    let newer = rotated_device(&a).await;
    let refused = through_b(&known).ack(&[reply]).await.unwrap_err();
    assert!(unauthorized(&refused), "{refused}");
    assert_eq!(place_of(&db, &reply).await, "Messages");
    let new_token = newer;
    let inbox = through_b(&new_token).inbox(None).await.unwrap();
    assert_eq!(inbox.messages.len(), 1);
    let acked = through_b(&new_token).ack(&[reply]).await.unwrap();
    assert_eq!(acked.acked, 1);
    assert_eq!(place_of(&db, &reply).await, "Log");

    // The device deleted through A: its token is refused through B too.
    a.admin.delete_device(&id("phone-1"), true).await.unwrap();
    let refused = through_b(&new_token)
        .send(&message("db-a", r#"{"order":3}"#, None))
        .await
        .unwrap_err();
    assert!(unauthorized(&refused), "{refused}");
}

/// phone-1's token, changed through `a`.
async fn rotated_device(a: &TestServer) -> String {
    a.admin
        .rotate_device_token(&id("phone-1"))
        .await
        .unwrap()
        .token
}

/// Where the message `id` is (its `place`).
async fn place_of(db: &estafeta_postgres::Store, id: &estafeta_exchange::MessageId) -> String {
    let client = db.client().await.unwrap();
    client
        .query_one(
            "SELECT place FROM messages WHERE id = $1",
            &[&id.to_string()],
        )
        .await
        .unwrap()
        .get(0)
}

/// Through `a`, with a database token of its own (db-a's rotated), a whole
/// cycle of db-a's messages: the id of its reply to phone-1, now in the
/// phone's inbox.
async fn reply_to_phone(
    a: &TestServer,
    db: &estafeta_postgres::Store,
) -> estafeta_exchange::MessageId {
    let token = a
        .admin
        .rotate_database_token(&id("db-a"))
        .await
        .unwrap()
        .token;
    let processor = a.client(&token);
    let started = processor.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let prepared = processor
        .prepare(
            &pid,
            &prepare_all(
                started.messages.unwrap().iter().map(|m| m.id),
                r#"{"ok":true}"#,
            ),
        )
        .await
        .unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);
    assert_eq!(processor.commit(&pid).await.unwrap().status, CallStatus::Ok);
    let client = db.client().await.unwrap();
    let id: String = client
        .query_one(
            "SELECT id FROM messages WHERE owner = 'phone-1' AND place = 'Messages'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    id.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_token_changed_through_one_node_is_refused_by_the_next_call_through_another() {
    let a = TestServer::start_on(Store::Postgres).await;
    let url = a.store.clone().unwrap();
    let data = tempfile::tempdir().unwrap();
    let b = second_node(data.path(), &url).await;
    let db = estafeta_postgres::Store::connect(&url).unwrap();
    let (old_token, phone_token) = provision_one(&a.admin).await;
    let through_b = |token: &str| Client::new(&b, token).unwrap();
    for n in 0..2 {
        through_b(&phone_token)
            .send(&message("db-a", &format!(r#"{{"order":{n}}}"#), None))
            .await
            .unwrap();
    }

    // B knows the database's token from this start on.
    let started = start_ok(&through_b(&old_token), "db-a").await;
    let pid = started.process_id.unwrap();
    let messages = started.messages.unwrap();

    // The token changed through A before each call: B's copy still has the
    // one before (it learns each change only in the call), and each of the
    // processor's calls with it through B is refused, nothing written (no
    // reply stored, the process still STARTED).
    let mut known = old_token;
    for call in ["prepare", "commit", "abort", "start"] {
        let newer = a
            .admin
            .rotate_database_token(&id("db-a"))
            .await
            .unwrap()
            .token;
        let old = through_b(&known);
        let refused = match call {
            "prepare" => old
                .prepare(
                    &pid,
                    &prepare_all(messages.iter().map(|m| m.id), r#"{"ok":true}"#),
                )
                .await
                .err(),
            "commit" => old.commit(&pid).await.err(),
            "abort" => old.abort(&pid, "gave up").await.err(),
            _ => old.start(&start_request("db-a")).await.err(),
        };
        assert!(
            refused.as_ref().is_some_and(unauthorized),
            "{call}: {refused:?}"
        );
        known = newer;
    }
    assert_eq!(rows(&db, "messages WHERE place = 'Prepared'").await, 0);
    let new = through_b(&known);
    assert_eq!(
        new.process(&pid).await.unwrap().state,
        ProcessState::Started
    );

    // The new token works through B at once.
    process_all(&new, &pid, messages.iter().map(|m| m.id), r#"{"ok":true}"#).await;
    assert_eq!(new.process(&pid).await.unwrap().state, ProcessState::Done);
    assert_eq!(rows(&db, "messages WHERE owner = 'phone-1'").await, 1);
}
