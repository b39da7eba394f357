//! Exclusive access to one session.

use crate::data::SessionData;
use crate::engine::State;
use crate::error::Error;
use crate::key::SessionKey;
use crate::shard::Handle;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// Exclusive access to one session, given to one command at a time.
///
/// It derefs to [`SessionData`]. Dropping it releases the session (a needed
/// save then happens in the background); [`SessionGuard::release`] releases
/// it and returns only once a needed save is durable.
pub struct SessionGuard<K: SessionKey, S: State> {
    /// The way back into the cache (one of several: see [`Handle`]).
    handle: Arc<Handle<K, S>>,
    /// The key's hash, computed once when it was asked for.
    hash: u64,
    key: K,
    /// `Some` until released; only `release` and `drop` take it.
    session: Option<SessionData<S>>,
}

impl<K: SessionKey, S: State> SessionGuard<K, S> {
    pub(crate) fn new(
        handle: Arc<Handle<K, S>>,
        hash: u64,
        key: K,
        session: SessionData<S>,
    ) -> Self {
        SessionGuard {
            handle,
            hash,
            key,
            session: Some(session),
        }
    }

    pub(crate) fn handle(&self) -> &Handle<K, S> {
        &self.handle
    }

    /// Take the session out without releasing the key (the engine goes on
    /// holding it).
    pub(crate) fn into_parts(mut self) -> (Arc<Handle<K, S>>, u64, K, SessionData<S>) {
        let session = self
            .session
            .take()
            .expect("a guard holds its session until it is released");
        (self.handle.clone(), self.hash, self.key.clone(), session)
    }

    /// The session's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Save the session now, durably, and keep holding it. Lets a command
    /// make a step durable before it goes on (and undo its change if the
    /// save fails).
    pub async fn save(&mut self) -> Result<(), Error> {
        match self.session.as_mut() {
            Some(session) => self.handle.core().save(&self.key, session).await,
            None => Ok(()),
        }
    }

    /// Release the session: it is saved first if a persistent change needs
    /// it, and this returns once that save is durable. If the save fails,
    /// the error is returned and the session stays in memory, dirty, to be
    /// saved on a later attempt; the next command gets it either way.
    pub async fn release(mut self) -> Result<(), Error> {
        match self.session.take() {
            Some(session) => {
                self.handle
                    .clone()
                    .finish(self.hash, self.key.clone(), session)
                    .await
            }
            None => Ok(()),
        }
    }
}

impl<K: SessionKey, S: State> Deref for SessionGuard<K, S> {
    type Target = SessionData<S>;
    fn deref(&self) -> &SessionData<S> {
        self.session
            .as_ref()
            .expect("a guard holds its session until it is released")
    }
}

impl<K: SessionKey, S: State> DerefMut for SessionGuard<K, S> {
    fn deref_mut(&mut self) -> &mut SessionData<S> {
        self.session
            .as_mut()
            .expect("a guard holds its session until it is released")
    }
}

impl<K: SessionKey, S: State> Drop for SessionGuard<K, S> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.handle.release_from_drop(self.hash, &self.key, session);
        }
    }
}

impl<K: SessionKey, S: State + std::fmt::Debug> std::fmt::Debug for SessionGuard<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionGuard")
            .field("key", &self.key)
            .field("session", &self.session)
            .finish()
    }
}
