//! [`DataLayout`]: every path under the data folder, named in one place.
//!
//! ```text
//! <data>/<id>/{Messages,Prepared,Log,Unknown,Error}/   mailboxes (crate::mailbox)
//! <data>/.estafeta/                                     the server's own state, mode 0700
//!     registry.redb        tenancy and token hashes
//!     admin-token          the generated admin token, mode 0600
//!     sessions.redb        database, device and process sessions
//!     sessions.redb.log    their save log (the session store's, beside its file)
//!     scheduled.redb       deliver_at messages waiting for their time
//!     alerts.redb          raised alerts and their acknowledgements
//!     alerts-repeat.redb   pending alert deliveries
//!     push-repeat.redb     pending push notifications
//!     events.redb          the event log
//!     removed/<id>         one empty file per deleted mailbox (until made again)
//!     clean-stop           present between a clean stop and the next start
//! ```
//!
//! Mailbox ids never start with a dot ([`crate::Id`]), so `.estafeta` cannot
//! be taken for a mailbox.

use std::path::{Path, PathBuf};

/// The state folder's name in the data folder.
const STATE_DIR: &str = ".estafeta";

/// The paths of one data folder.
///
/// ```
/// use estafeta_exchange::DataLayout;
/// let layout = DataLayout::new("/srv/estafeta");
/// assert_eq!(layout.sessions(), std::path::Path::new("/srv/estafeta/.estafeta/sessions.redb"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataLayout {
    root: PathBuf,
}

impl DataLayout {
    /// The layout of the data folder `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DataLayout { root: root.into() }
    }

    /// The data folder, which holds the mailboxes.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `.estafeta/`: the server's own state.
    pub fn state_dir(&self) -> PathBuf {
        self.root.join(STATE_DIR)
    }

    /// The registry of enterprises, subsystems, databases, devices and token hashes.
    pub fn registry(&self) -> PathBuf {
        self.state_dir().join("registry.redb")
    }

    /// The generated admin token.
    pub fn admin_token(&self) -> PathBuf {
        self.state_dir().join("admin-token")
    }

    /// The session store: database, device and process sessions.
    pub fn sessions(&self) -> PathBuf {
        self.state_dir().join("sessions.redb")
    }

    /// The devices' idempotency keys, one entry per key.
    pub fn keys(&self) -> PathBuf {
        self.state_dir().join("keys.redb")
    }

    /// The store of `deliver_at` messages waiting for their time.
    pub fn scheduled(&self) -> PathBuf {
        self.state_dir().join("scheduled.redb")
    }

    /// Raised alerts and their acknowledgements.
    pub fn alerts(&self) -> PathBuf {
        self.state_dir().join("alerts.redb")
    }

    /// Pending alert deliveries.
    pub fn alert_deliveries(&self) -> PathBuf {
        self.state_dir().join("alerts-repeat.redb")
    }

    /// Pending push notifications.
    pub fn push_deliveries(&self) -> PathBuf {
        self.state_dir().join("push-repeat.redb")
    }

    /// The event log.
    pub fn events(&self) -> PathBuf {
        self.state_dir().join("events.redb")
    }

    /// The deleted mailboxes, one empty file each, named by the id.
    pub fn removed(&self) -> PathBuf {
        self.state_dir().join("removed")
    }

    /// An empty file made at a clean stop once every message file is
    /// durable under its name and no spare file is left, and removed by
    /// the next start before anything is written: a start that finds it
    /// has no writes of a crash to look for.
    pub fn clean_stop(&self) -> PathBuf {
        self.state_dir().join("clean-stop")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_file_is_in_the_state_folder_under_its_own_name() {
        let layout = DataLayout::new("/data");
        let files = [
            layout.registry(),
            layout.admin_token(),
            layout.sessions(),
            layout.scheduled(),
            layout.alerts(),
            layout.alert_deliveries(),
            layout.push_deliveries(),
            layout.events(),
            layout.removed(),
            layout.clean_stop(),
        ];
        let names: std::collections::BTreeSet<_> = files.iter().map(|f| f.file_name()).collect();
        assert_eq!(names.len(), files.len());
        for file in &files {
            assert_eq!(file.parent(), Some(Path::new("/data/.estafeta")));
        }
        assert_eq!(layout.root(), Path::new("/data"));
    }
}
