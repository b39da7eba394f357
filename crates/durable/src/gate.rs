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

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedRwLockWriteGuard, RwLock, RwLockReadGuard};

/// The gate of a set of stores' durable writes. Cheap to clone; clones
/// are one gate.
#[derive(Clone, Debug, Default)]
pub struct WriteGate {
    lock: Arc<RwLock<()>>,
    /// How many writes wait at the gate now.
    waiting: Arc<AtomicUsize>,
}

/// Counts a write as waiting at the gate while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Writes through the gate are held back while this lives.
#[derive(Debug)]
pub struct Closed {
    _writes: OwnedRwLockWriteGuard<()>,
}

/// A write passing the gate: the gate cannot close while this lives.
#[derive(Debug)]
pub struct Passing<'a> {
    _write: RwLockReadGuard<'a, ()>,
}

impl WriteGate {
    /// Runs `write` once the gate is open, keeping it from closing until
    /// `write` returns. Blocks: call it on a blocking thread.
    pub fn pass<T>(&self, write: impl FnOnce() -> T) -> T {
        let waiting = Waiting::new(&self.waiting);
        let _write = self.lock.blocking_read();
        drop(waiting);
        write()
    }

    /// Waits until the gate is open; it stays open while the guard lives.
    pub async fn enter(&self) -> Passing<'_> {
        let waiting = Waiting::new(&self.waiting);
        let write = self.lock.read().await;
        drop(waiting);
        Passing { _write: write }
    }

    /// Waits for the writes passing now to end and holds back new ones
    /// until the guard is dropped.
    pub async fn close(&self) -> Closed {
        Closed {
            _writes: self.lock.clone().write_owned().await,
        }
    }

    /// Whether a write could pass now.
    pub fn is_open(&self) -> bool {
        self.lock.try_read().is_ok()
    }

    /// How many writes wait at the gate now (held back by a closed gate).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
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
    }
}
