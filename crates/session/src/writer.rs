//! The single writer: group commit of many sessions' saves.
//!
//! Saves arrive on a channel. The writer takes all that are waiting (up to
//! `max_batch`), commits them in one durable storage transaction on a
//! blocking thread, and answers every caller. While one commit runs, the
//! next batch gathers, so under load many releases share one fsync.

use crate::stats::Counters;
use crate::storage::{Storage, StorageError, Write};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// One save waiting for the writer.
pub(crate) struct SaveRequest {
    pub(crate) write: Write,
    pub(crate) done: oneshot::Sender<Result<(), StorageError>>,
}

pub(crate) async fn run(
    storage: Arc<dyn Storage>,
    counters: Arc<Counters>,
    max_batch: usize,
    mut rx: mpsc::UnboundedReceiver<SaveRequest>,
) {
    let mut batch = Vec::new();
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
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
        let storage = storage.clone();
        let result = match tokio::task::spawn_blocking(move || storage.write(&writes)).await {
            Ok(r) => r,
            Err(_) => Err(StorageError::Panicked),
        };
        Counters::add(&counters.save_batches, 1);
        match &result {
            Ok(()) => Counters::add(&counters.saves, batch.len() as u64),
            Err(e) => {
                Counters::add(&counters.storage_errors, 1);
                tracing::error!(error = %e, writes = batch.len(), "session storage write failed");
            }
        }
        for r in batch.drain(..) {
            let _ = r.done.send(result.clone());
        }
    }
}
