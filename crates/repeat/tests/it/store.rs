//! Both embedded stores keep the stores' contract (`store::conformance`)
//! and page their scans exactly; the redb one keeps its data across reopen.

use std::ops::Bound;

use estafeta_repeat::store::Read;
use estafeta_repeat::store::conformance::{self, ids};
use estafeta_repeat::{MemoryStore, Position, RedbStore, Store};

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
fn redb_store_keeps_the_contract_and_its_data_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("repeat.redb");
    contract(&RedbStore::open(&path).unwrap());
    let reopened = RedbStore::open(&path).unwrap();
    assert_eq!(ids(&reopened, "a", 100), vec!["y"]);
    assert_eq!(ids(&reopened, "b", 100), vec!["x"]);
}
