//! The structured event log: every protocol step (`estafeta::event`),
//! every alert (`estafeta::alert`) and every warning and error, as JSON
//! lines under `<data>/.estafeta/events/`, which the dashboard reads.
//!
//! - [`layer`]: [`EventLog`], the `tracing` layer that writes the lines and
//!   rotates the file by size.
//! - [`reader`]: reading the lines back, newest first, with a filter.
//!
//! The alerts page does not read the log: alerts and their
//! acknowledgements are kept by the notifier ([`crate::notify::raised`]).

pub mod layer;
pub mod reader;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use layer::{EventLog, Rotation};
pub use reader::{EventFilter, read_events};

/// The target of protocol-step events.
pub const EVENT_TARGET: &str = "estafeta::event";
/// The target of alerts.
pub const ALERT_TARGET: &str = "estafeta::alert";

/// The folder of the event log in a data folder.
pub fn events_dir(data_dir: &Path) -> PathBuf {
    estafeta_exchange::DataLayout::new(data_dir).events_dir()
}

/// One line of the event log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// A unique id (time in nanoseconds and a sequence number).
    pub id: String,
    /// When, RFC 3339 in UTC with milliseconds.
    pub ts: String,
    /// `TRACE` … `ERROR`.
    pub level: String,
    /// The `tracing` target.
    pub target: String,
    /// The event's text.
    pub text: String,
    /// The database, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db: Option<String>,
    /// The device, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The process, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// The message id, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Every other field of the event.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl EventRecord {
    /// Whether this line is an alert.
    pub fn is_alert(&self) -> bool {
        self.target == ALERT_TARGET
    }
}
