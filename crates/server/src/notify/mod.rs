//! Alerts delivered to administrators: the server's [`AlertSink`].
//!
//! The exchange raises an [`Alert`] when something needs a person (a process
//! in doubt or FAILED, orphans at start-up, a failed storage write); the
//! server adds free disk under a threshold ([`disk`]). The [`Notifier`]:
//!
//! 1. records the alert and its condition key durably ([`raised`]); a key
//!    already ongoing is not sent again until the exchange clears it (the
//!    process in doubt was settled, the FAILED one finished). The same
//!    store keeps which alerts an operator acknowledged: the dashboard's
//!    alert list and open count read it. A write the store cannot take
//!    (the cluster's database out of reach, a full disk) is tried again
//!    until it succeeds, in order with the later ones ([`record`]);
//! 2. schedules one delivery per configured channel (e-mail, SMS, webhook)
//!    in the repeat scheduler (`<data>/.estafeta/alerts-repeat.redb`), due at
//!    once; the schedule is durable before `raise` returns;
//! 3. the scheduler's handler sends it through the send queues
//!    ([`outbound`]); a failure is retried with exponential backoff (first
//!    wait [`NotifySettings::retry`], doubling up to an hour), and pending
//!    deliveries survive a restart.
//!
//! Delivery is at least once: a crash between the send and the removal of
//! the repeat entry sends that notice again after the restart.
//!
//! In cluster mode ([`Notifier::open_in`] with the cluster's store) the
//! alerts are [`estafeta_postgres::PgAlerts`] and the deliveries entries of
//! the shared repeat table, written with their alert in one transaction:
//! a condition that several nodes see is one alert and one delivery per
//! channel. Every node runs a scheduler on the table; a due delivery is
//! claimed by one of them for [`LEASE`] ([`estafeta_postgres::PgQueue`]),
//! and taken up by another node if the claimer dies.
//!
//! Push notifications to databases' and devices' webhooks ([`push`]) go
//! through the same HTTP send queue and host probes.

pub mod backlog;
pub mod disk;
pub mod outbound;
pub mod push;
pub mod raised;
pub mod record;
pub mod settings;
pub mod targets;

pub use backlog::{Backlog, LastErrors, Row};
pub use push::Pusher;
pub use raised::{AlertRecord, AlertStore, Raised, RaisedError};
pub use settings::{EmailChannel, NotifyConfigError, NotifySettings, SmsChannel};

use std::sync::Arc;
use std::time::Duration;

use estafeta_exchange::service::Listed;
use estafeta_exchange::store::WallClock;
use estafeta_exchange::{
    Alert, AlertKind, AlertSink, DataLayout, Exchange, Quiesce, Timestamp, alert_key,
};
use estafeta_repeat::store::Store as RepeatStore;
use estafeta_repeat::{
    Clock, Entry, Options, Outcome, RedbStore, RetryPolicy, Scheduler, WorkerPool,
};
use estafeta_sendq::{EmailMessage, ProbeRequest, SendError, SmsMessage, WebhookRequest};
use estafeta_session::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use outbound::{EMAIL, HttpOut, Outbound, PROBE, SMS, WEBHOOK, host_of};

/// The repeat source of alert deliveries.
pub const SOURCE: &str = "alerts";
/// The longest wait between two delivery attempts.
const MAX_RETRY: Duration = Duration::from_secs(3600);
/// Deliveries handled at once.
const WORKERS: usize = 4;
/// In cluster mode, how long a node that took a due delivery (an alert's,
/// a push notification's) holds it before another node may take it: longer
/// than a send takes while its host is up (the transports time out after
/// 30 s), and the longest a dead node's delivery waits.
pub const LEASE: Duration = Duration::from_secs(120);

/// The notifier could not start.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The open-alert store.
    #[error(transparent)]
    Raised(#[from] RaisedError),
    /// The repeat store.
    #[error("alert delivery store: {0}")]
    Repeat(#[from] estafeta_repeat::StoreError),
    /// A send queue or transport.
    #[error("alert transports: {0}")]
    Send(#[from] estafeta_sendq::ConfigError),
    /// The state folder.
    #[error("alert state folder: {0}")]
    Io(#[from] std::io::Error),
}

/// A channel alerts go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Channel {
    Email,
    Sms,
    Webhook,
}

/// A repeat entry's payload: one alert for one channel.
#[derive(Debug, Serialize, Deserialize)]
struct Delivery {
    channel: Channel,
    alert: Alert,
}

/// Sends alerts to the configured administrators. Cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

/// The alert deliveries' scheduler.
type AlertScheduler = Scheduler<Listed<dyn RepeatStore>, WallClock>;

struct Inner {
    settings: NotifySettings,
    /// The alerts, written in order and until each write is done.
    alerts: record::Recorder,
    scheduler: Arc<AlertScheduler>,
    /// The deliveries, read to list them (without claiming any).
    store: Arc<dyn RepeatStore>,
    /// Why each retrying delivery failed last.
    errors: LastErrors,
    outbound: Outbound,
}

impl Notifier {
    /// Opens the notifier's stores under `<data>/.estafeta/` (their writes
    /// paused by `quiesce`) and builds its send queues; its deliveries come
    /// due on `clock`. Must run inside the Tokio runtime.
    pub async fn open(
        settings: NotifySettings,
        clock: Arc<dyn estafeta_session::Clock>,
        quiesce: Quiesce,
    ) -> Result<Self, NotifyError> {
        Notifier::open_in(settings, clock, quiesce, None).await
    }

    /// [`Notifier::open`], keeping the alerts and their deliveries in
    /// `cluster`'s store (migrated) when given, instead of files under the
    /// data folder.
    pub async fn open_in(
        settings: NotifySettings,
        clock: Arc<dyn estafeta_session::Clock>,
        quiesce: Quiesce,
        cluster: Option<&estafeta_postgres::Store>,
    ) -> Result<Self, NotifyError> {
        let options = Options {
            retry: RetryPolicy {
                first: settings.retry,
                max: MAX_RETRY,
            },
            ..Options::default()
        };
        let (alerts, scheduler, store): (Arc<dyn AlertStore>, _, Arc<dyn RepeatStore>) =
            match cluster {
                Some(db) => {
                    let claiming: Arc<dyn RepeatStore> = Arc::new(
                        estafeta_postgres::PgQueue::claiming(db.clone(), &[SOURCE], LEASE),
                    );
                    let scheduler =
                        Arc::new(Scheduler::new(Listed(claiming), WallClock(clock), options));
                    (
                        Arc::new(estafeta_postgres::PgAlerts::new(db.clone())),
                        scheduler,
                        Arc::new(estafeta_postgres::PgQueue::new(db.clone(), &[SOURCE])),
                    )
                }
                None => {
                    let layout = DataLayout::new(&settings.data_dir);
                    tokio::fs::create_dir_all(layout.state_dir()).await?;
                    let raised = {
                        let (path, gate) = (layout.alerts(), quiesce.stores().clone());
                        tokio::task::spawn_blocking(move || Raised::open(&path, gate))
                            .await
                            .map_err(std::io::Error::other)??
                    };
                    let store: Arc<dyn RepeatStore> = {
                        let (path, gate) = (layout.alert_deliveries(), quiesce.stores().clone());
                        Arc::new(
                            tokio::task::spawn_blocking(move || RedbStore::open_gated(path, gate))
                                .await
                                .map_err(|e| {
                                    estafeta_repeat::StoreError::Backend(e.to_string().into())
                                })??,
                        )
                    };
                    let scheduler = Arc::new(Scheduler::new(
                        Listed(store.clone()),
                        WallClock(clock),
                        options,
                    ));
                    let alerts = LocalAlerts {
                        raised,
                        scheduler: scheduler.clone(),
                    };
                    (Arc::new(alerts), scheduler, store)
                }
            };
        let outbound = Outbound::new(
            settings.email.as_ref().map(|e| &e.smtp),
            settings.sms.as_ref().map(|s| &s.gateway),
            settings.webhook_private,
        )?;
        if let Some(url) = settings.webhook.as_deref()
            && let Some(host) = host_of(url)
        {
            // A refused alert webhook is not probed (its alerts fail, logged).
            match targets::refused(url, settings.webhook_private).await {
                None => outbound.note_host(&host),
                Some(why) => tracing::error!(why, "the alert webhook's target is refused"),
            }
        }
        Ok(Notifier {
            inner: Arc::new(Inner {
                settings,
                alerts: record::Recorder::new(alerts),
                scheduler,
                store,
                errors: LastErrors::default(),
                outbound,
            }),
        })
    }

    /// The send queues (shared with push notifications).
    pub fn outbound(&self) -> &Outbound {
        &self.inner.outbound
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &NotifySettings {
        &self.inner.settings
    }

    /// Pending alert deliveries (the first `limit`, soonest first), with
    /// their attempts and last error.
    pub async fn pending(&self, limit: usize) -> Result<Vec<Row>, estafeta_repeat::StoreError> {
        backlog::rows(&self.inner.store, SOURCE, limit, &self.inner.errors).await
    }

    /// The alert delivery backlog at the scheduler's clock.
    pub async fn backlog(&self) -> Result<Backlog, estafeta_repeat::StoreError> {
        let now = self.inner.scheduler.clock().now_secs();
        backlog::backlog(&self.inner.store, SOURCE, now).await
    }

    /// The newest `limit` alerts raised, newest first, ended and
    /// acknowledged or not.
    pub async fn alerts(&self, limit: usize) -> Result<Vec<AlertRecord>, RaisedError> {
        self.inner.alerts.store().list(limit).await
    }

    /// An operator acknowledged alert `id` at `at`.
    pub async fn acknowledge(&self, id: u64, at: Timestamp) -> Result<(), RaisedError> {
        self.inner.alerts.store().acknowledge(id, at).await
    }

    /// How many alerts no operator acknowledged yet.
    pub async fn unacknowledged(&self) -> Result<u64, RaisedError> {
        self.inner.alerts.store().unacknowledged().await
    }

    /// The configured channels.
    fn channels(&self) -> Vec<Channel> {
        let s = &self.inner.settings;
        let mut out = Vec::new();
        if s.email.is_some() {
            out.push(Channel::Email);
        }
        if s.sms.is_some() {
            out.push(Channel::Sms);
        }
        if s.webhook.is_some() {
            out.push(Channel::Webhook);
        }
        out
    }

    /// Delivers due alerts, watches the disk and probes the HTTP hosts
    /// until `stop` is cancelled; then stops the queues (queued alerts go
    /// back to the scheduler, to be sent after the restart).
    pub async fn run(&self, exchange: Exchange, stop: CancellationToken) {
        let disk = tokio::spawn(disk::watch(
            exchange.clone(),
            self.inner.settings.data_dir.clone(),
            self.inner.settings.disk_alert_bytes,
            self.inner.settings.disk_check,
            stop.clone(),
        ));
        let probes = tokio::spawn(self.clone().probe(exchange.clone(), stop.clone()));
        let queues = {
            let outbound = self.inner.outbound.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                stop.cancelled().await;
                // Sends waiting in the queues fail now, so the scheduler's
                // handlers finish and their entries stay for the next start.
                outbound.shutdown().await;
            })
        };
        let me = self.clone();
        let handler = move |entry: Entry| {
            let me = me.clone();
            async move { me.deliver(entry).await }
        };
        if let Err(e) = self
            .inner
            .scheduler
            .run(WorkerPool::new(WORKERS), handler, stop.cancelled())
            .await
        {
            tracing::error!(error = %e, "alert delivery stopped");
        }
        for task in [disk, probes, queues] {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "an alert task panicked");
            }
        }
        self.inner.scheduler.close().await;
    }

    /// One due delivery: send it, or fail it for a retry with backoff.
    async fn deliver(&self, entry: Entry) -> Outcome {
        let delivery: Delivery = match serde_json::from_slice(&entry.payload) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(id = entry.id, error = %e, "unreadable alert delivery dropped");
                return Outcome::Done;
            }
        };
        let key = delivery.alert.key.clone();
        match self.send(&delivery).await {
            Ok(true) => {
                self.inner.errors.clear(&entry.id);
                tracing::info!(key, channel = ?delivery.channel, "alert delivered");
                Outcome::Done
            }
            Ok(false) => {
                self.inner.errors.clear(&entry.id);
                tracing::warn!(key, channel = ?delivery.channel, "alert channel no longer configured; delivery dropped");
                Outcome::Done
            }
            Err(e) => {
                self.inner.errors.set(&entry.id, e.to_string());
                tracing::warn!(key, channel = ?delivery.channel, attempt = entry.attempt + 1, error = %e, "alert delivery failed; will retry");
                Outcome::Failed(e.to_string())
            }
        }
    }

    /// Sends through the channel's queue; `Ok(false)` if it is not configured.
    async fn send(&self, d: &Delivery) -> Result<bool, SendError> {
        let s = &self.inner.settings;
        let q = &self.inner.outbound;
        let subject = format!("[estafeta] {}: {}", d.alert.kind, d.alert.key);
        let text = format!("{}\n\nraised at {}", d.alert.text, d.alert.raised_at);
        match d.channel {
            Channel::Email => {
                let (Some(c), Some(queue)) = (&s.email, &q.email) else {
                    return Ok(false);
                };
                let mail = EmailMessage {
                    to: c.to.clone(),
                    subject,
                    body: text,
                };
                queue.submit("smtp".to_owned(), EMAIL, mail)?.await?;
            }
            Channel::Sms => {
                let Some(c) = &s.sms else {
                    return Ok(false);
                };
                let host = host_of(&c.gateway.url).unwrap_or_default();
                q.note_host(&host);
                let pending: Vec<_> =
                    c.to.iter()
                        .map(|to| {
                            let sms = SmsMessage {
                                recipient: to.clone(),
                                text: format!("{subject}: {}", d.alert.text),
                            };
                            q.http.submit(host.clone(), SMS, HttpOut::Sms(sms))
                        })
                        .collect::<Result<_, _>>()?;
                for p in pending {
                    p.await?;
                }
            }
            Channel::Webhook => {
                let Some(url) = &s.webhook else {
                    return Ok(false);
                };
                let body = serde_json::json!({
                    "version": 1,
                    "alert": d.alert,
                });
                let call = WebhookRequest {
                    url: url.clone(),
                    body,
                };
                if let Some(why) = targets::refused(url, s.webhook_private).await {
                    return Err(SendError::Config(estafeta_sendq::ConfigError::Invalid {
                        what: "alert webhook",
                        reason: why,
                    }));
                }
                let host = host_of(url).unwrap_or_default();
                q.note_host(&host);
                q.http
                    .submit(host, WEBHOOK, HttpOut::Webhook(call))?
                    .await?;
            }
        }
        Ok(true)
    }

    /// Probes the HTTP hosts in use (the SMS gateway, the alert webhook,
    /// the push webhooks sent to) every [`NotifySettings::probe`] (when not
    /// zero); the send queue marks a host down after failed probes and up
    /// again on a good one. A host found down raises a `host_down` alert
    /// (sent through the other channels at once, through its own when it
    /// is back), cleared when it is up again.
    async fn probe(self, exchange: Exchange, stop: CancellationToken) {
        let period = self.inner.settings.probe;
        if period.is_zero() {
            return stop.cancelled().await;
        }
        let mut tick = tokio::time::interval(period);
        let mut down = std::collections::HashSet::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            for host in &self.inner.outbound.http_hosts() {
                // What the probes sent so far decided.
                match self.inner.outbound.http.is_down(host) {
                    Some(true) if down.insert(host.clone()) => {
                        let text = format!(
                            "the host {host} fails its health probes; alerts and push notifications for it wait until it is back"
                        );
                        let alert = Alert::new(AlertKind::HostDown, host, text, exchange.now());
                        exchange.raise_alert(alert).await;
                    }
                    Some(false) if down.remove(host) => {
                        exchange
                            .clear_alert(alert_key(AlertKind::HostDown, host))
                            .await;
                    }
                    _ => {}
                }
                let probe = HttpOut::Probe(ProbeRequest {
                    url: format!("{host}/"),
                });
                // Busy: the last probe of this host is still out.
                if let Ok(pending) = self.inner.outbound.http.submit(host.clone(), PROBE, probe) {
                    tokio::spawn(pending);
                }
            }
        }
    }

    /// The deliveries of `alert`, one per channel, due now.
    fn deliveries(&self, alert: &Alert) -> Vec<Entry> {
        let due = self.inner.scheduler.clock().now_secs();
        let mut entries = Vec::new();
        for channel in self.channels() {
            let payload = match serde_json::to_vec(&Delivery {
                channel,
                alert: alert.clone(),
            }) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "encoding an alert failed");
                    continue;
                }
            };
            entries.push(Entry {
                source: SOURCE.to_owned(),
                due,
                id: format!("{channel:?}/{}", alert.key),
                payload,
                attempt: 0,
            });
        }
        entries
    }

    /// The notifier's clock now, as a timestamp.
    fn now(&self) -> Timestamp {
        let now = self.inner.scheduler.clock().now();
        Timestamp::from_millis(i64::try_from(now.as_millis()).unwrap_or(i64::MAX))
    }
}

impl AlertSink for Notifier {
    fn raise(&self, alert: Alert) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let entries = self.deliveries(&alert);
            self.inner.alerts.raise(alert, entries).await;
        })
    }

    fn clear(&self, key: String) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.inner.alerts.close(key, self.now()).await;
        })
    }

    fn raise_in_step(&self, step: &mut dyn estafeta_session::Step, alert: &Alert) -> bool {
        let entries = self.deliveries(alert);
        self.inner
            .alerts
            .store()
            .raise_in_step(step, alert, &entries)
    }

    fn clear_in_step(&self, step: &mut dyn estafeta_session::Step, key: &str) -> bool {
        self.inner
            .alerts
            .store()
            .close_in_step(step, key, self.now())
    }
}

/// The alerts of the embedded store: [`Raised`], and the deliveries in the
/// notifier's own repeat store.
struct LocalAlerts {
    raised: Raised,
    scheduler: Arc<AlertScheduler>,
}

impl AlertStore for LocalAlerts {
    fn raise<'a>(
        &'a self,
        alert: &'a Alert,
        deliveries: Vec<Entry>,
    ) -> BoxFuture<'a, Result<bool, RaisedError>> {
        Box::pin(async move {
            if self.raised.is_open(&alert.key).await? {
                return Ok(false);
            }
            // Scheduled before the key is marked open (two files, two
            // transactions): a crash in between may send twice, never not
            // at all.
            self.scheduler
                .schedule_all(deliveries)
                .await
                .map_err(|e| RaisedError::Store(format!("scheduling its delivery: {e}")))?;
            self.raised.open_alert(alert).await
        })
    }

    fn close<'a>(
        &'a self,
        key: &'a str,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<bool, RaisedError>> {
        Box::pin(self.raised.close(key, at))
    }

    fn acknowledge(&self, id: u64, at: Timestamp) -> BoxFuture<'_, Result<(), RaisedError>> {
        Box::pin(self.raised.acknowledge(id, at))
    }

    fn list(&self, limit: usize) -> BoxFuture<'_, Result<Vec<AlertRecord>, RaisedError>> {
        Box::pin(self.raised.list(limit))
    }

    fn unacknowledged(&self) -> BoxFuture<'_, Result<u64, RaisedError>> {
        Box::pin(self.raised.unacknowledged())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What every alert store does, `deliveries` counting the scheduled
    /// deliveries: a condition is one alert (and one set of deliveries)
    /// while it lasts; ended, it is a new one; acknowledgements keep their
    /// first time.
    async fn an_alert_store_records_each_condition_once(
        alerts: &dyn AlertStore,
        deliveries: impl Fn() -> u64,
    ) {
        let t = Timestamp::from_millis;
        let a = Alert::new(AlertKind::InDoubt, "p1", "t", t(1));
        let entry = Entry {
            source: SOURCE.to_owned(),
            due: 1,
            id: format!("Email/{}", a.key),
            payload: b"{}".to_vec(),
            attempt: 0,
        };
        assert!(alerts.raise(&a, vec![entry.clone()]).await.unwrap());
        assert!(!alerts.raise(&a, vec![entry.clone()]).await.unwrap());
        assert_eq!(deliveries(), 1);
        assert_eq!(alerts.unacknowledged().await.unwrap(), 1);
        let first = alerts.list(10).await.unwrap()[0].id;
        alerts.acknowledge(first, t(5)).await.unwrap();
        alerts.acknowledge(first, t(6)).await.unwrap();
        assert!(matches!(
            alerts.acknowledge(first + 100, t(6)).await,
            Err(RaisedError::Unknown(_))
        ));
        // Acknowledged while it lasts: still not news again.
        assert!(!alerts.raise(&a, vec![entry.clone()]).await.unwrap());
        assert_eq!(alerts.unacknowledged().await.unwrap(), 0);
        assert!(alerts.close(&a.key, t(7)).await.unwrap());
        assert!(!alerts.close(&a.key, t(8)).await.unwrap());
        // Ended, the same condition is a new alert.
        assert!(alerts.raise(&a, vec![entry]).await.unwrap());
        let list = alerts.list(10).await.unwrap();
        assert_eq!(list.len(), 2);
        assert!(list[0].id > list[1].id);
        assert_eq!((list[0].ended_at, list[0].acked_at), (None, None));
        assert_eq!(list[0].alert, a);
        assert_eq!(
            (list[1].ended_at, list[1].acked_at),
            (Some(t(7)), Some(t(5)))
        );
        assert_eq!(alerts.unacknowledged().await.unwrap(), 1);
    }

    fn count(store: &Arc<dyn RepeatStore>) -> u64 {
        let store = store.clone();
        std::thread::spawn(move || store.count(SOURCE, u64::MAX).unwrap().entries)
            .join()
            .unwrap()
    }

    #[tokio::test]
    async fn embedded_alerts_record_each_condition_once() {
        let dir = tempfile::tempdir().unwrap();
        let raised = Raised::open(&dir.path().join("alerts.redb"), Default::default()).unwrap();
        let store: Arc<dyn RepeatStore> =
            Arc::new(RedbStore::open(dir.path().join("alerts-repeat.redb")).unwrap());
        let scheduler = Arc::new(Scheduler::new(
            Listed(store.clone()),
            WallClock(Arc::new(estafeta_session::SystemClock)),
            Options::default(),
        ));
        let alerts = LocalAlerts { raised, scheduler };
        an_alert_store_records_each_condition_once(&alerts, || count(&store)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_alerts_record_each_condition_once() {
        let pg = estafeta_postgres::testing::Postgres::start().unwrap();
        let db = estafeta_postgres::Store::connect(&pg.url()).unwrap();
        db.migrate().await.unwrap();
        let store: Arc<dyn RepeatStore> =
            Arc::new(estafeta_postgres::PgQueue::new(db.clone(), &[SOURCE]));
        let alerts = estafeta_postgres::PgAlerts::new(db);
        an_alert_store_records_each_condition_once(&alerts, || count(&store)).await;
    }
}
