//! Both indexes checked against a plain map on random operations.

use super::list_map::ListMapIndex;
use super::{BucketIndex, ExpiryIndex};
use crate::clock::Timestamp;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
enum Op {
    Touch {
        key: u8,
        expires: Option<u16>,
        resident: bool,
    },
    Remove(u8),
    Expire,
    TakeIdle(u8),
    Tick(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (any::<u8>(), proptest::option::of(0u16..5000), any::<bool>())
            .prop_map(|(key, expires, resident)| Op::Touch { key: key % 32, expires, resident }),
        1 => any::<u8>().prop_map(|k| Op::Remove(k % 32)),
        2 => Just(Op::Expire),
        1 => (0u8..5).prop_map(Op::TakeIdle),
        2 => (0u16..700).prop_map(Op::Tick),
    ]
}

/// The model: key → (expires, last access if resident).
type Model = BTreeMap<u8, (Option<Timestamp>, Option<Timestamp>)>;

fn check<I: ExpiryIndex<u8>>(mut index: I, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut model = Model::new();
    let mut now = 0u64;
    for op in ops {
        match op {
            Op::Touch {
                key,
                expires,
                resident,
            } => {
                let exp = expires.map(|e| Timestamp(now + u64::from(e)));
                let la = resident.then_some(Timestamp(now));
                index.touch(&key, exp, la);
                model.insert(key, (exp, la));
            }
            Op::Remove(key) => {
                index.remove(&key);
                model.remove(&key);
            }
            Op::Expire => {
                let mut got = Vec::new();
                index.take_expired(Timestamp(now), &mut got);
                got.sort();
                let want: Vec<u8> = model
                    .iter()
                    .filter(|(_, (e, _))| e.is_some_and(|e| e.0 <= now))
                    .map(|(k, _)| *k)
                    .collect();
                model.retain(|k, _| !want.contains(k));
                prop_assert_eq!(got, want);
            }
            Op::TakeIdle(max) => {
                let mut got = Vec::new();
                index.take_idle(Some(Timestamp(now)), usize::from(max), &mut got);
                for (k, la) in &got {
                    let entry = model.get_mut(k);
                    prop_assert!(entry.is_some());
                    if let Some(entry) = entry {
                        prop_assert_eq!(entry.1, Some(*la));
                        prop_assert!(la.0 < now);
                        entry.1 = None;
                    }
                }
                if got.len() < usize::from(max) {
                    let left = model
                        .values()
                        .filter(|(_, la)| la.is_some_and(|la| la.0 < now))
                        .count();
                    prop_assert_eq!(left, 0);
                }
            }
            Op::Tick(d) => now += u64::from(d),
        }
        prop_assert_eq!(index.len(), model.len());
        prop_assert_eq!(
            index.resident(),
            model.values().filter(|(_, la)| la.is_some()).count()
        );
        prop_assert_eq!(
            index.next_expiry(),
            model.values().filter_map(|(e, _)| *e).min()
        );
        prop_assert_eq!(
            index.oldest_idle(),
            model.values().filter_map(|(_, la)| *la).min()
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn list_map_matches_model(ops in proptest::collection::vec(op(), 1..200)) {
        check(ListMapIndex::new(), ops)?;
    }

    #[test]
    fn bucket_matches_model(ops in proptest::collection::vec(op(), 1..200)) {
        check(BucketIndex::with_slice(100), ops)?;
    }
}
