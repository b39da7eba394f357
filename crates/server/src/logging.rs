//! [`init`]: the process's `tracing` subscriber: log lines on stderr
//! ([`stderr_lines`]: filtered by the `log` setting, `ESTAFETA_LOG`, as text
//! or JSON by `log_format`, `ESTAFETA_LOG_FORMAT`) and, for `serve`, the
//! structured event log under the data folder, which keeps every protocol
//! step, alert, warning and error whatever that filter says. Both mask the
//! secrets of URLs (a webhook target's user, password, path and query) in
//! what they write.

use std::io::IsTerminal;
use std::path::Path;

use tracing::{Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogFormat, Settings};
use crate::events::layer::redact_urls;
use crate::events::{ALERT_TARGET, EVENT_TARGET, EventLog, EventLogHandle, Retention, events_file};

/// Installing the subscriber failed.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The event log could not be opened.
    #[error("opening the event log: {0}")]
    EventLog(#[from] crate::events::EventStoreError),
    /// The `store` setting is not a cluster store's URL.
    #[error("{0}")]
    Store(#[from] crate::error::ServeError),
    /// A global subscriber was installed already.
    #[error("installing the log subscriber: {0}")]
    Init(#[from] tracing_subscriber::util::TryInitError),
}

/// Installs the global subscriber: the stderr lines of `settings` (`log`,
/// `log_format`) alone (the commands that keep no event log).
pub fn init(settings: &Settings) -> Result<(), LoggingError> {
    install(settings, None)
}

/// Installs the global subscriber of `serve`: the stderr lines of
/// `settings`, and the event log, kept as long as the `events_max_age` and
/// `events_max_mb` settings say: in the cluster store when the `store`
/// setting names one, else in `<data_dir>/.estafeta/events.redb`. Returns
/// the event log's handle: the server is given its file, and the process
/// flushes it as it stops.
pub fn init_with_event_log(
    settings: &Settings,
    data_dir: &Path,
) -> Result<EventLogHandle, LoggingError> {
    let retention = Retention {
        max_age: settings.events_max_age,
        max_bytes: settings.events_max_mb.saturating_mul(1 << 20),
    };
    let log = match &settings.store {
        Some(url) => {
            crate::stores::check_store_url(url.expose())?;
            EventLog::cluster(url.expose(), retention)?
        }
        None => EventLog::open(&events_file(data_dir), retention)?,
    };
    let handle = log.handle();
    install(settings, Some(log))?;
    Ok(handle)
}

/// The global subscriber: the stderr lines of `settings`, and `events`.
fn install(settings: &Settings, events: Option<EventLog>) -> Result<(), LoggingError> {
    let ansi = std::io::stderr().is_terminal();
    let stderr = stderr_lines(settings, || Redacting(std::io::stderr()), ansi);
    // Decided once per call site (not per event): protocol steps and
    // alerts at any level, everything else from WARN up.
    let keep = Targets::new()
        .with_target(EVENT_TARGET, Level::TRACE)
        .with_target(ALERT_TARGET, Level::TRACE)
        .with_default(Level::WARN);
    tracing_subscriber::registry()
        .with(stderr)
        .with(events.map(|log| log.with_filter(keep)))
        .try_init()?;
    Ok(())
}

/// The layer of the log lines that `init` writes to stderr, writing to
/// `writer` instead (with terminal colours when `ansi`, text only).
///
/// Text: the time, the level, the spans (a request's `request{request_id=…
/// method=… path=…}`), the target, the message and the fields. JSON: one
/// object per line with `timestamp`, `level`, `target`, `message` and the
/// event's fields at the top level, and the innermost span's fields and
/// `name` under `span`.
pub fn stderr_lines<S, W>(settings: &Settings, writer: W, ansi: bool) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let lines = match settings.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(ansi)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(writer)
            .boxed(),
    };
    lines.with_filter(EnvFilter::new(settings.log.as_str()))
}

/// A writer that masks the secrets of every URL in what it is given
/// ([`redact_urls`]) before writing it on. The stderr layer writes
/// each formatted line in one call, so a URL is never split between two.
struct Redacting<W>(W);

impl<W: std::io::Write> std::io::Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(redact_urls(text).as_bytes())?,
            Err(_) => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn urls_lose_their_credentials_on_the_way_out() {
        let mut out = Redacting(Vec::new());
        write!(
            out,
            "push failed: error sending request for url (https://hook:s3cret@example.net/x)"
        )
        .unwrap();
        let text = String::from_utf8(out.0).unwrap();
        assert_eq!(
            text,
            "push failed: error sending request for url (https://***@example.net/***)"
        );
    }
}
