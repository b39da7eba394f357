//! [`PgLogins`]: dashboard login sessions in the `dashboard_sessions`
//! table, so that a login through one node holds on every node.
//!
//! A session is found by the hash of its cookie's secret (the secret itself
//! is never stored). Its idle deadline is kept in the database server's
//! clock, so that nodes whose clocks differ agree on when it ends.

use std::time::Duration;

use crate::{Error, Store};

/// The database server's clock, in milliseconds since the Unix epoch.
const NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Dashboard login sessions in the cluster store. Cheap to clone.
#[derive(Clone)]
pub struct PgLogins {
    store: Store,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl PgLogins {
    /// The login sessions of `store` (migrated).
    pub fn new(store: Store) -> PgLogins {
        PgLogins { store }
    }

    /// A new session under `secret_hash` with its CSRF token, ending when
    /// unused for `idle`. Sessions that ended are removed on the way.
    pub async fn create(
        &self,
        secret_hash: &[u8],
        csrf: &str,
        idle: Duration,
    ) -> Result<(), Error> {
        let mut client = self.store.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            &format!("DELETE FROM dashboard_sessions WHERE expires_at <= {NOW}"),
            &[],
        )
        .await?;
        tx.execute(
            &format!(
                "INSERT INTO dashboard_sessions (secret_hash, csrf, expires_at)
                 VALUES ($1, $2, {NOW} + $3)
                 ON CONFLICT (secret_hash) DO UPDATE
                 SET csrf = EXCLUDED.csrf, expires_at = EXCLUDED.expires_at"
            ),
            &[&secret_hash, &csrf, &millis(idle)],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The CSRF token of the live session under `secret_hash`, whose idle
    /// deadline moves `idle` ahead; `None` if there is none or it ended.
    pub async fn touch(&self, secret_hash: &[u8], idle: Duration) -> Result<Option<String>, Error> {
        let client = self.store.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "UPDATE dashboard_sessions SET expires_at = {NOW} + $2
                     WHERE secret_hash = $1 AND expires_at > {NOW} RETURNING csrf"
                ),
                &[&secret_hash, &millis(idle)],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Ends the session under `secret_hash`.
    pub async fn remove(&self, secret_hash: &[u8]) -> Result<(), Error> {
        let client = self.store.client().await?;
        client
            .execute(
                "DELETE FROM dashboard_sessions WHERE secret_hash = $1",
                &[&secret_hash],
            )
            .await?;
        Ok(())
    }
}
