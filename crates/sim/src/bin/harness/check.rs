//! The invariants of issue 7, checked after the drain, and the summary line.
//!
//! For every message a device got an id for (201, or 200 for its key after
//! a lost 201): applied exactly once in its processor's database and its
//! file in `Log`, or not applied and its file in `Error` (incorrect); one
//! reply for it at its device after deduplication. Nothing in `Messages`,
//! `Prepared` or `Unknown`; no process live or in doubt; no process the
//! processors still have to settle; no upload left in a device's outbox.
//! Every (re)start of the server answered `/readyz` within the bound. Every
//! in-doubt episode (the databases' durable `in_doubt` counters) has its
//! alert (a distinct `in_doubt:<process>` in `/v1/admin/alerts`).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use estafeta_client::Client;
use estafeta_sim::{Device, Processor};
use estafeta_wire::{Folder, Id, MessageId, ProcessState};

use crate::run::Faults;
use crate::server::READY_BOUND;

/// What the run did and what the checks found.
#[derive(Debug)]
pub(crate) struct Summary {
    faults: Faults,
    network_faults: u64,
    /// Faults fired between the nodes and PostgreSQL.
    db_faults: u64,
    messages: usize,
    lost: usize,
    duplicated: usize,
    stuck: usize,
    max_ready: Duration,
    /// Answers with a server error other than 503 (storage out of reach,
    /// not ready, stopping: retry later), which are never right.
    server_errors: u64,
    /// In-doubt episodes (the databases' durable counters).
    in_doubt: u64,
    /// Distinct processes an in-doubt alert was raised for.
    in_doubt_alerts: u64,
}

impl Summary {
    /// The one summary line.
    pub(crate) fn line(&self) -> String {
        let f = &self.faults;
        format!(
            "rounds={} server_crashes={} processor_crashes={} network_faults={} db_faults={} \
             disk_full={} messages={} lost={} duplicated={} stuck={}",
            f.rounds,
            f.server_crashes,
            f.processor_crashes,
            self.network_faults,
            self.db_faults,
            f.disk_full,
            self.messages,
            self.lost,
            self.duplicated,
            self.stuck,
        )
    }

    /// What the summary line does not carry.
    pub(crate) fn details(&self) -> String {
        let points: Vec<String> = self
            .faults
            .failpoint_crashes
            .iter()
            .map(|(point, n)| format!("{point}:{n}"))
            .collect();
        format!(
            "pauses={} failovers={} db_episodes={} server_deaths={} server_errors={} max_ready_ms={} \
             in_doubt={} in_doubt_alerts={} failpoint_crashes={} [{}]",
            self.faults.pauses,
            self.faults.failovers,
            self.faults.db_episodes,
            self.faults.server_deaths,
            self.server_errors,
            self.max_ready.as_millis(),
            self.in_doubt,
            self.in_doubt_alerts,
            self.faults.failpoint_crashes.values().sum::<u64>(),
            points.join(" "),
        )
    }

    /// Nothing lost, duplicated or stuck, no server error but 503, and
    /// every in-doubt episode alerted.
    pub(crate) fn passed(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.stuck == 0
            && self.server_errors == 0
            && self.in_doubt_alerts >= self.in_doubt
    }
}

/// Checks the invariants over the server's folders and processes, the
/// processors' databases and the devices' inboxes.
pub(crate) async fn check(
    admin: &Client,
    processors: &[(Id, Processor)],
    devices: &[Device],
    faults: &Faults,
    network_faults: u64,
    db_faults: u64,
    logs: &[&Path],
) -> anyhow::Result<Summary> {
    let mut lost = 0;
    let mut duplicated = 0;
    let mut stuck = 0;

    let mut applied: HashMap<MessageId, usize> = HashMap::new();
    let mut log = HashSet::new();
    let mut error = HashSet::new();
    for (db, p) in processors {
        for m in p.applied()? {
            *applied.entry(m).or_default() += 1;
        }
        let dups = p.duplicates()?;
        if !dups.is_empty() {
            eprintln!("{db}: applied again: {dups:?}");
        }
        duplicated += dups.len();
        let unsettled = p.unsettled()?;
        if unsettled > 0 {
            eprintln!("{db}: {unsettled} processes not settled");
        }
        stuck += unsettled;
        let listing = |folder| async move {
            admin
                .folder(db, folder)
                .await
                .map(|l| l.files)
                .map_err(|e| {
                    eprintln!("{db}: the server did not list {folder:?}: {e}");
                })
        };
        match (listing(Folder::Log).await, listing(Folder::Error).await) {
            (Ok(l), Ok(e)) => {
                log.extend(l.into_iter().map(|f| f.id));
                error.extend(e.into_iter().map(|f| f.id));
            }
            // A server that cannot answer is stuck; its messages then
            // count as lost below.
            _ => stuck += 1,
        }
        for folder in [Folder::Messages, Folder::Prepared, Folder::Unknown] {
            match listing(folder).await {
                Ok(left) => {
                    if !left.is_empty() {
                        // The names carry their ids, whose time finds them
                        // in the server logs.
                        let names: Vec<&str> = left.iter().map(|f| f.name.as_str()).collect();
                        eprintln!(
                            "{db}: {} files left in {folder:?}: {}",
                            left.len(),
                            names.join(" ")
                        );
                    }
                    stuck += left.len();
                }
                Err(()) => stuck += 1,
            }
        }
    }

    let mut replies: HashMap<String, usize> = HashMap::new();
    let mut sent = Vec::new();
    for d in devices {
        sent.extend_from_slice(d.sent());
        if d.unsent() > 0 {
            eprintln!("{}: {} uploads never accepted", d.id(), d.unsent());
        }
        stuck += d.unsent();
        for m in d.received() {
            let re = m
                .body
                .parse::<serde_json::Value>()
                .ok()
                .and_then(|v| v["re"].as_str().map(str::to_owned));
            if let Some(re) = re {
                *replies.entry(re).or_default() += 1;
            }
        }
    }
    let unique: HashSet<MessageId> = sent.iter().copied().collect();
    duplicated += sent.len() - unique.len();

    for m in &unique {
        let times = applied.get(m).copied().unwrap_or(0);
        let done = times == 1 && log.contains(m) && !error.contains(m);
        let incorrect = times == 0 && error.contains(m) && !log.contains(m);
        if times > 1 {
            eprintln!("{m}: applied {times} times");
            duplicated += 1;
        } else if !(done || incorrect) {
            eprintln!(
                "{m}: applied {times}, in Log {}, in Error {}",
                log.contains(m),
                error.contains(m)
            );
            lost += 1;
        }
        match replies.get(&m.to_string()).copied().unwrap_or(0) {
            1 => {}
            0 => {
                eprintln!("{m}: no reply reached its device");
                lost += 1;
            }
            n => {
                eprintln!("{m}: {n} replies reached its device");
                duplicated += 1;
            }
        }
    }

    match admin.processes().await {
        Ok(list) => {
            for p in list.processes {
                if p.state.is_live() || p.state == ProcessState::InDoubt {
                    eprintln!("process {} of {} left {:?}", p.process_id, p.db_id, p.state);
                    stuck += 1;
                }
            }
        }
        Err(e) => {
            eprintln!("the server did not list its processes: {e}");
            stuck += 1;
        }
    }

    let max_ready = faults.ready_times.iter().copied().max().unwrap_or_default();
    if max_ready > READY_BOUND {
        eprintln!("the server took {max_ready:?} to be ready");
        stuck += 1;
    }
    let (in_doubt, in_doubt_alerts) = match (admin.stats().await, admin.alerts().await) {
        (Ok(stats), Ok(alerts)) => {
            let episodes: u64 = stats.databases.iter().map(|db| db.in_doubt).sum();
            let alerted = alerts
                .alerts
                .iter()
                .filter(|a| a.key.starts_with("in_doubt:"))
                .map(|a| a.key.as_str())
                .collect::<HashSet<_>>()
                .len() as u64;
            if alerted < episodes {
                eprintln!("{episodes} in-doubt episodes, alerts for {alerted} processes");
            }
            (episodes, alerted)
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("the server did not give its stats or alerts: {e}");
            stuck += 1;
            (0, 0)
        }
    };

    let mut server_errors = 0;
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
        messages: unique.len(),
        lost,
        duplicated,
        stuck,
        max_ready,
        in_doubt,
        in_doubt_alerts,
    })
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
    use super::is_server_error;

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
}
