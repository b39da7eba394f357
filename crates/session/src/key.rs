//! Session keys and their byte form in storage.

use std::fmt::Debug;
use std::hash::Hash;

/// What a session key must be: hashable for the cache, ordered for the expiry
/// index, and convertible to and from bytes for storage.
pub trait SessionKey: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static {
    /// The key's bytes in storage.
    fn to_bytes(&self) -> Vec<u8>;
    /// The key back from its bytes; `None` if they are not a valid key.
    fn from_bytes(bytes: &[u8]) -> Option<Self>;
}

impl SessionKey for String {
    fn to_bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

impl SessionKey for u64 {
    fn to_bytes(&self) -> Vec<u8> {
        self.to_be_bytes().to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(u64::from_be_bytes(bytes.try_into().ok()?))
    }
}

impl SessionKey for Vec<u8> {
    fn to_bytes(&self) -> Vec<u8> {
        self.clone()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(bytes.to_vec())
    }
}
