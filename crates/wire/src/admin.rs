//! Bodies of the administration calls (`/v1/admin/...`, admin token).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Folder;
use crate::id::Id;
use crate::timestamp::Timestamp;
use crate::ulid_ids::{MessageId, ProcessId};
use crate::{ProcessState, Version};

/// `POST /v1/admin/enterprises`, and the 201 answer (the same shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateEnterprise {
    /// Always 1.
    pub version: Version,
    /// The new enterprise's id.
    pub id: Id,
}

/// `POST /v1/admin/enterprises/{ent}/subsystems`, and the 201 answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateSubsystem {
    /// Always 1.
    pub version: Version,
    /// The new subsystem's id (unique within the enterprise).
    pub id: Id,
}

/// `POST /v1/admin/enterprises/{ent}/databases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateDatabase {
    /// Always 1.
    pub version: Version,
    /// The new database's id (unique across databases and devices).
    pub id: Id,
}

/// `POST /v1/admin/enterprises/{ent}/devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateDevice {
    /// Always 1.
    pub version: Version,
    /// The new device's id (unique across databases and devices).
    pub id: Id,
    /// The subsystem (mobile application) the device runs.
    pub subsystem: Id,
}

/// `PUT /v1/admin/databases/{db}/webhook` and `PUT /v1/admin/devices/{dev}/webhook`,
/// and their 200 answer (the stored value; `DELETE` answers with `url: null`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Webhook {
    /// Always 1.
    pub version: Version,
    /// Where a small JSON notification is POSTed when a message arrives
    /// (`http://` or `https://`); `null` clears it.
    #[serde(default)]
    pub url: Option<String>,
}

/// The 201 answer to creating a database or device: its token, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Credentials {
    /// Always 1.
    pub version: Version,
    /// The database's or device's id.
    pub id: Id,
    /// Its bearer token; the server keeps only a hash.
    pub token: String,
}

/// `GET /v1/admin/processes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    /// Always 1.
    pub version: Version,
    /// Current and recently ended processes.
    pub processes: Vec<ProcessSummary>,
}

/// One process in a [`ProcessList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessSummary {
    /// The process.
    pub process_id: ProcessId,
    /// Its database.
    pub db_id: Id,
    /// Its state.
    pub state: ProcessState,
    /// When it started.
    pub started_at: Timestamp,
    /// When it became READY_TO_COMMIT, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<Timestamp>,
    /// When it ended, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
    /// How many messages it handed out.
    pub messages: u64,
    /// How many replies it prepared.
    pub replies: u64,
}

/// `GET /v1/admin/stats`: counters per database and per device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Stats {
    /// Always 1.
    pub version: Version,
    /// One entry per database.
    pub databases: Vec<DatabaseStats>,
    /// One entry per device.
    pub devices: Vec<DeviceStats>,
}

/// Counters of one database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DatabaseStats {
    /// The database.
    pub id: Id,
    /// Its enterprise.
    pub enterprise: Id,
    /// Messages delivered into its `Messages` folder.
    pub received: u64,
    /// Messages waiting in its `Messages` folder now.
    pub waiting: u64,
    /// Processes started (API_1 answered OK).
    pub processes: u64,
    /// Messages committed as PROCESSED.
    pub processed: u64,
    /// Messages reported PROCESSED_DEADLOCK.
    pub deadlocks: u64,
    /// Messages committed as PROCESSED_INCORRECT.
    pub incorrect: u64,
    /// Replies committed (sent to devices).
    pub replies: u64,
    /// Processes ended by rollback, abort or timeout.
    pub not_committed: u64,
    /// Processes that went IN_DOUBT.
    pub in_doubt: u64,
    /// The error code and text of the last message committed as
    /// PROCESSED_INCORRECT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When a process of this database last ended or went in doubt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Timestamp>,
}

/// Counters of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeviceStats {
    /// The device.
    pub id: Id,
    /// Its enterprise.
    pub enterprise: Id,
    /// Its subsystem.
    pub subsystem: Id,
    /// Messages uploaded.
    pub sent: u64,
    /// Repeated uploads answered from the idempotency record.
    pub duplicates: u64,
    /// Replies delivered into its inbox.
    pub received: u64,
    /// Replies acknowledged.
    pub acked: u64,
}

/// `GET /v1/admin/databases/{db}/folders/{folder}`: the files in a folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FolderListing {
    /// Always 1.
    pub version: Version,
    /// The mailbox (database or device id).
    pub db_id: Id,
    /// The folder.
    pub folder: Folder,
    /// Its message files, oldest first.
    pub files: Vec<FileInfo>,
}

/// One message file in a [`FolderListing`]; everything comes from the name and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileInfo {
    /// The file name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// The message id.
    pub id: MessageId,
    /// The sender.
    pub from: Id,
    /// The recipient.
    pub to: Id,
    /// The subsystem.
    pub subsystem: Id,
    /// The sender's creation time.
    pub created_at: Timestamp,
}

/// `GET /v1/admin/alerts`: every alert raised, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AlertList {
    /// Always 1.
    pub version: Version,
    /// The alerts, newest first.
    pub alerts: Vec<AlertEntry>,
}

/// One alert in an [`AlertList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AlertEntry {
    /// Its id (increasing in the order raised).
    pub id: u64,
    /// What kind of condition: `in_doubt`, `failed`, `orphans`,
    /// `storage_write`, `disk_low`, `host_down`.
    pub kind: String,
    /// The condition, `<kind>:<subject>` (e.g. `in_doubt:<process id>`): it
    /// is alerted once while it lasts.
    pub key: String,
    /// A sentence for the administrator.
    pub text: String,
    /// When it was raised.
    pub raised_at: Timestamp,
    /// When its condition ended, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
    /// When an operator acknowledged it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged_at: Option<Timestamp>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_device_round_trip() {
        let text = r#"{"version":1,"id":"phone-1","subsystem":"sales"}"#;
        let d: CreateDevice = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), text);
        assert!(serde_json::from_str::<CreateDevice>(r#"{"version":1,"id":"phone-1"}"#).is_err());
        assert!(serde_json::from_str::<CreateEnterprise>(r#"{"version":1,"id":".."}"#).is_err());
    }
}
