//! An in-memory store for tests and for callers that need no durability.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Applied, Op, Read, Scan, Skip, SourceCount, Store, collect_scan};
use crate::{Entry, Position, StoreError};

/// A [`Store`] in memory. Clones share the same entries, so a test can
/// "restart" a scheduler on the same data by giving it a clone.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

/// Stored value: (payload, attempt).
type Value = (Vec<u8>, u32);

#[derive(Debug, Default)]
struct Inner {
    sources: BTreeMap<String, BTreeMap<Position, Value>>,
    ids: HashMap<String, (String, u64)>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // No operation here can fail or panic halfway through a batch, so a
        // poisoned lock still guards consistent data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    fn remove_id(&mut self, id: &str) -> Option<(String, Position, Value)> {
        let (source, due) = self.ids.remove(id)?;
        let at = Position {
            due,
            id: id.to_owned(),
        };
        let value = self.sources.get_mut(&source)?.remove(&at)?;
        Some((source, at, value))
    }

    fn put(&mut self, source: &str, at: Position, value: Value) -> Applied {
        self.remove_id(&at.id);
        self.ids.insert(at.id.clone(), (source.to_owned(), at.due));
        self.sources
            .entry(source.to_owned())
            .or_default()
            .insert(at.clone(), value);
        Applied::Placed {
            source: source.to_owned(),
            at,
        }
    }

    /// Whether exactly `entry` (place, payload and attempt) is stored.
    fn holds(&self, entry: &Entry) -> bool {
        self.ids.get(&entry.id) == Some(&(entry.source.clone(), entry.due))
            && self
                .sources
                .get(&entry.source)
                .and_then(|table| table.get(&entry.position()))
                .is_some_and(|(payload, attempt)| {
                    *payload == entry.payload && *attempt == entry.attempt
                })
    }

    fn apply(&mut self, op: &Op) -> Applied {
        match op {
            Op::Put(e) => self.put(&e.source, e.position(), (e.payload.clone(), e.attempt)),
            Op::Cancel { id } => match self.remove_id(id) {
                Some(_) => Applied::Removed,
                None => Applied::Unchanged,
            },
            Op::Reschedule { id, due } => match self.remove_id(id) {
                Some((source, at, (payload, _))) => {
                    self.put(&source, Position { due: *due, ..at }, (payload, 0))
                }
                None => Applied::Unchanged,
            },
            Op::Remove(e) => {
                if !self.holds(e) {
                    return Applied::Unchanged;
                }
                self.remove_id(&e.id);
                Applied::Removed
            }
            Op::Move {
                entry,
                due,
                attempt,
            } => {
                if !self.holds(entry) {
                    return Applied::Unchanged;
                }
                self.remove_id(&entry.id);
                self.put(
                    &entry.source,
                    Position {
                        due: *due,
                        id: entry.id.clone(),
                    },
                    (entry.payload.clone(), *attempt),
                )
            }
            Op::Restore(e) => {
                if self.ids.contains_key(&e.id) {
                    return Applied::Unchanged;
                }
                self.put(&e.source, e.position(), (e.payload.clone(), e.attempt))
            }
        }
    }
}

impl Store for MemoryStore {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        let mut inner = self.lock();
        Ok(ops.iter().map(|op| inner.apply(op)).collect())
    }

    fn sources(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.lock().sources.keys().cloned().collect())
    }

    fn scan(&self, read: Read<'_>, now: u64, skip: Skip<'_>) -> Result<Scan, StoreError> {
        let source = read.source;
        let inner = self.lock();
        let Some(table) = inner.sources.get(source) else {
            return Ok(Scan::default());
        };
        let entries = table
            .range((read.from, Bound::Unbounded))
            .map(|(at, (payload, attempt))| {
                Ok::<_, StoreError>(Entry {
                    source: source.to_owned(),
                    due: at.due,
                    id: at.id.clone(),
                    payload: payload.clone(),
                    attempt: *attempt,
                })
            });
        collect_scan(entries, now, read.limit, skip)
    }

    fn contains(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().ids.contains_key(id))
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        let inner = self.lock();
        let Some(table) = inner.sources.get(source) else {
            return Ok(SourceCount::default());
        };
        Ok(SourceCount {
            entries: table.len() as u64,
            due: table.keys().take_while(|at| at.due <= now).count() as u64,
        })
    }
}
