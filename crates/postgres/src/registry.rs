//! The exchange's registry (`estafeta_exchange::store::RegistryStore`) over
//! the cluster store: the `enterprises`, `subsystems` and `mailboxes`
//! tables (with each database's and device's webhook in `push_url`), the
//! admin token's hash in `cluster_settings`, and the change counter
//! `registry` in `cluster_counters`.
//!
//! Every node keeps the registry in memory; each change bumps the counter in
//! its own transaction, and a node whose copy was loaded at a lower counter
//! reloads before it answers (`Registry::refresh`, or `Registry::refresh_to`
//! with the counter a session step's lock read), so a device created, a
//! token revoked or a webhook set through one node holds on every node at
//! once.

use crate::Store;
use estafeta_exchange::TenancyError;
use estafeta_exchange::id::Id;
use estafeta_exchange::store::{Change, RegistryStore, Snapshot};
use estafeta_exchange::tenancy::{Endpoint, Role};
use estafeta_exchange::token::{Token, TokenHash};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

/// The database's clock in milliseconds since the Unix epoch (the rows'
/// `created_at`: one clock for every node).
const NOW: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";
const ADMIN: &str = "admin_token_sha256";
/// The registry's change counter (also read beside a device's inbox,
/// `PgMessages::oldest_array_and_registry`).
pub(crate) const VERSION: &str =
    "SELECT coalesce((SELECT value FROM cluster_counters WHERE name = 'registry'), 0)";
const BUMP: &str = "INSERT INTO cluster_counters (name, value) VALUES ('registry', 1)
    ON CONFLICT (name) DO UPDATE SET value = cluster_counters.value + 1";

/// The registry in the cluster store. Cheap to clone.
#[derive(Clone)]
pub struct PgRegistry {
    store: Store,
}

impl PgRegistry {
    /// The registry over `store` (its schema migrated).
    pub fn new(store: Store) -> PgRegistry {
        PgRegistry { store }
    }
}

/// A store failure, as the registry's error: unavailable (retry later) or
/// failed, as [`crate::Error::is_unavailable`] tells.
fn shared(e: impl Into<crate::Error>) -> TenancyError {
    let e = e.into();
    match e.is_unavailable() {
        true => TenancyError::Unavailable(Box::new(e)),
        false => TenancyError::Shared(Box::new(e)),
    }
}

/// A stored id that does not parse (a row written by hand).
fn stored_id(text: String) -> Result<Id, TenancyError> {
    Id::new(text.clone()).map_err(|e| TenancyError::Corrupt {
        key: text,
        reason: e.to_string(),
    })
}

fn stored_hash(id: &str, bytes: &[u8]) -> Result<TokenHash, TenancyError> {
    let bytes: [u8; 32] = bytes.try_into().map_err(|_| TenancyError::Corrupt {
        key: id.to_owned(),
        reason: format!("a token hash of {} bytes, not 32", bytes.len()),
    })?;
    Ok(TokenHash(bytes))
}

/// What a failed statement of `change` means to the registry: a row another
/// node's change refers to (a foreign key) is a refusal the registry names;
/// anything else is a store failure.
fn refused(change: &Change, e: tokio_postgres::Error) -> TenancyError {
    if e.code() != Some(&SqlState::FOREIGN_KEY_VIOLATION) {
        return shared(e);
    }
    match change {
        Change::DeleteEnterprise(id) => TenancyError::InUse {
            kind: "enterprise",
            id: id.to_string(),
            reason: "it has subsystems, databases or devices; delete those first".into(),
        },
        Change::DeleteSubsystem { id, .. } => TenancyError::InUse {
            kind: "subsystem",
            id: id.to_string(),
            reason: "devices run it; delete them first".into(),
        },
        Change::CreateSubsystem { enterprise, .. } => {
            TenancyError::UnknownEnterprise(enterprise.to_string())
        }
        Change::CreateEndpoint { endpoint, .. } => match &endpoint.role {
            Role::Device { subsystem } => TenancyError::UnknownSubsystem {
                enterprise: endpoint.enterprise.to_string(),
                subsystem: subsystem.to_string(),
            },
            Role::Database => TenancyError::UnknownEnterprise(endpoint.enterprise.to_string()),
        },
        _ => shared(e),
    }
}

fn exists(kind: &'static str, id: &Id) -> TenancyError {
    TenancyError::AlreadyExists {
        kind,
        id: id.to_string(),
    }
}

#[async_trait::async_trait]
impl RegistryStore for PgRegistry {
    async fn load(&self) -> Result<Snapshot, TenancyError> {
        let mut client = self.store.client().await.map_err(shared)?;
        // One snapshot of the database: the records and the counter agree.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(shared)?;
        let version: i64 = tx.query_one(VERSION, &[]).await.map_err(shared)?.get(0);
        let mut snapshot = Snapshot {
            version: u64::try_from(version).unwrap_or(0),
            ..Snapshot::default()
        };
        for row in tx
            .query("SELECT id FROM enterprises", &[])
            .await
            .map_err(shared)?
        {
            snapshot
                .enterprises
                .entry(stored_id(row.get(0))?)
                .or_default();
        }
        for row in tx
            .query("SELECT enterprise_id, id FROM subsystems", &[])
            .await
            .map_err(shared)?
        {
            snapshot
                .enterprises
                .entry(stored_id(row.get(0))?)
                .or_default()
                .insert(stored_id(row.get(1))?);
        }
        for row in tx
            .query(
                "SELECT id, enterprise_id, subsystem_id, token_hash, push_url FROM mailboxes",
                &[],
            )
            .await
            .map_err(shared)?
        {
            let id: String = row.get(0);
            let hash = stored_hash(&id, row.get(3))?;
            let role = match row.get::<_, Option<String>>(2) {
                Some(subsystem) => Role::Device {
                    subsystem: stored_id(subsystem)?,
                },
                None => Role::Database,
            };
            let endpoint = Endpoint {
                id: stored_id(id)?,
                enterprise: stored_id(row.get(1))?,
                role,
            };
            if let Some(url) = row.get::<_, Option<String>>(4) {
                snapshot.webhooks.push((endpoint.id.clone(), url));
            }
            snapshot.endpoints.push((endpoint, hash));
        }
        tx.commit().await.map_err(shared)?;
        Ok(snapshot)
    }

    async fn admin(&self) -> Result<Option<TokenHash>, TenancyError> {
        let client = self.store.client().await.map_err(shared)?;
        let row = client
            .query_opt(
                "SELECT value FROM cluster_settings WHERE name = $1",
                &[&ADMIN],
            )
            .await
            .map_err(shared)?;
        row.map(|r| stored_hash(ADMIN, r.get(0))).transpose()
    }

    async fn apply(&self, change: &Change) -> Result<(), TenancyError> {
        let mut client = self.store.client().await.map_err(shared)?;
        let tx = client.transaction().await.map_err(shared)?;
        // The change's transaction id: a lost answer to its `COMMIT` is
        // looked up, so a change that was made answers as made (a created
        // device's token is only ever shown in that answer).
        let xid: String = tx
            .query_one(crate::outcome::CURRENT_XID, &[])
            .await
            .map_err(shared)?
            .get(0);
        let no = |e| refused(change, e);
        match change {
            Change::CreateEnterprise(id) => {
                let sql = format!(
                    "INSERT INTO enterprises (id, created_at) VALUES ($1, {NOW}) ON CONFLICT DO NOTHING"
                );
                if tx.execute(&sql, &[&id.as_str()]).await.map_err(no)? == 0 {
                    return Err(exists("enterprise", id));
                }
            }
            Change::DeleteEnterprise(id) => {
                tx.execute("DELETE FROM enterprises WHERE id = $1", &[&id.as_str()])
                    .await
                    .map_err(no)?;
            }
            Change::CreateSubsystem { enterprise, id } => {
                let sql = format!(
                    "INSERT INTO subsystems (enterprise_id, id, created_at) VALUES ($1, $2, {NOW})
                    ON CONFLICT DO NOTHING"
                );
                let params: [&(dyn ToSql + Sync); 2] = [&enterprise.as_str(), &id.as_str()];
                if tx.execute(&sql, &params).await.map_err(no)? == 0 {
                    return Err(exists("subsystem", id));
                }
            }
            Change::DeleteSubsystem { enterprise, id } => {
                let params: [&(dyn ToSql + Sync); 2] = [&enterprise.as_str(), &id.as_str()];
                tx.execute(
                    "DELETE FROM subsystems WHERE enterprise_id = $1 AND id = $2",
                    &params,
                )
                .await
                .map_err(no)?;
            }
            Change::CreateEndpoint { endpoint, token } => {
                let (kind, subsystem) = match &endpoint.role {
                    Role::Database => ("database", None),
                    Role::Device { subsystem } => ("device", Some(subsystem.as_str())),
                };
                let sql = format!(
                    "INSERT INTO mailboxes (id, kind, enterprise_id, subsystem_id, token_hash, created_at)
                    VALUES ($1, $2, $3, $4, $5, {NOW}) ON CONFLICT (id) DO NOTHING"
                );
                let hash: &[u8] = &token.0;
                let params: [&(dyn ToSql + Sync); 5] = [
                    &endpoint.id.as_str(),
                    &kind,
                    &endpoint.enterprise.as_str(),
                    &subsystem,
                    &hash,
                ];
                if tx.execute(&sql, &params).await.map_err(no)? == 0 {
                    return Err(exists("database or device", &endpoint.id));
                }
            }
            Change::DeleteEndpoint(id) => {
                // Its messages are the message store's to remove, which the
                // exchange did first.
                tx.execute("DELETE FROM mailboxes WHERE id = $1", &[&id.as_str()])
                    .await
                    .map_err(no)?;
            }
            Change::SetToken { endpoint, token } => {
                let hash: &[u8] = &token.0;
                let params: [&(dyn ToSql + Sync); 2] = [&endpoint.id.as_str(), &hash];
                tx.execute(
                    "UPDATE mailboxes SET token_hash = $2 WHERE id = $1",
                    &params,
                )
                .await
                .map_err(no)?;
            }
            Change::SetWebhook { id, url } => {
                let params: [&(dyn ToSql + Sync); 2] = [&id.as_str(), url];
                let set = tx
                    .execute("UPDATE mailboxes SET push_url = $2 WHERE id = $1", &params)
                    .await
                    .map_err(no)?;
                if set == 0 {
                    return Err(TenancyError::Unknown {
                        kind: "database or device",
                        id: id.to_string(),
                    });
                }
            }
            Change::SetAdmin(token) => {
                let hash = token.hash().0;
                let hash: &[u8] = &hash;
                let params: [&(dyn ToSql + Sync); 2] = [&ADMIN, &hash];
                tx.execute(
                    "INSERT INTO cluster_settings (name, value) VALUES ($1, $2)
                    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
                    &params,
                )
                .await
                .map_err(no)?;
            }
        }
        tx.execute(BUMP, &[]).await.map_err(shared)?;
        let Err(failed) = tx.commit().await else {
            return Ok(());
        };
        drop(client);
        let failed = crate::Error::from(failed);
        self.store.found_out(failed, &xid).await.map_err(shared)
    }

    async fn set_first_admin(&self, token: &Token) -> Result<bool, TenancyError> {
        let client = self.store.client().await.map_err(shared)?;
        let stored = client
            .execute(
                "INSERT INTO cluster_settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                &[&ADMIN, &token.hash().0.as_slice()],
            )
            .await
            .map_err(shared)?;
        Ok(stored == 1)
    }

    /// Read with the step's lock, in the same statement
    /// (`Locked::registry`).
    fn version_in_step(&self, step: &mut dyn estafeta_session::storage::Step) -> Option<u64> {
        crate::session_storage::joint_of(step).map(|joint| joint.registry)
    }

    /// Every node of the cluster changes it.
    fn shared(&self) -> bool {
        true
    }

    async fn version(&self) -> Result<u64, TenancyError> {
        let client = self.store.client().await.map_err(shared)?;
        let stmt = client.prepare_cached(VERSION).await.map_err(shared)?;
        let version: i64 = client.query_one(&stmt, &[]).await.map_err(shared)?.get(0);
        Ok(u64::try_from(version).unwrap_or(0))
    }
}
