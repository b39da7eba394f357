//! [`Folder`] and [`Location`]: where in the data folder a message file lives.

use std::fmt;
use std::path::{Path, PathBuf};

pub use estafeta_wire::Folder;

use crate::id::Id;

/// A folder of one mailbox: `<data>/<mailbox>/<folder>`. The mailbox is a
/// database or device id (they share one namespace). Stored as the pair
/// `[mailbox, folder]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(from = "(Id, Folder)", into = "(Id, Folder)")]
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

impl From<(Id, Folder)> for Location {
    fn from((mailbox, folder): (Id, Folder)) -> Self {
        Location { mailbox, folder }
    }
}

impl From<Location> for (Id, Folder) {
    fn from(at: Location) -> Self {
        (at.mailbox, at.folder)
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
    fn path_under_the_root() {
        let loc = Location::new(Id::new("db-a").unwrap(), Folder::Log);
        assert_eq!(loc.path(Path::new("/d")), Path::new("/d/db-a/Log"));
    }
}
