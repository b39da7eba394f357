//! Model checks of how a key is held, queued for, handed over and let go,
//! and of `stop` against every way a key is let go, with loom: built with
//! `--cfg loom`, the protocol's atomics and locks are loom's (see
//! `crate::sync`), and each check runs the real engine code under every
//! interleaving of its threads (up to `LOOM_MAX_PREEMPTIONS` preemptions,
//! [`PREEMPTIONS`] if unset). Run by `.ci/loom`.
//!
//! Each check builds an engine with one shard and nothing running in the
//! background: its threads are the commands, the expiry manager's brief
//! looks at cells (`drain_touched`, then `flush_key`) and `stop`, driven by
//! loom's `block_on`. Tokio's channels and `Notify` are not loom's, but
//! they take no lock across a point where loom switches threads, and they
//! wake a blocked model thread through its waker, so a lost wake-up shows
//! as loom's deadlock.

use crate::clock::{Clock, Timestamp};
use crate::guard::complete;
use crate::shard::Entered;
use crate::{Config, Engine, MemoryStorage, SessionGuard};
use loom::future::block_on;
use loom::sync::atomic::AtomicUsize;
use loom::thread;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The preemption bound when `LOOM_MAX_PREEMPTIONS` is not set.
const PREEMPTIONS: usize = 3;

/// The time in every model: its clock does not move.
const NOW: Timestamp = Timestamp(1_000_000_000);

struct Fixed;

impl Clock for Fixed {
    fn now(&self) -> Timestamp {
        NOW
    }
}

type Model = Engine<u64, u64>;

/// Run `f` under every interleaving within the bound, and say how many
/// there were.
fn check(name: &str, f: impl Fn() + Send + Sync + 'static) {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(PREEMPTIONS);
    let bound = builder.preemption_bound;
    builder.check(move || {
        counted.fetch_add(1, SeqCst);
        f();
    });
    println!(
        "loom: {name}: {} interleavings (preemption bound {bound:?})",
        runs.load(SeqCst)
    );
}

/// An engine with one shard and no background tasks. (The runtime is only
/// carried: nothing in these models spawns.)
fn engine() -> Model {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    });
    Engine::builder(Arc::new(MemoryStorage::new()))
        .clock(Arc::new(Fixed))
        .config(Config {
            shards: 1,
            ..Config::default()
        })
        .assemble(runtime.handle().clone())
        .engine
}

/// Put a session for `key` in memory, as a command that created it and
/// let it go leaves it: loaded, free, listed for the expiry manager.
/// `expires_at`: within the five seconds that keep it from being flushed.
fn resident(engine: &Model, key: u64, expiring: bool) {
    let Ok(Entered::Held(mut held)) = engine.shared.enter(key, true) else {
        panic!("a new key is held at once");
    };
    let cell = held.owned.as_mut().expect("held");
    let mut session = engine.shared.core().fresh();
    *session.state_mut() = 0;
    if expiring {
        session.expires_at = Some(NOW.after(Duration::from_secs(1)));
    }
    cell.session = Some(session);
    cell.loaded = true;
    drop(SessionGuard::from_held(held));
}

/// The expiry manager has looked at every listed key: the next release of
/// each is its first again.
fn noted(engine: &Model) {
    engine.shared.drain_touched(NOW, &mut Vec::new());
}

/// Take `key`, whose session is in memory.
fn take(engine: &Model, key: u64) -> SessionGuard<u64, u64> {
    block_on(engine.get(key, false))
        .expect("taken")
        .expect("in memory")
}

/// A place in `key`'s queue (the key is held).
fn queue(engine: &Model, key: u64) -> Entered<u64, u64> {
    match engine.shared.enter(key, true) {
        Ok(e @ Entered::Queued(_)) => e,
        _ => panic!("the key is held: a command queues"),
    }
}

/// One iteration of the expiry manager, as far as it looks at cells:
/// note the released keys, then try to flush `key`.
fn expiry_iteration(engine: &Model, key: u64) {
    noted(engine);
    block_on(engine.shared.flush_key(key, NOW, NOW));
}

/// Nobody holds any key.
fn all_free(engine: &Model) {
    assert_eq!(engine.shared.cache.locked(), 0, "a key is still held");
}

fn spawn(f: impl FnOnce() + 'static) -> thread::JoinHandle<()> {
    thread::spawn(f)
}

fn join(threads: Vec<thread::JoinHandle<()>>) {
    for t in threads {
        t.join().expect("a model thread panicked");
    }
}

/// `stop` while `threads` run: it returns, and once they are done nobody
/// holds any key.
fn stop_beside(engine: &Model, threads: Vec<thread::JoinHandle<()>>) {
    block_on(engine.stop()).expect("stopped");
    join(threads);
    all_free(engine);
}

/// `stop` while a command lets go of key 1 (resident, expiring soon if
/// `expiring`) and the expiry manager's `look` at the key overlaps it.
fn stop_beside_a_looked_at_release(expiring: bool, look: fn(&Model)) {
    let engine = engine();
    resident(&engine, 1, expiring);
    let holder = take(&engine, 1);
    let threads = vec![spawn(move || drop(holder)), {
        let engine = engine.clone();
        spawn(move || look(&engine))
    }];
    stop_beside(&engine, threads);
}

/// Two commands for one key: never both inside, and neither change lost.
#[test]
fn one_holder_at_a_time() {
    check("one_holder_at_a_time", || {
        let engine = engine();
        resident(&engine, 1, false);
        let inside = Arc::new(AtomicUsize::new(0));
        let threads = (0..2)
            .map(|_| {
                let (engine, inside) = (engine.clone(), inside.clone());
                spawn(move || {
                    let mut guard = block_on(engine.get(1, true))
                        .expect("taken")
                        .expect("a session");
                    assert_eq!(inside.fetch_add(1, SeqCst), 0, "two holders");
                    *guard.state_mut() += 1;
                    inside.fetch_sub(1, SeqCst);
                })
            })
            .collect();
        join(threads);
        assert_eq!(*take(&engine, 1).state(), 2);
    });
}

/// Two queued commands get the key in the order they queued, and a command
/// that comes while the queue is there gets it after them.
#[test]
fn queued_commands_get_the_key_in_arrival_order() {
    check("queued_commands_get_the_key_in_arrival_order", || {
        let engine = engine();
        resident(&engine, 1, false);
        let holder = take(&engine, 1);
        let order = Arc::new(AtomicUsize::new(0));
        let mut threads: Vec<_> = [queue(&engine, 1), queue(&engine, 1)]
            .into_iter()
            .enumerate()
            .map(|(rank, entered)| {
                let order = order.clone();
                spawn(move || {
                    let guard = block_on(complete(entered, false))
                        .expect("handed over")
                        .expect("a session");
                    assert_eq!(order.fetch_add(1, SeqCst), rank, "out of turn");
                    drop(guard);
                })
            })
            .collect();
        {
            let (engine, order) = (engine.clone(), order.clone());
            threads.push(spawn(move || {
                let guard = take(&engine, 1);
                assert_eq!(order.fetch_add(1, SeqCst), 2, "ahead of the queue");
                drop(guard);
            }));
        }
        drop(holder);
        join(threads);
        all_free(&engine);
    });
}

/// A queued command gives up while the key is let go: the next one in line
/// gets it, and the key is free after it.
#[test]
fn a_waiter_gives_up() {
    check("a_waiter_gives_up", || {
        let engine = engine();
        resident(&engine, 1, false);
        let holder = take(&engine, 1);
        let first = queue(&engine, 1);
        let second = queue(&engine, 1);
        let threads = vec![
            spawn(move || drop(first)),
            spawn(move || {
                block_on(complete(second, false))
                    .expect("handed over")
                    .expect("a session");
            }),
        ];
        drop(holder);
        join(threads);
        all_free(&engine);
        assert!(
            block_on(engine.try_get(1, false)).is_ok(),
            "the key is free"
        );
    });
}

/// `stop` while a command lets a key go on the fast path (its session
/// stays in memory, its key already listed) and the expiry manager, in an
/// iteration begun before `stop`, looks at the same cell: `stop` returns,
/// with every key free.
#[test]
fn stop_hears_a_release_that_the_expiry_manager_overlaps() {
    check(
        "stop_hears_a_release_that_the_expiry_manager_overlaps",
        || stop_beside_a_looked_at_release(false, |engine| expiry_iteration(engine, 1)),
    );
}

/// The same when the expiry manager only notes the released keys (it
/// flushes nothing in most iterations).
#[test]
fn stop_hears_a_release_that_a_note_overlaps() {
    check("stop_hears_a_release_that_a_note_overlaps", || {
        stop_beside_a_looked_at_release(false, noted)
    });
}

/// The same with a session that expires soon (the flush keeps it
/// resident).
#[test]
fn stop_hears_a_release_that_a_keep_resident_look_overlaps() {
    check(
        "stop_hears_a_release_that_a_keep_resident_look_overlaps",
        || stop_beside_a_looked_at_release(true, |engine| expiry_iteration(engine, 1)),
    );
}

/// `stop` while a command lets a key go for the first time since the
/// expiry manager looked (the release lists the key).
#[test]
fn stop_hears_a_first_release() {
    check("stop_hears_a_first_release", || {
        let engine = engine();
        resident(&engine, 1, false);
        noted(&engine);
        let holder = take(&engine, 1);
        let threads = vec![spawn(move || drop(holder))];
        stop_beside(&engine, threads);
    });
}

/// `stop` while a command that found no session lets its key go (the key
/// leaves memory).
#[test]
fn stop_hears_a_release_that_leaves_nothing() {
    check("stop_hears_a_release_that_leaves_nothing", || {
        let engine = engine();
        let Ok(Entered::Held(mut held)) = engine.shared.enter(1, true) else {
            panic!("a new key is held at once");
        };
        held.owned.as_mut().expect("held").loaded = true;
        let threads = vec![spawn(move || drop(held))];
        stop_beside(&engine, threads);
    });
}

/// `stop` while a key with a queued command is let go: the command gets
/// the key (and lets it go) or is told the engine is stopping.
#[test]
fn stop_hears_a_hand_over() {
    check("stop_hears_a_hand_over", || {
        let engine = engine();
        resident(&engine, 1, false);
        let holder = take(&engine, 1);
        let waiter = queue(&engine, 1);
        let threads = vec![
            spawn(move || drop(holder)),
            spawn(move || match block_on(complete(waiter, false)) {
                Ok(guard) => drop(guard.expect("a session")),
                Err(e) => assert!(matches!(e, crate::Error::Stopping), "{e}"),
            }),
        ];
        stop_beside(&engine, threads);
    });
}
