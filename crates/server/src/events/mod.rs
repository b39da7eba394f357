//! The structured event log: every protocol step (`estafeta::event`),
//! every alert (`estafeta::alert`) and every warning and error, with the
//! id of the request it happened in, kept in `<data>/.estafeta/events.redb`
//! with indexes, which the dashboard reads a page at a time.
//!
//! - [`layer`]: [`EventLog`], the `tracing` layer that hands the records to
//!   a writer thread, which writes them in batches, off the request path.
//! - [`store`]: [`EventStore`], the redb file, its indexes and retention.
//! - [`mod@reader`]: [`EventFilter`], which records a page shows.
//!
//! The alerts page does not read the log: alerts and their
//! acknowledgements are kept by the notifier ([`crate::notify::raised`]).
//!
//! In cluster mode the log is the cluster's `events` table
//! ([`EventLog::cluster`]), so every node's pages show the events of every
//! node; the server reads whichever store its node keeps the log in
//! (`crate::stores::NodeStores`).

pub mod layer;
pub mod reader;
pub mod store;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use layer::{EventLog, EventLogHandle};
pub use reader::EventFilter;
pub use store::{EventLogStore, EventPage, EventStore, EventStoreError, Retention, SetAside};

/// The target of protocol-step events.
pub const EVENT_TARGET: &str = "estafeta::event";
/// The target of alerts.
pub const ALERT_TARGET: &str = "estafeta::alert";

/// The event log's file in a data folder.
pub fn events_file(data_dir: &Path) -> PathBuf {
    estafeta_exchange::DataLayout::new(data_dir).events()
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
    /// The id of the HTTP request it happened in, when in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
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
