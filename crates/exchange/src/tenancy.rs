//! The registry of enterprises, subsystems, databases and devices, and
//! authentication of bearer tokens.
//!
//! The records are kept by a [`RegistryStore`] (embedded: `registry.redb`
//! in the server's state folder, [`RedbRegistry`]); every change is durable
//! there before it is acknowledged. A copy is kept in memory, so
//! authentication and lookups, which every request makes, never wait on
//! storage. A store shared by several servers makes the copy a
//! read-through cache: [`Registry::refresh`] reads the store's change
//! counter and reloads the copy when another server changed the store, so
//! what one server created or revoked holds on every server at once (one
//! counter read per call; nothing for the embedded store). A call that
//! takes its caller's session step needs no read of its own: the token is
//! taken from the copy, then checked against the counter the step's lock
//! read ([`Registry::version_in_step`], [`Registry::refresh_to`]). The
//! store also keeps each database's and device's webhook, so the copy
//! holds those too ([`Registry::webhook`]), and a webhook set through one
//! server is pushed to by all. Database and device ids share one namespace across the server:
//! they name mailboxes, and a message names its sender and recipient by id
//! alone.
//!
//! Tokens are shown once and stored only as SHA-256 hashes. A presented
//! token is hashed and looked up by its hash; the lookup cannot leak the
//! secret (the attacker does not control the hash bytes), and the final
//! comparison is constant-time. The admin token's hash is held in memory and
//! compared in constant time as well.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::error::TenancyError;
use crate::id::Id;
use crate::layout::DataLayout;
use crate::store::{Change, RedbRegistry, RegistryStore, Snapshot};
use crate::token::{Token, TokenHash};
use tracing::Instrument;

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

impl Role {
    /// A device's subsystem; `None` for a database.
    pub fn subsystem(&self) -> Option<&Id> {
        match self {
            Role::Database => None,
            Role::Device { subsystem } => Some(subsystem),
        }
    }
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
    /// Made at an earlier start; its hash is kept (`<state>/admin-token`,
    /// or the cluster's store).
    Existing,
    /// Made now, its hash kept (`<state>/admin-token`, mode 0600, or the
    /// cluster's store); the server prints it once.
    Generated(Token),
}

/// The in-memory copy of the registry, kept small: with 100,000 devices
/// it is most of what the server holds per idle device. Each endpoint's id
/// is one allocation shared by both maps, and its enterprise and subsystem
/// are the allocations of the `enterprises` map's names.
#[derive(Default)]
struct Cache {
    /// Enterprise → its subsystems.
    enterprises: BTreeMap<Arc<str>, BTreeSet<Arc<str>>>,
    endpoints: BTreeMap<Arc<str>, Held>,
    by_token: HashMap<TokenHash, Arc<str>>,
    /// The webhooks, by endpoint id.
    webhooks: HashMap<Arc<str>, String>,
}

/// A registered database or device as the copy holds it (its id is the key).
struct Held {
    enterprise: Arc<str>,
    /// The subsystem of a device; `None` for a database.
    subsystem: Option<Arc<str>>,
    token: TokenHash,
}

/// A name of the copy as an [`Id`]: the copy holds only names that were
/// `Id`s.
fn as_id(name: &str) -> Id {
    Id::new(name).expect("the registry's copy holds only valid ids")
}

impl Held {
    fn endpoint(&self, endpoint_id: &str) -> Endpoint {
        Endpoint {
            id: as_id(endpoint_id),
            enterprise: as_id(&self.enterprise),
            role: self.role(),
        }
    }

    fn role(&self) -> Role {
        match &self.subsystem {
            None => Role::Database,
            Some(subsystem) => Role::Device {
                subsystem: as_id(subsystem),
            },
        }
    }

    fn is_device(&self) -> bool {
        self.subsystem.is_some()
    }

    fn holds(&self, kind: Kind) -> bool {
        match kind {
            Kind::Database => !self.is_device(),
            Kind::Device => self.is_device(),
        }
    }
}

impl Cache {
    fn from_snapshot(snapshot: Snapshot) -> Cache {
        let enterprises: BTreeMap<Arc<str>, BTreeSet<Arc<str>>> = snapshot
            .enterprises
            .into_iter()
            .map(|(e, subs)| {
                (
                    Arc::from(e.as_str()),
                    subs.iter().map(|s| Arc::from(s.as_str())).collect(),
                )
            })
            .collect();
        let mut by_token = HashMap::with_capacity(snapshot.endpoints.len());
        // Built whole from the records (sorted once, nodes filled), not
        // by one insert each (nodes left half full).
        let endpoints: BTreeMap<Arc<str>, Held> = snapshot
            .endpoints
            .into_iter()
            .map(|(endpoint, hash)| {
                let (key, held) = held(&enterprises, endpoint, hash);
                by_token.insert(hash, Arc::clone(&key));
                (key, held)
            })
            .collect();
        let webhooks = snapshot
            .webhooks
            .into_iter()
            .filter_map(|(id, url)| {
                let (key, _) = endpoints.get_key_value(id.as_str())?;
                Some((Arc::clone(key), url))
            })
            .collect();
        Cache {
            enterprises,
            endpoints,
            by_token,
            webhooks,
        }
    }

    fn add_endpoint(&mut self, endpoint: Endpoint, hash: TokenHash) {
        let (key, held) = held(&self.enterprises, endpoint, hash);
        self.by_token.insert(hash, Arc::clone(&key));
        self.endpoints.insert(key, held);
    }

    /// The endpoint `id`, as handed out.
    fn endpoint(&self, id: &Id) -> Option<Endpoint> {
        let (key, held) = self.endpoints.get_key_value(id.as_str())?;
        Some(held.endpoint(key))
    }

    /// Whether enterprise `enterprise` has subsystem `subsystem`.
    fn has_subsystem(&self, enterprise: &Id, subsystem: &Id) -> bool {
        self.enterprises
            .get(enterprise.as_str())
            .is_some_and(|s| s.contains(subsystem.as_str()))
    }
}

/// `endpoint` as the copy holds it, its names shared with `enterprises`
/// (a name not found there gets an allocation of its own).
fn held(
    enterprises: &BTreeMap<Arc<str>, BTreeSet<Arc<str>>>,
    endpoint: Endpoint,
    token: TokenHash,
) -> (Arc<str>, Held) {
    let known = enterprises.get_key_value(endpoint.enterprise.as_str());
    let enterprise = known.map_or_else(
        || Arc::from(endpoint.enterprise.as_str()),
        |(e, _)| Arc::clone(e),
    );
    let subsystem = endpoint.role.subsystem().map(|subsystem| {
        known
            .and_then(|(_, subs)| subs.get(subsystem.as_str()))
            .map_or_else(|| Arc::from(subsystem.as_str()), Arc::clone)
    });
    let held = Held {
        enterprise,
        subsystem,
        token,
    };
    (Arc::from(endpoint.id.as_str()), held)
}

/// The tenancy registry. Cheap to clone (shared).
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn RegistryStore>,
    /// The admin token's hash; replaced by [`Registry::rotate_admin_token`].
    admin: RwLock<TokenHash>,
    /// The admin token comes from the environment: the server cannot change it.
    admin_pinned: bool,
    cache: RwLock<Cache>,
    /// Held from checking a change against the cache until the cache has
    /// it: changes reach the store and the cache in the same order (and a
    /// reload of a shared store's records waits for both).
    changing: tokio::sync::Mutex<()>,
    /// Whether other servers change the store ([`RegistryStore::shared`]):
    /// only then is its change counter read.
    shared: bool,
    /// The shared store's change counter as the cache was last loaded.
    seen: AtomicU64,
    /// The last read of the shared store's change counter: when it began
    /// and what it read. Reads go one at a time, and a caller that finds
    /// one begun after it asked takes that one's answer: any number of
    /// callers at once (a flood of unknown tokens) cost one read, never a
    /// connection each.
    counter: tokio::sync::Mutex<Option<(std::time::Instant, u64)>>,
}

/// Which kind of registered id a paged list or a lookup is about.
pub use crate::wire::Kind;

impl Registry {
    /// Opens (creating if needed) the embedded registry in the state folder
    /// of `layout`. The admin token is `admin_token` when given; otherwise
    /// the one saved in the layout's admin-token file, or a new one made and
    /// saved there with mode 0600 ([`AdminToken::Generated`]).
    pub async fn open(
        layout: &DataLayout,
        admin_token: Option<String>,
    ) -> Result<(Self, AdminToken), TenancyError> {
        let configured = admin_token.map(Token::from_text).transpose()?;
        let store = RedbRegistry::open(layout).await?;
        Self::with_store(Arc::new(store), configured).await
    }

    /// The registry over `store`: its records loaded into memory, and the
    /// admin token settled: `configured` when given (pinned: it cannot be
    /// rotated); otherwise the store's, or a new one made and stored
    /// ([`AdminToken::Generated`]).
    pub async fn with_store(
        store: Arc<dyn RegistryStore>,
        configured: Option<Token>,
    ) -> Result<(Self, AdminToken), TenancyError> {
        let snapshot = store.load().await?;
        let seen = snapshot.version;
        let cache = Cache::from_snapshot(snapshot);
        let admin_pinned = configured.is_some();
        let (admin, origin) = match configured {
            Some(token) => (token.hash(), AdminToken::Configured),
            None => match store.admin().await? {
                Some(hash) => (hash, AdminToken::Existing),
                None => {
                    let token = Token::generate()?;
                    if store.set_first_admin(&token).await? {
                        (token.hash(), AdminToken::Generated(token))
                    } else {
                        // Another server of a shared store made it first.
                        let hash = store.admin().await?.ok_or_else(|| TenancyError::Corrupt {
                            key: "admin token".into(),
                            reason: "a first admin token was stored and is gone".into(),
                        })?;
                        (hash, AdminToken::Existing)
                    }
                }
            },
        };
        let shared = store.shared();
        let registry = Registry {
            inner: Arc::new(Inner {
                store,
                admin: RwLock::new(admin),
                admin_pinned,
                cache: RwLock::new(cache),
                changing: tokio::sync::Mutex::new(()),
                shared,
                seen: AtomicU64::new(seen),
                counter: tokio::sync::Mutex::new(None),
            }),
        };
        Ok((registry, origin))
    }

    /// Brings the copy in memory up to the store when other servers share
    /// it and changed it since it was loaded: call before answering from the
    /// copy ([`Registry::authenticate`]). A store only this server changes
    /// is not read: the copy is the store.
    pub async fn refresh(&self) -> Result<(), TenancyError> {
        if !self.inner.shared {
            return Ok(());
        }
        let asked = std::time::Instant::now();
        let now = {
            let mut last = self.inner.counter.lock().await;
            match *last {
                Some((began, version)) if began >= asked => version,
                _ => {
                    let began = std::time::Instant::now();
                    let version = self.inner.store.version().await?;
                    *last = Some((began, version));
                    version
                }
            }
        };
        if now <= self.inner.seen.load(Ordering::Acquire) {
            return Ok(());
        }
        let _changing = self.inner.changing.lock().await;
        self.catch_up(now).await
    }

    /// The shared store's change counter as read with the lock of `step`
    /// (see [`RegistryStore::version_in_step`]); `None` for a store that
    /// gives no such reading.
    pub fn version_in_step(&self, step: &mut dyn estafeta_session::storage::Step) -> Option<u64> {
        self.inner.store.version_in_step(step)
    }

    /// Brings the copy in memory up to `version`, a change counter read from
    /// the shared store ([`version_in_step`](Self::version_in_step)):
    /// [`refresh`](Self::refresh) without reading the counter. Nothing to do
    /// (no await) when the copy is that recent.
    pub async fn refresh_to(&self, version: u64) -> Result<(), TenancyError> {
        if version <= self.inner.seen.load(Ordering::Acquire) {
            return Ok(());
        }
        let _changing = self.inner.changing.lock().await;
        self.catch_up(version).await
    }

    /// Reloads the copy unless it was loaded at `version` or later (inside
    /// [`change`](Self::change) or with `changing` held). The copy is
    /// replaced whole, so a reload cut short leaves the old one.
    async fn catch_up(&self, version: u64) -> Result<(), TenancyError> {
        if self.inner.seen.load(Ordering::Acquire) >= version {
            return Ok(());
        }
        let snapshot = self.inner.store.load().await?;
        let admin = match self.inner.admin_pinned {
            true => None,
            false => self.inner.store.admin().await?,
        };
        let loaded = snapshot.version;
        *self.inner.write_cache() = Cache::from_snapshot(snapshot);
        if let Some(hash) = admin {
            *self.inner.admin.write().unwrap_or_else(|p| p.into_inner()) = hash;
        }
        self.inner.seen.fetch_max(loaded, Ordering::AcqRel);
        Ok(())
    }

    /// Who `token` belongs to, or `None` for an unknown token (401).
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        self.authenticate_hash(&TokenHash::of(token))
    }

    /// Who the token whose hash is `presented` belongs to, or `None`.
    pub fn authenticate_hash(&self, presented: &TokenHash) -> Option<Principal> {
        let presented = *presented;
        let admin = *self.inner.admin.read().unwrap_or_else(|p| p.into_inner());
        if admin.ct_eq(&presented) {
            return Some(Principal::Admin);
        }
        let cache = self.read();
        let id = cache.by_token.get(&presented)?;
        let (key, held) = cache.endpoints.get_key_value(&**id)?;
        held.token
            .ct_eq(&presented)
            .then(|| held.endpoint(key).principal())
    }

    /// Creates an enterprise; [`TenancyError::AlreadyExists`] if it exists.
    pub async fn create_enterprise(&self, id: Id) -> Result<(), TenancyError> {
        self.change(move |this| async move {
            this.store(Change::CreateEnterprise(id.clone())).await?;
            this.inner
                .write_cache()
                .enterprises
                .entry(Arc::from(id.as_str()))
                .or_default();
            Ok(())
        })
        .await
    }

    /// Creates a subsystem of an enterprise.
    pub async fn create_subsystem(&self, enterprise: Id, id: Id) -> Result<(), TenancyError> {
        self.change(move |this| async move {
            this.inner.require_enterprise(&enterprise)?;
            this.store(Change::CreateSubsystem {
                enterprise: enterprise.clone(),
                id: id.clone(),
            })
            .await?;
            this.inner
                .write_cache()
                .enterprises
                .entry(Arc::from(enterprise.as_str()))
                .or_default()
                .insert(Arc::from(id.as_str()));
            Ok(())
        })
        .await
    }

    /// Creates a database of an enterprise and returns its token (shown once).
    pub async fn create_database(&self, enterprise: Id, id: Id) -> Result<Token, TenancyError> {
        self.change(move |this| async move {
            this.inner.require_enterprise(&enterprise)?;
            this.add_endpoint(Endpoint {
                id,
                enterprise,
                role: Role::Database,
            })
            .await
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
        self.change(move |this| async move {
            this.inner.require_enterprise(&enterprise)?;
            let known = this.read().has_subsystem(&enterprise, &subsystem);
            if !known {
                return Err(TenancyError::UnknownSubsystem {
                    enterprise: enterprise.into_string(),
                    subsystem: subsystem.into_string(),
                });
            }
            this.add_endpoint(Endpoint {
                id,
                enterprise,
                role: Role::Device { subsystem },
            })
            .await
        })
        .await
    }

    /// Whether the enterprise exists.
    pub fn enterprise_exists(&self, id: &Id) -> bool {
        self.read().enterprises.contains_key(id.as_str())
    }

    /// All enterprises, sorted.
    pub fn enterprises(&self) -> Vec<Id> {
        self.read().enterprises.keys().map(|e| as_id(e)).collect()
    }

    /// The subsystems of an enterprise, sorted (empty if it does not exist).
    pub fn subsystems(&self, enterprise: &Id) -> Vec<Id> {
        self.read()
            .enterprises
            .get(enterprise.as_str())
            .map(|s| s.iter().map(|s| as_id(s)).collect())
            .unwrap_or_default()
    }

    /// The database or device registered under `id`.
    pub fn endpoint(&self, id: &Id) -> Option<Endpoint> {
        self.read().endpoint(id)
    }

    /// The enterprise that owns a database or device id.
    pub fn enterprise_of(&self, id: &Id) -> Option<Id> {
        self.read()
            .endpoints
            .get(id.as_str())
            .map(|h| as_id(&h.enterprise))
    }

    /// Whether `id` is a database of `enterprise` (a device may send only to those).
    pub fn is_database_of(&self, id: &Id, enterprise: &Id) -> bool {
        self.read()
            .endpoints
            .get(id.as_str())
            .is_some_and(|h| !h.is_device() && *h.enterprise == *enterprise.as_str())
    }

    /// The subsystem of a device (`None` if `id` is not a device).
    pub fn device_subsystem(&self, id: &Id) -> Option<Id> {
        self.read()
            .endpoints
            .get(id.as_str())
            .and_then(|h| h.subsystem.as_deref().map(as_id))
    }

    /// The webhook of database or device `id` with its kind, if it has one
    /// (as of the last [`refresh`](Self::refresh)).
    pub fn webhook(&self, id: &Id) -> Option<(Kind, String)> {
        let cache = self.read();
        let url = cache.webhooks.get(id.as_str())?;
        let kind = match cache.endpoints.get(id.as_str())?.is_device() {
            true => Kind::Device,
            false => Kind::Database,
        };
        Some((kind, url.clone()))
    }

    /// The databases and devices with a webhook.
    pub fn hooked(&self) -> Vec<Id> {
        self.read().webhooks.keys().map(|id| as_id(id)).collect()
    }

    /// Sets (or with `None` clears) the webhook of a database or device (of
    /// `kind`), durably, for every server sharing the store.
    /// [`TenancyError::Unknown`] if there is no such one.
    pub async fn set_webhook(
        &self,
        kind: Kind,
        id: Id,
        url: Option<String>,
    ) -> Result<(), TenancyError> {
        self.change(move |this| async move {
            this.inner.require_endpoint(kind, &id)?;
            this.store(Change::SetWebhook {
                id: id.clone(),
                url: url.clone(),
            })
            .await?;
            let mut cache = this.inner.write_cache();
            let Some((key, _)) = cache.endpoints.get_key_value(id.as_str()) else {
                return Ok(());
            };
            let key = Arc::clone(key);
            match url {
                Some(url) => cache.webhooks.insert(key, url),
                None => cache.webhooks.remove(&key),
            };
            Ok(())
        })
        .await
    }

    /// All databases, sorted by id.
    pub fn databases(&self) -> Vec<Endpoint> {
        self.endpoints_where(|h| !h.is_device())
    }

    /// All devices, sorted by id.
    pub fn devices(&self) -> Vec<Endpoint> {
        self.endpoints_where(Held::is_device)
    }

    /// Up to `limit` enterprises after `after` (exclusive), sorted, each
    /// with its subsystems.
    pub fn enterprises_page(&self, after: Option<&Id>, limit: usize) -> Vec<(Id, Vec<Id>)> {
        let cache = self.read();
        let from = match after {
            Some(a) => std::ops::Bound::Excluded(a.as_str()),
            None => std::ops::Bound::Unbounded,
        };
        cache
            .enterprises
            .range::<str, _>((from, std::ops::Bound::Unbounded))
            .take(limit)
            .map(|(id, subs)| (as_id(id), subs.iter().map(|s| as_id(s)).collect()))
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
            Some(a) => std::ops::Bound::Excluded(a.as_str()),
            None => std::ops::Bound::Unbounded,
        };
        cache
            .endpoints
            .range::<str, _>((from, std::ops::Bound::Unbounded))
            .filter(|(_, h)| {
                h.holds(kind) && enterprise.is_none_or(|ent| *h.enterprise == *ent.as_str())
            })
            .take(limit)
            .map(|(key, h)| h.endpoint(key))
            .collect()
    }

    /// Deletes an enterprise; refused ([`TenancyError::InUse`]) while it has
    /// subsystems, databases or devices.
    pub async fn delete_enterprise(&self, id: Id) -> Result<(), TenancyError> {
        self.change(move |this| async move {
            this.inner.require_enterprise(&id)?;
            {
                let cache = this.read();
                let members = cache
                    .endpoints
                    .values()
                    .filter(|h| *h.enterprise == *id.as_str())
                    .count();
                let subsystems = cache
                    .enterprises
                    .get(id.as_str())
                    .map_or(0, BTreeSet::len);
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
            this.store(Change::DeleteEnterprise(id.clone())).await?;
            this.inner.write_cache().enterprises.remove(id.as_str());
            Ok(())
        })
        .await
    }

    /// Deletes a subsystem of an enterprise; refused
    /// ([`TenancyError::InUse`]) while a device runs it.
    pub async fn delete_subsystem(&self, enterprise: Id, id: Id) -> Result<(), TenancyError> {
        self.change(move |this| async move {
            this.inner.require_enterprise(&enterprise)?;
            {
                let cache = this.read();
                if !cache.has_subsystem(&enterprise, &id) {
                    return Err(TenancyError::UnknownSubsystem {
                        enterprise: enterprise.into_string(),
                        subsystem: id.into_string(),
                    });
                }
                let devices = cache
                    .endpoints
                    .values()
                    .filter(|h| {
                        *h.enterprise == *enterprise.as_str()
                            && h.subsystem.as_deref() == Some(id.as_str())
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
            this.store(Change::DeleteSubsystem {
                enterprise: enterprise.clone(),
                id: id.clone(),
            })
            .await?;
            if let Some(subs) = this
                .inner
                .write_cache()
                .enterprises
                .get_mut(enterprise.as_str())
            {
                subs.remove(id.as_str());
            }
            Ok(())
        })
        .await
    }

    /// Deletes a database or device (of `kind`): its token stops working at
    /// once. Its mailbox is the caller's to empty.
    pub async fn delete_endpoint(&self, kind: Kind, id: Id) -> Result<Endpoint, TenancyError> {
        self.change(move |this| async move {
            let endpoint = this.inner.require_endpoint(kind, &id)?;
            this.store(Change::DeleteEndpoint(id.clone())).await?;
            let mut cache = this.inner.write_cache();
            if let Some(held) = cache.endpoints.remove(id.as_str()) {
                cache.by_token.remove(&held.token);
            }
            cache.webhooks.remove(id.as_str());
            Ok(endpoint)
        })
        .await
    }

    /// Gives a database or device (of `kind`) a new token, returned to be
    /// shown once; the old one stops working at once.
    pub async fn rotate_token(&self, kind: Kind, id: Id) -> Result<Token, TenancyError> {
        self.change(move |this| async move {
            let endpoint = this.inner.require_endpoint(kind, &id)?;
            let token = Token::generate()?;
            let hash = token.hash();
            this.store(Change::SetToken {
                endpoint: endpoint.clone(),
                token: hash,
            })
            .await?;
            let mut cache = this.inner.write_cache();
            if let Some(held) = cache.endpoints.remove(id.as_str()) {
                cache.by_token.remove(&held.token);
            }
            cache.add_endpoint(endpoint, hash);
            Ok(token)
        })
        .await
    }

    /// Replaces the admin token with a new one, returned to be shown once:
    /// its hash stored first (the embedded store saves it to the
    /// admin-token file, mode 0600), then the old one stops working. Refused
    /// ([`TenancyError::AdminTokenPinned`]) when the token comes from the
    /// environment: the server cannot change that.
    pub async fn rotate_admin_token(&self) -> Result<Token, TenancyError> {
        if self.inner.admin_pinned {
            return Err(TenancyError::AdminTokenPinned);
        }
        self.change(move |this| async move {
            let token = Token::generate()?;
            this.store(Change::SetAdmin(token.clone())).await?;
            *this.inner.admin.write().unwrap_or_else(|p| p.into_inner()) = token.hash();
            Ok(token)
        })
        .await
    }

    fn endpoints_where(&self, keep: impl Fn(&Held) -> bool) -> Vec<Endpoint> {
        self.read()
            .endpoints
            .iter()
            .filter(|(_, h)| keep(h))
            .map(|(key, h)| h.endpoint(key))
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Cache> {
        self.inner.read_cache()
    }

    /// Runs a change on a task of its own, one change at a time: a caller
    /// that goes away midway cannot leave the store changed and the copy in
    /// memory not. The copy is brought up to the store first (a shared
    /// store's: nothing to do for one only this server changes), so the
    /// change is checked against what every server did.
    async fn change<T, F, Fut>(&self, f: F) -> Result<T, TenancyError>
    where
        F: FnOnce(Registry) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, TenancyError>> + Send,
        T: Send + 'static,
    {
        let this = self.clone();
        let change = async move {
            let _changing = this.inner.changing.lock().await;
            let now = this.inner.store.version().await?;
            this.catch_up(now).await?;
            f(this.clone()).await
        };
        tokio::spawn(change.instrument(tracing::Span::current()))
            .await
            .map_err(|e| TenancyError::Join(e.to_string()))?
    }

    /// Hands a change to the store (inside [`change`](Self::change)).
    async fn store(&self, change: Change) -> Result<(), TenancyError> {
        self.inner.store.apply(&change).await
    }

    /// Stores a new database or device with a fresh token, durably (inside
    /// [`change`](Self::change)).
    async fn add_endpoint(&self, endpoint: Endpoint) -> Result<Token, TenancyError> {
        let token = Token::generate()?;
        let hash = token.hash();
        self.store(Change::CreateEndpoint {
            endpoint: endpoint.clone(),
            token: hash,
        })
        .await?;
        self.inner.write_cache().add_endpoint(endpoint, hash);
        Ok(token)
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
        if self
            .read_cache()
            .enterprises
            .contains_key(enterprise.as_str())
        {
            Ok(())
        } else {
            Err(TenancyError::UnknownEnterprise(enterprise.to_string()))
        }
    }

    /// The database or device (of `kind`) `id`; [`TenancyError::Unknown`] if
    /// there is none.
    fn require_endpoint(&self, kind: Kind, id: &Id) -> Result<Endpoint, TenancyError> {
        match self.read_cache().endpoints.get_key_value(id.as_str()) {
            Some((key, h)) if h.holds(kind) => Ok(h.endpoint(key)),
            _ => Err(TenancyError::Unknown {
                kind: kind.as_str(),
                id: id.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Id {
        Id::new(s).unwrap()
    }

    /// Every endpoint's names are the `enterprises` map's allocations and
    /// its id is one allocation shared by both maps, whether the copy was
    /// loaded from the store or changed since.
    fn assert_shared(cache: &Cache) {
        let (acme, subs) = cache.enterprises.get_key_value("acme").unwrap();
        let sales = subs.get("sales").unwrap();
        for (key, held) in &cache.endpoints {
            assert!(Arc::ptr_eq(&held.enterprise, acme), "{key}");
            if let Some(subsystem) = &held.subsystem {
                assert!(Arc::ptr_eq(subsystem, sales), "{key}");
            }
            assert!(Arc::ptr_eq(&cache.by_token[&held.token], key), "{key}");
        }
        assert_eq!(cache.by_token.len(), cache.endpoints.len());
    }

    /// A store whose change counter reads are counted and held until the
    /// test lets them go; shared with other servers or not.
    struct Slow {
        shared: bool,
        reads: std::sync::atomic::AtomicUsize,
        gate: tokio::sync::Semaphore,
    }

    impl Slow {
        /// Shared or not; `permits` counter reads let through at once.
        fn new(shared: bool, permits: usize) -> Arc<Slow> {
            Arc::new(Slow {
                shared,
                reads: std::sync::atomic::AtomicUsize::new(0),
                gate: tokio::sync::Semaphore::new(permits),
            })
        }
    }

    #[async_trait::async_trait]
    impl RegistryStore for Slow {
        async fn load(&self) -> Result<Snapshot, TenancyError> {
            Ok(Snapshot::default())
        }
        async fn admin(&self) -> Result<Option<TokenHash>, TenancyError> {
            Ok(Some(TokenHash::of("admin-secret")))
        }
        async fn apply(&self, _change: &Change) -> Result<(), TenancyError> {
            Ok(())
        }
        fn shared(&self) -> bool {
            self.shared
        }
        async fn version(&self) -> Result<u64, TenancyError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let _let_go = self.gate.acquire().await;
            Ok(0)
        }
    }

    /// A hundred unknown tokens presented at once, while a read of the
    /// shared store's counter is under way, cost one more read between
    /// them, not a read each.
    #[tokio::test]
    async fn unknown_tokens_at_once_share_one_read_of_the_shared_store() {
        let store = Slow::new(true, 0);
        let (reg, _) = Registry::with_store(store.clone(), None).await.unwrap();
        let first = tokio::spawn({
            let reg = reg.clone();
            async move { reg.refresh().await }
        });
        while store.reads.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let waiting: Vec<_> = (0..100)
            .map(|_| {
                let reg = reg.clone();
                tokio::spawn(async move { reg.refresh().await })
            })
            .collect();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        store.gate.add_permits(1_000);
        first.await.unwrap().unwrap();
        for w in waiting {
            w.await.unwrap().unwrap();
        }
        assert_eq!(store.reads.load(Ordering::SeqCst), 2);
    }

    /// A store only this server changes is never asked for its counter:
    /// the copy is the store, and a call's check costs nothing.
    #[tokio::test]
    async fn a_store_only_this_server_changes_is_not_read_to_refresh() {
        let store = Slow::new(false, 1_000);
        let (reg, _) = Registry::with_store(store.clone(), None).await.unwrap();
        for _ in 0..10 {
            reg.refresh().await.unwrap();
        }
        assert_eq!(store.reads.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn endpoints_share_their_names_in_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        let layout = DataLayout::new(dir.path());
        let (reg, _) = Registry::open(&layout, Some("admin-secret".into()))
            .await
            .unwrap();
        reg.create_enterprise(id("acme")).await.unwrap();
        reg.create_subsystem(id("acme"), id("sales")).await.unwrap();
        reg.create_database(id("acme"), id("db-a")).await.unwrap();
        for n in 0..3 {
            reg.create_device(id("acme"), id(&format!("phone-{n}")), id("sales"))
                .await
                .unwrap();
        }
        reg.rotate_token(Kind::Device, id("phone-1")).await.unwrap();
        assert_shared(&reg.read());
        assert_eq!(reg.read().endpoints.len(), 4);
        drop(reg);

        let (reg, _) = Registry::open(&layout, Some("admin-secret".into()))
            .await
            .unwrap();
        assert_shared(&reg.read());
        reg.create_device(id("acme"), id("phone-9"), id("sales"))
            .await
            .unwrap();
        assert_shared(&reg.read());
        assert_eq!(reg.read().endpoints.len(), 5);
    }
}
