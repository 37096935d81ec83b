//! Maps keyed by request id or token.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes request ids and tokens (sequential integers) by a multiplication: cheap, and spread
/// well enough for a table keyed by them.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by request id or token.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A map keyed by request id (or token): mostly sequential keys, most of them taken out soon and
/// in about the order they came. A key's place is `key & mask` in a power-of-two array, kept at
/// least twice the number of entries in it (so that a key mostly finds its place free, and no
/// hashing or probing is needed); a key whose place is taken (by an older key still waiting, an
/// acquire queued for long) moves that older one out to a hash map, looked in only when it is
/// not empty.
pub(crate) struct IdTable<V> {
    slots: Vec<Option<(u64, V)>>,
    /// Entries in `slots`.
    in_slots: usize,
    overflow: IdMap<V>,
}

impl<V> Default for IdTable<V> {
    fn default() -> Self {
        IdTable { slots: Vec::new(), in_slots: 0, overflow: IdMap::default() }
    }
}

impl<V> IdTable<V> {
    /// The smallest array made.
    const MIN_SLOTS: usize = 64;

    fn place(&self, key: u64) -> usize {
        // The length is a power of two (or zero, then `get` misses).
        (key as usize) & self.slots.len().wrapping_sub(1)
    }

    pub fn len(&self) -> usize {
        self.in_slots + self.overflow.len()
    }

    #[inline]
    pub fn insert(&mut self, key: u64, value: V) {
        if 2 * (self.in_slots + 1) > self.slots.len() {
            self.grow();
        }
        let i = self.place(key);
        let slot = &mut self.slots[i];
        if slot.is_none() && self.overflow.is_empty() {
            // The usual case: written in place, nothing to move out.
            *slot = Some((key, value));
            self.in_slots += 1;
        } else {
            self.insert_slow(i, key, value);
        }
    }

    #[cold]
    fn insert_slow(&mut self, i: usize, key: u64, value: V) {
        // The same key is never in both: a key in `overflow` put back in its place leaves it.
        self.overflow.remove(&key);
        match self.slots[i].replace((key, value)) {
            None => self.in_slots += 1,
            Some((k, _)) if k == key => {}
            Some((k, v)) => drop(self.overflow.insert(k, v)),
        }
    }

    /// Doubles the array (at least to [`MIN_SLOTS`](Self::MIN_SLOTS)). Keys in different places
    /// of the old array are in different places of the new one.
    fn grow(&mut self) {
        let size = (2 * self.slots.len()).max(Self::MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, Vec::with_capacity(size));
        self.slots.resize_with(size, || None);
        for (k, v) in old.into_iter().flatten() {
            let i = self.place(k);
            self.slots[i] = Some((k, v));
        }
    }

    pub fn get(&self, key: u64) -> Option<&V> {
        match self.slots.get(self.place(key)) {
            Some(Some((k, v))) if *k == key => Some(v),
            _ if self.overflow.is_empty() => None,
            _ => self.overflow.get(&key),
        }
    }

    pub fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        let i = self.place(key);
        match self.slots.get_mut(i) {
            Some(Some((k, v))) if *k == key => Some(v),
            _ if self.overflow.is_empty() => None,
            _ => self.overflow.get_mut(&key),
        }
    }

    pub fn contains_key(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    #[inline]
    pub fn remove(&mut self, key: u64) -> Option<V> {
        let i = self.place(key);
        if let Some(slot) = self.slots.get_mut(i)
            && slot.as_ref().is_some_and(|(k, _)| *k == key)
        {
            self.in_slots -= 1;
            return slot.take().map(|(_, v)| v);
        }
        if self.overflow.is_empty() { None } else { self.overflow.remove(&key) }
    }

    /// [`remove`](IdTable::remove), dropping the value where it is (a large one is not moved
    /// out first); returns whether it was there.
    #[inline]
    pub fn delete(&mut self, key: u64) -> bool {
        let i = self.place(key);
        if let Some(slot) = self.slots.get_mut(i)
            && slot.as_ref().is_some_and(|(k, _)| *k == key)
        {
            self.in_slots -= 1;
            *slot = None;
            return true;
        }
        !self.overflow.is_empty() && self.overflow.remove(&key).is_some()
    }

    /// The entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        let slots = self.slots.iter().filter_map(|s| s.as_ref().map(|(k, v)| (*k, v)));
        slots.chain(self.overflow.iter().map(|(k, v)| (*k, v)))
    }

    /// The entries, in no particular order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut V)> {
        let slots = self.slots.iter_mut().filter_map(|s| s.as_mut().map(|(k, v)| (*k, v)));
        slots.chain(self.overflow.iter_mut().map(|(k, v)| (*k, v)))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// Keeps the entries for which `keep` says true.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &mut V) -> bool) {
        for slot in &mut self.slots {
            if let Some((k, v)) = slot
                && !keep(*k, v)
            {
                *slot = None;
                self.in_slots -= 1;
            }
        }
        self.overflow.retain(|k, v| keep(*k, v));
    }

    /// Takes every entry out (in no particular order).
    pub fn drain(&mut self) -> Vec<(u64, V)> {
        let mut all: Vec<(u64, V)> = Vec::with_capacity(self.len());
        for slot in &mut self.slots {
            all.extend(slot.take());
        }
        self.in_slots = 0;
        all.extend(self.overflow.drain());
        all
    }
}
