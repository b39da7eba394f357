//! An index of a list of keys in last-access order, a hash from key to its
//! entry, and an ordered map of expirations.

use super::ExpiryIndex;
use crate::clock::Timestamp;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;

#[derive(Clone, Copy, Debug)]
struct Entry {
    expires_at: Option<Timestamp>,
    last_access: Option<Timestamp>,
    /// Which element of `access` is current for this key; older elements are
    /// skipped when met (lazy deletion keeps touch O(1)).
    seq: u64,
}

/// List + hash + ordered map.
#[derive(Debug)]
pub struct ListMapIndex<K> {
    entries: HashMap<K, Entry>,
    by_expiry: BTreeSet<(Timestamp, K)>,
    access: VecDeque<(u64, K)>,
    next_seq: u64,
    resident: usize,
}

impl<K> Default for ListMapIndex<K> {
    fn default() -> Self {
        ListMapIndex {
            entries: HashMap::new(),
            by_expiry: BTreeSet::new(),
            access: VecDeque::new(),
            next_seq: 0,
            resident: 0,
        }
    }
}

impl<K: Clone + Eq + Hash + Ord + Send + 'static> ListMapIndex<K> {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn is_current(&self, seq: u64, key: &K) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| e.seq == seq && e.last_access.is_some())
    }

    fn drop_stale_front(&mut self) {
        while let Some((seq, key)) = self.access.front() {
            if self.is_current(*seq, key) {
                break;
            }
            self.access.pop_front();
        }
    }

    fn compact_if_sparse(&mut self) {
        if self.access.len() > 1024 && self.access.len() > 4 * self.resident {
            let entries = &self.entries;
            self.access.retain(|(seq, k)| {
                entries
                    .get(k)
                    .is_some_and(|e| e.seq == *seq && e.last_access.is_some())
            });
        }
    }
}

impl<K: Clone + Eq + Hash + Ord + Send + 'static> ExpiryIndex<K> for ListMapIndex<K> {
    fn touch(&mut self, key: &K, expires_at: Option<Timestamp>, last_access: Option<Timestamp>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let old = self.entries.insert(
            key.clone(),
            Entry {
                expires_at,
                last_access,
                seq,
            },
        );
        if let Some(old) = old {
            if old.last_access.is_some() {
                self.resident -= 1;
            }
            if old.expires_at != expires_at {
                if let Some(t) = old.expires_at {
                    self.by_expiry.remove(&(t, key.clone()));
                }
                if let Some(t) = expires_at {
                    self.by_expiry.insert((t, key.clone()));
                }
            }
        } else if let Some(t) = expires_at {
            self.by_expiry.insert((t, key.clone()));
        }
        if last_access.is_some() {
            self.resident += 1;
            self.access.push_back((seq, key.clone()));
        }
        self.compact_if_sparse();
    }

    fn remove(&mut self, key: &K) {
        if let Some(old) = self.entries.remove(key) {
            if old.last_access.is_some() {
                self.resident -= 1;
            }
            if let Some(t) = old.expires_at {
                self.by_expiry.remove(&(t, key.clone()));
            }
        }
    }

    fn take_expired(&mut self, now: Timestamp, out: &mut Vec<K>) {
        while let Some((t, _)) = self.by_expiry.first() {
            if *t > now {
                break;
            }
            if let Some((_, key)) = self.by_expiry.pop_first() {
                if let Some(old) = self.entries.remove(&key)
                    && old.last_access.is_some()
                {
                    self.resident -= 1;
                }
                out.push(key);
            }
        }
    }

    fn next_expiry(&mut self) -> Option<Timestamp> {
        self.by_expiry.first().map(|(t, _)| *t)
    }

    fn oldest_idle(&mut self) -> Option<Timestamp> {
        self.drop_stale_front();
        let (_, key) = self.access.front()?;
        self.entries.get(key).and_then(|e| e.last_access)
    }

    fn take_idle(
        &mut self,
        idle_before: Option<Timestamp>,
        max: usize,
        out: &mut Vec<(K, Timestamp)>,
    ) {
        let mut taken = 0;
        while taken < max {
            self.drop_stale_front();
            let Some((_, key)) = self.access.front() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(key) else {
                break;
            };
            let Some(la) = entry.last_access else { break };
            if idle_before.is_some_and(|b| la >= b) {
                break;
            }
            entry.last_access = None;
            self.resident -= 1;
            if let Some((_, key)) = self.access.pop_front() {
                out.push((key, la));
            }
            taken += 1;
        }
    }

    fn resident(&self) -> usize {
        self.resident
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}
