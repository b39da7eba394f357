//! The embedded registry store: `registry.redb` in the server's state
//! folder (`<data>/.estafeta/`), every change a durable (fsynced) redb
//! commit, and the admin token's hash in its own file beside it (mode
//! 0600): like every other token, the admin token is shown once and kept
//! only as its hash, so neither the data folder nor a backup of it holds
//! it. A file written by an earlier version, holding the token itself, is
//! rewritten as its hash when read.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use estafeta_durable::WriteGate;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::registry::{Change, RegistryStore, Snapshot};
use crate::error::TenancyError;
use crate::id::Id;
use crate::layout::DataLayout;
use crate::tenancy::{Endpoint, Role};
use crate::token::{Token, TokenHash};

/// Enterprise id → nothing.
const ENTERPRISES: TableDefinition<'static, &str, ()> = TableDefinition::new("enterprises");
/// (enterprise id, subsystem id) → nothing.
const SUBSYSTEMS: TableDefinition<'static, (&str, &str), ()> = TableDefinition::new("subsystems");
/// Database or device id → JSON [`Record`].
const ENDPOINTS: TableDefinition<'static, &str, &str> = TableDefinition::new("endpoints");
/// Database or device id → its webhook URL.
const WEBHOOKS: TableDefinition<'static, &str, &str> = TableDefinition::new("webhooks");

/// The stored form of an endpoint.
#[derive(Serialize, Deserialize)]
struct Record {
    enterprise: Id,
    /// Present for devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device_subsystem: Option<Id>,
    token_sha256: String,
}

/// The registry in `registry.redb`. Cheap to clone.
#[derive(Clone)]
pub struct RedbRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    /// The admin-token file.
    admin_file: PathBuf,
    /// What an online backup closes to hold back this store's writes.
    gate: WriteGate,
}

impl RedbRegistry {
    /// Opens (creating if needed, with its folders made durable) the
    /// registry of `layout`.
    pub async fn open(layout: &DataLayout) -> Result<Self, TenancyError> {
        RedbRegistry::open_gated(layout, WriteGate::default()).await
    }

    /// [`RedbRegistry::open`], every change passing `gate` (an online
    /// backup closes it to hold them back).
    pub async fn open_gated(layout: &DataLayout, gate: WriteGate) -> Result<Self, TenancyError> {
        let layout = layout.clone();
        blocking(move || open_blocking(&layout, gate)).await
    }

    /// Runs `f` on a blocking thread (redb commits fsync).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, TenancyError> + Send + 'static,
    ) -> Result<T, TenancyError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || f(&inner)).await
    }
}

#[async_trait::async_trait]
impl RegistryStore for RedbRegistry {
    /// The file is this server's alone.
    fn shared(&self) -> bool {
        false
    }

    async fn load(&self) -> Result<Snapshot, TenancyError> {
        self.run(|inner| load(&inner.db)).await
    }

    async fn admin(&self) -> Result<Option<TokenHash>, TenancyError> {
        self.run(|inner| read_admin_hash(&inner.admin_file)).await
    }

    async fn apply(&self, change: &Change) -> Result<(), TenancyError> {
        let change = change.clone();
        self.run(move |inner| inner.gate.pass(|| inner.apply(change)))
            .await
    }
}

impl Inner {
    fn apply(&self, change: Change) -> Result<(), TenancyError> {
        if let Change::SetAdmin(token) = &change {
            return save_admin_hash(&self.admin_file, &token.hash());
        }
        let txn = self.db.begin_write().map_err(redb::Error::from)?;
        match change {
            Change::CreateEnterprise(id) => {
                let mut table = txn.open_table(ENTERPRISES).map_err(redb::Error::from)?;
                if table.get(id.as_str()).map_err(redb::Error::from)?.is_some() {
                    return Err(exists("enterprise", &id));
                }
                table.insert(id.as_str(), ()).map_err(redb::Error::from)?;
            }
            Change::DeleteEnterprise(id) => {
                let mut table = txn.open_table(ENTERPRISES).map_err(redb::Error::from)?;
                table.remove(id.as_str()).map_err(redb::Error::from)?;
            }
            Change::CreateSubsystem { enterprise, id } => {
                let mut table = txn.open_table(SUBSYSTEMS).map_err(redb::Error::from)?;
                let key = (enterprise.as_str(), id.as_str());
                if table.get(key).map_err(redb::Error::from)?.is_some() {
                    return Err(exists("subsystem", &id));
                }
                table.insert(key, ()).map_err(redb::Error::from)?;
            }
            Change::DeleteSubsystem { enterprise, id } => {
                let mut table = txn.open_table(SUBSYSTEMS).map_err(redb::Error::from)?;
                table
                    .remove((enterprise.as_str(), id.as_str()))
                    .map_err(redb::Error::from)?;
            }
            Change::CreateEndpoint { endpoint, token } => {
                let json = record_json(&endpoint, &token)?;
                let mut table = txn.open_table(ENDPOINTS).map_err(redb::Error::from)?;
                if table
                    .get(endpoint.id.as_str())
                    .map_err(redb::Error::from)?
                    .is_some()
                {
                    return Err(exists("database or device", &endpoint.id));
                }
                table
                    .insert(endpoint.id.as_str(), json.as_str())
                    .map_err(redb::Error::from)?;
            }
            Change::DeleteEndpoint(id) => {
                let mut table = txn.open_table(ENDPOINTS).map_err(redb::Error::from)?;
                table.remove(id.as_str()).map_err(redb::Error::from)?;
                let mut table = txn.open_table(WEBHOOKS).map_err(redb::Error::from)?;
                table.remove(id.as_str()).map_err(redb::Error::from)?;
            }
            Change::SetToken { endpoint, token } => {
                let json = record_json(&endpoint, &token)?;
                let mut table = txn.open_table(ENDPOINTS).map_err(redb::Error::from)?;
                table
                    .insert(endpoint.id.as_str(), json.as_str())
                    .map_err(redb::Error::from)?;
            }
            Change::SetWebhook { id, url } => {
                let endpoints = txn.open_table(ENDPOINTS).map_err(redb::Error::from)?;
                if endpoints
                    .get(id.as_str())
                    .map_err(redb::Error::from)?
                    .is_none()
                {
                    return Err(TenancyError::Unknown {
                        kind: "database or device",
                        id: id.to_string(),
                    });
                }
                let mut table = txn.open_table(WEBHOOKS).map_err(redb::Error::from)?;
                match url {
                    Some(url) => table.insert(id.as_str(), url.as_str()),
                    None => table.remove(id.as_str()),
                }
                .map_err(redb::Error::from)?;
            }
            // Saved before the transaction.
            Change::SetAdmin(_) => {}
        }
        txn.commit().map_err(redb::Error::from)?;
        Ok(())
    }
}

/// The stored JSON of an endpoint with the token hash `hash`.
fn record_json(endpoint: &Endpoint, hash: &TokenHash) -> Result<String, TenancyError> {
    let record = Record {
        enterprise: endpoint.enterprise.clone(),
        device_subsystem: endpoint.role.subsystem().cloned(),
        token_sha256: hash.to_hex(),
    };
    serde_json::to_string(&record).map_err(|e| TenancyError::Corrupt {
        key: endpoint.id.to_string(),
        reason: e.to_string(),
    })
}

fn exists(kind: &'static str, id: &Id) -> TenancyError {
    TenancyError::AlreadyExists {
        kind,
        id: id.to_string(),
    }
}

/// Makes the state folder (mode 0700) and opens the redb file, making sure
/// the tables exist; on a first start, each new folder's entry is fsynced.
fn open_blocking(layout: &DataLayout, gate: WriteGate) -> Result<RedbRegistry, TenancyError> {
    // Private: it holds the admin token and the registry.
    let dir = layout.state_dir();
    // On a first start, the data folder and `.estafeta` itself.
    let mut new_folders = Vec::new();
    let mut up = Some(dir.as_path());
    while let Some(folder) = up.filter(|f| !f.as_os_str().is_empty() && !f.exists()) {
        new_folders.push(folder);
        up = folder.parent();
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| TenancyError::io(&dir, e))?;
    let db = estafeta_durable::open_redb(&layout.registry(), |db| {
        let txn = db.begin_write()?;
        txn.open_table(ENTERPRISES)?;
        txn.open_table(SUBSYSTEMS)?;
        txn.open_table(ENDPOINTS)?;
        txn.open_table(WEBHOOKS)?;
        txn.commit()?;
        Ok(())
    })?;
    // What this start created survives a power loss only once each new
    // folder's entry is fsynced.
    for folder in new_folders {
        let parent = match folder.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        sync_folder(parent)?;
    }
    Ok(RedbRegistry {
        inner: Arc::new(Inner {
            db,
            admin_file: layout.admin_token(),
            gate,
        }),
    })
}

/// Reads every table.
fn load(db: &Database) -> Result<Snapshot, TenancyError> {
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let mut snapshot = Snapshot::default();
    let corrupt = |key: &str, reason: String| TenancyError::Corrupt {
        key: key.to_owned(),
        reason,
    };
    let stored_id = |s: &str| Id::new(s).map_err(|e| corrupt(s, e.to_string()));

    let table = txn.open_table(ENTERPRISES).map_err(redb::Error::from)?;
    for row in table.iter().map_err(redb::Error::from)? {
        let (key, _) = row.map_err(redb::Error::from)?;
        snapshot
            .enterprises
            .insert(stored_id(key.value())?, BTreeSet::new());
    }
    let table = txn.open_table(SUBSYSTEMS).map_err(redb::Error::from)?;
    for row in table.iter().map_err(redb::Error::from)? {
        let (key, _) = row.map_err(redb::Error::from)?;
        let (enterprise, subsystem) = key.value();
        snapshot
            .enterprises
            .entry(stored_id(enterprise)?)
            .or_default()
            .insert(stored_id(subsystem)?);
    }
    let table = txn.open_table(ENDPOINTS).map_err(redb::Error::from)?;
    for row in table.iter().map_err(redb::Error::from)? {
        let (key, value) = row.map_err(redb::Error::from)?;
        let id = stored_id(key.value())?;
        let record: Record =
            serde_json::from_str(value.value()).map_err(|e| corrupt(id.as_str(), e.to_string()))?;
        let hash = TokenHash::from_hex(&record.token_sha256)
            .ok_or_else(|| corrupt(id.as_str(), "bad token hash".to_owned()))?;
        let role = match record.device_subsystem {
            None => Role::Database,
            Some(subsystem) => Role::Device { subsystem },
        };
        snapshot.endpoints.push((
            Endpoint {
                id,
                enterprise: record.enterprise,
                role,
            },
            hash,
        ));
    }
    let table = txn.open_table(WEBHOOKS).map_err(redb::Error::from)?;
    for row in table.iter().map_err(redb::Error::from)? {
        let (key, value) = row.map_err(redb::Error::from)?;
        snapshot
            .webhooks
            .push((stored_id(key.value())?, value.value().to_owned()));
    }
    Ok(snapshot)
}

/// How the admin-token file marks the hash it holds.
const HASH_PREFIX: &str = "sha256:";

/// The admin token's hash saved at `path`, if there is one. A file that
/// holds the token itself (written by an earlier version) is rewritten as
/// its hash first.
fn read_admin_hash(path: &Path) -> Result<Option<TokenHash>, TenancyError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TenancyError::io(path, e)),
    };
    let text = text.trim_end();
    if let Some(hex) = text.strip_prefix(HASH_PREFIX) {
        return TokenHash::from_hex(hex)
            .map(Some)
            .ok_or_else(|| TenancyError::Corrupt {
                key: path.display().to_string(),
                reason: "not an admin token's hash".into(),
            });
    }
    let hash = Token::from_text(text)?.hash();
    save_admin_hash(path, &hash)?;
    Ok(Some(hash))
}

/// Saves the admin token's hash at `path` with mode 0600: written to a
/// temporary file beside it created with that mode (never readable by
/// others, not even for a moment), fsynced, renamed, and the folder
/// fsynced.
fn save_admin_hash(path: &Path, hash: &TokenHash) -> Result<(), TenancyError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(path.file_name().unwrap_or_default());
    temp_name.push(".tmp");
    let temp = dir.join(temp_name);
    // A stale temporary file might have another mode; start from nothing.
    let _ = std::fs::remove_file(&temp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .and_then(|mut f| {
            writeln!(f, "{HASH_PREFIX}{}", hash.to_hex())?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&temp, path))
        .and_then(|()| std::fs::File::open(dir)?.sync_all());
    written.map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        TenancyError::io(path, e)
    })
}

/// Fsync a folder, making the entries created in it durable.
fn sync_folder(folder: &Path) -> Result<(), TenancyError> {
    #[cfg(test)]
    tests::SYNCED.with(|s| s.borrow_mut().push(folder.to_path_buf()));
    std::fs::File::open(folder)
        .and_then(|f| f.sync_all())
        .map_err(|e| TenancyError::io(folder, e))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TenancyError> + Send + 'static,
) -> Result<T, TenancyError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TenancyError::Join(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// The folders this thread fsynced through `sync_folder`.
        pub(super) static SYNCED: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
    }

    fn synced() -> BTreeSet<PathBuf> {
        SYNCED.with(|s| s.take()).into_iter().collect()
    }

    /// A first start creates the data folder, `.estafeta` and the registry
    /// file: each one's folder is fsynced. A later start creates nothing
    /// and fsyncs nothing (a full disk must not stop it).
    #[test]
    fn a_first_start_makes_its_new_folders_and_registry_durable() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let layout = DataLayout::new(&data);
        drop(open_blocking(&layout, WriteGate::default()).unwrap());
        // `.estafeta` itself is fsynced by the registry's creation.
        let expected: BTreeSet<PathBuf> = [tmp.path().to_path_buf(), data].into();
        assert_eq!(synced(), expected);
        drop(open_blocking(&layout, WriteGate::default()).unwrap());
        assert_eq!(synced(), BTreeSet::new());
    }

    /// The admin token is kept as its hash; a file holding the token itself
    /// is rewritten as its hash when read.
    #[test]
    fn the_admin_token_is_kept_only_as_its_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("admin-token");
        let token = Token::from_text("a-token-of-the-operator").unwrap();
        save_admin_hash(&path, &token.hash()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(token.expose()), "{text}");
        assert_eq!(read_admin_hash(&path).unwrap(), Some(token.hash()));
        std::fs::write(&path, "an-earlier-plain-token\n").unwrap();
        let earlier = Token::from_text("an-earlier-plain-token").unwrap();
        assert_eq!(read_admin_hash(&path).unwrap(), Some(earlier.hash()));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("sha256:{}\n", earlier.hash().to_hex()));
        std::fs::write(&path, "sha256:zz\n").unwrap();
        assert!(read_admin_hash(&path).is_err());
    }
}
