//! A prepare's replies are deleted when its process ends without them
//! (rolled back, aborted, timed out): with the message store out of reach
//! at that moment, the step fails before its save and is tried again,
//! rather than ending the process and leaving replies no record names (a
//! shared store has no start-up look for them).

use async_trait::async_trait;
use estafeta_exchange::error::MailboxError;
use estafeta_exchange::store::{
    Applied, FileEntry, FileName, Filter, Folder, Limits, Location, MailboxKind, MessageStore, Op,
    Outcome, RawArray, Tallies,
};
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::*;
use estafeta_exchange::{Exchange, ExchangeConfig, Id, MessageId, Sinks, Stores, Timestamp};
use estafeta_session::{Timestamp as SessionTime, TokioClock};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The exchange's message store, whose deletes fail as a store out of
/// reach while `down` is set.
struct Flaky {
    inner: Arc<dyn MessageStore>,
    down: Arc<AtomicBool>,
}

#[async_trait]
impl MessageStore for Flaky {
    async fn create_mailbox(&self, owner: &Id) -> Result<(), MailboxError> {
        self.inner.create_mailbox(owner).await
    }
    async fn remove_mailbox(&self, owner: &Id) -> Result<u64, MailboxError> {
        self.inner.remove_mailbox(owner).await
    }
    async fn scheduled_for(&self, owner: &Id) -> Result<u64, MailboxError> {
        self.inner.scheduled_for(owner).await
    }
    async fn put(&self, at: &Location, message: &Message) -> Result<FileEntry, MailboxError> {
        self.inner.put(at, message).await
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
                results: ops
                    .iter()
                    .map(|_| {
                        Err(MailboxError::store(
                            "test:delete",
                            "connection closed",
                            true,
                        ))
                    })
                    .collect(),
                arrivals: Default::default(),
            };
        }
        self.inner.apply(step, ops).await
    }
    async fn delete_all(
        &self,
        at: &Location,
        names: &[FileName],
    ) -> Vec<Result<Outcome, MailboxError>> {
        if self.down.load(Ordering::SeqCst) {
            return names
                .iter()
                .map(|_| {
                    Err(MailboxError::store(
                        "test:delete",
                        "connection closed",
                        true,
                    ))
                })
                .collect();
        }
        self.inner.delete_all(at, names).await
    }
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

fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_rollback_whose_replies_cannot_be_deleted_fails_and_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut config = ExchangeConfig::new(&data);
    config.admin_token = Some("a".repeat(64));
    let clock: Arc<dyn estafeta_session::Clock> =
        Arc::new(TokioClock::starting_at(SessionTime(1_800_000_000_000)));
    let mut stores = Stores::embedded(&data, clock.clone(), &config.quiesce)
        .await
        .unwrap();
    let down = Arc::new(AtomicBool::new(false));
    stores.messages = Arc::new(Flaky {
        inner: stores.messages,
        down: down.clone(),
    });
    let (ex, _) = Exchange::open(config, clock, Sinks::default(), stores)
        .await
        .unwrap();
    ex.recover().await.unwrap();

    let admin = Principal::Admin;
    ex.create_enterprise(&admin, id("acme")).await.unwrap();
    ex.create_subsystem(&admin, id("acme"), id("sales"))
        .await
        .unwrap();
    let db_token = ex
        .create_database(&admin, id("acme"), id("db-a"))
        .await
        .unwrap();
    let phone_token = ex
        .create_device(&admin, id("acme"), id("phone-1"), id("sales"))
        .await
        .unwrap();
    let db = ex.authenticate(db_token.expose()).await.unwrap().unwrap();
    let phone = ex
        .authenticate(phone_token.expose())
        .await
        .unwrap()
        .unwrap();

    let upload = SendMessage {
        version: Version,
        to: id("db-a"),
        body: Body::from_json(r#"{"n":1}"#).unwrap(),
        created_at: None,
        deliver_at: None,
        idempotency_key: None,
    };
    ex.send(&phone, upload).await.unwrap();
    let start = StartRequest {
        version: Version,
        db_id: id("db-a"),
        subsystems: None,
        senders: None,
        max_files: None,
        max_mb: None,
    };
    let started: StartResponse =
        serde_json::from_slice(&ex.start(&db, start).await.unwrap()).unwrap();
    let pid = started.process_id.unwrap().to_string();
    let results = started
        .messages
        .iter()
        .flatten()
        .map(|m| MessageResult {
            message_id: m.id,
            status: ResultStatus::Processed,
            error_code: None,
            error_text: None,
        })
        .collect();
    let replies = (0..2)
        .map(|i| Reply {
            to: id("phone-1"),
            body: Body::from_json(format!(r#"{{"reply":{i}}}"#)).unwrap(),
            created_at: None,
            deliver_at: None,
        })
        .collect();
    let prepare = PrepareRequest {
        version: Version,
        results,
        replies,
    };
    let prepared = ex.prepare(&db, &pid, prepare).await.unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);
    let rollback = || RollbackRequest {
        version: Version,
        error_text: "tx failed".into(),
    };

    down.store(true, Ordering::SeqCst);
    let refused = ex.rollback(&db, &pid, rollback()).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::StorageError);
    assert!(refused.is_store_unavailable(), "{refused}");
    // The end is saved before the replies are deleted: the verdict stands,
    // and the deletion is what is tried again.
    assert_eq!(
        ex.process_status(&db, &pid).await.unwrap().state,
        ProcessState::RolledBack
    );

    down.store(false, Ordering::SeqCst);
    let again = ex.rollback(&db, &pid, rollback()).await.unwrap();
    assert_eq!(again.status, CallStatus::Ok);
    assert_eq!(
        ex.process_status(&db, &pid).await.unwrap().state,
        ProcessState::RolledBack
    );
    let left = std::fs::read_dir(data.join("db-a").join(Folder::Prepared.as_str()))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .count();
    assert_eq!(left, 0, "the replies were deleted");
}
