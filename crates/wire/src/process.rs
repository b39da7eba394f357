//! Bodies of the six processor calls (API_1 … API_6) and the process status.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::id::Id;
use crate::timestamp::Timestamp;
use crate::ulid_ids::{MessageId, ProcessId};
use crate::{Body, CallStatus, Message, ProcessState, ResultStatus, StartStatus, Version};

/// API_1, `POST /v1/processes`: start a process for a database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StartRequest {
    /// Always 1.
    pub version: Version,
    /// The database (must be the token's own).
    pub db_id: Id,
    /// Only messages of these subsystems.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsystems: Option<Vec<Id>>,
    /// Only messages from these senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub senders: Option<Vec<Id>>,
    /// At most this many messages (the smaller of this and the server's limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_files: Option<u64>,
    /// At most this many megabytes (MiB) in total, except a single larger message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mb: Option<f64>,
}

impl StartRequest {
    /// A start for the database `db_id`: every subsystem and sender, within
    /// the server's limits.
    pub fn new(db_id: Id) -> StartRequest {
        StartRequest {
            version: Version,
            db_id,
            subsystems: None,
            senders: None,
            max_files: None,
            max_mb: None,
        }
    }
}

/// The answer to API_1: IDLE, BUSY, or OK with a process id and messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StartResponse {
    /// Always 1.
    pub version: Version,
    /// IDLE, BUSY or OK.
    pub status: StartStatus,
    /// With OK: the new process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_id: Option<ProcessId>,
    /// With OK: the messages to process, oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Message>>,
}

impl StartResponse {
    /// `{"version":1,"status":"IDLE"}`.
    pub fn idle() -> Self {
        Self::bare(StartStatus::Idle)
    }

    /// `{"version":1,"status":"BUSY"}`.
    pub fn busy() -> Self {
        Self::bare(StartStatus::Busy)
    }

    fn bare(status: StartStatus) -> Self {
        Self {
            version: Version,
            status,
            process_id: None,
            messages: None,
        }
    }

    /// The OK answer built around a JSON array of messages that was assembled
    /// from file bytes, without parsing them.
    pub fn ok_json_from_raw(process_id: ProcessId, messages_array: &[u8]) -> Vec<u8> {
        let head =
            format!(r#"{{"version":1,"status":"OK","process_id":"{process_id}","messages":"#);
        let mut out = Vec::with_capacity(head.len() + messages_array.len() + 1);
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(messages_array);
        out.push(b'}');
        out
    }
}

/// API_2, `POST /v1/processes/{pid}/accept`: the subset the processor will handle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AcceptRequest {
    /// Always 1.
    pub version: Version,
    /// A subset of the process's messages.
    pub message_ids: Vec<MessageId>,
}

/// API_3, `POST /v1/processes/{pid}/prepare`: verdicts and replies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PrepareRequest {
    /// Always 1.
    pub version: Version,
    /// One verdict for every accepted message, each exactly once.
    pub results: Vec<MessageResult>,
    /// Replies to write durably to `Prepared`.
    pub replies: Vec<Reply>,
}

/// The verdict on one message in a [`PrepareRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MessageResult {
    /// The message.
    pub message_id: MessageId,
    /// PROCESSED, PROCESSED_DEADLOCK or PROCESSED_INCORRECT.
    pub status: ResultStatus,
    /// The database's numeric error code, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<i64>,
    /// The error text, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_text: Option<String>,
}

/// A reply message in a [`PrepareRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Reply {
    /// The recipient (a device of the database's enterprise).
    pub to: Id,
    /// Any JSON.
    pub body: Body,
    /// When the processor made the reply; the server's time if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Timestamp>,
    /// Scheduled delivery (RFC 3339): once the process commits, the reply
    /// is scheduled durably and enters the recipient's inbox at this time,
    /// not before. Absent or in the past: at commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<Timestamp>,
}

/// API_4, `POST /v1/processes/{pid}/commit`: the processor's transaction committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CommitRequest {
    /// Always 1.
    pub version: Version,
}

/// API_5, `POST /v1/processes/{pid}/rollback`: the processor's commit failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RollbackRequest {
    /// Always 1.
    pub version: Version,
    /// Why; goes to the event log.
    pub error_text: String,
}

/// API_6, `POST /v1/processes/{pid}/abort`: the processor gives up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AbortRequest {
    /// Always 1.
    pub version: Version,
    /// Why; goes to the event log.
    pub message: String,
}

/// The answer to API_2 … API_6: a status word with HTTP 200.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CallResponse {
    /// Always 1.
    pub version: Version,
    /// OK, CANCELLED or FAILED.
    pub status: CallStatus,
}

impl CallResponse {
    /// An answer with the given status.
    pub fn new(status: CallStatus) -> Self {
        Self {
            version: Version,
            status,
        }
    }
}

/// `GET /v1/processes/{pid}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessStatus {
    /// Always 1.
    pub version: Version,
    /// The process.
    pub process_id: ProcessId,
    /// Its database.
    pub db_id: Id,
    /// Its state.
    pub state: ProcessState,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_answers() {
        assert_eq!(
            serde_json::to_string(&StartResponse::idle()).unwrap(),
            r#"{"version":1,"status":"IDLE"}"#
        );
        assert_eq!(
            serde_json::to_string(&StartResponse::busy()).unwrap(),
            r#"{"version":1,"status":"BUSY"}"#
        );
        let pid = ProcessId::from_parts(7, 7);
        let bytes = StartResponse::ok_json_from_raw(pid, b"[]");
        let parsed: StartResponse = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(parsed.status, StartStatus::Ok);
        assert_eq!(parsed.process_id, Some(pid));
        assert_eq!(parsed.messages, Some(vec![]));
    }

    #[test]
    fn start_request_filters_are_optional() {
        let r: StartRequest = serde_json::from_str(r#"{"version":1,"db_id":"db-a"}"#).unwrap();
        assert_eq!(r.subsystems, None);
        assert_eq!(r.max_mb, None);
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"version":1,"db_id":"db-a"}"#
        );
        assert!(serde_json::from_str::<StartRequest>(r#"{"version":1}"#).is_err());
        assert!(
            serde_json::from_str::<StartRequest>(r#"{"version":1,"db_id":"a","max_files":-1}"#)
                .is_err()
        );
    }

    #[test]
    fn prepare_needs_results_and_replies() {
        let id = MessageId::from_parts(1, 1);
        let ok = format!(
            r#"{{"version":1,"results":[{{"message_id":"{id}","status":"PROCESSED_INCORRECT","error_code":335544345,"error_text":"lock"}}],"replies":[{{"to":"phone-1","body":{{}}}}]}}"#
        );
        let p: PrepareRequest = serde_json::from_str(&ok).unwrap();
        assert_eq!(p.results[0].error_code, Some(335_544_345));
        assert_eq!(serde_json::to_string(&p).unwrap(), ok);
        assert!(serde_json::from_str::<PrepareRequest>(r#"{"version":1,"results":[]}"#).is_err());
        let bad_status = format!(
            r#"{{"version":1,"results":[{{"message_id":"{id}","status":"DONE"}}],"replies":[]}}"#
        );
        assert!(serde_json::from_str::<PrepareRequest>(&bad_status).is_err());
    }

    #[test]
    fn call_bodies_need_their_text() {
        assert!(serde_json::from_str::<CommitRequest>(r#"{"version":1}"#).is_ok());
        assert!(serde_json::from_str::<CommitRequest>(r#"{}"#).is_err());
        assert!(serde_json::from_str::<RollbackRequest>(r#"{"version":1}"#).is_err());
        assert!(serde_json::from_str::<AbortRequest>(r#"{"version":1,"message":"x"}"#).is_ok());
        assert_eq!(
            serde_json::to_string(&CallResponse::new(CallStatus::Cancelled)).unwrap(),
            r#"{"version":1,"status":"CANCELLED"}"#
        );
    }
}
