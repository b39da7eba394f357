//! The workload run under the recorder, and its journal: what each client
//! had acknowledged, and when (on strace's clock, the wall clock), so that
//! a crash state is checked against what was acknowledged before its cut.
//!
//! Two databases and two devices. Uploads, `dev-0`'s with idempotency keys
//! (a file that appears once its key is saved) and `dev-1`'s without (a file
//! published at once, into a spare whose name is durable), each with a
//! nonce in its body; a keyed one sent again as after a lost answer; then on `db-0` a process committed
//! (its replies delivered), on `db-1` one rolled back, more uploads, on
//! `db-1` one left READY_TO_COMMIT past the server's timeout (in doubt)
//! and then committed late; every second reply of each process is
//! scheduled ([`SCHEDULED_AFTER`]), so that the scheduler's store and its
//! deliveries are in the cuts; once nothing is scheduled any more, the
//! devices read and acknowledge their replies; more uploads.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use estafeta_client::Client;
use estafeta_wire::{
    Body, CallStatus, Id, MessageId, MessageResult, PrepareRequest, ProcessId, ProcessState, Reply,
    ResultStatus, SendMessage, StartRequest, StartStatus, Timestamp, Upload, Version,
};

/// The databases and devices of the workload.
pub(crate) const DATABASES: [&str; 2] = ["db-0", "db-1"];
pub(crate) const DEVICES: [&str; 2] = ["dev-0", "dev-1"];

/// How long the workload waits for its process to be put in doubt.
const DOUBT_BOUND: Duration = Duration::from_secs(30);

/// How far ahead a scheduled reply is due (`deliver_at`).
const SCHEDULED_AFTER: Duration = Duration::from_secs(2);

/// How long the scheduled replies may take to be delivered, in the
/// recorded run and at each check.
pub(crate) const SCHEDULED_BOUND: Duration = Duration::from_secs(30);

/// Seconds since the epoch, as strace's `-ttt` prints them.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Something a client had acknowledged.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Ack {
    /// The databases and devices exist.
    Provisioned,
    /// An upload about to be sent: its answer may be lost at a cut, and a
    /// device sends a keyed one again then (`key` as in [`Ack::Upload`]).
    Sending {
        device: usize,
        db: usize,
        key: String,
        keyed: bool,
    },
    /// An upload answered 201 (or 200 for its key) with this id; `key`
    /// is the nonce in its body, and its idempotency key if `keyed`.
    Upload {
        device: usize,
        db: usize,
        key: String,
        keyed: bool,
        id: MessageId,
    },
    /// A start answered OK: the processor knows the process.
    Started {
        db: usize,
        pid: ProcessId,
        messages: Vec<MessageId>,
    },
    /// The processor's own transaction committed (after its prepare was
    /// answered OK): it commits on the server, again after a crash.
    LocalCommit { pid: ProcessId },
    /// Commit or rollback answered OK: the processor forgot the process.
    Settled { pid: ProcessId },
    /// A device read these replies from its inbox.
    Received {
        device: usize,
        replies: Vec<MessageId>,
    },
    /// The server answered a device's acknowledgement of these replies.
    Acknowledged {
        device: usize,
        replies: Vec<MessageId>,
    },
}

/// Everything the workload had acknowledged, with when.
#[derive(Clone, Debug, Default)]
pub(crate) struct Journal {
    pub(crate) acks: Vec<(f64, Ack)>,
    pub(crate) db_tokens: Vec<String>,
    pub(crate) device_tokens: Vec<String>,
    /// Each workload process's tag (in its replies' bodies).
    pub(crate) tags: Vec<(ProcessId, &'static str)>,
    /// The replies the devices read: their process's tag and the message
    /// each answers, by reply id.
    pub(crate) replies: HashMap<MessageId, (String, String)>,
}

impl Journal {
    fn ack(&mut self, ack: Ack) {
        self.acks.push((now(), ack));
    }

    /// What was acknowledged before `until`.
    pub(crate) fn before(&self, until: f64) -> impl Iterator<Item = &Ack> {
        self.acks
            .iter()
            .filter(move |(t, _)| *t < until)
            .map(|(_, a)| a)
    }

    /// What was acknowledged before `until`, as one comparable value (the
    /// same crash state with the same value is checked once).
    pub(crate) fn signature(&self, until: f64) -> Vec<bool> {
        self.acks.iter().map(|(t, _)| *t < until).collect()
    }

    /// How many acknowledgements the workload got.
    pub(crate) fn count(&self) -> usize {
        self.acks.len()
    }
}

fn id(s: &str) -> anyhow::Result<Id> {
    Ok(s.parse()?)
}

/// An upload to `to` with the nonce `key` in its body ([`nonce_of`]), and
/// as its idempotency key if `keyed`.
fn upload(to: &Id, key: &str, keyed: bool) -> anyhow::Result<SendMessage> {
    let body = Body::from_json(format!(r#"{{"key":"{key}"}}"#))?;
    let upload = SendMessage::new(to.clone(), body);
    Ok(if keyed { upload.with_key(key) } else { upload })
}

/// The same upload again, as a device whose answer was lost sends it:
/// 200 with the same id.
pub(crate) async fn upload_again(device: &Client, to: &Id, key: &str) -> anyhow::Result<MessageId> {
    Ok(device.send(&upload(to, key, true)?).await?.accepted.id)
}

/// Every message PROCESSED, with `replies`.
pub(crate) fn prepare(messages: &[MessageId], replies: Vec<Reply>) -> PrepareRequest {
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

/// The reply body of message `re` in the process tagged `tag`.
pub(crate) fn reply_body(tag: &str, re: &MessageId) -> String {
    format!(r#"{{"reply":"{tag}","re":"{re}"}}"#)
}

/// The nonce in an upload's body (see [`upload`]).
pub(crate) fn nonce_of(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(v.get("key")?.as_str()?.to_owned())
}

/// A reply's identity, from its body: the tag of its process and the
/// message it answers.
pub(crate) fn reply_of(body: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    Some((
        v.get("reply")?.as_str()?.to_owned(),
        v.get("re")?.as_str()?.to_owned(),
    ))
}

/// The workload's clients.
struct Clients {
    dbs: Vec<Client>,
    devices: Vec<Client>,
}

/// Runs the workload against the server `admin` reaches; `uploads` per
/// batch of uploads (three batches).
pub(crate) async fn run(admin: &Client, uploads: usize) -> anyhow::Result<Journal> {
    let mut j = Journal::default();
    let ent = id("powerloss")?;
    let sales = id("sales")?;
    admin.create_enterprise(&ent).await?;
    admin.create_subsystem(&ent, &sales).await?;
    for db in DATABASES {
        j.db_tokens
            .push(admin.create_database(&ent, &id(db)?).await?.token);
    }
    for dev in DEVICES {
        j.device_tokens
            .push(admin.create_device(&ent, &id(dev)?, &sales).await?.token);
    }
    j.ack(Ack::Provisioned);
    let c = Clients {
        dbs: j.db_tokens.iter().map(|t| admin.with_token(t)).collect(),
        devices: j
            .device_tokens
            .iter()
            .map(|t| admin.with_token(t))
            .collect(),
    };

    batch(&c, &mut j, 0, uploads).await?;
    // The first keyed upload again, as after a lost answer.
    if let Some((
        _,
        Ack::Upload {
            device,
            db,
            key,
            keyed,
            id: first,
        },
    )) = j
        .acks
        .iter()
        .find(|(_, a)| matches!(a, Ack::Upload { keyed: true, .. }))
        .cloned()
    {
        let again = upload_again(&c.devices[device], &id(DATABASES[db])?, &key).await?;
        if again != first {
            bail!("the upload {key} sent again became {again}, not {first}");
        }
        j.ack(Ack::Upload {
            device,
            db,
            key,
            keyed,
            id: again,
        });
    }
    process(&c, &mut j, 0, "committed", Outcome::Commit).await?;
    process(&c, &mut j, 1, "rolled-back", Outcome::Rollback).await?;
    batch(&c, &mut j, uploads, uploads).await?;
    process(&c, &mut j, 1, "in-doubt", Outcome::InDoubtThenCommit(admin)).await?;
    if !delivered(admin).await? {
        bail!("the scheduled replies were not delivered within {SCHEDULED_BOUND:?}");
    }
    for (device, client) in c.devices.iter().enumerate() {
        let inbox = client.inbox(None).await?;
        for m in &inbox.messages {
            let reply = reply_of(m.body.get()).context("a message in an inbox that is no reply")?;
            j.replies.insert(m.id, reply);
        }
        let replies: Vec<MessageId> = inbox.messages.iter().map(|m| m.id).collect();
        j.ack(Ack::Received {
            device,
            replies: replies.clone(),
        });
        if !replies.is_empty() {
            client.ack(&replies).await?;
            j.ack(Ack::Acknowledged { device, replies });
        }
    }
    batch(&c, &mut j, 2 * uploads, uploads).await?;
    Ok(j)
}

/// `n` uploads, numbered from `first`: the devices in turn, each to the
/// database [`database_of`] its own upload's number, `dev-0`'s keyed.
async fn batch(c: &Clients, j: &mut Journal, first: usize, n: usize) -> anyhow::Result<()> {
    for i in first..first + n {
        let device = i % DEVICES.len();
        let db = database_of(device, i / DEVICES.len());
        let key = format!("key-{i}");
        let keyed = device == 0;
        j.ack(Ack::Sending {
            device,
            db,
            key: key.clone(),
            keyed,
        });
        let sent = c.devices[device]
            .send(&upload(&id(DATABASES[db])?, &key, keyed)?)
            .await?;
        if sent.upload != Upload::Created {
            bail!("the new upload {key} was answered as a repeat");
        }
        j.ack(Ack::Upload {
            device,
            db,
            key,
            keyed,
            id: sent.accepted.id,
        });
    }
    Ok(())
}

/// The database of `device`'s `n`th upload. `dev-1` sends to each in
/// turn; `dev-0` sends the second of every four to `db-1` and the others
/// to `db-0` (its first two still go one to each). With `--uploads 22` or
/// more, `dev-0`'s record hands its 32 keys to the key store at its 33rd
/// keyed upload. Were they sent to each database in turn, that would be
/// its 17th write into each queue, just after a refill of the queue's
/// spares fsynced the folder, and no rename would be left for the settle
/// before the hand-over to make durable; this way renames of acknowledged
/// uploads are still unsettled then.
fn database_of(device: usize, n: usize) -> usize {
    match device {
        0 => usize::from(n % 4 == 1),
        _ => n % DATABASES.len(),
    }
}

/// Waits until the server `admin` keeps nothing scheduled (its
/// `deliver_at` entries, from its metrics: when to look, not what
/// arrived); `false` if that took longer than [`SCHEDULED_BOUND`].
pub(crate) async fn delivered(admin: &Client) -> anyhow::Result<bool> {
    let began = Instant::now();
    loop {
        let scheduled = admin
            .scheduled_messages()
            .await?
            .context("the server's metrics give no scheduled count")?;
        if scheduled == 0 {
            return Ok(true);
        }
        if began.elapsed() > SCHEDULED_BOUND {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How a workload process ends.
enum Outcome<'a> {
    Commit,
    Rollback,
    /// Left READY_TO_COMMIT until the server (`admin` reaches it) puts it
    /// in doubt, then committed late.
    InDoubtThenCommit(&'a Client),
}

/// One process on database `db`: every message PROCESSED with a reply to
/// its sender, then as `outcome` says.
async fn process(
    c: &Clients,
    j: &mut Journal,
    db: usize,
    tag: &'static str,
    outcome: Outcome<'_>,
) -> anyhow::Result<()> {
    let processor = &c.dbs[db];
    let started = processor
        .start(&StartRequest::new(id(DATABASES[db])?))
        .await?;
    if started.status != StartStatus::Ok {
        bail!("the {tag} process's start answered {:?}", started.status);
    }
    let pid = started.process_id.context("no process id")?;
    let messages = started.messages.unwrap_or_default();
    j.tags.push((pid, tag));
    j.ack(Ack::Started {
        db,
        pid,
        messages: messages.iter().map(|m| m.id).collect(),
    });
    let later = Timestamp::from_system_time(SystemTime::now() + SCHEDULED_AFTER);
    let replies = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            Ok(Reply {
                to: m.from.clone(),
                body: Body::from_json(reply_body(tag, &m.id))?,
                created_at: None,
                deliver_at: (i % 2 == 1).then_some(later),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
    let prepared = processor.prepare(&pid, &prepare(&ids, replies)).await?;
    if prepared.status != CallStatus::Ok {
        bail!("the {tag} process's prepare answered {:?}", prepared.status);
    }
    let answer = match outcome {
        Outcome::Commit => {
            j.ack(Ack::LocalCommit { pid });
            processor.commit(&pid).await?
        }
        Outcome::Rollback => {
            processor
                .rollback(&pid, "the processor's transaction rolled back")
                .await?
        }
        Outcome::InDoubtThenCommit(admin) => {
            j.ack(Ack::LocalCommit { pid });
            let began = Instant::now();
            loop {
                let list = admin.processes().await?;
                let state = list
                    .processes
                    .iter()
                    .find(|p| p.process_id == pid)
                    .map(|p| p.state);
                if state == Some(ProcessState::InDoubt) {
                    break;
                }
                if began.elapsed() > DOUBT_BOUND {
                    bail!("the {tag} process was not put in doubt ({state:?})");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            processor.commit(&pid).await?
        }
    };
    if answer.status != CallStatus::Ok {
        bail!("the {tag} process's end answered {:?}", answer.status);
    }
    j.ack(Ack::Settled { pid });
    Ok(())
}
