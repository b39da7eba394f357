//! Reading the event log back for the dashboard: the rotated files oldest
//! first, then the current one; the newest matching lines first.

use std::io::{self, BufRead, BufReader};
use std::path::Path;

use chrono::{DateTime, Utc};
use tracing::Level;

use super::EventRecord;

/// Which lines to show. Empty fields match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only lines about this database.
    pub db: Option<String>,
    /// Only lines about this device.
    pub device: Option<String>,
    /// Only lines at least this severe.
    pub level: Option<Level>,
    /// Only lines at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only lines at or before this time.
    pub until: Option<DateTime<Utc>>,
}

impl EventFilter {
    /// Whether a line passes.
    pub fn matches(&self, e: &EventRecord) -> bool {
        let same = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        if !same(&self.db, &e.db) || !same(&self.device, &e.device) {
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

/// The newest `limit` lines of the event log in `dir` that pass `filter`,
/// newest first. Lines that do not parse are skipped.
pub fn read_events(dir: &Path, filter: &EventFilter, limit: usize) -> io::Result<Vec<EventRecord>> {
    let mut rotated: Vec<(usize, std::path::PathBuf)> = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(n) = name
                    .strip_prefix("events.")
                    .and_then(|r| r.strip_suffix(".jsonl"))
                    .and_then(|n| n.parse::<usize>().ok())
                {
                    rotated.push((n, entry.path()));
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    // Highest number is oldest.
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut paths: Vec<_> = rotated.into_iter().map(|(_, p)| p).collect();
    paths.push(dir.join("events.jsonl"));
    let mut kept = std::collections::VecDeque::new();
    for path in paths {
        for e in read_lines(&path)? {
            if filter.matches(&e) {
                kept.push_back(e);
                if kept.len() > limit {
                    kept.pop_front();
                }
            }
        }
    }
    Ok(kept.into_iter().rev().collect())
}

fn read_lines(path: &Path) -> io::Result<Vec<EventRecord>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in BufReader::new(file).lines() {
        if let Ok(e) = serde_json::from_str::<EventRecord>(&line?) {
            out.push(e);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventLog, Rotation};

    fn record(i: usize, level: &str, db: Option<&str>, ts: &str) -> EventRecord {
        EventRecord {
            id: i.to_string(),
            ts: ts.to_owned(),
            level: level.to_owned(),
            target: "estafeta::event".to_owned(),
            text: format!("step {i}"),
            db: db.map(str::to_owned),
            device: None,
            process: None,
            message: None,
            fields: Default::default(),
        }
    }

    #[test]
    fn reads_across_rotated_files_newest_first_with_filters() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(
            dir.path(),
            Rotation {
                max_bytes: 300,
                keep: 3,
            },
        )
        .unwrap();
        for i in 0..12 {
            let (level, db) = if i % 3 == 0 {
                ("WARN", "db-a")
            } else {
                ("INFO", "db-b")
            };
            let ts = format!("2026-11-25T10:00:{i:02}.000Z");
            log.write(&record(i, level, Some(db), &ts)).unwrap();
        }
        let all = read_events(dir.path(), &EventFilter::default(), 100).unwrap();
        let ids: Vec<_> = all.iter().map(|e| e.id.parse::<usize>().unwrap()).collect();
        let mut sorted = ids.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(ids, sorted, "newest first");
        assert_eq!(ids[0], 11);

        let warn = EventFilter {
            level: Some(Level::WARN),
            ..Default::default()
        };
        let w = read_events(dir.path(), &warn, 100).unwrap();
        assert!(!w.is_empty() && w.iter().all(|e| e.level == "WARN"));

        let db_b = EventFilter {
            db: Some("db-b".into()),
            ..Default::default()
        };
        assert!(
            read_events(dir.path(), &db_b, 100)
                .unwrap()
                .iter()
                .all(|e| e.db.as_deref() == Some("db-b"))
        );

        let window = EventFilter {
            since: Some("2026-11-25T10:00:10Z".parse().unwrap()),
            until: Some("2026-11-25T10:00:11Z".parse().unwrap()),
            ..Default::default()
        };
        let ids: Vec<_> = read_events(dir.path(), &window, 100)
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, ["11", "10"]);
        assert_eq!(
            read_events(dir.path(), &EventFilter::default(), 2)
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn a_missing_log_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none");
        assert!(
            read_events(&missing, &EventFilter::default(), 10)
                .unwrap()
                .is_empty()
        );
    }
}
