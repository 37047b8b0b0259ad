//! Node sessions in a slab indexed by a small integer, and a node-id index that holds
//! only those integers.
//!
//! A shard holds every node's session for as long as the node lives, so the bytes
//! spent per node matter at a million nodes. A session lives inline in a fixed-size
//! chunk of the slab (no allocation, no reference count per node); the session id a
//! node's heartbeats carry names its slot in its low bits, so a heartbeat finds its
//! session without a hash lookup; and the index from node id to slot stores a `u32`
//! per node, hashing the node id kept in the slot itself.

use std::hash::BuildHasher;

use hashbrown::HashTable;

/// Slots per chunk. Chunks are never moved or freed, so growing the slab never copies
/// the sessions it holds, and no more than one partly used chunk is ever spare.
const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;

/// Bits of a session id that name the slot; the rest are random, so a session id is
/// never reused for another session in practice (2^38 values per slot).
pub const SLOT_BITS: u32 = 26;
/// Most sessions one shard can hold at once.
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;

/// The slot a session id names.
pub fn slot_of(session_id: u64) -> u32 {
    (session_id & (MAX_SLOTS as u64 - 1)) as u32
}

/// A session id for `slot`: a random non-zero tag above the slot bits.
pub fn session_id_for(slot: u32, random: u64) -> u64 {
    let tag = (random >> SLOT_BITS).max(1);
    (tag << SLOT_BITS) | u64::from(slot)
}

/// A slab of `T` in fixed-size chunks; freed slots are reused first.
pub struct Slab<T> {
    chunks: Vec<Box<[Option<T>]>>,
    free: Vec<u32>,
    /// Slots ever handed out (the high-water mark).
    next: u32,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { chunks: Vec::new(), free: Vec::new(), next: 0, len: 0 }
    }
}

impl<T> Slab<T> {
    /// Stores `value` in a free slot and returns the slot; `None` when the slab is full.
    pub fn insert(&mut self, value: T) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                if self.next as usize >= MAX_SLOTS {
                    return None;
                }
                let s = self.next;
                self.next += 1;
                if (s as usize) >> CHUNK_BITS == self.chunks.len() {
                    self.chunks.push((0..CHUNK).map(|_| None).collect());
                }
                s
            }
        };
        let cell = &mut self.chunks[(slot as usize) >> CHUNK_BITS][(slot as usize) & (CHUNK - 1)];
        debug_assert!(cell.is_none(), "a free slot is empty");
        *cell = Some(value);
        self.len += 1;
        Some(slot)
    }

    /// The slot the next [`Slab::insert`] fills; `None` when the slab is full.
    pub fn vacant_slot(&self) -> Option<u32> {
        match self.free.last() {
            Some(&s) => Some(s),
            None => ((self.next as usize) < MAX_SLOTS).then_some(self.next),
        }
    }

    pub fn get(&self, slot: u32) -> Option<&T> {
        self.chunks.get((slot as usize) >> CHUNK_BITS)?[(slot as usize) & (CHUNK - 1)].as_ref()
    }

    /// Asks the CPU to bring `slot`'s value into cache, without reading it: a batch of
    /// heartbeats names its sessions first, so their (randomly placed) slots load while
    /// the ones before are handled.
    pub fn prefetch(&self, slot: u32) {
        let Some(chunk) = self.chunks.get((slot as usize) >> CHUNK_BITS) else { return };
        let cell: *const Option<T> = &chunk[(slot as usize) & (CHUNK - 1)];
        flotilla_core::prefetch_value(cell);
    }

    pub fn get_mut(&mut self, slot: u32) -> Option<&mut T> {
        self.chunks.get_mut((slot as usize) >> CHUNK_BITS)?[(slot as usize) & (CHUNK - 1)].as_mut()
    }

    /// Empties `slot`, returning what it held; the slot is handed out again later.
    pub fn remove(&mut self, slot: u32) -> Option<T> {
        let cell = self.chunks.get_mut((slot as usize) >> CHUNK_BITS)?.get_mut((slot as usize) & (CHUNK - 1))?;
        let value = cell.take()?;
        self.free.push(slot);
        self.len -= 1;
        Some(value)
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

/// An index from a key each value carries (its node id) to the value's slot. It stores
/// only slot numbers: hashing and comparing read the key from the slab.
pub struct SlotIndex<S = std::hash::RandomState> {
    table: HashTable<u32>,
    hasher: S,
}

impl Default for SlotIndex {
    fn default() -> Self {
        SlotIndex { table: HashTable::new(), hasher: std::hash::RandomState::new() }
    }
}

impl<S: BuildHasher> SlotIndex<S> {
    /// The slot whose value has key `key`.
    pub fn find<T>(&self, slab: &Slab<T>, key: &str, key_of: impl Fn(&T) -> &str) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        self.table.find(hash, |&s| slab.get(s).is_some_and(|v| key_of(v) == key)).copied()
    }

    /// Records `slot` (which holds a value with key `key`, not yet indexed).
    pub fn insert<T>(&mut self, slab: &Slab<T>, slot: u32, key: &str, key_of: impl Fn(&T) -> &str) {
        let hash = self.hasher.hash_one(key);
        let hasher = &self.hasher;
        self.table.insert_unique(hash, slot, |&s| slab.get(s).map_or(0, |v| hasher.hash_one(key_of(v))));
    }

    /// Forgets `slot`, indexed under `key`. Call before the slot is emptied.
    pub fn remove(&mut self, key: &str, slot: u32) -> bool {
        let hash = self.hasher.hash_one(key);
        match self.table.find_entry(hash, |&s| s == slot) {
            Ok(e) => {
                e.remove();
                true
            }
            Err(_) => false,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_after_removal_and_never_shared() {
        let mut s = Slab::default();
        assert_eq!(s.vacant_slot(), Some(0));
        let a = s.insert("a").unwrap();
        let b = s.insert("b").unwrap();
        assert_ne!(a, b);
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None, "a slot is emptied once");
        assert_eq!(s.get(a), None);
        assert_eq!(s.vacant_slot(), Some(a));
        let c = s.insert("c").unwrap();
        assert_eq!(c, a, "a freed slot is handed out again");
        assert_eq!((s.get(b), s.get(c), s.len()), (Some(&"b"), Some(&"c"), 2));
        assert_eq!(s.get(999_999), None, "a slot past the end holds nothing");
        assert_eq!(s.remove(999_999), None);
    }

    #[test]
    fn the_slab_grows_by_whole_chunks_without_moving_values() {
        let mut s = Slab::default();
        let first = s.insert(0usize).unwrap();
        let p = s.get(first).unwrap() as *const usize;
        for i in 1..(3 * CHUNK + 5) {
            assert_eq!(s.insert(i), Some(i as u32));
        }
        assert_eq!(s.chunks.len(), 4);
        assert_eq!(p, s.get(first).unwrap() as *const usize, "growing never moved a value");
        *s.get_mut(7).unwrap() += 100;
        assert_eq!(s.get(7), Some(&107));
        assert_eq!(s.len(), 3 * CHUNK + 5);
    }

    #[test]
    fn session_ids_name_their_slot_and_are_never_zero() {
        for (slot, random) in [(0, 0), (5, u64::MAX), ((MAX_SLOTS - 1) as u32, 12345 << 40)] {
            let sid = session_id_for(slot, random);
            assert_ne!(sid, 0);
            assert_eq!(slot_of(sid), slot);
        }
        assert_ne!(session_id_for(3, 1 << 40), session_id_for(3, 2 << 40));
    }

    #[test]
    fn the_index_follows_inserts_and_removals() {
        let mut slab: Slab<Named> = Slab::default();
        let mut idx = SlotIndex::default();
        struct Named(String);
        fn key(v: &Named) -> &str {
            v.0.as_str()
        }
        let mut slots = Vec::new();
        for i in 0..10_000 {
            let name = format!("node-{i}");
            let s = slab.insert(Named(name.clone())).unwrap();
            idx.insert(&slab, s, &name, key);
            slots.push(s);
        }
        assert_eq!(idx.len(), 10_000);
        for (i, &s) in slots.iter().enumerate() {
            assert_eq!(idx.find(&slab, &format!("node-{i}"), key), Some(s));
        }
        assert_eq!(idx.find(&slab, "node-x", key), None);
        // Remove every other node; the rest stay found, the removed are gone.
        for (i, &s) in slots.iter().enumerate().step_by(2) {
            assert!(idx.remove(&format!("node-{i}"), s));
            slab.remove(s);
        }
        assert!(!idx.remove("node-0", slots[0]), "removed once");
        for (i, &s) in slots.iter().enumerate() {
            let found = idx.find(&slab, &format!("node-{i}"), key);
            assert_eq!(found, (i % 2 == 1).then_some(s));
        }
        // Reused slots under new keys are found by the new keys only.
        let s = slab.insert(Named("fresh".into())).unwrap();
        idx.insert(&slab, s, "fresh", key);
        assert_eq!(idx.find(&slab, "fresh", key), Some(s));
        assert_eq!(idx.len(), slab.len());
    }
}
