//! Bearer tokens: made from 32 random bytes, shown once, stored only as
//! SHA-256 hashes, compared in constant time.

use std::fmt;

use rand::TryRng;
use rand::rngs::SysRng;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::TenancyError;

/// A secret bearer token. Its `Debug` form hides the secret so that it
/// cannot leak into logs by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The number of random bytes in a generated token.
    pub const BYTES: usize = 32;

    /// A fresh token: 32 bytes from the operating system's random source,
    /// as 64 lower-case hex characters.
    pub fn generate() -> Result<Self, TenancyError> {
        let mut bytes = [0u8; Self::BYTES];
        SysRng
            .try_fill_bytes(&mut bytes)
            .map_err(|e| TenancyError::Random(e.to_string()))?;
        Ok(Self(hex::encode(bytes)))
    }

    /// Wraps a token given by an operator (`ESTAFETA_ADMIN_TOKEN`) or read
    /// from a file; it must be non-empty visible ASCII (it travels in an
    /// HTTP header).
    pub fn from_text(text: impl Into<String>) -> Result<Self, TenancyError> {
        let text = text.into();
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TenancyError::BadAdminToken);
        }
        Ok(Self(text))
    }

    /// The secret text, to hand to the caller once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The hash under which the token is stored.
    pub fn hash(&self) -> TokenHash {
        TokenHash::of(&self.0)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(…)")
    }
}

/// The SHA-256 of a token: what the server keeps instead of the token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash(pub [u8; 32]);

impl TokenHash {
    /// The hash of a presented token.
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Constant-time equality, so that comparing says nothing about how
    /// many leading bytes matched.
    pub fn ct_eq(&self, other: &TokenHash) -> bool {
        self.0.ct_eq(&other.0).into()
    }

    /// Lower-case hex, as stored in the registry.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses the stored hex form.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenHash({})", self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_fresh_hex() {
        let a = Token::generate().unwrap();
        let b = Token::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 64);
        assert!(a.expose().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(format!("{a:?}"), "Token(…)");
    }

    #[test]
    fn hashes_compare_and_round_trip() {
        let t = Token::from_text("s3cret").unwrap();
        let h = t.hash();
        assert!(h.ct_eq(&TokenHash::of("s3cret")));
        assert!(!h.ct_eq(&TokenHash::of("s3cres")));
        assert_eq!(TokenHash::from_hex(&h.to_hex()), Some(h));
        assert_eq!(TokenHash::from_hex("zz"), None);
    }

    #[test]
    fn operator_tokens_must_be_visible_ascii() {
        for bad in ["", " x", "x ", "a b", "tök"] {
            assert!(Token::from_text(bad).is_err(), "{bad:?}");
        }
    }
}
