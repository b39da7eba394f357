//! [`EventLog`]: a `tracing` layer that appends the events worth keeping
//! to `events.jsonl`, one JSON object a line, and rotates `events.jsonl` when it passes a size: the current file
//! becomes `events.1.jsonl`, `.1` becomes `.2`, and the oldest beyond the
//! kept count is removed.
//!
//! Credentials in URLs (`scheme://user:password@host`) are replaced by
//! `***` in every value before it is written ([`redact_credentials`]).
//!
//! Every record is size-capped (values cut at [`MAX_VALUE_BYTES`], at most
//! [`MAX_FIELDS`] other fields, a line at most [`MAX_RECORD_BYTES`]): what
//! a request carries into an event cannot grow the log without bound.
//!
//! Log lines are not fsynced one by one: they are a record of what
//! happened, not data the server promised to keep; a crash may lose the
//! last few.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use super::{ALERT_TARGET, EVENT_TARGET, EventRecord};

/// The longest value (the text or a field) a record keeps, in bytes; a
/// longer one is cut and ends in `…`.
pub const MAX_VALUE_BYTES: usize = 1024;
/// The most fields besides the text, database, device, process and message
/// a record keeps; later ones are dropped.
pub const MAX_FIELDS: usize = 32;
/// The longest line written, in bytes. A record whose line would be longer
/// keeps its text (cut short) and names, and loses its other fields.
pub const MAX_RECORD_BYTES: usize = 16 * 1024;

/// How large `events.jsonl` may grow and how many older files are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate when the current file passes this many bytes.
    pub max_bytes: u64,
    /// Older files kept (`events.1.jsonl` … `events.N.jsonl`).
    pub keep: usize,
}

impl Default for Rotation {
    /// 8 MB a file, 5 older files.
    fn default() -> Self {
        Rotation {
            max_bytes: 8 << 20,
            keep: 5,
        }
    }
}

/// The event-log layer; see the module documentation.
pub struct EventLog {
    dir: PathBuf,
    rotation: Rotation,
    files: Mutex<Files>,
    seq: AtomicU64,
}

struct Files {
    events: Option<File>,
    size: u64,
}

impl EventLog {
    /// A layer writing into `dir` (created if missing, with every missing
    /// parent, readable by the server's user only and durable in their
    /// parents: the log is the first thing `estafeta serve` creates in a
    /// new data folder, so later opens find these folders present).
    pub fn open(dir: impl Into<PathBuf>, rotation: Rotation) -> io::Result<EventLog> {
        let dir = dir.into();
        estafeta_durable::create_dir_all(&dir, 0o700)?;
        let events = append(&dir.join("events.jsonl"))?;
        let size = events.metadata()?.len();
        Ok(EventLog {
            dir,
            rotation,
            files: Mutex::new(Files {
                events: Some(events),
                size,
            }),
            seq: AtomicU64::new(0),
        })
    }

    /// Whether an event is kept: protocol steps, alerts, warnings, errors.
    pub fn wants(target: &str, level: &Level) -> bool {
        target == EVENT_TARGET || target == ALERT_TARGET || *level <= Level::WARN
    }

    /// Writes one record (rotating first if the file is full), cut down to
    /// [`MAX_RECORD_BYTES`] if it is longer.
    pub fn write(&self, record: &EventRecord) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        if line.len() > MAX_RECORD_BYTES {
            line = serde_json::to_vec(&shrunk(record)).map_err(io::Error::other)?;
        }
        line.push(b'\n');
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if files.size > 0 && files.size + line.len() as u64 > self.rotation.max_bytes {
            files.events = None;
            self.rotate()?;
            files.events = Some(append(&self.dir.join("events.jsonl"))?);
            files.size = 0;
        }
        let file = match files.events.as_mut() {
            Some(f) => f,
            None => files.events.insert(append(&self.dir.join("events.jsonl"))?),
        };
        file.write_all(&line)?;
        files.size += line.len() as u64;
        Ok(())
    }

    /// `events.{k}` → `events.{k+1}` from the oldest down, then the current
    /// file → `events.1`; the one past `keep` is removed.
    fn rotate(&self) -> io::Result<()> {
        let numbered = |k: usize| self.dir.join(format!("events.{k}.jsonl"));
        if self.rotation.keep == 0 {
            return remove_if_present(&self.dir.join("events.jsonl"));
        }
        remove_if_present(&numbered(self.rotation.keep))?;
        for k in (1..self.rotation.keep).rev() {
            rename_if_present(&numbered(k), &numbered(k + 1))?;
        }
        rename_if_present(&self.dir.join("events.jsonl"), &numbered(1))
    }

    fn next_id(&self, nanos: i64) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{nanos}-{seq}")
    }
}

/// `record` cut down far enough that its line fits [`MAX_RECORD_BYTES`]
/// even when every character needs escaping: the text and names short,
/// the other fields replaced by `"truncated": true`.
fn shrunk(record: &EventRecord) -> EventRecord {
    let short = |s: &str, max: usize| {
        let mut s = s.to_owned();
        cut(&mut s, max);
        s
    };
    let name = |n: &Option<String>| n.as_deref().map(|n| short(n, 128));
    let mut fields = serde_json::Map::new();
    fields.insert("truncated".to_owned(), true.into());
    EventRecord {
        id: short(&record.id, 64),
        ts: short(&record.ts, 64),
        level: short(&record.level, 16),
        target: short(&record.target, 128),
        text: short(&record.text, 256),
        db: name(&record.db),
        device: name(&record.device),
        process: name(&record.process),
        message: name(&record.message),
        fields,
    }
}

/// `text` with the user information of every URL in it (what comes
/// between `scheme://` and `@host`, such as `user:password`) replaced by
/// `***`.
pub fn redact_credentials(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("://") || !text.contains('@') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (before, after) = rest.split_at(i + 3);
        out.push_str(before);
        let end = after
            .find(|c: char| "/?#\"'<> ".contains(c) || c.is_whitespace() || c.is_control())
            .unwrap_or(after.len());
        let authority = &after[..end];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// Cuts `s` to at most `max` bytes (at a character boundary), marking the
/// cut with `…`.
fn cut(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push('…');
}

/// Opens a log file for appending; a new one is the server's user's only.
fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn rename_if_present(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::rename(from, to) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

impl<S: Subscriber> Layer<S> for EventLog {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        if !Self::wants(meta.target(), meta.level()) {
            return;
        }
        let now = chrono::Utc::now();
        let mut record = EventRecord {
            id: self.next_id(now.timestamp_nanos_opt().unwrap_or_default()),
            ts: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            level: meta.level().to_string(),
            target: meta.target().to_owned(),
            text: String::new(),
            db: None,
            device: None,
            process: None,
            message: None,
            fields: serde_json::Map::new(),
        };
        event.record(&mut Fields {
            record: &mut record,
            text_seen: false,
        });
        if let Err(e) = self.write(&record) {
            // Not through tracing: that would come back here.
            eprintln!("estafeta: writing the event log failed: {e}");
        }
    }
}

/// Sorts an event's fields into the record. The macros put the event's
/// text first, as a field named `message`; a later `message` field is a
/// message id.
struct Fields<'a> {
    record: &'a mut EventRecord,
    text_seen: bool,
}

impl Fields<'_> {
    fn put(&mut self, field: &Field, mut value: serde_json::Value) {
        if let serde_json::Value::String(s) = &mut value {
            if let std::borrow::Cow::Owned(redacted) = redact_credentials(s) {
                *s = redacted;
            }
            cut(s, MAX_VALUE_BYTES);
        }
        let text = || match &value {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        match field.name() {
            "message" if !self.text_seen => {
                self.text_seen = true;
                self.record.text = text();
            }
            "message" => self.record.message = Some(text()),
            "db" => self.record.db = Some(text()),
            "device" => self.record.device = Some(text()),
            "process" => self.record.process = Some(text()),
            name if self.record.fields.len() < MAX_FIELDS => {
                self.record.fields.insert(name.to_owned(), value);
            }
            _ => {}
        }
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, serde_json::Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, serde_json::Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, serde_json::Value::String(value.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    fn lines(path: &Path) -> Vec<EventRecord> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn keeps_events_alerts_and_warnings_with_their_fields() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(dir.path(), Rotation::default()).unwrap();
        let subscriber = tracing_subscriber::registry().with(log);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "estafeta::event", db = "db-a", device = "phone-1", message = "01MSG", n = 3, "message received");
            tracing::info!("an ordinary info line is not kept");
            tracing::warn!(process = "01PID", "a warning is kept");
            tracing::error!(target: "estafeta::alert", db = "db-a", "in doubt");
        });
        let events = lines(&dir.path().join("events.jsonl"));
        assert_eq!(events.len(), 3, "{events:?}");
        let e = &events[0];
        assert_eq!(e.text, "message received");
        assert_eq!(e.db.as_deref(), Some("db-a"));
        assert_eq!(e.device.as_deref(), Some("phone-1"));
        assert_eq!(e.message.as_deref(), Some("01MSG"));
        assert_eq!(e.fields["n"], 3);
        assert_eq!(e.level, "INFO");
        assert_eq!(events[1].process.as_deref(), Some("01PID"));
        assert_eq!(events[1].level, "WARN");
        assert!(events[2].is_alert());
        assert_ne!(events[0].id, events[1].id);
    }

    #[test]
    fn credentials_in_urls_are_redacted() {
        let cases = [
            (
                "http://u:secret@example.org/hook",
                "http://***@example.org/hook",
            ),
            (
                "see https://tok@h:8080?x=1 and ftp://a:b@c",
                "see https://***@h:8080?x=1 and ftp://***@c",
            ),
            ("http://example.org/a@b", "http://example.org/a@b"),
            ("mail ops@example.org", "mail ops@example.org"),
            ("no url", "no url"),
            ("\"http://a:b@c\"", "\"http://***@c\""),
        ];
        for (given, want) in cases {
            assert_eq!(redact_credentials(given), want, "{given}");
        }
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(dir.path(), Rotation::default()).unwrap();
        let subscriber = tracing_subscriber::registry().with(log);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "estafeta::event", webhook = "http://u:secret@h/x", "set http://v:hidden@h/y");
        });
        let text = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
        assert!(
            !text.contains("secret") && !text.contains("hidden"),
            "{text}"
        );
        assert!(text.contains("http://***@h/x"), "{text}");
    }

    #[test]
    fn every_record_is_size_capped() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(dir.path(), Rotation::default()).unwrap();
        let subscriber = tracing_subscriber::registry().with(log);
        let huge = "é".repeat(1 << 20);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "estafeta::event", method = %huge, db = %huge, "{huge}");
        });
        let text = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
        assert!(text.len() <= MAX_RECORD_BYTES + 1, "{} bytes", text.len());
        let e = &lines(&dir.path().join("events.jsonl"))[0];
        assert!(e.text.len() <= MAX_VALUE_BYTES + '…'.len_utf8());
        assert!(e.text.ends_with('…') && e.text.starts_with("éé"));
        let field = e.fields["method"].as_str().unwrap();
        assert!(field.len() <= MAX_VALUE_BYTES + '…'.len_utf8());

        // Every value escaped six-fold in JSON still fits, with the names kept.
        let log = EventLog::open(dir.path().join("b"), Rotation::default()).unwrap();
        let control = "\u{1}".repeat(MAX_VALUE_BYTES);
        let mut fields = serde_json::Map::new();
        for i in 0..MAX_FIELDS {
            fields.insert(format!("f{i}"), control.clone().into());
        }
        log.write(&EventRecord {
            id: "1".to_owned(),
            ts: "2026-11-25T10:00:00.000Z".to_owned(),
            level: "INFO".to_owned(),
            target: EVENT_TARGET.to_owned(),
            text: control.clone(),
            db: Some("db-a".to_owned()),
            device: None,
            process: None,
            message: None,
            fields,
        })
        .unwrap();
        let path = dir.path().join("b").join("events.jsonl");
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size <= MAX_RECORD_BYTES as u64 + 1, "{size} bytes");
        let e = &lines(&path)[0];
        assert_eq!(e.db.as_deref(), Some("db-a"));
        assert_eq!(e.fields["truncated"], true);

        let subscriber = tracing_subscriber::registry()
            .with(EventLog::open(dir.path().join("c"), Rotation::default()).unwrap());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "estafeta::event", a0 = 0, a1 = 1, a2 = 2, a3 = 3, a4 = 4, a5 = 5, a6 = 6,
                a7 = 7, a8 = 8, a9 = 9, b0 = 0, b1 = 1, b2 = 2, b3 = 3, b4 = 4, b5 = 5, b6 = 6, b7 = 7,
                b8 = 8, b9 = 9, c0 = 0, c1 = 1, c2 = 2, c3 = 3, c4 = 4, c5 = 5, c6 = 6, c7 = 7, c8 = 8,
                c9 = 9, d0 = 0, d1 = 1, d2 = 2, d3 = 3, "many fields");
        });
        let e = &lines(&dir.path().join("c").join("events.jsonl"))[0];
        assert_eq!(e.fields.len(), MAX_FIELDS);
        assert_eq!(e.text, "many fields");
    }

    #[test]
    fn rotates_by_size_and_keeps_n_files() {
        let dir = tempfile::tempdir().unwrap();
        let rotation = Rotation {
            max_bytes: 400,
            keep: 2,
        };
        let log = EventLog::open(dir.path(), rotation).unwrap();
        let subscriber = tracing_subscriber::registry().with(log);
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..40 {
                tracing::info!(target: "estafeta::event", i, "step");
            }
        });
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["events.1.jsonl", "events.2.jsonl", "events.jsonl"]);
        for name in &names {
            let size = std::fs::metadata(dir.path().join(name)).unwrap().len();
            assert!(size <= 400, "{name} is {size} bytes");
        }
        let newest = lines(&dir.path().join("events.jsonl"));
        assert_eq!(newest.last().unwrap().fields["i"], 39);
        let older = lines(&dir.path().join("events.1.jsonl"));
        let last_older = older.last().unwrap().fields["i"].as_u64().unwrap();
        let first_newest = newest[0].fields["i"].as_u64().unwrap();
        assert_eq!(last_older + 1, first_newest);
    }
}
