//! Both stores obey the same contract; the redb one keeps it across reopen.

use std::ops::Bound;

use crate::common::entry;
use estafeta_repeat::store::{Applied, Op, SourceCount};
use estafeta_repeat::{Entry, MemoryStore, Position, RedbStore, Store};

fn pos(due: u64, id: &str) -> Position {
    Position {
        due,
        id: id.to_owned(),
    }
}

fn ids(store: &impl Store, source: &str, now: u64) -> Vec<String> {
    let scan = store
        .scan(source, Bound::Unbounded, now, usize::MAX, &|_| false)
        .unwrap();
    scan.entries.into_iter().map(|e| e.id).collect()
}

fn contract(store: &impl Store) {
    let put = |s: &str, due, id: &str| Op::Put(entry(s, due, id));
    let applied = store
        .apply(&[
            put("a", 20, "x"),
            put("a", 10, "y"),
            put("b", 10, "z"),
            put("a", 10, "w"),
        ])
        .unwrap();
    assert_eq!(
        applied[1],
        Applied::Placed {
            source: "a".into(),
            at: pos(10, "y")
        }
    );
    let mut sources = store.sources().unwrap();
    sources.sort();
    assert_eq!(sources, vec!["a", "b"]);
    assert_eq!(
        ids(store, "a", 100),
        vec!["w", "y", "x"],
        "due order, then id"
    );

    // Putting an existing id moves it, even across sources.
    store.apply(&[put("b", 30, "x")]).unwrap();
    assert_eq!(ids(store, "a", 100), vec!["w", "y"]);
    assert_eq!(ids(store, "b", 100), vec!["z", "x"]);
    assert_eq!(
        store.count("b", 15).unwrap(),
        SourceCount { entries: 2, due: 1 }
    );
    assert_eq!(store.count("nope", 15).unwrap(), SourceCount::default());

    // Scans stop at the limit or the first future entry, and pass over skipped positions.
    let scan = store
        .scan("a", Bound::Unbounded, 100, 1, &|p| p.id == "w")
        .unwrap();
    assert_eq!(scan.entries.len(), 1);
    assert_eq!(scan.entries[0].id, "y");
    assert_eq!(scan.last, Some(pos(10, "y")));
    assert_eq!(scan.next_due, None);
    let scan = store
        .scan("b", Bound::Excluded(&pos(10, "z")), 20, 10, &|_| false)
        .unwrap();
    assert!(scan.entries.is_empty());
    assert_eq!(scan.next_due, Some(30));
    let scan = store
        .scan("a", Bound::Unbounded, 100, 0, &|_| false)
        .unwrap();
    assert_eq!(
        (scan.entries.len(), scan.last, scan.next_due),
        (0, None, Some(10))
    );

    // Exact removes and moves do nothing when the entry moved meanwhile.
    let results = store
        .apply(&[
            Op::Remove(entry("a", 20, "x")),
            Op::Move {
                entry: entry("a", 10, "y"),
                due: 50,
                attempt: 3,
            },
            Op::Remove(entry("a", 10, "w")),
            Op::Cancel { id: "z".into() },
            Op::Cancel { id: "z".into() },
            Op::Reschedule {
                id: "x".into(),
                due: 5,
            },
            Op::Reschedule {
                id: "nope".into(),
                due: 5,
            },
        ])
        .unwrap();
    assert_eq!(
        results,
        vec![
            Applied::Unchanged,
            Applied::Placed {
                source: "a".into(),
                at: pos(50, "y")
            },
            Applied::Removed,
            Applied::Removed,
            Applied::Unchanged,
            Applied::Placed {
                source: "b".into(),
                at: pos(5, "x")
            },
            Applied::Unchanged,
        ]
    );
    let scan = store
        .scan("a", Bound::Unbounded, 100, 10, &|_| false)
        .unwrap();
    assert_eq!(scan.entries.len(), 1);
    assert_eq!((scan.entries[0].due, scan.entries[0].attempt), (50, 3));
    assert_eq!(scan.entries[0].payload, b"y");
    assert_eq!(ids(store, "b", 100), vec!["x"]);

    // Nor when the entry was replaced at the same place: the replacement
    // stays as it is. A restore puts an entry back only if its id is free.
    let old = entry("c", 7, "r");
    let new = Entry {
        payload: b"new".to_vec(),
        ..old.clone()
    };
    store.apply(&[Op::Put(new.clone())]).unwrap();
    let results = store
        .apply(&[
            Op::Remove(old.clone()),
            Op::Move {
                entry: old.clone(),
                due: 9,
                attempt: 1,
            },
            Op::Remove(Entry {
                attempt: 1,
                ..new.clone()
            }),
            Op::Restore(Entry { due: 1, ..old }),
            Op::Restore(entry("c", 8, "s")),
        ])
        .unwrap();
    assert_eq!(
        results,
        vec![
            Applied::Unchanged,
            Applied::Unchanged,
            Applied::Unchanged,
            Applied::Unchanged,
            Applied::Placed {
                source: "c".into(),
                at: pos(8, "s")
            },
        ]
    );
    let scan = store
        .scan("c", Bound::Unbounded, 100, 10, &|_| false)
        .unwrap();
    assert_eq!(scan.entries, vec![new.clone(), entry("c", 8, "s")]);
    let results = store.apply(&[Op::Remove(new), Op::Cancel { id: "s".into() }]);
    assert_eq!(results.unwrap(), vec![Applied::Removed, Applied::Removed]);
    assert_eq!(ids(store, "c", 100), Vec::<String>::new());
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
