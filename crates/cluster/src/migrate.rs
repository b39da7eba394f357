//! The schema, created or updated at start by whichever node comes first.

use crate::{Error, Store};

refinery::embed_migrations!("migrations");

/// The advisory lock key that serialises migration runs of the whole cluster
/// (the bytes of "estafeta" read as a number).
const MIGRATION_LOCK: i64 = 0x6573_7461_6665_7461;

/// The schema's version in the store against this build's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchemaVersion {
    /// The last migration applied in the store (0: none, a new database).
    pub applied: u32,
    /// The last migration this build has.
    pub built: u32,
}

impl Store {
    /// The schema's version, read without changing anything (for
    /// `estafeta check`): the store's newest applied migration and this
    /// build's newest.
    pub async fn schema_version(&self) -> Result<SchemaVersion, Error> {
        let built = migrations::runner()
            .get_migrations()
            .iter()
            .map(|m| m.version())
            .max()
            .unwrap_or(0);
        let client = self.client().await?;
        let made: bool = client
            .query_one(
                "SELECT to_regclass('refinery_schema_history') IS NOT NULL",
                &[],
            )
            .await?
            .get(0);
        let applied: i32 = if made {
            client
                .query_one(
                    "SELECT coalesce(max(version), 0) FROM refinery_schema_history",
                    &[],
                )
                .await?
                .get(0)
        } else {
            0
        };
        Ok(SchemaVersion {
            applied: u32::try_from(applied).unwrap_or(0),
            built: u32::try_from(built).unwrap_or(0),
        })
    }

    /// Bring the schema up to this build's version. Safe when several nodes
    /// start at once: each run holds a cluster-wide advisory lock on its own
    /// connection, so one applies the migrations (all in one transaction)
    /// while the others wait and then find nothing left to do.
    ///
    /// The run's connection is taken out of the pool and closed afterwards,
    /// which releases the lock whatever happened; a node that dies mid-run
    /// releases it the same way, and its transaction is rolled back.
    pub async fn migrate(&self) -> Result<(), Error> {
        let mut client = deadpool_postgres::Object::take(self.client().await?);
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        let client: &mut tokio_postgres::Client = &mut client;
        migrations::runner()
            .set_grouped(true)
            .run_async(client)
            .await
            .map_err(Error::Migration)?;
        Ok(())
    }
}
