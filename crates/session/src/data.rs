//! A session's contents, what its state must be, and the marks that
//! decide whether it is saved.

use crate::clock::Timestamp;
use serde::{Serialize, de::DeserializeOwned};

/// What a session's state must be: stored as JSON, created empty.
pub trait State: Serialize + DeserializeOwned + Default + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Default + Send + 'static> State for T {}

/// One session: the user's state plus its times and marks.
///
/// A command reaches it through a [`crate::SessionGuard`] (which derefs to
/// it) and the hooks get it by `&mut`. Changing the state through
/// [`SessionData::persistent_mut`] or the expiration through
/// [`SessionData::set_expires_at`] sets the persistent mark: the session is
/// saved, durably, before the command's release returns. Changes through
/// [`SessionData::state_mut`] live in memory only.
#[derive(Debug)]
pub struct SessionData<S> {
    pub(crate) state: S,
    pub(crate) created_at: Timestamp,
    pub(crate) last_access: Timestamp,
    pub(crate) expires_at: Option<Timestamp>,
    /// A version of it is in storage.
    pub(crate) stored: bool,
    /// The persistent mark: changed since last saved.
    pub(crate) dirty: bool,
    /// Changed at all since creation: a new session that its creating
    /// command left untouched is not kept (lazy creation).
    pub(crate) touched: bool,
    /// The begin notification went out.
    pub(crate) begun: bool,
    /// The storage generation it was last saved under.
    pub(crate) generation: u64,
    /// Its key is in its shard's list for the expiry manager.
    pub(crate) touch_pending: bool,
    /// Released by a dropped guard, whose release reads no clock: the
    /// expiry manager sets `last_access` when it notes the key.
    pub(crate) unstamped: bool,
}

impl<S: Clone> SessionData<S> {
    /// A copy to stage a change on ([`crate::Transaction`]).
    pub(crate) fn staged(&self) -> Self {
        SessionData {
            state: self.state.clone(),
            ..*self
        }
    }
}

impl<S> SessionData<S> {
    pub(crate) fn fresh(state: S, now: Timestamp, generation: u64) -> Self {
        SessionData {
            state,
            created_at: now,
            last_access: now,
            expires_at: None,
            stored: false,
            dirty: false,
            touched: false,
            begun: false,
            generation,
            touch_pending: false,
            unstamped: false,
        }
    }

    /// The user's state, to read.
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The user's state, to change in memory only: the change is not saved
    /// and does not survive a flush or a restart.
    pub fn state_mut(&mut self) -> &mut S {
        self.touched = true;
        &mut self.state
    }

    /// The user's state, to change persistently: the session is saved
    /// before the command's release returns.
    pub fn persistent_mut(&mut self) -> &mut S {
        self.touched = true;
        self.dirty = true;
        &mut self.state
    }

    /// When the session expires, if ever.
    pub fn expires_at(&self) -> Option<Timestamp> {
        self.expires_at
    }

    /// Extend or shorten the session's life (`None`: never expires). Saved
    /// atomically with the rest of this command's changes.
    pub fn set_expires_at(&mut self, at: Option<Timestamp>) {
        if self.expires_at != at {
            self.expires_at = at;
            self.touched = true;
            self.dirty = true;
        }
    }

    /// When the session was created.
    pub fn created_at(&self) -> Timestamp {
        self.created_at
    }

    /// When a command last released it: exact for an awaited
    /// [`crate::SessionGuard::release`] or a save; for a guard dropped
    /// without a save, the time the expiry manager noted the release (within
    /// about a second after it; idle sessions are flushed no earlier for it).
    pub fn last_access(&self) -> Timestamp {
        self.last_access
    }

    /// Whether the session has never been stored nor kept yet: the current
    /// command created it.
    pub fn is_new(&self) -> bool {
        !self.stored && !self.begun
    }

    /// Whether it carries changes not yet saved.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }
}
