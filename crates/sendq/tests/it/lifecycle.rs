//! Completion guarantees, adaptive windows, probes, configuration errors and
//! shutdown.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{Answering, Host, Manual, drain_calls, queue_over, settle};
use estafeta_sendq::{
    Adaptive, Completion, ConfigError, Done, Kind, QueueConfig, SendError, SendQueue,
    TransportError, TypeConfig,
};

const A: Kind = Kind(0);
const B: Kind = Kind(1);

/// Ends each entry a different way, chosen by its payload.
fn scripted() -> Answering {
    let kept = Mutex::new(Vec::new());
    Answering::new(move |p, reply| {
        match p % 5 {
            0 => {
                tokio::spawn(async move { reply.answer(Ok(p)) });
            }
            1 => reply.answer(Err(TransportError::Other("refused".into()).into())),
            2 => drop(reply),
            3 => kept.lock().unwrap().push(reply),
            _ => return Err(TransportError::Other("write failed".into()).into()),
        }
        Ok(())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_is_finalized_exactly_once_and_callbacks_never_overlap() {
    const N: usize = 8_000;
    let types = vec![
        TypeConfig::new("plain", 3),
        TypeConfig::new("keep", 2).queueable_if_down(),
        // Short enough that some entries expire while queued behind a window of 1.
        TypeConfig::new("soon", 1).deadline(Duration::from_micros(200)),
    ];
    let mut config = QueueConfig::new(types);
    config.workers = 4;
    let q = SendQueue::new(config, scripted()).unwrap();
    let expired = Arc::new(AtomicUsize::new(0));
    let counts: Arc<Vec<AtomicU8>> = Arc::new((0..N).map(|_| AtomicU8::new(0)).collect());
    let accepted: Arc<Vec<AtomicBool>> = Arc::new((0..N).map(|_| AtomicBool::new(false)).collect());
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let hosts: [Host; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];

    let mut adders = Vec::new();
    for part in 0..4 {
        let (q, counts, accepted) = (q.clone(), counts.clone(), accepted.clone());
        let expired = expired.clone();
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        adders.push(tokio::spawn(async move {
            for i in (part..N).step_by(4) {
                let host = hosts[i % hosts.len()];
                if i % 97 == 0 {
                    q.host_down(&host);
                } else if i % 89 == 0 {
                    q.host_up(&host);
                } else if i % 499 == 0 {
                    q.remove_host(&host);
                }
                let kind = Kind(i % 3);
                let (counts, inside, overlaps) = (counts.clone(), inside.clone(), overlaps.clone());
                let expired = expired.clone();
                let added = q.add(host, kind, i as u32, move |done| {
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    if matches!(done.result, Err(SendError::Expired)) {
                        expired.fetch_add(1, Ordering::SeqCst);
                    }
                    counts[done.payload as usize].fetch_add(1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                });
                match added {
                    Ok(()) => accepted[i].store(true, Ordering::SeqCst),
                    Err(SendError::HostDown) => {}
                    Err(e) => panic!("unexpected refusal: {e}"),
                }
                if i % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for adder in adders {
        adder.await.unwrap();
    }
    q.shutdown().await;
    let mut finalized = 0;
    for i in 0..N {
        let expected = u8::from(accepted[i].load(Ordering::SeqCst));
        assert_eq!(counts[i].load(Ordering::SeqCst), expected, "entry {i}");
        finalized += usize::from(expected);
    }
    assert!(
        finalized > N / 2,
        "most entries were accepted ({finalized})"
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    // Entries stuck behind a never-answered one of the "soon" type expire.
    assert!(
        expired.load(Ordering::SeqCst) > 0,
        "the expiry path was taken"
    );
}

/// A completion of the caller's own type, stored inline in each entry.
struct Tally(tokio::sync::mpsc::UnboundedSender<(u32, Result<u32, SendError>)>);

impl Completion<Host, u32, u32> for Tally {
    fn complete(self, done: Done<Host, u32, u32>) {
        let _ = self.0.send((done.payload, done.result));
    }
}

#[tokio::test]
async fn an_inline_completion_type_gets_each_outcome_once() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let config = QueueConfig::new(vec![TypeConfig::new("a", 3)]);
    let q = SendQueue::<Host, u32, Answering, Tally>::with_completion(config, Answering::echo())
        .unwrap();
    for i in 0..1_000u32 {
        let host = ["x", "y", "z"][(i % 3) as usize];
        q.add_with(host, A, i, Tally(tx.clone())).unwrap();
    }
    // Refused: the completion is dropped unused.
    assert!(matches!(
        q.add_with("x", Kind(7), 7_000, Tally(tx.clone())),
        Err(SendError::Config(ConfigError::UnknownKind(7)))
    ));
    drop(tx);
    let mut seen = vec![0u8; 1_000];
    for _ in 0..1_000 {
        let (payload, result) = rx.recv().await.unwrap();
        assert_eq!(result.unwrap(), payload);
        seen[payload as usize] += 1;
    }
    assert!(seen.iter().all(|&n| n == 1));
    q.shutdown().await;
    // Every completion is gone (the queue held the last senders): nothing more comes.
    assert!(rx.recv().await.is_none());
}

/// Many tasks add to the same few hosts while the manager drains them; every
/// entry must be sent. A lost wake-up would leave a future unresolved, so the
/// whole run is bounded by a generous hang guard (not a timing assertion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_added_while_the_manager_drains_a_host_are_still_sent() {
    let mut config = QueueConfig::new(vec![TypeConfig::new("a", 2), TypeConfig::new("b", 1)]);
    config.workers = 3;
    let q = SendQueue::new(config, Answering::echo()).unwrap();
    let mut adders = Vec::new();
    for part in 0..4u32 {
        let q = q.clone();
        adders.push(tokio::spawn(async move {
            let mut pending = Vec::new();
            for i in 0..3_000u32 {
                let host = ["x", "y", "z"][(i % 3) as usize];
                let kind = if i % 2 == 0 { A } else { B };
                pending.push(q.submit(host, kind, part * 10_000 + i).unwrap());
                if i % 100 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            let mut answered = 0;
            for p in pending {
                p.await.unwrap();
                answered += 1;
            }
            answered
        }));
    }
    let all = async {
        let mut total = 0;
        for adder in adders {
            total += adder.await.unwrap();
        }
        total
    };
    let total = tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("hang guard: an entry was never sent");
    assert_eq!(total, 12_000);
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_adaptive_window_halves_on_errors_and_grows_on_fast_answers() {
    let t = TypeConfig::new("a", 4).adaptive(Adaptive {
        min: 1,
        max: 6,
        latency_target: Duration::from_millis(100),
    });
    let (q, mut calls, rec) = queue_over(Manual::new(), QueueConfig::new(vec![t]));
    for i in 0..200 {
        q.add("h", A, i, rec.callback()).unwrap();
    }
    settle().await;
    let first = drain_calls(&mut calls);
    assert_eq!(first.len(), 4);
    let err = || Err(TransportError::Other("overloaded".into()).into());
    for call in first {
        call.reply.answer(err());
    }
    settle().await;
    // 4 -> 2 -> 1 (min), so only one more send goes out.
    assert_eq!(q.stats(&"h", A).unwrap().window, 1);
    let mut next = drain_calls(&mut calls);
    assert_eq!(next.len(), 1);

    // A slow answer is congestion too.
    tokio::time::sleep(Duration::from_millis(150)).await;
    next.pop().unwrap().reply.answer(Ok(0));
    settle().await;
    assert_eq!(q.stats(&"h", A).unwrap().window, 1);

    // Fast answers: +1 per full window of them, up to max.
    let mut widths = Vec::new();
    for _ in 0..30 {
        let batch = drain_calls(&mut calls);
        let window = q.stats(&"h", A).unwrap().window;
        assert!(
            batch.len() <= window,
            "{} sends with a window of {window}",
            batch.len()
        );
        widths.push(window);
        for call in batch {
            call.reply.answer(Ok(0));
        }
        settle().await;
    }
    assert_eq!(widths.first(), Some(&1));
    assert_eq!(widths.last(), Some(&6));
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn probe_failures_beyond_the_threshold_mark_the_host_down_and_a_success_up() {
    let types = vec![TypeConfig::new("a", 1), TypeConfig::probe("probe", 2)];
    let (q, mut calls, mut rec) = queue_over(Manual::new(), QueueConfig::new(types));
    let fail = || Err(TransportError::Other("no route".into()).into());
    for round in 0..2 {
        q.add("h", B, round, rec.callback()).unwrap();
        settle().await;
        drain_calls(&mut calls).pop().unwrap().reply.answer(fail());
        settle().await;
    }
    assert_eq!(q.is_down(&"h"), Some(true));
    assert!(matches!(
        q.add("h", A, 9, rec.callback()),
        Err(SendError::HostDown)
    ));
    // Probes still go to a down host.
    q.add("h", B, 2, rec.callback()).unwrap();
    settle().await;
    drain_calls(&mut calls).pop().unwrap().reply.answer(Ok(2));
    settle().await;
    assert_eq!(q.is_down(&"h"), Some(false));
    q.add("h", A, 10, rec.callback()).unwrap();
    assert_eq!(rec.drain().len(), 3);
    q.shutdown().await;
}

#[tokio::test]
async fn configuration_errors_are_typed() {
    let zero = QueueConfig::new(vec![TypeConfig::new("a", 0)]);
    assert!(matches!(
        SendQueue::new(zero, Answering::echo()),
        Err(ConfigError::ZeroWindow { kind: 0, .. })
    ));
    let q = SendQueue::new(
        QueueConfig::new(vec![TypeConfig::new("a", 1)]),
        Answering::echo(),
    )
    .unwrap();
    assert!(matches!(
        q.submit("h", Kind(5), 1),
        Err(SendError::Config(ConfigError::UnknownKind(5)))
    ));
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_fails_unfinished_entries_and_refuses_new_ones() {
    let (transport, mut calls) = Manual::new();
    let q = SendQueue::new(QueueConfig::new(vec![TypeConfig::new("a", 1)]), transport).unwrap();
    let sent = q.submit("h", A, 1).unwrap();
    let queued = q.submit("h", A, 2).unwrap();
    settle().await;
    let held = drain_calls(&mut calls);
    q.shutdown().await;
    assert!(matches!(sent.await, Err(SendError::ShuttingDown)));
    assert!(matches!(queued.await, Err(SendError::ShuttingDown)));
    assert!(matches!(q.submit("h", A, 3), Err(SendError::ShuttingDown)));
    // A late answer after shutdown is ignored.
    for call in held {
        call.reply.answer(Ok(1));
    }
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_handle_shuts_the_queue_down() {
    let (transport, _calls) = Manual::holding_writes();
    let q = SendQueue::new(QueueConfig::new(vec![TypeConfig::new("a", 1)]), transport).unwrap();
    let pending = q.submit("h", A, 1).unwrap();
    drop(q);
    assert!(matches!(pending.await, Err(SendError::ShuttingDown)));
}

#[tokio::test]
async fn a_panicking_transport_fails_its_entry_and_keeps_its_worker() {
    let mut config = QueueConfig::new(vec![TypeConfig::new("a", 1)]);
    config.workers = 1;
    // Panics on payload 13, echoes everything else.
    let fragile = Answering::new(|payload, reply| {
        assert_ne!(payload, 13, "transport bug");
        reply.answer(Ok(payload));
        Ok(())
    });
    let q = SendQueue::new(config, fragile).unwrap();
    let bad = q.submit("h", A, 13).unwrap();
    let good = q.submit("h", A, 14).unwrap();
    assert!(matches!(
        bad.await,
        Err(SendError::Transport(TransportError::Other(_)))
    ));
    assert_eq!(good.await.unwrap(), 14);
    q.shutdown().await;
}
