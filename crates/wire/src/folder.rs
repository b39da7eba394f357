//! [`Folder`]: the five folders of every mailbox, named in the admin
//! API's folder listings and on disk.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The five folders of every mailbox: the queue and the places a message
/// goes after it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
pub enum Folder {
    /// The queue: messages addressed to this database or device.
    Messages,
    /// Replies written by a processor, waiting for its commit.
    Prepared,
    /// Processed (or, for a device, acknowledged) messages.
    Log,
    /// Files of processes whose outcome is in doubt.
    Unknown,
    /// Messages whose processing failed (PROCESSED_INCORRECT).
    Error,
}

impl Folder {
    /// All folders, in the order they are created.
    pub const ALL: [Folder; 5] = [
        Folder::Messages,
        Folder::Prepared,
        Folder::Log,
        Folder::Unknown,
        Folder::Error,
    ];

    /// The folder's directory name.
    pub fn as_str(self) -> &'static str {
        match self {
            Folder::Messages => "Messages",
            Folder::Prepared => "Prepared",
            Folder::Log => "Log",
            Folder::Unknown => "Unknown",
            Folder::Error => "Error",
        }
    }

    /// The folder named `s` (exact spelling), e.g. from a URL path.
    pub fn from_name(s: &str) -> Option<Folder> {
        Folder::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

impl fmt::Display for Folder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for f in Folder::ALL {
            assert_eq!(Folder::from_name(f.as_str()), Some(f));
            assert_eq!(serde_json::to_value(f).unwrap().as_str(), Some(f.as_str()));
        }
        assert_eq!(Folder::from_name("messages"), None);
    }
}
