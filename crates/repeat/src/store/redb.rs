//! The default store: one redb file, a table per source plus an id index.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ops::Bound;
use std::path::Path;

use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, Table, TableDefinition,
    TableHandle, WriteTransaction,
};

use super::{Applied, Op, Read, Scan, Skip, SourceCount, Store, collect_scan};
use crate::{Position, StoreError};
use estafeta_durable::WriteGate;

/// The id index: id → (source, due).
const IDS: TableDefinition<'_, &str, (&str, u64)> = TableDefinition::new("repeat.ids");

/// Source tables are named with this prefix followed by the source name.
const SOURCE_PREFIX: &str = "repeat.source.";

/// A source table: (due, id) → attempt (4 bytes, little endian) + payload.
type SourceTable<'a> = TableDefinition<'a, (u64, &'static str), &'static [u8]>;

fn source_table(name: &str) -> SourceTable<'_> {
    TableDefinition::new(name)
}

/// A [`Store`] in one redb file. Every [`Store::apply`] is one write
/// transaction committed with redb's default (immediate, fsynced) durability.
#[derive(Debug)]
pub struct RedbStore {
    db: Database,
    /// What an online backup closes to hold back this store's writes.
    gate: WriteGate,
}

impl RedbStore {
    /// Opens the store at `path`, creating the file if it does not exist.
    /// A file it creates is durable, entry in its folder included, when
    /// this returns.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        RedbStore::open_gated(path, WriteGate::default())
    }

    /// [`RedbStore::open`], every [`Store::apply`] passing `gate` (an
    /// online backup closes it to hold them back).
    pub fn open_gated(path: impl AsRef<Path>, gate: WriteGate) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let db = estafeta_durable::open_redb(path, |db| {
            let txn = db.begin_write()?;
            txn.open_table(IDS)?;
            txn.commit()?;
            Ok(())
        })
        .map_err(StoreError::redb)?;
        Ok(Self { db, gate })
    }
}

fn encode(attempt: u32, payload: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(4 + payload.len());
    value.extend_from_slice(&attempt.to_le_bytes());
    value.extend_from_slice(payload);
    value
}

fn decode(id: &str, value: &[u8]) -> Result<(u32, Vec<u8>), StoreError> {
    match value.split_first_chunk::<4>() {
        Some((attempt, payload)) => Ok((u32::from_le_bytes(*attempt), payload.to_vec())),
        None => Err(StoreError::Malformed(format!(
            "entry {id:?} is shorter than its header"
        ))),
    }
}

/// How many entries a range may hold per entry removed from it, beside
/// [`CLOSE_SLACK`], and still be removed from in one pass (see
/// [`close_together`]): a pass steps over a kept entry for a small part of
/// what one removal costs.
const CLOSE_FACTOR: usize = 4;
/// See [`CLOSE_FACTOR`]: room for the deliveries still in flight among a
/// run's finished ones.
const CLOSE_SLACK: usize = 64;

/// A removed entry: (source, due, attempt, payload).
type Taken = (String, u64, u32, Vec<u8>);

/// An open source table inside a write transaction.
type SourceTableMut<'t> = Table<'t, (u64, &'static str), &'static [u8]>;

/// One write transaction with its tables opened once, not once per op.
struct Writer<'t> {
    txn: &'t WriteTransaction,
    ids: Table<'t, &'static str, (&'static str, u64)>,
    sources: HashMap<String, SourceTableMut<'t>>,
}

impl<'t> Writer<'t> {
    fn new(txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            txn,
            ids: txn.open_table(IDS).map_err(StoreError::redb)?,
            sources: HashMap::new(),
        })
    }

    fn source(&mut self, name: &str) -> Result<&mut SourceTableMut<'t>, StoreError> {
        Self::open_source(self.txn, &mut self.sources, name)
    }

    /// Opens (once) the table of source `name`; a free function over the
    /// fields so the id index can be used while a source table is borrowed.
    fn open_source<'s>(
        txn: &'t WriteTransaction,
        sources: &'s mut HashMap<String, SourceTableMut<'t>>,
        name: &str,
    ) -> Result<&'s mut SourceTableMut<'t>, StoreError> {
        match sources.entry(name.to_owned()) {
            Entry::Occupied(table) => Ok(table.into_mut()),
            Entry::Vacant(slot) => {
                let table_name = format!("{SOURCE_PREFIX}{name}");
                let table = txn
                    .open_table(source_table(&table_name))
                    .map_err(StoreError::redb)?;
                Ok(slot.insert(table))
            }
        }
    }

    fn locate(&self, id: &str) -> Result<Option<(String, u64)>, StoreError> {
        let found = self.ids.get(id).map_err(StoreError::redb)?;
        Ok(found.map(|g| {
            let (source, due) = g.value();
            (source.to_owned(), due)
        }))
    }

    /// Removes the entry with `id`, returning its source, due, attempt and payload.
    fn take(&mut self, id: &str) -> Result<Option<Taken>, StoreError> {
        let Some((source, due)) = self.locate(id)? else {
            return Ok(None);
        };
        self.ids.remove(id).map_err(StoreError::redb)?;
        let table = self.source(&source)?;
        let value = table.remove((due, id)).map_err(StoreError::redb)?;
        let (attempt, payload) = match value {
            Some(v) => decode(id, v.value())?,
            None => {
                return Err(StoreError::Malformed(format!(
                    "id {id:?} indexed but missing"
                )));
            }
        };
        Ok(Some((source, due, attempt, payload)))
    }

    /// Removes exactly `entry` (place, payload and attempt), if it is
    /// stored; returns whether it was. Ids are unique, so finding the key in
    /// the source table is enough; the index is not consulted (this is the
    /// hot path of every finished delivery). An entry replaced at the same
    /// place is put back as it was.
    fn take_exact(&mut self, entry: &crate::Entry) -> Result<bool, StoreError> {
        let table = Self::open_source(self.txn, &mut self.sources, &entry.source)?;
        if !remove_exact(table, entry)? {
            return Ok(false);
        }
        self.ids
            .remove(entry.id.as_str())
            .map_err(StoreError::redb)?;
        Ok(true)
    }

    /// [`Writer::take_exact`] of each of `entries` (a run of finished
    /// deliveries), answering in their order. Where a source's entries lie
    /// close together, as the dispatcher's hand-outs do, they leave in one
    /// pass over their range, a leaf rewritten once for all of its
    /// removals rather than once for each; elsewhere one by one.
    fn take_exact_all(&mut self, entries: &[&crate::Entry]) -> Result<Vec<bool>, StoreError> {
        let mut removed = vec![false; entries.len()];
        let mut by_source: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, entry) in entries.iter().enumerate() {
            by_source.entry(&entry.source).or_default().push(i);
        }
        let place = |i: usize| (entries[i].due, entries[i].id.as_str());
        for (source, mut run) in by_source {
            run.sort_by(|&a, &b| place(a).cmp(&place(b)));
            let table = Self::open_source(self.txn, &mut self.sources, source)?;
            let (first, last) = (place(run[0]), place(run[run.len() - 1]));
            if !close_together(table, first..=last, run.len())? {
                for &i in &run {
                    removed[i] = remove_exact(table, entries[i])?;
                }
                continue;
            }
            // The pass visits stored places in order; `next` walks `run`
            // beside it.
            let mut next = 0;
            table
                .retain_in(first..=last, |(due, id), stored| {
                    while next < run.len() && place(run[next]) < (due, id) {
                        next += 1;
                    }
                    let same_place = run[next..].iter().take_while(|&&i| place(i) == (due, id));
                    for &i in same_place {
                        if !removed[i] && is_exactly(entries[i], stored) {
                            removed[i] = true;
                            return false;
                        }
                    }
                    true
                })
                .map_err(StoreError::redb)?;
        }
        let mut ids: Vec<&str> = (0..entries.len())
            .filter(|&i| removed[i])
            .map(|i| entries[i].id.as_str())
            .collect();
        ids.sort_unstable();
        if let (Some(&first), Some(&last)) = (ids.first(), ids.last()) {
            if close_together(&self.ids, first..=last, ids.len())? {
                let mut next = 0;
                self.ids
                    .retain_in(first..=last, |id, _| {
                        while next < ids.len() && ids[next] < id {
                            next += 1;
                        }
                        ids.get(next) != Some(&id)
                    })
                    .map_err(StoreError::redb)?;
            } else {
                for id in ids {
                    self.ids.remove(id).map_err(StoreError::redb)?;
                }
            }
        }
        Ok(removed)
    }

    fn put(
        &mut self,
        source: &str,
        due: u64,
        id: &str,
        attempt: u32,
        payload: &[u8],
    ) -> Result<Applied, StoreError> {
        self.take(id)?;
        self.ids
            .insert(id, (source, due))
            .map_err(StoreError::redb)?;
        self.source(source)?
            .insert((due, id), encode(attempt, payload).as_slice())
            .map_err(StoreError::redb)?;
        Ok(Applied::Placed {
            source: source.to_owned(),
            at: Position {
                due,
                id: id.to_owned(),
            },
        })
    }

    /// Applies `ops` in order; a run of exact removals (finished
    /// deliveries, the bulk of the writes) goes as one batch.
    fn apply_all(&mut self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        let mut applied = Vec::with_capacity(ops.len());
        let mut rest = ops;
        while !rest.is_empty() {
            let removals: Vec<&crate::Entry> = rest
                .iter()
                .map_while(|op| match op {
                    Op::Remove(entry) => Some(entry),
                    _ => None,
                })
                .collect();
            if removals.len() > 1 {
                let removed = self.take_exact_all(&removals)?;
                applied.extend(removed.into_iter().map(|removed| match removed {
                    true => Applied::Removed,
                    false => Applied::Unchanged,
                }));
                rest = &rest[removals.len()..];
            } else {
                applied.push(self.apply(&rest[0])?);
                rest = &rest[1..];
            }
        }
        Ok(applied)
    }

    fn apply(&mut self, op: &Op) -> Result<Applied, StoreError> {
        match op {
            Op::Put(e) => self.put(&e.source, e.due, &e.id, e.attempt, &e.payload),
            Op::Cancel { id } => Ok(match self.take(id)? {
                Some(_) => Applied::Removed,
                None => Applied::Unchanged,
            }),
            Op::Reschedule { id, due } => match self.take(id)? {
                Some((source, _, _, payload)) => self.put(&source, *due, id, 0, &payload),
                None => Ok(Applied::Unchanged),
            },
            Op::Remove(entry) => Ok(if self.take_exact(entry)? {
                Applied::Removed
            } else {
                Applied::Unchanged
            }),
            Op::Move {
                entry,
                due,
                attempt,
            } => {
                if !self.take_exact(entry)? {
                    return Ok(Applied::Unchanged);
                }
                self.put(&entry.source, *due, &entry.id, *attempt, &entry.payload)
            }
            Op::Restore(e) => {
                if self.locate(&e.id)?.is_some() {
                    return Ok(Applied::Unchanged);
                }
                self.put(&e.source, e.due, &e.id, e.attempt, &e.payload)
            }
        }
    }
}

/// Whether the stored value is exactly `entry`'s attempt and payload.
fn is_exactly(entry: &crate::Entry, stored: &[u8]) -> bool {
    stored
        .split_first_chunk::<4>()
        .is_some_and(|(attempt, payload)| {
            *attempt == entry.attempt.to_le_bytes() && payload == entry.payload.as_slice()
        })
}

/// Removes `entry` from its source `table` if it is stored there exactly;
/// an entry replaced at the same place is put back as it was.
fn remove_exact(table: &mut SourceTableMut<'_>, entry: &crate::Entry) -> Result<bool, StoreError> {
    let key = (entry.due, entry.id.as_str());
    // The stored bytes when they are not exactly the entry, to put back.
    let other = match table.remove(key).map_err(StoreError::redb)? {
        None => return Ok(false),
        Some(value) => {
            let stored = value.value();
            (!is_exactly(entry, stored)).then(|| stored.to_vec())
        }
    };
    match other {
        Some(other) => {
            table
                .insert(key, other.as_slice())
                .map_err(StoreError::redb)?;
            Ok(false)
        }
        None => Ok(true),
    }
}

/// Whether `range` of `table`, where `wanted` entries are sought, holds
/// few enough entries in all that one pass over it costs less than a
/// removal of each: at most [`CLOSE_FACTOR`] times `wanted`, plus
/// [`CLOSE_SLACK`]. Counting stops there, so a wide range costs no more
/// than that to rule out.
fn close_together<'k, K, V>(
    table: &impl ReadableTable<K, V>,
    range: std::ops::RangeInclusive<K::SelfType<'k>>,
    wanted: usize,
) -> Result<bool, StoreError>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
{
    let budget = wanted
        .saturating_mul(CLOSE_FACTOR)
        .saturating_add(CLOSE_SLACK);
    let mut held = 0;
    for item in table.range(range).map_err(StoreError::redb)? {
        item.map_err(StoreError::redb)?;
        held += 1;
        if held > budget {
            return Ok(false);
        }
    }
    Ok(true)
}

impl RedbStore {
    /// Applies `ops` in one write transaction: all of them or none.
    fn write(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        let txn = self.db.begin_write().map_err(StoreError::redb)?;
        // The writer (and its open tables) must be gone before commit.
        let applied = Writer::new(&txn).and_then(|mut writer| writer.apply_all(ops));
        match applied {
            Ok(applied) => {
                txn.commit().map_err(StoreError::redb)?;
                Ok(applied)
            }
            Err(e) => {
                // Abort so nothing of the batch is kept; the abort error (if
                // any) matters less than the one that caused it.
                let _ = txn.abort();
                Err(e)
            }
        }
    }
}

impl Store for RedbStore {
    fn apply(&self, ops: &[Op]) -> Result<Vec<Applied>, StoreError> {
        self.gate.pass(|| self.write(ops))
    }

    fn sources(&self) -> Result<Vec<String>, StoreError> {
        let txn = self.db.begin_read().map_err(StoreError::redb)?;
        let tables = txn.list_tables().map_err(StoreError::redb)?;
        Ok(tables
            .filter_map(|t| t.name().strip_prefix(SOURCE_PREFIX).map(str::to_owned))
            .collect())
    }

    fn scan(&self, read: Read<'_>, now: u64, skip: Skip<'_>) -> Result<Scan, StoreError> {
        let source = read.source;
        let txn = self.db.begin_read().map_err(StoreError::redb)?;
        let name = format!("{SOURCE_PREFIX}{source}");
        let table = match txn.open_table(source_table(&name)) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Scan::default()),
            Err(e) => return Err(StoreError::redb(e)),
        };
        let lower = match read.from {
            Bound::Included(p) => Bound::Included((p.due, p.id.as_str())),
            Bound::Excluded(p) => Bound::Excluded((p.due, p.id.as_str())),
            Bound::Unbounded => Bound::Unbounded,
        };
        let range = table
            .range::<(u64, &str)>((lower, Bound::Unbounded))
            .map_err(StoreError::redb)?;
        let entries = range.map(|item| {
            let (key, value) = item.map_err(StoreError::redb)?;
            let (due, id) = key.value();
            let (attempt, payload) = decode(id, value.value())?;
            Ok(crate::Entry {
                source: source.to_owned(),
                due,
                id: id.to_owned(),
                payload,
                attempt,
            })
        });
        collect_scan(entries, now, read.limit, skip)
    }

    fn contains(&self, id: &str) -> Result<bool, StoreError> {
        let txn = self.db.begin_read().map_err(StoreError::redb)?;
        let ids = match txn.open_table(IDS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
            Err(e) => return Err(StoreError::redb(e)),
        };
        Ok(ids.get(id).map_err(StoreError::redb)?.is_some())
    }

    fn count(&self, source: &str, now: u64) -> Result<SourceCount, StoreError> {
        let txn = self.db.begin_read().map_err(StoreError::redb)?;
        let name = format!("{SOURCE_PREFIX}{source}");
        let table = match txn.open_table(source_table(&name)) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(SourceCount::default()),
            Err(e) => return Err(StoreError::redb(e)),
        };
        let entries = table.len().map_err(StoreError::redb)?;
        let mut due = 0;
        for item in table
            .range::<(u64, &str)>((
                Bound::Unbounded,
                Bound::Excluded((now.saturating_add(1), "")),
            ))
            .map_err(StoreError::redb)?
        {
            item.map_err(StoreError::redb)?;
            due += 1;
        }
        Ok(SourceCount { entries, due })
    }
}
