//! Server-assigned ids: [`MessageId`] and [`ProcessId`] (ULIDs), and the
//! [`UlidGenerator`] that makes them.
//!
//! A ULID is 26 Crockford base-32 characters: 48 bits of milliseconds then
//! 80 random bits, so ids are unique and sort by the time the server made
//! them. That is what the API promises for message ids ("sorts by arrival"),
//! and it lets retention read a file's age from its name.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use ulid::Ulid;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::error::UlidError;
use crate::timestamp::Timestamp;

/// Defines a ULID newtype with parsing, display, serde and an OpenAPI schema.
macro_rules! ulid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Ulid);

        impl $name {
            /// The length of the textual form.
            pub const LEN: usize = ulid::ULID_LEN;

            /// Builds an id from a time (ms since the Unix epoch) and random bits.
            pub fn from_parts(timestamp_ms: u64, random: u128) -> Self {
                Self(Ulid::from_parts(timestamp_ms, random))
            }

            /// When the id was made, from its first 48 bits.
            pub fn timestamp(self) -> Timestamp {
                Timestamp::from_millis(i64::try_from(self.0.timestamp_ms()).unwrap_or(i64::MAX))
            }
        }

        impl FromStr for $name {
            type Err = UlidError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                // Only the canonical (upper-case) form is accepted, so that an id and
                // its text are one-to-one and file names never differ by case.
                match Ulid::from_string(s) {
                    Ok(u) if u.to_string() == s => Ok(Self(u)),
                    _ => Err(UlidError(s.to_owned())),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut buf = [0u8; ulid::ULID_LEN];
                f.write_str(self.0.array_to_str(&mut buf))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut buf = [0u8; ulid::ULID_LEN];
                serializer.serialize_str(self.0.array_to_str(&mut buf))
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = String::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(ulid::ULID_LEN))
                    .max_length(Some(ulid::ULID_LEN))
                    .pattern(Some("^[0-9A-HJKMNP-TV-Z]{26}$"))
                    .description(Some("a ULID, assigned by the server"))
                    .into()
            }
        }

        impl ToSchema for $name {}
    };
}

ulid_id!(
    /// The server-assigned id of a message; unique, sorts by arrival.
    MessageId
);

ulid_id!(
    /// The server-assigned id of a process (one run of the six-call protocol).
    ProcessId
);

/// Makes strictly increasing ULIDs from the caller's clock, even when many
/// are made in one millisecond or the clock steps back (then the last id is
/// incremented instead of going backwards).
#[derive(Debug, Default)]
pub struct UlidGenerator {
    inner: Mutex<ulid::Generator>,
}

impl UlidGenerator {
    /// A generator that has made no ids yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next message id at time `now`.
    pub fn message_id(&self, now: SystemTime) -> MessageId {
        MessageId(self.next(now))
    }

    /// The next process id at time `now`.
    pub fn process_id(&self, now: SystemTime) -> ProcessId {
        ProcessId(self.next(now))
    }

    fn next(&self, now: SystemTime) -> Ulid {
        // A poisoned lock only means another thread panicked mid-call; the
        // generator's single field is always consistent, so keep using it.
        let mut generator = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match generator.generate_from_datetime(now) {
            Ok(u) => u,
            // 2^80 ids in one millisecond: borrow from the next millisecond.
            Err(overflow) => overflow.commit_overflow_increment(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn text_round_trip_and_order() {
        let a = MessageId::from_parts(1_000, 5);
        let b = MessageId::from_parts(1_001, 0);
        assert!(a < b);
        assert!(a.to_string() < b.to_string());
        assert_eq!(a.to_string().len(), MessageId::LEN);
        assert_eq!(a.to_string().parse::<MessageId>().unwrap(), a);
        assert_eq!(a.timestamp().as_millis(), 1_000);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<MessageId>(&json).unwrap(), a);
    }

    #[test]
    fn rejects_non_canonical_text() {
        let a = ProcessId::from_parts(1_000, 5).to_string();
        assert!(a.to_lowercase().parse::<ProcessId>().is_err());
        assert!("".parse::<ProcessId>().is_err());
        assert!("../../etc/passwd".parse::<ProcessId>().is_err());
        assert!(serde_json::from_str::<MessageId>("\"nope\"").is_err());
    }

    #[test]
    fn generator_is_monotonic_even_if_the_clock_steps_back() {
        let g = UlidGenerator::new();
        let t = at_ms(1_700_000_000_000);
        let first = g.message_id(t);
        let second = g.message_id(t);
        let third = g.message_id(t - Duration::from_secs(60));
        assert!(first < second && second < third);
        assert_eq!(first.timestamp().as_millis(), 1_700_000_000_000);
    }

    fn at_ms(ms: u64) -> SystemTime {
        std::time::UNIX_EPOCH + Duration::from_millis(ms)
    }
}
