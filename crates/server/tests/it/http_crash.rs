//! The real binary killed with `kill -9` in the middle of a process and
//! started again on the same data folder.

use crate::common::{
    Binary, Store, both_stores, listed, message, prepare_all, provision_one, start_request,
    wait_ready,
};
use estafeta_client::Client;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{Body, CallStatus, ProcessState};
use estafeta_exchange::{MessageId, ProcessId};

/// `processor` prepares `pid` with `msg` PROCESSED and the reply
/// `{"ok":1}` to `phone-1`: answered OK.
async fn prepare_ok(processor: &Client, pid: &ProcessId, msg: MessageId) {
    let prepare = prepare_all([msg], r#"{"ok":1}"#);
    let status = processor.prepare(pid, &prepare).await.unwrap().status;
    assert_eq!(status, CallStatus::Ok);
}

both_stores!(killed_while_ready_to_commit_and_committed_after_the_restart);
async fn killed_while_ready_to_commit_and_committed_after_the_restart(store: Store) {
    let mut s = Crashable::start(store).await;
    let (db, phone) = provision_one(&s.admin).await;
    s.as_token(&phone)
        .send(&message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();
    let processor = s.as_token(&db);
    let started = processor.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let msg = started.messages.unwrap()[0].id;
    prepare_ok(&processor, &pid, msg).await;
    s.crash().await;

    let processor = s.as_token(&db);
    // The embedded store finds the process at start-up and cannot know
    // whether its transaction committed: in doubt, the message and the
    // reply in `Unknown`. A cluster node's start leaves processes as they
    // are (another node may be serving them): READY_TO_COMMIT, the reply in
    // `Prepared`.
    let (state, unknown, prepared) = match s.store {
        None => (ProcessState::InDoubt, 2, 0),
        Some(_) => (ProcessState::ReadyToCommit, 0, 1),
    };
    assert_eq!(processor.process(&pid).await.unwrap().state, state);
    for (folder, files) in [(Folder::Unknown, unknown), (Folder::Prepared, prepared)] {
        let listed = listed(&s.admin, "db-a", folder).await;
        assert_eq!(listed.len(), files, "{listed:?}");
    }

    // The processor learns that its transaction committed.
    assert_eq!(processor.commit(&pid).await.unwrap().status, CallStatus::Ok);
    assert!(listed(&s.admin, "db-a", Folder::Unknown).await.is_empty());
    assert_eq!(listed(&s.admin, "db-a", Folder::Log).await, vec![msg]);
    let inbox = s.as_token(&phone).inbox(None).await.unwrap();
    assert_eq!(inbox.messages.len(), 1);
    assert_eq!(
        inbox.messages[0].body,
        Body::from_json(r#"{"ok":1}"#).unwrap()
    );
    s.stop().await;
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

    /// Stops the server with SIGTERM: it exits 0.
    async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            assert_eq!(server.terminate().await, Some(0));
        }
    }

    fn as_token(&self, token: &str) -> Client {
        self.admin.with_token(token)
    }

    async fn files(&self, mailbox: &str, folder: Folder) -> usize {
        listed(&self.admin, mailbox, folder).await.len()
    }
}

both_stores!(killed_after_every_protocol_step_and_restarted);
async fn killed_after_every_protocol_step_and_restarted(store: Store) {
    let mut s = Crashable::start(store).await;
    let (db, phone) = provision_one(&s.admin).await;
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
    // Results must name exactly the accepted message, even after the crash.
    prepare_ok(&processor, &pid, messages[0].id).await;
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
    s.stop().await;
}
