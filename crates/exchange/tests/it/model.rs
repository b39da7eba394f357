//! A model test of the protocol: random sequences of device uploads,
//! processor steps (with the processor's own transaction), processor
//! crashes, timeouts and server restarts, then a drain; afterwards every
//! message was applied exactly once or marked incorrect, no file is left in
//! `Prepared` or `Unknown`, and every reply reached its device once.

use crate::world::*;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::*;
use estafeta_exchange::{Exchange, MessageId};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[derive(Clone, Debug)]
enum Op {
    Upload(u8),
    /// One step of the processor's cycle; the number picks verdicts and
    /// whether its own commit succeeds.
    Step(u8),
    ProcessorCrash,
    Advance(u16),
    Restart,
    Fetch,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..4).prop_map(Op::Upload),
        6 => any::<u8>().prop_map(Op::Step),
        1 => Just(Op::ProcessorCrash),
        2 => prop_oneof![Just(30u16), Just(400), Just(700)].prop_map(Op::Advance),
        1 => Just(Op::Restart),
        2 => Just(Op::Fetch),
    ]
}

/// The processor's local view of its current process.
enum Local {
    Started {
        pid: String,
        messages: Vec<Message>,
    },
    Prepared {
        pid: String,
        processed: Vec<MessageId>,
    },
    Committed {
        pid: String,
    },
}

/// The processor's database: what survives its crashes.
#[derive(Default)]
struct ProcessorDb {
    /// Rows applied, per message id (must end at exactly 1 or 0).
    applied: BTreeMap<MessageId, u32>,
    /// Process ids recorded before prepare (a separate small transaction).
    known: BTreeSet<String>,
    /// Process ids whose transaction committed (recorded inside it).
    committed: BTreeSet<String>,
    /// Process ids settled with the server.
    settled: BTreeSet<String>,
}

struct Model {
    w: World,
    local: Option<Local>,
    db: ProcessorDb,
    uploaded: BTreeSet<MessageId>,
    incorrect: BTreeSet<MessageId>,
    /// Replies received by the device, by reply id → source message.
    received: BTreeMap<MessageId, String>,
    /// When the test's clock started (the exchange's clock reads T0 then).
    t0: tokio::time::Instant,
}

impl Model {
    fn ex(&self) -> &Exchange {
        &self.w.ex
    }

    async fn step(&mut self, pick: u8) {
        match self.local.take() {
            None => {
                let s = self.w.start().await;
                if s.status == StartStatus::Ok {
                    let pid = s.process_id.unwrap().to_string();
                    self.db.known.insert(pid.clone());
                    self.local = Some(Local::Started {
                        pid,
                        messages: s.messages.unwrap(),
                    });
                }
            }
            Some(Local::Started { pid, messages }) => {
                let mut results = Vec::new();
                let mut replies = Vec::new();
                let mut processed = Vec::new();
                for (i, m) in messages.iter().enumerate() {
                    let status = match (pick as usize + i) % 7 {
                        0 => ResultStatus::ProcessedDeadlock,
                        1 => ResultStatus::ProcessedIncorrect,
                        _ => ResultStatus::Processed,
                    };
                    if status == ResultStatus::Processed {
                        processed.push(m.id);
                        replies.push(Reply {
                            to: m.from.clone(),
                            body: Body::from_json(format!(r#"{{"source":"{}"}}"#, m.id)).unwrap(),
                            created_at: None,
                            deliver_at: None,
                        });
                    }
                    if status == ResultStatus::ProcessedIncorrect {
                        self.incorrect.insert(m.id);
                    }
                    results.push(MessageResult {
                        message_id: m.id,
                        status,
                        error_code: None,
                        error_text: None,
                    });
                }
                let req = PrepareRequest {
                    version: Version,
                    results,
                    replies,
                };
                match self.ex().prepare(&self.w.db, &pid, req).await {
                    Ok(r) if r.status == CallStatus::Ok => {
                        self.local = Some(Local::Prepared { pid, processed })
                    }
                    // CANCELLED or an error: the processor rolls back its transaction.
                    _ => {
                        for m in &messages {
                            self.incorrect.remove(&m.id);
                        }
                        self.db.settled.insert(pid);
                    }
                }
            }
            Some(Local::Prepared { pid, processed }) => {
                if pick.is_multiple_of(5) {
                    // The processor's own commit fails.
                    self.w.rollback(&pid).await;
                    self.db.settled.insert(pid);
                } else {
                    for id in processed {
                        *self.db.applied.entry(id).or_default() += 1;
                    }
                    self.db.committed.insert(pid.clone());
                    self.local = Some(Local::Committed { pid });
                }
            }
            Some(Local::Committed { pid }) => {
                let s = self.w.commit(&pid).await;
                assert!(
                    matches!(s, CallStatus::Ok | CallStatus::Failed),
                    "commit of a committed process: {s:?}"
                );
                self.db.settled.insert(pid);
            }
        }
    }

    /// After a crash (or at the end), the processor settles every process
    /// it knows of from its own database.
    async fn settle(&mut self) {
        let open: Vec<String> = self
            .db
            .known
            .difference(&self.db.settled)
            .cloned()
            .collect();
        for pid in open {
            if self.db.committed.contains(&pid) {
                assert_eq!(self.w.commit(&pid).await, CallStatus::Ok);
            } else {
                // Its transaction never committed: whatever the server has,
                // roll it back (an answer of CANCELLED means it had already
                // ended with nothing committed... or DONE, which cannot be).
                let s = self.w.rollback(&pid).await;
                assert_ne!(
                    s,
                    CallStatus::Cancelled,
                    "a process the processor never committed ended DONE"
                );
            }
            self.db.settled.insert(pid);
        }
    }

    async fn fetch(&mut self) {
        let inbox = self.w.inbox().await;
        let mut ids = Vec::new();
        for m in inbox.messages {
            let v: serde_json::Value = serde_json::from_str(m.body.get()).unwrap();
            self.received
                .insert(m.id, v["source"].as_str().unwrap_or_default().to_string());
            ids.push(m.id);
        }
        self.w
            .ex
            .ack(
                &self.w.phone,
                AckRequest {
                    version: Version,
                    ids,
                },
            )
            .await
            .unwrap();
    }

    async fn restart(self) -> Model {
        let now = estafeta_session::Timestamp(1_800_000_000_000).after(self.t0.elapsed());
        Model {
            w: self.w.restart(now).await,
            ..self
        }
    }
}

async fn run(ops: Vec<Op>) {
    let t0 = tokio::time::Instant::now();
    let w = World::new().await;
    let mut m = Model {
        w,
        local: None,
        db: ProcessorDb::default(),
        uploaded: BTreeSet::new(),
        incorrect: BTreeSet::new(),
        received: BTreeMap::new(),
        t0,
    };
    for op in ops {
        match op {
            Op::Upload(n) => m.uploaded.extend(m.w.upload(n as usize).await),
            Op::Step(pick) => m.step(pick).await,
            Op::ProcessorCrash => {
                m.local = None;
                m.settle().await;
            }
            Op::Advance(s) => tokio::time::advance(Duration::from_secs(u64::from(s))).await,
            Op::Restart => m = m.restart().await,
            Op::Fetch => m.fetch().await,
        }
    }
    // Drain: finish or settle the processor's work, then process the rest.
    for round in 0.. {
        assert!(round < 1_000, "the processor's work never drains");
        match m.local {
            Some(Local::Committed { .. })
            | Some(Local::Prepared { .. })
            | Some(Local::Started { .. }) => m.step(2).await,
            None => {
                m.settle().await;
                m.step(2).await;
                if m.local.is_none() {
                    break;
                }
            }
        }
    }
    // Any FAILED commit is retried by the server with backoff.
    tokio::time::advance(Duration::from_secs(600)).await;
    m.fetch().await;

    // Every upload: applied exactly once, or never applied and in Error.
    for id in &m.uploaded {
        let applied = m.db.applied.get(id).copied().unwrap_or(0);
        assert!(applied <= 1, "message {id} applied {applied} times");
        if applied == 0 {
            assert!(m.incorrect.contains(id), "message {id} was lost");
        }
    }
    assert_eq!(
        m.w.files("db-a", Folder::Log) + m.w.files("db-a", Folder::Error),
        m.uploaded.len()
    );
    assert_eq!(m.w.files("db-a", Folder::Messages), 0);
    assert_eq!(
        m.w.files("db-a", Folder::Prepared),
        0,
        "nothing left in Prepared"
    );
    assert_eq!(
        m.w.files("db-a", Folder::Unknown),
        0,
        "nothing left in Unknown"
    );
    // Every applied message's reply arrived exactly once.
    let sources: Vec<&String> = m.received.values().collect();
    let distinct: BTreeSet<&String> = sources.iter().copied().collect();
    assert_eq!(sources.len(), distinct.len(), "a reply was delivered twice");
    let applied: BTreeSet<String> = m.db.applied.keys().map(ToString::to_string).collect();
    assert_eq!(
        distinct.into_iter().cloned().collect::<BTreeSet<_>>(),
        applied
    );
    // No process left in a non-final state.
    let list = m.w.ex.processes(&m.w.admin).await.unwrap();
    for p in list.processes {
        assert!(
            matches!(
                p.state,
                ProcessState::Done
                    | ProcessState::RolledBack
                    | ProcessState::Aborted
                    | ProcessState::TimedOut
            ),
            "process {} left {:?}",
            p.process_id,
            p.state
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn no_loss_no_double_processing(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        rt.block_on(run(ops));
    }
}
