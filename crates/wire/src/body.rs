//! [`Body`]: the arbitrary JSON a message carries, kept as raw bytes.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType};
use utoipa::{PartialSchema, ToSchema};

/// A message body: any JSON value, passed through byte for byte.
///
/// The server never looks inside a body, so it keeps the sender's text
/// (already checked to be valid JSON by the parser) instead of building a
/// `serde_json::Value` and printing it again. Raw values work with
/// `serde_json::from_slice`/`from_str`/`from_reader` and `serde_json`
/// serializers (not with `serde_json::from_value` or other formats).
#[derive(Clone)]
pub struct Body(Box<RawValue>);

impl Body {
    /// Wraps JSON text, checking that it is one valid JSON value.
    pub fn from_json(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text.into()).map(Self)
    }

    /// Serializes any value into a body.
    pub fn from_value<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self)
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Parses the body into a typed value (or a `serde_json::Value`).
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

/// Two bodies are equal when their JSON values are equal (whitespace and key
/// order do not matter); text that fails to parse compares by bytes.
impl PartialEq for Body {
    fn eq(&self, other: &Self) -> bool {
        match (
            self.parse::<serde_json::Value>(),
            other.parse::<serde_json::Value>(),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => self.get() == other.get(),
        }
    }
}

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl Serialize for Body {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Body {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Self)
    }
}

impl PartialSchema for Body {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some("any JSON value, passed through unchanged"))
            .into()
    }
}

impl ToSchema for Body {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_bytes_through() {
        let b = Body::from_json(r#"{ "b": [1, 2],  "a": "x" }"#).unwrap();
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{ "b": [1, 2],  "a": "x" }"#
        );
        assert_eq!(b, Body::from_json(r#"{"a":"x","b":[1,2]}"#).unwrap());
        assert_ne!(b, Body::from_json("null").unwrap());
        let v: serde_json::Value = b.parse().unwrap();
        assert_eq!(v["a"], "x");
    }

    #[test]
    fn rejects_invalid_json() {
        assert!(Body::from_json("{").is_err());
        assert!(Body::from_json("1 2").is_err());
    }
}
