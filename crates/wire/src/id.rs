//! [`Id`]: the validated name of an enterprise, subsystem, database or device.
//!
//! Ids are the only client-given strings that reach file paths, so they are
//! checked once, here, and everything path-related takes an `Id` rather than
//! a `&str`. The alphabet (`A-Z a-z 0-9 . -`, first character a letter or a
//! digit) excludes `/`, `_` (the field separator of message file names),
//! `.` and `..`, and every name starting with a dot (temporary files,
//! `.estafeta`).

use std::borrow::Borrow;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::error::IdError;

/// A validated id (1–64 characters of `A-Z a-z 0-9 . -`, starting with a
/// letter or a digit). Deserializing validates, so a request carrying a bad
/// id fails to parse (HTTP 400) before it reaches any logic.
///
/// The text is shared: a clone costs a reference count, not an allocation
/// (every file name holds three ids, and the records of a process copy
/// hundreds of names at each of its steps).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Id(Arc<str>);

impl Id {
    /// The longest id, in bytes (and characters: the alphabet is ASCII).
    pub const MAX_LEN: usize = 64;

    /// The regular expression of a valid id, as published in the OpenAPI document.
    pub const PATTERN: &'static str = "^[A-Za-z0-9][A-Za-z0-9.-]{0,63}$";

    /// Validates `s` and wraps it.
    pub fn new(s: impl AsRef<str>) -> Result<Self, IdError> {
        let s = s.as_ref();
        validate(s)?;
        Ok(Self(Arc::from(s)))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Unwraps the inner string.
    pub fn into_string(self) -> String {
        String::from(&*self.0)
    }
}

/// Checks the rules of the module docs.
fn validate(s: &str) -> Result<(), IdError> {
    let mut chars = s.chars();
    let first = chars.next().ok_or(IdError::Empty)?;
    if !first.is_ascii_alphanumeric() {
        return Err(IdError::BadStart);
    }
    if let Some(bad) = chars.find(|c| !(c.is_ascii_alphanumeric() || *c == '.' || *c == '-')) {
        return Err(IdError::BadChar(bad));
    }
    // All characters are ASCII by now, so bytes and characters agree.
    if s.len() > Id::MAX_LEN {
        return Err(IdError::TooLong(s.len()));
    }
    Ok(())
}

impl FromStr for Id {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for Id {
    type Error = IdError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<&str> for Id {
    type Error = IdError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Id {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<std::path::Path> for Id {
    fn as_ref(&self) -> &std::path::Path {
        std::path::Path::new(&*self.0)
    }
}

impl Borrow<str> for Id {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

impl PartialSchema for Id {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(Self::MAX_LEN))
            .pattern(Some(Self::PATTERN))
            .description(Some(
                "1-64 characters of A-Z a-z 0-9 . -, starting with a letter or a digit",
            ))
            .into()
    }
}

impl ToSchema for Id {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_alphabet() {
        for ok in ["a", "0", "db-a", "phone-1", "A.b-C.9", "a..b", "x."] {
            assert_eq!(Id::new(ok).unwrap().as_str(), ok);
        }
        let longest = "a".repeat(64);
        assert_eq!(Id::new(longest.clone()).unwrap().as_str(), longest);
    }

    #[test]
    fn rejects_everything_else() {
        assert_eq!(Id::new(""), Err(IdError::Empty));
        assert_eq!(Id::new("a".repeat(65)), Err(IdError::TooLong(65)));
        assert_eq!(Id::new("."), Err(IdError::BadStart));
        assert_eq!(Id::new(".."), Err(IdError::BadStart));
        assert_eq!(Id::new(".estafeta"), Err(IdError::BadStart));
        assert_eq!(Id::new("-a"), Err(IdError::BadStart));
        assert_eq!(Id::new("a/b"), Err(IdError::BadChar('/')));
        assert_eq!(Id::new("a_b"), Err(IdError::BadChar('_')));
        assert_eq!(Id::new("a b"), Err(IdError::BadChar(' ')));
        assert_eq!(Id::new("a\\b"), Err(IdError::BadChar('\\')));
        assert_eq!(Id::new("aé"), Err(IdError::BadChar('é')));
        assert_eq!(Id::new("é"), Err(IdError::BadStart));
    }

    #[test]
    fn multibyte_input_is_a_bad_char_not_a_panic() {
        let s = format!("a{}", "é".repeat(40));
        assert_eq!(Id::new(s), Err(IdError::BadChar('é')));
    }

    #[test]
    fn serde_validates() {
        let id: Id = serde_json::from_str("\"db-a\"").unwrap();
        assert_eq!(id.to_string(), "db-a");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"db-a\"");
        assert!(serde_json::from_str::<Id>("\"../etc\"").is_err());
        assert!(serde_json::from_str::<Id>("\"a_b\"").is_err());
        assert!(serde_json::from_str::<Id>("17").is_err());
    }
}
