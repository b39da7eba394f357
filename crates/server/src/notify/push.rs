//! [`Pusher`]: push notifications to the webhooks of databases and devices,
//! the server's [`PushSink`].
//!
//! When a message lands in a recipient's `Messages` (durably) and the
//! recipient has a webhook, the exchange calls [`PushSink::arrived`]. The
//! pusher then:
//!
//! 1. coalesces: while a notification for that recipient is pending
//!    (scheduled, queued, unanswered or retrying) a new arrival only marks
//!    it "again", and one more notification goes after it settles, so a
//!    burst of any size costs at most two POSTs;
//! 2. otherwise schedules one in the repeat scheduler
//!    (`<data>/.estafeta/push-repeat.redb`, on the exchange's clock), due at
//!    once, so that a pending push survives a restart;
//! 3. the scheduler's handler POSTs `{"version":1,"event":"messages_waiting",
//!    "recipient","kind","at"}` (never a message body) to the webhook read
//!    at that moment, through the HTTP send queue's `push` type (its own
//!    window; queueable while the host is down; the host's health probes
//!    decide down and up); a failure is retried with exponential backoff.
//!
//! The arrival call itself only takes a lock and, for the first arrival of
//! a burst, spawns the durable scheduling: it never blocks a protocol call.
//! A crash between an arrival and that write would lose the notification;
//! start-up processing therefore pushes every recipient whose `Messages`
//! still holds something (at least once: one notification more at most).
//!
//! In cluster mode ([`Pusher::open_in`] with the cluster's store) the
//! pending notifications are entries of the shared repeat table, and the
//! coalescing is done there rather than in one node's memory, since the
//! node that delivers a notification need not be the one that scheduled
//! it: a recipient has at most one pending notification (`<kind>/<id>`),
//! and an arrival while it is pending adds at most one more
//! (`<kind>/<id>/again`), so a burst through any nodes still costs at most
//! two POSTs. Each is written through the node's own scheduler, which is
//! woken by it as by an embedded store's; the other nodes find it at their
//! next look, within a second. Each due notification is claimed by one node
//! ([`estafeta_postgres::PgQueue`]): one POST per notification, not one per
//! node. The webhooks are the registry's, shared by the nodes: the node
//! that sends reads the registry's changes first
//! ([`Exchange::current_webhook`]), so a notification goes to the webhook
//! set last through any node, and none goes once it was cleared.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use estafeta_exchange::Quiesce;
use estafeta_exchange::service::Listed;
use estafeta_exchange::store::WallClock;
use estafeta_exchange::{DataLayout, Exchange, Id, PushSink, RecipientKind};
use estafeta_repeat::store::Store as RepeatStore;
use estafeta_repeat::{Entry, Options, Outcome, RedbStore, RetryPolicy, Scheduler, WorkerPool};
use estafeta_sendq::WebhookRequest;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::backlog::{self, Backlog, LastErrors, Row};
use super::outbound::{HttpOut, Outbound, PUSH, host_of};
use super::{LEASE, Notifier, NotifyError};

/// The repeat source of push notifications.
pub const SOURCE: &str = "push";
/// The longest wait between two attempts.
const MAX_RETRY: Duration = Duration::from_secs(3600);
/// Notifications handled at once.
const WORKERS: usize = 8;

/// A repeat entry's payload: whom to notify.
#[derive(Debug, Serialize, Deserialize)]
struct Push {
    recipient: Id,
    kind: RecipientKind,
}

/// Sends push notifications. Cheap to clone.
#[derive(Clone)]
pub struct Pusher {
    inner: Arc<Inner>,
}

struct Inner {
    outbound: Outbound,
    scheduler: Scheduler<Listed<dyn RepeatStore>, WallClock>,
    /// The notifications, read to list them (without claiming any).
    store: Arc<dyn RepeatStore>,
    /// Cluster mode: pending notifications are coalesced in the store.
    shared: bool,
    errors: LastErrors,
    /// Recipients with a notification pending → whether more arrived since.
    pending: Mutex<HashMap<Id, bool>>,
    /// Makes entry ids unique within a millisecond.
    seq: AtomicU64,
}

impl Pusher {
    /// Opens the push store under `<data>/.estafeta/` and sends through the
    /// notifier's queues, retrying after the notifier's first wait, on the
    /// exchange's `clock`, its writes paused by `quiesce`. Notifications
    /// pending from an earlier run are picked up.
    pub async fn open(
        notifier: &Notifier,
        clock: Arc<dyn estafeta_session::Clock>,
        quiesce: Quiesce,
    ) -> Result<Self, NotifyError> {
        Pusher::open_in(notifier, clock, quiesce, None).await
    }

    /// [`Pusher::open`], keeping the pending notifications in `cluster`'s
    /// store (migrated) when given, instead of a file under the data folder.
    pub async fn open_in(
        notifier: &Notifier,
        clock: Arc<dyn estafeta_session::Clock>,
        quiesce: Quiesce,
        cluster: Option<&estafeta_postgres::Store>,
    ) -> Result<Self, NotifyError> {
        let options = Options {
            retry: RetryPolicy {
                first: notifier.settings().retry,
                max: MAX_RETRY,
            },
            ..Options::default()
        };
        let (scheduled, store): (Arc<dyn RepeatStore>, Arc<dyn RepeatStore>) = match cluster {
            Some(db) => (
                Arc::new(estafeta_postgres::PgQueue::claiming(
                    db.clone(),
                    &[SOURCE],
                    LEASE,
                )),
                Arc::new(estafeta_postgres::PgQueue::new(db.clone(), &[SOURCE])),
            ),
            None => {
                let path = DataLayout::new(&notifier.settings().data_dir).push_deliveries();
                let gate = quiesce.stores().clone();
                let store: Arc<dyn RepeatStore> = Arc::new(
                    tokio::task::spawn_blocking(move || RedbStore::open_gated(path, gate))
                        .await
                        .map_err(|e| {
                            estafeta_repeat::StoreError::Backend(e.to_string().into())
                        })??,
                );
                (store.clone(), store)
            }
        };
        let scheduler = Scheduler::new(Listed(scheduled), WallClock(clock), options);
        // What an earlier run left pending is pending now: arrivals for
        // those recipients coalesce into it. (Cluster mode coalesces in
        // the store.)
        let pending = if cluster.is_some() {
            HashMap::new()
        } else {
            let listed = Listed(store.clone());
            let earlier = tokio::task::spawn_blocking(move || listed.entries(SOURCE, usize::MAX))
                .await
                .map_err(|e| estafeta_repeat::StoreError::Backend(e.to_string().into()))??;
            earlier
                .iter()
                .filter_map(|e| serde_json::from_slice::<Push>(&e.payload).ok())
                .map(|p| (p.recipient, false))
                .collect()
        };
        let pusher = Pusher {
            inner: Arc::new(Inner {
                outbound: notifier.outbound().clone(),
                scheduler,
                store,
                shared: cluster.is_some(),
                errors: LastErrors::default(),
                pending: Mutex::new(pending),
                seq: AtomicU64::new(0),
            }),
        };
        Ok(pusher)
    }

    /// Sends due notifications to the webhooks `exchange` knows until `stop`
    /// is cancelled, and every `probe` (when not zero) looks for webhook
    /// hosts that came back up. Start it once start-up processing is done
    /// (the webhooks are known then).
    pub async fn run(&self, exchange: Exchange, probe: Duration, stop: CancellationToken) {
        let me = self.clone();
        let ex = exchange.clone();
        let handler = move |entry: Entry| {
            let (me, ex) = (me.clone(), ex.clone());
            async move { me.deliver(&ex, entry).await }
        };
        let hosts = stop.child_token();
        let watcher = tokio::spawn(self.clone().watch_hosts(exchange, probe, hosts.clone()));
        if let Err(e) = self
            .inner
            .scheduler
            .run(WorkerPool::new(WORKERS), handler, stop.cancelled())
            .await
        {
            tracing::error!(error = %e, "push delivery stopped");
        }
        hosts.cancel();
        if let Err(e) = watcher.await {
            tracing::error!(error = %e, "the push host watcher panicked");
        }
        self.close().await;
    }

    /// Stops accepting new notifications and releases the store once the
    /// last write is durable (what is pending stays for the next start).
    pub async fn close(&self) {
        self.inner.scheduler.close().await;
    }

    /// A host that was down and is up again gets its notifications at
    /// once, rather than when their backoff runs out (attempts restart).
    async fn watch_hosts(self, exchange: Exchange, period: Duration, stop: CancellationToken) {
        if period.is_zero() {
            return stop.cancelled().await;
        }
        let mut tick = tokio::time::interval(period);
        let mut down = HashSet::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            for host in self.inner.outbound.http_hosts() {
                match self.inner.outbound.http.is_down(&host) {
                    Some(true) => {
                        down.insert(host);
                    }
                    _ if down.remove(&host) => self.hurry(&exchange, &host).await,
                    _ => {}
                }
            }
        }
    }

    /// Makes the notifications for `host` that wait for a retry due now
    /// (in cluster mode, those waiting longer than a lease).
    async fn hurry(&self, exchange: &Exchange, host: &str) {
        use estafeta_repeat::Clock;
        let now = self.inner.scheduler.clock().now_secs();
        let listed = Listed(self.inner.store.clone());
        let entries =
            match tokio::task::spawn_blocking(move || listed.entries(SOURCE, usize::MAX)).await {
                Ok(Ok(entries)) => entries,
                Ok(Err(e)) => return tracing::error!(error = %e, "reading pending pushes failed"),
                Err(e) => return tracing::error!(error = %e, "reading pending pushes failed"),
            };
        // Cluster mode: an entry a node has claimed is due at the end of
        // its lease; it is being sent, and made due now another node would
        // send it too. Retries due within a lease go at their time.
        let after = if self.inner.shared {
            now.saturating_add(LEASE.as_secs())
        } else {
            now
        };
        for entry in entries.iter().filter(|e| e.due > after) {
            let for_host = serde_json::from_slice::<Push>(&entry.payload)
                .ok()
                .and_then(|p| exchange.webhook(&p.recipient))
                .and_then(|(_, url)| host_of(&url))
                .is_some_and(|h| h == host);
            if for_host && let Err(e) = self.inner.scheduler.reschedule(&entry.id, now).await {
                tracing::error!(error = %e, "rescheduling a push failed");
            }
        }
        tracing::info!(
            host,
            "webhook host is up; its waiting push notifications go now"
        );
    }

    /// Pending notifications (the first `limit`, soonest first), with their
    /// attempts and last error.
    pub async fn pending(&self, limit: usize) -> Result<Vec<Row>, estafeta_repeat::StoreError> {
        backlog::rows(&self.inner.store, SOURCE, limit, &self.inner.errors).await
    }

    /// The push backlog at the exchange's clock.
    pub async fn backlog(&self) -> Result<Backlog, estafeta_repeat::StoreError> {
        use estafeta_repeat::Clock;
        let now = self.inner.scheduler.clock().now_secs();
        backlog::backlog(&self.inner.store, SOURCE, now).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Id, bool>> {
        self.inner
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Schedules a notification for `recipient`, due now; on failure the
    /// recipient is no longer pending (the next arrival tries again).
    async fn schedule(self, recipient: Id, kind: RecipientKind) {
        use estafeta_repeat::Clock;
        let now = self.inner.scheduler.clock();
        let id = format!(
            "{}/{recipient}/{}-{}",
            kind.as_str(),
            now.now().as_millis(),
            self.inner.seq.fetch_add(1, Ordering::Relaxed)
        );
        let scheduled = match serde_json::to_vec(&Push {
            recipient: recipient.clone(),
            kind,
        }) {
            Ok(payload) => self
                .inner
                .scheduler
                .schedule(SOURCE, now.now_secs(), &id, &payload)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = scheduled {
            tracing::error!(%recipient, error = %e, "scheduling a push notification failed");
            self.lock().remove(&recipient);
        }
    }

    /// Cluster mode: a notification for `recipient`, due now, unless one
    /// is pending; then one more after it, unless that one is pending too.
    async fn schedule_shared(self, recipient: Id, kind: RecipientKind) {
        use estafeta_repeat::Clock;
        let due = self.inner.scheduler.clock().now_secs();
        let payload = match serde_json::to_vec(&Push {
            recipient: recipient.clone(),
            kind,
        }) {
            Ok(payload) => payload,
            Err(e) => {
                return tracing::error!(%recipient, error = %e, "encoding a push notification failed");
            }
        };
        let first = format!("{}/{recipient}", kind.as_str());
        // Through this node's scheduler, which is woken when one is
        // written; the other nodes' find it at their next look.
        let scheduler = &self.inner.scheduler;
        let written = match scheduler
            .schedule_if_absent(SOURCE, due, &first, &payload)
            .await
        {
            Ok(false) => scheduler
                .schedule_if_absent(SOURCE, due, &format!("{first}/again"), &payload)
                .await
                .map(drop),
            other => other.map(drop),
        };
        if let Err(e) = written {
            tracing::error!(%recipient, error = %e, "scheduling a push notification failed");
        }
    }

    /// One due notification: sent, or failed for a retry with backoff.
    async fn deliver(&self, exchange: &Exchange, entry: Entry) -> Outcome {
        let push: Push = match serde_json::from_slice(&entry.payload) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(id = entry.id, error = %e, "unreadable push notification dropped");
                return Outcome::Done;
            }
        };
        let known = match exchange.current_webhook(&push.recipient).await {
            Ok(known) => known,
            Err(e) => {
                tracing::warn!(recipient = %push.recipient, attempt = entry.attempt + 1, error = %e, "reading the webhook failed; will retry");
                self.inner.errors.set(&entry.id, e.to_string());
                return Outcome::Failed(e.to_string());
            }
        };
        let Some((kind, url)) = known else {
            tracing::info!(recipient = %push.recipient, "webhook cleared; push notification dropped");
            return self.settled(&entry, &push.recipient);
        };
        let Some(host) = host_of(&url) else {
            tracing::error!(recipient = %push.recipient, url, "webhook url has no host; push notification dropped");
            return self.settled(&entry, &push.recipient);
        };
        // A refused target (one stored before webhook_private said deny)
        // is neither sent to nor noted for the probes; a name's addresses
        // are checked again as the client resolves it.
        if let Some(why) = super::targets::refused(&url, self.inner.outbound.webhook_private).await
        {
            tracing::error!(recipient = %push.recipient, why, "webhook target refused; push notification dropped");
            return self.settled(&entry, &push.recipient);
        }
        self.inner.outbound.note_host(&host);
        let body = serde_json::json!({
            "version": 1,
            "event": "messages_waiting",
            "recipient": push.recipient,
            "kind": kind,
            "at": exchange.now(),
        });
        let call = HttpOut::Webhook(WebhookRequest { url, body });
        let sent = match self.inner.outbound.http.submit(host, PUSH, call) {
            Ok(pending) => pending.await,
            Err(e) => Err(e),
        };
        match sent {
            Ok(_) => {
                tracing::info!(target: "estafeta::event", recipient = %push.recipient, "push notification delivered");
                self.settled(&entry, &push.recipient)
            }
            Err(e) => {
                tracing::warn!(recipient = %push.recipient, attempt = entry.attempt + 1, error = %e, "push notification failed; will retry");
                self.inner.errors.set(&entry.id, e.to_string());
                Outcome::Failed(e.to_string())
            }
        }
    }

    /// The notification settled: one more goes if messages arrived since
    /// it was scheduled, else the recipient is no longer pending.
    fn settled(&self, entry: &Entry, recipient: &Id) -> Outcome {
        use estafeta_repeat::Clock;
        self.inner.errors.clear(&entry.id);
        if self.inner.shared {
            return Outcome::Done;
        }
        let mut pending = self.lock();
        match pending.get_mut(recipient) {
            Some(again) if *again => {
                *again = false;
                Outcome::Reschedule(self.inner.scheduler.clock().now_secs())
            }
            _ => {
                pending.remove(recipient);
                Outcome::Done
            }
        }
    }
}

impl PushSink for Pusher {
    fn arrived(&self, recipient: &Id, kind: RecipientKind) {
        if self.inner.shared {
            tokio::spawn(self.clone().schedule_shared(recipient.clone(), kind));
            return;
        }
        {
            let mut pending = self.lock();
            if let Some(again) = pending.get_mut(recipient) {
                *again = true;
                return;
            }
            pending.insert(recipient.clone(), false);
        }
        tokio::spawn(self.clone().schedule(recipient.clone(), kind));
    }
}
