//! A session held for a call: made if new, and, for a call that presented
//! a token, its caller confirmed against the registry as the session's
//! step read it, so that a token revoked through another node is refused
//! before anything is written.

use super::Presented;
use super::error::ExchangeError;
use crate::Id;
use crate::tenancy::Registry;
use crate::wire::ErrorCode;
use estafeta_session::{Engine, SessionGuard, SessionKey, State};

/// The session of `id` in `engine`, held (made if new); `what` names its
/// kind in the error of an engine that has none to give.
pub(crate) async fn hold<K: SessionKey, S: State>(
    engine: &Engine<K, S>,
    id: &K,
    what: &str,
) -> Result<SessionGuard<K, S>, ExchangeError> {
    engine.get(id.clone(), true).await?.ok_or_else(|| {
        ExchangeError::unavailable(
            ErrorCode::StorageError,
            format!("{what} session unavailable"),
        )
    })
}

/// The session of `id` (the device or database of `who`) in `engine`,
/// held ([`hold`]), once `who` is confirmed ([`confirm`]) against
/// `registry` with the change counter its step's lock read. A token that
/// is no longer `who`'s is refused (401) and the session released,
/// nothing written.
pub(crate) async fn hold_for<S: State>(
    registry: &Registry,
    engine: &Engine<Id, S>,
    id: &Id,
    what: &str,
    who: &Presented,
) -> Result<SessionGuard<Id, S>, ExchangeError> {
    let mut g = hold(engine, id, what).await?;
    if who.hash.is_none() {
        return Ok(g);
    }
    let version = g.step().and_then(|step| registry.version_in_step(step));
    match confirm(registry, who, version).await {
        Ok(()) => Ok(g),
        Err(refused) => {
            g.release().await?;
            Err(refused)
        }
    }
}

/// Confirms `who`: a principal vouched for as it is; a presented token
/// against `registry` brought up to date, with a shared registry to
/// `version`, its change counter as a statement of the call read it (a
/// step's lock, or the call's read): reloaded only when it moved; without
/// one, the counter is read first. A token that is no longer `who`'s is
/// refused (401).
pub(crate) async fn confirm(
    registry: &Registry,
    who: &Presented,
    version: Option<u64>,
) -> Result<(), ExchangeError> {
    let Some(hash) = &who.hash else {
        return Ok(());
    };
    match version {
        Some(version) => registry.refresh_to(version).await?,
        None => registry.refresh().await?,
    }
    match registry.authenticate_hash(hash).as_ref() == Some(&who.who) {
        true => Ok(()),
        false => Err(ExchangeError::unauthorized("unknown token")),
    }
}
