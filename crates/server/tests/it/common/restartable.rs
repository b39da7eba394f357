//! An in-process server on a data folder that outlives it, reading a clock
//! the test moves: for tests that restart the server and control time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use estafeta_client::Client;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::{ExchangeConfig, MessageId};
use estafeta_server::config::ClusterStore;
use estafeta_server::notify::NotifySettings;
use estafeta_server::{HttpSettings, ServeError, Server as Assembled};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::clock::ManualClock;
use super::{ADMIN_TOKEN, Store, Tenancy, id, on_loopback, wait_ready};

/// An in-process server on `data` reading `clock`.
pub(crate) struct Server {
    pub(crate) admin: Client,
    /// `http://127.0.0.1:<port>`.
    pub(crate) base: String,
    stop: CancellationToken,
    task: JoinHandle<Result<(), ServeError>>,
}

impl Server {
    pub(crate) async fn start(data: &Path, clock: &ManualClock) -> Server {
        Self::start_on(data, None, clock).await
    }

    /// [`Server::start`] over the `store` setting `store` (none: the
    /// embedded store under `data`).
    pub(crate) async fn start_on(data: &Path, store: Option<&str>, clock: &ManualClock) -> Server {
        Self::start_notified_on(data, store, clock, NotifySettings::log_only(data)).await
    }

    /// A server whose alerts and push notifications go out as `notify` says.
    pub(crate) async fn start_notified(
        data: &Path,
        clock: &ManualClock,
        notify: NotifySettings,
    ) -> Server {
        Self::start_notified_on(data, None, clock, notify).await
    }

    /// [`Server::start_notified`] over the `store` setting `store` (none:
    /// the embedded store under `data`).
    pub(crate) async fn start_notified_on(
        data: &Path,
        store: Option<&str>,
        clock: &ManualClock,
        notify: NotifySettings,
    ) -> Server {
        let server = reopen(data, store, clock, notify).await;
        let (_, base, stop, task) = on_loopback(server).await;
        let admin = Client::new(&base, ADMIN_TOKEN).unwrap();
        wait_ready(&admin).await;
        Server {
            admin,
            base,
            stop,
            task,
        }
    }

    pub(crate) async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }

    pub(crate) async fn queued(&self) -> Vec<MessageId> {
        self.queued_at("db-a").await
    }

    pub(crate) async fn queued_at(&self, mailbox: &str) -> Vec<MessageId> {
        let listing = self
            .admin
            .folder(&id(mailbox), Folder::Messages)
            .await
            .unwrap();
        listing.files.into_iter().map(|f| f.id).collect()
    }

    /// Waits until `wanted` is in db-a's queue (the scheduler looks at the
    /// clock at least once a second).
    pub(crate) async fn wait_queued(&self, wanted: MessageId) {
        for _ in 0..3000 {
            if self.queued().await.contains(&wanted) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{wanted} did not enter the queue");
    }
}

/// A new data folder, the `store` setting of a store (none: the embedded
/// store), a clock the test moves, a server on them and its provisioned
/// tenancy: what a test that restarts the server and moves time starts
/// from.
pub(crate) type Started = (
    tempfile::TempDir,
    Option<String>,
    ManualClock,
    Server,
    Tenancy,
);

/// [`Started`] on `store`, its alerts logged.
pub(crate) async fn started(store: Store) -> Started {
    started_notified(store, |data| NotifySettings::log_only(data)).await
}

/// [`Started`] on `store`, its alerts and push notifications sent as
/// `notify` (given the data folder) says.
pub(crate) async fn started_notified(
    store: Store,
    notify: impl FnOnce(&Path) -> NotifySettings,
) -> Started {
    let data = tempfile::tempdir().unwrap();
    let store = store.setting();
    let clock = ManualClock::now();
    let notify = notify(data.path());
    let server = Server::start_notified_on(data.path(), store.as_deref(), &clock, notify).await;
    let t = Tenancy::provision(&server.admin).await;
    (data, store, clock, server, t)
}

/// Opens the server on `data` over the `store` setting `store`; the last
/// run's tasks release the files a moment after it stopped, so a restart
/// tries a few times.
pub(crate) async fn reopen(
    data: &Path,
    store: Option<&str>,
    clock: &ManualClock,
    notify: NotifySettings,
) -> Assembled {
    for _ in 0..500 {
        let mut config = ExchangeConfig::new(data);
        config.admin_token = Some(ADMIN_TOKEN.to_owned());
        let (http, notify) = (HttpSettings::default(), notify.clone());
        let clock = Arc::new(clock.clone());
        let cluster = store.map(ClusterStore::new);
        match Assembled::open_with(config, clock, http, notify, cluster.as_ref(), None).await {
            Ok((server, _)) => return server,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    panic!("the data folder stayed locked");
}
