//! [`EventFilter`]: which records of the event log a page shows.

use chrono::{DateTime, Utc};
use tracing::Level;

use super::EventRecord;

/// Which records to show. Empty fields match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only records about this database.
    pub db: Option<String>,
    /// Only records about this device.
    pub device: Option<String>,
    /// Only records about this message.
    pub message: Option<String>,
    /// Only records of this request.
    pub request: Option<String>,
    /// Only records at least this severe.
    pub level: Option<Level>,
    /// Only records at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only records at or before this time.
    pub until: Option<DateTime<Utc>>,
}

impl EventFilter {
    /// Whether a record passes.
    pub fn matches(&self, e: &EventRecord) -> bool {
        let same = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        if !same(&self.db, &e.db)
            || !same(&self.device, &e.device)
            || !same(&self.message, &e.message)
            || !same(&self.request, &e.request)
        {
            return false;
        }
        if let Some(min) = self.level {
            // tracing orders levels by verbosity: ERROR < WARN < … < TRACE.
            match e.level.parse::<Level>() {
                Ok(level) if level <= min => {}
                _ => return false,
            }
        }
        if self.since.is_some() || self.until.is_some() {
            let Ok(ts) = DateTime::parse_from_rfc3339(&e.ts) else {
                return false;
            };
            let ts = ts.with_timezone(&Utc);
            if self.since.is_some_and(|s| ts < s) || self.until.is_some_and(|u| ts > u) {
                return false;
            }
        }
        true
    }
}
