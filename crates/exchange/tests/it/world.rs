//! A whole exchange on a temporary data folder with a controlled clock,
//! provisioned with two enterprises, databases and devices.

use crate::common::{id, message_files, replies, send_request, start_request};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::*;
use estafeta_exchange::{Exchange, ExchangeConfig, MessageId, Sinks};
use estafeta_session::{Timestamp as SessionTime, TokioClock};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub(crate) const STARTED_TIMEOUT: Duration = Duration::from_secs(600);
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(300);

pub(crate) struct World {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) ex: Exchange,
    pub(crate) admin: Principal,
    pub(crate) db: Principal,
    pub(crate) db2: Principal,
    pub(crate) phone: Principal,
    pub(crate) phone2: Principal,
    pub(crate) other_db: Principal,
    pub(crate) other_phone: Principal,
}

/// The exchange opened on `dir`'s data folder, handing alerts and arrivals
/// to `sinks`, and start-up processing run.
pub(crate) async fn open(dir: &std::path::Path, start: SessionTime, sinks: Sinks) -> Exchange {
    let ex = open_unrecovered(dir, start, sinks).await;
    ex.recover().await.unwrap();
    ex
}

/// The configuration of an exchange on the data folder `data`, with the
/// tests' admin token, and a clock on tokio's (pausable) time that reads
/// `start` now.
pub(crate) fn config_and_clock(
    data: &Path,
    start: SessionTime,
) -> (ExchangeConfig, Arc<dyn estafeta_session::Clock>) {
    let mut config = ExchangeConfig::new(data);
    config.admin_token = Some("a".repeat(64));
    (config, Arc::new(TokioClock::starting_at(start)))
}

/// Provisions on `ex` the enterprise acme with its subsystem sales, its
/// database db-a and its device phone-1: the principals of db-a and
/// phone-1.
pub(crate) async fn provision_acme(ex: &Exchange) -> (Principal, Principal) {
    let admin = Principal::Admin;
    ex.create_enterprise(&admin, id("acme")).await.unwrap();
    ex.create_subsystem(&admin, id("acme"), id("sales"))
        .await
        .unwrap();
    let db = ex.create_database(&admin, id("acme"), id("db-a")).await;
    let phone = ex
        .create_device(&admin, id("acme"), id("phone-1"), id("sales"))
        .await;
    let db = ex.authenticate(db.unwrap().expose()).await.unwrap();
    let phone = ex.authenticate(phone.unwrap().expose()).await.unwrap();
    (db.unwrap(), phone.unwrap())
}

/// Writes `state` as the session record of `key` in the session store of
/// the data folder `data`, made and last used at `at` (ms), as an earlier
/// version wrote it (the exchange stopped).
pub(crate) fn write_old_record(data: &Path, key: &[u8], state: &str, at: u64) {
    use estafeta_session::storage::{RedbStorage, Storage, Write};
    let sessions = estafeta_exchange::DataLayout::new(data).sessions();
    let storage = RedbStorage::open(sessions).unwrap();
    let mut record = vec![estafeta_session::record::FORMAT_VERSION];
    record.extend(
        format!(
            r#"{{"created_at":{at},"last_access":{at},"expires_at":null,"generation":0,"state":{state}}}"#
        )
        .bytes(),
    );
    let put = Write::Put {
        key: key.to_vec(),
        record,
        expires_at: None,
    };
    storage.write(&[put]).unwrap();
}

/// Shuts `ex` down, drops it and lets its tasks close their files.
pub(crate) async fn close(ex: Exchange) {
    ex.shutdown().await.unwrap();
    drop(ex);
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

/// The exchange opened, start-up processing not yet run.
pub(crate) async fn open_unrecovered(
    dir: &std::path::Path,
    start: SessionTime,
    sinks: Sinks,
) -> Exchange {
    let (mut config, clock) = config_and_clock(&dir.join("data"), start);
    config.started_timeout = STARTED_TIMEOUT;
    config.ready_timeout = READY_TIMEOUT;
    let (ex, _) = Exchange::open_embedded(config, clock, sinks).await.unwrap();
    ex
}

impl World {
    pub(crate) async fn new() -> World {
        World::with_sinks(|_| Sinks::default()).await
    }

    /// A world whose exchange hands alerts and arrivals to the sinks that
    /// `sinks` makes, given the data folder.
    pub(crate) async fn with_sinks(sinks: impl FnOnce(&std::path::Path) -> Sinks) -> World {
        let dir = tempfile::tempdir().unwrap();
        let sinks = sinks(&dir.path().join("data"));
        let ex = open(dir.path(), SessionTime(1_800_000_000_000), sinks).await;
        let admin = Principal::Admin;
        for ent in ["acme", "other"] {
            ex.create_enterprise(&admin, id(ent)).await.unwrap();
            ex.create_subsystem(&admin, id(ent), id("sales"))
                .await
                .unwrap();
        }
        let mut tokens = Vec::new();
        for (ent, db) in [("acme", "db-a"), ("acme", "db-b"), ("other", "db-x")] {
            tokens.push(ex.create_database(&admin, id(ent), id(db)).await.unwrap());
        }
        for (ent, dev) in [
            ("acme", "phone-1"),
            ("acme", "phone-2"),
            ("other", "phone-x"),
        ] {
            tokens.push(
                ex.create_device(&admin, id(ent), id(dev), id("sales"))
                    .await
                    .unwrap(),
            );
        }
        let mut p: Vec<Principal> = Vec::new();
        for t in &tokens {
            p.push(ex.authenticate(t.expose()).await.unwrap().unwrap());
        }
        World {
            dir,
            ex,
            admin,
            db: p[0].clone(),
            db2: p[1].clone(),
            other_db: p[2].clone(),
            phone: p[3].clone(),
            phone2: p[4].clone(),
            other_phone: p[5].clone(),
        }
    }

    /// Shut the exchange down, let its tasks close their files, and open
    /// the same data folder again with a clock that reads `at`.
    pub(crate) async fn restart(self, at: SessionTime) -> World {
        self.restart_with(at, |_| Sinks::default()).await
    }

    /// [`World::restart`] with the sinks that `sinks` makes, given the
    /// data folder.
    pub(crate) async fn restart_with(
        self,
        at: SessionTime,
        sinks: impl FnOnce(&std::path::Path) -> Sinks,
    ) -> World {
        let World { ex, dir, .. } = self;
        close(ex).await;
        let sinks = sinks(&dir.path().join("data"));
        let ex = open(dir.path(), at, sinks).await;
        World { ex, dir, ..self }
    }

    /// [`World::restart`] as after a crash: the clean stop's marker
    /// removed, so that the start looks for what a crash leaves (files a
    /// test put in place of a crash's between the two).
    pub(crate) async fn restart_as_after_a_crash(self, at: SessionTime) -> World {
        let World { ex, dir, .. } = self;
        close(ex).await;
        let data = dir.path().join("data");
        std::fs::remove_file(estafeta_exchange::DataLayout::new(&data).clean_stop()).unwrap();
        let ex = open(dir.path(), at, Sinks::default()).await;
        World { ex, dir, ..self }
    }

    pub(crate) fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// File count of a folder of a mailbox.
    pub(crate) fn files(&self, mailbox: &str, folder: Folder) -> usize {
        message_files(&self.data().join(mailbox).join(folder.as_str()))
    }

    pub(crate) async fn upload(&self, n: usize) -> Vec<MessageId> {
        let mut ids = Vec::new();
        for i in 0..n {
            let req = send_request("db-a", &format!(r#"{{"n":{i}}}"#), None);
            ids.push(self.ex.send(&self.phone, req).await.unwrap().0.id);
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        ids
    }

    pub(crate) async fn start(&self) -> StartResponse {
        let req = start_request("db-a");
        serde_json::from_slice(&self.ex.start(&self.db, req).await.unwrap()).unwrap()
    }

    /// `n` messages uploaded and a process started on them: the start's
    /// answer and the process id.
    pub(crate) async fn started(&self, n: usize) -> (StartResponse, String) {
        self.upload(n).await;
        let s = self.start().await;
        let pid = s.process_id.unwrap().to_string();
        (s, pid)
    }

    /// `messages` uploaded messages, started and prepared as processed
    /// with `replies` replies; the process id.
    pub(crate) async fn prepared(&self, messages: usize, replies: usize) -> String {
        let (s, pid) = self.started(messages).await;
        assert_eq!(
            self.prepare(&pid, Self::results(&s, ResultStatus::Processed), replies)
                .await,
            CallStatus::Ok
        );
        pid
    }

    /// Two uploaded messages, started and prepared with one reply, the
    /// first processed and the second incorrect; the process id.
    pub(crate) async fn prepared_with_an_incorrect(&self) -> String {
        let (s, pid) = self.started(2).await;
        let mut results = Self::results(&s, ResultStatus::Processed);
        results[1].status = ResultStatus::ProcessedIncorrect;
        assert_eq!(self.prepare(&pid, results, 1).await, CallStatus::Ok);
        pid
    }

    pub(crate) fn results(start: &StartResponse, status: ResultStatus) -> Vec<MessageResult> {
        start
            .messages
            .iter()
            .flatten()
            .map(|m| MessageResult {
                message_id: m.id,
                status,
                error_code: None,
                error_text: None,
            })
            .collect()
    }

    pub(crate) async fn prepare(
        &self,
        pid: &str,
        results: Vec<MessageResult>,
        n_replies: usize,
    ) -> CallStatus {
        let replies = replies(n_replies);
        self.ex
            .prepare(
                &self.db,
                pid,
                PrepareRequest {
                    version: Version,
                    results,
                    replies,
                },
            )
            .await
            .unwrap()
            .status
    }

    pub(crate) async fn commit(&self, pid: &str) -> CallStatus {
        self.ex
            .commit(&self.db, pid, CommitRequest { version: Version })
            .await
            .unwrap()
            .status
    }

    pub(crate) async fn rollback(&self, pid: &str) -> CallStatus {
        self.ex
            .rollback(
                &self.db,
                pid,
                RollbackRequest {
                    version: Version,
                    error_text: "tx failed".into(),
                },
            )
            .await
            .unwrap()
            .status
    }

    /// The abort of process `pid` with `message`.
    pub(crate) async fn abort(&self, pid: &str, message: &str) -> CallStatus {
        self.ex
            .abort(
                &self.db,
                pid,
                AbortRequest {
                    version: Version,
                    message: message.into(),
                },
            )
            .await
            .unwrap()
            .status
    }

    /// How many of `ids` phone-1's acknowledgement newly acknowledged.
    pub(crate) async fn ack(&self, ids: Vec<MessageId>) -> u64 {
        let req = AckRequest {
            version: Version,
            ids,
        };
        self.ex.ack(&self.phone, req).await.unwrap().acked
    }

    pub(crate) async fn state(&self, pid: &str) -> ProcessState {
        self.ex.process_status(&self.db, pid).await.unwrap().state
    }

    pub(crate) async fn inbox(&self) -> Inbox {
        serde_json::from_slice(&self.ex.inbox(&self.phone, None).await.unwrap()).unwrap()
    }
}
