//! [`run`]: serve the router on a listener the caller bound, with start-up
//! recovery in the background, the daily retention sweep, scheduled
//! delivery, alert delivery ([`run_with`]), and graceful shutdown when the
//! caller's signal fires.
//!
//! The accept loop is hyper's own rather than `axum::serve`, because the
//! latter sets no header read timeout: a client that never finishes its
//! request head would hold a connection, and a graceful shutdown, forever.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use estafeta_exchange::{Exchange, ExchangeError, LogOnly, NoPush};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_http::add_extension::AddExtension;

use crate::app::app;
use crate::config::HttpSettings;
use crate::notify::{Notifier, NotifyError, NotifySettings, Pusher};
use crate::state::AppState;

/// The longest wait between two attempts at start-up recovery.
const MAX_RECOVERY_BACKOFF: Duration = Duration::from_secs(60);

/// Serving ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The alert notifier could not start.
    #[error("starting alert delivery failed: {0}")]
    Notify(#[from] NotifyError),
    /// The exchange could not save its state when stopping.
    #[error("stopping the exchange failed: {0}")]
    Shutdown(#[from] ExchangeError),
}

/// Serves the API on `listener` until `shutdown` resolves, then stops
/// accepting, lets in-flight calls finish, and shuts the exchange down.
///
/// `/healthz` answers at once; `/readyz` answers 503 until
/// [`Exchange::recover`] (run here in the background, retried with backoff
/// if it fails) has returned Ok, and again once stopping has begun.
pub async fn run<F>(
    listener: TcpListener,
    exchange: Exchange,
    http: HttpSettings,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let notify = NotifySettings::log_only(exchange.data_dir());
    run_with(listener, exchange, http, notify, shutdown).await
}

/// [`run`] with alerts sent to the administrators of `notify` (the
/// [`Notifier`] becomes the exchange's alert sink before start-up recovery,
/// so alerts that recovery raises reach them too), and push notifications
/// to the recipients' webhooks (the [`Pusher`], sending once start-up
/// recovery has loaded the webhooks).
pub async fn run_with<F>(
    listener: TcpListener,
    exchange: Exchange,
    http: HttpSettings,
    notify: NotifySettings,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let notifier = Notifier::open(notify).await?;
    exchange.set_alert_sink(Arc::new(notifier.clone()));
    let pusher = Pusher::open(&notifier, exchange.clone()).await?;
    exchange.set_push_sink(Arc::new(pusher.clone()));
    let state = AppState::new(exchange.clone(), http.clone());
    state.set_notifier(notifier.clone());
    state.set_pusher(pusher.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let recovery = tokio::spawn(recover(state.clone(), stop_rx.clone()));
    let retention = tokio::spawn(retention(
        exchange.clone(),
        http.retention_interval,
        stop_rx.clone(),
    ));
    let deliveries = {
        let (exchange, mut stop) = (exchange.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|stopping| *stopping).await;
            };
            if let Err(e) = exchange.run_deliveries(stopped).await {
                tracing::error!(error = %e, "scheduled delivery stopped");
            }
        })
    };
    let pushes = {
        let (exchange, mut stop) = (exchange.clone(), stop_rx.clone());
        let probe = notifier.settings().probe;
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|stopping| *stopping).await;
            };
            let mut stopped = std::pin::pin!(stopped);
            tokio::select! {
                _ = exchange.wait_ready() => pusher.run(probe, stopped).await,
                _ = &mut stopped => pusher.close().await,
            }
        })
    };
    let alerts = {
        let (notifier, exchange, mut stop) = (notifier, exchange.clone(), stop_rx);
        tokio::spawn(async move {
            notifier
                .run(exchange, async move {
                    let _ = stop.wait_for(|stopping| *stopping).await;
                })
                .await;
        })
    };

    let signal = {
        let state = state.clone();
        let stop_tx = stop_tx.clone();
        async move {
            shutdown.await;
            tracing::info!("stopping: no new connections; finishing calls in flight");
            state.set_ready(false);
            tell_service_manager(sd_notify::NotifyState::Stopping);
            stop_tx.send_replace(true);
        }
    };
    let signal = tokio::spawn(signal);
    serve_http(
        listener,
        app(state.clone()),
        http.request_timeout,
        stop_tx.subscribe(),
    )
    .await;
    signal.abort();

    for task in [recovery, retention, deliveries, pushes, alerts] {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "a background task panicked");
        }
    }
    // The notifier's stores close with it; a later run may open them again.
    exchange.set_alert_sink(Arc::new(LogOnly));
    exchange.set_push_sink(Arc::new(NoPush));
    exchange.shutdown().await?;
    tracing::info!("stopped");
    Ok(())
}

/// Accepts connections until `stop`, then lets every open connection finish
/// its request in flight and closes it. A request head must arrive within
/// `header_timeout`.
async fn serve_http(
    listener: TcpListener,
    router: Router,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopping| *stopping) => break,
        };
        let (tcp, remote) = match accepted {
            Ok(pair) => pair,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin.
                tracing::error!(error = %e, "accepting a connection failed");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = stop.wait_for(|stopping| *stopping) => break,
                }
            }
        };
        // Small request/answer exchanges: do not let Nagle's algorithm hold them.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        // The client's address, for the handlers that need it (login throttling).
        let service =
            TowerToHyperService::new(AddExtension::new(router.clone(), ConnectInfo(remote)));
        let conn = graceful.watch(http.serve_connection(TokioIo::new(tcp), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%remote, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
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

/// Runs start-up recovery until it succeeds (or the server stops), then
/// marks the state ready.
async fn recover(state: AppState, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match state.exchange().recover().await {
            Ok(report) => {
                tracing::info!(?report, "start-up recovery done; ready");
                if !*stop.borrow() {
                    state.set_ready(true);
                    tell_service_manager(sd_notify::NotifyState::Ready);
                }
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, retry_in = ?backoff, "start-up recovery failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|stopping| *stopping) => return,
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

/// Removes expired files every `interval` (start-up recovery did the first
/// sweep). A sweep in progress is let finish when the server stops.
async fn retention(exchange: Exchange, interval: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|stopping| *stopping) => return,
        }
        match exchange.retention_sweep().await {
            Ok(removed) => tracing::info!(removed, "retention sweep done"),
            Err(e) => tracing::error!(error = %e, "retention sweep failed"),
        }
    }
}
