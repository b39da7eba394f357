//! Behaviour of the queue itself, with a transport the test drives by hand.
//! Time is paused: `settle()` runs every task until all are idle.

use std::time::Duration;

use crate::common;
use crate::common::{Host, Manual, Outcome, Recorder, drain_calls, payloads, queue_over, settle};
use estafeta_sendq::{
    Kind, QueueConfig, Reply, Request, SendError, SendQueue, Transport, TypeConfig,
};

const A: Kind = Kind(0);
const B: Kind = Kind(1);

fn config(types: Vec<TypeConfig>) -> QueueConfig {
    QueueConfig::new(types)
}

fn ok(host: Host, payload: u32) -> Outcome {
    Outcome {
        host,
        payload,
        result: Ok(payload),
    }
}

fn failed(host: Host, payload: u32, why: &str) -> Outcome {
    Outcome {
        host,
        payload,
        result: Err(why.into()),
    }
}

#[tokio::test(start_paused = true)]
async fn window_of_three_sends_three_and_each_answer_lets_one_more_go() {
    let (q, mut calls, mut rec) = queue_over(Manual::new(), config(vec![TypeConfig::new("a", 3)]));
    for i in 0..10 {
        q.add("h", A, i, rec.callback()).unwrap();
    }
    settle().await;
    let first = drain_calls(&mut calls);
    assert_eq!(payloads(&first), vec![0, 1, 2]);
    assert!(q.window_is_full(&"h", A));
    let stats = q.stats(&"h", A).unwrap();
    assert_eq!((stats.in_flight, stats.queued, stats.window), (3, 7, 3));

    let mut first = first.into_iter();
    let c0 = first.next().unwrap();
    c0.reply.answer(Ok(c0.payload));
    settle().await;
    assert_eq!(payloads(&drain_calls(&mut calls)), vec![3]);
    assert_eq!(rec.drain(), vec![ok("h", 0)]);
    assert!(q.window_is_full(&"h", A));
    drop(first);
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_saturated_type_does_not_hold_back_another_type() {
    let types = vec![TypeConfig::new("a", 1), TypeConfig::new("b", 1)];
    let (q, mut calls, rec) = queue_over(Manual::new(), config(types));
    for i in 0..5 {
        q.add("h", A, i, rec.callback()).unwrap();
    }
    q.add("h", B, 100, rec.callback()).unwrap();
    settle().await;
    // Keep the calls: a dropped reply fails its entry and frees the slot.
    let calls = drain_calls(&mut calls);
    let sent: Vec<(Kind, u32)> = calls.iter().map(|c| (c.kind, c.payload)).collect();
    assert_eq!(sent, vec![(A, 0), (B, 100)]);
    assert_eq!(q.stats(&"h", A).unwrap().queued, 4);
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_blocked_host_does_not_hold_back_other_hosts() {
    let mut c = config(vec![TypeConfig::new("a", 100)]);
    c.workers = 2;
    let (q, mut calls, rec) = queue_over(Manual::holding_writes(), c);
    for i in 0..50 {
        q.add("slow", A, i, rec.callback()).unwrap();
    }
    q.add("fast", A, 1000, rec.callback()).unwrap();
    settle().await;
    let sent: Vec<(Host, u32)> = drain_calls(&mut calls)
        .iter()
        .map(|c| (c.host, c.payload))
        .collect();
    assert_eq!(sent, vec![("slow", 0), ("fast", 1000)]);
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn per_host_send_concurrency_is_never_exceeded() {
    let (transport, mut calls) = Manual::holding_writes();
    let writing = transport.max_writing();
    let mut c = config(vec![TypeConfig::new("a", 10), TypeConfig::new("b", 10)]);
    c.workers = 8;
    c.per_host_sends = 2;
    let q = SendQueue::new(c, transport).unwrap();
    let mut rec = Recorder::new();
    let hosts = ["x", "y", "z"];
    for i in 0..60 {
        let kind = if i % 2 == 0 { A } else { B };
        q.add(hosts[i as usize % 3], kind, i, rec.callback())
            .unwrap();
    }
    let mut done = 0;
    while done < 60 {
        settle().await;
        let batch = drain_calls(&mut calls);
        assert!(!batch.is_empty(), "the queue stalled after {done} sends");
        for call in batch {
            call.written.unwrap().send(()).unwrap();
            call.reply.answer(Ok(call.payload));
            done += 1;
        }
    }
    settle().await;
    assert_eq!(rec.drain().len(), 60);
    for host in hosts {
        assert_eq!(writing.lock().unwrap()[host].1, 2, "host {host}");
    }
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn order_within_a_type_equals_order_of_adding() {
    let (q, mut calls, mut rec) = queue_over(Manual::new(), config(vec![TypeConfig::new("a", 4)]));
    for i in 0..100 {
        q.add("h", A, i, rec.callback()).unwrap();
    }
    let mut order = Vec::new();
    while order.len() < 100 {
        settle().await;
        let batch = drain_calls(&mut calls);
        assert!(!batch.is_empty());
        for call in batch {
            order.push(call.payload);
            call.reply.answer(Ok(call.payload));
        }
    }
    assert_eq!(order, (0..100).collect::<Vec<_>>());
    settle().await;
    let finished: Vec<u32> = rec.drain().iter().map(|o| o.payload).collect();
    assert_eq!(finished, (0..100).collect::<Vec<_>>());
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_probe_added_behind_50_ready_entries_is_sent_next() {
    let types = vec![TypeConfig::new("a", 100), TypeConfig::probe("probe", 3)];
    let (q, mut calls, rec) = queue_over(Manual::holding_writes(), config(types));
    q.add("h", A, 0, rec.callback()).unwrap();
    settle().await;
    let first = drain_calls(&mut calls);
    assert_eq!(payloads(&first), vec![0]);
    for i in 1..=50 {
        q.add("h", A, i, rec.callback()).unwrap();
    }
    q.add("h", B, 999, rec.callback()).unwrap();
    settle().await;
    assert!(
        drain_calls(&mut calls).is_empty(),
        "one send at a time per host"
    );
    for call in first {
        call.written.unwrap().send(()).unwrap();
    }
    settle().await;
    let next = drain_calls(&mut calls);
    assert_eq!(
        next.iter().map(|c| (c.kind, c.payload)).collect::<Vec<_>>(),
        vec![(B, 999)]
    );
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_second_probe_while_one_is_unanswered_is_refused() {
    let types = vec![TypeConfig::new("a", 1), TypeConfig::probe("probe", 3)];
    let (q, mut calls, mut rec) = queue_over(Manual::new(), config(types));
    q.add("h", B, 1, rec.callback()).unwrap();
    assert!(matches!(
        q.add("h", B, 2, rec.callback()),
        Err(SendError::Busy)
    ));
    settle().await;
    assert!(matches!(
        q.add("h", B, 3, rec.callback()),
        Err(SendError::Busy)
    ));
    let probe = drain_calls(&mut calls).pop().unwrap();
    probe.reply.answer(Ok(1));
    settle().await;
    assert_eq!(rec.drain(), vec![ok("h", 1)]);
    q.add("h", B, 4, rec.callback()).unwrap();
    assert!(matches!(q.add("other", B, 5, rec.callback()), Ok(())));
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn queueable_entries_survive_a_down_period_and_go_out_in_order() {
    let types = vec![
        TypeConfig::new("keep", 2).queueable_if_down(),
        TypeConfig::new("plain", 2),
    ];
    let (q, mut calls, mut rec) = queue_over(Manual::new(), config(types));
    q.add("h", B, 0, rec.callback()).unwrap();
    settle().await;
    drain_calls(&mut calls).pop().unwrap().reply.answer(Ok(0));
    q.host_down(&"h");
    assert_eq!(q.is_down(&"h"), Some(true));
    assert!(matches!(
        q.add("h", B, 1, rec.callback()),
        Err(SendError::HostDown)
    ));
    for i in 10..20 {
        q.add("h", A, i, rec.callback()).unwrap();
    }
    settle().await;
    assert!(drain_calls(&mut calls).is_empty());
    assert_eq!(q.stats(&"h", A).unwrap().queued, 10);
    q.host_up(&"h");
    let mut order = Vec::new();
    while order.len() < 10 {
        settle().await;
        let batch = drain_calls(&mut calls);
        assert!(!batch.is_empty(), "the queue stalled after {order:?}");
        for call in batch {
            order.push(call.payload);
            call.reply.answer(Ok(call.payload));
        }
    }
    assert_eq!(order, (10..20).collect::<Vec<_>>());
    settle().await;
    let mut expected = vec![ok("h", 0)];
    expected.extend((10..20).map(|i| ok("h", i)));
    assert_eq!(rec.drain(), expected);
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_queueable_one_shot_added_while_its_host_is_down_waits_for_it_to_come_up() {
    let types = vec![
        TypeConfig::new("urgent", 1)
            .prior_one_shot()
            .queueable_if_down(),
    ];
    let (q, mut calls, mut rec) = queue_over(Manual::new(), config(types));
    q.add("h", A, 0, rec.callback()).unwrap();
    settle().await;
    drain_calls(&mut calls).pop().unwrap().reply.answer(Ok(0));
    settle().await;
    q.host_down(&"h");
    q.add("h", A, 1, rec.callback()).unwrap();
    settle().await;
    assert!(
        payloads(&drain_calls(&mut calls)).is_empty(),
        "nothing is sent to a host that is down"
    );
    let stats = q.stats(&"h", A).unwrap();
    assert_eq!((stats.queued, stats.in_flight), (1, 0));
    assert!(matches!(
        q.add("h", A, 2, rec.callback()),
        Err(SendError::Busy)
    ));
    q.host_up(&"h");
    settle().await;
    let call = drain_calls(&mut calls).pop().unwrap();
    assert_eq!(call.payload, 1);
    call.reply.answer(Ok(1));
    settle().await;
    assert_eq!(rec.drain(), vec![ok("h", 0), ok("h", 1)]);
    q.shutdown().await;
}

/// A queue that holds writes, with one host's entries in every stage:
/// `keep` 0 being written (its call is returned), `keep` 1 ready, `keep` 2
/// waiting, `plain` 10 and 11 ready, `plain` 12 waiting.
async fn entries_in_every_stage() -> (
    SendQueue<Host, u32, Manual>,
    tokio::sync::mpsc::UnboundedReceiver<common::Call>,
    Recorder,
    common::Call,
) {
    let types = vec![
        TypeConfig::new("keep", 2).queueable_if_down(),
        TypeConfig::new("plain", 2),
    ];
    let (q, mut calls, rec) = queue_over(Manual::holding_writes(), config(types));
    for i in 0..3 {
        q.add("h", A, i, rec.callback()).unwrap();
    }
    for i in 10..13 {
        q.add("h", B, i, rec.callback()).unwrap();
    }
    settle().await;
    let mut writing = drain_calls(&mut calls);
    assert_eq!(payloads(&writing), vec![0]);
    assert_eq!(q.stats(&"h", A).unwrap().queued, 1);
    assert_eq!(q.stats(&"h", B).unwrap().queued, 1);
    let call = writing.pop().unwrap();
    (q, calls, rec, call)
}

/// The transport finishes writing entry 0 (`writing`) and answers it: the
/// entry completes with its payload, whatever befell the host meanwhile.
async fn finish_writing_0(writing: common::Call, rec: &mut Recorder) {
    writing.written.unwrap().send(()).unwrap();
    writing.reply.answer(Ok(0));
    settle().await;
    assert_eq!(rec.drain(), vec![ok("h", 0)]);
}

#[tokio::test(start_paused = true)]
async fn host_down_fails_ready_and_plain_entries_and_keeps_queueable_ones() {
    let (q, mut calls, mut rec, writing) = entries_in_every_stage().await;

    q.host_down(&"h");
    settle().await;
    let mut fates = rec.drain();
    fates.sort_by_key(|o| o.payload);
    assert_eq!(
        fates,
        vec![
            failed("h", 1, "aborted"),
            failed("h", 10, "aborted"),
            failed("h", 11, "aborted"),
            failed("h", 12, "host down"),
        ]
    );
    // The entry being written is settled by its transport.
    finish_writing_0(writing, &mut rec).await;
    assert!(drain_calls(&mut calls).is_empty());

    q.host_up(&"h");
    settle().await;
    let kept = drain_calls(&mut calls);
    assert_eq!(payloads(&kept), vec![2]);
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn host_removal_fails_every_unsent_entry_queueable_ones_too() {
    let (q, _calls, mut rec, writing) = entries_in_every_stage().await;

    q.remove_host(&"h");
    settle().await;
    let mut fates = rec.drain();
    fates.sort_by_key(|o| o.payload);
    let expected: Vec<Outcome> = [1, 2, 10, 11, 12]
        .into_iter()
        .map(|p| failed("h", p, "removed"))
        .collect();
    assert_eq!(fates, expected);
    assert_eq!(q.stats(&"h", A), None);

    finish_writing_0(writing, &mut rec).await;
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_adds_with_one_stuck_worker_all_return_at_once() {
    let mut c = config(vec![TypeConfig::new("a", 5), TypeConfig::new("b", 1000)]);
    c.workers = 1;
    let (q, mut calls, mut rec) = queue_over(Manual::holding_writes(), c);
    q.add("stuck", A, 0, rec.callback()).unwrap();
    settle().await;
    let stuck = drain_calls(&mut calls);
    assert_eq!(stuck.len(), 1);
    let hosts = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
    for i in 1..=10_000u32 {
        let kind = if i % 2 == 0 { A } else { B };
        q.add(hosts[i as usize % 10], kind, i, rec.callback())
            .unwrap();
    }
    let mut counted = 0;
    for host in hosts {
        for kind in [A, B] {
            let s = q.stats(&host, kind).unwrap();
            counted += s.queued + s.in_flight;
        }
    }
    assert_eq!(counted, 10_000);
    settle().await;
    assert!(
        drain_calls(&mut calls).is_empty(),
        "the only worker is stuck"
    );
    q.shutdown().await;
    let fates = rec.drain();
    assert_eq!(fates.len(), 10_001);
    assert!(fates.iter().all(|o| o.result == Err("shutdown".into())));
    drop(stuck);
}

/// Adds entries 0 and 1 to host "h" of type `A` (window 1): 0 is sent, 1
/// queues behind it. The returned call is kept unanswered by the caller: a
/// dropped reply would fail the entry and free the window.
async fn one_sent_one_queued(
    q: &SendQueue<Host, u32, Manual>,
    calls: &mut tokio::sync::mpsc::UnboundedReceiver<common::Call>,
    rec: &Recorder,
) -> Vec<common::Call> {
    q.add("h", A, 0, rec.callback()).unwrap();
    q.add("h", A, 1, rec.callback()).unwrap();
    settle().await;
    let sent = drain_calls(calls);
    assert_eq!(payloads(&sent), vec![0]);
    sent
}

#[tokio::test(start_paused = true)]
async fn queued_entries_past_their_deadline_expire() {
    let t = TypeConfig::new("a", 1).deadline(Duration::from_secs(10));
    let (q, mut calls, mut rec) = queue_over(Manual::new(), config(vec![t]));
    let start = tokio::time::Instant::now();
    let sent = one_sent_one_queued(&q, &mut calls, &rec).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    q.add("h", A, 2, rec.callback()).unwrap();
    assert_eq!(
        q.stats(&"h", A).unwrap().oldest_queued,
        Some(start.elapsed())
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(rec.drain(), vec![failed("h", 1, "expired")]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(rec.drain(), vec![failed("h", 2, "expired")]);
    // A sent entry is past being queued: its deadline no longer applies.
    for call in sent {
        call.reply.answer(Ok(0));
    }
    settle().await;
    assert_eq!(rec.drain(), vec![ok("h", 0)]);
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_oldest_queued_age_counts_from_adding() {
    let (q, mut calls, rec) = queue_over(Manual::new(), config(vec![TypeConfig::new("a", 1)]));
    let start = tokio::time::Instant::now();
    let sent = one_sent_one_queued(&q, &mut calls, &rec).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = tokio::time::Instant::now();
    q.add("g", A, 2, rec.callback()).unwrap();
    q.add("g", A, 3, rec.callback()).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Entry 1 waits behind the unanswered 0; entry 3 behind 2.
    let stats = q.stats(&"h", A).unwrap();
    assert_eq!(stats.oldest_queued, Some(start.elapsed()));
    let stats = q.stats(&"g", A).unwrap();
    assert_eq!(stats.oldest_queued, Some(later.elapsed()));
    assert!(later.elapsed() < start.elapsed());
    q.shutdown().await;
    drop(sent);
}

/// Answers before its write is done, then waits for the test to finish the write.
struct AnswersFirst(tokio::sync::mpsc::UnboundedSender<tokio::sync::oneshot::Sender<()>>);

impl Transport<Host, u32> for AnswersFirst {
    type Answer = u32;
    async fn send(
        &self,
        request: Request<'_, Host, u32>,
        reply: Reply<u32>,
    ) -> Result<(), SendError> {
        reply.answer(Ok(*request.payload));
        let (written, wait) = tokio::sync::oneshot::channel();
        let _ = self.0.send(written);
        let _ = wait.await;
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_before_the_sent_event_completes_once_after_it() {
    let (tx, mut writes) = tokio::sync::mpsc::unbounded_channel();
    let q = SendQueue::new(config(vec![TypeConfig::new("a", 2)]), AnswersFirst(tx)).unwrap();
    let mut rec = Recorder::new();
    q.add("h", A, 7, rec.callback()).unwrap();
    settle().await;
    let written = writes.try_recv().unwrap();
    assert!(
        rec.drain().is_empty(),
        "not completed before the sent event"
    );
    assert_eq!(q.stats(&"h", A).unwrap().in_flight, 1);
    written.send(()).unwrap();
    settle().await;
    assert_eq!(rec.drain(), vec![ok("h", 7)]);
    assert_eq!(q.stats(&"h", A).unwrap().in_flight, 0);
    q.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_completion_can_add_an_aborted_entry_again_without_a_copy() {
    let types = vec![TypeConfig::new("keep", 4).queueable_if_down()];
    let (q, mut calls, mut rec) = queue_over(Manual::holding_writes(), QueueConfig::new(types));
    q.add("h", A, 1, rec.callback()).unwrap();
    let again = q.clone();
    let record = rec.callback();
    q.add("h", A, 2, move |done| {
        // Aborted while ready: the finalizer puts it back.
        assert!(matches!(done.result, Err(SendError::ConnectionAborted)));
        again
            .add(done.host, done.kind, done.payload, record)
            .unwrap();
    })
    .unwrap();
    settle().await;
    let writing = drain_calls(&mut calls);
    assert_eq!(payloads(&writing), vec![1]);
    q.host_down(&"h");
    settle().await;
    assert_eq!(
        q.stats(&"h", A).unwrap().queued,
        1,
        "re-added and kept while down"
    );
    q.host_up(&"h");
    for call in writing {
        call.written.unwrap().send(()).unwrap();
        call.reply.answer(Ok(1));
    }
    settle().await;
    let resent = drain_calls(&mut calls);
    assert_eq!(payloads(&resent), vec![2]);
    for call in resent {
        call.written.unwrap().send(()).unwrap();
        call.reply.answer(Ok(2));
    }
    settle().await;
    assert_eq!(rec.drain(), vec![ok("h", 1), ok("h", 2)]);
    q.shutdown().await;
}
