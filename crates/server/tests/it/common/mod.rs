//! The shared harness of the server's tests: the library's `run` on a
//! loopback port-0 listener over a temporary data folder, the real
//! `estafeta` binary as a child process, and a provisioned tenancy.
//!
//! What the server's benches need too (the binary as a child process, the
//! tenancy, the requests) lives in the `estafeta-server-harness` crate;
//! this module re-exports it, so a test takes every helper from here.

pub(crate) mod broken_folder;
pub(crate) mod clock;
pub(crate) mod cluster;
pub(crate) mod postgres;
pub(crate) mod raw;
pub(crate) mod recorder;
pub(crate) mod restartable;
pub(crate) mod slow_reads;
pub(crate) mod webhook;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use estafeta_client::Client;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::Version;
use estafeta_exchange::{Exchange, ExchangeConfig, MessageId};
use estafeta_server::config::ClusterStore;
use estafeta_server::notify::NotifySettings;
use estafeta_server::{HttpSettings, ServeError, Server};
pub(crate) use estafeta_server_harness::api::{
    Tenancy, committed_process, id, message, processed, provision_db_a, ready_process, reply,
    start_ok, start_request, wait_ready,
};
use estafeta_server_harness::binary::{self, Program};
use tokio::process::Command;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Which store a test's server keeps everything in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Store {
    /// Files and redb under the data folder (no `store` setting).
    Embedded,
    /// A database of its own on the test binary's shared PostgreSQL
    /// instance ([`postgres::database`]), as a cluster node keeps it.
    Postgres,
}

impl Store {
    /// The `store` setting of a new server: none for the embedded store; for
    /// PostgreSQL, the URL of a new, empty database. A server restarted by
    /// the test is given the same setting again.
    pub(crate) fn setting(self) -> Option<String> {
        match self {
            Store::Embedded => None,
            Store::Postgres => Some(postgres::database()),
        }
    }
}

/// The tests `name::embedded` and `name::postgres`, each running
/// `async fn name(store: Store)` on its store under the test attribute
/// given (`#[tokio::test]` when none is):
/// `both_stores!(#[tokio::test(flavor = "multi_thread")] name);`.
#[allow(unused_macros)]
macro_rules! both_stores {
    ($name:ident) => {
        $crate::common::both_stores!(#[tokio::test] $name);
    };
    ($(#[$attr:meta])+ $name:ident) => {
        mod $name {
            $(#[$attr])+
            async fn embedded() {
                super::$name($crate::common::Store::Embedded).await;
            }

            $(#[$attr])+
            async fn postgres() {
                super::$name($crate::common::Store::Postgres).await;
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both_stores;

/// The admin token of in-process servers.
pub(crate) const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// How long a test waits for something that should happen within seconds.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// The next thing a loopback fake received (a mail, an SMS, a POST).
pub(crate) async fn next<T>(rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("nothing arrived in time")
        .expect("the channel closed")
}

/// Notification settings over `data` with a one-second first retry, so a
/// test that moves its clock past it sees the retry.
pub(crate) fn quick_retry(data: &Path) -> NotifySettings {
    NotifySettings {
        retry: Duration::from_secs(1),
        ..NotifySettings::log_only(data)
    }
}

/// Opens a server on `data` with the test admin token, the default HTTP
/// settings and logged alerts.
pub(crate) async fn open_server(data: &Path) -> Server {
    open_server_with(
        data,
        HttpSettings::default(),
        |_| {},
        NotifySettings::log_only(data),
    )
    .await
}

/// Opens a server on `data` with the test admin token, `http`, `tweak`ed
/// exchange settings and `notify`.
pub(crate) async fn open_server_with(
    data: &Path,
    http: HttpSettings,
    tweak: impl FnOnce(&mut ExchangeConfig),
    notify: NotifySettings,
) -> Server {
    open_server_on(data, None, http, tweak, notify).await
}

/// [`open_server_with`] over the `store` setting `store` (none: the
/// embedded store under `data`).
pub(crate) async fn open_server_on(
    data: &Path,
    store: Option<&str>,
    http: HttpSettings,
    tweak: impl FnOnce(&mut ExchangeConfig),
    notify: NotifySettings,
) -> Server {
    let mut config = ExchangeConfig::new(data);
    config.admin_token = Some(ADMIN_TOKEN.to_owned());
    tweak(&mut config);
    let clock = Arc::new(estafeta_session::SystemClock);
    let store = store.map(ClusterStore::new);
    let (server, _) = Server::open_with(config, clock, http, notify, store.as_ref(), None)
        .await
        .unwrap();
    server
}

/// The library's `run` on 127.0.0.1:0 in a temporary data folder, over
/// either store.
pub(crate) struct TestServer {
    pub(crate) data: tempfile::TempDir,
    /// Its `store` setting (none: the embedded store under `data`).
    pub(crate) store: Option<String>,
    pub(crate) addr: SocketAddr,
    pub(crate) base: String,
    /// A client with the admin token.
    pub(crate) admin: Client,
    /// The server's exchange (for calls no HTTP route makes).
    pub(crate) exchange: Exchange,
    /// The event log its dashboard reads (records a test writes there
    /// itself: the server holds the file open).
    pub(crate) events: Arc<dyn estafeta_server::events::EventLogStore>,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl TestServer {
    /// A ready server on the embedded store with the default HTTP settings.
    pub(crate) async fn start() -> TestServer {
        Self::start_on(Store::Embedded).await
    }

    /// A ready server on `store` with the default HTTP settings.
    pub(crate) async fn start_on(store: Store) -> TestServer {
        Self::start_with(store, |_| {}).await
    }

    /// A ready server on `store` with the default HTTP settings `tweak`ed.
    pub(crate) async fn start_with(
        store: Store,
        tweak: impl FnOnce(&mut HttpSettings),
    ) -> TestServer {
        let mut http = HttpSettings::default();
        tweak(&mut http);
        Self::start_custom(store, http, |_| {}).await
    }

    /// A ready server on `store` with the given HTTP settings and `tweak`ed
    /// exchange settings.
    pub(crate) async fn start_custom(
        store: Store,
        http: HttpSettings,
        tweak: impl FnOnce(&mut ExchangeConfig),
    ) -> TestServer {
        Self::start_notified(store, http, tweak, |data| NotifySettings::log_only(data)).await
    }

    /// A ready server on `store` whose alerts go where `notify` (given the
    /// data folder) says.
    pub(crate) async fn start_notified(
        store: Store,
        http: HttpSettings,
        tweak: impl FnOnce(&mut ExchangeConfig),
        notify: impl FnOnce(&Path) -> NotifySettings,
    ) -> TestServer {
        let data = tempfile::tempdir().unwrap();
        let store = store.setting();
        let notify = notify(data.path());
        let server = open_server_on(data.path(), store.as_deref(), http, tweak, notify).await;
        let exchange = server.exchange().clone();
        let events = server.state().events().clone();
        let (addr, base, stop, task) = on_loopback(server).await;
        let admin = Client::new(&base, ADMIN_TOKEN).unwrap();
        wait_ready(&admin).await;
        TestServer {
            data,
            store,
            addr,
            base,
            admin,
            exchange,
            events,
            stop,
            task: Some(task),
        }
    }

    /// A client with another token (empty: none).
    pub(crate) fn client(&self, token: &str) -> Client {
        self.admin.with_token(token)
    }

    /// A raw HTTP client for requests the typed client cannot make.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signals shutdown without waiting for it.
    pub(crate) fn signal_stop(&mut self) {
        self.stop.cancel();
    }

    /// Signals shutdown and waits for `run` to return.
    pub(crate) async fn stop(mut self) -> Result<(), ServeError> {
        self.signal_stop();
        self.task.take().unwrap().await.unwrap()
    }
}

/// The ids in `mailbox`'s `folder`, as the admin API lists them to
/// `admin`.
pub(crate) async fn listed(admin: &Client, mailbox: &str, folder: Folder) -> Vec<MessageId> {
    let listing = admin.folder(&id(mailbox), folder).await.unwrap();
    listing.files.into_iter().map(|f| f.id).collect()
}

/// A server's run on a loopback port: its address, its base URL, the
/// token that stops it and the task that runs it.
pub(crate) type Running = (
    SocketAddr,
    String,
    CancellationToken,
    JoinHandle<Result<(), ServeError>>,
);

/// Runs `server` on a new loopback port (127.0.0.1:0) until its stop token
/// is cancelled.
pub(crate) async fn on_loopback(server: Server) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(server.run(listener, stop.clone()));
    (addr, format!("http://{addr}"), stop, task)
}

/// The smallest tenancy: enterprise `acme` with subsystem `sales`, database
/// `db-a` and device `phone-1`; their tokens (database, device).
pub(crate) async fn provision_one(admin: &Client) -> (String, String) {
    let (db, mut phones) = provision_db_a(admin, &[id("phone-1")]).await;
    (db, phones.remove(0))
}

/// A prepare that marks each of `ids` PROCESSED and replies once to
/// `phone-1` with `body`.
pub(crate) fn prepare_all(
    ids: impl IntoIterator<Item = estafeta_exchange::MessageId>,
    body: &str,
) -> estafeta_exchange::wire::PrepareRequest {
    estafeta_exchange::wire::PrepareRequest {
        version: Version,
        results: ids.into_iter().map(processed).collect(),
        replies: vec![reply(id("phone-1"), body)],
    }
}

/// Prepares `pid` through `db` with [`prepare_all`] of `ids` and `reply`,
/// then commits it; both answer OK.
pub(crate) async fn process_all(
    db: &Client,
    pid: &estafeta_exchange::ProcessId,
    ids: impl IntoIterator<Item = estafeta_exchange::MessageId>,
    reply: &str,
) {
    use estafeta_exchange::wire::CallStatus;
    let prepared = db.prepare(pid, &prepare_all(ids, reply)).await.unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);
    assert_eq!(db.commit(pid).await.unwrap().status, CallStatus::Ok);
}

/// [`provision_one`], then one cycle through `db-a` that leaves `reply`
/// waiting in `phone-1`'s inbox; `phone-1`'s token.
pub(crate) async fn reply_waiting(admin: &Client, reply: &str) -> String {
    let (db, phone) = provision_one(admin).await;
    let db = admin.with_token(&db);
    let sent = admin
        .with_token(&phone)
        .send(&message("db-a", "{}", None))
        .await
        .unwrap();
    let started = db.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    process_all(&db, &pid, [sent.accepted.id], reply).await;
    phone
}

/// The `estafeta` binary built with the tests.
pub(crate) struct Estafeta;

impl Program for Estafeta {
    const BUILT: &'static str = env!("CARGO_BIN_EXE_estafeta");
}

/// The real `estafeta` binary, started by [`Binary::serve`].
pub(crate) type Binary = binary::Binary<Estafeta>;

/// A command for the binary with no `ESTAFETA_*` setting inherited from
/// the test's environment, run in `cwd` (so no stray `estafeta.toml`).
/// The binary is the one built with the tests, or the one named by
/// `ESTAFETA_TEST_BINARY` (a measurement against an optimized build).
pub(crate) fn estafeta(cwd: &Path) -> Command {
    Binary::command(cwd)
}

/// [`estafeta`] started by `sh -c` after the shell commands `prelude`
/// (`ulimit -n 256`, `umask 000`): what the binary inherits from them.
pub(crate) fn estafeta_after(cwd: &Path, prelude: &str) -> Command {
    Binary::command_after(cwd, prelude)
}

/// The arguments of `estafeta admin` that create device `phone-1` of
/// subsystem `sales` in enterprise `acme`.
pub(crate) const CREATE_PHONE_1: [&str; 6] = [
    "device",
    "create",
    "acme",
    "phone-1",
    "--subsystem",
    "sales",
];

/// What a command that ran to its end gave: whether it succeeded, its
/// stdout and its stderr (UTF-8).
pub(crate) fn outcome(out: std::process::Output) -> (bool, String, String) {
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A plain HTTP client that follows no redirect: a test sees the
/// dashboard's own `303` answers and the cookies they set.
pub(crate) fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The value of cookie `name` among the answer's `Set-Cookie` headers, and
/// the whole header.
pub(crate) fn set_cookie(r: &reqwest::Response, name: &str) -> Option<(String, String)> {
    let set = r.headers().get_all(reqwest::header::SET_COOKIE);
    set.iter().find_map(|v| {
        let text = v.to_str().ok()?.to_owned();
        let value = text
            .strip_prefix(&format!("{name}="))?
            .split(';')
            .next()?
            .to_owned();
        Some((value, text))
    })
}

/// Logs in to the dashboard at `dashboard` (`http://…/admin`) with
/// `token`, through the login form and its nonce; the session's cookie
/// header value.
pub(crate) async fn dashboard_session(dashboard: &str, token: &str) -> String {
    use reqwest::header::{CONTENT_TYPE, COOKIE};
    let url = format!("{dashboard}/login");
    let form = http().get(&url).send().await.unwrap();
    assert!(form.status().is_success(), "{}", form.status());
    let (nonce, _) = set_cookie(&form, "estafeta_login").expect("no estafeta_login cookie");
    let r = http()
        .post(&url)
        .header(COOKIE, format!("estafeta_login={nonce}"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("token={token}&nonce={nonce}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::SEE_OTHER);
    let (session, _) = set_cookie(&r, "estafeta_admin").expect("no estafeta_admin cookie");
    format!("estafeta_admin={session}")
}

/// The text of `/metrics` at `base`.
pub(crate) async fn scrape(base: &str) -> String {
    let answer = reqwest::get(format!("{base}/metrics")).await.unwrap();
    answer.text().await.unwrap()
}

/// The whole of what `child` writes to its stderr, until it closes it.
pub(crate) async fn stderr_of(child: &mut tokio::process::Child) -> String {
    use tokio::io::AsyncReadExt;
    let mut stderr = String::new();
    let mut pipe = child.stderr.take().unwrap();
    pipe.read_to_string(&mut stderr).await.unwrap();
    stderr
}

/// The value of one series of `/metrics` at `base`, if the scrape has it.
pub(crate) async fn metric(base: &str, series: &str) -> Option<f64> {
    let text = scrape(base).await;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until the series of `/metrics` at `base` is there with `want` (a
/// missing series never matches), at most for [`PATIENCE`].
pub(crate) async fn wait_metric(base: &str, series: &str, want: f64) {
    let polled = async {
        while metric(base, series).await != Some(want) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PATIENCE, polled)
        .await
        .unwrap_or_else(|_| panic!("{series} did not reach {want}"));
}
