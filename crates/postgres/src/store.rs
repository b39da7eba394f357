//! The connection pool over a libpq URL.

use crate::Error;
use crate::tls;
use deadpool_postgres::{Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};
use std::time::Duration;

/// How a node uses the database, beyond what the URL says.
#[derive(Clone, Debug)]
pub struct Options {
    /// The most connections this node keeps open.
    pub pool_size: usize,
    /// How long one host may take to accept a connection before the next
    /// host of the URL is tried (unless the URL sets `connect_timeout`).
    pub connect_timeout: Duration,
    /// How long a caller waits for a free pooled connection, or for a new one
    /// to be made, before the store counts as unavailable.
    pub wait_timeout: Duration,
    /// The bound on how long a paused or stuck node can hold a key's lock.
    /// It is set on every connection as two server settings:
    /// `idle_in_transaction_session_timeout`, which ends a session left idle
    /// inside an open transaction (a node paused between two statements),
    /// and `tcp_user_timeout`, which drops a TCP connection whose data stays
    /// unacknowledged, or whose peer's receive window stays closed, that long
    /// (a node paused while the server sends it more than the socket buffers
    /// hold: the server then sits in `ClientWrite`, not idle, and only the
    /// TCP timeout frees its locks). Zero leaves both off (PostgreSQL's
    /// meaning of 0). A URL whose `options` set either setting overrides it.
    pub hold_limit: Duration,
    /// The `application_name` its connections show in
    /// `pg_stat_activity` (unless the URL sets one): which node's pool a
    /// session belongs to, for an operator and for the tests.
    pub application_name: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(10),
            hold_limit: Duration::from_secs(10),
            application_name: None,
        }
    }
}

/// A node's handle on the cluster store: a pool of connections to the
/// current primary. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
}

impl Store {
    /// Open a pool over `url` with default [`Options`]. No connection is
    /// made yet: the first call that needs one connects (so a node can start
    /// while the database is still coming up).
    pub fn connect(url: &str) -> Result<Store, Error> {
        Store::connect_with(url, &Options::default())
    }

    /// Open a pool over `url` (a `postgres://` URL or a libpq `key=value`
    /// string; several hosts with `target_session_attrs=read-write` let the
    /// pool find the primary after a failover). TLS follows the URL's
    /// `sslmode`, `sslrootcert`, `sslcert` and `sslkey` as libpq reads them
    /// (`verify-full` checks the server's certificate and name).
    pub fn connect_with(url: &str, options: &Options) -> Result<Store, Error> {
        let (url, tls) = tls::Settings::take_from(url)?;
        let mut config: tokio_postgres::Config = url.parse().map_err(Error::Url)?;
        config.ssl_mode(tls.ssl_mode());
        if config.get_hosts().is_empty() {
            return Err(Error::NoHost);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        if let (None, Some(name)) = (config.get_application_name(), &options.application_name) {
            config.application_name(name);
        }
        let hold_ms = options.hold_limit.as_millis();
        let hold = format!(
            "-c idle_in_transaction_session_timeout={hold_ms} -c tcp_user_timeout={hold_ms}"
        );
        // The server applies `-c` settings in order, the last one winning:
        // the URL's own options come last, so an operator's value stands.
        let server_options = match config.get_options() {
            Some(given) => format!("{hold} {given}"),
            None => hold,
        };
        config.options(server_options);
        let manager = Manager::from_config(
            config,
            tls.connector()?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // The connection used last goes out first: a node under light
        // load keeps reusing a few warm backends (their caches and prepared
        // statements hot) instead of cycling through every one it opened.
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .queue_mode(QueueMode::Lifo)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.wait_timeout))
            .create_timeout(Some(options.wait_timeout))
            .build()
            .map_err(|e| Error::Options(e.to_string()))?;
        Ok(Store { pool })
    }

    /// A pooled connection (to the primary).
    pub async fn client(&self) -> Result<deadpool_postgres::Object, Error> {
        Ok(self.pool.get().await?)
    }
}
