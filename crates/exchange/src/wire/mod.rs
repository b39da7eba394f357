//! Serde types for every request and response body of the HTTP API
//! (API.md), shared by the server and the client crate.
//!
//! Every body carries [`Version`] (only `1` parses; a missing version is an
//! error), unknown fields are ignored, ids are validated while parsing, and
//! status words are enums with the API's exact spelling. Every type derives
//! or implements `utoipa::ToSchema`, so the server's `/v1/openapi.json`
//! describes exactly what is parsed here.

mod admin;
mod body;
mod error_body;
mod message;
mod process;
mod status;
mod version;

pub use admin::{
    AlertEntry, AlertList, CreateDatabase, CreateDevice, CreateEnterprise, CreateSubsystem,
    Credentials, DatabaseStats, DeviceStats, FileInfo, FolderListing, ProcessList, ProcessSummary,
    Stats, Webhook,
};
pub use body::Body;
pub use error_body::{ErrorBody, ErrorDetail};
pub use message::{AckRequest, AckResponse, Inbox, Message, MessageAccepted, SendMessage};
pub use process::{
    AbortRequest, AcceptRequest, CallResponse, CommitRequest, MessageResult, PrepareRequest,
    ProcessStatus, Reply, RollbackRequest, StartRequest, StartResponse,
};
pub use status::{CallStatus, ProcessState, ResultStatus, StartStatus};
pub use version::Version;
