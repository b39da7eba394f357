//! [`AlertBook`]: the alerts the exchange raised (the `estafeta::alert`
//! lines of the event log) and which of them an operator acknowledged.
//! Acknowledgements are kept durably in `<data>/.estafeta/alerts-acked.json`
//! (written to a temporary file, fsynced, renamed, folder fsynced).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::events::{EventRecord, events_dir, read_alerts};

/// An alert and when it was acknowledged, if it was.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    /// The event-log line that raised it.
    pub event: EventRecord,
    /// When an operator acknowledged it (RFC 3339).
    pub acked_at: Option<String>,
}

/// Acknowledging failed; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    /// No alert has this id.
    #[error("no alert {0}")]
    Unknown(String),
    /// Reading the alerts or writing the acknowledgement failed.
    #[error("alert storage: {0}")]
    Io(#[from] io::Error),
}

/// The alerts of one data folder and their acknowledgements.
pub struct AlertBook {
    events: PathBuf,
    acks_path: PathBuf,
    acks: Mutex<BTreeMap<String, String>>,
}

impl AlertBook {
    /// Reads the acknowledgements of `data_dir` (none if the file is absent).
    pub fn open(data_dir: &Path) -> Result<AlertBook, AlertError> {
        let acks_path = data_dir.join(".estafeta").join("alerts-acked.json");
        let acks = match std::fs::read(&acks_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(io::Error::other)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e.into()),
        };
        Ok(AlertBook {
            events: events_dir(data_dir),
            acks_path,
            acks: Mutex::new(acks),
        })
    }

    /// A book with no acknowledgements (when the file cannot be read, so
    /// the dashboard still shows the alerts).
    pub fn empty(data_dir: &Path) -> AlertBook {
        AlertBook {
            events: events_dir(data_dir),
            acks_path: data_dir.join(".estafeta").join("alerts-acked.json"),
            acks: Mutex::new(BTreeMap::new()),
        }
    }

    /// Every alert, newest first.
    pub fn list(&self) -> Result<Vec<Alert>, AlertError> {
        let acks = self.acks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(read_alerts(&self.events)?
            .into_iter()
            .map(|event| Alert {
                acked_at: acks.get(&event.id).cloned(),
                event,
            })
            .collect())
    }

    /// How many alerts nobody acknowledged yet.
    pub fn open_count(&self) -> Result<usize, AlertError> {
        Ok(self.list()?.iter().filter(|a| a.acked_at.is_none()).count())
    }

    /// Acknowledges an alert, durably, at `now` (RFC 3339).
    pub fn acknowledge(&self, id: &str, now: &str) -> Result<(), AlertError> {
        if !read_alerts(&self.events)?.iter().any(|a| a.id == id) {
            return Err(AlertError::Unknown(id.to_owned()));
        }
        let mut acks = self.acks.lock().unwrap_or_else(|p| p.into_inner());
        if acks.contains_key(id) {
            return Ok(());
        }
        let mut next = acks.clone();
        next.insert(id.to_owned(), now.to_owned());
        write_durably(
            &self.acks_path,
            &serde_json::to_vec(&next).map_err(io::Error::other)?,
        )?;
        *acks = next;
        Ok(())
    }
}

fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventLog, Rotation};

    #[test]
    fn acknowledgements_survive_reopening() {
        let data = tempfile::tempdir().unwrap();
        let log = EventLog::open(events_dir(data.path()), Rotation::default()).unwrap();
        for (i, target) in ["estafeta::alert", "estafeta::event", "estafeta::alert"]
            .iter()
            .enumerate()
        {
            log.write(&EventRecord {
                id: format!("a{i}"),
                ts: "2026-11-25T10:00:00.000Z".into(),
                level: "ERROR".into(),
                target: (*target).into(),
                text: "in doubt".into(),
                db: None,
                device: None,
                process: None,
                message: None,
                fields: Default::default(),
            })
            .unwrap();
        }
        let book = AlertBook::open(data.path()).unwrap();
        assert_eq!(book.open_count().unwrap(), 2);
        assert!(matches!(
            book.acknowledge("a1", "now"),
            Err(AlertError::Unknown(_))
        ));
        book.acknowledge("a2", "2026-11-25T10:01:00Z").unwrap();
        book.acknowledge("a2", "later").unwrap();
        let again = AlertBook::open(data.path()).unwrap();
        let list = again.list().unwrap();
        assert_eq!(list[0].event.id, "a2");
        assert_eq!(list[0].acked_at.as_deref(), Some("2026-11-25T10:01:00Z"));
        assert_eq!(list[1].acked_at, None);
        assert_eq!(again.open_count().unwrap(), 1);
    }
}
