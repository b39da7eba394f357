//! [`run`]: serve the router on a listener the caller bound, with start-up
//! recovery in the background, the daily retention sweep, and graceful
//! shutdown when the caller's signal fires.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use estafeta_exchange::{Exchange, ExchangeError};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::app;
use crate::config::HttpSettings;
use crate::state::AppState;

/// The longest wait between two attempts at start-up recovery.
const MAX_RECOVERY_BACKOFF: Duration = Duration::from_secs(60);

/// Serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listener failed.
    #[error("serving HTTP failed: {0}")]
    Io(#[from] std::io::Error),
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
    let state = AppState::new(exchange.clone(), http.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let recovery = tokio::spawn(recover(state.clone(), stop_rx.clone()));
    let retention = tokio::spawn(retention(
        exchange.clone(),
        http.retention_interval,
        stop_rx,
    ));

    let signal = {
        let state = state.clone();
        let stop_tx = stop_tx.clone();
        async move {
            shutdown.await;
            tracing::info!("stopping: no new connections; finishing calls in flight");
            state.set_ready(false);
            stop_tx.send_replace(true);
        }
    };
    // Small request/answer exchanges: do not let Nagle's algorithm hold them.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
    });
    let served = axum::serve(listener, app(state.clone()))
        .with_graceful_shutdown(signal)
        .await;

    // Also when serving failed before the signal: stop the background tasks.
    state.set_ready(false);
    stop_tx.send_replace(true);
    for task in [recovery, retention] {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "a background task panicked");
        }
    }
    exchange.shutdown().await?;
    tracing::info!("stopped");
    served.map_err(ServeError::from)
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
