//! The stored form of a session: a format version byte, then JSON.
//!
//! The version byte lets a later release read records written by this one
//! (or refuse them clearly) without guessing from their content.

use crate::clock::Timestamp;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// The format this release writes.
pub const FORMAT_VERSION: u8 = 1;

/// A session as stored.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Record<S> {
    pub(crate) created_at: Timestamp,
    pub(crate) last_access: Timestamp,
    pub(crate) expires_at: Option<Timestamp>,
    /// The storage generation that saved it: older means "saved before the
    /// last restart".
    pub(crate) generation: u64,
    pub(crate) state: S,
}

/// Why a stored record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The record is empty.
    #[error("empty record")]
    Empty,
    /// The record was written in a format this release does not know.
    #[error("unknown record format version {0}")]
    UnknownVersion(u8),
    /// The payload does not decode as this session type.
    #[error("record payload: {0}")]
    Payload(#[from] serde_json::Error),
}

pub(crate) fn encode<S: Serialize>(record: &Record<S>) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = vec![FORMAT_VERSION];
    serde_json::to_writer(&mut out, record)?;
    Ok(out)
}

pub(crate) fn decode<S: DeserializeOwned>(bytes: &[u8]) -> Result<Record<S>, DecodeError> {
    match bytes.split_first() {
        None => Err(DecodeError::Empty),
        Some((&FORMAT_VERSION, payload)) => Ok(serde_json::from_slice(payload)?),
        Some((&v, _)) => Err(DecodeError::UnknownVersion(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_version_checks() {
        let r = Record {
            created_at: Timestamp(1),
            last_access: Timestamp(2),
            expires_at: Some(Timestamp(3)),
            generation: 4,
            state: vec![1u32, 2],
        };
        let bytes = encode(&r).unwrap();
        let back: Record<Vec<u32>> = decode(&bytes).unwrap();
        assert_eq!(back.state, vec![1, 2]);
        assert_eq!(back.expires_at, Some(Timestamp(3)));
        assert!(matches!(decode::<u32>(&[]), Err(DecodeError::Empty)));
        assert!(matches!(
            decode::<u32>(&[9, b'1']),
            Err(DecodeError::UnknownVersion(9))
        ));
        assert!(matches!(
            decode::<u32>(&[1, b'x']),
            Err(DecodeError::Payload(_))
        ));
    }
}
