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
    /// Its messages committed PROCESSED, over every database.
    #[serde(default)]
    pub processed: u64,
    /// Its messages reported PROCESSED_DEADLOCK in committed processes.
    #[serde(default)]
    pub deadlocks: u64,
    /// Its messages committed PROCESSED_INCORRECT.
    #[serde(default)]
    pub incorrect: u64,
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
    /// In `Error`: the error code the processor gave with PROCESSED_INCORRECT,
    /// while the server still remembers the process that put it there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<i64>,
    /// In `Error`: the error text the processor gave with PROCESSED_INCORRECT,
    /// while the server still remembers the process that put it there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_text: Option<String>,
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

/// One enterprise in an [`EnterpriseList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EnterpriseInfo {
    /// The enterprise.
    pub id: Id,
    /// Its subsystems, sorted.
    pub subsystems: Vec<Id>,
}

/// `GET /v1/admin/enterprises`: one page of enterprises, sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EnterpriseList {
    /// Always 1.
    pub version: Version,
    /// This page.
    pub enterprises: Vec<EnterpriseInfo>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<Id>,
}

/// `GET /v1/admin/enterprises/{ent}`: an enterprise and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EnterpriseDetail {
    /// Always 1.
    pub version: Version,
    /// The enterprise.
    pub id: Id,
    /// Its subsystems, sorted.
    pub subsystems: Vec<Id>,
    /// How many databases it has.
    pub databases: u64,
    /// How many devices it has.
    pub devices: u64,
}

/// `GET /v1/admin/enterprises/{ent}/subsystems`: all subsystems of an enterprise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SubsystemList {
    /// Always 1.
    pub version: Version,
    /// The enterprise.
    pub enterprise: Id,
    /// Its subsystems, sorted.
    pub subsystems: Vec<Id>,
}

/// One database or device in a [`DatabaseList`] or [`DeviceList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EndpointInfo {
    /// The database's or device's id.
    pub id: Id,
    /// Its enterprise.
    pub enterprise: Id,
    /// A device's subsystem (absent for a database).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsystem: Option<Id>,
}

/// `GET /v1/admin/databases`: one page of databases, sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DatabaseList {
    /// Always 1.
    pub version: Version,
    /// This page.
    pub databases: Vec<EndpointInfo>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<Id>,
}

/// `GET /v1/admin/devices`: one page of devices, sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeviceList {
    /// Always 1.
    pub version: Version,
    /// This page.
    pub devices: Vec<EndpointInfo>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<Id>,
}

/// How many message files each folder of a mailbox holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FolderCounts {
    /// `Messages`: waiting to be handed out.
    pub messages: u64,
    /// `Prepared`: replies waiting for their process's commit.
    pub prepared: u64,
    /// `Log`: processed or acknowledged.
    pub log: u64,
    /// `Unknown`: held by processes in doubt.
    pub unknown: u64,
    /// `Error`: processed incorrectly.
    pub error: u64,
}

/// `GET /v1/admin/databases/{db}` and `GET /v1/admin/devices/{dev}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EndpointDetail {
    /// Always 1.
    pub version: Version,
    /// The database's or device's id.
    pub id: Id,
    /// Its enterprise.
    pub enterprise: Id,
    /// A device's subsystem (absent for a database).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsystem: Option<Id>,
    /// The files in its mailbox's folders.
    pub folders: FolderCounts,
    /// A database's processes that have not ended: the live one and those
    /// in doubt.
    pub open_processes: Vec<ProcessSummary>,
}

/// The 200 answer to deleting a database or device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Deleted {
    /// Always 1.
    pub version: Version,
    /// The deleted database or device.
    pub id: Id,
    /// Whether the delete was forced.
    pub forced: bool,
    /// Message files deleted with its mailbox (only a forced delete
    /// deletes any besides `Log`).
    pub discarded: u64,
    /// Processes a forced delete ended: the live one aborted, those in
    /// doubt settled as rolled back.
    pub ended_processes: Vec<ProcessId>,
}

/// The 200 answer to `POST /v1/admin/token`: the new admin token, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AdminCredentials {
    /// Always 1.
    pub version: Version,
    /// The new admin token; the old one no longer works.
    pub token: String,
}

/// How an operator settles a process in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Settlement {
    /// As committed: replies go to their devices, PROCESSED messages to `Log`.
    Commit,
    /// As rolled back: replies are deleted, the messages go back to `Messages`.
    Rollback,
}

/// `POST /v1/admin/processes/{pid}/settle`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SettleRequest {
    /// Always 1.
    pub version: Version,
    /// Commit or roll back.
    pub outcome: Settlement,
}

/// What an operator did with a message of `Unknown` or `Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HandAction {
    /// Moved into its recipient's `Messages`.
    Requeued,
    /// Deleted for good.
    Discarded,
}

/// The 200 answer to requeueing or discarding a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HandSettled {
    /// Always 1.
    pub version: Version,
    /// The message.
    pub id: MessageId,
    /// The folder it was in.
    pub folder: Folder,
    /// What was done.
    pub action: HandAction,
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
