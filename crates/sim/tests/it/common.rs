//! The shared harness of the simulator tests: the server library's `Server` on
//! a loopback port-0 listener over a temporary data folder, and a
//! provisioned enterprise.

use std::sync::Arc;
use std::time::Duration;

use estafeta_client::Client;
use estafeta_exchange::ExchangeConfig;
use estafeta_server::notify::NotifySettings;
use estafeta_server::{HttpSettings, ServeError, Server};
use estafeta_wire::{Folder, Id, MessageId};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The admin token of the test servers.
pub(crate) const ADMIN_TOKEN: &str = "sim-test-admin-token-0123456789";

pub(crate) fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

/// A running server on 127.0.0.1:0.
pub(crate) struct TestServer {
    pub(crate) data: tempfile::TempDir,
    pub(crate) admin: Client,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl TestServer {
    /// A ready server whose exchange settings are `tweak`ed.
    pub(crate) async fn start(tweak: impl FnOnce(&mut ExchangeConfig)) -> TestServer {
        let data = tempfile::tempdir().unwrap();
        let mut config = ExchangeConfig::new(data.path());
        config.admin_token = Some(ADMIN_TOKEN.to_owned());
        tweak(&mut config);
        let (server, _) = Server::open(
            config,
            Arc::new(estafeta_session::SystemClock),
            HttpSettings::default(),
            NotifySettings::log_only(data.path()),
        )
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let task = tokio::spawn(server.run(listener, stop.clone()));
        let admin = Client::new(&base, ADMIN_TOKEN).unwrap();
        for _ in 0..1000 {
            if admin.readyz().await.unwrap() {
                return TestServer {
                    data,
                    admin,
                    stop,
                    task: Some(task),
                };
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the server did not become ready");
    }

    /// Stops the server and waits for it.
    pub(crate) async fn stop(mut self) {
        self.stop.cancel();
        self.task.take().unwrap().await.unwrap().unwrap();
    }

    /// The ids of the files in `folder` of `mailbox`.
    pub(crate) async fn folder(&self, mailbox: &str, folder: Folder) -> Vec<MessageId> {
        let listing = self.admin.folder(&id(mailbox), folder).await.unwrap();
        listing.files.into_iter().map(|f| f.id).collect()
    }
}

/// Enterprise `acme`, subsystem `sales`, database `db-a`, devices
/// `phone-1` and `phone-2`: the database's client and the devices' clients.
pub(crate) async fn provision(admin: &Client) -> (Client, Vec<(Id, Client)>) {
    let phones = [id("phone-1"), id("phone-2")];
    let (db, tokens) = estafeta_server_harness::api::provision_db_a(admin, &phones).await;
    let devices = phones
        .into_iter()
        .zip(tokens)
        .map(|(phone, token)| (phone, admin.with_token(&token)))
        .collect();
    (admin.with_token(&db), devices)
}
