//! [`Kind`]: whether an id names a database or a device, the two kinds of
//! mailbox owner: in the admin API's paths, webhook notifications, the
//! registry's lists and the folder totals.

use serde::{Deserialize, Serialize};

/// A database or a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A database: its `Messages` holds the uploads waiting for a process.
    Database,
    /// A device: its `Messages` holds what waits for the device to fetch.
    Device,
}

impl Kind {
    /// `"database"` or `"device"`: the kind's name in paths and
    /// notifications.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Database => "database",
            Kind::Device => "device",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_named_as_in_paths_and_notifications() {
        for kind in [Kind::Database, Kind::Device] {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(serde_json::from_str::<Kind>(&json).unwrap(), kind);
        }
    }
}
