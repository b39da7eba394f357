//! A prepare's replies are deleted when its process ends without them
//! (rolled back, aborted, timed out). A rollback saves its end first, with
//! the replies to delete named in the database's record, then deletes
//! them: with the message store out of reach at that moment, the call
//! fails and the deletion is tried again by the next call, and a server
//! stopped in between deletes them at its next start. No replies are left
//! that no record names (a shared store has no start-up look for them),
//! and no READY_TO_COMMIT process names replies that are gone. And a
//! commit whose moves failed after its replies were delivered, retried
//! once the device acknowledged them, finds them delivered, not missing.
//! And a retried upload whose message a full disk kept from being written
//! is written by the retry, while a second retry waits for it rather than
//! acknowledge a file that write may yet take back. And a device's
//! idempotency keys leave its record (handed to the key store, expired,
//! the device deleted) only once their uploads' queue is settled: with the
//! queue's folder failing to sync, the call fails and no key leaves.

use crate::common::{id, message_files, replies, send_request, start_request};
use crate::world::{World, config_and_clock, provision_acme};
use async_trait::async_trait;
use estafeta_exchange::error::MailboxError;
use estafeta_exchange::store::{
    Applied, FileEntry, FileName, Filter, Folder, Limits, Location, MailboxKind, MessageReads,
    MessageSteps, MessageStore, MessageUpkeep, Op, Outcome, RawArray, Tallies,
};
use estafeta_exchange::tenancy::{Kind, Principal};
use estafeta_exchange::wire::*;
use estafeta_exchange::{
    Alert, AlertSink, Exchange, ExchangeConfig, ExchangeError, Id, MessageId, Sinks, Stores,
    Timestamp, Upload,
};
use estafeta_session::BoxFuture;
use estafeta_session::Timestamp as SessionTime;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The exchange's message store, whose deletes fail as a store out of
/// reach while `down` is set, and whose moves into db-a's `Log` fail while
/// `log_fails` is set.
struct Flaky {
    inner: Arc<dyn MessageStore>,
    down: Arc<AtomicBool>,
    log_fails: Arc<AtomicBool>,
    puts: Arc<Puts>,
}

/// Faults of new messages' writes, as a full disk gives them: the next
/// write fails before its file exists, or it shows its file, waits until
/// released, then takes the file back and fails.
#[derive(Default)]
struct Puts {
    fail_next: AtomicBool,
    take_back: Mutex<
        Option<(
            tokio::sync::oneshot::Sender<()>,
            tokio::sync::oneshot::Receiver<()>,
        )>,
    >,
    /// Settling a queue fails (its folder's fsync, on a full disk).
    settle_fails: AtomicBool,
}

/// A full disk's error at `at`.
fn full(at: &Location) -> MailboxError {
    MailboxError::Storage {
        kind: estafeta_exchange::error::StorageKind::Full,
        path: format!("{at:?}").into(),
        source: std::io::Error::from(std::io::ErrorKind::StorageFull),
    }
}

/// An alert sink that keeps the keys of the alerts raised.
#[derive(Default)]
struct Raised(Mutex<Vec<String>>);

impl AlertSink for Raised {
    fn raise(&self, alert: Alert) -> BoxFuture<'_, ()> {
        self.0.lock().unwrap().push(alert.key);
        Box::pin(async {})
    }
    fn clear(&self, _key: String) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The error of each delete while the message store is out of reach.
fn out_of_reach() -> MailboxError {
    MailboxError::store("test:delete", "connection closed", true)
}

#[async_trait]
impl MessageSteps for Flaky {
    async fn put(&self, at: &Location, message: &Message) -> Result<FileEntry, MailboxError> {
        if self.puts.fail_next.swap(false, Ordering::SeqCst) {
            return Err(full(at));
        }
        let take_back = self.puts.take_back.lock().unwrap().take();
        let entry = self.inner.put(at, message).await?;
        let Some((shown, release)) = take_back else {
            return Ok(entry);
        };
        let _ = shown.send(());
        let _ = release.await;
        let gone = Op::Delete {
            name: entry.name.clone(),
            at: at.clone(),
        };
        let applied = self.inner.apply(None, &[gone]).await;
        assert!(applied.results.iter().all(Result::is_ok), "{applied:?}");
        Err(full(at))
    }

    async fn settle(&self, at: &Location) -> Result<(), MailboxError> {
        if self.puts.settle_fails.load(Ordering::SeqCst) {
            return Err(full(at));
        }
        self.inner.settle(at).await
    }

    async fn schedule(&self, message: &Message, until: Timestamp) -> Result<(), MailboxError> {
        self.inner.schedule(message, until).await
    }

    fn put_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        at: &Location,
        message: &Message,
    ) -> Result<Option<FileEntry>, MailboxError> {
        self.inner.put_in_step(step, at, message)
    }

    async fn put_all(
        &self,
        at: &Location,
        messages: &[Message],
        when: tokio::sync::oneshot::Receiver<bool>,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        self.inner.put_all(at, messages, when).await
    }

    fn put_all_in_step(
        &self,
        step: &mut dyn estafeta_session::storage::Step,
        at: &Location,
        messages: &[Message],
    ) -> Result<Option<Vec<FileEntry>>, MailboxError> {
        self.inner.put_all_in_step(step, at, messages)
    }

    async fn apply(
        &self,
        step: Option<&mut dyn estafeta_session::storage::Step>,
        ops: &[Op],
    ) -> Applied {
        let deletes = ops.iter().any(|op| matches!(op, Op::Delete { .. }));
        if deletes && self.down.load(Ordering::SeqCst) {
            return Applied {
                results: ops.iter().map(|_| Err(out_of_reach())).collect(),
                arrivals: Default::default(),
            };
        }
        let into_log = |op: &Op| matches!(op, Op::Move { to, .. } if to.folder == Folder::Log && to.mailbox.as_str() == "db-a");
        if !self.log_fails.load(Ordering::SeqCst) || !ops.iter().any(into_log) {
            return self.inner.apply(step, ops).await;
        }
        let rest: Vec<Op> = ops.iter().filter(|op| !into_log(op)).cloned().collect();
        let applied = self.inner.apply(step, &rest).await;
        let mut results = applied.results.into_iter();
        Applied {
            results: ops
                .iter()
                .map(|op| match into_log(op) {
                    true => Err(MailboxError::store("test:log", "disk error", false)),
                    false => results.next().unwrap(),
                })
                .collect(),
            arrivals: applied.arrivals,
        }
    }

    async fn delete_all(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Vec<Result<Outcome, MailboxError>> {
        if self.down.load(Ordering::SeqCst) {
            return names.iter().map(|_| Err(out_of_reach())).collect();
        }
        self.inner.delete_all(at, names).await
    }
}

#[async_trait]
impl MessageReads for Flaky {
    async fn select(
        &self,
        at: &Location,
        filter: &Filter,
        limits: Limits,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        self.inner.select(at, filter, limits).await
    }

    async fn read_array(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Result<RawArray, MailboxError> {
        self.inner.read_array(at, names).await
    }

    async fn count(&self, at: &Location) -> Result<usize, MailboxError> {
        self.inner.count(at).await
    }

    async fn oldest(&self, at: &Location, n: usize) -> Result<Vec<FileName>, MailboxError> {
        self.inner.oldest(at, n).await
    }

    async fn find(&self, at: &Location, id: MessageId) -> Result<Option<FileName>, MailboxError> {
        self.inner.find(at, id).await
    }

    async fn find_all(
        &self,
        at: &Location,
        ids: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError> {
        self.inner.find_all(at, ids).await
    }

    async fn delivered(&self, name: &FileName) -> Result<bool, MailboxError> {
        self.inner.delivered(name).await
    }

    async fn list(&self, at: &Location) -> Result<Vec<FileEntry>, MailboxError> {
        self.inner.list(at).await
    }
}

#[async_trait]
impl MessageUpkeep for Flaky {
    async fn create_mailbox(&self, owner: &Id) -> Result<(), MailboxError> {
        self.inner.create_mailbox(owner).await
    }

    async fn remove_mailbox(&self, owner: &Id) -> Result<u64, MailboxError> {
        self.inner.remove_mailbox(owner).await
    }

    async fn scheduled_for(&self, owner: &Id) -> Result<u64, MailboxError> {
        self.inner.scheduled_for(owner).await
    }

    async fn remove_older_than(
        &self,
        at: &Location,
        cutoff: Timestamp,
        keep: &HashSet<MessageId>,
    ) -> Result<usize, MailboxError> {
        self.inner.remove_older_than(at, cutoff, keep).await
    }

    async fn recover_writes(&self, owner: &Id) -> Result<(), MailboxError> {
        self.inner.recover_writes(owner).await
    }

    async fn unconfirmed_written(&self, owner: &Id) -> Result<Vec<Message>, MailboxError> {
        self.inner.unconfirmed_written(owner).await
    }

    async fn publish_written(
        &self,
        owner: &Id,
        confirmed: &HashSet<MessageId>,
    ) -> Result<(), MailboxError> {
        self.inner.publish_written(owner, confirmed).await
    }

    async fn orphans(
        &self,
        db: &Id,
        referenced: &HashSet<MessageId>,
    ) -> Result<Vec<FileName>, MailboxError> {
        self.inner.orphans(db, referenced).await
    }

    fn count_as(&self, owner: &Id, kind: MailboxKind) {
        self.inner.count_as(owner, kind)
    }

    async fn tallies(&self) -> Option<Tallies> {
        self.inner.tallies().await
    }

    async fn holding(&self, folder: Folder) -> Option<Vec<(MailboxKind, Id)>> {
        self.inner.holding(folder).await
    }
}

/// An exchange over a [`Flaky`] store with a process of db-a
/// READY_TO_COMMIT, which processed phone-1's upload and replies twice to
/// it.
struct Ready {
    ex: Exchange,
    /// Faults of the message store's writes of new messages.
    puts: Arc<Puts>,
    down: Arc<AtomicBool>,
    log_fails: Arc<AtomicBool>,
    raised: Arc<Raised>,
    db: Principal,
    phone: Principal,
    pid: String,
}

/// [`Ready`] over `data`.
async fn ready_to_commit(data: &std::path::Path) -> Ready {
    let (config, clock) = config_and_clock(data, SessionTime(1_800_000_000_000));
    let mut stores = Stores::embedded(data, clock.clone(), &config.quiesce)
        .await
        .unwrap();
    let down = Arc::new(AtomicBool::new(false));
    let log_fails = Arc::new(AtomicBool::new(false));
    let puts = Arc::new(Puts::default());
    stores.messages = Arc::new(Flaky {
        inner: stores.messages,
        down: down.clone(),
        log_fails: log_fails.clone(),
        puts: puts.clone(),
    });
    let raised = Arc::new(Raised::default());
    let sinks = Sinks {
        alerts: raised.clone(),
        ..Sinks::default()
    };
    let (ex, _) = Exchange::open(config, clock, sinks, stores).await.unwrap();
    ex.recover().await.unwrap();

    let (db, phone) = provision_acme(&ex).await;

    let upload = send_request("db-a", r#"{"n":1}"#, None);
    ex.send(&phone, upload).await.unwrap();
    let start = ex.start(&db, start_request("db-a")).await.unwrap();
    let started: StartResponse = serde_json::from_slice(&start).unwrap();
    let pid = started.process_id.unwrap().to_string();
    let prepare = PrepareRequest {
        version: Version,
        results: World::results(&started, ResultStatus::Processed),
        replies: replies(2),
    };
    let prepared = ex.prepare(&db, &pid, prepare).await.unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);
    Ready {
        ex,
        down,
        log_fails,
        puts,
        raised,
        db,
        phone,
        pid,
    }
}

/// The exchange over `data`'s embedded stores, start-up processing done.
async fn reopen(data: &std::path::Path) -> Exchange {
    let (config, clock) = config_and_clock(data, SessionTime(1_800_000_100_000));
    let (ex, _) = Exchange::open_embedded(config, clock, Sinks::default())
        .await
        .unwrap();
    ex.recover().await.unwrap();
    ex
}

/// How many message files `folder` of db-a holds.
fn files(data: &std::path::Path, folder: Folder) -> usize {
    message_files(&data.join("db-a").join(folder.as_str()))
}

fn rollback() -> RollbackRequest {
    RollbackRequest {
        version: Version,
        error_text: "tx failed".into(),
    }
}

/// [`Ready`] over `data`, and the refusal of its rollback sent while the
/// message store is out of reach (it stays so).
async fn refused_rollback(data: &std::path::Path) -> (Ready, ExchangeError) {
    let r = ready_to_commit(data).await;
    r.down.store(true, Ordering::SeqCst);
    let refused = r.ex.rollback(&r.db, &r.pid, rollback()).await.unwrap_err();
    (r, refused)
}

/// The state of `db`'s process `pid`, as `ex` tells it.
async fn state(ex: &Exchange, db: &Principal, pid: &str) -> ProcessState {
    ex.process_status(db, pid).await.unwrap().state
}

#[tokio::test(start_paused = true)]
async fn a_rollback_whose_replies_cannot_be_deleted_fails_and_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (
        Ready {
            ex, down, db, pid, ..
        },
        refused,
    ) = refused_rollback(&data).await;
    assert_eq!(refused.code(), ErrorCode::StorageError);
    assert!(refused.is_store_unavailable(), "{refused}");
    // The end is saved before the replies are deleted: the verdict stands,
    // and the deletion is what is tried again.
    assert_eq!(state(&ex, &db, &pid).await, ProcessState::RolledBack);
    assert_eq!(files(&data, Folder::Prepared), 2);

    down.store(false, Ordering::SeqCst);
    let again = ex.rollback(&db, &pid, rollback()).await.unwrap();
    assert_eq!(again.status, CallStatus::Ok);
    assert_eq!(state(&ex, &db, &pid).await, ProcessState::RolledBack);
    assert_eq!(
        files(&data, Folder::Prepared),
        0,
        "the replies were deleted"
    );
}

/// A server stopped between a rollback's saved end and the deletion of its
/// replies (as by a crash there): its next start deletes them. Nothing is
/// left in `Prepared`, nothing goes to `Unknown` (no orphan, no process in
/// doubt whose replies are gone), and the rollback sent again answers OK.
#[tokio::test(start_paused = true)]
async fn replies_a_rollback_left_are_deleted_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (Ready { ex, db, pid, .. }, _) = refused_rollback(&data).await;
    assert_eq!(files(&data, Folder::Prepared), 2);
    ex.shutdown().await.unwrap();
    drop(ex);

    let ex = reopen(&data).await;
    assert_eq!(files(&data, Folder::Prepared), 0, "deleted at the start");
    assert_eq!(files(&data, Folder::Unknown), 0);
    assert_eq!(state(&ex, &db, &pid).await, ProcessState::RolledBack);
    let again = ex.rollback(&db, &pid, rollback()).await.unwrap();
    assert_eq!(again.status, CallStatus::Ok);
}

#[tokio::test(start_paused = true)]
async fn a_retried_commit_finds_its_acknowledged_reply_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let r = ready_to_commit(&data).await;
    // The replies are delivered, the processed message's move to `Log`
    // fails: the commit is FAILED, its moves to be tried again.
    r.log_fails.store(true, Ordering::SeqCst);
    let failed =
        r.ex.commit(&r.db, &r.pid, CommitRequest { version: Version })
            .await
            .unwrap();
    assert_eq!(failed.status, CallStatus::Failed);
    let inbox: Inbox = serde_json::from_slice(&r.ex.inbox(&r.phone, None).await.unwrap()).unwrap();
    assert_eq!(inbox.messages.len(), 2);
    let ids = inbox.messages.iter().map(|m| m.id).collect();
    r.ex.ack(
        &r.phone,
        AckRequest {
            version: Version,
            ids,
        },
    )
    .await
    .unwrap();

    r.log_fails.store(false, Ordering::SeqCst);
    let done =
        r.ex.commit(&r.db, &r.pid, CommitRequest { version: Version })
            .await
            .unwrap();
    assert_eq!(done.status, CallStatus::Ok);
    assert_eq!(state(&r.ex, &r.db, &r.pid).await, ProcessState::Done);
    let raised = r.raised.0.lock().unwrap().clone();
    assert!(
        !raised.iter().any(|key| key.starts_with("missing_file:")),
        "{raised:?}"
    );
}

/// An upload repeated with its idempotency key after its message could not
/// be written (a full disk) is written by the retry; a second retry that
/// comes while the first one's write is under way waits for it, and does
/// not acknowledge a file that write then takes back: whatever is
/// acknowledged is in the database's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_never_acknowledges_the_file_of_another_retrys_write_under_way() {
    let dir = tempfile::tempdir().unwrap();
    let r = ready_to_commit(dir.path()).await;
    let keyed = || send_request("db-a", r#"{"n":2}"#, Some("k-1"));
    // The key is recorded, the message not written.
    r.puts.fail_next.store(true, Ordering::SeqCst);
    assert!(r.ex.send(&r.phone, keyed()).await.is_err());

    // The first retry's write shows its file and waits.
    let (shown_tx, shown) = tokio::sync::oneshot::channel();
    let (release, release_rx) = tokio::sync::oneshot::channel();
    *r.puts.take_back.lock().unwrap() = Some((shown_tx, release_rx));
    let first = tokio::spawn({
        let (ex, phone) = (r.ex.clone(), r.phone.clone());
        async move { ex.send(&phone, keyed()).await }
    });
    shown.await.unwrap();

    // The second retry: it waits for the device's session, or (the fault)
    // answers at once.
    let second = tokio::spawn({
        let (ex, phone) = (r.ex.clone(), r.phone.clone());
        async move { ex.send(&phone, keyed()).await }
    });
    while !second.is_finished() && r.ex.session_stats().queued == 0 {
        tokio::task::yield_now().await;
    }
    // The first write takes its file back and fails.
    release.send(()).unwrap();
    assert!(first.await.unwrap().is_err());
    let (accepted, _) = second.await.unwrap().unwrap();

    let queue =
        r.ex.folder(&Principal::Admin, id("db-a"), Folder::Messages)
            .await
            .unwrap();
    let waiting: Vec<MessageId> = queue.files.iter().map(|f| f.id).collect();
    assert!(
        waiting.contains(&accepted.id),
        "acknowledged {} but the queue holds {waiting:?}",
        accepted.id
    );
}

/// phone-1's upload to db-a with the idempotency key `k-<n>`.
fn keyed(n: usize) -> SendMessage {
    send_request("db-a", &format!(r#"{{"n":{n}}}"#), Some(&format!("k-{n}")))
}

/// A keyed upload's file appears once its key is in the device's record,
/// and its rename is not waited for on disk: after a crash the record's
/// key is what says the upload was accepted. So the 32 keys a record holds
/// go to the key store only once their queue is settled, and a device is
/// deleted (its keys with it) only then: with the queue's folder failing to
/// sync, both fail and every key stays; once it syncs, the upload is made
/// and every key still answers its first upload.
#[tokio::test(start_paused = true)]
async fn keys_leave_a_device_record_only_once_their_uploads_are_settled() {
    let dir = tempfile::tempdir().unwrap();
    let r = ready_to_commit(dir.path()).await;
    let before = files(dir.path(), Folder::Messages);
    let mut ids = Vec::new();
    for n in 0..32 {
        let (sent, outcome) = r.ex.send(&r.phone, keyed(n)).await.unwrap();
        assert_eq!(outcome, Upload::Created);
        ids.push(sent.id);
    }

    r.puts.settle_fails.store(true, Ordering::SeqCst);
    let refused = r.ex.send(&r.phone, keyed(32)).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::StorageFull, "{refused}");
    let phone = id("phone-1");
    let kept =
        r.ex.delete_endpoint(&Principal::Admin, Kind::Device, phone.clone(), true)
            .await
            .unwrap_err();
    assert_eq!(kept.code(), ErrorCode::StorageFull, "{kept}");
    assert_eq!(
        files(dir.path(), Folder::Messages),
        before + 32,
        "nothing written"
    );

    r.puts.settle_fails.store(false, Ordering::SeqCst);
    let (last, outcome) = r.ex.send(&r.phone, keyed(32)).await.unwrap();
    assert_eq!(outcome, Upload::Created);
    ids.push(last.id);
    for (n, first) in ids.iter().enumerate() {
        let (again, outcome) = r.ex.send(&r.phone, keyed(n)).await.unwrap();
        assert_eq!((again.id, outcome), (*first, Upload::Repeated), "k-{n}");
    }
    assert_eq!(files(dir.path(), Folder::Messages), before + 33);
}

/// An expired key leaves the device's record with the next keyed upload's
/// save, once its queue is settled: with the folder failing to sync, that
/// upload fails and nothing is written; once it syncs, both keys make new
/// uploads (the expired one is forgotten).
#[tokio::test(start_paused = true)]
async fn expired_keys_leave_a_device_record_only_once_their_uploads_are_settled() {
    let dir = tempfile::tempdir().unwrap();
    let r = ready_to_commit(dir.path()).await;
    let before = files(dir.path(), Folder::Messages);
    let (first, _) = r.ex.send(&r.phone, keyed(0)).await.unwrap();
    tokio::time::advance(ExchangeConfig::new(dir.path()).idempotency_ttl * 2).await;

    r.puts.settle_fails.store(true, Ordering::SeqCst);
    let refused = r.ex.send(&r.phone, keyed(1)).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::StorageFull, "{refused}");
    assert_eq!(
        files(dir.path(), Folder::Messages),
        before + 1,
        "nothing written"
    );

    r.puts.settle_fails.store(false, Ordering::SeqCst);
    let (_, outcome) = r.ex.send(&r.phone, keyed(1)).await.unwrap();
    assert_eq!(outcome, Upload::Created);
    let (again, outcome) = r.ex.send(&r.phone, keyed(0)).await.unwrap();
    assert_eq!(outcome, Upload::Created, "the expired key is forgotten");
    assert_ne!(again.id, first.id);
    assert_eq!(files(dir.path(), Folder::Messages), before + 3);
}
