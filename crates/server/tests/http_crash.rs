//! The real binary killed with `kill -9` in the middle of a process and
//! started again on the same data folder.

mod common;

use common::{Binary, id, message, start_request, wait_ready};
use estafeta_client::Client;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{
    Body, CallStatus, MessageResult, PrepareRequest, ProcessState, Reply, ResultStatus, Version,
};

#[tokio::test]
async fn killed_while_ready_to_commit_is_in_doubt_and_a_late_commit_settles_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let env = [("ESTAFETA_ADMIN_TOKEN", "crash-admin")];
    let server = Binary::serve(dir.path(), &data, &[], &env).await;
    let admin = Client::new(&server.base, "crash-admin").unwrap();
    wait_ready(&admin).await;
    admin.create_enterprise(&id("acme")).await.unwrap();
    admin
        .create_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();
    let db = admin
        .create_database(&id("acme"), &id("db-a"))
        .await
        .unwrap();
    let phone = admin
        .create_device(&id("acme"), &id("phone-1"), &id("sales"))
        .await
        .unwrap();
    admin
        .with_token(&phone.token)
        .send(&message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();
    let processor = admin.with_token(&db.token);
    let started = processor.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let msg = started.messages.unwrap()[0].id;
    let prepare = PrepareRequest {
        version: Version,
        results: vec![MessageResult {
            message_id: msg,
            status: ResultStatus::Processed,
            error_code: None,
            error_text: None,
        }],
        replies: vec![Reply {
            to: id("phone-1"),
            body: Body::from_json(r#"{"ok":1}"#).unwrap(),
            created_at: None,
            deliver_at: None,
        }],
    };
    assert_eq!(
        processor.prepare(&pid, &prepare).await.unwrap().status,
        CallStatus::Ok
    );
    server.kill9().await;

    let server = Binary::serve(dir.path(), &data, &[], &env).await;
    let admin = Client::new(&server.base, "crash-admin").unwrap();
    wait_ready(&admin).await;
    let processor = admin.with_token(&db.token);
    assert_eq!(
        processor.process(&pid).await.unwrap().state,
        ProcessState::InDoubt
    );
    let unknown = admin.folder(&id("db-a"), Folder::Unknown).await.unwrap();
    assert_eq!(unknown.files.len(), 2, "{unknown:?}");
    assert!(
        admin
            .folder(&id("db-a"), Folder::Prepared)
            .await
            .unwrap()
            .files
            .is_empty()
    );

    // The processor learns that its transaction committed.
    assert_eq!(processor.commit(&pid).await.unwrap().status, CallStatus::Ok);
    assert!(
        admin
            .folder(&id("db-a"), Folder::Unknown)
            .await
            .unwrap()
            .files
            .is_empty()
    );
    let log = admin.folder(&id("db-a"), Folder::Log).await.unwrap();
    assert_eq!(
        log.files.iter().map(|f| f.id).collect::<Vec<_>>(),
        vec![msg]
    );
    let inbox = admin.with_token(&phone.token).inbox(None).await.unwrap();
    assert_eq!(inbox.messages.len(), 1);
    assert_eq!(
        inbox.messages[0].body,
        Body::from_json(r#"{"ok":1}"#).unwrap()
    );
    assert_eq!(server.terminate().await, Some(0));
}
