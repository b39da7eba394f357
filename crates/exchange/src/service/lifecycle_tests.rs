//! A property test of the lifecycle alone: random sequences of calls,
//! deadlines, crashes (at any step of a call, and inside start-up
//! processing), failing moves, late settlements and operator actions
//! (settle, requeue, discard) run through [`step`] against a model of the
//! folders, the saved record, the owner records and the processor's own
//! database. The processor is a truthful one: it commits its transaction
//! only after `prepare` answered OK, tells the server how its transaction
//! ended (again after a lost answer), and the operator settles a process
//! in doubt as the processor's database says.
//!
//! After every operation: every file the lifecycle moves is one the model
//! knows, in the place it is moved from (or already where it goes); each
//! upload is in exactly one place, a place for uploads (unless the operator
//! discarded it); an upload in `Log` stays there, and was processed by
//! exactly one process whose transaction committed; no upload is processed
//! by two such processes; no reply is visible unless its process's
//! transaction committed; a live process always has a deadline (a way
//! out). At the end, the processor's settlements, deadlines and operator
//! settlements bring every process to an end with no file left in
//! `Prepared` or `Unknown`, every committed process's messages in `Log`
//! (or `Error`) and its replies in their mailboxes, and every rolled-back
//! process's replies gone. The same holds for a node of a shared store,
//! where a crash runs no start-up processing and only the deadlines (acted
//! on by any live node) and the calls move things on.
//!
//! 256 cases per property; `PROPTEST_CASES=10000` for a long run.

use super::*;
use crate::Timestamp as T;
use crate::mailbox::Folder;
use crate::service::records::RECENT;
use crate::store::Op as StoreOp;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

const MINUTE: i64 = 60_000;

fn id(s: &str) -> Id {
    s.parse().unwrap()
}

/// Where a file is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Place {
    At(Id, Folder),
    /// Scheduled until its `deliver_at`.
    Scheduled,
}

#[derive(Clone, Debug)]
enum Op {
    Upload(u8),
    /// The processor starts a process.
    Start,
    /// The processor narrows its process's list to the picked messages.
    Accept(u8),
    /// The processor prepares its process, with verdicts picked by the number.
    Prepare(u8),
    /// The processor commits its transaction (prepare answered OK) and
    /// tells the server.
    Commit,
    /// The processor rolls its transaction back and tells the server
    /// (`true`: with `abort`).
    GiveUp(bool),
    /// The processor tells the server how each of its transactions the
    /// server has not heard of ended (its start-up, or its next cycle).
    ProcessorSettle,
    /// The operator settles the first process in doubt, as the
    /// processor's database says.
    Settle,
    /// The operator requeues the picked file of `Unknown` or `Error`.
    Requeue(u8),
    /// The operator discards the picked file of `Unknown` or `Error`.
    Discard(u8),
    /// Time passes; a due deadline fires.
    Tick(u8),
    /// The next call, deadline or start-up processing crashes after this
    /// many steps.
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
        1 => Just(Op::ProcessorSettle),
        1 => Just(Op::Settle),
        1 => any::<u8>().prop_map(Op::Requeue),
        1 => any::<u8>().prop_map(Op::Discard),
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

/// What the processor's own database knows of one of its processes (it
/// survives the server's crashes).
#[derive(Clone, Debug, Default)]
struct Local {
    /// The messages the start handed out.
    messages: Vec<FileName>,
    /// Those kept by an `accept` answered OK.
    accepted: Option<Vec<MessageId>>,
    /// `prepare` answered OK: the transaction may commit.
    prepared: bool,
    /// The verdicts of its transaction (its prepare's results).
    verdicts: Vec<(MessageId, ResultStatus)>,
    /// How its transaction ended: committed (`true`) or rolled back.
    committed: Option<bool>,
    /// The server answered how it ended.
    settled: bool,
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
    /// Replies the lifecycle deleted (a rollback's, or an unanswered
    /// prepare's).
    deleted: BTreeSet<MessageId>,
    /// Files the operator requeued or discarded.
    handled: BTreeSet<MessageId>,
    /// Uploads the operator discarded.
    discarded: BTreeSet<MessageId>,
    /// Uploads seen in `Log`.
    logged: BTreeSet<MessageId>,
    /// The processor's database: its processes, and the one it works on.
    local: BTreeMap<ProcessId, Local>,
    current: Option<ProcessId>,
    next_id: u64,
    crash_at: Option<usize>,
    fail_moves: Option<usize>,
    /// A node of a shared store: after a crash no start-up processing runs.
    shared: bool,
    /// The open alerts (the sink keeps them across restarts).
    alerts: HashSet<(AlertKind, ProcessId)>,
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
            deleted: BTreeSet::new(),
            handled: BTreeSet::new(),
            discarded: BTreeSet::new(),
            logged: BTreeSet::new(),
            local: BTreeMap::new(),
            current: None,
            next_id: 1,
            crash_at: None,
            fail_moves: None,
            shared,
            alerts: HashSet::new(),
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

    /// Runs file operations as the message store does: a move or a
    /// schedule finds its file where it comes from or already where it
    /// goes; a delete of a file that is not there does nothing.
    fn run(&mut self, ops: &[StoreOp], fail_at: Option<usize>) -> Result<(), String> {
        for (i, op) in ops.iter().enumerate() {
            if fail_at == Some(i) {
                return Err("injected".into());
            }
            match op {
                StoreOp::Move { name, from, to } => {
                    let from = Place::At(from.mailbox.clone(), from.folder);
                    let to = Place::At(to.mailbox.clone(), to.folder);
                    self.relocate(name, &from, to);
                }
                StoreOp::Delete { name, at } => {
                    assert!(
                        !self.uploads.contains(&name.id),
                        "an upload is never deleted"
                    );
                    let at = Place::At(at.mailbox.clone(), at.folder);
                    if self.files.get(&name.id).is_some_and(|(_, p)| *p == at) {
                        self.files.remove(&name.id);
                        self.deleted.insert(name.id);
                    }
                }
                StoreOp::Schedule { name, from, .. } => {
                    let from = Place::At(from.mailbox.clone(), from.folder);
                    self.relocate(name, &from, Place::Scheduled);
                }
            }
        }
        Ok(())
    }

    /// A move of `name` from `from` to `to`. Only a reply the lifecycle
    /// deleted may be missing (the store alerts `missing_file`; whether
    /// that lost a reply the drain's checks of committed processes say).
    fn relocate(&mut self, name: &FileName, from: &Place, to: Place) {
        match self.files.get_mut(&name.id) {
            Some((_, at)) => {
                assert!(
                    *at == *from || *at == to,
                    "{name} is at {at:?}, not at {from:?} or {to:?}"
                );
                *at = to;
            }
            None => assert!(
                self.deleted.contains(&name.id),
                "a move of {name}, a file the model does not hold (discarded: {})",
                self.discarded.contains(&name.id)
            ),
        }
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
                                self.deleted.insert(n.id);
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
    /// start-up processing runs on it; a crash inside it (an armed
    /// [`Op::CrashAt`]) means another start. On a shared store the next
    /// call or deadline is another node's, which starts from what was
    /// saved, with no start-up processing.
    fn restart(&mut self) {
        loop {
            self.rec = self.saved.clone();
            self.deadline = self.saved_deadline;
            if self.shared || self.drive(Event::Recover, Mode::Hook).is_ok() {
                return;
            }
        }
    }

    /// A call; `None` when the server crashed before answering (it is
    /// started again).
    fn call(&mut self, event: Event, mode: Mode) -> Option<Answer> {
        match self.drive(event, mode) {
            Ok(answer) => answer,
            Err(Crashed) => {
                self.restart();
                None
            }
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
            Op::Start => self.start(),
            Op::Accept(pick) => self.accept(pick),
            Op::Prepare(pick) => self.prepare(pick),
            Op::Commit => {
                let pid = self
                    .unsettled()
                    .rev()
                    .find(|(_, l)| l.prepared && l.committed != Some(false));
                if let Some((pid, _)) = pid {
                    self.tell(pid, true);
                }
            }
            Op::GiveUp(abort) => {
                let pid = self
                    .unsettled()
                    .rev()
                    .find(|(_, l)| l.committed != Some(true));
                if let Some((pid, _)) = pid {
                    self.give_up(pid, abort);
                }
            }
            Op::ProcessorSettle => self.processor_settle(),
            Op::Settle => self.operator_settle(),
            Op::Requeue(pick) => self.by_hand(pick, true),
            Op::Discard(pick) => self.by_hand(pick, false),
            Op::Tick(minutes) => {
                self.now += i64::from(minutes) * MINUTE;
                self.fire();
            }
            Op::CrashAt(k) => self.crash_at = Some(usize::from(k)),
            Op::FailMoves(k) => self.fail_moves = Some(usize::from(k)),
            Op::Restart => self.restart(),
        }
    }

    /// The processor's processes the server has not answered the end of,
    /// oldest first.
    fn unsettled(&self) -> impl DoubleEndedIterator<Item = (ProcessId, &Local)> {
        self.local
            .iter()
            .filter(|(_, l)| !l.settled)
            .map(|(pid, l)| (*pid, l))
    }

    /// The process the processor works on, while it may still accept or
    /// prepare it.
    fn open(&self) -> Option<ProcessId> {
        self.current.filter(|pid| {
            self.local
                .get(pid)
                .is_some_and(|l| !l.prepared && l.committed.is_none() && !l.settled)
        })
    }

    /// The processor's process whose call went unanswered or was
    /// cancelled: its transaction rolls back (the server hears it at the
    /// next settlement).
    fn doomed(&mut self, pid: ProcessId) {
        if let Some(l) = self.local.get_mut(&pid) {
            l.committed.get_or_insert(false);
        }
        self.current = None;
    }

    fn start(&mut self) {
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
        let event = Event::Start {
            pid,
            db,
            messages: messages.clone(),
        };
        if self.call(event, Mode::Call) == Some(Answer::Ok) {
            self.local.insert(
                pid,
                Local {
                    messages,
                    ..Local::default()
                },
            );
            self.current = Some(pid);
        }
    }

    fn accept(&mut self, pick: u8) {
        let Some(pid) = self.open() else { return };
        let ids: Vec<MessageId> = self.local[&pid]
            .messages
            .iter()
            .enumerate()
            .filter(|(i, _)| pick & (1 << i) != 0)
            .map(|(_, n)| n.id)
            .collect();
        let event = Event::Accept {
            pid,
            ids: ids.clone(),
        };
        match self.call(event, Mode::Call) {
            Some(Answer::Ok) => {
                if let Some(l) = self.local.get_mut(&pid) {
                    l.accepted = Some(ids);
                }
            }
            _ => self.doomed(pid),
        }
    }

    fn prepare(&mut self, pick: u8) {
        let Some(pid) = self.open() else { return };
        let l = self.local[&pid].clone();
        let names: Vec<FileName> = match &l.accepted {
            None => l.messages.clone(),
            Some(ids) => l
                .messages
                .iter()
                .filter(|n| ids.contains(&n.id))
                .cloned()
                .collect(),
        };
        let mut results = Vec::new();
        let mut replies = Vec::new();
        for (i, n) in names.into_iter().enumerate() {
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
        if let Some(l) = self.local.get_mut(&pid) {
            l.verdicts = results.iter().map(|v| (v.name.id, v.status)).collect();
        }
        let scheduled = replies
            .iter()
            .filter(|r| pick & 0x80 != 0 && r.id.timestamp().as_millis() % 2 == 0)
            .map(|r| (r.id, T::from_millis(self.now + 10 * MINUTE)))
            .collect();
        let names = replies.clone();
        match self.drive(Event::Preparing { pid, names }, Mode::Call) {
            Err(Crashed) => {
                self.restart();
                return self.doomed(pid);
            }
            Ok(Some(Answer::Cancelled)) => return self.doomed(pid),
            Ok(_) => {}
        }
        let prepared = Place::At(self.db.clone(), Folder::Prepared);
        for r in &replies {
            self.reply_of.insert(r.id, pid);
            self.files.insert(r.id, (r.clone(), prepared.clone()));
        }
        let event = Event::Prepared {
            pid,
            results,
            replies,
            scheduled,
        };
        match self.call(event, Mode::Call) {
            Some(Answer::Ok) => {
                if let Some(l) = self.local.get_mut(&pid) {
                    l.prepared = true;
                }
            }
            _ => self.doomed(pid),
        }
    }

    /// The processor commits its transaction and tells the server (again,
    /// after a lost or FAILED answer).
    fn tell(&mut self, pid: ProcessId, commit: bool) {
        if !commit {
            return self.give_up(pid, false);
        }
        if let Some(l) = self.local.get_mut(&pid) {
            l.committed = Some(true);
        }
        let ended = self.owners.get(&pid).copied().flatten();
        match self.call(Event::Commit { pid, ended }, Mode::Call) {
            Some(Answer::Ok) => self.settled(pid),
            Some(Answer::Cancelled) => {
                panic!("the commit of {pid}, whose transaction committed, answered CANCELLED")
            }
            // FAILED (its moves are retried) or no answer: told again later.
            _ => {}
        }
    }

    /// The processor rolls its transaction back and tells the server.
    fn give_up(&mut self, pid: ProcessId, abort: bool) {
        if let Some(l) = self.local.get_mut(&pid) {
            l.committed = Some(false);
        }
        let as_state = if abort {
            ProcessState::Aborted
        } else {
            ProcessState::RolledBack
        };
        let ended = self.owners.get(&pid).copied().flatten();
        let event = Event::GiveUp {
            pid,
            as_state,
            ended,
        };
        match self.call(event, Mode::Call) {
            Some(Answer::Ok) => self.settled(pid),
            Some(Answer::Cancelled) => {
                assert_ne!(
                    self.owners.get(&pid).copied().flatten(),
                    Some(ProcessState::Done),
                    "the rollback of {pid} answered CANCELLED, and the server committed it"
                );
                self.settled(pid);
            }
            _ => {}
        }
    }

    fn settled(&mut self, pid: ProcessId) {
        if let Some(l) = self.local.get_mut(&pid) {
            l.settled = true;
        }
        if self.current == Some(pid) {
            self.current = None;
        }
    }

    /// What a processor does first in a cycle (`Processor::settle`).
    fn processor_settle(&mut self) {
        let todo: Vec<(ProcessId, bool)> = self
            .unsettled()
            .map(|(pid, l)| (pid, l.committed == Some(true)))
            .collect();
        for (pid, commit) in todo {
            self.tell(pid, commit);
        }
    }

    /// The operator settles the first process in doubt as the processor's
    /// database says (a transaction it does not know of did not commit).
    fn operator_settle(&mut self) {
        let Some(pid) = self.rec.in_doubt.first().map(|p| p.id) else {
            return;
        };
        let commit = self.local.get(&pid).and_then(|l| l.committed) == Some(true);
        if !commit {
            self.doomed(pid);
        }
        let ended = self.owners.get(&pid).copied().flatten();
        let event = if commit {
            Event::Commit { pid, ended }
        } else {
            Event::GiveUp {
                pid,
                as_state: ProcessState::RolledBack,
                ended,
            }
        };
        assert_ne!(
            self.call(event, Mode::Call),
            Some(Answer::Cancelled),
            "the operator's settlement of {pid} (commit: {commit}) answered CANCELLED"
        );
    }

    /// The operator requeues or discards a file of `Unknown` or `Error`:
    /// refused while a process in memory refers to it, as the exchange
    /// refuses it.
    fn by_hand(&mut self, pick: u8, requeue: bool) {
        let held: Vec<MessageId> = self
            .files
            .iter()
            .filter(|(_, (_, at))| {
                matches!(at, Place::At(mb, Folder::Unknown | Folder::Error) if *mb == self.db)
            })
            .map(|(m, _)| *m)
            .collect();
        if held.is_empty() {
            return;
        }
        let m = held[usize::from(pick) % held.len()];
        if self.rec.referenced().any(|n| n.id == m) {
            return;
        }
        self.handled.insert(m);
        if requeue {
            if let Some((name, at)) = self.files.get_mut(&m) {
                *at = Place::At(name.to.clone(), Folder::Messages);
            }
        } else {
            self.files.remove(&m);
            self.discarded.insert(m);
        }
    }

    /// The session's deadline passed: the engine runs the finalize hook.
    fn fire(&mut self) {
        let now = u64::try_from(self.now).unwrap();
        if self.deadline.is_some_and(|t| t.0 <= now) {
            self.call(Event::Deadline, Mode::Hook);
        }
    }

    /// The processes whose transaction committed and that gave `m` this
    /// verdict.
    fn decided(&self, m: &MessageId, status: ResultStatus) -> Vec<ProcessId> {
        self.local
            .iter()
            .filter(|(_, l)| l.committed == Some(true))
            .filter(|(_, l)| l.verdicts.contains(&(*m, status)))
            .map(|(pid, _)| *pid)
            .collect()
    }

    fn check(&mut self) {
        for m in &self.uploads {
            if self.discarded.contains(m) {
                assert!(!self.files.contains_key(m), "discarded upload {m} is back");
                continue;
            }
            // In exactly one place, a place for uploads.
            let (_, at) = self.files.get(m).expect("an upload is never lost");
            let ok = matches!(at, Place::At(mb, f) if *mb == self.db
                && matches!(f, Folder::Messages | Folder::Log | Folder::Error | Folder::Unknown));
            assert!(ok, "upload {m} at {at:?}");
            // Processed at most once, and in `Log` only when processed.
            let by = self.decided(m, ResultStatus::Processed);
            assert!(by.len() <= 1, "upload {m} processed twice: by {by:?}");
            let in_log = *at == Place::At(self.db.clone(), Folder::Log);
            if self.logged.contains(m) {
                assert!(in_log, "upload {m} left Log for {at:?}");
            }
            if in_log {
                assert_eq!(
                    by.len(),
                    1,
                    "upload {m} in Log without a committed transaction that processed it"
                );
            }
        }
        let logged: Vec<MessageId> = self
            .uploads
            .iter()
            .filter(|m| {
                self.files
                    .get(m)
                    .is_some_and(|(_, at)| *at == Place::At(self.db.clone(), Folder::Log))
            })
            .copied()
            .collect();
        self.logged.extend(logged);
        // No reply visible unless its process's transaction committed.
        for (r, pid) in &self.reply_of {
            if let Some((_, at)) = self.files.get(r) {
                let visible =
                    *at == Place::Scheduled || *at == Place::At(self.dev.clone(), Folder::Messages);
                if visible {
                    assert_eq!(
                        self.local.get(pid).and_then(|l| l.committed),
                        Some(true),
                        "reply {r} visible while the transaction of {pid} did not commit"
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

    /// The processor's settlements, deadlines and the operator's
    /// settlements bring everything to an end.
    fn drain(&mut self) {
        self.crash_at = None;
        self.fail_moves = None;
        self.restart();
        for _ in 0..20 {
            self.processor_settle();
            self.check();
            if self.rec.process.is_none() && self.unsettled().next().is_none() {
                break;
            }
            self.now += 10 * MINUTE;
            self.fire();
            self.check();
        }
        assert!(self.rec.process.is_none(), "a live process never ends");
        if let Some((pid, l)) = self.unsettled().next() {
            panic!("the processor cannot settle {pid}: {l:?}");
        }
        while !self.rec.in_doubt.is_empty() {
            let before = self.rec.in_doubt.len();
            self.operator_settle();
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
        // A committed process's messages are in `Log` (or `Error`, unless
        // the operator took them from there) and its replies reached
        // their mailbox; a rolled-back process left no reply.
        let log = Place::At(self.db.clone(), Folder::Log);
        let error = Place::At(self.db.clone(), Folder::Error);
        let inbox = Place::At(self.dev.clone(), Folder::Messages);
        for (pid, l) in &self.local {
            let committed = l.committed == Some(true);
            for (m, status) in &l.verdicts {
                let at = self.files.get(m).map(|(_, at)| at);
                match status {
                    ResultStatus::Processed if committed => {
                        assert_eq!(at, Some(&log), "{m} of committed {pid}")
                    }
                    ResultStatus::ProcessedIncorrect if committed && !self.handled.contains(m) => {
                        assert_eq!(at, Some(&error), "{m} of committed {pid}")
                    }
                    _ => {}
                }
            }
            for (r, _) in self.reply_of.iter().filter(|(_, p)| **p == *pid) {
                let at = self.files.get(r).map(|(_, at)| at);
                if committed && l.prepared {
                    assert!(
                        at == Some(&inbox) || at == Some(&Place::Scheduled),
                        "reply {r} of committed {pid} at {at:?}"
                    );
                } else {
                    assert_eq!(at, None, "reply {r} of {pid}, which did not commit");
                }
            }
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
    #![proptest_config(ProptestConfig::default())]

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
                scheduled: Vec::new(),
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

/// A deadline's moves fail and raise their alert, and the node dies
/// before the deadline hook's record (with the failed attempt) is saved;
/// the commit that runs the moves again later must end the alert.
#[test]
fn a_failed_attempt_forgotten_in_a_crash_does_not_keep_its_alert_open() {
    run(
        vec![
            Op::Upload(2),
            Op::Start,
            Op::CrashAt(3),
            Op::FailMoves(0),
            Op::Prepare(0),
            Op::Commit,
            Op::CrashAt(5),
            Op::Tick(1),
        ],
        true,
    );
}

/// The same inside start-up processing: a commit dies before its moves,
/// start-up processing runs them, they fail, the alert is raised, and the
/// server dies again before the hook's record is saved; the next start's
/// moves succeed and must end the alert.
#[test]
fn a_failed_attempt_of_start_up_processing_forgotten_in_a_crash_does_not_keep_its_alert_open() {
    let mut w = World::new(false);
    for op in [Op::Upload(2), Op::Start, Op::Prepare(2)] {
        w.apply(op);
    }
    let pid = w.current.expect("a process prepared");
    w.local.get_mut(&pid).unwrap().committed = Some(true);
    w.crash_at = Some(3);
    let commit = Event::Commit { pid, ended: None };
    assert!(
        w.drive(commit, Mode::Call).is_err(),
        "died before its moves"
    );
    // Start-up: Count, Run, Owner, Deadline, Save; then the failed
    // attempt: Deadline, Save, Raise, and the crash before the answer.
    w.rec = w.saved.clone();
    w.deadline = w.saved_deadline;
    w.fail_moves = Some(0);
    w.crash_at = Some(8);
    assert!(w.drive(Event::Recover, Mode::Hook).is_err());
    assert!(w.alerts.contains(&(AlertKind::Failed, pid)));
    w.restart();
    w.check();
    w.drain();
}
