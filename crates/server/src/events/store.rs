//! [`EventStore`]: the event log in redb (`<data>/.estafeta/events.redb`),
//! with indexes, so that a page of it costs the same with a million events
//! kept as with ten.
//!
//! - `events`: `(nanoseconds, sequence)` → the record as JSON; the key is
//!   the record's id, so the table is in time order.
//! - `events.index.<n>`: `("<kind>:<value>", nanoseconds, sequence)` → `()`,
//!   one entry per database, device, process, message and request id a
//!   record names: a filter on one of them reads only its entries. The
//!   index is kept in segments, each of the records written while it was
//!   the newest, about a [`SEGMENTS_KEPT`]th of what the retention keeps.
//! - `events.segments`: each segment's number → its first record's time,
//!   its newest record's key and its records' bytes.
//! - `events.meta`: the bytes of JSON kept, for the retention by size.
//!
//! Retention: after each batch written, the oldest records go while they
//! are older than [`Retention::max_age`] or the JSON kept passes
//! [`Retention::max_bytes`] (at most [`PRUNE_MOST`] a batch, so that one
//! batch stays short; the next ones go on), in one sweep of the table's
//! start. Their index entries are not removed one by one (each on a page
//! of its own, in four places a record): a segment goes whole, its table
//! dropped, once its newest record is gone. Until then a query's range
//! starts at the oldest record kept, past its older entries. So retention
//! rewrites the pages at the table's start, not pages all over the index.
//! The file does not shrink: redb reuses the pages freed.
//!
//! redb opens a file once per process: `serve` opens it with its log
//! subscriber ([`super::EventLog::open`]) and hands that store to the server
//! ([`super::EventLogHandle::file`]), whose dashboard pages and backups use
//! it.
//!
//! A file redb cannot open for damage is set aside (renamed
//! `events.redb.damaged-<milliseconds>`) and a new log begun: the server
//! starts without that history, and says so ([`SetAside`]). A backup holds
//! writes back while it copies the file ([`EventStore::hold_writes`]).
//!
//! [`EventLogStore`] is what the writer and the readers use: this file, or
//! the cluster's `events` table ([`estafeta_postgres::PgEvents`]), the same
//! filters and pages over both.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
};

use super::{EventFilter, EventRecord};

const EVENTS: TableDefinition<'_, (u64, u64), &[u8]> = TableDefinition::new("events");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("events.meta");
/// The index's segments: a segment's number → [`Segment::value`].
const SEGMENTS: TableDefinition<'_, u64, (u64, u64, u64, u64)> =
    TableDefinition::new("events.segments");
/// The one index of a log written before the index had segments: opened,
/// it becomes segment 0.
const UNSEGMENTED_INDEX: TableDefinition<'_, (&str, u64, u64), ()> =
    TableDefinition::new("events.index");

/// How many segments the index of a full log is in: a segment ends once
/// its records' JSON reaches this share of [`Retention::max_bytes`], or
/// they span this share of [`Retention::max_age`].
pub const SEGMENTS_KEPT: u64 = 16;

/// The name of index segment `number`'s table.
fn segment_name(number: u64) -> String {
    format!("events.index.{number}")
}

/// An index segment's table.
fn index_table(name: &str) -> TableDefinition<'_, (&'static str, u64, u64), ()> {
    TableDefinition::new(name)
}

/// What an index segment holds, kept in `events.segments`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    /// The time of its first record: a segment spans at most a
    /// [`SEGMENTS_KEPT`]th of the age kept.
    first_nanos: u64,
    /// Its newest record's key: once that record is gone, so are all of
    /// the segment's, and the segment is dropped.
    newest: EventKey,
    /// Its records' JSON bytes.
    bytes: u64,
}

impl Segment {
    const EMPTY: Segment = Segment {
        first_nanos: 0,
        newest: (0, 0),
        bytes: 0,
    };

    fn value(self) -> (u64, u64, u64, u64) {
        (self.first_nanos, self.newest.0, self.newest.1, self.bytes)
    }

    fn from_value((first_nanos, nanos, sequence, bytes): (u64, u64, u64, u64)) -> Segment {
        Segment {
            first_nanos,
            newest: (nanos, sequence),
            bytes,
        }
    }

    /// Whether the next record, at `nanos`, begins a new segment.
    fn is_full(&self, retention: &Retention, nanos: u64) -> bool {
        let max_age = u64::try_from(retention.max_age.as_nanos()).unwrap_or(u64::MAX);
        self.bytes > 0
            && (self.bytes >= retention.max_bytes / SEGMENTS_KEPT
                || nanos.saturating_sub(self.first_nanos) >= max_age / SEGMENTS_KEPT)
    }
}

/// The key of the JSON bytes kept, in `events.meta`.
const BYTES: &str = "bytes";

/// The most records one batch removes for the retention.
pub const PRUNE_MOST: usize = 10_000;

/// The most records one query looks at (the filters that no index serves,
/// such as the level, are checked one record at a time): a page that
/// reaches it ends there, with a link further back.
pub const SCAN_MOST: usize = 20_000;

/// How long and how much of the event log is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Records older than this are removed.
    pub max_age: std::time::Duration,
    /// The oldest records are removed while the records' JSON passes this
    /// many bytes.
    pub max_bytes: u64,
}

impl Default for Retention {
    /// 30 days, 256 MiB.
    fn default() -> Self {
        Retention {
            max_age: std::time::Duration::from_secs(30 * 24 * 3600),
            max_bytes: 256 << 20,
        }
    }
}

/// Where the event log is kept.
pub trait EventLogStore: Send + Sync {
    /// Writes `records` in one transaction, then removes what the
    /// retention says must go, counting age from `now_nanos`.
    fn append(
        &self,
        records: &[EventRecord],
        retention: &Retention,
        now_nanos: u64,
    ) -> Result<(), EventStoreError>;

    /// How many records are kept, and their JSON's bytes.
    fn size(&self) -> Result<(u64, u64), EventStoreError>;

    /// Up to `limit` records passing `filter`, newest first, older than the
    /// record `before` (an id from the previous page) when given, looking
    /// at no more than [`SCAN_MOST`] records.
    fn query(
        &self,
        filter: &EventFilter,
        before: Option<EventKey>,
        limit: usize,
    ) -> Result<EventPage, EventStoreError>;

    /// Holds back writes until the guard is dropped, for a store kept in a
    /// file of the data folder (a backup copies it meanwhile); `None`: the
    /// store is not in the data folder.
    fn hold_writes(&self) -> Option<MutexGuard<'_, ()>> {
        None
    }
}

impl EventLogStore for EventStore {
    fn append(
        &self,
        records: &[EventRecord],
        retention: &Retention,
        now_nanos: u64,
    ) -> Result<(), EventStoreError> {
        EventStore::append(self, records, retention, now_nanos)
    }

    fn size(&self) -> Result<(u64, u64), EventStoreError> {
        EventStore::size(self)
    }

    fn query(
        &self,
        filter: &EventFilter,
        before: Option<EventKey>,
        limit: usize,
    ) -> Result<EventPage, EventStoreError> {
        EventStore::query(self, filter, before, limit)
    }

    fn hold_writes(&self) -> Option<MutexGuard<'_, ()>> {
        Some(EventStore::hold_writes(self))
    }
}

/// The key range a filter and a page cursor read: from the lowest key at
/// or after `since` up to `until` and before `before`.
fn key_range(filter: &EventFilter, before: Option<EventKey>) -> (EventKey, Bound<EventKey>) {
    let nanos = |t: Option<chrono::DateTime<chrono::Utc>>, default: u64| {
        t.map_or(default, |t| {
            u64::try_from(t.timestamp_nanos_opt().unwrap_or(0)).unwrap_or(0)
        })
    };
    let low: EventKey = (nanos(filter.since, 0), 0);
    let mut high: Bound<EventKey> = match filter.until {
        Some(_) => Bound::Included((nanos(filter.until, u64::MAX), u64::MAX)),
        None => Bound::Unbounded,
    };
    if let Some(b) = before {
        high = match high {
            Bound::Included(h) if h < b => Bound::Included(h),
            _ => Bound::Excluded(b),
        };
    }
    (low, high)
}

/// The index a filter reads, if one serves it: its kind and value.
fn indexed(filter: &EventFilter) -> Option<(&'static str, &str)> {
    [
        ("message", &filter.message),
        ("request", &filter.request),
        ("device", &filter.device),
        ("db", &filter.db),
    ]
    .into_iter()
    .find_map(|(kind, v)| v.as_deref().map(|v| (kind, v)))
}

/// The event log in the cluster's store.
impl EventLogStore for estafeta_postgres::PgEvents {
    fn append(
        &self,
        records: &[EventRecord],
        retention: &Retention,
        now_nanos: u64,
    ) -> Result<(), EventStoreError> {
        let mut rows = Vec::with_capacity(records.len());
        for e in records {
            let Some(key) = parse_key(&e.id) else {
                continue;
            };
            let record = serde_json::to_vec(e).map_err(cluster_error)?;
            rows.push(estafeta_postgres::EventRow {
                key,
                names: [
                    e.db.clone(),
                    e.device.clone(),
                    e.process.clone(),
                    e.message.clone(),
                    e.request.clone(),
                ],
                record,
            });
        }
        let cutoff = now_nanos
            .saturating_sub(u64::try_from(retention.max_age.as_nanos()).unwrap_or(u64::MAX));
        estafeta_postgres::PgEvents::append(self, &rows, cutoff, retention.max_bytes, PRUNE_MOST)
            .map_err(cluster_error)
    }

    fn size(&self) -> Result<(u64, u64), EventStoreError> {
        estafeta_postgres::PgEvents::size(self).map_err(cluster_error)
    }

    fn query(
        &self,
        filter: &EventFilter,
        before: Option<EventKey>,
        limit: usize,
    ) -> Result<EventPage, EventStoreError> {
        /// Records read per round trip.
        const CHUNK: usize = 500;
        let (low, mut high) = key_range(filter, before);
        let index = indexed(filter);
        let mut page = EventPage::default();
        let mut looked = 0;
        loop {
            let rows = self.page(index, low, high, CHUNK).map_err(cluster_error)?;
            let full = rows.len() == CHUNK;
            for (key, json) in rows {
                looked += 1;
                if let Ok(e) = serde_json::from_slice::<EventRecord>(&json)
                    && filter.matches(&e)
                {
                    page.records.push(e);
                }
                if page.records.len() >= limit || looked >= SCAN_MOST {
                    page.next = Some(format!("{}-{}", key.0, key.1));
                    return Ok(page);
                }
                high = Bound::Excluded(key);
            }
            if !full {
                return Ok(page);
            }
        }
    }
}

pub(crate) fn cluster_error(e: impl std::fmt::Display) -> EventStoreError {
    EventStoreError {
        path: "the cluster store".to_owned(),
        message: e.to_string(),
    }
}

/// The event store failed.
#[derive(Debug, thiserror::Error)]
#[error("the event log {path}: {message}")]
pub struct EventStoreError {
    path: String,
    message: String,
}

impl EventStoreError {
    /// A file system error about the store at `path`.
    pub fn from_io(path: &Path, e: std::io::Error) -> Self {
        error(path, e)
    }
}

/// A record's key: its id, `<nanoseconds>-<sequence>`.
pub type EventKey = (u64, u64);

/// The key in a record's id; `None` if it is not one.
pub fn parse_key(id: &str) -> Option<EventKey> {
    let (n, s) = id.split_once('-')?;
    Some((n.parse().ok()?, s.parse().ok()?))
}

/// The index entries of a record.
fn index_keys(e: &EventRecord) -> Vec<String> {
    let mut keys = Vec::new();
    for (kind, value) in [
        ("db", &e.db),
        ("device", &e.device),
        ("process", &e.process),
        ("message", &e.message),
        ("request", &e.request),
    ] {
        if let Some(v) = value {
            keys.push(format!("{kind}:{v}"));
        }
    }
    keys
}

/// One page of the log: the records, newest first, and the id to pass as
/// `before` for the next (older) page, if there may be more.
#[derive(Debug, Default)]
pub struct EventPage {
    /// The records.
    pub records: Vec<EventRecord>,
    /// The id of the last record looked at, when the page is full or the
    /// scan stopped at [`SCAN_MOST`].
    pub next: Option<String>,
}

/// The event log's store. See the module documentation.
pub struct EventStore {
    path: PathBuf,
    db: Database,
    /// Held by each write and by a backup while it copies the file, so
    /// that the copy is of a committed state ([`EventStore::hold_writes`]).
    writing: Mutex<()>,
    /// The damaged file moved out of the way when this store was opened,
    /// until someone takes it to say so ([`EventStore::take_set_aside`]).
    set_aside: Mutex<Option<SetAside>>,
}

/// A damaged event log that [`EventStore::open`] moved out of the way, so
/// that the server starts without that history rather than not at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetAside {
    /// Where the damaged file is now.
    pub path: PathBuf,
    /// What redb found.
    pub damage: String,
}

/// Whether `e`, met opening an event log, says the file is damaged (rather
/// than out of reach: a full disk, a missing permission).
fn is_damage(e: &redb::Error) -> bool {
    match e {
        redb::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
        ),
        redb::Error::Corrupted(_)
        | redb::Error::UpgradeRequired(_)
        | redb::Error::RepairAborted
        | redb::Error::TableTypeMismatch { .. }
        | redb::Error::TableIsMultimap(_)
        | redb::Error::TableIsNotMultimap(_)
        | redb::Error::TypeDefinitionChanged { .. } => true,
        _ => false,
    }
}

/// Opens (or makes) the event log's file at `path`, with its tables.
fn open_db(path: &Path) -> Result<Database, redb::Error> {
    estafeta_durable::open_redb(path, |db| {
        let txn = db.begin_write()?;
        let (first, newest) = {
            let events = txn.open_table(EVENTS)?;
            let first = events.first()?.map(|(k, _)| k.value());
            let newest = events.last()?.map(|(k, _)| k.value());
            (first, newest)
        };
        let bytes = txn.open_table(META)?.get(BYTES)?.map_or(0, |v| v.value());
        let mut segments = txn.open_table(SEGMENTS)?;
        if segments.is_empty()? {
            let first_segment = segment_name(0);
            if txn
                .list_tables()?
                .any(|t| t.name() == UNSEGMENTED_INDEX.name())
            {
                txn.rename_table(UNSEGMENTED_INDEX, index_table(&first_segment))?;
            } else {
                txn.open_table(index_table(&first_segment))?;
            }
            let segment = Segment {
                first_nanos: first.map_or(0, |k| k.0),
                newest: newest.unwrap_or((0, 0)),
                bytes,
            };
            segments.insert(0, segment.value())?;
        }
        drop(segments);
        txn.commit()?;
        Ok(())
    })
}

/// Renames the damaged file at `path` to `<name>.damaged-<milliseconds
/// since the epoch>` beside it, durably.
fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".damaged-{millis}"));
    let aside = path.with_file_name(name);
    std::fs::rename(path, &aside)?;
    estafeta_durable::sync_parent(path)?;
    Ok(aside)
}

impl EventStore {
    /// The file at `path` opened (made if missing, with its tables). A file
    /// redb finds damaged is set aside and a new one made: the log is a
    /// record of what happened, not data the server promised to keep, and
    /// must never stop the server from starting
    /// ([`EventStore::take_set_aside`] says so). A file this process has
    /// open already is not opened again (redb says so): share that store.
    pub fn open(path: &Path) -> Result<Arc<EventStore>, EventStoreError> {
        let (db, aside) = match open_db(path) {
            Ok(db) => (db, None),
            Err(damage) if is_damage(&damage) => {
                let aside = SetAside {
                    path: set_aside(path).map_err(|e| error(path, e))?,
                    damage: damage.to_string(),
                };
                (open_db(path).map_err(|e| error(path, e))?, Some(aside))
            }
            Err(e) => return Err(error(path, e)),
        };
        Ok(Arc::new(EventStore {
            path: path.to_owned(),
            db,
            writing: Mutex::new(()),
            set_aside: Mutex::new(aside),
        }))
    }

    /// The file the store is kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The damaged file set aside when this store was opened, once (to the
    /// first caller).
    pub fn take_set_aside(&self) -> Option<SetAside> {
        self.set_aside
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Holds back writes until the guard is dropped (a write under way
    /// ends first): the file is then a committed state, whole to copy.
    pub fn hold_writes(&self) -> MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, e: impl std::fmt::Display) -> EventStoreError {
        error(&self.path, e)
    }

    /// Writes `records` in one transaction, then removes what the
    /// retention says must go, counting age from `now_nanos`.
    pub fn append(
        &self,
        records: &[EventRecord],
        retention: &Retention,
        now_nanos: u64,
    ) -> Result<(), EventStoreError> {
        let _writing = self.hold_writes();
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut events = txn.open_table(EVENTS).map_err(|e| self.err(e))?;
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            let mut segments = txn.open_table(SEGMENTS).map_err(|e| self.err(e))?;
            let mut bytes = meta
                .get(BYTES)
                .map_err(|e| self.err(e))?
                .map_or(0, |v| v.value());
            let (mut number, mut segment) = segments
                .last()
                .map_err(|e| self.err(e))?
                .map_or((0, Segment::EMPTY), |(n, s)| {
                    (n.value(), Segment::from_value(s.value()))
                });
            if let Some(first) = records.iter().find_map(|e| parse_key(&e.id)) {
                if segment.is_full(retention, first.0) {
                    number += 1;
                    segment = Segment::EMPTY;
                }
                if segment.bytes == 0 {
                    segment.first_nanos = first.0;
                }
            }
            {
                let mut index = txn
                    .open_table(index_table(&segment_name(number)))
                    .map_err(|e| self.err(e))?;
                for e in records {
                    let Some(key) = parse_key(&e.id) else {
                        continue;
                    };
                    let json = serde_json::to_vec(e).map_err(|e| self.err(e))?;
                    bytes += json.len() as u64;
                    segment.bytes += json.len() as u64;
                    segment.newest = segment.newest.max(key);
                    events
                        .insert(key, json.as_slice())
                        .map_err(|e| self.err(e))?;
                    for k in index_keys(e) {
                        index
                            .insert((k.as_str(), key.0, key.1), ())
                            .map_err(|e| self.err(e))?;
                    }
                }
            }
            segments
                .insert(number, segment.value())
                .map_err(|e| self.err(e))?;
            let cutoff = now_nanos
                .saturating_sub(u64::try_from(retention.max_age.as_nanos()).unwrap_or(u64::MAX));
            // The oldest records that go are read first, then removed in
            // one sweep of the table (a removal of each would descend the
            // tree and rewrite its leaf once per record).
            let mut last_gone = None;
            for entry in events.iter().map_err(|e| self.err(e))?.take(PRUNE_MOST) {
                let (key, json) = entry.map_err(|e| self.err(e))?;
                let key = key.value();
                if key.0 >= cutoff && bytes <= retention.max_bytes {
                    break;
                }
                bytes = bytes.saturating_sub(json.value().len() as u64);
                last_gone = Some(key);
            }
            if let Some(last) = last_gone {
                events
                    .retain_in(..=last, |_, _| false)
                    .map_err(|e| self.err(e))?;
            }
            meta.insert(BYTES, bytes).map_err(|e| self.err(e))?;
            // A segment none of whose records is kept goes whole: its
            // index entries are not removed one by one.
            let oldest = events
                .first()
                .map_err(|e| self.err(e))?
                .map(|(k, _)| k.value());
            let mut gone = Vec::new();
            for entry in segments.iter().map_err(|e| self.err(e))? {
                let (n, s) = entry.map_err(|e| self.err(e))?;
                let (n, s) = (n.value(), Segment::from_value(s.value()));
                if n != number && oldest.is_none_or(|oldest| s.newest < oldest) {
                    gone.push(n);
                }
            }
            for n in gone {
                segments.remove(n).map_err(|e| self.err(e))?;
                txn.delete_table(index_table(&segment_name(n)))
                    .map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))
    }

    /// How many records are kept, and their JSON's bytes.
    pub fn size(&self) -> Result<(u64, u64), EventStoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let events = txn.open_table(EVENTS).map_err(|e| self.err(e))?;
        let meta = txn.open_table(META).map_err(|e| self.err(e))?;
        let bytes = meta
            .get(BYTES)
            .map_err(|e| self.err(e))?
            .map_or(0, |v| v.value());
        Ok((events.len().map_err(|e| self.err(e))?, bytes))
    }

    /// Up to `limit` records passing `filter`, newest first, older than the
    /// record `before` (an id from the previous page) when given. A filter
    /// on a database, device, message or request id reads that id's index
    /// entries only; the time range bounds the keys read.
    pub fn query(
        &self,
        filter: &EventFilter,
        before: Option<EventKey>,
        limit: usize,
    ) -> Result<EventPage, EventStoreError> {
        let (low, high) = key_range(filter, before);
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let events = txn.open_table(EVENTS).map_err(|e| self.err(e))?;
        let mut page = EventPage::default();
        // Index entries older than the oldest record kept are of records
        // gone, in a segment not yet dropped: the range starts after them.
        let Some(oldest) = events
            .first()
            .map_err(|e| self.err(e))?
            .map(|(k, _)| k.value())
        else {
            return Ok(page);
        };
        let low = low.max(oldest);
        let empty = match high {
            Bound::Included(h) => h < low,
            Bound::Excluded(h) => h <= low,
            Bound::Unbounded => false,
        };
        if empty {
            return Ok(page);
        }
        let mut looked = 0;
        let mut take = |key: EventKey, page: &mut EventPage| -> Result<bool, EventStoreError> {
            looked += 1;
            if let Some(json) = events.get(key).map_err(|e| self.err(e))?
                && let Ok(e) = serde_json::from_slice::<EventRecord>(json.value())
                && filter.matches(&e)
            {
                page.records.push(e);
            }
            let last = format!("{}-{}", key.0, key.1);
            if page.records.len() >= limit || looked >= SCAN_MOST {
                page.next = Some(last);
                return Ok(false);
            }
            Ok(true)
        };
        match indexed(filter).map(|(kind, v)| format!("{kind}:{v}")) {
            Some(k) => {
                let segments = txn.open_table(SEGMENTS).map_err(|e| self.err(e))?;
                let mut tables = Vec::new();
                for entry in segments.iter().map_err(|e| self.err(e))? {
                    let (n, _) = entry.map_err(|e| self.err(e))?;
                    tables.push(
                        txn.open_table(index_table(&segment_name(n.value())))
                            .map_err(|e| self.err(e))?,
                    );
                }
                let from = (k.as_str(), low.0, low.1);
                let to = match high {
                    Bound::Included(h) => Bound::Included((k.as_str(), h.0, h.1)),
                    Bound::Excluded(h) => Bound::Excluded((k.as_str(), h.0, h.1)),
                    Bound::Unbounded => Bound::Included((k.as_str(), u64::MAX, u64::MAX)),
                };
                let mut ranges = Vec::with_capacity(tables.len());
                for table in &tables {
                    let range = table
                        .range::<(&str, u64, u64)>((Bound::Included(from), to))
                        .map_err(|e| self.err(e))?;
                    ranges.push(
                        range
                            .rev()
                            .map(|entry| {
                                entry.map(|(key, _)| {
                                    let (_, n, s) = key.value();
                                    (n, s)
                                })
                            })
                            .peekable(),
                    );
                }
                for key in newest_first(ranges) {
                    if !take(key.map_err(|e| self.err(e))?, &mut page)? {
                        break;
                    }
                }
            }
            None => {
                let range = events
                    .range::<EventKey>((Bound::Included(low), high))
                    .map_err(|e| self.err(e))?;
                for entry in range.rev() {
                    let (key, _) = entry.map_err(|e| self.err(e))?;
                    if !take(key.value(), &mut page)? {
                        break;
                    }
                }
            }
        }
        Ok(page)
    }
}

fn error(path: &Path, e: impl std::fmt::Display) -> EventStoreError {
    EventStoreError {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// The keys of ranges each read newest first, in one newest-first order
/// (the segments' ranges are in turn unless the clock stepped back; a
/// read error is passed on where it is met).
fn newest_first<I>(
    mut ranges: Vec<std::iter::Peekable<I>>,
) -> impl Iterator<Item = Result<EventKey, redb::StorageError>>
where
    I: Iterator<Item = Result<EventKey, redb::StorageError>>,
{
    std::iter::from_fn(move || {
        let mut newest: Option<(usize, EventKey)> = None;
        for (i, range) in ranges.iter_mut().enumerate() {
            match range.peek() {
                Some(Err(_)) => return range.next(),
                Some(Ok(key)) if newest.is_none_or(|(_, n)| *key > n) => {
                    newest = Some((i, *key));
                }
                Some(Ok(_)) | None => {}
            }
        }
        newest.and_then(|(i, _)| ranges[i].next())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tracing::Level;

    const SECOND: u64 = 1_000_000_000;
    /// 2026-11-25T10:00:00Z in nanoseconds.
    const T0: u64 = 1_795_600_800 * SECOND;

    /// Record `i`, `i` seconds after `T0`: about `db`, from device
    /// `phone-{i % 3}`, WARN every third.
    fn record(i: u64, db: &str) -> EventRecord {
        let ts = chrono::DateTime::from_timestamp_nanos((T0 + i * SECOND) as i64);
        EventRecord {
            id: format!("{}-{i}", T0 + i * SECOND),
            ts: ts.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            level: if i.is_multiple_of(3) { "WARN" } else { "INFO" }.to_owned(),
            target: "estafeta::event".to_owned(),
            text: format!("step {i}"),
            db: Some(db.to_owned()),
            device: Some(format!("phone-{}", i % 3)),
            process: None,
            message: Some(format!("m{i}")),
            request: Some(format!("req-{}", i / 10)),
            fields: Default::default(),
        }
    }

    fn ids(page: &EventPage) -> Vec<String> {
        page.records.iter().map(|e| e.text.clone()).collect()
    }

    fn keep_all() -> Retention {
        Retention {
            max_age: Duration::from_secs(1 << 40),
            max_bytes: u64::MAX,
        }
    }

    /// Every event log store: filters and pages newest first.
    fn filters_and_pages_newest_first(store: &dyn EventLogStore) {
        let records: Vec<_> = (0..60)
            .map(|i| record(i, if i.is_multiple_of(2) { "db-a" } else { "db-b" }))
            .collect();
        store.append(&records, &keep_all(), T0).unwrap();

        // Every record, two pages of 25 and the rest.
        let all = EventFilter::default();
        let first = store.query(&all, None, 25).unwrap();
        assert_eq!(first.records.len(), 25);
        assert_eq!(first.records[0].text, "step 59");
        let before = first.next.as_deref().and_then(parse_key);
        let second = store.query(&all, before, 25).unwrap();
        assert_eq!(second.records[0].text, "step 34");
        let before = second.next.as_deref().and_then(parse_key);
        let third = store.query(&all, before, 25).unwrap();
        assert_eq!(third.records.len(), 10);
        assert_eq!(third.records.last().unwrap().text, "step 0");
        assert_eq!(third.next, None);

        // By database, device, message, request; with the level and a time range.
        let db_a = EventFilter {
            db: Some("db-a".into()),
            ..Default::default()
        };
        let page = store.query(&db_a, None, 100).unwrap();
        assert_eq!(page.records.len(), 30);
        assert!(page.records.iter().all(|e| e.db.as_deref() == Some("db-a")));
        let device = EventFilter {
            device: Some("phone-1".into()),
            db: Some("db-b".into()),
            ..Default::default()
        };
        let page = store.query(&device, None, 3).unwrap();
        assert_eq!(ids(&page), ["step 55", "step 49", "step 43"]);
        let paged = store
            .query(&device, page.next.as_deref().and_then(parse_key), 3)
            .unwrap();
        assert_eq!(ids(&paged), ["step 37", "step 31", "step 25"]);
        let message = EventFilter {
            message: Some("m17".into()),
            ..Default::default()
        };
        assert_eq!(ids(&store.query(&message, None, 10).unwrap()), ["step 17"]);
        let request = EventFilter {
            request: Some("req-2".into()),
            level: Some(Level::WARN),
            ..Default::default()
        };
        assert_eq!(
            ids(&store.query(&request, None, 10).unwrap()),
            ["step 27", "step 24", "step 21"]
        );
        let window = EventFilter {
            since: Some(chrono::DateTime::from_timestamp_nanos(
                (T0 + 10 * SECOND) as i64,
            )),
            until: Some(chrono::DateTime::from_timestamp_nanos(
                (T0 + 12 * SECOND) as i64,
            )),
            ..Default::default()
        };
        assert_eq!(
            ids(&store.query(&window, None, 10).unwrap()),
            ["step 12", "step 11", "step 10"]
        );
        let window_db = EventFilter {
            db: Some("db-a".into()),
            ..window
        };
        assert_eq!(
            ids(&store.query(&window_db, None, 10).unwrap()),
            ["step 12", "step 10"]
        );
    }

    /// Every event log store: the retention removes the oldest records by
    /// age and by size, and they are gone from the indexes too.
    fn retention_removes_the_oldest_by_age_and_by_size(store: &dyn EventLogStore) {
        let records: Vec<_> = (0..20).map(|i| record(i, "db-a")).collect();
        store.append(&records, &keep_all(), T0).unwrap();
        let (n, bytes) = store.size().unwrap();
        assert_eq!(n, 20);

        // By age: at T0 + 30 s with 20 s kept, records 0..10 (older than
        // T0 + 10 s) go.
        let by_age = Retention {
            max_age: Duration::from_secs(20),
            max_bytes: u64::MAX,
        };
        store.append(&[], &by_age, T0 + 30 * SECOND).unwrap();
        let left = store.query(&EventFilter::default(), None, 100).unwrap();
        assert_eq!(left.records.len(), 10);
        assert_eq!(left.records.last().unwrap().text, "step 10");
        let gone = EventFilter {
            message: Some("m3".into()),
            ..Default::default()
        };
        assert!(store.query(&gone, None, 10).unwrap().records.is_empty());

        // By size: a budget of about five records keeps the newest five.
        let (_, left_bytes) = store.size().unwrap();
        assert!(left_bytes < bytes);
        let one = left_bytes / 10;
        let by_size = Retention {
            max_age: Duration::from_secs(1 << 40),
            max_bytes: one * 5 + one / 2,
        };
        store.append(&[record(20, "db-a")], &by_size, T0).unwrap();
        let left = store.query(&EventFilter::default(), None, 100).unwrap();
        assert_eq!(
            ids(&left),
            ["step 20", "step 19", "step 18", "step 17", "step 16"]
        );
        let db_a = EventFilter {
            db: Some("db-a".into()),
            ..Default::default()
        };
        assert_eq!(store.query(&db_a, None, 100).unwrap().records.len(), 5);
        assert!(store.size().unwrap().1 <= by_size.max_bytes);
    }

    /// The index tables in the file.
    fn index_tables(store: &EventStore) -> Vec<String> {
        let txn = store.db.begin_read().unwrap();
        txn.list_tables()
            .unwrap()
            .map(|t| t.name().to_owned())
            .filter(|name| name.starts_with("events.index"))
            .collect()
    }

    /// As a log turns over many times, whole segments of its index go,
    /// and every record kept is still found by each index.
    #[test]
    fn the_index_is_dropped_a_segment_at_a_time_as_the_log_turns_over() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventStore::open(&dir.path().join("events.redb")).unwrap();
        let one = serde_json::to_vec(&record(1000, "db-a")).unwrap().len() as u64;
        let retention = Retention {
            max_age: Duration::from_secs(1 << 40),
            max_bytes: one * 100,
        };
        let mut most = 0;
        for batch in 0..100 {
            let records: Vec<_> = (batch * 30..batch * 30 + 30)
                .map(|i| record(1000 + i, if i % 2 == 0 { "db-a" } else { "db-b" }))
                .collect();
            store.append(&records, &retention, T0).unwrap();
            most = most.max(index_tables(&store).len());
        }
        // 16 segments of about 6 records, and the newest beyond the limit;
        // 100 batches of 30 made 100 segments, all but these dropped.
        assert!(most <= SEGMENTS_KEPT as usize + 2, "{most} index tables");
        assert!(!index_tables(&store).contains(&segment_name(0)));
        let kept = store.query(&EventFilter::default(), None, 1000).unwrap();
        assert!(
            (90..=100).contains(&kept.records.len()),
            "{}",
            kept.records.len()
        );
        for db in ["db-a", "db-b"] {
            let filter = EventFilter {
                db: Some(db.into()),
                ..Default::default()
            };
            let by_index = store.query(&filter, None, 1000).unwrap();
            let expected: Vec<_> = kept
                .records
                .iter()
                .filter(|e| e.db.as_deref() == Some(db))
                .map(|e| e.id.clone())
                .collect();
            let found: Vec<_> = by_index.records.iter().map(|e| e.id.clone()).collect();
            assert_eq!(found, expected);
        }
        let gone = EventFilter {
            message: Some("m1000".into()),
            ..Default::default()
        };
        assert!(store.query(&gone, None, 10).unwrap().records.is_empty());
    }

    /// Records written after the clock stepped back, in a later segment
    /// than newer ones, still come newest first through an index.
    #[test]
    fn an_index_read_across_segments_is_newest_first_whatever_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventStore::open(&dir.path().join("events.redb")).unwrap();
        let retention = Retention {
            max_age: Duration::from_secs(1 << 40),
            max_bytes: u64::MAX,
        };
        let a_segment_a_batch = Retention {
            max_age: Duration::from_secs(SEGMENTS_KEPT),
            ..retention
        };
        store
            .append(&[record(10, "db-a"), record(30, "db-a")], &retention, T0)
            .unwrap();
        store
            .append(
                &[record(20, "db-a"), record(40, "db-a")],
                &a_segment_a_batch,
                T0,
            )
            .unwrap();
        assert_eq!(index_tables(&store).len(), 2);
        let db_a = EventFilter {
            db: Some("db-a".into()),
            ..Default::default()
        };
        let page = store.query(&db_a, None, 3).unwrap();
        assert_eq!(ids(&page), ["step 40", "step 30", "step 20"]);
        let rest = store
            .query(&db_a, page.next.as_deref().and_then(parse_key), 3)
            .unwrap();
        assert_eq!(ids(&rest), ["step 10"]);
    }

    /// A log written before the index had segments keeps its index: that
    /// table becomes segment 0, dropped once its records are gone.
    #[test]
    fn a_log_from_before_index_segments_keeps_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.redb");
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut events = txn.open_table(EVENTS).unwrap();
                let mut index = txn.open_table(UNSEGMENTED_INDEX).unwrap();
                let mut bytes = 0;
                for i in 0..10 {
                    let e = record(i, "db-a");
                    let key = parse_key(&e.id).unwrap();
                    let json = serde_json::to_vec(&e).unwrap();
                    bytes += json.len() as u64;
                    events.insert(key, json.as_slice()).unwrap();
                    for k in index_keys(&e) {
                        index.insert((k.as_str(), key.0, key.1), ()).unwrap();
                    }
                }
                txn.open_table(META).unwrap().insert(BYTES, bytes).unwrap();
            }
            txn.commit().unwrap();
        }
        let store = EventStore::open(&path).unwrap();
        assert_eq!(store.take_set_aside(), None);
        assert_eq!(index_tables(&store), [segment_name(0)]);
        let device = EventFilter {
            device: Some("phone-1".into()),
            ..Default::default()
        };
        assert_eq!(
            ids(&store.query(&device, None, 10).unwrap()),
            ["step 7", "step 4", "step 1"]
        );
        // Ten newer records with room for them only: the old ones and
        // their segment go.
        let newer: Vec<_> = (10..20).map(|i| record(i, "db-a")).collect();
        let retention = Retention {
            max_age: Duration::from_secs(1 << 40),
            max_bytes: newer
                .iter()
                .map(|e| serde_json::to_vec(e).unwrap().len() as u64)
                .sum(),
        };
        store.append(&newer, &retention, T0).unwrap();
        assert_eq!(index_tables(&store), [segment_name(1)]);
        assert_eq!(
            ids(&store.query(&device, None, 10).unwrap()),
            ["step 19", "step 16", "step 13", "step 10"]
        );
    }

    #[test]
    fn the_file_filters_and_pages_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventStore::open(&dir.path().join("events.redb")).unwrap();
        filters_and_pages_newest_first(&*store);
    }

    #[test]
    fn the_file_retention_removes_the_oldest_by_age_and_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventStore::open(&dir.path().join("events.redb")).unwrap();
        retention_removes_the_oldest_by_age_and_by_size(&*store);
    }

    /// The cluster's `events` table (its methods block: run off the
    /// runtime's threads).
    async fn on_postgres(check: fn(&dyn EventLogStore)) {
        let pg = estafeta_postgres::testing::Postgres::start().unwrap();
        let db = estafeta_postgres::Store::connect(&pg.url()).unwrap();
        db.migrate().await.unwrap();
        let store = estafeta_postgres::PgEvents::new(db);
        tokio::task::spawn_blocking(move || check(&store))
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_cluster_table_filters_and_pages_newest_first() {
        on_postgres(filters_and_pages_newest_first).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_cluster_table_retention_removes_the_oldest_by_age_and_by_size() {
        on_postgres(retention_removes_the_oldest_by_age_and_by_size).await;
    }

    /// A second open of a file this process holds is refused, and the
    /// open file is neither set aside nor touched; closed, it opens again.
    #[test]
    fn a_file_open_in_this_process_is_not_opened_twice() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.redb");
        let open = EventStore::open(&path).unwrap();
        open.append(&[record(1, "db-a")], &keep_all(), T0).unwrap();
        let again = EventStore::open(&path).err().expect("a second open");
        assert!(again.to_string().contains("events.redb"), "{again}");
        assert_eq!(open.take_set_aside(), None);
        assert_eq!(open.size().unwrap().0, 1);
        drop(open);
        let reopened = EventStore::open(&path).unwrap();
        assert_eq!(reopened.take_set_aside(), None);
        assert_eq!(reopened.size().unwrap().0, 1);
    }

    #[test]
    fn a_write_waits_while_writes_are_held_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventStore::open(&dir.path().join("events.redb")).unwrap();
        let held = store.hold_writes();
        let (done, written) = std::sync::mpsc::channel();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                store.append(&[record(1, "db-a")], &keep_all(), T0).unwrap();
                done.send(()).unwrap();
            })
        };
        // Nothing can end the wait but the guard's drop; the bound only
        // keeps the test short.
        assert_eq!(
            written.recv_timeout(Duration::from_millis(300)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout),
            "a write went through while writes were held back"
        );
        assert_eq!(store.size().unwrap().0, 0);
        drop(held);
        writer.join().unwrap();
        assert_eq!(store.size().unwrap().0, 1);
    }
}
