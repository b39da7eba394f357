//! The batched paths under load on a multi-thread runtime: workers taking
//! runs of a host's entries, handing the rest of a batch back when a write
//! waits, answers given at once, before the write ends, or later from another
//! task. Every entry must be written once and finalized once, and no window or
//! per-host send concurrency may ever be exceeded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use estafeta_sendq::{
    Kind, QueueConfig, Reply, Request, SendError, SendQueue, Transport, TypeConfig,
};

const HOSTS: usize = 6;
const WINDOWS: [usize; 3] = [1, 4, 16];
const PER_HOST_SENDS: usize = 2;
const N: usize = 20_000;

/// What the transport saw, counted where the queue cannot hide anything.
struct Seen {
    /// Per host and type: sent and not yet answered.
    in_flight: Vec<AtomicUsize>,
    /// Per host: being written.
    writing: Vec<AtomicUsize>,
    /// Per payload: how many times it was written.
    writes: Vec<AtomicU8>,
    windows_exceeded: AtomicUsize,
    sends_exceeded: AtomicUsize,
}

impl Seen {
    fn slot(&self, host: usize, kind: usize) -> &AtomicUsize {
        &self.in_flight[host * WINDOWS.len() + kind]
    }

    /// Frees the window slot, then answers (the queue may send the next entry at once).
    fn answer(&self, host: usize, kind: usize, payload: u32, reply: Reply<u32>) {
        self.slot(host, kind).fetch_sub(1, Ordering::SeqCst);
        reply.answer(Ok(payload));
    }
}

/// Ends each entry a different way, chosen by its payload.
struct Mixed(Arc<Seen>);

impl Transport<usize, u32> for Mixed {
    type Answer = u32;

    async fn send(
        &self,
        request: Request<'_, usize, u32>,
        reply: Reply<u32>,
    ) -> Result<(), SendError> {
        let (host, kind, payload) = (*request.host, request.kind.0, *request.payload);
        let seen = &self.0;
        seen.writes[payload as usize].fetch_add(1, Ordering::SeqCst);
        if seen.writing[host].fetch_add(1, Ordering::SeqCst) + 1 > PER_HOST_SENDS {
            seen.sends_exceeded.fetch_add(1, Ordering::SeqCst);
        }
        if seen.slot(host, kind).fetch_add(1, Ordering::SeqCst) + 1 > WINDOWS[kind] {
            seen.windows_exceeded.fetch_add(1, Ordering::SeqCst);
        }
        match payload % 4 {
            // Answered at once, inside the write.
            0 => seen.answer(host, kind, payload, reply),
            // The write waits (the worker hands the rest of its batch back).
            1 => {
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                seen.answer(host, kind, payload, reply);
            }
            // Answered before the write ends.
            2 => {
                seen.answer(host, kind, payload, reply);
                tokio::task::yield_now().await;
            }
            // Answered later, from another task.
            _ => {
                let seen = Arc::clone(seen);
                tokio::spawn(async move {
                    tokio::task::yield_now().await;
                    seen.answer(host, kind, payload, reply);
                });
            }
        }
        seen.writing[host].fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_write_each_entry_once_and_keep_every_window_and_host_limit() {
    let seen = Arc::new(Seen {
        in_flight: (0..HOSTS * WINDOWS.len())
            .map(|_| AtomicUsize::new(0))
            .collect(),
        writing: (0..HOSTS).map(|_| AtomicUsize::new(0)).collect(),
        writes: (0..N).map(|_| AtomicU8::new(0)).collect(),
        windows_exceeded: AtomicUsize::new(0),
        sends_exceeded: AtomicUsize::new(0),
    });
    let types = WINDOWS
        .iter()
        .enumerate()
        .map(|(k, w)| TypeConfig::new(format!("t{k}"), *w))
        .collect();
    let mut config = QueueConfig::new(types);
    config.workers = 4;
    config.per_host_sends = PER_HOST_SENDS;
    let q = SendQueue::new(config, Mixed(Arc::clone(&seen))).unwrap();
    let finalized: Arc<Vec<AtomicU8>> = Arc::new((0..N).map(|_| AtomicU8::new(0)).collect());
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let left = Arc::new(AtomicUsize::new(N));
    let all = Arc::new(tokio::sync::Notify::new());

    let mut adders = Vec::new();
    for part in 0..3 {
        let (q, finalized, inside) = (q.clone(), finalized.clone(), inside.clone());
        let (overlaps, left, all) = (overlaps.clone(), left.clone(), all.clone());
        adders.push(tokio::spawn(async move {
            for i in (part..N).step_by(3) {
                let (finalized, inside) = (finalized.clone(), inside.clone());
                let (overlaps, left, all) = (overlaps.clone(), left.clone(), all.clone());
                let host = (i / 7) % HOSTS;
                q.add(host, Kind(i % WINDOWS.len()), i as u32, move |done| {
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    assert_eq!(done.result.ok(), Some(i as u32));
                    finalized[i].fetch_add(1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    if left.fetch_sub(1, Ordering::SeqCst) == 1 {
                        all.notify_one();
                    }
                })
                .unwrap();
                if i % 1_000 < 3 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for adder in adders {
        adder.await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(120), all.notified())
        .await
        .expect("hang guard: an entry was never finalized");
    q.shutdown().await;

    for i in 0..N {
        assert_eq!(seen.writes[i].load(Ordering::SeqCst), 1, "writes of {i}");
        assert_eq!(finalized[i].load(Ordering::SeqCst), 1, "completions of {i}");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "callbacks overlapped");
    assert_eq!(seen.windows_exceeded.load(Ordering::SeqCst), 0);
    assert_eq!(seen.sends_exceeded.load(Ordering::SeqCst), 0);
}
