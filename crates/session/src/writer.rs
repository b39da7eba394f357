//! The single writer: group commit of many sessions' saves.
//!
//! A save joins the queue. If no commit is under way, its caller starts
//! one on a blocking thread, which takes all that are waiting (up to
//! `max_batch`), commits them in one durable storage transaction, answers
//! every caller, and goes on with what gathered meanwhile until the queue
//! is empty. So a lone save crosses threads twice (to the blocking thread
//! and back), and under load many releases share one fsync; one commit
//! runs at a time.

use crate::error::Error;
use crate::stats::Counters;
use crate::storage::{Storage, StorageError, Write};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::oneshot;

/// One save waiting for a commit.
struct SaveRequest {
    write: Write,
    done: oneshot::Sender<Result<(), StorageError>>,
}

/// The saves waiting, and whether a commit is under way.
#[derive(Default)]
struct Queue {
    waiting: Vec<SaveRequest>,
    committing: bool,
}

/// The group commit of one engine's saves.
pub(crate) struct Writer {
    storage: Arc<dyn Storage>,
    counters: Arc<Counters>,
    max_batch: usize,
    queue: Mutex<Queue>,
}

impl Writer {
    /// Commits into `storage`, at most `max_batch` saves at a time.
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        counters: Arc<Counters>,
        max_batch: usize,
    ) -> Self {
        Writer {
            storage,
            counters,
            max_batch: max_batch.max(1),
            queue: Mutex::new(Queue::default()),
        }
    }

    /// Saves `write` durably, in a commit shared with whatever else is
    /// saved meanwhile; the commit runs on `runtime`'s blocking threads.
    pub(crate) async fn save(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        write: Write,
    ) -> Result<(), Error> {
        let (done, answer) = oneshot::channel();
        let lead = {
            let mut queue = self.lock();
            queue.waiting.push(SaveRequest { write, done });
            !std::mem::replace(&mut queue.committing, true)
        };
        if lead {
            let writer = Arc::clone(self);
            runtime.spawn_blocking(move || commit_all(writer));
        }
        answer.await.map_err(|_| Error::Stopping)??;
        Ok(())
    }

    /// One durable transaction of `batch`'s writes, counted.
    fn commit(&self, batch: &[SaveRequest]) -> Result<(), StorageError> {
        // The same key twice in one batch: the later write wins.
        let mut last: HashMap<&[u8], usize> = HashMap::new();
        for (i, r) in batch.iter().enumerate() {
            last.insert(r.write.key(), i);
        }
        let writes: Vec<Write> = batch
            .iter()
            .enumerate()
            .filter(|(i, r)| last.get(r.write.key()) == Some(i))
            .map(|(_, r)| r.write.clone())
            .collect();
        // A storage that panics fails this batch, not the writer: the
        // next batch is committed all the same.
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.storage.write(&writes)))
                .unwrap_or(Err(StorageError::Panicked));
        Counters::add(&self.counters.save_batches, 1);
        match &result {
            Ok(()) => Counters::add(&self.counters.saves, batch.len() as u64),
            Err(e) => {
                Counters::add(&self.counters.storage_errors, 1);
                tracing::error!(error = %e, writes = batch.len(), "session storage write failed");
            }
        }
        result
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next batch to commit, or none (no commit under way from now).
    fn next_batch(&self) -> Option<Vec<SaveRequest>> {
        let mut queue = self.lock();
        if queue.waiting.is_empty() {
            queue.committing = false;
            return None;
        }
        let n = queue.waiting.len().min(self.max_batch);
        Some(queue.waiting.drain(..n).collect())
    }
}

/// Commits batches until no save is waiting (blocking). The last batch's
/// callers are answered only once this thread has let `writer` go, so a
/// caller that drops the engine after its save finds the storage free
/// (a redb file can be opened again at once).
fn commit_all(writer: Arc<Writer>) {
    let Some(mut batch) = writer.next_batch() else {
        return;
    };
    loop {
        let result = writer.commit(&batch);
        match writer.next_batch() {
            Some(next) => answer(std::mem::replace(&mut batch, next), &result),
            None => {
                drop(writer);
                answer(batch, &result);
                return;
            }
        }
    }
}

/// Tells every caller of `batch` its commit's `result`.
fn answer(batch: Vec<SaveRequest>, result: &Result<(), StorageError>) {
    for r in batch {
        let _ = r.done.send(result.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemoryStorage;
    use std::sync::mpsc;

    fn put(key: &str) -> Write {
        Write::Put {
            key: key.as_bytes().to_vec(),
            record: b"{}".to_vec(),
            expires_at: None,
        }
    }

    /// A storage whose first write tells the test it began and waits for
    /// its go-ahead; and whose writes of the key `boom` panic.
    struct Held {
        inner: MemoryStorage,
        first: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
    }

    impl Storage for Held {
        fn load(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
            self.inner.load(key)
        }
        fn write(&self, batch: &[Write]) -> Result<(), StorageError> {
            if let Some((began, go)) = self.first.lock().unwrap().take() {
                began.send(()).unwrap();
                go.recv().unwrap();
            }
            assert!(batch.iter().all(|w| w.key() != b"boom"), "a storage bug");
            self.inner.write(batch)
        }
        fn deadlines(&self) -> Result<Vec<(Vec<u8>, crate::Timestamp)>, StorageError> {
            self.inner.deadlines()
        }
        fn quarantine(&self, key: &[u8], reason: &str) -> Result<(), StorageError> {
            self.inner.quarantine(key, reason)
        }
        fn quarantined(&self) -> Result<Vec<Vec<u8>>, StorageError> {
            self.inner.quarantined()
        }
        fn generation(&self) -> u64 {
            self.inner.generation()
        }
    }

    /// Saves made while a commit runs wait for it and then share the next
    /// one: nine saves, two commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn saves_made_during_a_commit_share_the_next() {
        let (began, began_rx) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let storage = Arc::new(Held {
            inner: MemoryStorage::new(),
            first: Mutex::new(Some((began, go_rx))),
        });
        let counters = Arc::new(Counters::default());
        let writer = Arc::new(Writer::new(storage.clone(), counters.clone(), 64));
        let runtime = tokio::runtime::Handle::current();
        let save = |key: String| {
            let (writer, runtime) = (writer.clone(), runtime.clone());
            tokio::spawn(async move { writer.save(&runtime, put(&key)).await })
        };
        let first = save("k0".into());
        tokio::task::spawn_blocking(move || began_rx.recv().unwrap())
            .await
            .unwrap();
        let rest: Vec<_> = (1..9).map(|i| save(format!("k{i}"))).collect();
        while writer.lock().waiting.len() < 8 {
            tokio::task::yield_now().await;
        }
        go.send(()).unwrap();
        first.await.unwrap().unwrap();
        for s in rest {
            s.await.unwrap().unwrap();
        }
        assert_eq!(storage.inner.batches(), 2);
        let stats = counters.snapshot(0, 0);
        assert_eq!((stats.saves, stats.save_batches), (9, 2));
    }

    /// Once a save is answered, the thread that committed it holds the
    /// writer (and so the storage) no more: an engine dropped right after
    /// its last save leaves its redb file free to open again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answered_save_leaves_the_writer_to_its_owners() {
        let writer = Arc::new(Writer::new(
            Arc::new(MemoryStorage::new()),
            Arc::default(),
            64,
        ));
        let runtime = tokio::runtime::Handle::current();
        for i in 0..200 {
            writer.save(&runtime, put(&format!("k{i}"))).await.unwrap();
            assert_eq!(Arc::strong_count(&writer), 1, "after save {i}");
        }
    }

    /// A storage that panics fails the batch it was writing, and the next
    /// save is committed all the same.
    #[tokio::test]
    async fn a_panicking_storage_fails_one_batch_not_the_writer() {
        let storage = Arc::new(Held {
            inner: MemoryStorage::new(),
            first: Mutex::new(None),
        });
        let writer = Arc::new(Writer::new(storage.clone(), Arc::default(), 64));
        let runtime = tokio::runtime::Handle::current();
        let failed = writer.save(&runtime, put("boom")).await;
        assert!(
            matches!(failed, Err(Error::Storage(StorageError::Panicked))),
            "{failed:?}"
        );
        writer.save(&runtime, put("k1")).await.unwrap();
        assert!(storage.inner.load(b"k1").unwrap().is_some());
    }
}
