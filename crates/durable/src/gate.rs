//! [`WriteGate`]: lets an online backup hold back a store's durable writes,
//! so that the files it copies meanwhile are a state a crash could leave.
//!
//! A store opened with a gate passes it for the length of each durable
//! write (a redb transaction, a message file written, moved or deleted);
//! [`WriteGate::close`] waits for the writes under way and holds back new
//! ones until its guard is dropped. Reads never pass the gate. A store
//! opened without one is given a gate nobody closes.
//!
//! # Example
//!
//! ```
//! # fn main() -> std::io::Result<()> {
//! let gate = estafeta_durable::WriteGate::default();
//! // A store's write, on a thread that may block.
//! assert_eq!(gate.pass(|| "written"), "written");
//! // A backup closes the gate, copies, and opens it again.
//! let runtime = tokio::runtime::Builder::new_current_thread().build()?;
//! let closed = runtime.block_on(gate.close());
//! assert!(!gate.is_open());
//! drop(closed);
//! assert!(gate.is_open());
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// The gate of a set of stores' durable writes. Cheap to clone; clones
/// are one gate. A write waiting at a closed gate blocks its thread
/// ([`WriteGate::pass`]) or its task ([`WriteGate::enter`]); neither
/// panics, inside a runtime or out.
#[derive(Clone, Debug, Default)]
pub struct WriteGate {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the threads waiting in [`WriteGate::pass`] when the gate opens.
    opened: Condvar,
    /// Wakes the tasks waiting for the gate to open or to empty.
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    closed: bool,
    /// Writes between the gate and their end.
    passing: usize,
    /// Writes waiting at the closed gate.
    waiting: usize,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A write is through the gate: its guard lets the gate close once
    /// dropped.
    fn passed(&self) -> Passing<'_> {
        Passing { shared: self }
    }

    /// Opens the gate and wakes whoever waits for it.
    fn open(&self) {
        self.state().closed = false;
        self.opened.notify_all();
        self.changed.notify_waiters();
    }

    /// A write no longer waits at the gate.
    fn uncount(&self) {
        self.state().waiting -= 1;
    }
}

/// Undoes what a wait marked on the gate if its future is dropped while
/// it waits (a task given up); disarmed once the wait ends.
struct Undo<'a> {
    shared: &'a Shared,
    undo: fn(&Shared),
}

impl Undo<'_> {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        (self.undo)(self.shared);
    }
}

/// Writes through the gate are held back while this lives.
#[derive(Debug)]
pub struct Closed {
    shared: Arc<Shared>,
}

impl Drop for Closed {
    fn drop(&mut self) {
        self.shared.open();
    }
}

/// A write passing the gate: the gate cannot close while this lives.
#[derive(Debug)]
pub struct Passing<'a> {
    shared: &'a Shared,
}

impl Drop for Passing<'_> {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.passing -= 1;
        if state.passing == 0 && state.closed {
            self.shared.changed.notify_waiters();
        }
    }
}

impl WriteGate {
    /// Runs `write` once the gate is open, keeping it from closing until
    /// `write` returns. Blocks while the gate is closed: call it where a
    /// store's blocking write may run.
    pub fn pass<T>(&self, write: impl FnOnce() -> T) -> T {
        let shared = &*self.shared;
        let mut state = shared.state();
        if state.closed {
            state.waiting += 1;
            while state.closed {
                state = shared
                    .opened
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            state.waiting -= 1;
        }
        state.passing += 1;
        drop(state);
        let _passing = shared.passed();
        write()
    }

    /// Waits until the gate is open; it stays open while the guard lives.
    pub async fn enter(&self) -> Passing<'_> {
        let shared = &*self.shared;
        let mut counted = false;
        loop {
            let opened = shared.changed.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            {
                let mut state = shared.state();
                if !state.closed {
                    if counted {
                        state.waiting -= 1;
                    }
                    state.passing += 1;
                    return shared.passed();
                }
                if !counted {
                    state.waiting += 1;
                    counted = true;
                }
            }
            let uncount = Undo {
                shared,
                undo: Shared::uncount,
            };
            opened.await;
            uncount.disarm();
        }
    }

    /// Waits for the writes passing now to end and holds back new ones
    /// until the guard is dropped (one backup at a time: a second close
    /// waits for the first guard to go).
    pub async fn close(&self) -> Closed {
        let shared = &*self.shared;
        let mut mine = false;
        loop {
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = shared.state();
                if !mine && !state.closed {
                    state.closed = true;
                    mine = true;
                }
                if mine && state.passing == 0 {
                    return Closed {
                        shared: self.shared.clone(),
                    };
                }
            }
            // Dropped before it closed for good, the gate opens again.
            let reopen = mine.then(|| Undo {
                shared,
                undo: Shared::open,
            });
            changed.await;
            if let Some(reopen) = reopen {
                reopen.disarm();
            }
        }
    }

    /// Whether a write could pass now.
    pub fn is_open(&self) -> bool {
        !self.shared.state().closed
    }

    /// How many writes wait at the gate now (held back by a closed gate).
    pub fn waiting(&self) -> usize {
        self.shared.state().waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_gate_holds_writes_back_until_it_opens() {
        let gate = WriteGate::default();
        let closed = gate.close().await;
        let write = tokio::task::spawn_blocking({
            let gate = gate.clone();
            move || gate.pass(|| "written")
        });
        while gate.waiting() == 0 {
            assert!(!write.is_finished(), "a write passed the closed gate");
            tokio::task::yield_now().await;
        }
        drop(closed);
        assert_eq!(write.await.unwrap(), "written");
        assert!(gate.is_open());
    }

    #[tokio::test]
    async fn an_open_gate_lets_a_write_pass_on_a_runtime_thread() {
        let gate = WriteGate::default();
        assert_eq!(gate.pass(|| "written"), "written");
    }

    #[tokio::test]
    async fn a_write_or_a_close_given_up_while_waiting_leaves_nothing_behind() {
        let gate = WriteGate::default();
        let closed = gate.close().await;
        let mut entering = Box::pin(gate.enter());
        assert!(futures_poll_once(entering.as_mut()).is_none());
        assert_eq!(gate.waiting(), 1);
        drop(entering);
        assert_eq!(gate.waiting(), 0);
        let mut second = Box::pin(gate.close());
        assert!(futures_poll_once(second.as_mut()).is_none());
        drop(second);
        assert!(!gate.is_open(), "the first close still holds");
        drop(closed);
        assert!(gate.is_open());
        let passing = gate.enter().await;
        let mut closing = Box::pin(gate.close());
        assert!(futures_poll_once(closing.as_mut()).is_none());
        assert!(!gate.is_open());
        drop(closing);
        assert!(gate.is_open(), "a close given up opens the gate again");
        drop(passing);
    }

    /// Polls `f` once: its output if it is ready.
    fn futures_poll_once<F: std::future::Future + ?Sized>(
        f: std::pin::Pin<&mut F>,
    ) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        match f.poll(&mut std::task::Context::from_waker(waker)) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closing_waits_for_the_write_passing() {
        let gate = WriteGate::default();
        let passing = gate.enter().await;
        let close = tokio::spawn({
            let gate = gate.clone();
            async move { drop(gate.close().await) }
        });
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!close.is_finished());
        drop(passing);
        close.await.unwrap();
        assert_eq!(
            Arc::strong_count(&gate.shared),
            1,
            "a close that waited keeps nothing of the gate"
        );
    }
}
