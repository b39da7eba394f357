//! The durable part of the tenancy registry.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::TenancyError;
use crate::id::Id;
use crate::tenancy::Endpoint;
use crate::token::{Token, TokenHash};

/// Everything a registry store holds, read at open.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// Enterprise → its subsystems.
    pub enterprises: BTreeMap<Id, BTreeSet<Id>>,
    /// Every database and device with the hash of its token.
    pub endpoints: Vec<(Endpoint, TokenHash)>,
    /// A shared store's change counter as these records were read (0 for a
    /// store that is not shared).
    pub version: u64,
    /// Each database's and device's webhook: its id → the URL.
    pub webhooks: Vec<(Id, String)>,
}

/// One change of the registry. The [`Registry`](crate::tenancy::Registry)
/// checks it against what it holds (the enterprise exists, nothing uses
/// what is deleted) before handing it to the store.
#[derive(Debug, Clone)]
pub enum Change {
    /// A new enterprise; [`TenancyError::AlreadyExists`] if it exists.
    CreateEnterprise(Id),
    /// An enterprise removed.
    DeleteEnterprise(Id),
    /// A new subsystem of an enterprise; [`TenancyError::AlreadyExists`] if
    /// it exists.
    CreateSubsystem {
        /// Its enterprise.
        enterprise: Id,
        /// The subsystem.
        id: Id,
    },
    /// A subsystem removed.
    DeleteSubsystem {
        /// Its enterprise.
        enterprise: Id,
        /// The subsystem.
        id: Id,
    },
    /// A new database or device with its token's hash;
    /// [`TenancyError::AlreadyExists`] if the id is taken.
    CreateEndpoint {
        /// The database or device.
        endpoint: Endpoint,
        /// Its token's hash.
        token: TokenHash,
    },
    /// A database or device removed.
    DeleteEndpoint(Id),
    /// A database or device's token replaced.
    SetToken {
        /// The database or device.
        endpoint: Endpoint,
        /// The new token's hash.
        token: TokenHash,
    },
    /// The admin token replaced (or made at a first start). The store may
    /// keep the token itself where only the operator can read it (the
    /// admin-token file) or only its hash.
    SetAdmin(Token),
    /// A database's or device's webhook set, or with `None` cleared.
    /// [`TenancyError::Unknown`] if `id` is gone.
    SetWebhook {
        /// The database or device.
        id: Id,
        /// Its webhook URL.
        url: Option<String>,
    },
}

/// Where the registry's records are kept. The [`Registry`] keeps a copy in
/// memory (authentication never waits on storage) and sends every change
/// here first, one at a time, updating its copy once the store has it
/// durably.
///
/// A store shared by several servers (a cluster over one database) makes
/// the copy a read-through cache: each change also bumps a change counter
/// ([`version`](Self::version)) in the same transaction, and a registry
/// whose last-read counter is behind reloads with [`load`](Self::load)
/// before it answers, so a token revoked through one server is refused by
/// all at once. A store only its own server changes (the embedded one) is
/// not [`shared`](Self::shared): its registry never reads the counter.
///
/// [`Registry`]: crate::tenancy::Registry
#[async_trait::async_trait]
pub trait RegistryStore: Send + Sync {
    /// Everything stored.
    async fn load(&self) -> Result<Snapshot, TenancyError>;

    /// The admin token's hash, if one was stored.
    async fn admin(&self) -> Result<Option<TokenHash>, TenancyError>;

    /// Applies one change durably before returning.
    async fn apply(&self, change: &Change) -> Result<(), TenancyError>;

    /// Stores the admin token made at a first start, unless a token is
    /// stored already (another server of a shared store made one first);
    /// whether this one was stored.
    async fn set_first_admin(&self, token: &Token) -> Result<bool, TenancyError> {
        self.apply(&Change::SetAdmin(token.clone())).await?;
        Ok(true)
    }

    /// Whether other servers change this store too (a cluster's
    /// database): only then does the registry read its change counter
    /// before answering from its copy. Every store says so: one that
    /// wrongly said no would let a token revoked elsewhere pass here.
    fn shared(&self) -> bool;

    /// The change counter now (asked of a [`shared`](Self::shared) store
    /// only; 0 by default); its value in a [`Snapshot`] is what that
    /// snapshot holds.
    async fn version(&self) -> Result<u64, TenancyError> {
        Ok(0)
    }

    /// The change counter as read with the lock of `step`, the step a
    /// command holds in a shared session store (see
    /// [`Step::joint`](estafeta_session::storage::Step::joint)), when this
    /// store is in that store's database: the step's own round trip read
    /// it, so a command that holds a step checks its registry copy without
    /// one of its own. `None` (the default): no such reading.
    fn version_in_step(&self, _step: &mut dyn estafeta_session::storage::Step) -> Option<u64> {
        None
    }
}
