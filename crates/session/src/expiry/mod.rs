//! The expiry manager: one task that finalizes expired sessions and flushes
//! idle ones out of memory.
//!
//! It owns the expiry index outright. Releases do not message it: each
//! shard lists the keys released since the manager last looked, and the
//! manager reads their times from the cache when it wakes (at the next
//! deadline, at most a second later, or at once when a release brings a
//! deadline earlier than the one it sleeps towards). So the hot path pays
//! one vector push per released key, at most once per key per look.

use crate::clock::Timestamp;
use crate::data::State;
use crate::index::ExpiryIndex;
use crate::key::SessionKey;
use crate::shared::Shared;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;

pub(crate) mod message;

use message::{ExpiryMsg, Flushed};

/// The longest the manager sleeps without looking again, so that releases
/// reach the index and a wall-clock step is noticed within a second.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// A session announced while already due is looked at again this much later
/// (its finalization is running, was kept without a new deadline, or
/// failed), so that the manager never spins on it.
const DUE_AGAIN: Duration = Duration::from_secs(1);

fn touch<K: SessionKey, I: ExpiryIndex<K>>(
    index: &mut I,
    key: &K,
    expires_at: Option<Timestamp>,
    last_access: Timestamp,
    now: Timestamp,
) {
    let expires_at = expires_at.map(|t| if t <= now { now.after(DUE_AGAIN) } else { t });
    index.touch(key, expires_at, Some(last_access));
}

pub(crate) async fn run<K: SessionKey, S: State, I: ExpiryIndex<K>>(
    shared: Weak<Shared<K, S>>,
    mut index: I,
    mut rx: mpsc::UnboundedReceiver<ExpiryMsg<K>>,
) {
    let mut due = Vec::new();
    let mut idle = Vec::new();
    let mut touched = Vec::new();
    let Some(wake) = shared.upgrade().map(|e| e.core().wake_expiry.clone()) else {
        return;
    };
    loop {
        let Some(engine) = shared.upgrade() else {
            return;
        };
        let now = engine.core().now();
        loop {
            match rx.try_recv() {
                Ok(ExpiryMsg::Remove(key)) => index.remove(&key),
                Ok(ExpiryMsg::Stop) | Err(mpsc::error::TryRecvError::Disconnected) => return,
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
        if engine.core().stopping.load(Ordering::SeqCst) {
            return;
        }
        engine.drain_touched(now, &mut touched);
        for (key, expires_at, last_access) in touched.drain(..) {
            touch(&mut index, &key, expires_at, last_access, now);
        }

        index.take_expired(now, &mut due);
        if engine.core().shared {
            due.extend(engine.due_in_store(now).await);
        }
        for key in due.drain(..) {
            engine.expire_key(key).await;
        }

        let limit = engine.core().config.flush_count_limit;
        let time_limit = engine.core().config.flush_time_limit;
        if index.resident() > limit {
            index.take_idle(None, index.resident() - limit * 9 / 10, &mut idle);
        } else if index
            .oldest_idle()
            .is_some_and(|t| now.since(t) >= time_limit)
        {
            let before = now.before(time_limit).after(Duration::from_millis(1));
            index.take_idle(Some(before), usize::MAX, &mut idle);
        }
        for (key, last_access) in idle.drain(..) {
            match engine.flush_key(key.clone(), last_access, now).await {
                Flushed::Done | Flushed::Skipped => {}
                // Looked at again a flush period from now, not at once.
                Flushed::KeepResident(e) => index.touch(&key, e, Some(now)),
                Flushed::Forget => index.remove(&key),
            }
        }

        let now = engine.core().now();
        let next = [
            index.next_expiry(),
            index.oldest_idle().map(|t| t.after(time_limit)),
        ]
        .into_iter()
        .flatten()
        .min();
        let wait = next.map_or(MAX_SLEEP, |t| t.since(now).min(MAX_SLEEP));
        engine
            .core()
            .next_wake
            .store(now.after(wait).0, Ordering::Relaxed);
        drop(engine);
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(ExpiryMsg::Remove(key)) => index.remove(&key),
                Some(ExpiryMsg::Stop) | None => return,
            },
            _ = wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
