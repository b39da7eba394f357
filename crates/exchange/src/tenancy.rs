//! The registry of enterprises, subsystems, databases and devices, and
//! authentication of bearer tokens.
//!
//! Records live in a redb file, `registry.redb`, in the server's state
//! folder (`<data>/.estafeta/`); every change is a durable (fsynced) redb
//! commit before it is acknowledged. A copy is kept in memory, so
//! authentication and lookups, which every request makes, never touch the
//! disk. Database and device ids share one namespace across the server:
//! they name mailbox folders, and a message names its sender and recipient
//! by id alone.
//!
//! Tokens are shown once and stored only as SHA-256 hashes. A presented
//! token is hashed and looked up by its hash; the lookup cannot leak the
//! secret (the attacker does not control the hash bytes), and the final
//! comparison is constant-time. The admin token's hash is held in memory and
//! compared in constant time as well.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, RwLock};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::error::TenancyError;
use crate::id::Id;
use crate::layout::DataLayout;
use crate::token::{Token, TokenHash};

/// Enterprise id → nothing.
const ENTERPRISES: TableDefinition<'static, &str, ()> = TableDefinition::new("enterprises");
/// (enterprise id, subsystem id) → nothing.
const SUBSYSTEMS: TableDefinition<'static, (&str, &str), ()> = TableDefinition::new("subsystems");
/// Database or device id → JSON [`Record`].
const ENDPOINTS: TableDefinition<'static, &str, &str> = TableDefinition::new("endpoints");

/// Who a token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The administrator.
    Admin,
    /// A database (a processor working on it).
    Database {
        /// The database id.
        id: Id,
        /// Its enterprise.
        enterprise: Id,
    },
    /// A mobile device.
    Device {
        /// The device id.
        id: Id,
        /// Its enterprise.
        enterprise: Id,
        /// Its subsystem (mobile application).
        subsystem: Id,
    },
}

/// What a registered database or device id is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A database.
    Database,
    /// A device running an application of the given subsystem.
    Device {
        /// The subsystem.
        subsystem: Id,
    },
}

/// A registered database or device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Its id (also its mailbox folder's name).
    pub id: Id,
    /// The enterprise that owns it.
    pub enterprise: Id,
    /// Database or device.
    pub role: Role,
}

impl Endpoint {
    /// The principal its token authenticates as.
    fn principal(&self) -> Principal {
        match &self.role {
            Role::Database => Principal::Database {
                id: self.id.clone(),
                enterprise: self.enterprise.clone(),
            },
            Role::Device { subsystem } => Principal::Device {
                id: self.id.clone(),
                enterprise: self.enterprise.clone(),
                subsystem: subsystem.clone(),
            },
        }
    }
}

/// Where the admin token came from when the registry was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminToken {
    /// Given by the operator (`ESTAFETA_ADMIN_TOKEN`).
    Configured,
    /// Read from `<state>/admin-token`, made at an earlier start.
    Existing,
    /// Made now and saved to `<state>/admin-token` (mode 0600); the server
    /// prints it once.
    Generated(Token),
}

/// The stored form of an endpoint.
#[derive(Serialize, Deserialize)]
struct Record {
    enterprise: Id,
    /// Present for devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device_subsystem: Option<Id>,
    token_sha256: String,
}

/// The in-memory copy of the registry.
#[derive(Default)]
struct Cache {
    /// Enterprise → its subsystems.
    enterprises: BTreeMap<Id, BTreeSet<Id>>,
    endpoints: BTreeMap<Id, (Endpoint, TokenHash)>,
    by_token: HashMap<TokenHash, Id>,
}

impl Cache {
    fn add_endpoint(&mut self, endpoint: Endpoint, hash: TokenHash) {
        self.by_token.insert(hash, endpoint.id.clone());
        self.endpoints.insert(endpoint.id.clone(), (endpoint, hash));
    }
}

/// The tenancy registry. Cheap to clone (shared).
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    /// The admin token's hash; replaced by [`Registry::rotate_admin_token`].
    admin: RwLock<TokenHash>,
    /// Where the admin token is saved; `None` when the environment pins it.
    admin_file: Option<std::path::PathBuf>,
    cache: RwLock<Cache>,
}

/// Which kind of registered id a paged list or a lookup is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Databases.
    Database,
    /// Devices.
    Device,
}

impl Kind {
    /// `"database"` or `"device"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Database => "database",
            Kind::Device => "device",
        }
    }

    fn holds(self, role: &Role) -> bool {
        matches!(
            (self, role),
            (Kind::Database, Role::Database) | (Kind::Device, Role::Device { .. })
        )
    }
}

impl Registry {
    /// Opens (creating if needed) the registry in the state folder of
    /// `layout`. The admin token is `admin_token` when given; otherwise the
    /// one saved in the layout's admin-token file, or a new one made and
    /// saved there with mode 0600 ([`AdminToken::Generated`]).
    pub async fn open(
        layout: &DataLayout,
        admin_token: Option<String>,
    ) -> Result<(Self, AdminToken), TenancyError> {
        let layout = layout.clone();
        blocking(move || open_blocking(&layout, admin_token)).await
    }

    /// Who `token` belongs to, or `None` for an unknown token (401).
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let presented = TokenHash::of(token);
        let admin = *self.inner.admin.read().unwrap_or_else(|p| p.into_inner());
        if admin.ct_eq(&presented) {
            return Some(Principal::Admin);
        }
        let cache = self.read();
        let id = cache.by_token.get(&presented)?;
        let (endpoint, stored) = cache.endpoints.get(id)?;
        stored.ct_eq(&presented).then(|| endpoint.principal())
    }

    /// Creates an enterprise; [`TenancyError::AlreadyExists`] if it exists.
    pub async fn create_enterprise(&self, id: Id) -> Result<(), TenancyError> {
        self.write(move |inner| {
            let txn = inner.db.begin_write().map_err(redb::Error::from)?;
            {
                let mut table = txn.open_table(ENTERPRISES).map_err(redb::Error::from)?;
                if table.get(id.as_str()).map_err(redb::Error::from)?.is_some() {
                    return Err(exists("enterprise", &id));
                }
                table.insert(id.as_str(), ()).map_err(redb::Error::from)?;
            }
            txn.commit().map_err(redb::Error::from)?;
            inner.write_cache().enterprises.entry(id).or_default();
            Ok(())
        })
        .await
    }

    /// Creates a subsystem of an enterprise.
    pub async fn create_subsystem(&self, enterprise: Id, id: Id) -> Result<(), TenancyError> {
        self.write(move |inner| {
            inner.require_enterprise(&enterprise)?;
            let txn = inner.db.begin_write().map_err(redb::Error::from)?;
            {
                let mut table = txn.open_table(SUBSYSTEMS).map_err(redb::Error::from)?;
                let key = (enterprise.as_str(), id.as_str());
                if table.get(key).map_err(redb::Error::from)?.is_some() {
                    return Err(exists("subsystem", &id));
                }
                table.insert(key, ()).map_err(redb::Error::from)?;
            }
            txn.commit().map_err(redb::Error::from)?;
            inner
                .write_cache()
                .enterprises
                .entry(enterprise)
                .or_default()
                .insert(id);
            Ok(())
        })
        .await
    }

    /// Creates a database of an enterprise and returns its token (shown once).
    pub async fn create_database(&self, enterprise: Id, id: Id) -> Result<Token, TenancyError> {
        self.write(move |inner| {
            inner.require_enterprise(&enterprise)?;
            inner.add_endpoint(Endpoint {
                id,
                enterprise,
                role: Role::Database,
            })
        })
        .await
    }

    /// Creates a device of an enterprise, running `subsystem`'s application,
    /// and returns its token (shown once).
    pub async fn create_device(
        &self,
        enterprise: Id,
        id: Id,
        subsystem: Id,
    ) -> Result<Token, TenancyError> {
        self.write(move |inner| {
            inner.require_enterprise(&enterprise)?;
            let known = inner
                .read_cache()
                .enterprises
                .get(&enterprise)
                .is_some_and(|s| s.contains(&subsystem));
            if !known {
                return Err(TenancyError::UnknownSubsystem {
                    enterprise: enterprise.into_string(),
                    subsystem: subsystem.into_string(),
                });
            }
            inner.add_endpoint(Endpoint {
                id,
                enterprise,
                role: Role::Device { subsystem },
            })
        })
        .await
    }

    /// Whether the enterprise exists.
    pub fn enterprise_exists(&self, id: &Id) -> bool {
        self.read().enterprises.contains_key(id)
    }

    /// All enterprises, sorted.
    pub fn enterprises(&self) -> Vec<Id> {
        self.read().enterprises.keys().cloned().collect()
    }

    /// The subsystems of an enterprise, sorted (empty if it does not exist).
    pub fn subsystems(&self, enterprise: &Id) -> Vec<Id> {
        self.read()
            .enterprises
            .get(enterprise)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The database or device registered under `id`.
    pub fn endpoint(&self, id: &Id) -> Option<Endpoint> {
        self.read().endpoints.get(id).map(|(e, _)| e.clone())
    }

    /// The enterprise that owns a database or device id.
    pub fn enterprise_of(&self, id: &Id) -> Option<Id> {
        self.read()
            .endpoints
            .get(id)
            .map(|(e, _)| e.enterprise.clone())
    }

    /// Whether `id` is a database of `enterprise` (a device may send only to those).
    pub fn is_database_of(&self, id: &Id, enterprise: &Id) -> bool {
        self.read()
            .endpoints
            .get(id)
            .is_some_and(|(e, _)| e.role == Role::Database && &e.enterprise == enterprise)
    }

    /// The subsystem of a device (`None` if `id` is not a device).
    pub fn device_subsystem(&self, id: &Id) -> Option<Id> {
        match self.read().endpoints.get(id) {
            Some((
                Endpoint {
                    role: Role::Device { subsystem },
                    ..
                },
                _,
            )) => Some(subsystem.clone()),
            _ => None,
        }
    }

    /// All databases, sorted by id.
    pub fn databases(&self) -> Vec<Endpoint> {
        self.endpoints_where(|e| e.role == Role::Database)
    }

    /// All devices, sorted by id.
    pub fn devices(&self) -> Vec<Endpoint> {
        self.endpoints_where(|e| matches!(e.role, Role::Device { .. }))
    }

    /// Up to `limit` enterprises after `after` (exclusive), sorted, each
    /// with its subsystems.
    pub fn enterprises_page(&self, after: Option<&Id>, limit: usize) -> Vec<(Id, Vec<Id>)> {
        let cache = self.read();
        let from = match after {
            Some(a) => std::ops::Bound::Excluded(a),
            None => std::ops::Bound::Unbounded,
        };
        cache
            .enterprises
            .range::<Id, _>((from, std::ops::Bound::Unbounded))
            .take(limit)
            .map(|(id, subs)| (id.clone(), subs.iter().cloned().collect()))
            .collect()
    }

    /// Up to `limit` databases or devices after `after` (exclusive), sorted
    /// by id, of `enterprise` when given.
    pub fn endpoints_page(
        &self,
        kind: Kind,
        enterprise: Option<&Id>,
        after: Option<&Id>,
        limit: usize,
    ) -> Vec<Endpoint> {
        let cache = self.read();
        let from = match after {
            Some(a) => std::ops::Bound::Excluded(a),
            None => std::ops::Bound::Unbounded,
        };
        cache
            .endpoints
            .range::<Id, _>((from, std::ops::Bound::Unbounded))
            .map(|(_, (e, _))| e)
            .filter(|e| kind.holds(&e.role) && enterprise.is_none_or(|ent| &e.enterprise == ent))
            .take(limit)
            .cloned()
            .collect()
    }

    /// Deletes an enterprise; refused ([`TenancyError::InUse`]) while it has
    /// subsystems, databases or devices.
    pub async fn delete_enterprise(&self, id: Id) -> Result<(), TenancyError> {
        self.write(move |inner| {
            inner.require_enterprise(&id)?;
            {
                let cache = inner.read_cache();
                let members = cache
                    .endpoints
                    .values()
                    .filter(|(e, _)| e.enterprise == id)
                    .count();
                let subsystems = cache.enterprises.get(&id).map_or(0, BTreeSet::len);
                if members > 0 || subsystems > 0 {
                    return Err(TenancyError::InUse {
                        kind: "enterprise",
                        id: id.to_string(),
                        reason: format!(
                            "it has {members} databases and devices and {subsystems} subsystems; delete those first"
                        ),
                    });
                }
            }
            let txn = inner.db.begin_write().map_err(redb::Error::from)?;
            {
                let mut table = txn.open_table(ENTERPRISES).map_err(redb::Error::from)?;
                table.remove(id.as_str()).map_err(redb::Error::from)?;
            }
            txn.commit().map_err(redb::Error::from)?;
            inner.write_cache().enterprises.remove(&id);
            Ok(())
        })
        .await
    }

    /// Deletes a subsystem of an enterprise; refused
    /// ([`TenancyError::InUse`]) while a device runs it.
    pub async fn delete_subsystem(&self, enterprise: Id, id: Id) -> Result<(), TenancyError> {
        self.write(move |inner| {
            inner.require_enterprise(&enterprise)?;
            {
                let cache = inner.read_cache();
                if !cache
                    .enterprises
                    .get(&enterprise)
                    .is_some_and(|s| s.contains(&id))
                {
                    return Err(TenancyError::UnknownSubsystem {
                        enterprise: enterprise.into_string(),
                        subsystem: id.into_string(),
                    });
                }
                let devices = cache
                    .endpoints
                    .values()
                    .filter(|(e, _)| {
                        e.enterprise == enterprise
                            && matches!(&e.role, Role::Device { subsystem } if *subsystem == id)
                    })
                    .count();
                if devices > 0 {
                    return Err(TenancyError::InUse {
                        kind: "subsystem",
                        id: id.to_string(),
                        reason: format!("{devices} devices run it; delete them first"),
                    });
                }
            }
            let txn = inner.db.begin_write().map_err(redb::Error::from)?;
            {
                let mut table = txn.open_table(SUBSYSTEMS).map_err(redb::Error::from)?;
                table
                    .remove((enterprise.as_str(), id.as_str()))
                    .map_err(redb::Error::from)?;
            }
            txn.commit().map_err(redb::Error::from)?;
            if let Some(subs) = inner.write_cache().enterprises.get_mut(&enterprise) {
                subs.remove(&id);
            }
            Ok(())
        })
        .await
    }

    /// Deletes a database or device (of `kind`): its token stops working at
    /// once. Its mailbox is the caller's to empty.
    pub async fn delete_endpoint(&self, kind: Kind, id: Id) -> Result<Endpoint, TenancyError> {
        self.write(move |inner| {
            let endpoint = inner.require_endpoint(kind, &id)?;
            let txn = inner.db.begin_write().map_err(redb::Error::from)?;
            {
                let mut table = txn.open_table(ENDPOINTS).map_err(redb::Error::from)?;
                table.remove(id.as_str()).map_err(redb::Error::from)?;
            }
            txn.commit().map_err(redb::Error::from)?;
            let mut cache = inner.write_cache();
            if let Some((_, hash)) = cache.endpoints.remove(&id) {
                cache.by_token.remove(&hash);
            }
            Ok(endpoint)
        })
        .await
    }

    /// Gives a database or device (of `kind`) a new token, returned to be
    /// shown once; the old one stops working at once.
    pub async fn rotate_token(&self, kind: Kind, id: Id) -> Result<Token, TenancyError> {
        self.write(move |inner| {
            let endpoint = inner.require_endpoint(kind, &id)?;
            let token = Token::generate()?;
            let hash = token.hash();
            let json = record_json(&endpoint, &hash)?;
            let txn = inner.db.begin_write().map_err(redb::Error::from)?;
            {
                let mut table = txn.open_table(ENDPOINTS).map_err(redb::Error::from)?;
                table
                    .insert(id.as_str(), json.as_str())
                    .map_err(redb::Error::from)?;
            }
            txn.commit().map_err(redb::Error::from)?;
            let mut cache = inner.write_cache();
            if let Some((_, old)) = cache.endpoints.remove(&id) {
                cache.by_token.remove(&old);
            }
            cache.add_endpoint(endpoint, hash);
            Ok(token)
        })
        .await
    }

    /// Replaces the admin token with a new one, returned to be shown once:
    /// saved to the admin-token file (mode 0600) first, then the old one
    /// stops working. Refused ([`TenancyError::AdminTokenPinned`]) when the
    /// token comes from the environment: the server cannot change that.
    pub async fn rotate_admin_token(&self) -> Result<Token, TenancyError> {
        self.write(move |inner| {
            let path = inner
                .admin_file
                .as_ref()
                .ok_or(TenancyError::AdminTokenPinned)?;
            let token = Token::generate()?;
            save_admin_token(path, &token)?;
            *inner.admin.write().unwrap_or_else(|p| p.into_inner()) = token.hash();
            Ok(token)
        })
        .await
    }

    fn endpoints_where(&self, keep: impl Fn(&Endpoint) -> bool) -> Vec<Endpoint> {
        self.read()
            .endpoints
            .values()
            .map(|(e, _)| e)
            .filter(|e| keep(e))
            .cloned()
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Cache> {
        self.inner.read_cache()
    }

    /// Runs a registry change on a blocking thread (redb commits fsync).
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, TenancyError> + Send + 'static,
    ) -> Result<T, TenancyError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || f(&inner)).await
    }
}

impl Inner {
    // A poisoned lock only means a panic elsewhere; the cache is updated by
    // single inserts after each commit, so it is still consistent.
    fn read_cache(&self) -> std::sync::RwLockReadGuard<'_, Cache> {
        self.cache.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_cache(&self) -> std::sync::RwLockWriteGuard<'_, Cache> {
        self.cache.write().unwrap_or_else(|p| p.into_inner())
    }

    fn require_enterprise(&self, enterprise: &Id) -> Result<(), TenancyError> {
        if self.read_cache().enterprises.contains_key(enterprise) {
            Ok(())
        } else {
            Err(TenancyError::UnknownEnterprise(enterprise.to_string()))
        }
    }

    /// The database or device (of `kind`) `id`; [`TenancyError::Unknown`] if
    /// there is none.
    fn require_endpoint(&self, kind: Kind, id: &Id) -> Result<Endpoint, TenancyError> {
        match self.read_cache().endpoints.get(id) {
            Some((e, _)) if kind.holds(&e.role) => Ok(e.clone()),
            _ => Err(TenancyError::Unknown {
                kind: kind.as_str(),
                id: id.to_string(),
            }),
        }
    }

    /// Stores a new database or device with a fresh token, durably.
    fn add_endpoint(&self, endpoint: Endpoint) -> Result<Token, TenancyError> {
        let token = Token::generate()?;
        let hash = token.hash();
        let json = record_json(&endpoint, &hash)?;
        let txn = self.db.begin_write().map_err(redb::Error::from)?;
        {
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
        txn.commit().map_err(redb::Error::from)?;
        self.write_cache().add_endpoint(endpoint, hash);
        Ok(token)
    }
}

/// The stored JSON of an endpoint with the token hash `hash`.
fn record_json(endpoint: &Endpoint, hash: &TokenHash) -> Result<String, TenancyError> {
    let record = Record {
        enterprise: endpoint.enterprise.clone(),
        device_subsystem: match &endpoint.role {
            Role::Database => None,
            Role::Device { subsystem } => Some(subsystem.clone()),
        },
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

/// Opens the redb file, makes sure the tables exist, loads the cache, and
/// settles the admin token.
fn open_blocking(
    layout: &DataLayout,
    admin_token: Option<String>,
) -> Result<(Registry, AdminToken), TenancyError> {
    let configured = admin_token.map(Token::from_text).transpose()?;
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
    let cache = load(&db)?;

    let admin_file = configured.is_none().then(|| layout.admin_token());
    let (admin, origin) = match configured {
        Some(token) => (token.hash(), AdminToken::Configured),
        None => match read_admin_token(&layout.admin_token())? {
            Some(token) => (token.hash(), AdminToken::Existing),
            None => {
                let token = Token::generate()?;
                save_admin_token(&layout.admin_token(), &token)?;
                (token.hash(), AdminToken::Generated(token))
            }
        },
    };
    let registry = Registry {
        inner: Arc::new(Inner {
            db,
            admin: RwLock::new(admin),
            admin_file,
            cache: RwLock::new(cache),
        }),
    };
    Ok((registry, origin))
}

/// Reads every table into memory.
fn load(db: &Database) -> Result<Cache, TenancyError> {
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let mut cache = Cache::default();
    let corrupt = |key: &str, reason: String| TenancyError::Corrupt {
        key: key.to_owned(),
        reason,
    };
    let stored_id = |s: &str| Id::new(s).map_err(|e| corrupt(s, e.to_string()));

    let table = txn.open_table(ENTERPRISES).map_err(redb::Error::from)?;
    for row in table.iter().map_err(redb::Error::from)? {
        let (key, _) = row.map_err(redb::Error::from)?;
        cache
            .enterprises
            .insert(stored_id(key.value())?, BTreeSet::new());
    }
    let table = txn.open_table(SUBSYSTEMS).map_err(redb::Error::from)?;
    for row in table.iter().map_err(redb::Error::from)? {
        let (key, _) = row.map_err(redb::Error::from)?;
        let (enterprise, subsystem) = key.value();
        cache
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
        cache.add_endpoint(
            Endpoint {
                id,
                enterprise: record.enterprise,
                role,
            },
            hash,
        );
    }
    Ok(cache)
}

/// The admin token saved at `path`, if there is one.
fn read_admin_token(path: &Path) -> Result<Option<Token>, TenancyError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Token::from_text(text.trim_end()).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TenancyError::io(path, e)),
    }
}

/// Saves the admin token at `path` with mode 0600: written to a temporary
/// file beside it created with that mode (never readable by others, not even
/// for a moment), fsynced, renamed, and the folder fsynced.
fn save_admin_token(path: &Path, token: &Token) -> Result<(), TenancyError> {
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
            f.write_all(token.expose().as_bytes())?;
            f.write_all(b"\n")?;
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
    use std::path::PathBuf;

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
        let token = Some("a".repeat(40));
        drop(open_blocking(&layout, token.clone()).unwrap());
        // `.estafeta` itself is fsynced by the registry's creation.
        let expected: BTreeSet<PathBuf> = [tmp.path().to_path_buf(), data].into();
        assert_eq!(synced(), expected);
        drop(open_blocking(&layout, token).unwrap());
        assert_eq!(synced(), BTreeSet::new());
    }
}
