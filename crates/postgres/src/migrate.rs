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

/// How durable a committed step is on the database server: whether a
/// `COMMIT` waits for its write-ahead log to be flushed, and whether a
/// synchronous standby confirms it too (so that losing the primary loses
/// no step a node answered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Durability {
    /// The server's `synchronous_commit` (`on`, `remote_apply`, `off`, …).
    pub synchronous_commit: String,
    /// Its `synchronous_standby_names` (empty: none is waited for).
    pub standby_names: String,
    /// Standbys attached now that confirm commits (`sync` or `quorum`).
    pub synchronous_standbys: u64,
}

impl Durability {
    /// Whether every commit a node is answered is flushed to disk on the
    /// primary first (`off` answers before).
    pub fn flushes(&self) -> bool {
        self.synchronous_commit != "off"
    }

    /// Whether a committed step also survives losing the primary: commits
    /// wait for a synchronous standby, and one is attached.
    pub fn survives_the_primary(&self) -> bool {
        matches!(
            self.synchronous_commit.as_str(),
            "on" | "remote_write" | "remote_apply"
        ) && !self.standby_names.is_empty()
            && self.synchronous_standbys > 0
    }
}

const DURABILITY: &str = "SELECT current_setting('synchronous_commit'),
    current_setting('synchronous_standby_names'),
    (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))";

impl Store {
    /// What a committed step's durability rests on (for `estafeta check`).
    pub async fn durability(&self) -> Result<Durability, Error> {
        let client = self.client().await?;
        let row = client.query_one(DURABILITY, &[]).await?;
        Ok(Durability {
            synchronous_commit: row.get(0),
            standby_names: row.get(1),
            synchronous_standbys: u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
        })
    }

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
            .map_err(Error::from)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// Every migration in the folder is in the build (`build.rs` makes an
    /// added file rebuild the crate).
    #[test]
    fn every_migration_file_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let files = std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "sql")
            })
            .count();
        assert_eq!(super::migrations::runner().get_migrations().len(), files);
    }
}
