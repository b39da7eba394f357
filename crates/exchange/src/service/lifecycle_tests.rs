//! A property test of the lifecycle alone: random sequences of calls,
//! deadlines, crashes (at any step of a call), failing moves, late
//! settlements and operator actions run through [`step`] against a model
//! of the folders, the saved record and the owner records. After every
//! operation: each message is in exactly one place and none is lost, no
//! reply is visible unless its process committed, and a live process
//! always has a deadline (a way out); at the end, deadlines and operator
//! settlements bring every process to an end with no file left in
//! `Prepared` or `Unknown`. The same holds for a node of a shared store,
//! where a crash runs no start-up processing and only the deadlines (acted
//! on by any live node) and the calls move things on.

use super::*;
use crate::Timestamp as T;
use proptest::prelude::*;
use std::collections::{BTreeMap, VecDeque};

const MINUTE: i64 = 60_000;

fn id(s: &str) -> Id {
    s.parse().unwrap()
}

/// Where a file is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Place {
    At(Id, Folder),
    /// Kept aside until its `deliver_at`.
    Scheduled,
}

#[derive(Clone, Debug)]
enum Op {
    Upload(u8),
    Start,
    Accept(u8),
    /// Prepare with verdicts picked by the number.
    Prepare(u8),
    Commit,
    GiveUp(bool),
    /// The operator (or a late call) settles the first process in doubt.
    Settle(bool),
    /// Time passes; a due deadline fires.
    Tick(u8),
    /// The next call or deadline crashes after this many steps.
    CrashAt(u8),
    /// The next moves fail after this many operations.
    FailMoves(u8),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..4).prop_map(Op::Upload),
        3 => Just(Op::Start),
        1 => any::<u8>().prop_map(Op::Accept),
        3 => any::<u8>().prop_map(Op::Prepare),
        3 => Just(Op::Commit),
        1 => any::<bool>().prop_map(Op::GiveUp),
        1 => any::<bool>().prop_map(Op::Settle),
        2 => (1u8..8).prop_map(Op::Tick),
        1 => (0u8..8).prop_map(Op::CrashAt),
        1 => (0u8..4).prop_map(Op::FailMoves),
        1 => Just(Op::Restart),
    ]
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A protocol call: each Save makes the staged record the session.
    Call,
    /// A session hook: the engine saves the record when the hook returns.
    Hook,
}

struct World {
    db: Id,
    dev: Id,
    now: i64,
    /// The session in memory and its deadline.
    rec: DbRecord,
    deadline: Option<estafeta_session::Timestamp>,
    /// What storage holds.
    saved: DbRecord,
    saved_deadline: Option<estafeta_session::Timestamp>,
    owners: BTreeMap<ProcessId, Option<ProcessState>>,
    files: BTreeMap<MessageId, (FileName, Place)>,
    uploads: Vec<MessageId>,
    /// Reply → the process that wrote it.
    reply_of: BTreeMap<MessageId, ProcessId>,
    next_id: u64,
    crash_at: Option<usize>,
    fail_moves: Option<usize>,
    /// A node of a shared store: after a crash no start-up processing runs.
    shared: bool,
    /// The open alerts (the sink keeps them across restarts).
    alerts: std::collections::HashSet<(AlertKind, ProcessId)>,
}

/// A call crashed the server.
struct Crashed;

impl World {
    fn new(shared: bool) -> World {
        World {
            db: id("db-a"),
            dev: id("phone-1"),
            now: 1_800_000_000_000,
            rec: DbRecord::default(),
            deadline: None,
            saved: DbRecord::default(),
            saved_deadline: None,
            owners: BTreeMap::new(),
            files: BTreeMap::new(),
            uploads: Vec::new(),
            reply_of: BTreeMap::new(),
            next_id: 1,
            crash_at: None,
            fail_moves: None,
            shared,
            alerts: std::collections::HashSet::new(),
        }
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            now: T::from_millis(self.now),
            started_timeout: Duration::from_secs(300),
            ready_timeout: Duration::from_secs(300),
        }
    }

    fn name(&mut self, from: &Id, to: &Id) -> FileName {
        self.next_id += 1;
        FileName {
            created_at: T::from_millis(self.now),
            id: MessageId::from_parts(self.now as u64, u128::from(self.next_id)),
            from: from.clone(),
            to: to.clone(),
            subsystem: id("sales"),
        }
    }

    fn pid(&mut self) -> ProcessId {
        self.next_id += 1;
        ProcessId::from_parts(self.now as u64, u128::from(self.next_id))
    }

    fn run(&mut self, ops: &[FileOp], fail_at: Option<usize>) -> Result<(), String> {
        for (i, op) in ops.iter().enumerate() {
            if fail_at == Some(i) {
                return Err("injected".into());
            }
            match op {
                FileOp::Move { name, from, to } => {
                    let from = Place::At(from.0.clone(), from.1);
                    let to = Place::At(to.0.clone(), to.1);
                    // A file found in neither place is lost; a reply
                    // deleted by a rollback that crashed before it was
                    // saved is gone.
                    if let Some((_, at)) = self.files.get_mut(&name.id) {
                        assert!(
                            *at == from || *at == to,
                            "{name} is at {at:?}, not at {from:?} or {to:?}"
                        );
                        *at = to;
                    }
                }
                FileOp::Delete { name, at } => {
                    assert!(
                        !self.uploads.contains(&name.id),
                        "an upload is never deleted"
                    );
                    let at = Place::At(at.0.clone(), at.1);
                    if self.files.get(&name.id).is_some_and(|(_, p)| *p == at) {
                        self.files.remove(&name.id);
                    }
                }
                FileOp::Schedule { name, from, .. } => {
                    let from = Place::At(from.0.clone(), from.1);
                    if let Some((_, at)) = self.files.get_mut(&name.id) {
                        assert!(
                            *at == from || *at == Place::Scheduled,
                            "{name} is at {at:?}, not at {from:?} or scheduled"
                        );
                        *at = Place::Scheduled;
                    }
                }
            }
        }
        Ok(())
    }

    /// Carry out `event` the way the exchange's drivers do.
    fn drive(&mut self, event: Event, mode: Mode) -> Result<Option<Answer>, Crashed> {
        let ctx = self.ctx();
        let mut queue = VecDeque::from([event]);
        let mut answer = None;
        let mut done = 0;
        let mut hook_rec = self.rec.clone();
        let mut hook_deadline = self.deadline;
        let mut hook_changed = false;
        while let Some(event) = queue.pop_front() {
            let mut staged = match mode {
                Mode::Call => self.rec.clone(),
                Mode::Hook => hook_rec.clone(),
            };
            let mut deadline = match mode {
                Mode::Call => self.deadline,
                Mode::Hook => hook_deadline,
            };
            let steps = step(&mut staged, event, &ctx);
            for s in steps {
                if self.crash_at == Some(done) {
                    self.crash_at = None;
                    return Err(Crashed);
                }
                done += 1;
                match s {
                    Step::Owner {
                        pid, ended: None, ..
                    } => {
                        self.owners.entry(pid).or_insert(None);
                    }
                    Step::Owner { pid, ended, .. } => {
                        self.owners.insert(pid, ended);
                    }
                    Step::Discard { db, names } => {
                        let prepared = Place::At(db, Folder::Prepared);
                        for n in names {
                            if self.files.get(&n.id).is_some_and(|(_, p)| *p == prepared) {
                                self.files.remove(&n.id);
                            }
                        }
                    }
                    Step::Deadline(at) => deadline = at,
                    Step::Save => match mode {
                        Mode::Call => {
                            self.rec = staged.clone();
                            self.deadline = deadline;
                            self.saved = staged.clone();
                            self.saved_deadline = deadline;
                        }
                        Mode::Hook => hook_changed = true,
                    },
                    Step::Run { pid, ops } => {
                        let fail = self.fail_moves.take();
                        let result = self.run(&ops, fail);
                        queue.push_back(Event::Ran { pid, result });
                    }
                    Step::Raise { kind, pid, .. } => {
                        self.alerts.insert((kind, pid));
                    }
                    Step::Clear { kind, pid } => {
                        self.alerts.remove(&(kind, pid));
                    }
                    Step::Count(_) => {}
                    Step::Answer(a) => answer = Some(a),
                }
            }
            if mode == Mode::Hook {
                hook_rec = staged;
                hook_deadline = deadline;
            }
        }
        if mode == Mode::Hook {
            if hook_changed {
                self.rec = hook_rec;
            }
            self.deadline = hook_deadline;
            self.saved = self.rec.clone();
            self.saved_deadline = self.deadline;
        }
        Ok(answer)
    }

    /// The server stops and starts again: memory is what was saved, and
    /// start-up processing runs on it (without crashing or failing). On a
    /// shared store the next call or deadline is another node's, which
    /// starts from what was saved, with no start-up processing.
    fn restart(&mut self) {
        self.rec = self.saved.clone();
        self.deadline = self.saved_deadline;
        self.crash_at = None;
        self.fail_moves = None;
        if !self.shared {
            let _ = self.drive(Event::Recover, Mode::Hook);
        }
    }

    fn call(&mut self, event: Event, mode: Mode) {
        if self.drive(event, mode).is_err() {
            self.restart();
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Upload(n) => {
                for _ in 0..n {
                    let (dev, db) = (self.dev.clone(), self.db.clone());
                    let name = self.name(&dev, &db);
                    self.uploads.push(name.id);
                    self.files
                        .insert(name.id, (name, Place::At(db, Folder::Messages)));
                }
            }
            Op::Start => {
                if !can_start(&self.rec) {
                    return;
                }
                let queue = Place::At(self.db.clone(), Folder::Messages);
                let messages: Vec<FileName> = self
                    .files
                    .values()
                    .filter(|(_, p)| *p == queue)
                    .map(|(n, _)| n.clone())
                    .take(3)
                    .collect();
                if messages.is_empty() {
                    return;
                }
                let pid = self.pid();
                let db = self.db.clone();
                self.call(Event::Start { pid, db, messages }, Mode::Call);
            }
            Op::Accept(pick) => {
                let Some(p) = self.live_started() else { return };
                let ids = p
                    .messages
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| pick & (1 << i) != 0)
                    .map(|(_, n)| n.id)
                    .collect();
                let pid = p.id;
                self.call(Event::Accept { pid, ids }, Mode::Call);
            }
            Op::Prepare(pick) => self.prepare(pick),
            Op::Commit => {
                if let Some(pid) = self.rec.process.as_ref().map(|p| p.id) {
                    let ended = self.owners.get(&pid).copied().flatten();
                    self.call(Event::Commit { pid, ended }, Mode::Call);
                }
            }
            Op::GiveUp(abort) => {
                if let Some(pid) = self.rec.process.as_ref().map(|p| p.id) {
                    let as_state = if abort {
                        ProcessState::Aborted
                    } else {
                        ProcessState::RolledBack
                    };
                    let ended = self.owners.get(&pid).copied().flatten();
                    self.call(
                        Event::GiveUp {
                            pid,
                            as_state,
                            ended,
                        },
                        Mode::Call,
                    );
                }
            }
            Op::Settle(commit) => self.settle(Some(commit)),
            Op::Tick(minutes) => {
                self.now += i64::from(minutes) * MINUTE;
                self.fire();
            }
            Op::CrashAt(k) => self.crash_at = Some(usize::from(k)),
            Op::FailMoves(k) => self.fail_moves = Some(usize::from(k)),
            Op::Restart => self.restart(),
        }
    }

    fn live_started(&self) -> Option<&Process> {
        self.rec
            .process
            .as_ref()
            .and_then(|p| started(&self.rec, &p.id))
    }

    fn prepare(&mut self, pick: u8) {
        let Some(p) = self.live_started().cloned() else {
            return;
        };
        let mut results = Vec::new();
        let mut replies = Vec::new();
        for (i, n) in p.accepted_names().into_iter().enumerate() {
            let status = match (usize::from(pick) + i) % 5 {
                0 => ResultStatus::ProcessedDeadlock,
                1 => ResultStatus::ProcessedIncorrect,
                _ => ResultStatus::Processed,
            };
            if status == ResultStatus::Processed {
                let (db, dev) = (self.db.clone(), self.dev.clone());
                replies.push(self.name(&db, &dev));
            }
            results.push(Verdict {
                name: n,
                status,
                error_code: None,
                error_text: None,
            });
        }
        let deferred = replies
            .iter()
            .filter(|r| pick & 0x80 != 0 && r.id.timestamp().as_millis() % 2 == 0)
            .map(|r| (r.id, T::from_millis(self.now + 10 * MINUTE)))
            .collect();
        let names = replies.clone();
        match self.drive(Event::Preparing { pid: p.id, names }, Mode::Call) {
            Err(Crashed) => return self.restart(),
            Ok(Some(Answer::Cancelled)) => return,
            Ok(_) => {}
        }
        let prepared = Place::At(self.db.clone(), Folder::Prepared);
        for r in &replies {
            self.reply_of.insert(r.id, p.id);
            self.files.insert(r.id, (r.clone(), prepared.clone()));
        }
        let event = Event::Prepared {
            pid: p.id,
            results,
            replies,
            deferred,
        };
        self.call(event, Mode::Call);
    }

    /// A late verdict on the first process in doubt; `None`: the one it
    /// already has, else a commit.
    fn settle(&mut self, commit: Option<bool>) {
        let Some(p) = self.rec.in_doubt.first() else {
            return;
        };
        let pid = p.id;
        let saved = p.target.map(|t| t == ProcessState::Done);
        let commit = commit.or(saved).unwrap_or(true);
        let event = if commit {
            Event::Commit { pid, ended: None }
        } else {
            Event::GiveUp {
                pid,
                as_state: ProcessState::RolledBack,
                ended: None,
            }
        };
        self.call(event, Mode::Call);
    }

    /// The session's deadline passed: the engine runs the finalize hook.
    fn fire(&mut self) {
        let now = u64::try_from(self.now).unwrap();
        if self.deadline.is_some_and(|t| t.0 <= now) {
            self.call(Event::Deadline, Mode::Hook);
        }
    }

    /// The commit of `pid` is durable: it ended DONE, or its record says
    /// it is on its way there.
    fn committed(&self, pid: &ProcessId) -> bool {
        self.owners.get(pid).copied().flatten() == Some(ProcessState::Done)
            || self
                .saved
                .process
                .iter()
                .chain(&self.saved.in_doubt)
                .any(|p| {
                    p.id == *pid
                        && (p.target == Some(ProcessState::Done)
                            || p.verdict == Some(ProcessState::Done))
                })
    }

    fn check(&self) {
        // Each upload is in exactly one place, a place for uploads.
        for m in &self.uploads {
            let (_, at) = self.files.get(m).expect("an upload is never lost");
            let ok = matches!(at, Place::At(mb, f) if *mb == self.db
                && matches!(f, Folder::Messages | Folder::Log | Folder::Error | Folder::Unknown));
            assert!(ok, "upload {m} at {at:?}");
        }
        // No reply visible unless its process committed.
        for (r, pid) in &self.reply_of {
            if let Some((_, at)) = self.files.get(r) {
                let visible =
                    *at == Place::Scheduled || *at == Place::At(self.dev.clone(), Folder::Messages);
                if visible {
                    assert!(
                        self.committed(pid),
                        "reply {r} visible while process {pid} is not committed"
                    );
                }
            }
        }
        // A live process has a way out: its deadline; moves that failed
        // are tried again by their retry time.
        if let Some(p) = &self.rec.process {
            assert!(self.deadline.is_some(), "{:?} with no deadline", p.state);
        }
        for p in self.rec.process.iter().chain(&self.rec.in_doubt) {
            if let Some(retry) = p.retry_at {
                let retry = estafeta_session::Timestamp(retry.as_millis() as u64);
                assert!(
                    self.deadline.is_some_and(|d| d <= retry),
                    "{:?} retries at {retry:?} but the deadline is {:?}",
                    p.state,
                    self.deadline
                );
            }
        }
    }

    /// Deadlines and operator settlements bring everything to an end.
    fn drain(&mut self) {
        self.restart();
        for _ in 0..10 {
            if self.rec.process.is_none() {
                break;
            }
            self.now += 10 * MINUTE;
            self.fire();
            self.check();
        }
        assert!(self.rec.process.is_none(), "a live process never ends");
        while !self.rec.in_doubt.is_empty() {
            let before = self.rec.in_doubt.len();
            self.settle(None);
            self.check();
            assert!(
                self.rec.in_doubt.len() < before,
                "a process in doubt cannot be settled"
            );
        }
        for (n, at) in self.files.values() {
            let stuck = matches!(at, Place::At(_, Folder::Prepared | Folder::Unknown));
            assert!(!stuck, "{n} left at {at:?}");
        }
        assert!(
            self.alerts
                .iter()
                .all(|(kind, _)| *kind != AlertKind::Failed),
            "a failed-moves alert stays open: {:?}",
            self.alerts
        );
        // An id whose start never became durable (a crash between its
        // owner record and the database's save) has no process to end.
        for (pid, ended) in &self.owners {
            let issued = self.saved.recent.iter().any(|p| p.id == *pid);
            assert!(ended.is_some() || !issued, "process {pid} never ended");
        }
    }
}

/// `ops` on a new world (`shared`: a node of a shared store), checked
/// after each, then drained.
fn run(ops: Vec<Op>, shared: bool) {
    let mut w = World::new(shared);
    for op in ops {
        w.apply(op);
        w.check();
    }
    w.drain();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_process_ends_and_no_message_is_lost(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops, false);
    }

    #[test]
    fn on_a_shared_store_every_process_ends_without_start_up_processing(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        run(ops, true);
    }
}

/// The database record is saved whole at every step of every call: what it
/// remembers of ended processes must not grow with their batches, yet still
/// answer the admin list and the error reasons.
#[test]
fn the_record_does_not_grow_with_the_batches_it_remembers() {
    let mut w = World::new(false);
    let ctx = w.ctx();
    let (db, dev) = (w.db.clone(), w.dev.clone());
    let mut rec = DbRecord::default();
    for _ in 0..RECENT + 8 {
        let messages: Vec<FileName> = (0..100).map(|_| w.name(&dev, &db)).collect();
        let replies: Vec<FileName> = (0..100).map(|_| w.name(&db, &dev)).collect();
        let pid = w.pid();
        let results = messages
            .iter()
            .enumerate()
            .map(|(i, n)| Verdict {
                name: n.clone(),
                status: if i == 0 {
                    ResultStatus::ProcessedIncorrect
                } else {
                    ResultStatus::Processed
                },
                error_code: Some(7),
                error_text: Some("no such customer".into()),
            })
            .collect();
        let events = [
            Event::Start {
                pid,
                db: db.clone(),
                messages,
            },
            Event::Prepared {
                pid,
                results,
                replies,
                deferred: Vec::new(),
            },
            Event::Commit { pid, ended: None },
            Event::Ran {
                pid,
                result: Ok(()),
            },
        ];
        for event in events {
            step(&mut rec, event, &ctx);
        }
        assert!(rec.process.is_none());
    }
    assert_eq!(rec.recent.len(), RECENT);
    let last = rec.recent.back().unwrap();
    assert_eq!(
        (last.state, last.messages, last.replies),
        (ProcessState::Done, 100, 100)
    );
    assert_eq!(last.incorrect.len(), 1);
    let size = serde_json::to_vec(&rec).unwrap().len();
    assert!(size < 32 * 1024, "the record is {size} bytes");
}

/// A record saved when ended processes were remembered whole is read.
#[test]
fn a_record_remembering_whole_processes_is_read() {
    let mut w = World::new(false);
    let (db, dev) = (w.db.clone(), w.dev.clone());
    let pid = w.pid();
    let mut p = Process::started(
        pid,
        db.clone(),
        vec![w.name(&dev, &db)],
        T::from_millis(w.now),
    );
    p.replies = vec![w.name(&db, &dev), w.name(&db, &dev)];
    p.state = ProcessState::Done;
    let stored = serde_json::json!({ "recent": [serde_json::to_value(&p).unwrap()] });
    let rec: DbRecord = serde_json::from_value(stored).unwrap();
    let e = &rec.recent[0];
    assert_eq!(
        (e.id, e.state, e.messages, e.replies),
        (pid, ProcessState::Done, 1, 2)
    );
}
