//! Entries: what is scheduled, and where it sits in its source.

use std::cmp::Ordering;
use std::ops::Bound;

use crate::Error;

/// The largest payload accepted, so one entry cannot exhaust memory or a redb page budget.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// The longest entry id accepted, in bytes.
pub const MAX_ID: usize = 1024;

/// The longest source name accepted, in bytes.
pub const MAX_SOURCE: usize = 128;

/// A scheduled entry as it is stored and as a handler receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The source (partition) the entry lives in.
    pub source: String,
    /// The wall-clock second (UNIX time) at which the entry comes due.
    pub due: u64,
    /// The id, unique across all sources of one store.
    pub id: String,
    /// Opaque bytes for the handler.
    pub payload: Vec<u8>,
    /// How many times a handler has failed on this entry since it was last
    /// scheduled; drives the retry backoff.
    pub attempt: u32,
}

impl Entry {
    /// The entry's place in its source.
    pub fn position(&self) -> Position {
        Position {
            due: self.due,
            id: self.id.clone(),
        }
    }
}

/// The key of an entry inside its source: sources are read in this order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    /// Due second.
    pub due: u64,
    /// Entry id (breaks ties between entries due in the same second).
    pub id: String,
}

/// Checks a source name; names become redb table names, so they are kept plain.
pub(crate) fn check_source(source: &str) -> Result<(), Error> {
    let plain = source
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if source.is_empty() || source.len() > MAX_SOURCE || !plain {
        return Err(Error::InvalidSource(source.to_owned()));
    }
    Ok(())
}

/// Checks an entry id.
pub(crate) fn check_id(id: &str) -> Result<(), Error> {
    if id.is_empty() || id.len() > MAX_ID {
        return Err(Error::InvalidId(id.len()));
    }
    Ok(())
}

/// Checks a payload size.
pub(crate) fn check_payload(payload: &[u8]) -> Result<(), Error> {
    if payload.len() > MAX_PAYLOAD {
        return Err(Error::PayloadTooLarge(payload.len()));
    }
    Ok(())
}

/// The lower of two scan starting points; used when an entry lands behind a
/// source's read cursor and the cursor has to step back to see it.
pub(crate) fn lower_bound(a: Bound<Position>, b: Bound<Position>) -> Bound<Position> {
    match (a, b) {
        (Bound::Unbounded, _) | (_, Bound::Unbounded) => Bound::Unbounded,
        (Bound::Included(x), Bound::Included(y)) => Bound::Included(x.min(y)),
        (Bound::Excluded(x), Bound::Excluded(y)) => Bound::Excluded(x.min(y)),
        (Bound::Included(x), Bound::Excluded(y)) | (Bound::Excluded(y), Bound::Included(x)) => {
            match x.cmp(&y) {
                Ordering::Greater => Bound::Excluded(y),
                Ordering::Less | Ordering::Equal => Bound::Included(x),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(due: u64, id: &str) -> Position {
        Position {
            due,
            id: id.to_owned(),
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_source("retries-1.a_b").is_ok());
        assert!(check_source("").is_err());
        assert!(check_source("a/b").is_err());
        assert!(check_source(&"x".repeat(MAX_SOURCE + 1)).is_err());
        assert!(check_id("").is_err());
        assert!(check_id("ok").is_ok());
        assert!(check_payload(&vec![0; MAX_PAYLOAD + 1]).is_err());
    }

    #[test]
    fn lower_bound_prefers_the_earlier_start() {
        assert_eq!(
            lower_bound(Bound::Excluded(pos(5, "a")), Bound::Included(pos(5, "a"))),
            Bound::Included(pos(5, "a"))
        );
        assert_eq!(
            lower_bound(Bound::Excluded(pos(4, "z")), Bound::Included(pos(5, "a"))),
            Bound::Excluded(pos(4, "z"))
        );
        assert_eq!(
            lower_bound(Bound::Unbounded, Bound::Included(pos(1, "a"))),
            Bound::Unbounded
        );
    }
}
