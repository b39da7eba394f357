//! Bodies of the device calls (`/v1/messages`, `/v1/inbox`) and the message
//! itself, as the server hands it out and as it is stored in a file.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::id::Id;
use crate::timestamp::Timestamp;
use crate::ulid_ids::MessageId;
use crate::{Body, Version};

/// A message as handed out by the API; a message file holds exactly the
/// compact JSON of this struct, so answers are built by joining file bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Message {
    /// Always 1.
    pub version: Version,
    /// Assigned by the server; unique and sorts by arrival.
    pub id: MessageId,
    /// The sender (a device or database id).
    pub from: Id,
    /// The recipient (a database or device id).
    pub to: Id,
    /// The subsystem (mobile application) the message belongs to.
    pub subsystem: Id,
    /// The sender's creation time (the server's receive time when none was given).
    pub created_at: Timestamp,
    /// Any JSON.
    pub body: Body,
}

impl Message {
    /// The compact JSON stored in the message's file and handed out as is.
    pub fn to_file_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

/// `POST /v1/messages`: a device sends a message to a database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SendMessage {
    /// Always 1.
    pub version: Version,
    /// A database of the device's enterprise.
    pub to: Id,
    /// Any JSON.
    pub body: Body,
    /// When the device made the message; the server's receive time if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Timestamp>,
    /// Makes a retried upload idempotent: the same key from the same device
    /// gets the same message id and no second message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Scheduled delivery (RFC 3339): the message is scheduled durably and
    /// enters the database's queue at this time, not before. Absent or in
    /// the past: at once. The answer (201 with the id) comes once the
    /// message is kept durably either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<Timestamp>,
}

impl SendMessage {
    /// An upload of `body` to the database `to`: undated (the server's
    /// receive time stands), without an idempotency key, delivered at once.
    pub fn new(to: Id, body: Body) -> SendMessage {
        SendMessage {
            version: Version,
            to,
            body,
            created_at: None,
            idempotency_key: None,
            deliver_at: None,
        }
    }

    /// This upload, made idempotent by `key`.
    pub fn with_key(self, key: impl Into<String>) -> SendMessage {
        SendMessage {
            idempotency_key: Some(key.into()),
            ..self
        }
    }
}

/// The answer to `POST /v1/messages` (201, or 200 for a repeated idempotency key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MessageAccepted {
    /// Always 1.
    pub version: Version,
    /// The message's id.
    pub id: MessageId,
}

/// Whether an upload made a new message or found the earlier one: the
/// status of the answer to `POST /v1/messages`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upload {
    /// A new message (201).
    Created,
    /// The same idempotency key from the same device: the earlier id (200).
    Repeated,
}

/// The answer to `GET /v1/inbox`: unacknowledged messages, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Inbox {
    /// Always 1.
    pub version: Version,
    /// The messages.
    pub messages: Vec<Message>,
}

impl Inbox {
    /// Builds the answer around a JSON array of messages that was assembled
    /// from message files' bytes (each file holds one [`Message`]'s JSON).
    pub fn json_from_raw(messages_array: &[u8]) -> Vec<u8> {
        let head: &[u8] = br#"{"version":1,"messages":"#;
        let mut out = Vec::with_capacity(head.len() + messages_array.len() + 1);
        out.extend_from_slice(head);
        out.extend_from_slice(messages_array);
        out.push(b'}');
        out
    }
}

/// `POST /v1/inbox/ack`: the device has the messages; move them to `Log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AckRequest {
    /// Always 1.
    pub version: Version,
    /// Message ids; ids that are not messages of the device's inbox, of
    /// whatever shape (not a message id, not even a string), are ignored
    /// and not counted.
    #[serde(deserialize_with = "message_ids_only")]
    #[schema(value_type = Vec<String>)]
    pub ids: Vec<MessageId>,
}

/// The elements of a JSON array that are message ids; every other element
/// is dropped (an acknowledgement of something that is not a message of the
/// inbox acknowledges nothing). A non-array is still a type error. Each
/// element is looked at as it is parsed and only ids are kept: whatever
/// else the array holds costs no memory.
fn message_ids_only<'de, D>(deserializer: D) -> Result<Vec<MessageId>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Ids;

    impl<'de> serde::de::Visitor<'de> for Ids {
        type Value = Vec<MessageId>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an array of message ids")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut ids = Vec::new();
            while let Some(element) = seq.next_element::<MaybeId>()? {
                if let MaybeId(Some(id)) = element {
                    ids.push(id);
                }
            }
            Ok(ids)
        }
    }

    deserializer.deserialize_seq(Ids)
}

/// One element of an acknowledgement's `ids`: a message id, or anything
/// else (skipped without being kept).
struct MaybeId(Option<MessageId>);

impl<'de> Deserialize<'de> for MaybeId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Element;

        impl<'de> serde::de::Visitor<'de> for Element {
            type Value = MaybeId;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<MaybeId, E> {
                Ok(MaybeId(text.parse().ok()))
            }

            fn visit_bool<E>(self, _: bool) -> Result<MaybeId, E> {
                Ok(MaybeId(None))
            }

            fn visit_i64<E>(self, _: i64) -> Result<MaybeId, E> {
                Ok(MaybeId(None))
            }

            fn visit_u64<E>(self, _: u64) -> Result<MaybeId, E> {
                Ok(MaybeId(None))
            }

            fn visit_f64<E>(self, _: f64) -> Result<MaybeId, E> {
                Ok(MaybeId(None))
            }

            fn visit_unit<E>(self) -> Result<MaybeId, E> {
                Ok(MaybeId(None))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<MaybeId, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(MaybeId(None))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<MaybeId, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(MaybeId(None))
            }
        }

        deserializer.deserialize_any(Element)
    }
}

/// The answer to `POST /v1/inbox/ack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AckResponse {
    /// Always 1.
    pub version: Version,
    /// How many of the ids were acknowledged now.
    pub acked: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_has_the_documented_field_order() {
        let m = Message {
            version: Version,
            id: MessageId::from_parts(1, 2),
            from: Id::new("phone-1").unwrap(),
            to: Id::new("db-a").unwrap(),
            subsystem: Id::new("sales").unwrap(),
            created_at: Timestamp::parse_rfc3339("2026-11-25T10:00:00.123Z").unwrap(),
            body: Body::from_json(r#"{"n":1}"#).unwrap(),
        };
        let text = String::from_utf8(m.to_file_bytes().unwrap()).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"version":1,"id":"{}","from":"phone-1","to":"db-a","subsystem":"sales","created_at":"2026-11-25T10:00:00.123Z","body":{{"n":1}}}}"#,
                m.id
            )
        );
        assert_eq!(serde_json::from_str::<Message>(&text).unwrap(), m);
    }

    #[test]
    fn send_message_optional_fields() {
        let s: SendMessage =
            serde_json::from_str(r#"{"version":1,"to":"db-a","body":[1],"extra":true}"#).unwrap();
        assert_eq!(s.created_at, None);
        assert_eq!(s.idempotency_key, None);
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"version":1,"to":"db-a","body":[1]}"#
        );
        assert!(serde_json::from_str::<SendMessage>(r#"{"version":1,"to":"db-a"}"#).is_err());
        assert!(
            serde_json::from_str::<SendMessage>(r#"{"version":1,"to":"../x","body":1}"#).is_err()
        );
    }

    #[test]
    fn inbox_from_raw_parses() {
        let bytes = Inbox::json_from_raw(b"[]");
        let inbox: Inbox = serde_json::from_slice(&bytes).unwrap();
        assert!(inbox.messages.is_empty());
    }
}
