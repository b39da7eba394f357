//! The Estafeta server: HTTP routing, authentication, configuration and
//! shutdown around the exchange domain ([`estafeta_exchange::Exchange`]).
//!
//! - [`config`]: [`Settings`] from defaults, a TOML file and `ESTAFETA_*`
//!   variables, each setting declared once, mapped to the exchange's configuration.
//! - [`mod@app`]: [`app()`], the router of every route of the HTTP API, whose
//!   handlers live in [`routes`]; [`AppState`] ([`state`]) holds the
//!   exchange, readiness and the request counters of [`metrics`], which
//!   serves `/metrics` in the Prometheus text format; [`body_limit`] caps
//!   request bodies per group of routes, [`body_room`] the message bodies
//!   held at once.
//! - [`extract`] and [`error`]: authentication and body parsing that answer
//!   every bad request with the error JSON ([`ApiError`]), and why a start
//!   failed ([`ServeError`]); [`throttle`]
//!   slows down addresses that give wrong tokens, by the client's address
//!   ([`client_addr`]).
//! - [`openapi`]: the OpenAPI document of `/v1/openapi.json`.
//! - [`mod@serve`]: [`Server`], the parts built in order ([`Server::open`])
//!   and served on a caller-bound listener until the caller cancels its
//!   token ([`Server::run`]), with start-up recovery in the background;
//!   [`admission`] caps the connections (with a reserve for the operator)
//!   and [`write_timeout`] ends those whose client stopped reading.
//! - [`backup`]: a consistent copy of the data folder made while serving
//!   (`estafeta backup DIR`, `POST /v1/admin/backup`).
//! - [`mod@dashboard`]: the admin dashboard at `/admin` (askama pages, login
//!   session, CSRF-protected operator actions).
//! - [`trace`]: a request id on every request and answer, and a span
//!   carrying it around every log line of the request.
//! - [`events`]: the structured event log (a `tracing` layer writing JSON
//!   lines, rotated) that the dashboard reads; [`logging`]: the subscriber
//!   that `estafeta serve` installs with it.
//! - [`notify`]: alerts to administrators by e-mail, SMS and webhook, through
//!   the send queue with durable retries ([`notify::Notifier`], whose store
//!   of raised alerts and their acknowledgements the dashboard shows), and push
//!   notifications to the webhooks of databases and devices when messages
//!   arrive for them ([`notify::Pusher`]).
//! - [`stores`]: the stores a node runs on (embedded, or a cluster's
//!   PostgreSQL); [`open`]: opening the server at start, waiting out a full
//!   disk or a store out of reach;
//!   [`check`]: the state files' health (`estafeta check`, and the look
//!   before serving that refuses a damaged file).
//! - `failpoints` (cargo feature `failpoints`, for the fault-injection
//!   harness only): named crash and disk-full points armed from the
//!   environment.
//!
//! # Example
//!
//! The router answers without a socket (here the OpenAPI document, which
//! needs no exchange):
//!
//! ```
//! let doc = estafeta_server::openapi::document();
//! assert!(doc.paths.paths.contains_key("/v1/processes/{pid}/commit"));
//! ```
//!
//! Serving, as the `estafeta serve` command does it:
//!
//! ```no_run
//! use std::sync::Arc;
//! use estafeta_server::{Server, Settings};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = Settings::load(None)?;
//! let clock = Arc::new(estafeta_session::SystemClock);
//! let (server, _admin) =
//!     Server::open(settings.exchange_config()?, clock, settings.http(), settings.notify()?).await?;
//! let listener = tokio::net::TcpListener::bind(&settings.listen).await?;
//! let shutdown = CancellationToken::new();
//! let on_ctrl_c = shutdown.clone();
//! tokio::spawn(async move {
//!     let _ = tokio::signal::ctrl_c().await;
//!     on_ctrl_c.cancel();
//! });
//! server.run(listener, shutdown).await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod admission;
pub mod app;
pub mod backup;
pub mod body_limit;
pub mod body_room;
pub mod check;
pub mod client_addr;
pub mod config;
pub mod dashboard;
pub mod error;
pub mod events;
pub mod extract;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod last_seen;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod open;
pub mod openapi;
pub mod readiness;
pub mod routes;
pub mod serve;
pub mod state;
pub mod stores;
pub mod throttle;
pub mod trace;
pub mod write_timeout;

pub use app::app;
pub use config::{HttpSettings, Settings};
pub use error::{ApiError, ServeError};
pub use serve::Server;
pub use state::AppState;
