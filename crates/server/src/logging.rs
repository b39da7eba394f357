//! [`init`]: the process's `tracing` subscriber: human-readable lines on
//! stderr (filtered by the `log` setting, `ESTAFETA_LOG`) and, for `serve`,
//! the structured event log under the data folder, which keeps every
//! protocol step, alert, warning and error whatever that filter says.

use std::io::IsTerminal;
use std::path::Path;

use tracing::Level;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::LogFilter;
use crate::events::{ALERT_TARGET, EVENT_TARGET, EventLog, Rotation, events_dir};

/// Installing the subscriber failed.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The event log's folder or file could not be opened.
    #[error("opening the event log in {0}: {1}")]
    EventLog(String, std::io::Error),
    /// A global subscriber was installed already.
    #[error("installing the log subscriber: {0}")]
    Init(#[from] tracing_subscriber::util::TryInitError),
}

/// Installs the global subscriber, its stderr lines filtered by `filter`;
/// with `data_dir`, also the event log in `<data_dir>/.estafeta/events/`.
pub fn init(filter: &LogFilter, data_dir: Option<&Path>) -> Result<(), LoggingError> {
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(EnvFilter::new(filter.as_str()));
    let events = match data_dir {
        Some(dir) => {
            let dir = events_dir(dir);
            let log = EventLog::open(&dir, Rotation::default())
                .map_err(|e| LoggingError::EventLog(dir.display().to_string(), e))?;
            // Decided once per call site (not per event): protocol steps and
            // alerts at any level, everything else from WARN up.
            let keep = Targets::new()
                .with_target(EVENT_TARGET, Level::TRACE)
                .with_target(ALERT_TARGET, Level::TRACE)
                .with_default(Level::WARN);
            Some(log.with_filter(keep))
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(stderr)
        .with(events)
        .try_init()?;
    Ok(())
}
