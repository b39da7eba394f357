//! The vocabulary of the Estafeta HTTP API (version 1): ids, times and the
//! serde type of every request and response body, with no storage and no
//! HTTP in it, so that the server (`estafeta-exchange`, `estafeta-server`)
//! and the typed client (`estafeta-client`) share one definition of every
//! field and a client pulls in nothing of the server's.
//!
//! - [`id`]: [`Id`], the validated name of an enterprise, subsystem, database
//!   or device: the only client-given text that may reach a path.
//! - [`timestamp`] and [`ulid_ids`]: [`Timestamp`] (a message's `created_at`,
//!   a `deliver_at`) and the server-assigned [`MessageId`] and [`ProcessId`]
//!   (ULIDs), with the [`UlidGenerator`] that makes them.
//! - The bodies, at the crate root: [`Message`] and the device calls'
//!   bodies, the six process calls' ([`StartRequest`] … [`CallResponse`]),
//!   the admin calls' ([`Stats`], [`FolderListing`] over the five
//!   [`Folder`]s, …), and [`ErrorBody`], the JSON of every error answer,
//!   with its [`ErrorCode`].
//! - [`error`]: why a string is not a valid id, ULID or timestamp.
//!
//! Every body carries [`Version`] (only `1` parses; a missing version is an
//! error), unknown fields are ignored, ids are validated while parsing, and
//! status words are enums with the API's exact spelling. Every type derives
//! or implements `utoipa::ToSchema`, so the server's `/v1/openapi.json`
//! describes exactly what is parsed here.
//!
//! # Example
//!
//! A device's upload is parsed (its recipient validated on the way), turned
//! into the message the server stores, and that message's stored bytes parse
//! back as the same message:
//!
//! ```
//! use std::time::SystemTime;
//!
//! use estafeta_wire::{Id, Message, SendMessage, Timestamp, UlidGenerator, Version};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let upload: SendMessage = serde_json::from_str(
//!     r#"{"version": 1, "to": "db-a", "body": {"order": 17}, "idempotency_key": "order-17"}"#,
//! )?;
//! assert_eq!(upload.to, "db-a".parse::<Id>()?);
//!
//! // An id that could name another path, or another version, does not parse.
//! assert!(serde_json::from_str::<SendMessage>(r#"{"version": 1, "to": "../x", "body": 1}"#).is_err());
//! assert!(serde_json::from_str::<SendMessage>(r#"{"version": 2, "to": "db-a", "body": 1}"#).is_err());
//!
//! let ids = UlidGenerator::new();
//! let now = SystemTime::now();
//! let message = Message {
//!     version: Version,
//!     id: ids.message_id(now),
//!     from: "phone-1".parse()?,
//!     to: upload.to,
//!     subsystem: "sales".parse()?,
//!     created_at: upload.created_at.unwrap_or(Timestamp::from_system_time(now)),
//!     body: upload.body,
//! };
//! let stored = message.to_file_bytes()?;
//! assert_eq!(serde_json::from_slice::<Message>(&stored)?, message);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod error;
pub mod id;
pub mod timestamp;
pub mod ulid_ids;

mod admin;
mod body;
mod error_body;
mod error_code;
mod folder;
mod kind;
mod message;
mod process;
#[cfg(feature = "session-key")]
mod session_key;
mod status;
mod version;

pub use admin::{
    AdminCredentials, AlertEntry, AlertList, CreateDatabase, CreateDevice, CreateEnterprise,
    CreateSubsystem, Credentials, DatabaseList, DatabaseStats, Deleted, DeviceList, DeviceStats,
    EndpointDetail, EndpointInfo, EnterpriseDetail, EnterpriseInfo, EnterpriseList, FileInfo,
    FolderCounts, FolderListing, HandAction, HandSettled, ProcessList, ProcessSummary,
    SettleRequest, Settlement, Stats, SubsystemList, Webhook,
};
pub use body::Body;
pub use error::{IdError, TimestampError, UlidError};
pub use error_body::{ErrorBody, ErrorDetail};
pub use error_code::{ErrorCode, UnknownErrorCode};
pub use folder::Folder;
pub use id::Id;
pub use kind::Kind;
pub use message::{AckRequest, AckResponse, Inbox, Message, MessageAccepted, SendMessage, Upload};
pub use process::{
    AbortRequest, AcceptRequest, CallResponse, CommitRequest, MessageResult, PrepareRequest,
    ProcessStatus, Reply, RollbackRequest, StartRequest, StartResponse,
};
pub use status::{CallStatus, ProcessState, ResultStatus, StartStatus};
pub use timestamp::Timestamp;
pub use ulid_ids::{MessageId, ProcessId, UlidGenerator};
pub use version::Version;
