//! An index of time slices. A key touched is copied forward into the
//! slice of its new time; stale copies in older slices are skipped when met;
//! whole slices are dropped at once when their time has passed.
//!
//! Two slice lists are kept: one by expiration (which keys end when) and one
//! by last access (which in-memory keys are idle longest). Touching a key
//! costs a hash update and at most two vector pushes.

use super::ExpiryIndex;
use crate::clock::Timestamp;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;

#[derive(Clone, Copy, Debug)]
struct Entry {
    expires_at: Option<Timestamp>,
    last_access: Option<Timestamp>,
}

/// Time-bucket index.
#[derive(Debug)]
pub struct BucketIndex<K> {
    slice_ms: u64,
    entries: HashMap<K, Entry>,
    /// Expiration slice → keys (possibly stale copies).
    expiring: BTreeMap<u64, Vec<K>>,
    /// Last-access slices, oldest first → keys (possibly stale copies).
    access: VecDeque<(u64, Vec<K>)>,
    resident: usize,
}

impl<K> Default for BucketIndex<K> {
    fn default() -> Self {
        BucketIndex::with_slice(1000)
    }
}

impl<K> BucketIndex<K> {
    /// An index whose time slices are `slice_ms` milliseconds long.
    pub fn with_slice(slice_ms: u64) -> Self {
        BucketIndex {
            slice_ms: slice_ms.max(1),
            entries: HashMap::new(),
            expiring: BTreeMap::new(),
            access: VecDeque::new(),
            resident: 0,
        }
    }
}

impl<K: Clone + Eq + Hash + Ord + Send + 'static> BucketIndex<K> {
    /// An empty index with one-second slices.
    pub fn new() -> Self {
        Self::default()
    }

    fn slice(&self, t: Timestamp) -> u64 {
        t.0 / self.slice_ms
    }

    fn push_access(&mut self, key: &K, la: Timestamp) {
        let s = self.slice(la);
        match self.access.back_mut() {
            Some((bs, keys)) if *bs >= s => keys.push(key.clone()),
            _ => self.access.push_back((s, vec![key.clone()])),
        }
    }

    /// Whether `key`, met in the access slice `s`, is current there.
    fn access_current(&self, key: &K, s: u64) -> Option<Timestamp> {
        let e = self.entries.get(key)?;
        let la = e.last_access?;
        (self.slice(la) <= s).then_some(la)
    }
}

impl<K: Clone + Eq + Hash + Ord + Send + 'static> ExpiryIndex<K> for BucketIndex<K> {
    fn touch(&mut self, key: &K, expires_at: Option<Timestamp>, last_access: Option<Timestamp>) {
        let old = self.entries.insert(
            key.clone(),
            Entry {
                expires_at,
                last_access,
            },
        );
        let (old_exp, old_la) = old.map_or((None, None), |e| (e.expires_at, e.last_access));
        if let Some(t) = expires_at
            && old_exp.map(|o| self.slice(o)) != Some(self.slice(t))
        {
            let s = self.slice(t);
            self.expiring.entry(s).or_default().push(key.clone());
        }
        if old_la.is_some() {
            self.resident -= 1;
        }
        if let Some(la) = last_access {
            self.resident += 1;
            // Copy forward unless the key is already in the newest slice.
            let same_slice = old_la.is_some_and(|o| self.slice(o) == self.slice(la))
                && self
                    .access
                    .back()
                    .is_some_and(|(s, _)| *s == self.slice(la));
            if !same_slice {
                self.push_access(key, la);
            }
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(old) = self.entries.remove(key)
            && old.last_access.is_some()
        {
            self.resident -= 1;
        }
    }

    fn take_expired(&mut self, now: Timestamp, out: &mut Vec<K>) {
        let now_slice = self.slice(now);
        while let Some(first) = self.expiring.first_entry() {
            if *first.key() > now_slice {
                break;
            }
            let (s, keys) = first.remove_entry();
            let whole = s < now_slice;
            let mut keep = Vec::new();
            for key in keys {
                let Some(e) = self.entries.get(&key) else {
                    continue;
                };
                let Some(t) = e.expires_at else { continue };
                if t.0 / self.slice_ms != s {
                    continue; // a stale copy: the key moved to another slice
                }
                if whole || t <= now {
                    if e.last_access.is_some() {
                        self.resident -= 1;
                    }
                    self.entries.remove(&key);
                    out.push(key);
                } else {
                    keep.push(key);
                }
            }
            if !keep.is_empty() {
                self.expiring.insert(s, keep);
                break;
            }
        }
    }

    fn next_expiry(&mut self) -> Option<Timestamp> {
        loop {
            let mut first = self.expiring.first_entry()?;
            let s = *first.key();
            let entries = &self.entries;
            let slice_ms = self.slice_ms;
            first.get_mut().retain(|k| {
                entries
                    .get(k)
                    .and_then(|e| e.expires_at)
                    .is_some_and(|t| t.0 / slice_ms == s)
            });
            let min = first
                .get()
                .iter()
                .filter_map(|k| entries.get(k).and_then(|e| e.expires_at))
                .min();
            match min {
                Some(t) => return Some(t),
                None => {
                    first.remove();
                }
            }
        }
    }

    fn oldest_idle(&mut self) -> Option<Timestamp> {
        loop {
            let (s, keys) = self.access.front()?;
            let s = *s;
            let min = keys.iter().filter_map(|k| self.access_current(k, s)).min();
            if min.is_some() {
                return min;
            }
            self.access.pop_front();
        }
    }

    fn take_idle(
        &mut self,
        idle_before: Option<Timestamp>,
        max: usize,
        out: &mut Vec<(K, Timestamp)>,
    ) {
        let mut taken = 0;
        while taken < max {
            let Some((s, keys)) = self.access.pop_front() else {
                break;
            };
            if idle_before.is_some_and(|b| s > self.slice(b)) {
                self.access.push_front((s, keys));
                break;
            }
            let mut keep = Vec::new();
            for key in keys {
                let Some(la) = self.access_current(&key, s) else {
                    continue;
                };
                if taken >= max || idle_before.is_some_and(|b| la >= b) {
                    keep.push(key);
                    continue;
                }
                if let Some(e) = self.entries.get_mut(&key) {
                    e.last_access = None;
                }
                self.resident -= 1;
                out.push((key, la));
                taken += 1;
            }
            if !keep.is_empty() {
                self.access.push_front((s, keep));
                break;
            }
        }
    }

    fn resident(&self) -> usize {
        self.resident
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}
