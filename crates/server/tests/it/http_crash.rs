//! The real binary killed with `kill -9` in the middle of a process and
//! started again on the same data folder.

use crate::common::{
    Binary, Store, both_stores, id, message, provision_one, start_request, wait_ready,
};
use estafeta_client::Client;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{
    Body, CallStatus, MessageResult, PrepareRequest, ProcessState, Reply, ResultStatus, Version,
};

both_stores!(killed_while_ready_to_commit_and_committed_after_the_restart);
async fn killed_while_ready_to_commit_and_committed_after_the_restart(store: Store) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = store.setting();
    let env = [(
        "ESTAFETA_ADMIN_TOKEN",
        "crash-admin-0123456789abcdef0123456789",
    )];
    let server = Binary::serve_on(store.as_deref(), dir.path(), &data, &[], &env).await;
    let admin = Client::new(&server.base, "crash-admin-0123456789abcdef0123456789").unwrap();
    wait_ready(&admin).await;
    let (db, phone) = provision_one(&admin).await;
    admin
        .with_token(&phone)
        .send(&message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();
    let processor = admin.with_token(&db);
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

    let server = Binary::serve_on(store.as_deref(), dir.path(), &data, &[], &env).await;
    let admin = Client::new(&server.base, "crash-admin-0123456789abcdef0123456789").unwrap();
    wait_ready(&admin).await;
    let processor = admin.with_token(&db);
    // The embedded store finds the process at start-up and cannot know
    // whether its transaction committed: in doubt, the message and the
    // reply in `Unknown`. A cluster node's start leaves processes as they
    // are (another node may be serving them): READY_TO_COMMIT, the reply in
    // `Prepared`.
    let (state, unknown, prepared) = match store {
        None => (ProcessState::InDoubt, 2, 0),
        Some(_) => (ProcessState::ReadyToCommit, 0, 1),
    };
    assert_eq!(processor.process(&pid).await.unwrap().state, state);
    for (folder, files) in [(Folder::Unknown, unknown), (Folder::Prepared, prepared)] {
        let listed = admin.folder(&id("db-a"), folder).await.unwrap();
        assert_eq!(listed.files.len(), files, "{listed:?}");
    }

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
    let inbox = admin.with_token(&phone).inbox(None).await.unwrap();
    assert_eq!(inbox.messages.len(), 1);
    assert_eq!(
        inbox.messages[0].body,
        Body::from_json(r#"{"ok":1}"#).unwrap()
    );
    assert_eq!(server.terminate().await, Some(0));
}

/// A server on one data folder (and, on PostgreSQL, one database) that
/// can be killed and started again.
struct Crashable {
    dir: tempfile::TempDir,
    store: Option<String>,
    server: Option<Binary>,
    admin: Client,
}

const ADMIN: &str = "crash-admin-0123456789abcdef0123456789";

impl Crashable {
    async fn start(store: Store) -> Crashable {
        let dir = tempfile::tempdir().unwrap();
        let store = store.setting();
        let (server, admin) = Self::boot(dir.path(), store.as_deref()).await;
        Crashable {
            dir,
            store,
            server: Some(server),
            admin,
        }
    }

    async fn boot(dir: &std::path::Path, store: Option<&str>) -> (Binary, Client) {
        let server = Binary::serve_on(
            store,
            dir,
            &dir.join("data"),
            &[],
            &[("ESTAFETA_ADMIN_TOKEN", ADMIN)],
        )
        .await;
        let admin = Client::new(&server.base, ADMIN).unwrap();
        wait_ready(&admin).await;
        (server, admin)
    }

    /// `kill -9`, start again, wait until ready.
    async fn crash(&mut self) {
        if let Some(server) = self.server.take() {
            server.kill9().await;
        }
        let (server, admin) = Self::boot(self.dir.path(), self.store.as_deref()).await;
        self.server = Some(server);
        self.admin = admin;
    }

    fn as_token(&self, token: &str) -> Client {
        self.admin.with_token(token)
    }

    async fn files(&self, mailbox: &str, folder: Folder) -> usize {
        self.admin
            .folder(&id(mailbox), folder)
            .await
            .unwrap()
            .files
            .len()
    }
}

both_stores!(killed_after_every_protocol_step_and_restarted);
async fn killed_after_every_protocol_step_and_restarted(store: Store) {
    let mut s = Crashable::start(store).await;
    s.admin.create_enterprise(&id("acme")).await.unwrap();
    s.admin
        .create_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();
    let db = s
        .admin
        .create_database(&id("acme"), &id("db-a"))
        .await
        .unwrap()
        .token;
    let phone = s
        .admin
        .create_device(&id("acme"), &id("phone-1"), &id("sales"))
        .await
        .unwrap()
        .token;
    s.crash().await;

    // Upload: the message is durable once answered.
    let sent = s
        .as_token(&phone)
        .send(&message("db-a", r#"{"n":1}"#, Some("k1")))
        .await
        .unwrap();
    s.as_token(&phone)
        .send(&message("db-a", r#"{"n":2}"#, Some("k2")))
        .await
        .unwrap();
    s.crash().await;
    assert_eq!(s.files("db-a", Folder::Messages).await, 2);
    // The same key after the crash: the same message, not a second one.
    let again = s
        .as_token(&phone)
        .send(&message("db-a", r#"{"n":1}"#, Some("k1")))
        .await
        .unwrap();
    assert_eq!(again.accepted.id, sent.accepted.id);
    assert_eq!(s.files("db-a", Folder::Messages).await, 2);

    // Start: the process survives, STARTED, and the database stays BUSY.
    let started = s.as_token(&db).start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let messages = started.messages.unwrap();
    assert_eq!(messages.len(), 2);
    s.crash().await;
    let processor = s.as_token(&db);
    assert_eq!(
        processor.process(&pid).await.unwrap().state,
        ProcessState::Started
    );
    assert_eq!(
        processor
            .start(&start_request("db-a"))
            .await
            .unwrap()
            .status,
        estafeta_exchange::wire::StartStatus::Busy
    );

    // Accept narrows to the first message; that survives too.
    assert_eq!(
        processor
            .accept(&pid, &[messages[0].id])
            .await
            .unwrap()
            .status,
        CallStatus::Ok
    );
    s.crash().await;
    let processor = s.as_token(&db);
    let prepare = PrepareRequest {
        version: Version,
        results: vec![MessageResult {
            message_id: messages[0].id,
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
    // Results must name exactly the accepted message, even after the crash.
    assert_eq!(
        processor.prepare(&pid, &prepare).await.unwrap().status,
        CallStatus::Ok
    );
    assert_eq!(s.files("db-a", Folder::Prepared).await, 1);

    // Commit, then crash: DONE, files where they belong.
    assert_eq!(processor.commit(&pid).await.unwrap().status, CallStatus::Ok);
    s.crash().await;
    let processor = s.as_token(&db);
    assert_eq!(
        processor.process(&pid).await.unwrap().state,
        ProcessState::Done
    );
    assert_eq!(
        processor.commit(&pid).await.unwrap().status,
        CallStatus::Ok,
        "commit again: OK again"
    );
    assert_eq!(s.files("db-a", Folder::Log).await, 1);
    assert_eq!(
        s.files("db-a", Folder::Messages).await,
        1,
        "the message not accepted stays"
    );
    assert_eq!(s.files("db-a", Folder::Prepared).await, 0);
    assert_eq!(s.files("phone-1", Folder::Messages).await, 1);

    // The device fetches and acknowledges; the acknowledgement survives.
    let device = s.as_token(&phone);
    let inbox = device.inbox(None).await.unwrap();
    assert_eq!(inbox.messages.len(), 1);
    assert_eq!(device.ack(&[inbox.messages[0].id]).await.unwrap().acked, 1);
    s.crash().await;
    assert!(
        s.as_token(&phone)
            .inbox(None)
            .await
            .unwrap()
            .messages
            .is_empty()
    );
    assert_eq!(s.files("phone-1", Folder::Log).await, 1);

    // The remaining message: rolled back after a crash in STARTED.
    let processor = s.as_token(&db);
    let started = processor.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    s.crash().await;
    let processor = s.as_token(&db);
    assert_eq!(
        processor.rollback(&pid, "tx failed").await.unwrap().status,
        CallStatus::Ok
    );
    assert_eq!(
        processor.process(&pid).await.unwrap().state,
        ProcessState::RolledBack
    );
    assert_eq!(s.files("db-a", Folder::Messages).await, 1);
    if let Some(server) = s.server.take() {
        assert_eq!(server.terminate().await, Some(0));
    }
}
