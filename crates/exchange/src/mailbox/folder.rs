//! [`Folder`] and [`Location`]: where in the data folder a message file lives.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::id::Id;

/// The five folders of every mailbox (seed 004: the queue and the places a
/// message goes after it).
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

/// A folder of one mailbox: `<data>/<mailbox>/<folder>`. The mailbox is a
/// database or device id (they share one namespace).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// The database or device id owning the mailbox.
    pub mailbox: Id,
    /// The folder inside it.
    pub folder: Folder,
}

impl Location {
    /// The folder `folder` of mailbox `mailbox`.
    pub fn new(mailbox: Id, folder: Folder) -> Self {
        Self { mailbox, folder }
    }

    /// The directory path under the data root.
    pub fn path(&self, root: &Path) -> PathBuf {
        root.join(self.mailbox.as_str()).join(self.folder.as_str())
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.mailbox, self.folder)
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
        let loc = Location::new(Id::new("db-a").unwrap(), Folder::Log);
        assert_eq!(loc.path(Path::new("/d")), Path::new("/d/db-a/Log"));
    }
}
