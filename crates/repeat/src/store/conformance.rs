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

/// Runs of exact removes, as the dispatcher writes its finished deliveries,
/// on a fresh `store`: each remove answers as it would alone, whether its
/// entries lie close together in their source or far apart, whether one of
/// them was replaced or moved meanwhile, named twice, or never stored.
pub fn removal_runs(store: &impl Store) {
    let puts = |source: &str, count: usize, due: &dyn Fn(usize) -> u64| {
        let ops: Vec<Op> = (0..count)
            .map(|i| Op::Put(entry(source, due(i), &format!("{source}-{i:04}"))))
            .collect();
        store.apply(&ops).unwrap();
    };
    puts("a", 200, &|_| 10);
    puts("b", 50, &|i| 10 + i as u64);
    puts("c", 1_000, &|i| (i / 10) as u64);
    let replaced = Entry {
        payload: b"new".to_vec(),
        ..entry("b", 13, "b-0003")
    };
    store.apply(&[Op::Put(replaced.clone())]).unwrap();

    // Close together: every other one of a's first 100; far apart: one in
    // a hundred of c's; and the removes that find nothing to remove.
    let close: Vec<Entry> = (0..100)
        .step_by(2)
        .map(|i| entry("a", 10, &format!("a-{i:04}")))
        .collect();
    let far: Vec<Entry> = (0..1_000)
        .step_by(100)
        .map(|i| entry("c", (i / 10) as u64, &format!("c-{i:04}")))
        .collect();
    let unchanged = [
        entry("b", 13, "b-0003"),
        entry("b", 99, "b-0004"),
        Entry {
            attempt: 1,
            ..entry("b", 15, "b-0005")
        },
        entry("b", 10, "nope"),
        close[0].clone(),
    ];
    let mut run: Vec<Op> = Vec::new();
    for (i, e) in far.iter().enumerate() {
        run.push(Op::Remove(e.clone()));
        run.extend(
            close
                .get(i * 5..i * 5 + 5)
                .into_iter()
                .flatten()
                .cloned()
                .map(Op::Remove),
        );
    }
    run.push(Op::Remove(entry("b", 16, "b-0006")));
    run.extend(unchanged.iter().cloned().map(Op::Remove));
    let results = store.apply(&run).unwrap();
    let removed = run.len() - unchanged.len();
    assert!(
        results[..removed].iter().all(|r| *r == Applied::Removed),
        "{results:?}"
    );
    assert!(
        results[removed..].iter().all(|r| *r == Applied::Unchanged),
        "{results:?}"
    );

    let kept_a: Vec<String> = (1..100)
        .step_by(2)
        .chain(100..200)
        .map(|i| format!("a-{i:04}"))
        .collect();
    assert_eq!(ids(store, "a", 100), kept_a);
    assert_eq!(ids(store, "c", 1_000).len(), 990);
    assert_eq!(ids(store, "b", 1_000).len(), 49);
    for gone in close.iter().chain(&far) {
        assert!(!store.contains(&gone.id).unwrap(), "{} is removed", gone.id);
    }
    for kept in ["a-0001", "b-0003", "b-0004", "b-0005", "c-0001", "c-0999"] {
        assert!(store.contains(kept).unwrap(), "{kept} is kept");
    }
    let scan = store.scan(Read::first("b", 10), 13, &|_| false).unwrap();
    assert_eq!(
        scan.entries.last(),
        Some(&replaced),
        "the replacement stays"
    );

    // A run that is close together in both the sources and the ids.
    let rest: Vec<Op> = (100..200)
        .map(|i| Op::Remove(entry("a", 10, &format!("a-{i:04}"))))
        .collect();
    let results = store.apply(&rest).unwrap();
    assert!(
        results.iter().all(|r| *r == Applied::Removed),
        "{results:?}"
    );
    assert_eq!(ids(store, "a", 100).len(), 50);
    assert!(!store.contains("a-0150").unwrap() && store.contains("a-0099").unwrap());
}
