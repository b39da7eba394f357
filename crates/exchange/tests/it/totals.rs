//! The dashboard's running figures stay equal to a recount: after random
//! uploads, process starts, prepares (processed or incorrect), commits,
//! rollbacks, timeouts (a process ready to commit goes in doubt), the
//! operator's settlements, requeues and discards, and restarts,
//! [`Exchange::totals`] equals [`Exchange::recount`] (every folder counted)
//! and [`Exchange::process_totals`] the counts of [`Exchange::processes`]
//! (every database's record read) and the verdicts of `stats`, whose processes
//! [`Exchange::process_page`] lists, open ones first, and
//! [`Exchange::holding`] the mailboxes whose `Unknown` or `Error` holds
//! files.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::{id, replies};
use crate::world::*;
use estafeta_exchange::mailbox::{Folder, MailboxKind};
use estafeta_exchange::wire::*;
use estafeta_exchange::{Exchange, Id, ProcessTotals, Totals, Verdicts};
use estafeta_session::Timestamp as SessionTime;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Upload(u8),
    Start,
    /// Prepare the last process started: incorrect or processed, with
    /// that many replies.
    Prepare {
        incorrect: bool,
        replies: u8,
    },
    Commit,
    Rollback,
    /// Time passes beyond the READY_TO_COMMIT timeout (or the STARTED one).
    Timeout {
        started: bool,
    },
    /// The operator settles the first process in doubt.
    Settle {
        commit: bool,
    },
    /// The operator requeues or discards the oldest message of `Unknown`
    /// or `Error`.
    Operator {
        requeue: bool,
        error: bool,
    },
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..4).prop_map(Op::Upload),
        4 => Just(Op::Start),
        4 => (any::<bool>(), 0u8..3).prop_map(|(incorrect, replies)| Op::Prepare { incorrect, replies }),
        3 => Just(Op::Commit),
        1 => Just(Op::Rollback),
        2 => any::<bool>().prop_map(|started| Op::Timeout { started }),
        2 => any::<bool>().prop_map(|commit| Op::Settle { commit }),
        2 => (any::<bool>(), any::<bool>()).prop_map(|(requeue, error)| Op::Operator { requeue, error }),
        1 => Just(Op::Restart),
    ]
}

/// The process figures counted from the full list, and the verdicts
/// summed from every database's counters.
fn counted(list: &ProcessList, stats: &Stats) -> ProcessTotals {
    let mut by_state: HashMap<ProcessState, u64> = HashMap::new();
    let mut oldest_ready = None;
    for p in &list.processes {
        *by_state.entry(p.state).or_default() += 1;
        if p.state == ProcessState::ReadyToCommit {
            let since = p.ready_at.unwrap_or(p.started_at);
            oldest_ready =
                Some(oldest_ready.map_or(since, |o: estafeta_exchange::Timestamp| o.min(since)));
        }
    }
    let mut verdicts = Verdicts::default();
    for db in &stats.databases {
        verdicts += Verdicts {
            processed: db.processed,
            deadlocked: db.deadlocks,
            incorrect: db.incorrect,
        };
    }
    ProcessTotals {
        by_state,
        oldest_ready,
        listed: list.processes.len(),
        verdicts,
    }
}

/// The processes by id.
fn by_id(mut list: Vec<ProcessSummary>) -> Vec<ProcessSummary> {
    list.sort_by_key(|p| p.process_id);
    list
}

/// Both recounts, read together, and every process.
/// The mailboxes with files in `Unknown` and in `Error`, each folder's
/// databases first, each kind in id order, found by counting every folder.
async fn holding(ex: &Exchange, w: &World) -> Vec<Vec<(MailboxKind, Id)>> {
    let (dbs, devs) = ex.mailbox_ids(&w.admin).unwrap();
    let mut all: Vec<_> = dbs
        .into_iter()
        .map(|id| (MailboxKind::Database, id))
        .collect();
    all.extend(devs.into_iter().map(|id| (MailboxKind::Device, id)));
    all.sort();
    let mut out = Vec::new();
    for folder in [Folder::Unknown, Folder::Error] {
        let mut with_files = Vec::new();
        for (kind, id) in &all {
            let (n, _) = ex.folder_page(&w.admin, id, folder, 0, 0).await.unwrap();
            if n > 0 {
                with_files.push((*kind, id.clone()));
            }
        }
        out.push(with_files);
    }
    out
}

type Recount = (
    Totals,
    ProcessTotals,
    Vec<ProcessSummary>,
    Vec<Vec<(MailboxKind, Id)>>,
);

async fn recount(ex: &Exchange, w: &World) -> Recount {
    let list = ex.processes(&w.admin).await.unwrap();
    let stats = ex.stats(&w.admin).await.unwrap();
    (
        ex.recount(&w.admin).await.unwrap(),
        counted(&list, &stats),
        by_id(list.processes),
        holding(ex, w).await,
    )
}

/// The running figures equal the recounts read around them (read again
/// while a deadline's work, run by the session engine on its own, changes
/// them in between).
async fn check(w: &World) {
    let ex = &w.ex;
    for _ in 0..100 {
        let before = recount(ex, w).await;
        let (listed, page) = ex.process_page(&w.admin, 0, usize::MAX).await.unwrap();
        let open = page.iter().filter(|p| !is_ended(p.state)).count();
        assert!(
            page[..open].iter().all(|p| !is_ended(p.state)),
            "open processes first: {page:?}"
        );
        assert_eq!(listed, page.len());
        let mut held = Vec::new();
        for folder in [Folder::Unknown, Folder::Error] {
            let kept = ex.holding(&w.admin, folder).await.unwrap();
            held.push(kept.expect("the exchange's file store keeps running totals"));
        }
        let kept = (
            ex.totals(&w.admin).await.unwrap(),
            ex.process_totals(&w.admin).await.unwrap(),
            by_id(page),
            held,
        );
        let after = recount(ex, w).await;
        if before == after {
            assert_eq!(kept, before);
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the figures never held still");
}

/// Whether a process in `state` has ended.
fn is_ended(state: ProcessState) -> bool {
    matches!(
        state,
        ProcessState::Done
            | ProcessState::RolledBack
            | ProcessState::Aborted
            | ProcessState::TimedOut
    )
}

async fn run(ops: Vec<Op>) {
    let t0 = tokio::time::Instant::now();
    let mut w = World::new().await;
    let db = id("db-a");
    let mut last: Option<StartResponse> = None;
    check(&w).await;
    for op in ops {
        let pid = last
            .as_ref()
            .and_then(|s| s.process_id)
            .map(|p| p.to_string());
        match op {
            Op::Upload(n) => {
                w.upload(n as usize).await;
            }
            Op::Start => {
                let s = w.start().await;
                if s.process_id.is_some() {
                    last = Some(s);
                }
            }
            Op::Prepare {
                incorrect,
                replies: n_replies,
            } => {
                if let (Some(s), Some(pid)) = (&last, &pid) {
                    let status = if incorrect {
                        ResultStatus::ProcessedIncorrect
                    } else {
                        ResultStatus::Processed
                    };
                    let req = PrepareRequest {
                        version: Version,
                        results: World::results(s, status),
                        replies: replies(n_replies.into()),
                    };
                    let _ = w.ex.prepare(&w.db, pid, req).await;
                }
            }
            Op::Commit => {
                if let Some(pid) = &pid {
                    let req = CommitRequest { version: Version };
                    let _ = w.ex.commit(&w.db, pid, req).await;
                }
            }
            Op::Rollback => {
                if let Some(pid) = &pid {
                    let req = RollbackRequest {
                        version: Version,
                        error_text: "tx failed".into(),
                    };
                    let _ = w.ex.rollback(&w.db, pid, req).await;
                }
            }
            Op::Timeout { started } => {
                let past = if started {
                    STARTED_TIMEOUT
                } else {
                    READY_TIMEOUT
                };
                tokio::time::advance(past + Duration::from_secs(1)).await;
            }
            Op::Settle { commit } => {
                let in_doubt = w.ex.in_doubt(&w.admin, &db).await.unwrap();
                if let Some((pid, _)) = in_doubt.first() {
                    let _ = w.ex.settle(&w.admin, &pid.to_string(), commit).await;
                }
            }
            Op::Operator { requeue, error } => {
                let folder = if error {
                    Folder::Error
                } else {
                    Folder::Unknown
                };
                let (_, names) = w.ex.folder_page(&w.admin, &db, folder, 0, 1).await.unwrap();
                if let Some(name) = names.first() {
                    let _ = if requeue {
                        w.ex.requeue(&w.admin, &db, folder, name.id).await
                    } else {
                        w.ex.discard(&w.admin, &db, folder, name.id).await
                    };
                }
            }
            Op::Restart => {
                let now = SessionTime(1_800_000_000_000).after(t0.elapsed());
                w = w.restart(now).await;
            }
        }
        check(&w).await;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn running_figures_equal_a_recount(ops in proptest::collection::vec(op(), 1..30)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        rt.block_on(run(ops));
    }
}

/// One path through every kind of change, figures checked after each.
#[tokio::test(start_paused = true)]
async fn figures_follow_each_kind_of_change() {
    let ops = vec![
        Op::Upload(3),
        Op::Start,
        Op::Prepare {
            incorrect: true,
            replies: 1,
        },
        Op::Commit,
        Op::Upload(2),
        Op::Start,
        Op::Rollback,
        Op::Start,
        Op::Prepare {
            incorrect: false,
            replies: 2,
        },
        Op::Timeout { started: false },
        Op::Restart,
        Op::Operator {
            requeue: true,
            error: true,
        },
        Op::Settle { commit: false },
        Op::Operator {
            requeue: false,
            error: false,
        },
        Op::Upload(1),
        Op::Start,
        Op::Timeout { started: true },
        Op::Restart,
    ];
    run(ops).await;
}
