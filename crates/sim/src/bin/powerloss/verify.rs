//! The workload run under the recorder, and the checks run on every crash
//! state: the real server's start-up recovery, then nothing acknowledged
//! lost, nothing duplicated, nothing stuck.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use estafeta_client::Client;
use estafeta_wire::{
    Body, Folder, Id, MessageId, MessageResult, PrepareRequest, ProcessId, Reply, ResultStatus,
    SendMessage, StartRequest, StartStatus, Version,
};
use tokio::process::{Child, Command};

/// The admin token every server of a run gets.
pub(crate) const ADMIN_TOKEN: &str = "powerloss-admin-token-0123456789abcdef";

/// How long a server may take to answer `/readyz`.
const READY_BOUND: Duration = Duration::from_secs(30);

/// The reply's body: how the checks tell it from other messages.
const REPLY: &str = r#"{"reply":"cycle"}"#;

/// Seconds since the epoch, as strace's `-ttt` prints them.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What the workload got acknowledged, and when.
#[derive(Clone, Debug, Default)]
pub(crate) struct Acks {
    /// The database and the device exist.
    pub(crate) provisioned: Option<f64>,
    db: Option<Id>,
    db_token: String,
    device: Option<Id>,
    device_token: String,
    /// Uploads: idempotency key, message id, acknowledged at.
    uploads: Vec<(String, MessageId, f64)>,
    /// The processor's cycle: its process (known from the start's
    /// answer, acknowledged then) and the messages it processed.
    pid: Option<ProcessId>,
    started: Option<f64>,
    processed: Vec<MessageId>,
    /// The processor committed its own transaction then.
    local_commit: Option<f64>,
    /// The server acknowledged the commit then.
    commit: Option<f64>,
}

impl Acks {
    /// What the workload had acknowledged before `until`, as one
    /// comparable value (crash states with the same files and the same
    /// value need one check only).
    pub(crate) fn signature(&self, until: f64) -> Vec<bool> {
        let mut sig = vec![
            self.provisioned.is_some_and(|t| t < until),
            self.started.is_some_and(|t| t < until),
            self.local_commit.is_some_and(|t| t < until),
            self.commit.is_some_and(|t| t < until),
        ];
        sig.extend(self.uploads.iter().map(|u| u.2 < until));
        sig
    }

    /// How the processor settles its process after a crash at `until`,
    /// as a real one does (`Processor::settle`): it knows the process once
    /// the start answered; a late commit if its own transaction committed,
    /// a rollback otherwise (a prepare the server saved may not have been
    /// answered before the cut, and the process is in doubt on restart).
    pub(crate) fn settlement(&self, until: f64) -> Option<(ProcessId, Settle)> {
        let pid = self
            .pid
            .filter(|_| self.started.is_some_and(|t| t < until))?;
        if self.local_commit.is_some_and(|t| t < until) {
            Some((pid, Settle::Commit))
        } else {
            Some((pid, Settle::Rollback))
        }
    }

    /// How many calls were acknowledged.
    pub(crate) fn count(&self) -> usize {
        self.uploads.len()
            + usize::from(self.provisioned.is_some())
            + usize::from(self.commit.is_some())
    }
}

/// The processor's verdict on its process after a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Its transaction committed: a late `commit`.
    Commit,
    /// It did not: a `rollback`.
    Rollback,
}

/// A server process on a data folder.
pub(crate) struct Server {
    child: Child,
    pub(crate) admin: Client,
}

impl Server {
    /// Starts `cmd` (the server, possibly under strace) and waits for
    /// `/readyz`; `Err` with the reason when it does not get there.
    pub(crate) async fn start(
        mut cmd: Command,
        data: &Path,
        port: u16,
        log: &Path,
    ) -> anyhow::Result<Server> {
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ESTAFETA_") {
                cmd.env_remove(key);
            }
        }
        let log = std::fs::File::create(log)?;
        cmd.env("ESTAFETA_DATA_DIR", data)
            .env("ESTAFETA_LISTEN", format!("127.0.0.1:{port}"))
            .env("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("ESTAFETA_STARTED_TIMEOUT", "2s")
            .env("ESTAFETA_READY_TIMEOUT", "2s")
            .env("ESTAFETA_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().context("starting the server")?;
        let admin = Client::with_timeout(
            &format!("http://127.0.0.1:{port}"),
            ADMIN_TOKEN,
            Duration::from_secs(20),
        )?;
        let mut server = Server { child, admin };
        let began = Instant::now();
        while began.elapsed() < READY_BOUND {
            if let Ok(true) = server.admin.readyz().await {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("the server exited during start-up ({status})");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("the server was not ready within {READY_BOUND:?}")
    }

    /// The process id (the server's, or strace's when it runs under it).
    pub(crate) fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// `kill -9`, and waits for it.
    pub(crate) async fn kill(mut self) -> anyhow::Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// Waits for the process to end by itself.
    pub(crate) async fn wait(mut self) -> anyhow::Result<()> {
        self.child.wait().await?;
        Ok(())
    }
}

fn start_request(db: &Id) -> StartRequest {
    StartRequest {
        version: Version,
        db_id: db.clone(),
        subsystems: None,
        senders: None,
        max_files: None,
        max_mb: None,
    }
}

fn upload(to: &Id, key: &str) -> anyhow::Result<SendMessage> {
    Ok(SendMessage {
        version: Version,
        to: to.clone(),
        body: Body::from_json(format!(r#"{{"key":"{key}"}}"#))?,
        created_at: None,
        deliver_at: None,
        idempotency_key: Some(key.to_owned()),
    })
}

/// Processes every message in `processed` (all PROCESSED), with `replies`.
fn prepare(messages: &[MessageId], replies: Vec<Reply>) -> PrepareRequest {
    PrepareRequest {
        version: Version,
        results: messages
            .iter()
            .map(|id| MessageResult {
                message_id: *id,
                status: ResultStatus::Processed,
                error_code: None,
                error_text: None,
            })
            .collect(),
        replies,
    }
}

/// The workload: provision a database and a device; `uploads` uploads
/// with idempotency keys, half before and half after one processor cycle
/// (start → prepare with a reply to the device → the processor's own
/// commit → commit).
pub(crate) async fn workload(admin: &Client, uploads: usize) -> anyhow::Result<Acks> {
    let mut acks = Acks::default();
    let ent: Id = "powerloss".parse()?;
    let sales: Id = "sales".parse()?;
    let db: Id = "db-0".parse()?;
    let dev: Id = "dev-0".parse()?;
    admin.create_enterprise(&ent).await?;
    admin.create_subsystem(&ent, &sales).await?;
    acks.db_token = admin.create_database(&ent, &db).await?.token;
    acks.device_token = admin.create_device(&ent, &dev, &sales).await?.token;
    acks.provisioned = Some(now());
    let device = admin.with_token(&acks.device_token);
    let processor = admin.with_token(&acks.db_token);
    for i in 0..uploads {
        if i == uploads / 2 {
            let started = processor.start(&start_request(&db)).await?;
            if started.status != StartStatus::Ok {
                bail!("the processor's start answered {:?}", started.status);
            }
            let pid = started.process_id.context("no process id")?;
            acks.started = Some(now());
            acks.pid = Some(pid);
            let ids: Vec<MessageId> = started
                .messages
                .unwrap_or_default()
                .into_iter()
                .map(|m| m.id)
                .collect();
            let reply = Reply {
                to: dev.clone(),
                body: Body::from_json(REPLY)?,
                created_at: None,
                deliver_at: None,
            };
            processor.prepare(&pid, &prepare(&ids, vec![reply])).await?;
            acks.local_commit = Some(now());
            processor.commit(&pid).await?;
            acks.commit = Some(now());
            acks.processed = ids;
        }
        let key = format!("key-{i}");
        let sent = device.send(&upload(&db, &key)?).await?;
        acks.uploads.push((key, sent.accepted.id, now()));
    }
    acks.db = Some(db);
    acks.device = Some(dev);
    Ok(acks)
}

/// Starts the real server on the crash state in `state` (its `data`
/// folder), lets a processor and the device recover as they would after
/// the crash, and checks what was acknowledged before `until`; the
/// violations found.
pub(crate) async fn check_state(
    binary: &Path,
    state: &Path,
    acks: &Acks,
    until: f64,
    port: u16,
) -> anyhow::Result<Vec<String>> {
    let mut cmd = Command::new(binary);
    cmd.arg("serve").current_dir(state);
    let server =
        match Server::start(cmd, &state.join("data"), port, &state.join("server.log")).await {
            Ok(server) => server,
            Err(e) => {
                return Ok(vec![format!(
                    "stuck: {e:#}; {}",
                    last_line(&state.join("server.log"))
                )]);
            }
        };
    let found = checks(&server.admin, acks, until).await;
    server.kill().await?;
    found
}

fn last_line(log: &PathBuf) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|s| {
            s.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

async fn checks(admin: &Client, acks: &Acks, until: f64) -> anyhow::Result<Vec<String>> {
    let acked = |t: Option<f64>| t.is_some_and(|t| t < until);
    let mut found = Vec::new();
    let (Some(db), true) = (&acks.db, acked(acks.provisioned)) else {
        return Ok(found);
    };
    let device = admin.with_token(&acks.device_token);
    let processor = admin.with_token(&acks.db_token);
    if let Err(e) = device.inbox(None).await {
        found.push(format!("lost: the device dev-0 ({e})"));
        return Ok(found);
    }
    // The processor recovers: it settles the process it knows, a late
    // commit when its own transaction committed, a rollback otherwise.
    let mut applied: BTreeSet<MessageId> = BTreeSet::new();
    match acks.settlement(until) {
        Some((pid, Settle::Commit)) => {
            applied.extend(acks.processed.iter().copied());
            if let Err(e) = processor.commit(&pid).await {
                found.push(format!(
                    "lost: the prepared process {pid}, its commit answered {e}"
                ));
            }
        }
        Some((pid, Settle::Rollback)) => {
            if let Err(e) = processor
                .rollback(&pid, "the processor's transaction did not commit")
                .await
            {
                found.push(format!(
                    "stuck: the process {pid}, its rollback answered {e}"
                ));
            }
        }
        None => {}
    }
    // Then it processes whatever the queue offers until it is idle.
    let began = Instant::now();
    loop {
        if began.elapsed() > Duration::from_secs(20) {
            found.push("stuck: the queue never became idle".to_owned());
            break;
        }
        let started = match processor.start(&start_request(db)).await {
            Ok(s) => s,
            Err(e) => {
                found.push(format!("stuck: start answered {e}"));
                break;
            }
        };
        match started.status {
            StartStatus::Idle => break,
            StartStatus::Busy => tokio::time::sleep(Duration::from_millis(200)).await,
            StartStatus::Ok => {
                let pid = started.process_id.context("no process id")?;
                let ids: Vec<MessageId> = started
                    .messages
                    .unwrap_or_default()
                    .into_iter()
                    .map(|m| m.id)
                    .collect();
                for id in &ids {
                    if !applied.insert(*id) {
                        found.push(format!(
                            "duplicated: message {id} offered again after it was processed"
                        ));
                    }
                }
                processor.prepare(&pid, &prepare(&ids, Vec::new())).await?;
                processor.commit(&pid).await?;
            }
        }
    }
    for (key, id, at) in &acks.uploads {
        if *at < until && !applied.contains(id) {
            found.push(format!("lost: acknowledged upload {key} (message {id})"));
        }
    }
    for folder in [Folder::Messages, Folder::Prepared, Folder::Unknown] {
        let files = admin.folder(db, folder).await?.files.len();
        if files > 0 {
            found.push(format!("stuck: {files} file(s) left in {db}/{folder}"));
        }
    }
    let replies = device
        .inbox(None)
        .await?
        .messages
        .iter()
        .filter(|m| m.body.get() == REPLY)
        .count();
    if replies > 1 {
        found.push(format!("duplicated: the reply delivered {replies} times"));
    }
    if replies == 0 && acked(acks.commit) {
        found.push("lost: the reply of the acknowledged commit".to_owned());
    }
    // The idempotency keys of acknowledged uploads are still known.
    for (key, id, at) in &acks.uploads {
        if *at < until {
            let again = device.send(&upload(db, key)?).await?;
            if &again.accepted.id != id {
                found.push(format!(
                    "duplicated: upload {key} again became a new message {} (idempotency key lost)",
                    again.accepted.id
                ));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acks() -> Acks {
        Acks {
            pid: Some(estafeta_wire::UlidGenerator::new().process_id(SystemTime::now())),
            started: Some(10.0),
            local_commit: Some(20.0),
            commit: Some(30.0),
            ..Acks::default()
        }
    }

    #[test]
    fn the_processor_settles_only_a_process_whose_start_it_heard() {
        assert_eq!(acks().settlement(10.0), None);
        assert!(acks().settlement(10.5).is_some());
    }

    #[test]
    fn a_process_prepared_but_not_committed_locally_is_rolled_back() {
        // A cut after the server saved the prepare (READY_TO_COMMIT, so in
        // doubt at restart) and before the processor committed: it rolls
        // back, and the messages are offered again.
        let a = acks();
        assert_eq!(a.settlement(15.0).map(|s| s.1), Some(Settle::Rollback));
        assert_eq!(a.settlement(25.0).map(|s| s.1), Some(Settle::Commit));
        assert_eq!(a.settlement(35.0).map(|s| s.1), Some(Settle::Commit));
    }

    #[test]
    fn what_the_processor_heard_tells_crash_states_apart() {
        let a = acks();
        assert_ne!(a.signature(5.0), a.signature(15.0));
        assert_ne!(a.signature(15.0), a.signature(25.0));
    }
}
