//! The stores a node runs on: embedded under the data folder, or a
//! cluster's PostgreSQL database (the `store` setting). The choice is made
//! here once, for the exchange's stores and for the node's own state
//! (alerts and their deliveries, push notifications, dashboard logins, the
//! event log): in cluster mode no file under the data folder holds anything
//! needed to recover.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use estafeta_exchange::{Quiesce, Stores};
use estafeta_session::Clock;

use crate::config::ClusterStore;
use crate::dashboard::logins::Logins;
use crate::error::ServeError;
use crate::events::{EventLogStore, EventStore};
use crate::notify::{Notifier, NotifyError, NotifySettings, Pusher};
use estafeta_exchange::store::SCHEDULED_SOURCE;

/// How long a node holds a due `deliver_at` message it took in the cluster
/// store: a node paused holding one leaves it to another node this long
/// after it took it (one that dies, at once: see `PgQueue::holding`).
const SCHEDULED_LEASE: Duration = Duration::from_secs(30);
/// How many claims on due `deliver_at` messages a node holds open at once,
/// each on a pooled connection.
const SCHEDULED_HOLDS: usize = 4;
/// How long a read that finds every hold in use waits for one to end (a
/// hold ends once its deliveries are written), then claims with the lease.
const SCHEDULED_HOLD_WAIT: Duration = Duration::from_millis(50);
/// How often a cluster node reads the database server's time again.
const CLOCK_READING: Duration = Duration::from_secs(10);

/// The stores a node runs on, and the clock it runs on with them.
pub struct NodeStores {
    /// The exchange's.
    pub exchange: Stores,
    /// In cluster mode, the cluster's database (migrated), which also keeps
    /// the node's own state.
    pub cluster: Option<estafeta_postgres::Store>,
    /// What every part of the node reads the time from: the clock given,
    /// or in cluster mode the database server's time
    /// ([`estafeta_postgres::DatabaseClock`]), which all nodes share.
    pub clock: Arc<dyn Clock>,
    /// In cluster mode, the database's clock itself (how far the node's own
    /// is off, for the metrics).
    pub database_clock: Option<estafeta_postgres::DatabaseClock>,
}

impl NodeStores {
    /// The alert notifier, its alerts and deliveries in the cluster's
    /// database or under the data folder.
    pub async fn notifier(
        &self,
        settings: NotifySettings,
        quiesce: Quiesce,
    ) -> Result<Notifier, NotifyError> {
        Notifier::open_in(settings, self.clock.clone(), quiesce, self.cluster.as_ref()).await
    }

    /// The pusher, its pending notifications in the cluster's database or
    /// under the data folder.
    pub async fn pusher(
        &self,
        notifier: &Notifier,
        quiesce: Quiesce,
    ) -> Result<Pusher, NotifyError> {
        Pusher::open_in(notifier, self.clock.clone(), quiesce, self.cluster.as_ref()).await
    }

    /// The event log the dashboard reads: the cluster's `events` table
    /// (every node's records) or the file under `data_dir` (`opened`, when
    /// this process has it open already), whose damaged predecessor, if its
    /// opening set one aside, is named in a warning.
    pub fn events(
        &self,
        data_dir: &Path,
        opened: Option<&Arc<EventStore>>,
    ) -> Result<Arc<dyn EventLogStore>, crate::events::EventStoreError> {
        Ok(match (&self.cluster, opened) {
            (Some(db), _) => Arc::new(estafeta_postgres::PgEvents::new(db.clone())),
            (None, opened) => {
                let store = match opened {
                    Some(store) => store.clone(),
                    None => EventStore::open(&crate::events::events_file(data_dir))?,
                };
                if let Some(aside) = store.take_set_aside() {
                    tracing::warn!(
                        damaged = %aside.path.display(), damage = %aside.damage,
                        "the event log was damaged: set aside, and a new one begun (the history before this start is not shown)"
                    );
                }
                store
            }
        })
    }

    /// The dashboard's login sessions: in the cluster's database (a login
    /// holds on every node) or in this node's memory.
    pub fn logins(&self) -> Logins {
        match &self.cluster {
            Some(db) => Logins::new(estafeta_postgres::PgLogins::new(db.clone())),
            None => Logins::default(),
        }
    }
}

/// Whether `url` can be a `store` setting: a `postgres://` (or
/// `postgresql://`) URL.
pub fn check_store_url(url: &str) -> Result<(), ServeError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(())
    } else {
        Err(ServeError::StoreUrl)
    }
}

/// The stores a node runs on: with no `store` URL, the embedded ones under
/// `data_dir`; with a `postgres://` URL, the cluster's database, its schema
/// created or brought up to date first (safe when several nodes start at
/// once).
pub async fn stores(
    data_dir: &Path,
    store: Option<&ClusterStore>,
    clock: Arc<dyn Clock>,
    quiesce: &Quiesce,
) -> Result<NodeStores, ServeError> {
    let Some(cluster) = store else {
        let exchange = Stores::embedded(data_dir, clock.clone(), quiesce)
            .await
            .map_err(ServeError::Open)?;
        return Ok(NodeStores {
            exchange,
            cluster: None,
            clock,
            database_clock: None,
        });
    };
    check_store_url(&cluster.url)?;
    // A node keeps nothing it needs to recover here, but its folder is
    // where `/readyz` checks that the node's disk takes writes.
    let own = estafeta_exchange::DataLayout::new(data_dir).state_dir();
    estafeta_durable::create_dir_all(&own, 0o700).map_err(|e| ServeError::NodeFolder(own, e))?;
    // A pool per kind of holder, so that no holder of a connection waits
    // for another of its own pool: a call's session step holds one of
    // `steps` while it takes its process's step (`process_steps`), runs
    // statements beside the step (`db`: a start's selection, a commit's
    // moves, the replies a prepare stores) and reloads the node's copy of
    // the registry (`registry_db`). Were they one pool, as many such calls
    // at once as it holds would each wait for a second connection until
    // the pool's wait ran out. Each shows in `pg_stat_activity` by its
    // `application_name`.
    let pool = |size: usize, name: &str| {
        estafeta_postgres::Store::connect_with(
            &cluster.url,
            &estafeta_postgres::Options {
                pool_size: size,
                application_name: Some(format!("estafeta {name}")),
                ..cluster.options.clone()
            },
        )
        .map_err(ServeError::Store)
    };
    let steps = pool(cluster.options.pool_size, "steps")?;
    let process_steps = pool(cluster.options.pool_size, "process steps")?;
    let db = pool(cluster.options.pool_size, "statements")?;
    let registry_db = pool(1, "registry")?;
    db.migrate().await.map_err(ServeError::Store)?;
    // Every node runs on the database server's time: deadlines and leases
    // one node sets mean the same to all, whatever their own clocks say.
    let database_clock = estafeta_postgres::DatabaseClock::start(db.clone(), clock, CLOCK_READING)
        .await
        .map_err(ServeError::Store)?;
    let clock: Arc<dyn Clock> = Arc::new(database_clock.clone());
    let sessions = estafeta_postgres::SessionStorage::open(steps)
        .await
        .map_err(ServeError::Store)?;
    let process_sessions = estafeta_postgres::SessionStorage::open(process_steps)
        .await
        .map_err(ServeError::Store)?;
    // The exchange's scheduler reads its own source only (the table also
    // holds the notifier's and the pusher's), and each due message is
    // claimed by one node, held by the claim's open transaction while it
    // is delivered (a delivery is one insert); listings read without
    // claiming. No store here passes the data folder's gates: an online
    // backup is the database's own (pg_dump, base backups), not a pause.
    let exchange = Stores {
        messages: Arc::new(estafeta_postgres::PgMessages::with_clock(
            db.clone(),
            clock.clone(),
        )),
        registry: Arc::new(estafeta_postgres::PgRegistry::new(registry_db)),
        sessions: Arc::new(sessions),
        process_sessions: Arc::new(process_sessions),
        scheduled: estafeta_exchange::store::Scheduled::with_listing(
            Arc::new(estafeta_postgres::PgQueue::holding(
                db.clone(),
                &[SCHEDULED_SOURCE],
                SCHEDULED_LEASE,
                SCHEDULED_HOLDS,
                SCHEDULED_HOLD_WAIT,
            )),
            Arc::new(estafeta_postgres::PgQueue::new(
                db.clone(),
                &[SCHEDULED_SOURCE],
            )),
            clock.clone(),
        ),
        keys: Arc::new(estafeta_postgres::PgKeys::new(db.clone())),
    };
    Ok(NodeStores {
        exchange,
        cluster: Some(db),
        clock,
        database_clock: Some(database_clock),
    })
}
