//! Both embedded stores keep the stores' contract (`store::conformance`)
//! and page their scans exactly; the redb one keeps its data across reopen.

use std::ops::Bound;

use estafeta_repeat::store::conformance::{self, entry, ids};
use estafeta_repeat::store::{Op, Read};
use estafeta_repeat::{Entry, MemoryStore, Position, RedbStore, Store};
use proptest::prelude::*;

fn pos(due: u64, id: &str) -> Position {
    Position {
        due,
        id: id.to_owned(),
    }
}

/// The embedded stores' scans, on the store as [`conformance::ops`] hands
/// it over: a read starts after its `from`, stops at the limit or the
/// first future entry, passes over skipped positions, and reports the
/// exact due second it stopped at.
fn scans(store: &impl Store) {
    let scan = store
        .scan(Read::first("a", 1), 100, &|p| p.id == "w")
        .unwrap();
    assert_eq!(scan.entries.len(), 1);
    assert_eq!(scan.entries[0].id, "y");
    assert_eq!(scan.last, Some(pos(10, "y")));
    assert_eq!(scan.next_due, None);
    let scan = store
        .scan(
            Read {
                source: "b",
                from: Bound::Excluded(&pos(10, "z")),
                limit: 10,
            },
            20,
            &|_| false,
        )
        .unwrap();
    assert!(scan.entries.is_empty());
    assert_eq!(scan.next_due, Some(30));
    let scan = store.scan(Read::first("a", 0), 100, &|_| false).unwrap();
    assert_eq!(
        (scan.entries.len(), scan.last, scan.next_due),
        (0, None, Some(10))
    );
}

fn contract(store: &impl Store) {
    conformance::ops(store, scans);
    let mut sources = store.sources().unwrap();
    sources.sort();
    assert_eq!(sources, ["a", "b", "c"]);
}

#[test]
fn memory_store_keeps_the_contract() {
    contract(&MemoryStore::new());
}

#[test]
fn memory_store_removes_runs_as_each_alone() {
    conformance::removal_runs(&MemoryStore::new());
}

#[test]
fn redb_store_removes_runs_as_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    conformance::removal_runs(&RedbStore::open(dir.path().join("repeat.redb")).unwrap());
}

#[test]
fn redb_store_keeps_the_contract_and_its_data_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("repeat.redb");
    contract(&RedbStore::open(&path).unwrap());
    let reopened = RedbStore::open(&path).unwrap();
    assert_eq!(ids(&reopened, "a", 100), vec!["y"]);
    assert_eq!(ids(&reopened, "b", 100), vec!["x"]);
}

/// A remove as a run may hold it: of the stored entry its number picks
/// (see [`stored`]), exactly as stored or with its attempt or due changed,
/// or of an entry never stored.
#[derive(Debug, Clone)]
enum Remove {
    Exact(usize),
    OtherAttempt(usize),
    OtherDue(usize),
    Missing(usize),
}

/// The `i`th of `count` stored entries: over three sources, a few due
/// seconds, ids that sort apart from the order of their places.
fn stored(i: usize, count: usize) -> Entry {
    entry(
        ["a", "b", "c"][i % 3],
        (i % 4) as u64,
        &format!("e{:03}", count - i),
    )
}

fn remove_op(remove: &Remove, count: usize) -> Op {
    Op::Remove(match *remove {
        Remove::Exact(i) => stored(i % count, count),
        Remove::OtherAttempt(i) => Entry {
            attempt: 1,
            ..stored(i % count, count)
        },
        Remove::OtherDue(i) => Entry {
            due: 9,
            ..stored(i % count, count)
        },
        Remove::Missing(i) => entry("b", (i % 4) as u64, &format!("m{i}")),
    })
}

fn remove() -> impl Strategy<Value = Remove> {
    prop_oneof![
        6 => (0..400usize).prop_map(Remove::Exact),
        1 => (0..400usize).prop_map(Remove::OtherAttempt),
        1 => (0..400usize).prop_map(Remove::OtherDue),
        1 => (0..400usize).prop_map(Remove::Missing),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Runs of removes (some of them of the same entry twice, of an entry
    /// as it is not stored, or of none) answer on the redb store as on the
    /// memory store, and leave the same entries behind; a put between two
    /// runs splits them.
    #[test]
    fn runs_of_removes_on_redb_answer_as_on_memory(
        count in 1..300usize,
        runs in proptest::collection::vec(proptest::collection::vec(remove(), 1..80), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let redb = RedbStore::open(dir.path().join("repeat.redb")).unwrap();
        let memory = MemoryStore::new();
        let puts: Vec<Op> = (0..count).map(|i| Op::Put(stored(i, count))).collect();
        let mut ops = puts.clone();
        for run in &runs {
            ops.extend(run.iter().map(|r| remove_op(r, count)));
            ops.push(puts[count / 2].clone());
        }
        prop_assert_eq!(redb.apply(&ops).unwrap(), memory.apply(&ops).unwrap());
        for source in ["a", "b", "c"] {
            prop_assert_eq!(ids(&redb, source, 10), ids(&memory, source, 10));
        }
        for i in 0..count {
            let id = stored(i, count).id;
            prop_assert_eq!(redb.contains(&id).unwrap(), memory.contains(&id).unwrap());
        }
    }
}
