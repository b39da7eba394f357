//! The dispatcher's view of the sources: a read cursor, the next due time
//! and the entries in flight per source, and the order in which sources are
//! read (fair or nearest first).

use std::collections::{BTreeMap, HashSet};
use std::ops::{Bound, Range};
use std::time::Duration;

use tokio::time::Instant;

use crate::entry::lower_bound;
use crate::store::{Held, Holding, Read, Scan, Store};
use crate::{Delivery, Entry, Options, Position, SourceOrder, StoreError};

/// One source as the dispatcher tracks it.
#[derive(Debug)]
struct Source {
    /// Where the next read starts; every position before it was handed out,
    /// or has since been reported placed (which moves the cursor back).
    cursor: Bound<Position>,
    /// Due second of the first entry at or after the cursor; `None` when the
    /// source had nothing more when last read.
    head: Option<u64>,
    /// Handed out and not yet settled; reads pass over these.
    in_flight: HashSet<Position>,
    /// Whether `head` comes from a read (or a placement), not a guess.
    known: bool,
    /// Consecutive failed reads.
    failures: u32,
    /// No read before this instant (backoff after a failure).
    retry_at: Option<Instant>,
}

impl Source {
    fn new() -> Self {
        Self {
            cursor: Bound::Unbounded,
            // Unknown until read: read it at the first chance.
            head: Some(0),
            known: false,
            in_flight: HashSet::new(),
            failures: 0,
            retry_at: None,
        }
    }

    fn ready(&self, now: u64, mono: Instant) -> bool {
        self.head.is_some_and(|h| h <= now) && self.retry_at.is_none_or(|t| t <= mono)
    }
}

/// A failed read of one source.
#[derive(Debug)]
pub(crate) struct ReadFailure {
    pub(crate) source: String,
    pub(crate) failures: u32,
    pub(crate) error: StoreError,
}

/// A store's hold on some of a pass's entries (see [`Held`]).
#[derive(Debug)]
pub(crate) struct Hold {
    /// The claim their outcomes are settled through.
    pub(crate) held: Box<dyn Held>,
    /// Which of the pass's entries it holds.
    pub(crate) entries: Range<usize>,
}

/// What one pass over the sources produced.
#[derive(Debug, Default)]
pub(crate) struct Pass {
    /// Due entries taken, now in flight.
    pub(crate) entries: Vec<Entry>,
    /// The store's holds on some of them, in the order read.
    pub(crate) holds: Vec<Hold>,
    /// Sources whose read failed.
    pub(crate) failed: Vec<ReadFailure>,
    /// Sources read successfully after failing before.
    pub(crate) recovered: Vec<String>,
}

/// All sources, by name.
#[derive(Debug, Default)]
pub(crate) struct Sources {
    sources: BTreeMap<String, Source>,
    /// The fair order starts its next pass at the first source at or after this name.
    next_start: String,
}

impl Sources {
    /// Sources known to exist when the dispatcher starts.
    pub(crate) fn new(names: Vec<String>) -> Self {
        Self {
            sources: names.into_iter().map(|n| (n, Source::new())).collect(),
            next_start: String::new(),
        }
    }

    /// An entry was placed at `at` in `source`: read it from there.
    pub(crate) fn placed(&mut self, source: String, at: Position) {
        let s = self.sources.entry(source).or_insert_with(Source::new);
        s.head = Some(s.head.map_or(at.due, |h| h.min(at.due)));
        let cursor = std::mem::replace(&mut s.cursor, Bound::Unbounded);
        s.cursor = lower_bound(cursor, Bound::Included(at));
    }

    /// The outcome of a handed-out entry is durable: stop passing over it.
    pub(crate) fn settled(&mut self, source: &str, at: &Position) {
        if let Some(s) = self.sources.get_mut(source) {
            s.in_flight.remove(at);
        }
    }

    /// A handed-out entry was not removed after all (an at-most-once removal
    /// failed): forget it was handed out and read it again.
    pub(crate) fn unsettle(&mut self, source: &str, at: Position) {
        if let Some(s) = self.sources.get_mut(source) {
            s.in_flight.remove(&at);
        }
        self.placed(source.to_owned(), at);
    }

    /// Whether some source has an entry due at `now` and may be read.
    pub(crate) fn any_ready(&self, now: u64, mono: Instant) -> bool {
        self.sources.values().any(|s| s.ready(now, mono))
    }

    /// The earliest due second known over all sources.
    pub(crate) fn next_due(&self) -> Option<u64> {
        self.sources.values().filter_map(|s| s.head).min()
    }

    /// The earliest instant a failing source may be read again.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.sources.values().filter_map(|s| s.retry_at).min()
    }

    /// Reads up to `limit` entries due at `now` in the configured order,
    /// marking them in flight. Failing sources are put on backoff and
    /// returned; they do not stop the others.
    pub(crate) fn take<S: Store>(
        &mut self,
        store: &S,
        now: u64,
        mono: Instant,
        limit: usize,
        options: &Options,
    ) -> Pass {
        let mut ready: Vec<String> = self
            .sources
            .iter()
            .filter(|(_, s)| s.ready(now, mono))
            .map(|(n, _)| n.clone())
            .collect();
        let mut pass = Pass::default();
        match options.order {
            SourceOrder::NearestFirst => {
                // Learn the real next due time of sources not read yet (a
                // read with limit 0 only looks), so "nearest" is true.
                for name in &ready {
                    if self.sources.get(name).is_some_and(|s| !s.known) {
                        self.read(store, &[(name.clone(), 0)], now, mono, options, &mut pass);
                    }
                }
                ready.retain(|n| self.sources.get(n).is_some_and(|s| s.ready(now, mono)));
                ready.sort_by_key(|n| (self.sources.get(n).and_then(|s| s.head), n.clone()));
                for name in ready {
                    let want = limit - pass.entries.len();
                    if want == 0 {
                        break;
                    }
                    self.read(store, &[(name, want)], now, mono, options, &mut pass);
                }
            }
            SourceOrder::Fair => {
                let start = ready.partition_point(|n| *n < self.next_start);
                ready.rotate_left(start);
                let order = ready.clone();
                let mut served_first = None;
                while pass.entries.len() < limit && !ready.is_empty() {
                    // Each ready source's share of the room, read together;
                    // the first sources take one more each until the room
                    // is shared out, so that one read fills it.
                    let room = limit - pass.entries.len();
                    let (share, more) = (room / ready.len(), room % ready.len());
                    let mut wants = Vec::new();
                    for (k, name) in ready.iter().enumerate() {
                        let want = share + usize::from(k < more);
                        if want == 0 {
                            break;
                        }
                        wants.push((name.clone(), want));
                    }
                    let got = self.read(store, &wants, now, mono, options, &mut pass);
                    served_first.get_or_insert(wants.len());
                    ready = wants
                        .into_iter()
                        .zip(got)
                        .filter(|((name, want), got)| {
                            got == want
                                && self.sources.get(name).is_some_and(|s| s.ready(now, mono))
                        })
                        .map(|((name, _), _)| name)
                        .collect();
                }
                // The next pass starts at the first source not served in this
                // pass's first round, or one further if all were served.
                if let Some(served) = served_first {
                    let next = if served >= order.len() {
                        1 % order.len()
                    } else {
                        served
                    };
                    self.next_start = order[next].clone();
                }
            }
        }
        pass
    }

    /// Reads each named source for up to its number of entries, all in one
    /// store call; returns how many entries each gave.
    fn read<S: Store>(
        &mut self,
        store: &S,
        wants: &[(String, usize)],
        now: u64,
        mono: Instant,
        options: &Options,
        pass: &mut Pass,
    ) -> Vec<usize> {
        let reads: Vec<Read<'_>> = wants
            .iter()
            .filter_map(|(name, want)| {
                let s = self.sources.get(name)?;
                Some(Read {
                    source: name,
                    from: s.cursor.as_ref(),
                    limit: *want,
                })
            })
            .collect();
        let sources = &self.sources;
        let skip = |source: &str, at: &Position| {
            sources
                .get(source)
                .is_some_and(|s| s.in_flight.contains(at))
        };
        // Only an at-least-once delivery can settle a hold after its
        // handlers ran: an at-most-once one removes entries before.
        let Holding { scans, held } = match options.delivery {
            Delivery::AtLeastOnce => store.hold_sources(&reads, now, &skip),
            Delivery::AtMostOnce => Holding::unheld(store.scan_sources(&reads, now, &skip)),
        };
        let read: Vec<String> = reads.iter().map(|r| r.source.to_owned()).collect();
        let mut results: BTreeMap<String, Result<Scan, StoreError>> =
            read.into_iter().zip(scans).collect();
        let start = pass.entries.len();
        let got = wants
            .iter()
            .map(|(name, _)| match results.remove(name) {
                Some(result) => self.absorb(name, result, mono, options, pass),
                None => 0,
            })
            .collect();
        if let Some(held) = held {
            pass.holds.push(Hold {
                held,
                entries: start..pass.entries.len(),
            });
        }
        got
    }

    /// Takes in one source's read; returns how many entries it gave.
    fn absorb(
        &mut self,
        name: &str,
        result: Result<Scan, StoreError>,
        mono: Instant,
        options: &Options,
        pass: &mut Pass,
    ) -> usize {
        let Some(s) = self.sources.get_mut(name) else {
            return 0;
        };
        match result {
            Ok(scan) => {
                if s.failures > 0 {
                    pass.recovered.push(name.to_owned());
                }
                s.failures = 0;
                s.retry_at = None;
                s.known = true;
                if let Some(last) = scan.last {
                    s.cursor = Bound::Excluded(last);
                }
                s.head = scan.next_due;
                let got = scan.entries.len();
                for entry in scan.entries {
                    s.in_flight.insert(entry.position());
                    pass.entries.push(entry);
                }
                got
            }
            Err(error) => {
                s.failures = s.failures.saturating_add(1);
                let delay = options
                    .source_backoff
                    .saturating_mul(1 << (s.failures - 1).min(16))
                    .min(options.source_backoff_max);
                s.retry_at = Some(mono + delay.max(Duration::from_millis(1)));
                pass.failed.push(ReadFailure {
                    source: name.to_owned(),
                    failures: s.failures,
                    error,
                });
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryStore, Op};

    fn store(entries: &[(&str, u64, &str)]) -> MemoryStore {
        let store = MemoryStore::new();
        let ops: Vec<Op> = entries
            .iter()
            .map(|(source, due, id)| {
                Op::Put(Entry {
                    source: (*source).to_owned(),
                    due: *due,
                    id: (*id).to_owned(),
                    payload: Vec::new(),
                    attempt: 0,
                })
            })
            .collect();
        store.apply(&ops).unwrap();
        store
    }

    fn ids(pass: &Pass) -> Vec<&str> {
        pass.entries.iter().map(|e| e.id.as_str()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn fair_order_rotates_when_workers_are_fewer_than_sources() {
        let store = store(&[
            ("a", 1, "a1"),
            ("a", 1, "a2"),
            ("b", 1, "b1"),
            ("b", 1, "b2"),
            ("c", 1, "c1"),
            ("c", 1, "c2"),
        ]);
        let mut sources = Sources::new(store.sources().unwrap());
        let options = Options::default();
        let mono = Instant::now();
        let mut order = Vec::new();
        for _ in 0..3 {
            let pass = sources.take(&store, 10, mono, 2, &options);
            order.extend(ids(&pass).into_iter().map(str::to_owned));
        }
        assert_eq!(order, ["a1", "b1", "c1", "a2", "b2", "c2"]);
        assert!(
            !sources.any_ready(10, mono),
            "all in flight, nothing more due"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn fair_order_gives_unused_shares_to_busy_sources() {
        let store = store(&[
            ("a", 1, "a1"),
            ("a", 1, "a2"),
            ("a", 1, "a3"),
            ("b", 1, "b1"),
        ]);
        let mut sources = Sources::new(store.sources().unwrap());
        let pass = sources.take(&store, 10, Instant::now(), 4, &Options::default());
        assert_eq!(ids(&pass), ["a1", "a2", "b1", "a3"]);
    }

    #[tokio::test(start_paused = true)]
    async fn nearest_first_drains_the_earliest_source_and_tracks_next_due() {
        let store = store(&[
            ("a", 5, "a1"),
            ("b", 3, "b1"),
            ("b", 4, "b2"),
            ("b", 20, "b3"),
        ]);
        let mut sources = Sources::new(store.sources().unwrap());
        let options = Options {
            order: SourceOrder::NearestFirst,
            ..Options::default()
        };
        let pass = sources.take(&store, 10, Instant::now(), 10, &options);
        assert_eq!(ids(&pass), ["b1", "b2", "a1"]);
        assert_eq!(sources.next_due(), Some(20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_placed_entry_behind_the_cursor_is_read_again() {
        let store = store(&[("a", 5, "x"), ("a", 6, "y")]);
        let mut sources = Sources::new(store.sources().unwrap());
        let options = Options::default();
        let pass = sources.take(&store, 10, Instant::now(), 10, &options);
        assert_eq!(ids(&pass), ["x", "y"]);
        sources.settled(
            "a",
            &Position {
                due: 5,
                id: "x".into(),
            },
        );
        store
            .apply(&[Op::Remove(Entry {
                source: "a".into(),
                due: 5,
                id: "x".into(),
                payload: Vec::new(),
                attempt: 0,
            })])
            .unwrap();
        let placed = store
            .apply(&[Op::Reschedule {
                id: "y".into(),
                due: 1,
            }])
            .unwrap();
        sources.settled(
            "a",
            &Position {
                due: 6,
                id: "y".into(),
            },
        );
        assert_eq!(sources.next_due(), None);
        sources.placed(
            "a".into(),
            Position {
                due: 1,
                id: "y".into(),
            },
        );
        assert_eq!(placed.len(), 1);
        let pass = sources.take(&store, 10, Instant::now(), 10, &options);
        assert_eq!(ids(&pass), ["y"]);
    }
}
