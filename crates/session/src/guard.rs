//! Exclusive access to one session.

use crate::data::SessionData;
use crate::engine::{Shared, State};
use crate::error::Error;
use crate::key::SessionKey;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// Exclusive access to one session, given to one command at a time.
///
/// It derefs to [`SessionData`]. Dropping it releases the session (a needed
/// save then happens in the background); [`SessionGuard::release`] releases
/// it and returns only once a needed save is durable.
pub struct SessionGuard<K: SessionKey, S: State> {
    shared: Arc<Shared<K, S>>,
    key: K,
    /// `Some` until released; only `release` and `drop` take it.
    session: Option<Box<SessionData<S>>>,
}

impl<K: SessionKey, S: State> SessionGuard<K, S> {
    pub(crate) fn new(shared: Arc<Shared<K, S>>, key: K, session: Box<SessionData<S>>) -> Self {
        SessionGuard {
            shared,
            key,
            session: Some(session),
        }
    }

    /// Take the session out without releasing the key (the engine goes on
    /// holding it).
    pub(crate) fn into_parts(mut self) -> (K, Box<SessionData<S>>) {
        let session = self
            .session
            .take()
            .expect("a guard holds its session until it is released");
        (self.key.clone(), session)
    }

    /// The session's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Save the session now, durably, and keep holding it. Lets a command
    /// make a step durable before it goes on (and undo its change if the
    /// save fails).
    pub async fn save(&mut self) -> Result<(), Error> {
        match self.session.as_deref_mut() {
            Some(session) => self.shared.save(&self.key, session).await,
            None => Ok(()),
        }
    }

    /// Release the session: it is saved first if a persistent change needs
    /// it, and this returns once that save is durable. If the save fails,
    /// the error is returned and the session stays in memory, dirty, to be
    /// saved on a later attempt; the next command gets it either way.
    pub async fn release(mut self) -> Result<(), Error> {
        match self.session.take() {
            Some(session) => self.shared.clone().finish(self.key.clone(), session).await,
            None => Ok(()),
        }
    }
}

impl<K: SessionKey, S: State> Deref for SessionGuard<K, S> {
    type Target = SessionData<S>;
    fn deref(&self) -> &SessionData<S> {
        self.session
            .as_deref()
            .expect("a guard holds its session until it is released")
    }
}

impl<K: SessionKey, S: State> DerefMut for SessionGuard<K, S> {
    fn deref_mut(&mut self) -> &mut SessionData<S> {
        self.session
            .as_deref_mut()
            .expect("a guard holds its session until it is released")
    }
}

impl<K: SessionKey, S: State> Drop for SessionGuard<K, S> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.shared
                .clone()
                .release_from_drop(self.key.clone(), session);
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
