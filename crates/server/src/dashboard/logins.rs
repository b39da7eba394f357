//! The dashboard's login sessions ([`Logins`]), by a random session id:
//! in the node's memory, or in the cluster's store so that a login holds
//! on every node. Each keeps its CSRF token and the hash of the admin token
//! it was opened with, and ends when unused for [`IDLE_TIMEOUT`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use estafeta_exchange::token::{Token, TokenHash};
use estafeta_session::BoxFuture;
use tokio::time::Instant;

/// A session unused this long is gone.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(8 * 3600);

/// A login session store failed (the cluster's store is unreachable).
#[derive(Debug, thiserror::Error)]
#[error("login sessions: {0}")]
pub struct LoginError(String);

/// Where login sessions are kept, by session id: each ends when unused for
/// [`IDLE_TIMEOUT`].
pub trait LoginStore: Send + Sync {
    /// Keeps a new session `id` with its `csrf` token, durably.
    fn create<'a>(&'a self, id: &'a str, csrf: &'a str) -> BoxFuture<'a, Result<(), LoginError>>;

    /// The CSRF token of the live session `id`, marking it used; `None` if
    /// there is none or it ended.
    fn touch<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<String>, LoginError>>;

    /// Ends session `id`.
    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LoginError>>;
}

/// Logins in this node's memory (the embedded store: one node), on the
/// runtime's clock.
#[derive(Default)]
pub struct MemoryLogins {
    map: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    csrf: String,
    last_seen: Instant,
}

impl LoginStore for MemoryLogins {
    fn create<'a>(&'a self, id: &'a str, csrf: &'a str) -> BoxFuture<'a, Result<(), LoginError>> {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, e| now.duration_since(e.last_seen) < IDLE_TIMEOUT);
        map.insert(
            id.to_owned(),
            Entry {
                csrf: csrf.to_owned(),
                last_seen: now,
            },
        );
        Box::pin(std::future::ready(Ok(())))
    }

    fn touch<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<String>, LoginError>> {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let found = match map.get_mut(id) {
            Some(e) if now.duration_since(e.last_seen) < IDLE_TIMEOUT => {
                e.last_seen = now;
                Some(e.csrf.clone())
            }
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        };
        Box::pin(std::future::ready(Ok(found)))
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LoginError>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Logins in the cluster's store, by the hash of the session id; the
/// idle deadline runs on the database server's clock.
impl LoginStore for estafeta_postgres::PgLogins {
    fn create<'a>(&'a self, id: &'a str, csrf: &'a str) -> BoxFuture<'a, Result<(), LoginError>> {
        Box::pin(async move {
            estafeta_postgres::PgLogins::create(self, &TokenHash::of(id).0, csrf, IDLE_TIMEOUT)
                .await
                .map_err(|e| LoginError(e.to_string()))
        })
    }

    fn touch<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<String>, LoginError>> {
        Box::pin(async move {
            estafeta_postgres::PgLogins::touch(self, &TokenHash::of(id).0, IDLE_TIMEOUT)
                .await
                .map_err(|e| LoginError(e.to_string()))
        })
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LoginError>> {
        Box::pin(async move {
            estafeta_postgres::PgLogins::remove(self, &TokenHash::of(id).0)
                .await
                .map_err(|e| LoginError(e.to_string()))
        })
    }
}

/// The logged-in sessions.
pub struct Logins {
    store: Box<dyn LoginStore>,
}

impl Default for Logins {
    /// In this node's memory.
    fn default() -> Self {
        Logins::new(MemoryLogins::default())
    }
}

impl Logins {
    /// Logins kept in `store`.
    pub fn new(store: impl LoginStore + 'static) -> Logins {
        Logins {
            store: Box::new(store),
        }
    }

    /// A new session opened with the admin token whose hash is `admin`:
    /// its id and CSRF token (both random).
    pub async fn create(&self, admin: &TokenHash) -> Result<(String, String), LoginError> {
        let random = || {
            Token::generate()
                .map(|t| t.expose().to_owned())
                .map_err(|e| LoginError(e.to_string()))
        };
        let (id, csrf) = (random()?, random()?);
        // The store keeps, with the CSRF token (hex), the hash of the admin
        // token the session was opened with.
        let kept = format!("{csrf}.{}", admin.to_hex());
        self.store.create(&id, &kept).await?;
        Ok((id, csrf))
    }

    /// A live session's CSRF token and the hash of the admin token it was
    /// opened with (and marks it used).
    pub async fn touch(&self, id: &str) -> Result<Option<(String, TokenHash)>, LoginError> {
        let Some(kept) = self.store.touch(id).await? else {
            return Ok(None);
        };
        let opened_with = kept
            .split_once('.')
            .and_then(|(csrf, hash)| Some((csrf.to_owned(), TokenHash::from_hex(hash)?)));
        Ok(opened_with)
    }

    /// Ends a session.
    pub async fn remove(&self, id: &str) -> Result<(), LoginError> {
        self.store.remove(id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What every login store does: a session is found by its id until
    /// removed, with its own CSRF token.
    async fn a_login_store_keeps_sessions(one: &Logins, other: &Logins) {
        let admin = TokenHash::of("the-admin-token");
        let (id, csrf) = one.create(&admin).await.unwrap();
        assert_eq!(other.touch(&id).await.unwrap(), Some((csrf.clone(), admin)));
        let (second, csrf2) = other.create(&admin).await.unwrap();
        assert_ne!((&id, &csrf), (&second, &csrf2));
        assert_eq!(one.touch("unknown").await.unwrap(), None);
        other.remove(&id).await.unwrap();
        assert_eq!(one.touch(&id).await.unwrap(), None);
        assert_eq!(one.touch(&second).await.unwrap(), Some((csrf2, admin)));
    }

    #[tokio::test]
    async fn memory_logins_keep_sessions() {
        let s = Logins::default();
        a_login_store_keeps_sessions(&s, &s).await;
    }

    /// Two nodes' stores over one PostgreSQL: a login through one holds
    /// through the other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_logins_keep_sessions_across_nodes() {
        let pg = estafeta_postgres::testing::Postgres::start().unwrap();
        let db = estafeta_postgres::Store::connect(&pg.url()).unwrap();
        db.migrate().await.unwrap();
        let a = Logins::new(estafeta_postgres::PgLogins::new(db.clone()));
        let b = Logins::new(estafeta_postgres::PgLogins::new(db));
        a_login_store_keeps_sessions(&a, &b).await;
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_expire_when_idle() {
        let s = Logins::default();
        let admin = TokenHash::of("the-admin-token");
        let (id, csrf) = s.create(&admin).await.unwrap();
        assert_eq!(s.touch(&id).await.unwrap(), Some((csrf, admin)));
        tokio::time::advance(IDLE_TIMEOUT - Duration::from_secs(1)).await;
        assert!(s.touch(&id).await.unwrap().is_some(), "use keeps it alive");
        tokio::time::advance(IDLE_TIMEOUT).await;
        assert_eq!(s.touch(&id).await.unwrap(), None);
    }
}
