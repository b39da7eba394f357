//! The checks run on every crash state: the real server's start-up
//! recovery, the clients' recovery as they would after the crash, then
//! nothing acknowledged lost, nothing duplicated, nothing stuck.
//!
//! What the clients do after the crash: each database's processor settles
//! the processes it knows (their start was answered) and has not settled:
//! a late commit if its own transaction committed, a rollback otherwise;
//! then it processes what its queue offers until it is idle. Each device
//! first sends again the keyed uploads it had sent and not seen answered
//! (their answer lost with the crash); then, once the server keeps nothing
//! scheduled (the replies scheduled before the cut are due by now), it
//! reads its inbox, and sends the keyed uploads it had acknowledged again
//! (as after a lost answer).
//!
//! - **Lost**: a database's or a device's token unknown; an acknowledged
//!   upload (or one sent again after the crash) never processed by its
//!   database; the commit of a process whose
//!   transaction committed not answered OK; a reply of such a process that
//!   never reached its device.
//! - **Duplicated**: a message offered again after it was processed; an
//!   upload's nonce offered under two ids (or under another id than its
//!   answer gave); a reply delivered twice (two ids), or again after its
//!   acknowledgement was answered; an acknowledged upload's key giving a
//!   new message.
//! - **Wrong**: a reply of a process whose transaction did not commit.
//! - **Stuck**: a server that does not start or answer, files left in
//!   `Messages`, `Prepared` or `Unknown` of a database or in `Prepared` or
//!   `Unknown` of a device, a queue never idle, replies still scheduled
//!   after [`SCHEDULED_BOUND`](workload::SCHEDULED_BOUND).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use estafeta_client::Client;
use estafeta_wire::{CallStatus, Folder, MessageId, ProcessId, StartRequest, StartStatus};
use tokio::process::{Child, Command};

use crate::workload::{self, Ack, DATABASES, DEVICES, Journal};

/// The admin token every server of a run gets.
pub(crate) const ADMIN_TOKEN: &str = "powerloss-admin-token-0123456789abcdef";

/// How long a server may take to answer `/readyz`.
const READY_BOUND: Duration = Duration::from_secs(30);

/// How long the processors' recovery may take before the queue counts as
/// stuck.
const QUEUE_BOUND: Duration = Duration::from_secs(20);

/// The process timeouts of a server: the recorded one lets the workload's
/// processes live while strace slows it (STARTED) and puts the in-doubt
/// one in doubt soon (READY_TO_COMMIT); the checked ones time out
/// whatever a crash left started.
pub(crate) enum Timeouts {
    Recorded,
    Checked,
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
        timeouts: Timeouts,
    ) -> anyhow::Result<Server> {
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ESTAFETA_") {
                cmd.env_remove(key);
            }
        }
        let started = match timeouts {
            Timeouts::Recorded => "60s",
            Timeouts::Checked => "2s",
        };
        let log = std::fs::File::create(log)?;
        cmd.env("ESTAFETA_DATA_DIR", data)
            .env("ESTAFETA_LISTEN", format!("127.0.0.1:{port}"))
            .env("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("ESTAFETA_STARTED_TIMEOUT", started)
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

/// Starts the real server on the crash state in `state` (its `data`
/// folder), lets the clients recover as they would after the crash, and
/// checks what was acknowledged before `until`; the violations found.
pub(crate) async fn check_state(
    binary: &Path,
    state: &Path,
    journal: &Journal,
    until: f64,
    port: u16,
) -> anyhow::Result<Vec<String>> {
    let mut cmd = Command::new(binary);
    cmd.arg("serve").current_dir(state);
    let log = state.join("server.log");
    let server = match Server::start(cmd, &state.join("data"), port, &log, Timeouts::Checked).await
    {
        Ok(server) => server,
        Err(e) => return Ok(vec![format!("stuck: {e:#}; {}", last_line(&log))]),
    };
    let found = checks(&server.admin, journal, until).await;
    server.kill().await?;
    found
}

fn last_line(log: &Path) -> String {
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

/// What the clients had acknowledged before the cut, gathered.
#[derive(Default)]
struct Before {
    /// Acknowledged uploads: (device, database, nonce) → id, and whether
    /// the nonce is its idempotency key.
    uploads: BTreeMap<(usize, usize, String), (MessageId, bool)>,
    /// Keyed uploads sent and not answered before the cut: (device,
    /// database, nonce and key). Their device sends them again.
    in_flight: BTreeSet<(usize, usize, String)>,
    /// Processes whose start was answered, by database: their messages.
    started: BTreeMap<ProcessId, (usize, Vec<MessageId>)>,
    committed: BTreeSet<ProcessId>,
    settled: BTreeSet<ProcessId>,
    /// Replies each device read, and those whose acknowledgement was
    /// answered.
    received: BTreeMap<usize, BTreeSet<MessageId>>,
    acknowledged: BTreeSet<MessageId>,
}

impl Before {
    fn of(journal: &Journal, until: f64) -> Before {
        let mut b = Before::default();
        for ack in journal.before(until) {
            match ack {
                Ack::Provisioned => {}
                Ack::Sending {
                    device,
                    db,
                    key,
                    keyed,
                } => {
                    if *keyed {
                        b.in_flight.insert((*device, *db, key.clone()));
                    }
                }
                Ack::Upload {
                    device,
                    db,
                    key,
                    keyed,
                    id,
                } => {
                    b.in_flight.remove(&(*device, *db, key.clone()));
                    b.uploads.insert((*device, *db, key.clone()), (*id, *keyed));
                }
                Ack::Started { db, pid, messages } => {
                    b.started.insert(*pid, (*db, messages.clone()));
                }
                Ack::LocalCommit { pid } => {
                    b.committed.insert(*pid);
                }
                Ack::Settled { pid } => {
                    b.settled.insert(*pid);
                }
                Ack::Received { device, replies } => {
                    b.received.entry(*device).or_default().extend(replies);
                }
                Ack::Acknowledged { replies, .. } => b.acknowledged.extend(replies),
            }
        }
        b
    }
}

async fn checks(admin: &Client, journal: &Journal, until: f64) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    if !journal.before(until).any(|a| matches!(a, Ack::Provisioned)) {
        return Ok(found);
    }
    let b = Before::of(journal, until);
    let dbs: Vec<Client> = journal
        .db_tokens
        .iter()
        .map(|t| admin.with_token(t))
        .collect();
    let devices: Vec<Client> = journal
        .device_tokens
        .iter()
        .map(|t| admin.with_token(t))
        .collect();
    for (i, device) in devices.iter().enumerate() {
        if let Err(e) = device.inbox(Some(1)).await {
            found.push(format!("lost: the device {} ({e})", DEVICES[i]));
        }
    }
    if !found.is_empty() {
        return Ok(found);
    }
    let mut applied: Vec<BTreeSet<MessageId>> = vec![BTreeSet::new(); DATABASES.len()];
    for (pid, (db, messages)) in &b.started {
        if b.settled.contains(pid) {
            if b.committed.contains(pid) {
                applied[*db].extend(messages);
            }
            continue;
        }
        if b.committed.contains(pid) {
            applied[*db].extend(messages);
            let answer = settle(&dbs[*db], pid, true).await;
            if !matches!(answer, Ok(CallStatus::Ok)) {
                found.push(format!(
                    "lost: {pid}, whose transaction committed: its late commit answered {answer:?}"
                ));
            }
        } else if let Err(e) = settle(&dbs[*db], pid, false).await {
            found.push(format!("stuck: {pid}: its rollback answered {e}"));
        }
    }
    // A device sends again the keyed uploads whose answers the crash
    // lost: the server must answer each, and it must then be processed.
    let mut resent = BTreeMap::new();
    for (device, db, key) in &b.in_flight {
        match workload::upload_again(&devices[*device], &DATABASES[*db].parse()?, key).await {
            Ok(id) => {
                resent.insert((*device, *db, key.clone()), (id, true));
            }
            Err(e) => found.push(format!(
                "stuck: {}'s unanswered upload {key} sent again answered {e:#}",
                DEVICES[*device]
            )),
        }
    }
    // Then each processor processes whatever its queue offers until idle
    // (its own starts included): each upload's nonce under one id, the
    // one its answer gave if it had one.
    let mut nonces: BTreeMap<String, MessageId> = (b.uploads.iter().chain(&resent))
        .map(|((_, _, key), (id, _))| (key.clone(), *id))
        .collect();
    for (i, db) in dbs.iter().enumerate() {
        let queue: estafeta_wire::Id = DATABASES[i].parse()?;
        let began = Instant::now();
        loop {
            if began.elapsed() > QUEUE_BOUND {
                found.push(format!("stuck: {queue}'s queue never became idle"));
                break;
            }
            let started = match db.start(&StartRequest::new(queue.clone())).await {
                Ok(s) => s,
                Err(e) if e.status() == Some(reqwest::StatusCode::UNAUTHORIZED) => {
                    found.push(format!("lost: the database {queue} ({e})"));
                    break;
                }
                Err(e) => {
                    found.push(format!("stuck: {queue}: start answered {e}"));
                    break;
                }
            };
            match started.status {
                StartStatus::Idle => break,
                StartStatus::Busy => {
                    // A process the processor never heard of (a start not
                    // answered before the cut): its STARTED timeout ends it.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                StartStatus::Ok => {
                    let pid = started.process_id.context("no process id")?;
                    let messages = started.messages.unwrap_or_default();
                    for m in &messages {
                        let Some(nonce) = workload::nonce_of(m.body.get()) else {
                            continue;
                        };
                        let first = *nonces.entry(nonce.clone()).or_insert(m.id);
                        if first != m.id {
                            found.push(format!(
                                "duplicated: the upload {nonce} offered as {} besides {first}",
                                m.id
                            ));
                        }
                    }
                    let ids: Vec<MessageId> = messages.into_iter().map(|m| m.id).collect();
                    for id in &ids {
                        if !applied[i].insert(*id) {
                            found.push(format!(
                                "duplicated: {queue} offered {id} again after it was processed"
                            ));
                        }
                    }
                    let request = workload::prepare(&ids, Vec::new());
                    let done = match db.prepare(&pid, &request).await {
                        Ok(_) => db.commit(&pid).await.map(drop),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = done {
                        found.push(format!("stuck: {queue}: processing {ids:?} answered {e}"));
                        break;
                    }
                }
            }
        }
    }
    for ((device, db, key), (id, _)) in b.uploads.iter().chain(&resent) {
        if !applied[*db].contains(id) {
            found.push(format!(
                "lost: {}'s acknowledged upload {key} to {} ({id}) never processed",
                DEVICES[*device], DATABASES[*db]
            ));
        }
    }
    for db in DATABASES {
        let db: estafeta_wire::Id = db.parse()?;
        for folder in [Folder::Messages, Folder::Prepared, Folder::Unknown] {
            left(admin, &db, folder, &mut found).await;
        }
    }
    for dev in DEVICES {
        let dev: estafeta_wire::Id = dev.parse()?;
        for folder in [Folder::Prepared, Folder::Unknown] {
            left(admin, &dev, folder, &mut found).await;
        }
    }
    // The replies scheduled before the cut are delivered, due by now.
    match workload::delivered(admin).await {
        Ok(true) => {}
        Ok(false) => found.push(format!(
            "stuck: replies still scheduled after {:?}",
            workload::SCHEDULED_BOUND
        )),
        Err(e) => found.push(format!("stuck: the scheduled count not read: {e:#}")),
    }
    replies(journal, &b, &devices, &mut found).await;
    // The idempotency keys of acknowledged uploads are still known.
    for ((device, db, key), (id, _)) in b.uploads.iter().filter(|(_, (_, keyed))| *keyed) {
        match workload::upload_again(&devices[*device], &DATABASES[*db].parse()?, key).await {
            Ok(again) if again == *id => {}
            Ok(again) => found.push(format!(
                "duplicated: {}'s upload {key} sent again became {again}, not {id} (its key lost)",
                DEVICES[*device]
            )),
            Err(e) => found.push(format!(
                "stuck: {}'s upload {key} sent again answered {e:#}",
                DEVICES[*device]
            )),
        }
    }
    Ok(found)
}

/// Files left in a folder count as stuck (as does a folder not listed).
async fn left(
    admin: &Client,
    mailbox: &estafeta_wire::Id,
    folder: Folder,
    found: &mut Vec<String>,
) {
    match admin.folder(mailbox, folder).await {
        Ok(l) if l.files.is_empty() => {}
        Ok(l) => found.push(format!(
            "stuck: {} file(s) left in {mailbox}/{folder}",
            l.files.len()
        )),
        Err(e) => found.push(format!("stuck: {mailbox}/{folder} not listed: {e}")),
    }
}

/// A late commit (`commit`) or a rollback of `pid`, FAILED answers tried
/// again a few times (their moves are retried); the last status.
async fn settle(db: &Client, pid: &ProcessId, commit: bool) -> anyhow::Result<CallStatus> {
    let mut status = CallStatus::Failed;
    for _ in 0..5 {
        status = if commit {
            db.commit(pid).await?.status
        } else {
            db.rollback(pid, "the processor's transaction did not commit")
                .await?
                .status
        };
        if status != CallStatus::Failed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(status)
}

/// Each reply of a committed process at its device once; none of another.
async fn replies(journal: &Journal, b: &Before, devices: &[Client], found: &mut Vec<String>) {
    let tag = |pid: &ProcessId| journal.tags.iter().find(|(p, _)| p == pid).map(|(_, t)| *t);
    // Who sent each acknowledged upload.
    let senders: HashMap<MessageId, usize> = b
        .uploads
        .iter()
        .map(|((device, _, _), (id, _))| (*id, *device))
        .collect();
    // What must arrive: (tag, message) of committed processes, at the
    // device that sent the message (when its upload was acknowledged).
    let mut expected: BTreeMap<(String, String), Option<usize>> = BTreeMap::new();
    let mut committed_tags = BTreeSet::new();
    for pid in &b.committed {
        let (Some(t), Some((_, messages))) = (tag(pid), b.started.get(pid)) else {
            continue;
        };
        committed_tags.insert(t.to_owned());
        for m in messages {
            expected.insert((t.to_owned(), m.to_string()), senders.get(m).copied());
        }
    }
    // What the devices hold: what they read before the cut, and their
    // inbox now. The replies read before are known by id; their bodies
    // are in the recorded run's inbox reads only, so they are identified
    // through the inbox now or the journal's tags.
    let mut seen: BTreeMap<(String, String), BTreeSet<MessageId>> = BTreeMap::new();
    for (device, client) in devices.iter().enumerate() {
        let inbox = match client.inbox(None).await {
            Ok(inbox) => inbox,
            Err(e) => {
                found.push(format!("stuck: {}'s inbox not read: {e}", DEVICES[device]));
                continue;
            }
        };
        for m in &inbox.messages {
            let Some(key) = workload::reply_of(m.body.get()) else {
                found.push(format!(
                    "wrong: {} got {} which is no reply: {}",
                    DEVICES[device],
                    m.id,
                    m.body.get()
                ));
                continue;
            };
            if b.acknowledged.contains(&m.id) {
                found.push(format!(
                    "duplicated: {} got {} again after its acknowledgement was answered",
                    DEVICES[device], m.id
                ));
            }
            if !committed_tags.contains(&key.0) {
                found.push(format!(
                    "wrong: {} got {} of the {} process, whose transaction did not commit",
                    DEVICES[device], m.id, key.0
                ));
                continue;
            }
            if let Some(Some(sender)) = expected.get(&key)
                && *sender != device
            {
                found.push(format!(
                    "wrong: {} got the reply to {}, which {} sent",
                    DEVICES[device], key.1, DEVICES[*sender]
                ));
            }
            seen.entry(key).or_default().insert(m.id);
        }
    }
    // Replies read before the cut, by id: the recorded run's replies.
    for ids in b.received.values() {
        for id in ids {
            if let Some(key) = journal.replies.get(id).cloned() {
                seen.entry(key).or_default().insert(*id);
            }
        }
    }
    for (key, ids) in &seen {
        if ids.len() > 1 {
            found.push(format!(
                "duplicated: the reply of the {} process to {} delivered as {ids:?}",
                key.0, key.1
            ));
        }
    }
    for key in expected.keys() {
        if !seen.contains_key(key) {
            found.push(format!(
                "lost: the reply of the {} process to {}",
                key.0, key.1
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use estafeta_wire::UlidGenerator;
    use std::time::SystemTime;

    fn journal() -> (Journal, ProcessId, MessageId) {
        let ids = UlidGenerator::new();
        let pid = ids.process_id(SystemTime::now());
        let m = ids.message_id(SystemTime::now());
        let j = Journal {
            acks: vec![
                (1.0, Ack::Provisioned),
                (
                    2.0,
                    Ack::Upload {
                        device: 0,
                        db: 0,
                        key: "key-0".into(),
                        keyed: true,
                        id: m,
                    },
                ),
                (
                    3.0,
                    Ack::Started {
                        db: 0,
                        pid,
                        messages: vec![m],
                    },
                ),
                (4.0, Ack::LocalCommit { pid }),
                (5.0, Ack::Settled { pid }),
            ],
            ..Journal::default()
        };
        (j, pid, m)
    }

    #[test]
    fn what_was_acknowledged_before_the_cut_is_what_counts() {
        let (j, pid, m) = journal();
        let b = Before::of(&j, 3.5);
        assert_eq!(b.uploads.len(), 1);
        assert!(b.started.contains_key(&pid));
        assert!(
            !b.committed.contains(&pid),
            "committed at 4.0, after the cut"
        );
        let b = Before::of(&j, 4.5);
        assert!(b.committed.contains(&pid) && !b.settled.contains(&pid));
        assert_eq!(b.started[&pid].1, vec![m]);
        assert_ne!(j.signature(3.5), j.signature(4.5));
        assert_eq!(j.signature(4.2), j.signature(4.5));
    }

    /// A keyed upload sent before the cut is in flight (its device sends
    /// it again) until its answer came before the cut; an unkeyed one
    /// never is.
    #[test]
    fn a_keyed_upload_sent_and_not_answered_before_the_cut_is_sent_again() {
        let m = UlidGenerator::new().message_id(SystemTime::now());
        let sending = |key: &str, keyed| Ack::Sending {
            device: 0,
            db: 1,
            key: key.into(),
            keyed,
        };
        let j = Journal {
            acks: vec![
                (1.0, Ack::Provisioned),
                (2.0, sending("key-0", true)),
                (
                    3.0,
                    Ack::Upload {
                        device: 0,
                        db: 1,
                        key: "key-0".into(),
                        keyed: true,
                        id: m,
                    },
                ),
                (4.0, sending("key-1", false)),
            ],
            ..Journal::default()
        };
        let in_flight = |until| Vec::from_iter(Before::of(&j, until).in_flight);
        assert_eq!(in_flight(1.5), vec![]);
        assert_eq!(in_flight(2.5), vec![(0, 1, "key-0".to_owned())]);
        assert_eq!(in_flight(3.5), vec![]);
        assert_eq!(
            in_flight(4.5),
            vec![],
            "an unkeyed upload is not sent again"
        );
        assert_eq!(
            workload::nonce_of(r#"{"key":"key-0"}"#).as_deref(),
            Some("key-0")
        );
    }

    #[test]
    fn a_reply_names_its_process_and_message() {
        let m = UlidGenerator::new().message_id(SystemTime::now());
        let body = workload::reply_body("committed", &m);
        assert_eq!(
            workload::reply_of(&body),
            Some(("committed".to_owned(), m.to_string()))
        );
        assert_eq!(workload::reply_of(r#"{"key":"k"}"#), None);
    }
}
