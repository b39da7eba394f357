//! The service's leaf pieces: what its parts share and that uses nothing
//! of the service: the step a command holds in a shared session store
//! ([`Held`]) and the exchange's time now ([`now`]).

use crate::Timestamp;
use estafeta_session::Clock;

/// The step a session's command holds in a shared session store, which
/// writes beside the record join (see
/// [`Step::joint`](estafeta_session::storage::Step::joint)); `None` with a
/// session store of this server alone.
pub(crate) type Held<'a> = Option<&'a mut dyn estafeta_session::storage::Step>;

/// `held` lent for one call, to be used again after it.
pub(crate) fn again<'b>(held: &'b mut Held<'_>) -> Held<'b> {
    match held {
        Some(step) => Some(&mut **step),
        None => None,
    }
}

/// The exchange's time now, read from `clock`.
pub(crate) fn now(clock: &dyn Clock) -> Timestamp {
    Timestamp::from_millis(i64::try_from(clock.now().0).unwrap_or(i64::MAX))
}
