//! [`AlertKind`]: what kind of condition an alert reports. Its own file so
//! that the pure process lifecycle names the alerts it asks for without
//! reaching the alert machinery.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What kind of condition an alert reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A READY_TO_COMMIT process stalled, or was found at start-up: in doubt.
    InDoubt,
    /// A process's file moves failed (a commit's, those putting it in
    /// doubt, or a late settlement's): they are retried with backoff.
    Failed,
    /// Files in `Prepared` that no process referred to, moved to `Unknown`.
    Orphans,
    /// A write to storage failed.
    StorageWrite,
    /// Free disk space fell under the configured threshold.
    DiskLow,
    /// An outbound host (a webhook, a gateway) stays down.
    HostDown,
    /// A file a process's step was to move was in neither place: it was
    /// lost, or removed by hand or by retention. The step counts as done.
    MissingFile,
}

impl AlertKind {
    /// The kind's name as it appears in keys and notices.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::InDoubt => "in_doubt",
            AlertKind::Failed => "failed",
            AlertKind::Orphans => "orphans",
            AlertKind::StorageWrite => "storage_write",
            AlertKind::DiskLow => "disk_low",
            AlertKind::HostDown => "host_down",
            AlertKind::MissingFile => "missing_file",
        }
    }
}

impl fmt::Display for AlertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
