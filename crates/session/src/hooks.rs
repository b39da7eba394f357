//! What the embedding application decides: notifications, finalization of
//! expired sessions, and what to do with sessions saved before a restart.

use crate::data::SessionData;
use crate::storage::Step;
use std::future::Future;
use std::pin::Pin;

/// A boxed future, as the hooks return (they are called through a trait
/// object so the engine's types stay short).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What to do with a session after its finalize (or first-load) hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finalize {
    /// Keep it. A finalize hook that keeps a session should give it a new
    /// expiration; if it is still due, it is looked at again a second later
    /// (a way to retry finalization that could not finish).
    Keep,
    /// End it: the end notification goes out with its final state and it is
    /// removed from memory and storage.
    End,
}

/// The application's hooks. Every method has a default, so `()` is a valid
/// set of hooks: no notifications, expired sessions end.
pub trait Hooks<K, S>: Send + Sync + 'static {
    /// A session was created and kept (its creating command changed it).
    /// Called once per session.
    fn begin(&self, _key: &K, _state: &S) {}

    /// A session ended, with its final state. Called exactly once per
    /// session that had a begin.
    fn end(&self, _key: &K, _state: &S) {}

    /// The session's expiration passed. The hook has exclusive access; it
    /// may await (a "long call"), change the session and keep it with a new
    /// deadline, or end it. Commands that arrive meanwhile wait and then run
    /// on what it left. With a shared storage, `step` is the step that holds
    /// the key (writes the hook makes beside the session through it become
    /// durable with the session's save after the hook, or not at all: if
    /// that save fails, the command that found the session due fails too,
    /// and the next one finalizes it again from the stored record); with a
    /// storage of this engine alone it is `None`.
    fn finalize<'a>(
        &'a self,
        _key: &'a K,
        _session: &'a mut SessionData<S>,
        _step: Option<&'a mut dyn Step>,
    ) -> BoxFuture<'a, Finalize> {
        Box::pin(async { Finalize::End })
    }

    /// The session is loaded for the first time since the engine was opened
    /// and was saved before (by an earlier run). Runs before any command
    /// sees it; recovery goes here. Never called with a shared storage (a
    /// record of an older run may be another live engine's), so there is no
    /// step to hand it.
    fn first_load<'a>(
        &'a self,
        _key: &'a K,
        _session: &'a mut SessionData<S>,
    ) -> BoxFuture<'a, Finalize> {
        Box::pin(async { Finalize::Keep })
    }
}

impl<K, S> Hooks<K, S> for () {}
