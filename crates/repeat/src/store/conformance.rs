//! The behaviour every [`Store`] must show in what it applies, as checks any
//! backend's tests run against a fresh store (feature `test-support`): the
//! memory and redb stores' tests call them, and so do the tests of the
//! PostgreSQL store, so that one set of checks holds them to one contract.
//! How a store's scans page (whether a read starts at its `from`, how
//! exactly it reports the next due second) is each store's own, checked
//! beside it. A failed check panics with what differed.

use super::{Applied, Op, Read, SourceCount, Store};
use crate::{Entry, Position};

/// An entry of `source` due at `due`, its payload its id's bytes.
pub fn entry(source: &str, due: u64, id: &str) -> Entry {
    Entry {
        source: source.to_owned(),
        due,
        id: id.to_owned(),
        payload: id.as_bytes().to_vec(),
        attempt: 0,
    }
}

/// The ids of the entries of `source` due at or before `now`, as a scan
/// from the start returns them.
pub fn ids(store: &impl Store, source: &str, now: u64) -> Vec<String> {
    let scan = store.scan(Read::all(source), now, &|_| false).unwrap();
    scan.entries.into_iter().map(|e| e.id).collect()
}

/// What applying a put or a move answers: the entry placed in `source`
/// at `due`, `id`.
pub fn placed(source: &str, due: u64, id: &str) -> Applied {
    Applied::Placed {
        source: source.to_owned(),
        at: Position {
            due,
            id: id.to_owned(),
        },
    }
}

/// The ops of a fresh `store`: puts, a put that moves an entry across
/// sources, counts, lookups by id, and exact removes, moves, cancels,
/// reschedules and restores, each doing nothing when its entry moved or was
/// replaced meanwhile. `reads` is called half-way, when the store holds exactly
/// source `a`: `w` and `y` due at 10; `b`: `z` at 10, `x` at 30 (for the
/// store's own checks of its scans). The store ends holding `a`: `y` at 50
/// (attempt 3), `b`: `x` at 5, and nothing else.
pub fn ops<S: Store>(store: &S, reads: impl FnOnce(&S)) {
    let put = |s: &str, due, id: &str| Op::Put(entry(s, due, id));
    let applied = store
        .apply(&[
            put("a", 20, "x"),
            put("a", 10, "y"),
            put("b", 10, "z"),
            put("a", 10, "w"),
        ])
        .unwrap();
    assert_eq!(applied[1], placed("a", 10, "y"));
    let sources = store.sources().unwrap();
    assert!(
        sources.iter().any(|s| s == "a") && sources.iter().any(|s| s == "b"),
        "sources: {sources:?}"
    );
    assert_eq!(ids(store, "a", 100), ["w", "y", "x"], "due order, then id");

    // Putting an existing id moves it, even across sources.
    store.apply(&[put("b", 30, "x")]).unwrap();
    assert_eq!(ids(store, "a", 100), ["w", "y"]);
    assert_eq!(ids(store, "b", 100), ["z", "x"]);
    assert_eq!(
        store.count("b", 15).unwrap(),
        SourceCount { entries: 2, due: 1 }
    );
    assert_eq!(store.count("nope", 15).unwrap(), SourceCount::default());
    assert!(store.contains("x").unwrap() && store.contains("z").unwrap());
    assert!(!store.contains("nope").unwrap());
    reads(store);

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
        [
            Applied::Unchanged,
            placed("a", 50, "y"),
            Applied::Removed,
            Applied::Removed,
            Applied::Unchanged,
            placed("b", 5, "x"),
            Applied::Unchanged,
        ]
    );
    let scan = store.scan(Read::first("a", 10), 100, &|_| false).unwrap();
    assert_eq!(scan.entries.len(), 1);
    assert_eq!((scan.entries[0].due, scan.entries[0].attempt), (50, 3));
    assert_eq!(scan.entries[0].payload, b"y");
    assert_eq!(ids(store, "b", 100), ["x"]);
    assert!(!store.contains("w").unwrap() && !store.contains("z").unwrap());
    assert!(store.contains("y").unwrap(), "moved, still stored");

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
        [
            Applied::Unchanged,
            Applied::Unchanged,
            Applied::Unchanged,
            Applied::Unchanged,
            placed("c", 8, "s"),
        ]
    );
    let scan = store.scan(Read::first("c", 10), 100, &|_| false).unwrap();
    assert_eq!(scan.entries, [new.clone(), entry("c", 8, "s")]);
    let results = store.apply(&[Op::Remove(new), Op::Cancel { id: "s".into() }]);
    assert_eq!(results.unwrap(), [Applied::Removed, Applied::Removed]);
    assert_eq!(ids(store, "c", 100), Vec::<String>::new());
    assert!(!store.contains("r").unwrap() && !store.contains("s").unwrap());
}
