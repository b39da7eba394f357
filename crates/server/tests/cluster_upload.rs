//! Cluster mode: an upload's message, its idempotency key and the device's
//! session are written by one commit, the device step's. When that commit
//! fails after the message's insert was sent (the database refuses the
//! step's save, through a trigger), the client gets an error and neither
//! the message nor the key exists; the retry makes exactly one message.

mod common;

use common::{Store, TestServer, message, provision_one, start_request};
use estafeta_client::ClientError;

/// Makes every save of `phone-1`'s device session fail (`true`), or lets
/// them through again (`false`).
async fn refuse_device_saves(db: &estafeta_cluster::Store, refuse: bool) {
    let client = db.client().await.unwrap();
    let sql = match refuse {
        true => {
            "CREATE FUNCTION refuse_save() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'save refused by the test'; END $$;
             CREATE TRIGGER refuse_device_saves BEFORE UPDATE ON sessions FOR EACH ROW
               WHEN (position('phone-1'::bytea in NEW.key) > 0 AND NEW.record IS NOT NULL)
               EXECUTE FUNCTION refuse_save()"
        }
        false => "DROP TRIGGER refuse_device_saves ON sessions; DROP FUNCTION refuse_save()",
    };
    client.batch_execute(sql).await.unwrap();
}

/// Rows of `table` (the whole cluster's).
async fn rows(db: &estafeta_cluster::Store, table: &str) -> i64 {
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
    let db = estafeta_cluster::Store::connect(server.store.as_deref().unwrap()).unwrap();
    let (db_token, phone_token) = provision_one(&server.admin).await;
    let phone = server.client(&phone_token);

    refuse_device_saves(&db, true).await;
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
    refuse_device_saves(&db, false).await;

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
