//! Ids and process ids as session-engine keys (feature `session-key`):
//! stored as their text, so a stored key reads back as the same id.

use estafeta_session::SessionKey;

use crate::{Id, ProcessId};

impl SessionKey for Id {
    fn to_bytes(&self) -> Vec<u8> {
        self.as_str().as_bytes().to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        std::str::from_utf8(bytes).ok()?.parse().ok()
    }
}

impl SessionKey for ProcessId {
    fn to_bytes(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        std::str::from_utf8(bytes).ok()?.parse().ok()
    }
}
