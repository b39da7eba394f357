//! Exclusive access to one session.

use crate::data::SessionData;
use crate::data::State;
use crate::error::Error;
use crate::key::SessionKey;
use crate::shard::{self, Entered, Held, Owned};
use crate::storage::StorageError;
use std::ops::{Deref, DerefMut};

const HELD: &str = "a guard holds its session until it is released";

/// Exclusive access to one session, given to one command at a time.
///
/// It derefs to [`SessionData`]. Dropping it releases the session (a needed
/// save then happens in the background); [`SessionGuard::release`] releases
/// it and returns only once a needed save is durable.
pub struct SessionGuard<K: SessionKey, S: State> {
    /// The key's hash, computed once when it was asked for.
    hash: u64,
    key: K,
    /// The key's cell, locked, with a session in it (and the way back to
    /// the cache); `Some` until released (only `release`, `into_held` and
    /// `drop` take it).
    owned: Option<Owned<K, S>>,
}

impl<K: SessionKey, S: State> SessionGuard<K, S> {
    pub(crate) fn new(hash: u64, key: K, owned: Owned<K, S>) -> Self {
        SessionGuard {
            hash,
            key,
            owned: Some(owned),
        }
    }

    /// A command gets the key `held`.
    pub(crate) fn from_held(mut held: Held<K, S>) -> Option<Self> {
        let owned = held.owned.take()?;
        Some(SessionGuard::new(held.hash, held.key.clone(), owned))
    }

    /// The session's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Save the session now, durably, and keep holding it. Lets a command
    /// make a step durable before it goes on.
    pub async fn save(&mut self) -> Result<(), Error> {
        let Some(cell) = self.owned.as_deref_mut() else {
            return Ok(());
        };
        match cell.session.as_mut() {
            Some(session) => {
                cell.home
                    .core
                    .save(&self.key, session, &mut cell.step)
                    .await
            }
            None => Ok(()),
        }
    }

    /// Whether the command still holds the key exclusively: always with a
    /// storage of this engine alone; with a shared one, until a
    /// [`save`](Self::save) could not take the key again (another engine
    /// took it in between, and may act on it), a save failed, or
    /// [`Transaction::commit_last`] let the key go.
    pub fn holds(&self) -> bool {
        self.owned.as_deref().is_some_and(|cell| {
            !cell.home.core.shared || cell.step.as_deref().is_some_and(|step| step.held())
        })
    }

    /// With a shared storage, the step this command runs in (see
    /// [`Step::joint`](crate::storage::Step::joint)); `None` with a storage
    /// of this engine alone, or once the step lost the key.
    pub fn step(&mut self) -> Option<&mut dyn crate::storage::Step> {
        let step = self.owned.as_deref_mut()?.step.as_deref_mut()?;
        match step.held() {
            true => Some(step),
            false => None,
        }
    }

    /// Release the session: it is saved first if a persistent change needs
    /// it, and this returns once that save is durable. If the save fails,
    /// the error is returned and the session stays in memory, dirty, to be
    /// saved on a later attempt; the next command gets it either way.
    pub async fn release(mut self) -> Result<(), Error> {
        match self.owned.take() {
            Some(owned) => shard::finish(self.hash, self.key.clone(), owned).await,
            None => Ok(()),
        }
    }
}

impl<K: SessionKey, S: State + Clone> SessionGuard<K, S> {
    /// Change the session as one transaction: `change` works on a staged
    /// copy, which becomes the session only once it is durably saved (when
    /// it carries a persistent change). If `change` answers an error, or the
    /// save fails, the session stays exactly as it was and the error is
    /// returned.
    pub async fn update<R, E: From<Error>>(
        &mut self,
        change: impl FnOnce(&mut SessionData<S>) -> Result<R, E>,
    ) -> Result<R, E> {
        let mut tx = self.begin();
        let result = change(&mut tx)?;
        tx.commit().await?;
        Ok(result)
    }

    /// Stage a change: the [`Transaction`] holds a copy of the session to
    /// change (across awaits, too); [`Transaction::commit`] saves it and
    /// makes it the session, dropping it leaves the session as it was.
    pub fn begin(&mut self) -> Transaction<'_, K, S> {
        let staged = SessionData::staged(self);
        Transaction {
            guard: self,
            staged,
        }
    }
}

/// A staged change to a held session (see [`SessionGuard::begin`]). It
/// derefs to the staged copy; the session itself changes only when
/// [`Transaction::commit`] succeeds.
pub struct Transaction<'g, K: SessionKey, S: State> {
    guard: &'g mut SessionGuard<K, S>,
    staged: SessionData<S>,
}

impl<K: SessionKey, S: State> Transaction<'_, K, S> {
    /// Save the staged copy durably if it carries a persistent change, then
    /// make it the session. On an error the session stays as it was.
    pub async fn commit(mut self) -> Result<(), Error> {
        let guard = self.guard;
        let cell = guard.owned.as_deref_mut().expect(HELD);
        cell.home
            .core
            .save(&guard.key, &mut self.staged, &mut cell.step)
            .await?;
        cell.session = Some(self.staged);
        Ok(())
    }

    /// Whether the command still holds the key, as
    /// [`SessionGuard::holds`] tells.
    pub fn holds(&self) -> bool {
        self.guard.holds()
    }

    /// The step the command runs in, as [`SessionGuard::step`] tells.
    pub fn step(&mut self) -> Option<&mut dyn crate::storage::Step> {
        self.guard.step()
    }

    /// [`commit`](Self::commit) as the command's last change of the
    /// session. With a shared storage, the commit that makes it durable
    /// also lets the key go in the store (one round trip, and nothing left
    /// for the release to commit); with nothing to save, the step is
    /// finished all the same. The command may still read the session
    /// until it releases it, not change it: a later save fails
    /// ([`StorageError::Conflict`](crate::StorageError::Conflict)). With a
    /// storage of this engine alone, the same as `commit`.
    pub async fn commit_last(mut self) -> Result<(), Error> {
        let guard = self.guard;
        let cell = guard.owned.as_deref_mut().expect(HELD);
        cell.home
            .core
            .save_last(&guard.key, &mut self.staged, &mut cell.step)
            .await?;
        cell.session = Some(self.staged);
        Ok(())
    }
}

impl<K: SessionKey, S: State> Deref for Transaction<'_, K, S> {
    type Target = SessionData<S>;
    fn deref(&self) -> &SessionData<S> {
        &self.staged
    }
}

impl<K: SessionKey, S: State> DerefMut for Transaction<'_, K, S> {
    fn deref_mut(&mut self) -> &mut SessionData<S> {
        &mut self.staged
    }
}

impl<K: SessionKey, S: State> Deref for SessionGuard<K, S> {
    type Target = SessionData<S>;
    fn deref(&self) -> &SessionData<S> {
        self.owned
            .as_ref()
            .and_then(|o| o.session.as_ref())
            .expect(HELD)
    }
}

impl<K: SessionKey, S: State> DerefMut for SessionGuard<K, S> {
    fn deref_mut(&mut self) -> &mut SessionData<S> {
        self.owned
            .as_mut()
            .and_then(|o| o.session.as_mut())
            .expect(HELD)
    }
}

impl<K: SessionKey, S: State> Drop for SessionGuard<K, S> {
    fn drop(&mut self) {
        if let Some(owned) = self.owned.take() {
            shard::release_from_drop(self.hash, &self.key, owned);
        }
    }
}

impl<K: SessionKey, S: State + std::fmt::Debug> std::fmt::Debug for SessionGuard<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionGuard")
            .field("key", &self.key)
            .field("session", &self.owned.as_ref().map(|o| &o.session))
            .finish()
    }
}

/// How many times a command holds its key again after a finalization's
/// save let it go to another engine, before it fails.
const HOLD_AGAIN: usize = 8;

/// Wait for the key if queued, then make its session ready: loaded,
/// finalized if its time has passed, recovered on first load, created if
/// asked. `None`: no session and `create` was false.
pub(crate) async fn complete<K: SessionKey, S: State>(
    entered: Entered<K, S>,
    create: bool,
) -> Result<Option<SessionGuard<K, S>>, Error> {
    let mut held = match entered {
        Entered::Ready(held) => {
            let ready = held
                .owned
                .as_ref()
                .and_then(|o| Some(!o.home.core.needs_ready(o.session.as_ref()?)));
            if ready == Some(true) {
                return Ok(SessionGuard::from_held(held));
            }
            held
        }
        Entered::Held(h) => h,
        Entered::Queued(rx) => rx.await.map_err(|_| Error::Stopping)??,
    };
    let Some(cell) = held.owned.as_mut() else {
        return Ok(None);
    };
    let home = cell.home.clone();
    let core = &home.core;
    // With a shared storage the session is what is stored now, whatever
    // memory holds: another engine may have changed it.
    if core.shared {
        cell.loaded = false;
        let (step, session) = core.begin(&held.key).await?;
        cell.step = Some(step);
        cell.session = session;
        cell.loaded = true;
    }
    // If this future is dropped (its caller went away) while loading or
    // finalizing, `held` passes the key on with `loaded` false and its next
    // holder reads the session from storage again; on a load error too,
    // and on a failed save of a finalization in a shared storage.
    if !cell.loaded {
        cell.session = core.load(&held.key).await?;
        cell.loaded = true;
    }
    // A finalization's save was made but the key could not be held again:
    // another engine took it at that commit, and may have changed the
    // record or made a new session since. Nothing of the command is done
    // yet, so it holds the key again and starts from the record as stored
    // now, which that engine may have left due or ended in turn; a bounded
    // number of times, each one another engine's step done meanwhile.
    let mut held_again = 0;
    loop {
        if let Some(s) = cell.session.take() {
            cell.loaded = false;
            cell.session = core.ready(&held.key, s, &mut cell.step).await?;
            cell.loaded = true;
        }
        let lost = core.shared && !cell.step.as_deref().is_some_and(|step| step.held());
        // A session that ended took its key's row, and the hold, with it:
        // a command that makes none is done.
        if !lost || (cell.session.is_none() && !create) {
            break;
        }
        if held_again == HOLD_AGAIN {
            cell.loaded = false;
            return Err(Error::Storage(StorageError::Conflict));
        }
        held_again += 1;
        tracing::info!(key = ?held.key, "the session's key went to another engine at its finalization's save; holding it again from the stored record");
        cell.loaded = false;
        let (step, stored) = core.begin(&held.key).await?;
        cell.step = Some(step);
        cell.session = stored;
        cell.loaded = true;
    }
    if cell.session.is_none() && create {
        cell.session = Some(core.fresh());
    }
    if cell.session.is_some() {
        Ok(SessionGuard::from_held(held))
    } else {
        Ok(None)
    }
}
