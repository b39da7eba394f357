//! A slab with generation-tagged keys: entries and hosts are looked up by a
//! `u64` key without hashing, and a key to a freed slot never finds the slot's
//! next occupant. A [`Mirror`] stores values under keys another slab handed
//! out, so two structures behind different locks can share host keys.

/// Values stored by key; see the module documentation.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

fn split(key: u64) -> (usize, u32) {
    // The low half is the index, the high half the generation.
    ((key & u64::from(u32::MAX)) as usize, (key >> 32) as u32)
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Stores `value`; returns its key.
    pub(crate) fn insert(&mut self, value: T) -> u64 {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                // More than 2^32 live values would not fit in memory anyway.
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.value = Some(value);
        (u64::from(slot.generation) << 32) | u64::from(index)
    }

    pub(crate) fn get(&self, key: u64) -> Option<&T> {
        let (index, generation) = split(key);
        self.slots
            .get(index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.value.as_ref())
    }

    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        let (index, generation) = split(key);
        self.slots
            .get_mut(index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.value.as_mut())
    }

    pub(crate) fn remove(&mut self, key: u64) -> Option<T> {
        let (index, generation) = split(key);
        let slot = self
            .slots
            .get_mut(index)
            .filter(|s| s.generation == generation)?;
        let value = slot.value.take()?;
        self.free.push(index as u32);
        Some(value)
    }

    /// Whether no value is stored.
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.len() == self.free.len()
    }

    /// Keys of every stored value.
    pub(crate) fn keys(&self) -> Vec<u64> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.value.is_some())
            .map(|(i, s)| (u64::from(s.generation) << 32) | i as u64)
            .collect()
    }
}

/// Values stored under keys handed out by a [`Slab`] elsewhere; a key finds
/// only the value stored under that very key (same slot and generation).
#[derive(Debug)]
pub(crate) struct Mirror<T> {
    slots: Vec<Option<(u64, T)>>,
}

impl<T> Mirror<T> {
    pub(crate) fn new() -> Self {
        Self { slots: Vec::new() }
    }

    pub(crate) fn get(&self, key: u64) -> Option<&T> {
        match self.slots.get(split(key).0) {
            Some(Some((k, value))) if *k == key => Some(value),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        match self.slots.get_mut(split(key).0) {
            Some(Some((k, value))) if *k == key => Some(value),
            _ => None,
        }
    }

    /// Stores `value` under `key`, replacing whatever its slot held.
    pub(crate) fn insert(&mut self, key: u64, value: T) {
        let index = split(key).0;
        if self.slots.len() <= index {
            self.slots.resize_with(index + 1, || None);
        }
        self.slots[index] = Some((key, value));
    }

    pub(crate) fn remove(&mut self, key: u64) -> Option<T> {
        let slot = self.slots.get_mut(split(key).0)?;
        match slot.take() {
            Some((k, value)) if k == key => Some(value),
            other => {
                *slot = other;
                None
            }
        }
    }

    /// Keys of every stored value.
    pub(crate) fn keys(&self) -> Vec<u64> {
        self.slots.iter().flatten().map(|(k, _)| *k).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_key_does_not_find_the_next_occupant() {
        let mut slab = Slab::new();
        let a = slab.insert("a");
        assert_eq!(slab.remove(a), Some("a"));
        let b = slab.insert("b");
        assert_ne!(a, b);
        assert_eq!(slab.get(a), None);
        assert_eq!(slab.remove(a), None);
        assert_eq!(slab.get(b), Some(&"b"));
        assert_eq!(slab.keys(), vec![b]);
        assert!(!slab.is_empty());
        slab.remove(b);
        assert!(slab.is_empty());
    }

    #[test]
    fn slot_0_hands_out_key_0_once_its_generation_wraps() {
        let mut slab = Slab::new();
        let a = slab.insert("a");
        slab.remove(a);
        slab.slots[0].generation = u32::MAX;
        let b = slab.insert("b");
        assert_eq!(b, 0);
        assert_eq!(slab.get(b), Some(&"b"));
        assert_eq!(slab.get(a), None);
    }

    #[test]
    fn a_mirror_finds_only_the_key_it_was_given() {
        let mut slab = Slab::new();
        let mut mirror = Mirror::new();
        let a = slab.insert(());
        mirror.insert(a, 1);
        *mirror.get_mut(a).unwrap() += 1;
        assert_eq!(mirror.get(a), Some(&2));
        slab.remove(a);
        let b = slab.insert(());
        assert_eq!(mirror.get(b), None);
        assert_eq!(mirror.remove(b), None);
        assert_eq!(mirror.get(a), Some(&2));
        mirror.insert(b, 7);
        assert_eq!(mirror.get(a), None);
        assert_eq!(mirror.keys(), vec![b]);
        assert_eq!(mirror.remove(b), Some(7));
    }
}
