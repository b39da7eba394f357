//! [`Version`]: the `"version": 1` that every JSON body carries.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

/// The protocol version; serializes as `1` and deserializes only from `1`.
///
/// A field of this type has no default, so a body without `version` fails to
/// parse just like one with `"version": 2` (both are HTTP 400).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Version;

impl Version {
    /// The only version this server speaks.
    pub const CURRENT: u64 = 1;
}

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(Self::CURRENT)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Deserializing through serde_json::Value gives one clear message for
        // 2, "1", 1.0, null alike.
        let v = serde_json::Value::deserialize(deserializer)?;
        if v.as_u64() == Some(Self::CURRENT) {
            Ok(Version)
        } else {
            Err(serde::de::Error::custom(format_args!(
                "unsupported version {v}, expected 1"
            )))
        }
    }
}

impl PartialSchema for Version {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .enum_values(Some([1]))
            .description(Some("protocol version; always 1"))
            .into()
    }
}

impl ToSchema for Version {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Envelope {
        #[allow(dead_code)]
        version: Version,
    }

    #[test]
    fn only_one_is_accepted() {
        assert_eq!(serde_json::to_string(&Version).unwrap(), "1");
        assert!(serde_json::from_str::<Envelope>(r#"{"version":1}"#).is_ok());
        for bad in [
            r#"{"version":2}"#,
            r#"{"version":0}"#,
            r#"{"version":"1"}"#,
            r#"{"version":1.5}"#,
            r#"{"version":null}"#,
            r#"{}"#,
        ] {
            assert!(serde_json::from_str::<Envelope>(bad).is_err(), "{bad}");
        }
    }
}
