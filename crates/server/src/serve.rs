//! [`Server`]: the server's parts built in order (the alert notifier and the
//! pusher first, then the exchange with both as its sinks, then the
//! router's state), and [`Server::run`]: serve the router on a listener the
//! caller bound, with start-up recovery in the background, the daily
//! retention sweep, scheduled delivery, alert and push delivery, and a
//! graceful shutdown when the caller cancels its token.
//!
//! One [`CancellationToken`] tells every part to stop: it is cloned into
//! each task (no value to read, nothing to send it back), and a part that
//! runs helpers of its own stops them with a child token.
//!
//! The accept loop is hyper's own rather than `axum::serve`, because the
//! latter sets no header read timeout, caps no connections and bounds no
//! graceful stop: a client that never finishes its request head, or never
//! reads its answer, would hold a connection, and a graceful shutdown,
//! forever.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use estafeta_exchange::tenancy::AdminToken;
use estafeta_exchange::{Exchange, ExchangeConfig, Quiesce, Sinks};
use estafeta_session::Clock;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower_http::add_extension::AddExtension;

use crate::admission::{Admission, Admitted, Refusals, reserved_routes_only};
use crate::app::app;
use crate::config::{ClusterStore, HttpSettings};
use crate::error::ServeError;
use crate::events::EventLogHandle;
use crate::metrics::{Commits, Metrics};
use crate::notify::NotifySettings;
use crate::state::AppState;
use crate::write_timeout::WriteTimeout;

/// The longest wait between two attempts at start-up recovery.
const MAX_RECOVERY_BACKOFF: Duration = Duration::from_secs(60);

/// The server, assembled: every part was given what it needs when it was
/// built, and nothing refers back to what owns it.
pub struct Server {
    state: AppState,
}

impl Server {
    /// Opens the alert notifier (alerts to the administrators of
    /// `notify`), the pusher (push notifications to the recipients'
    /// webhooks, on `clock`), then the exchange with both as its sinks, so
    /// that the alerts start-up recovery raises reach them. Returns the
    /// admin token's provenance (print it when `Generated`).
    pub async fn open(
        config: ExchangeConfig,
        clock: Arc<dyn Clock>,
        http: HttpSettings,
        notify: NotifySettings,
    ) -> Result<(Server, AdminToken), ServeError> {
        Server::open_with(config, clock, http, notify, None, None).await
    }

    /// [`Server::open`] over the stores the `store` setting names: the
    /// embedded ones under the data folder, or a cluster's PostgreSQL
    /// database ([`crate::stores::stores`]). `event_log`: the event log this
    /// process's log subscriber keeps ([`crate::logging::init_with_event_log`]), whose file
    /// the dashboard reads rather than opening it again; without it the
    /// server opens the data folder's log file itself.
    pub async fn open_with(
        config: ExchangeConfig,
        clock: Arc<dyn Clock>,
        http: HttpSettings,
        notify: NotifySettings,
        store: Option<&ClusterStore>,
        event_log: Option<&EventLogHandle>,
    ) -> Result<(Server, AdminToken), ServeError> {
        // The exchange tells the metrics of its commits.
        let commits = Arc::new(Commits::default());
        let mut config = config;
        config.quiesce = Quiesce::observed(commits.clone());
        let stores = crate::stores::stores(&config.data_dir, store, clock, &config.quiesce).await?;
        let clock = stores.clock.clone();
        let metrics = Metrics::new(commits, stores.database_clock.clone());
        let notifier = stores.notifier(notify, config.quiesce.clone()).await?;
        let pusher = stores.pusher(&notifier, config.quiesce.clone()).await?;
        let logins = stores.logins();
        let events = stores.events(&config.data_dir, event_log.and_then(EventLogHandle::file))?;
        // In a cluster, wrong tokens are counted across the nodes.
        let auth_throttle =
            crate::throttle::AuthThrottle::new(stores.cluster.clone().map(|db| {
                estafeta_postgres::PgAuthFailures::new(db, crate::throttle::FORGET_AFTER)
            }));
        let readiness = crate::readiness::Readiness::new(
            estafeta_exchange::DataLayout::new(&config.data_dir).state_dir(),
            stores.cluster.clone(),
        );
        let sinks = Sinks {
            alerts: Arc::new(notifier.clone()),
            push: Arc::new(pusher.clone()),
        };
        let (exchange, admin) = Exchange::open(config, clock, sinks, stores.exchange)
            .await
            .map_err(ServeError::Open)?;
        let state = AppState::new(
            exchange,
            http,
            notifier,
            pusher,
            logins,
            events,
            metrics,
            auth_throttle,
            readiness,
        );
        Ok((Server { state }, admin))
    }

    /// The exchange.
    pub fn exchange(&self) -> &Exchange {
        self.state.exchange()
    }

    /// What the handlers share.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves the API on `listener` until `shutdown` is cancelled, then
    /// stops accepting, lets in-flight calls finish (closing the
    /// connections still open after the `stop_timeout` setting), and shuts
    /// the exchange down.
    ///
    /// `/healthz` answers at once; `/readyz` answers 503 until
    /// [`Exchange::recover`] (run here in the background, retried with
    /// backoff if it fails) has returned Ok, and again once stopping has
    /// begun. Push notifications start once recovery is done; the
    /// webhooks are loaded right after, with the start-up work that can
    /// wait ([`Exchange::tidy`]).
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        let state = self.state;
        let exchange = state.exchange().clone();
        let http = state.http().clone();
        let recovery = tokio::spawn(recover(exchange.clone(), shutdown.clone()));
        let retention = tokio::spawn(retention(
            exchange.clone(),
            http.retention_interval,
            shutdown.clone(),
        ));
        let deliveries = {
            let (exchange, stop) = (exchange.clone(), shutdown.clone());
            tokio::spawn(async move {
                if let Err(e) = exchange.run_deliveries(stop).await {
                    tracing::error!(error = %e, "scheduled delivery stopped");
                }
            })
        };
        let pushes = {
            let (pusher, exchange, stop) =
                (state.pusher().clone(), exchange.clone(), shutdown.clone());
            let probe = state.notifier().settings().probe;
            tokio::spawn(async move {
                if exchange.wait_ready().await {
                    pusher.run(exchange, probe, stop).await;
                } else {
                    pusher.close().await;
                }
            })
        };
        let alerts = {
            let (notifier, exchange, stop) =
                (state.notifier().clone(), exchange.clone(), shutdown.clone());
            tokio::spawn(async move { notifier.run(exchange, stop).await })
        };
        let wrong_tokens = {
            let (state, stop) = (state.clone(), shutdown.clone());
            tokio::spawn(async move { crate::throttle::run(state.auth_throttle(), stop).await })
        };
        let signal = {
            let (exchange, shutdown) = (exchange.clone(), shutdown.clone());
            tokio::spawn(async move {
                shutdown.cancelled().await;
                tracing::info!("stopping: no new connections; finishing calls in flight");
                exchange.begin_stopping();
                tell_service_manager(sd_notify::NotifyState::Stopping);
            })
        };
        serve_http(listener, app(state), &http, shutdown).await;

        for task in [
            signal,
            recovery,
            retention,
            deliveries,
            pushes,
            alerts,
            wrong_tokens,
        ] {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "a background task panicked");
            }
        }
        exchange.shutdown().await.map_err(ServeError::Shutdown)?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// How often refused connections are logged (in aggregate) at most.
const REFUSALS_LOGGED_EVERY: Duration = Duration::from_secs(60);

/// Accepts connections until `stop` as [`Admission`] allows, then lets
/// every open connection finish its request in flight for at most
/// `http.stop_timeout` and closes those still open. A request head must
/// arrive within `http.request_timeout`; an answer the client takes no byte
/// of for `http.write_timeout` ends its connection.
async fn serve_http(
    listener: TcpListener,
    router: Router,
    http: &HttpSettings,
    stop: CancellationToken,
) {
    let open_files = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let admission = Admission::new(http.max_connections, open_files);
    if admission.places() < http.max_connections {
        tracing::warn!(
            max_connections = http.max_connections,
            open_file_limit = open_files,
            serving = admission.places(),
            "the open-file limit is too low for max_connections; serving fewer (raise LimitNOFILE or ulimit -n)"
        );
    }
    let router = router.layer(axum::middleware::from_fn(reserved_routes_only));
    let graceful = GracefulShutdown::new();
    let mut general = http1::Builder::new();
    general
        .timer(TokioTimer::new())
        .header_read_timeout(http.request_timeout);
    let mut reserved = general.clone();
    reserved.keep_alive(false);
    let mut connections = JoinSet::new();
    let mut refusals_logged = tokio::time::Instant::now();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next() => continue,
            _ = stop.cancelled() => break,
        };
        let (tcp, remote) = match accepted {
            Ok(pair) => pair,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin.
                tracing::error!(error = %e, "accepting a connection failed");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = stop.cancelled() => break,
                }
            }
        };
        if refusals_logged.elapsed() >= REFUSALS_LOGGED_EVERY {
            refusals_logged = tokio::time::Instant::now();
            log_refusals(&admission, http.max_connections);
        }
        let Some(admitted) = admission.admit() else {
            // Every place is taken: closed at once.
            continue;
        };
        // Small request/answer exchanges: do not let Nagle's algorithm hold them.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let io = TokioIo::new(WriteTimeout::new(tcp, http.write_timeout));
        // The client's address, for the handlers that need it (login throttling).
        let service = AddExtension::new(router.clone(), ConnectInfo(remote));
        match admitted {
            Admitted::General(place) => {
                let conn =
                    graceful.watch(general.serve_connection(io, TowerToHyperService::new(service)));
                connections.spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%remote, error = %e, "connection ended with an error");
                    }
                    drop(place);
                });
            }
            Admitted::Reserved(place) => {
                let service = AddExtension::new(service, place.marker());
                let conn = graceful
                    .watch(reserved.serve_connection(io, TowerToHyperService::new(service)));
                connections.spawn(async move {
                    tokio::select! {
                        ended = conn => if let Err(e) = ended {
                            tracing::debug!(%remote, error = %e, "connection ended with an error");
                        },
                        _ = place.evicted() => {}
                    }
                });
            }
        }
    }
    drop(listener);
    log_refusals(&admission, http.max_connections);
    if tokio::time::timeout(http.stop_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            open = connections.len(),
            stop_timeout = ?http.stop_timeout,
            "stopping: connections still busy after stop_timeout are closed"
        );
    }
    connections.shutdown().await;
}

/// Logs the connections refused since the last time, if any.
fn log_refusals(admission: &Admission, max_connections: usize) {
    let Refusals { refused, evicted } = admission.refusals();
    if refused > 0 || evicted > 0 {
        tracing::warn!(
            refused,
            evicted,
            serving = admission.places(),
            max_connections,
            "connections refused: every place was taken (evicted: reserved connections that sent no request, closed for newer ones)"
        );
    }
}

/// Errors of one incoming connection, not of the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Runs start-up recovery until it succeeds (the exchange's phase becomes
/// ready then, unless stopping began) or the server stops, then the
/// start-up work that can wait ([`Exchange::tidy`]).
async fn recover(exchange: Exchange, stop: CancellationToken) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match exchange.recover().await {
            Ok(report) => {
                tracing::info!(?report, "start-up recovery done; ready");
                if exchange.is_ready() {
                    tell_service_manager(sd_notify::NotifyState::Ready);
                }
                if let Err(e) = exchange.tidy().await {
                    tracing::error!(error = %e, "start-up tidying failed");
                }
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, retry_in = ?backoff, "start-up recovery failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(MAX_RECOVERY_BACKOFF);
    }
}

/// Tells systemd (a `Type=notify` unit, through `NOTIFY_SOCKET`) that the
/// server is ready or stopping; without a service manager this does nothing.
fn tell_service_manager(state: sd_notify::NotifyState<'_>) {
    if let Err(e) = sd_notify::notify(&[state]) {
        tracing::warn!(error = %e, "telling the service manager failed");
    }
}

/// Removes expired files every `interval` (the start-up tidying did the
/// first sweep). A sweep in progress is let finish when the server stops.
async fn retention(exchange: Exchange, interval: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
        match exchange.retention_sweep().await {
            Ok(removed) => tracing::info!(removed, "retention sweep done"),
            Err(e) => tracing::error!(error = %e, "retention sweep failed"),
        }
    }
}
