//! [`EventLog`]: a `tracing` layer that keeps the events worth keeping in
//! the [`EventStore`]. The layer only builds the record and hands it to a
//! bounded queue; a writer thread of its own writes what has queued up in
//! one transaction, so a protocol call never waits for the log's disk.
//! Records arriving one by one are let gather for [`GATHER`] after the
//! first, so that a steady trickle (an upload's event each) costs one
//! transaction and one fsync per [`GATHER`], not one per record. A
//! transaction rewrites the pages its records land on (the ends of the
//! log and of each index it adds to, the pages retention empties) however
//! few records it holds, so the more a batch holds, the less each record
//! costs.
//!
//! The secrets of URLs (`scheme://user:password@host`, a webhook's path
//! and query) are masked in every value before it is written
//! ([`redact_urls`]).
//!
//! Every record is size-capped (values cut at [`MAX_VALUE_BYTES`], at most
//! [`MAX_FIELDS`] other fields, a record at most [`MAX_RECORD_BYTES`] of
//! JSON): what a request carries into an event cannot grow the log without
//! bound.
//!
//! What may be lost: the log is a record of what happened, not data the
//! server promised to keep. A clean stop writes everything queued
//! ([`EventLogHandle::flush`]); the records still queued when the process crashes or
//! is killed (at most a [`GATHER`]'s worth, unless the writer is behind)
//! are lost. A batch whose write fails is kept and tried again
//! with the next; when more than [`QUEUE`] records wait (in the queue, or
//! kept after failed writes), the newest are dropped and counted, and the
//! next batch carries a warning saying how many.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use super::store::{EventLogStore, EventStore, EventStoreError, Retention};
use super::{ALERT_TARGET, EVENT_TARGET, EventRecord};

/// The longest value (the text or a field) a record keeps, in bytes; a
/// longer one is cut and ends in `…`.
pub const MAX_VALUE_BYTES: usize = 1024;
/// The most fields besides the text, database, device, process and message
/// a record keeps; later ones are dropped.
pub const MAX_FIELDS: usize = 32;
/// The longest record's JSON, in bytes. A record that would be longer
/// keeps its text (cut short) and names, and loses its other fields.
pub const MAX_RECORD_BYTES: usize = 16 * 1024;
/// The most records waiting for the writer thread.
pub const QUEUE: usize = 16 * 1024;
/// The most records the writer puts in one transaction.
pub const BATCH: usize = 4096;

/// How long records that arrive one by one gather before the writer
/// writes them together: what the dashboard's event page may lag behind,
/// and about what a crash may lose.
pub const GATHER: Duration = Duration::from_secs(1);

/// Waits for [`GATHER`], or less if a flush is asked for meanwhile.
fn gather_time(bell: &FlushBell) {
    bell.wait(GATHER);
}

/// Ends the writer's gathering early when a flush is asked for: a stop
/// waits for what is queued, not for the gathering to run out. Records
/// queued do not ring it, so a steady trickle wakes the writer once a
/// [`GATHER`], not once a record.
#[derive(Default)]
struct FlushBell {
    rung: Mutex<bool>,
    bell: Condvar,
}

impl FlushBell {
    /// Ends the gathering under way, or the next one.
    fn ring(&self) {
        *self.rung() = true;
        self.bell.notify_all();
    }

    /// Waits until rung or `most` has passed; whether it was rung.
    fn wait(&self, most: Duration) -> bool {
        let (mut rung, _) = self
            .bell
            .wait_timeout_while(self.rung(), most, |rung| !*rung)
            .unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *rung)
    }

    fn rung(&self) -> MutexGuard<'_, bool> {
        // A bool: nothing half done if a holder panicked.
        self.rung.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the layer hands the writer thread.
enum Job {
    /// A record to keep.
    Record(Box<EventRecord>),
    /// Answer once everything queued before is written.
    Flush(SyncSender<()>),
}

/// What the process keeps of the event log its subscriber writes: a way to
/// wait for what is queued, and the file the log is kept in (embedded
/// mode), which the server reads rather than opening it a second time.
#[derive(Clone)]
pub struct EventLogHandle {
    queue: SyncSender<Job>,
    bell: Arc<FlushBell>,
    file: Option<Arc<EventStore>>,
}

impl EventLogHandle {
    /// Waits until every record queued before this call is written: the
    /// server calls it as it stops, so that a clean stop loses nothing.
    pub fn flush(&self) {
        flush_queue(&self.queue, &self.bell);
    }

    /// The file the log is kept in; `None` in cluster mode (the log is the
    /// cluster's `events` table).
    pub fn file(&self) -> Option<&Arc<EventStore>> {
        self.file.as_ref()
    }
}

/// Waits until the writer of `queue` has written what was queued before,
/// ringing `bell` to end its gathering.
fn flush_queue(queue: &SyncSender<Job>, bell: &FlushBell) {
    let (done, wait) = sync_channel(1);
    if queue.send(Job::Flush(done)).is_ok() {
        bell.ring();
        let _ = wait.recv();
    }
}

/// The event-log layer; see the module documentation.
pub struct EventLog {
    queue: SyncSender<Job>,
    /// Rung by a flush, to end the writer's gathering.
    bell: Arc<FlushBell>,
    /// The file the writer writes, when the log is one (for the handle).
    file: Option<Arc<EventStore>>,
    dropped: Arc<AtomicU64>,
    seq: AtomicU64,
}

impl EventLog {
    /// A layer keeping its records in the store at `path` (its folder
    /// created if missing, with every missing parent, readable by the
    /// server's user only and durable in their parents: the log is the
    /// first thing `estafeta serve` creates in a new data folder, so later
    /// opens find these folders present), and its writer thread.
    pub fn open(path: &Path, retention: Retention) -> Result<EventLog, EventStoreError> {
        if let Some(dir) = path.parent() {
            estafeta_durable::create_dir_all(dir, 0o700)
                .map_err(|e| EventStoreError::from_io(path, e))?;
        }
        let store = EventStore::open(path)?;
        EventLog::spawn(
            store.clone(),
            Some(store),
            None,
            retention,
            Box::new(gather_time),
        )
        .map_err(|e| EventStoreError::from_io(path, e))
    }

    /// A layer keeping its records in the `events` table of the cluster
    /// store at `url` (cluster mode: every node's records in one log), and
    /// its writer thread. The writer has a pool and a runtime of its own:
    /// the log exists before the server's store is opened, and a burst of
    /// records never takes a connection from the protocol. No connection
    /// is made here; records that cannot be written yet (the schema not
    /// made, the database away) wait in the queue and are tried again.
    pub fn cluster(url: &str, retention: Retention) -> Result<EventLog, EventStoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("estafeta-events-io")
            .enable_all()
            .build()
            .map_err(super::store::cluster_error)?;
        let options = estafeta_postgres::Options {
            pool_size: 1,
            application_name: Some("estafeta events".to_owned()),
            ..estafeta_postgres::Options::default()
        };
        let store = estafeta_postgres::Store::connect_with(url, &options)
            .map_err(super::store::cluster_error)?;
        let events = {
            let _inside = runtime.enter();
            Arc::new(estafeta_postgres::PgEvents::new(store))
        };
        EventLog::spawn(
            events,
            None,
            Some(runtime),
            retention,
            Box::new(gather_time),
        )
        .map_err(super::store::cluster_error)
    }

    /// The layer over `store` (the file `file`, if it is one), its writer
    /// thread started; `runtime` (the one `store` runs on, if any) lives as
    /// long as the thread; `gather` waits while records gather
    /// ([`GATHER`]), or until the bell it is given rings.
    fn spawn(
        store: Arc<dyn EventLogStore>,
        file: Option<Arc<EventStore>>,
        runtime: Option<tokio::runtime::Runtime>,
        retention: Retention,
        gather: Box<dyn Fn(&FlushBell) + Send>,
    ) -> std::io::Result<EventLog> {
        let (queue, jobs) = sync_channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let lost = Arc::clone(&dropped);
        let bell = Arc::new(FlushBell::default());
        let rung = Arc::clone(&bell);
        std::thread::Builder::new()
            .name("estafeta-events".to_owned())
            .spawn(move || {
                let gather = || gather(&rung);
                write_batches(store.as_ref(), &jobs, &lost, &retention, &gather);
                drop(runtime);
            })?;
        Ok(EventLog {
            queue,
            bell,
            file,
            dropped,
            seq: AtomicU64::new(0),
        })
    }

    /// Whether an event is kept: protocol steps, alerts, warnings, errors.
    pub fn wants(target: &str, level: &Level) -> bool {
        target == EVENT_TARGET || target == ALERT_TARGET || *level <= Level::WARN
    }

    /// Queues one record, cut down to [`MAX_RECORD_BYTES`] if it is longer;
    /// dropped (and counted) when the queue is full.
    pub fn write(&self, record: EventRecord) {
        let record = match serde_json::to_vec(&record) {
            Ok(json) if json.len() <= MAX_RECORD_BYTES => record,
            _ => shrunk(&record),
        };
        match self.queue.try_send(Job::Record(Box::new(record))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            // The writer is gone (its store failed to open a table); the
            // failure was reported on stderr.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Waits until every record queued before this call is written.
    pub fn flush(&self) {
        flush_queue(&self.queue, &self.bell);
    }

    /// The handle the process keeps once the layer is installed.
    pub fn handle(&self) -> EventLogHandle {
        EventLogHandle {
            queue: self.queue.clone(),
            bell: Arc::clone(&self.bell),
            file: self.file.clone(),
        }
    }

    fn next_id(&self, nanos: i64) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{nanos}-{seq}")
    }
}

/// How long the writer waits before trying again a batch it could not
/// write.
const RETRY: Duration = Duration::from_secs(1);

/// The writer thread: waits for a record, takes what else has queued up
/// (up to [`BATCH`]; if that is less, and no flush waits, also what comes
/// while `gather` waits), writes it in one transaction; until the layer is
/// gone. A batch that fails is kept and tried again with the next one (at
/// the latest after [`RETRY`]), up to [`QUEUE`] records; past that the
/// oldest are dropped and counted.
fn write_batches(
    store: &dyn EventLogStore,
    jobs: &Receiver<Job>,
    dropped: &AtomicU64,
    retention: &Retention,
    gather: &dyn Fn(),
) {
    let mut records: Vec<EventRecord> = Vec::new();
    loop {
        let first = if records.is_empty() {
            match jobs.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            }
        } else {
            match jobs.recv_timeout(RETRY) {
                Ok(job) => Some(job),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        let mut flushes = Vec::new();
        let taken = take(first, jobs, &mut records, &mut flushes, 0);
        if taken > 0 && taken < BATCH && flushes.is_empty() {
            gather();
            let next = jobs.try_recv().ok();
            take(next, jobs, &mut records, &mut flushes, taken);
        }
        if records.len() > QUEUE {
            let over = records.len() - QUEUE;
            records.drain(..over);
            dropped.fetch_add(over as u64, Ordering::Relaxed);
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        let now = chrono::Utc::now();
        let nanos = now.timestamp_nanos_opt().unwrap_or_default();
        if lost > 0 {
            records.push(EventRecord {
                id: format!("{nanos}-{}", u64::MAX),
                ts: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                level: Level::WARN.to_string(),
                target: EVENT_TARGET.to_owned(),
                text: format!("{lost} events were dropped: the event log could not keep up"),
                db: None,
                device: None,
                process: None,
                message: None,
                request: None,
                fields: serde_json::Map::new(),
            });
        }
        if !records.is_empty() {
            match store.append(&records, retention, u64::try_from(nanos).unwrap_or(0)) {
                Ok(()) => records.clear(),
                // Not through tracing: that would come back here.
                Err(e) => eprintln!("estafeta: writing the event log failed (tried again): {e}"),
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

/// Takes `first` and what else is queued, up to [`BATCH`] records in all
/// with the `taken` so far: records into `records`, flush requests into
/// `flushes`; how many records were taken in all.
fn take(
    first: Option<Job>,
    jobs: &Receiver<Job>,
    records: &mut Vec<EventRecord>,
    flushes: &mut Vec<SyncSender<()>>,
    mut taken: usize,
) -> usize {
    let mut next = first;
    while let Some(job) = next {
        match job {
            Job::Record(r) => {
                records.push(*r);
                taken += 1;
            }
            Job::Flush(done) => flushes.push(done),
        }
        next = if taken < BATCH {
            jobs.try_recv().ok()
        } else {
            None
        };
    }
    taken
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
        request: name(&record.request),
        fields,
    }
}

/// `text` with the secrets a URL in it may carry masked: the user
/// information (what comes between `scheme://` and `@host`, such as
/// `user:password`) replaced by `***`, and the path and query (where a
/// webhook's key often is: `/services/T0/B0/XXXX`, `?token=…`) by `/***`;
/// the scheme, host and port stay, to say where it went.
pub fn redact_urls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("://") {
        return std::borrow::Cow::Borrowed(text);
    }
    let ends_url = |c: char| "\"'<>()".contains(c) || c.is_whitespace() || c.is_control();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (before, after) = rest.split_at(i + 3);
        out.push_str(before);
        let end = after.find(ends_url).unwrap_or(after.len());
        let url = &after[..end];
        let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
        let authority = &url[..authority_end];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        let tail = &url[authority_end..];
        if !tail.is_empty() && tail != "/" {
            out.push_str("/***");
        } else {
            out.push_str(tail);
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

/// The request id of a span that has one, kept in the span's extensions.
struct RequestId(String);

/// Finds the `request_id` field of a span.
struct FindRequestId(Option<String>);

impl Visit for FindRequestId {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "request_id" {
            self.0 = Some(format!("{value:?}"));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "request_id" {
            self.0 = Some(value.to_owned());
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for EventLog {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut find = FindRequestId(None);
        attrs.record(&mut find);
        if let (Some(request), Some(span)) = (find.0, ctx.span(id)) {
            let mut request = request;
            cut(&mut request, 128);
            span.extensions_mut().insert(RequestId(request));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let meta = event.metadata();
        if !Self::wants(meta.target(), meta.level()) {
            return;
        }
        let now = chrono::Utc::now();
        let request = ctx.event_scope(event).and_then(|scope| {
            scope
                .into_iter()
                .find_map(|span| span.extensions().get::<RequestId>().map(|r| r.0.clone()))
        });
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
            request,
            fields: serde_json::Map::new(),
        };
        event.record(&mut Fields {
            record: &mut record,
            text_seen: false,
        });
        self.write(record);
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
            if let std::borrow::Cow::Owned(redacted) = redact_urls(s) {
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
    use crate::events::EventFilter;
    use std::sync::Mutex;
    use tracing_subscriber::layer::SubscriberExt;

    /// Every record of the file `log` keeps, oldest first.
    fn records(log: &EventLog) -> Vec<EventRecord> {
        let handle = log.handle();
        let store = handle.file().expect("a log kept in a file");
        let mut all = store
            .query(&EventFilter::default(), None, 10_000)
            .unwrap()
            .records;
        all.reverse();
        all
    }

    /// A layer on a new store in `dir`.
    fn log_in(dir: &Path) -> Arc<EventLog> {
        let path = dir.join("state").join("events.redb");
        Arc::new(EventLog::open(&path, Retention::default()).unwrap())
    }

    /// A store whose first `failures` appends fail.
    struct Flaky {
        failures: AtomicU64,
        written: Mutex<Vec<EventRecord>>,
        /// How many records each successful append wrote.
        appends: Mutex<Vec<usize>>,
    }

    impl Flaky {
        fn failing(failures: u64) -> Arc<Flaky> {
            Arc::new(Flaky {
                failures: AtomicU64::new(failures),
                written: Mutex::new(Vec::new()),
                appends: Mutex::new(Vec::new()),
            })
        }
    }

    impl EventLogStore for Flaky {
        fn append(
            &self,
            records: &[EventRecord],
            _: &Retention,
            _: u64,
        ) -> Result<(), EventStoreError> {
            if self.failures.load(Ordering::SeqCst) > 0 {
                self.failures.fetch_sub(1, Ordering::SeqCst);
                return Err(crate::events::store::cluster_error("the database is away"));
            }
            self.written.lock().unwrap().extend_from_slice(records);
            self.appends.lock().unwrap().push(records.len());
            Ok(())
        }

        fn size(&self) -> Result<(u64, u64), EventStoreError> {
            Ok((0, 0))
        }

        fn query(
            &self,
            _: &EventFilter,
            _: Option<crate::events::store::EventKey>,
            _: usize,
        ) -> Result<crate::events::EventPage, EventStoreError> {
            Ok(Default::default())
        }
    }

    #[test]
    fn records_of_a_failed_write_are_written_with_the_next_batch() {
        let flaky = Flaky::failing(1);
        let log = EventLog::spawn(
            flaky.clone(),
            None,
            None,
            Retention::default(),
            Box::new(|_: &FlushBell| ()),
        );
        let log = Arc::new(log.unwrap());
        with_log(&log, || tracing::warn!("while the database is away"));
        with_log(&log, || tracing::warn!("once it is back"));
        let texts: Vec<String> = flaky
            .written
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.text.clone())
            .collect();
        assert_eq!(texts, ["while the database is away", "once it is back"]);
    }

    /// Records that come while the writer gathers after a first one go
    /// into the first one's transaction.
    #[test]
    fn records_that_come_while_the_writer_gathers_share_its_transaction() {
        let store = Flaky::failing(0);
        let (gathering, gathers) = std::sync::mpsc::channel();
        let (go_on, waits) = std::sync::mpsc::channel::<()>();
        let waits = Mutex::new(waits);
        let gather = Box::new(move |_: &FlushBell| {
            gathering.send(()).unwrap();
            let bound = std::time::Duration::from_secs(30);
            waits.lock().unwrap().recv_timeout(bound).unwrap();
        });
        let log = EventLog::spawn(store.clone(), None, None, Retention::default(), gather);
        let log = Arc::new(log.unwrap());
        let subscriber = tracing_subscriber::registry().with(ArcLayer(Arc::clone(&log)));
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!("first");
            gathers
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("the writer gathers after the first record");
            tracing::warn!("second");
            tracing::warn!("third");
        });
        go_on.send(()).unwrap();
        log.flush();
        assert_eq!(*store.appends.lock().unwrap(), [3]);
        let texts: Vec<String> = store
            .written
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.text.clone())
            .collect();
        assert_eq!(texts, ["first", "second", "third"]);
    }

    /// A flush asked for while the writer gathers ends the gathering: it
    /// waits for what is queued, not for the gathering to run out.
    #[test]
    fn a_flush_ends_the_gathering_under_way() {
        let store = Flaky::failing(0);
        let (gathering, gathers) = std::sync::mpsc::channel();
        let (ended, ends) = std::sync::mpsc::channel();
        let gather = Box::new(move |bell: &FlushBell| {
            gathering.send(()).unwrap();
            ended.send(bell.wait(Duration::from_secs(30))).unwrap();
        });
        let log = EventLog::spawn(store.clone(), None, None, Retention::default(), gather);
        let log = Arc::new(log.unwrap());
        let subscriber = tracing_subscriber::registry().with(ArcLayer(Arc::clone(&log)));
        tracing::subscriber::with_default(subscriber, || tracing::warn!("first"));
        gathers
            .recv_timeout(Duration::from_secs(30))
            .expect("the writer gathers after the first record");
        log.handle().flush();
        assert!(ends.recv().unwrap(), "the flush rang the bell");
        assert_eq!(*store.appends.lock().unwrap(), [1]);
    }

    /// Runs `f` with `log` as the only layer, then waits for the writes.
    fn with_log(log: &Arc<EventLog>, f: impl FnOnce()) {
        let subscriber = tracing_subscriber::registry().with(ArcLayer(Arc::clone(log)));
        tracing::subscriber::with_default(subscriber, f);
        log.flush();
    }

    /// The layer behind an `Arc`, so that the test keeps it for `flush`.
    struct ArcLayer(Arc<EventLog>);

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for ArcLayer {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            self.0.on_new_span(attrs, id, ctx);
        }
        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            self.0.on_event(event, ctx);
        }
    }

    #[test]
    fn keeps_events_alerts_and_warnings_with_their_fields_and_request_id() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_in(dir.path());
        with_log(&log, || {
            let span = tracing::error_span!("request", request_id = "req-7", method = "POST");
            let _in = span.enter();
            tracing::info!(target: "estafeta::event", db = "db-a", device = "phone-1", message = "01MSG", n = 3, "message received");
            tracing::info!("an ordinary info line is not kept");
            tracing::warn!(process = "01PID", "a warning is kept");
            drop(_in);
            tracing::error!(target: "estafeta::alert", db = "db-a", "in doubt");
        });
        let events = records(&log);
        assert_eq!(events.len(), 3, "{events:?}");
        let e = &events[0];
        assert_eq!(e.text, "message received");
        assert_eq!(e.db.as_deref(), Some("db-a"));
        assert_eq!(e.device.as_deref(), Some("phone-1"));
        assert_eq!(e.message.as_deref(), Some("01MSG"));
        assert_eq!(e.request.as_deref(), Some("req-7"));
        assert_eq!(e.fields["n"], 3);
        assert_eq!(e.level, "INFO");
        assert_eq!(events[1].process.as_deref(), Some("01PID"));
        assert_eq!(events[1].request.as_deref(), Some("req-7"));
        assert_eq!(events[1].level, "WARN");
        assert!(events[2].is_alert());
        assert_eq!(events[2].request, None, "outside the request's span");
        assert_ne!(events[0].id, events[1].id);
    }

    #[test]
    fn credentials_in_urls_are_redacted() {
        let cases = [
            (
                "http://u:secret@example.org/hook",
                "http://***@example.org/***",
            ),
            (
                "see https://tok@h:8080?x=1 and ftp://a:b@c",
                "see https://***@h:8080/*** and ftp://***@c",
            ),
            (
                "https://hooks.example.org/services/T0/B0/XXXX",
                "https://hooks.example.org/***",
            ),
            (
                "error sending request for url (http://127.0.0.1:9/x?key=k3y)",
                "error sending request for url (http://127.0.0.1:9/***)",
            ),
            ("http://example.org/", "http://example.org/"),
            ("mail ops@example.org", "mail ops@example.org"),
            ("no url", "no url"),
            ("\"http://a:b@c\"", "\"http://***@c\""),
        ];
        for (given, want) in cases {
            assert_eq!(redact_urls(given), want, "{given}");
        }
        let dir = tempfile::tempdir().unwrap();
        let log = log_in(dir.path());
        with_log(&log, || {
            tracing::info!(target: "estafeta::event", webhook = "http://u:secret@h/x", "set http://v:hidden@h/y");
        });
        let text = serde_json::to_string(&records(&log)).unwrap();
        assert!(
            !text.contains("secret") && !text.contains("hidden"),
            "{text}"
        );
        assert!(text.contains("http://***@h/***"), "{text}");
    }

    #[test]
    fn every_record_is_size_capped() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_in(dir.path());
        let huge = "é".repeat(1 << 20);
        with_log(&log, || {
            tracing::info!(target: "estafeta::event", method = %huge, db = %huge, "{huge}");
        });
        let e = &records(&log)[0];
        assert!(serde_json::to_vec(e).unwrap().len() <= MAX_RECORD_BYTES);
        assert!(e.text.len() <= MAX_VALUE_BYTES + '…'.len_utf8());
        assert!(e.text.ends_with('…') && e.text.starts_with("éé"));
        let field = e.fields["method"].as_str().unwrap();
        assert!(field.len() <= MAX_VALUE_BYTES + '…'.len_utf8());

        // Every value escaped six-fold in JSON still fits, with the names kept.
        let log = log_in(&dir.path().join("b"));
        let control = "\u{1}".repeat(MAX_VALUE_BYTES);
        let mut fields = serde_json::Map::new();
        for i in 0..MAX_FIELDS {
            fields.insert(format!("f{i}"), control.clone().into());
        }
        log.write(EventRecord {
            id: format!("{}-1", chrono::Utc::now().timestamp_nanos_opt().unwrap()),
            ts: "2026-11-25T10:00:00.000Z".to_owned(),
            level: "INFO".to_owned(),
            target: EVENT_TARGET.to_owned(),
            text: control.clone(),
            db: Some("db-a".to_owned()),
            device: None,
            process: None,
            message: None,
            request: None,
            fields,
        });
        log.flush();
        let e = &records(&log)[0];
        assert!(serde_json::to_vec(e).unwrap().len() <= MAX_RECORD_BYTES);
        assert_eq!(e.db.as_deref(), Some("db-a"));
        assert_eq!(e.fields["truncated"], true);

        let log = log_in(&dir.path().join("c"));
        with_log(&log, || {
            tracing::info!(target: "estafeta::event", a0 = 0, a1 = 1, a2 = 2, a3 = 3, a4 = 4, a5 = 5, a6 = 6,
                a7 = 7, a8 = 8, a9 = 9, b0 = 0, b1 = 1, b2 = 2, b3 = 3, b4 = 4, b5 = 5, b6 = 6, b7 = 7,
                b8 = 8, b9 = 9, c0 = 0, c1 = 1, c2 = 2, c3 = 3, c4 = 4, c5 = 5, c6 = 6, c7 = 7, c8 = 8,
                c9 = 9, d0 = 0, d1 = 1, d2 = 2, d3 = 3, "many fields");
        });
        let e = &records(&log)[0];
        assert_eq!(e.fields.len(), MAX_FIELDS);
        assert_eq!(e.text, "many fields");
    }
}
