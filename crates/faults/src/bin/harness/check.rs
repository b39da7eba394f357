//! The judge of a run, after the drain: it counts from the clients' side,
//! per database and per device.
//!
//! The devices recorded every upload request (each with a nonce of its own
//! in its body, byte for byte) and every acknowledgement; each processor's
//! database holds every message it applied or found incorrect, as the
//! server handed it out. From those alone:
//!
//! - each acknowledged upload was processed exactly once (applied, or found
//!   incorrect), by the database it was sent to, under the id the server
//!   acknowledged, with the body of one of its requests and its device as
//!   the sender; otherwise it is **lost**, or **duplicated** when it became
//!   two messages;
//! - no request was processed twice (**duplicated**), and nothing was
//!   processed that no device sent or that went to another database
//!   (**wrong**);
//! - every processed message's reply reached the device that sent it,
//!   exactly once, saying what its processor decided: none is **lost**,
//!   two are **duplicated**, one at another device or for a message no
//!   processor kept is **wrong**.
//!
//! The server's folders must agree: each database's `Log` holds exactly the
//! messages its processor applied and its `Error` exactly those it found
//! incorrect (the run's only cause of `Error`). As **stuck**: anything in
//! `Messages`, `Prepared` or `Unknown` of any mailbox, a process live or in
//! doubt, a process a processor still has to settle, an upload never
//! acknowledged, a server that does not answer, a start slower than the
//! bound. Every in-doubt episode the harness caused (a processor stopped
//! after its prepare, then the server killed before the commit could come)
//! must have its alert, `in_doubt:<process>`, as must every episode the
//! databases' counters record; an exit of the server or of a processor
//! the harness did not cause fails the run (its log's tail was printed
//! when it happened), as does an answer with a server error other than
//! 503.
//!
//! No alert may be left open (`/v1/admin/alerts`, no `ended_at`) that the
//! final state does not justify (**unjustified alerts**). The server closes
//! an alert when its condition ends; each kind is justified at the end
//! only while its condition visibly holds:
//!
//! - `in_doubt:<process>`: the process is still in doubt (and so stuck);
//!   a settled one's alert is closed by its settlement;
//! - `failed:<process>`: the process has not ended (its moves are still
//!   retried); moves that succeed close it;
//! - `orphans:<database>`: the database's `Unknown` still holds files (the
//!   orphans it moved there wait for an operator; stuck too);
//! - `disk_low:data`: a data folder's file system has less free space than
//!   the threshold the harness gives the server ([`DISK_ALERT_MB`]);
//! - `storage_write:data`: never: the drain runs with every storage fault
//!   off, and a write that succeeds closes it;
//! - `host_down:<host>`, `missing_file:<file>`: never: the harness
//!   configures no outbound host, and removes no file behind the server;
//! - a kind this judge does not know: never (the harness's build fails on
//!   a new kind of the exchange until it has a rule here).
//!
//! Closing goes through the server's alert recorder, which retries a
//! close its store did not take (at most [`MAX_RETRY`] apart), and the
//! disk is looked at every second: the judge reads the alerts again until
//! none is unjustified, for at most [`ALERT_SETTLE`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use estafeta_client::Client;
use estafeta_exchange::AlertKind;
use estafeta_sim::{Attempt, Device, Kept, Processor};
use estafeta_wire::{AlertEntry, AlertList, Folder, Id, MessageId, ProcessId, ProcessState};

use crate::faults::Faults;
use crate::server::{DISK_ALERT_MB, READY_BOUND, Server};

/// The longest pause of the server's alert recorder between two tries of
/// an alert's close its store did not take (`notify::record::MAX_RETRY`).
const MAX_RETRY: Duration = Duration::from_secs(10);

/// How long the judge waits for open alerts to be closed: a close retried
/// by the recorder, and the disk's next look.
const ALERT_SETTLE: Duration = MAX_RETRY.saturating_add(Duration::from_secs(5));

/// What the run did and what the checks found.
#[derive(Debug)]
pub(crate) struct Summary {
    faults: Faults,
    network_faults: u64,
    /// Faults fired between the nodes and PostgreSQL.
    db_faults: u64,
    /// Uploads acknowledged.
    messages: usize,
    lost: usize,
    duplicated: usize,
    /// Processed or delivered where it was not sent, or changed on the way.
    wrong: usize,
    stuck: usize,
    /// Replies received that their processor scheduled (`deliver_at`):
    /// how much of the run went through the scheduler.
    scheduled_replies: usize,
    max_ready: Duration,
    /// Answers with a server error other than 503 (storage out of reach,
    /// not ready, stopping: retry later), which are never right.
    server_errors: u64,
    /// In-doubt episodes the databases' durable counters record.
    in_doubt: u64,
    /// Distinct processes an in-doubt alert was raised for.
    in_doubt_alerts: u64,
    /// In-doubt episodes the harness caused whose alert is missing.
    unalerted: usize,
    /// Alerts left open that nothing in the final state justifies.
    unjustified_alerts: usize,
}

impl Summary {
    /// The one summary line.
    pub(crate) fn line(&self) -> String {
        let f = &self.faults;
        format!(
            "rounds={} server_crashes={} processor_crashes={} network_faults={} db_faults={} \
             commit_losses={} failpoint_pauses={} disk_full={} messages={} lost={} duplicated={} \
             wrong={} stuck={} unjustified_alerts={} scheduled_replies={}",
            f.rounds,
            f.server_crashes,
            f.processor_crashes,
            self.network_faults,
            self.db_faults,
            f.commits_lost.values().sum::<u64>(),
            f.failpoint_pauses.values().sum::<u64>(),
            f.disk_full,
            self.messages,
            self.lost,
            self.duplicated,
            self.wrong,
            self.stuck,
            self.unjustified_alerts,
            self.scheduled_replies,
        )
    }

    /// What the summary line does not carry.
    pub(crate) fn details(&self) -> String {
        fn each<K: std::fmt::Display>(counts: &BTreeMap<K, u64>) -> String {
            let each: Vec<String> = counts.iter().map(|(k, n)| format!("{k}:{n}")).collect();
            each.join(" ")
        }
        let skew = match self.faults.skew_warnings {
            Some(n) => format!(" skew_warnings={n}"),
            None => String::new(),
        };
        format!(
            "pauses={} failovers={} db_episodes={} server_deaths={} processor_deaths={} \
             server_errors={} max_ready_ms={} \
             in_doubt={} in_doubt_alerts={} in_doubt_caused={} in_doubt_caused_unalerted={} \
             failpoint_crashes={} [{}] failpoint_pauses=[{}] commit_losses=[{}]{skew}",
            self.faults.pauses,
            self.faults.failovers,
            self.faults.db_episodes,
            self.faults.unexpected_exits,
            self.faults.processor_exits,
            self.server_errors,
            self.max_ready.as_millis(),
            self.in_doubt,
            self.in_doubt_alerts,
            self.faults.withheld.len(),
            self.unalerted,
            self.faults.failpoint_crashes.values().sum::<u64>(),
            each(&self.faults.failpoint_crashes),
            each(&self.faults.failpoint_pauses),
            each(&self.faults.commits_lost),
        )
    }

    /// Nothing lost, duplicated, wrong or stuck, no server error but 503,
    /// no exit of the server or of a processor the harness did not cause,
    /// every in-doubt episode alerted, no alert left open unjustified, and
    /// a skewed node that said its clock is off.
    pub(crate) fn passed(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.wrong == 0
            && self.stuck == 0
            && self.server_errors == 0
            && self.faults.unexpected_exits == 0
            && self.faults.processor_exits == 0
            && self.unalerted == 0
            && self.in_doubt_alerts >= self.in_doubt
            && self.unjustified_alerts == 0
            && self.faults.skew_warnings != Some(0)
    }

    /// The run's faults, for an end of the server's found after the checks
    /// (at its final kill).
    pub(crate) fn faults_mut(&mut self) -> &mut Faults {
        &mut self.faults
    }
}

/// The violations found, by kind; each is printed as it is found.
#[derive(Debug, Default)]
struct Found {
    lost: usize,
    duplicated: usize,
    wrong: usize,
    stuck: usize,
}

impl Found {
    fn lost(&mut self, what: String) {
        eprintln!("lost: {what}");
        self.lost += 1;
    }
    fn duplicated(&mut self, what: String) {
        eprintln!("duplicated: {what}");
        self.duplicated += 1;
    }
    fn wrong(&mut self, what: String) {
        eprintln!("wrong: {what}");
        self.wrong += 1;
    }
    fn stuck(&mut self, what: String) {
        eprintln!("stuck: {what}");
        self.stuck += 1;
    }
}

/// A message a processor kept, with the request it came from.
struct Handled<'a> {
    db: &'a Id,
    kept: Kept,
    /// Found incorrect (else applied).
    incorrect: bool,
    device: &'a Id,
    attempt: &'a Attempt,
}

/// The `nonce` field of a JSON body.
fn nonce(body: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    value.get("nonce")?.as_str().map(str::to_owned)
}

/// Checks the run's outcome from the devices' and processors' records and
/// the server's folders, processes and alerts (asked of the first of
/// `nodes`), its nodes' logs and the free space of their data folders.
pub(crate) async fn check(
    nodes: &[Server],
    processors: &[(Id, Processor)],
    devices: &[Device],
    faults: &Faults,
    network_faults: u64,
    db_faults: u64,
) -> anyhow::Result<Summary> {
    let admin = &nodes.first().context("a run without a server")?.admin;
    let mut found = Found::default();
    let mut end = Standing {
        disk_low: nodes.iter().any(|n| disk_low(n.data())),
        ..Standing::default()
    };

    // Every request the devices sent, by its nonce.
    let mut requests: HashMap<&str, (&Id, &Attempt)> = HashMap::new();
    for d in devices {
        for a in d.attempts() {
            if requests.insert(a.nonce.as_str(), (d.id(), a)).is_some() {
                anyhow::bail!("the nonce {} was sent twice", a.nonce);
            }
        }
    }

    // What each database's processor kept, traced to its request.
    let mut handled: Vec<Handled<'_>> = Vec::new();
    for (db, p) in processors {
        let rows = p.applied_rows()?.into_iter().map(|k| (k, false));
        let rows = rows.chain(p.incorrect_rows()?.into_iter().map(|k| (k, true)));
        for (kept, incorrect) in rows {
            let Some(&(device, attempt)) =
                nonce(&kept.body).as_deref().and_then(|n| requests.get(n))
            else {
                found.wrong(format!(
                    "{db} kept {} from {}, which no device sent: {}",
                    kept.id, kept.sender, kept.body
                ));
                continue;
            };
            if attempt.to != *db {
                found.wrong(format!(
                    "{db} kept {}, which {device} sent to {}",
                    kept.id, attempt.to
                ));
            }
            if kept.sender != device.as_str() {
                found.wrong(format!(
                    "{db} kept {} as sent by {}; {device} sent it",
                    kept.id, kept.sender
                ));
            }
            if kept.body != attempt.body {
                found.wrong(format!(
                    "{db} kept {} with body {}; {device} sent {}",
                    kept.id, kept.body, attempt.body
                ));
            }
            handled.push(Handled {
                db,
                kept,
                incorrect,
                device,
                attempt,
            });
        }
        let dups = p.duplicates()?;
        for m in dups {
            found.duplicated(format!("{db}: {m} offered again after it was applied"));
        }
        let unsettled = p.unsettled()?;
        if unsettled > 0 {
            found.stuck(format!("{db}: {unsettled} processes not settled"));
        }
    }

    // No request processed twice; no message kept twice.
    let mut per_request: HashMap<&str, BTreeSet<MessageId>> = HashMap::new();
    let mut per_message: HashMap<MessageId, usize> = HashMap::new();
    for h in &handled {
        per_request
            .entry(h.attempt.nonce.as_str())
            .or_default()
            .insert(h.kept.id);
        *per_message.entry(h.kept.id).or_default() += 1;
    }
    for (nonce, ids) in &per_request {
        if ids.len() > 1 {
            found.duplicated(format!("request {nonce} became the messages {ids:?}"));
        }
    }
    for (id, n) in &per_message {
        if *n > 1 {
            found.duplicated(format!("{id} processed {n} times"));
        }
    }

    // Each acknowledged upload processed once, as acknowledged.
    let mut per_upload: HashMap<(&Id, &str), BTreeSet<MessageId>> = HashMap::new();
    for h in &handled {
        per_upload
            .entry((h.device, h.attempt.key.as_str()))
            .or_default()
            .insert(h.kept.id);
    }
    let mut messages = 0;
    for d in devices {
        for a in d.acknowledged() {
            messages += 1;
            let ids = per_upload.remove(&(d.id(), a.key.as_str()));
            match ids.as_ref().map(BTreeSet::len).unwrap_or(0) {
                0 => found.lost(format!(
                    "{}: upload {} to {}, acknowledged as {}, never processed",
                    d.id(),
                    a.key,
                    a.to,
                    a.id
                )),
                1 if ids.as_ref().is_some_and(|ids| ids.contains(&a.id)) => {}
                1 => found.lost(format!(
                    "{}: upload {} acknowledged as {}, processed as {:?}",
                    d.id(),
                    a.key,
                    a.id,
                    ids
                )),
                _ => found.duplicated(format!(
                    "{}: upload {} became the messages {:?}",
                    d.id(),
                    a.key,
                    ids
                )),
            }
        }
        if d.unsent() > 0 {
            found.stuck(format!("{}: {} uploads never accepted", d.id(), d.unsent()));
        }
    }
    // What was processed of an upload never acknowledged (its key still in
    // an outbox, stuck above) is one message at most.
    for ((device, key), ids) in per_upload {
        if ids.len() > 1 {
            found.duplicated(format!(
                "{device}: upload {key} became the messages {ids:?}"
            ));
        }
    }

    // Each processed message's reply at its device, once, as decided.
    let by_id: HashMap<MessageId, &Handled<'_>> = handled.iter().map(|h| (h.kept.id, h)).collect();
    let mut replies: HashMap<MessageId, usize> = HashMap::new();
    let mut scheduled_replies = 0;
    for d in devices {
        for m in d.received() {
            let body: serde_json::Value = serde_json::from_str(m.body.get()).unwrap_or_default();
            let re = body["re"]
                .as_str()
                .and_then(|s| s.parse::<MessageId>().ok());
            let Some(h) = re.and_then(|re| by_id.get(&re)) else {
                found.wrong(format!(
                    "{} got {} from {}, a reply to no message a processor kept: {}",
                    d.id(),
                    m.id,
                    m.from,
                    m.body.get()
                ));
                continue;
            };
            *replies.entry(h.kept.id).or_default() += 1;
            if body["scheduled"] == true {
                scheduled_replies += 1;
            }
            let verdict = if h.incorrect {
                "PROCESSED_INCORRECT"
            } else {
                "PROCESSED"
            };
            let as_decided = m.to == *d.id()
                && h.device == d.id()
                && m.from == *h.db
                && body["db"].as_str() == Some(h.db.as_str())
                && body["nonce"].as_str() == Some(h.attempt.nonce.as_str())
                && body["verdict"].as_str() == Some(verdict);
            if !as_decided {
                found.wrong(format!(
                    "{} got {} from {} for {}, which {} sent to {} ({verdict}): {}",
                    d.id(),
                    m.id,
                    m.from,
                    h.kept.id,
                    h.device,
                    h.db,
                    m.body.get()
                ));
            }
        }
    }
    for h in &handled {
        match replies.get(&h.kept.id).copied().unwrap_or(0) {
            1 => {}
            0 => found.lost(format!(
                "the reply to {} (from {} to {}) never reached {}",
                h.kept.id, h.device, h.db, h.device
            )),
            n => found.duplicated(format!("{n} replies to {} reached {}", h.kept.id, h.device)),
        }
    }

    // The server's folders agree; nothing is left half-way.
    for (db, _) in processors {
        let applied: BTreeSet<MessageId> = handled
            .iter()
            .filter(|h| h.db == db && !h.incorrect)
            .map(|h| h.kept.id)
            .collect();
        let incorrect: BTreeSet<MessageId> = handled
            .iter()
            .filter(|h| h.db == db && h.incorrect)
            .map(|h| h.kept.id)
            .collect();
        for (folder, want) in [(Folder::Log, &applied), (Folder::Error, &incorrect)] {
            let Some(listed) = listing(admin, db, folder, &mut found).await else {
                continue;
            };
            let listed: BTreeSet<MessageId> = listed.into_iter().collect();
            for m in listed.difference(want) {
                found.wrong(format!(
                    "{db}/{folder:?} holds {m}, which its processor did not put there"
                ));
            }
            for m in want.difference(&listed) {
                found.lost(format!(
                    "{db}/{folder:?} lacks {m}, which its processor put there"
                ));
            }
        }
    }
    let mailboxes = processors
        .iter()
        .map(|(db, _)| {
            (
                db,
                &[Folder::Messages, Folder::Prepared, Folder::Unknown][..],
            )
        })
        .chain(devices.iter().map(|d| {
            let all = &[
                Folder::Messages,
                Folder::Prepared,
                Folder::Unknown,
                Folder::Error,
            ][..];
            (d.id(), all)
        }));
    for (mailbox, folders) in mailboxes {
        for folder in folders {
            if let Some(left) = listing(admin, mailbox, *folder, &mut found).await
                && !left.is_empty()
            {
                found.stuck(format!(
                    "{mailbox}: {} files left in {folder:?}: {left:?}",
                    left.len()
                ));
                if *folder == Folder::Unknown {
                    end.unknown.insert(mailbox.clone());
                }
            }
        }
    }

    match admin.processes().await {
        Ok(list) => {
            for p in list.processes {
                if p.state.is_live() || p.state == ProcessState::InDoubt {
                    found.stuck(format!(
                        "process {} of {} left {:?}",
                        p.process_id, p.db_id, p.state
                    ));
                    end.unended.insert(p.process_id, p.state);
                }
            }
        }
        Err(e) => found.stuck(format!("the server did not list its processes: {e}")),
    }

    let max_ready = faults.ready_times.iter().copied().max().unwrap_or_default();
    if max_ready > READY_BOUND {
        found.stuck(format!("a start took {max_ready:?} of its own to be ready"));
    }

    let alerts = settled(admin, &end).await;
    let (in_doubt, in_doubt_alerts, unalerted) = match (admin.stats().await, &alerts) {
        (Ok(stats), Ok(alerts)) => {
            let episodes: u64 = stats.databases.iter().map(|db| db.in_doubt).sum();
            let alerted: HashSet<&str> = alerts
                .alerts
                .iter()
                .filter_map(|a| a.key.strip_prefix("in_doubt:"))
                .collect();
            if (alerted.len() as u64) < episodes {
                eprintln!(
                    "{episodes} in-doubt episodes counted, alerts for {} processes",
                    alerted.len()
                );
            }
            let unalerted: Vec<String> = faults
                .withheld
                .iter()
                .map(ToString::to_string)
                .filter(|pid| !alerted.contains(pid.as_str()))
                .collect();
            if !unalerted.is_empty() {
                eprintln!("in doubt by the harness's doing, without an alert: {unalerted:?}");
            }
            (episodes, alerted.len() as u64, unalerted.len())
        }
        (Err(e), _) => {
            found.stuck(format!("the server did not give its stats: {e}"));
            (0, 0, faults.withheld.len())
        }
        (_, Err(e)) => {
            found.stuck(format!("the server did not give its alerts: {e}"));
            (0, 0, faults.withheld.len())
        }
    };
    let unjustified_alerts = alerts.as_ref().map_or(0, |list| {
        let open = unjustified(&list.alerts, &end);
        for a in &open {
            eprintln!(
                "unjustified alert: {} open since {}: {}",
                a.key, a.raised_at, a.text
            );
        }
        open.len()
    });

    let mut server_errors = 0;
    let mut logs: Vec<&Path> = nodes.iter().map(Server::log).collect();
    logs.dedup();
    for log in logs {
        let text = std::fs::read_to_string(log)?;
        for line in text.lines().filter(|l| is_server_error(l)) {
            eprintln!("{}: {line}", log.display());
            server_errors += 1;
        }
    }

    Ok(Summary {
        faults: faults.clone(),
        server_errors,
        network_faults,
        db_faults,
        messages,
        lost: found.lost,
        duplicated: found.duplicated,
        wrong: found.wrong,
        stuck: found.stuck,
        max_ready,
        in_doubt,
        in_doubt_alerts,
        unalerted,
        unjustified_alerts,
        scheduled_replies,
    })
}

/// What of the final state can justify an alert left open.
#[derive(Debug, Default)]
struct Standing {
    /// Processes not ended (live, or in doubt), with their state.
    unended: HashMap<ProcessId, ProcessState>,
    /// Mailboxes with files left in `Unknown`.
    unknown: HashSet<Id>,
    /// A data folder's file system has less free space than the server's
    /// threshold for its `disk_low` alert.
    disk_low: bool,
}

/// Whether `alert`, open at the end, has its condition still holding in
/// `end` (the rule of each kind is in the module's overview).
fn justified(alert: &AlertEntry, end: &Standing) -> bool {
    let kind = serde_json::from_value::<AlertKind>(serde_json::Value::String(alert.kind.clone()));
    let Ok(kind) = kind else {
        return false;
    };
    let Some(subject) = alert.key.strip_prefix(&format!("{kind}:")) else {
        return false;
    };
    let process = || {
        subject
            .parse::<ProcessId>()
            .ok()
            .and_then(|p| end.unended.get(&p))
    };
    match kind {
        AlertKind::InDoubt => process() == Some(&ProcessState::InDoubt),
        AlertKind::Failed => process().is_some(),
        AlertKind::Orphans => subject
            .parse::<Id>()
            .is_ok_and(|db| end.unknown.contains(&db)),
        AlertKind::DiskLow => end.disk_low,
        AlertKind::StorageWrite | AlertKind::HostDown | AlertKind::MissingFile => false,
    }
}

/// The alerts among `alerts` left open (no `ended_at`) that nothing in
/// `end` justifies.
fn unjustified<'a>(alerts: &'a [AlertEntry], end: &Standing) -> Vec<&'a AlertEntry> {
    alerts
        .iter()
        .filter(|a| a.ended_at.is_none() && !justified(a, end))
        .collect()
}

/// The server's alerts once none is left open unjustified, or as they are
/// after [`ALERT_SETTLE`].
async fn settled(
    admin: &Client,
    end: &Standing,
) -> Result<AlertList, estafeta_client::ClientError> {
    let began = Instant::now();
    loop {
        let list = admin.alerts().await?;
        if unjustified(&list.alerts, end).is_empty() || began.elapsed() >= ALERT_SETTLE {
            return Ok(list);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether the file system of `dir` has less free space than the server's
/// `disk_low` threshold (the server's own reading: blocks available to an
/// unprivileged writer); `false` when it cannot be read.
fn disk_low(dir: &Path) -> bool {
    rustix::fs::statvfs(dir)
        .is_ok_and(|st| st.f_bavail.saturating_mul(st.f_frsize) < DISK_ALERT_MB << 20)
}

/// The ids in a folder of `mailbox`; `None` (counted as stuck) when the
/// server does not list it.
async fn listing(
    admin: &Client,
    mailbox: &Id,
    folder: Folder,
    found: &mut Found,
) -> Option<Vec<MessageId>> {
    match admin.folder(mailbox, folder).await {
        Ok(l) => Some(l.files.into_iter().map(|f| f.id).collect()),
        Err(e) => {
            found.stuck(format!("the server did not list {mailbox}/{folder:?}: {e}"));
            None
        }
    }
}

/// Whether a server log line is the end of a request answered with a
/// server error other than 503 (the server's request trace logs every
/// 5xx answer as `finished status=…`).
fn is_server_error(line: &str) -> bool {
    line.split_once("finished status=5")
        .is_some_and(|(_, rest)| !rest.starts_with("03"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_are_the_5xx_answers_but_503() {
        let at = "2026-11-27T08:07:00Z  WARN request{method=POST path=/v1/upload}: \
                  estafeta_server::trace: finished status=";
        assert!(is_server_error(&format!("{at}500 latency_s=0.1")));
        assert!(is_server_error(&format!("{at}507 latency_s=0.1")));
        assert!(!is_server_error(&format!("{at}503 latency_s=0.1")));
        assert!(!is_server_error(
            "INFO estafeta::event: database created db=db-0"
        ));
    }

    const SETTLED: &str = "01MCC5RM000000000000000003";
    const IN_DOUBT: &str = "01MCC5RM000000000000000004";
    const FAILED: &str = "01MCC5RM000000000000000005";

    /// An alert of `kind` for `subject`, open or `ended`.
    fn alert(kind: &str, subject: &str, ended: bool) -> AlertEntry {
        AlertEntry {
            id: 1,
            kind: kind.to_owned(),
            key: format!("{kind}:{subject}"),
            text: "t".to_owned(),
            raised_at: estafeta_wire::Timestamp::from_millis(1),
            ended_at: ended.then(|| estafeta_wire::Timestamp::from_millis(2)),
            acknowledged_at: None,
        }
    }

    /// A final state with one process in doubt, one FAILED, files left in
    /// `db-1`'s `Unknown`, and a disk over the threshold.
    fn standing() -> Standing {
        Standing {
            unended: HashMap::from([
                (IN_DOUBT.parse().unwrap(), ProcessState::InDoubt),
                (FAILED.parse().unwrap(), ProcessState::Failed),
            ]),
            unknown: HashSet::from(["db-1".parse().unwrap()]),
            disk_low: false,
        }
    }

    fn keys(alerts: &[AlertEntry], end: &Standing) -> Vec<String> {
        unjustified(alerts, end)
            .into_iter()
            .map(|a| a.key.clone())
            .collect()
    }

    #[test]
    fn an_open_in_doubt_alert_of_a_settled_process_is_unjustified() {
        let end = standing();
        let alerts = [
            alert("in_doubt", SETTLED, false),
            alert("in_doubt", IN_DOUBT, false),
            alert("in_doubt", "not-a-process", false),
        ];
        assert_eq!(
            keys(&alerts, &end),
            [
                format!("in_doubt:{SETTLED}"),
                "in_doubt:not-a-process".to_owned()
            ]
        );
        // Closed by its settlement: nothing to say.
        assert!(keys(&[alert("in_doubt", SETTLED, true)], &end).is_empty());
        // A FAILED process is not in doubt.
        assert_eq!(
            keys(&[alert("in_doubt", FAILED, false)], &end),
            [format!("in_doubt:{FAILED}")]
        );
    }

    #[test]
    fn each_kind_is_justified_only_while_its_condition_holds() {
        let mut end = standing();
        let alerts = [
            alert("failed", FAILED, false),
            alert("failed", IN_DOUBT, false),
            alert("failed", SETTLED, false),
            alert("orphans", "db-1", false),
            alert("orphans", "db-0", false),
            alert("disk_low", "data", false),
            alert("storage_write", "data", false),
            alert("host_down", "hooks.example", false),
            alert("missing_file", "01MCC5RM000000000000000006", false),
            alert("clock_off", "node-2", false),
        ];
        let always = [
            "storage_write:data",
            "host_down:hooks.example",
            "missing_file:01MCC5RM000000000000000006",
            "clock_off:node-2",
        ];
        let mut want = vec![
            format!("failed:{SETTLED}"),
            "orphans:db-0".to_owned(),
            "disk_low:data".to_owned(),
        ];
        want.extend(always.map(str::to_owned));
        assert_eq!(keys(&alerts, &end), want);
        end.disk_low = true;
        want.retain(|k| k != "disk_low:data");
        assert_eq!(keys(&alerts, &end), want);
        // A key that does not name its kind is nobody's condition.
        let mut odd = alert("disk_low", "data", false);
        odd.key = "data".to_owned();
        assert_eq!(keys(&[odd], &end), ["data"]);
    }

    #[test]
    fn a_body_names_its_nonce() {
        assert_eq!(
            nonce(r#"{"key":"k","nonce":"dev-0-ab-3"}"#).as_deref(),
            Some("dev-0-ab-3")
        );
        assert_eq!(nonce(r#"{"key":"k"}"#), None);
        assert_eq!(nonce("not json"), None);
    }
}
