//! The memory store of cached answers: one map for the whole process (a hit on any shard
//! counts), least-recently-used eviction within `max_bytes`, per-entry expiry, purges by model
//! or tenant, and the vectors of semantic entries grouped by (tenant, model, system prompt and
//! tools) for a brute-force cosine search.
//!
//! Every byte an entry holds is also held in the admission budget of the shard that stored it;
//! entries removed here are reported back (`Freed`) so that shard can give the bytes back.
//!
//! Owns: `Store`. Must not: lock (the caller holds one short lock per call), do IO, or read
//! clocks (callers pass `now`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use super::key::Key;
use crate::dialect::Usage;

/// Bytes an entry costs beyond its body, tenant and vector: its map slot, LRU node, `Arc`
/// headers and fields (measured layout, rounded up; see docs/cache.md).
pub const ENTRY_OVERHEAD: u64 = 224;

/// One cached answer.
#[derive(Debug, Clone)]
pub struct Entry {
    pub body: Arc<[u8]>,
    pub tenant: Arc<str>,
    pub model: Arc<str>,
    pub usage: Usage,
    pub expires: Instant,
    /// The shard whose budget holds this entry's bytes.
    pub owner: usize,
    /// Semantic entries: the group (tenant, model, dialect, system prompt, tools) and the
    /// normalised embedding of the last user message.
    pub semantic: Option<(Key, Arc<[f32]>)>,
}

impl Entry {
    /// What the entry costs in bytes.
    pub fn size(&self) -> u64 {
        ENTRY_OVERHEAD
            + self.body.len() as u64
            + self.tenant.len() as u64
            + self.model.len() as u64
            + self
                .semantic
                .as_ref()
                .map_or(0, |(_, v)| 4 * v.len() as u64)
    }
}

/// A semantic group's member: its entry's key and vector.
type Member = (Key, Arc<[f32]>);

/// Bytes an entry owned by a shard gave back (the shard releases them from its budget).
pub type Freed = (usize, u64);

struct Slot {
    entry: Entry,
    size: u64,
    tick: u64,
}

/// The map, the LRU order and the byte count.
#[derive(Default)]
pub struct Store {
    map: HashMap<Key, Slot>,
    lru: BTreeMap<u64, Key>,
    /// Semantic groups: each entry's key and vector, inline (the search reads no map).
    groups: HashMap<Key, Vec<Member>>,
    tick: u64,
    bytes: u64,
    pub evictions: u64,
}

impl Store {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The live entry under `k`, marked recently used; an expired one is removed.
    pub fn get(&mut self, k: &Key, now: Instant, freed: &mut Vec<Freed>) -> Option<Entry> {
        let expired = self.map.get(k)?.entry.expires <= now;
        if expired {
            freed.extend(self.remove(k));
            return None;
        }
        self.tick += 1;
        let tick = self.tick;
        let slot = self.map.get_mut(k)?;
        self.lru.remove(&slot.tick);
        slot.tick = tick;
        self.lru.insert(tick, *k);
        Some(slot.entry.clone())
    }

    /// Store `e` under `k` (replacing what was there), evicting the least recently used
    /// entries until the store holds at most `max_bytes`. False (nothing stored) when `e`
    /// alone is larger than `max_bytes`.
    pub fn insert(&mut self, k: Key, e: Entry, max_bytes: u64, freed: &mut Vec<Freed>) -> bool {
        let size = e.size();
        if size > max_bytes {
            return false;
        }
        freed.extend(self.remove(&k));
        while self.bytes + size > max_bytes {
            match self.lru.first_key_value().map(|(_, k)| *k) {
                Some(old) => {
                    freed.extend(self.remove(&old));
                    self.evictions += 1;
                }
                None => break,
            }
        }
        self.tick += 1;
        if let Some((g, v)) = &e.semantic {
            self.groups.entry(*g).or_default().push((k, v.clone()));
        }
        self.lru.insert(self.tick, k);
        self.bytes += size;
        self.map.insert(
            k,
            Slot {
                entry: e,
                size,
                tick: self.tick,
            },
        );
        true
    }

    /// Remove `k`; the bytes its owner gets back.
    pub fn remove(&mut self, k: &Key) -> Option<Freed> {
        let slot = self.map.remove(k)?;
        self.lru.remove(&slot.tick);
        self.bytes = self.bytes.saturating_sub(slot.size);
        if let Some((g, _)) = &slot.entry.semantic {
            if let Some(list) = self.groups.get_mut(g) {
                list.retain(|(x, _)| x != k);
                if list.is_empty() {
                    self.groups.remove(g);
                }
            }
        }
        Some((slot.entry.owner, slot.size))
    }

    /// Remove every entry `pred` selects; how many.
    pub fn purge(&mut self, pred: impl Fn(&Entry) -> bool, freed: &mut Vec<Freed>) -> usize {
        let keys: Vec<Key> = self
            .map
            .iter()
            .filter(|(_, s)| pred(&s.entry))
            .map(|(k, _)| *k)
            .collect();
        for k in &keys {
            freed.extend(self.remove(k));
        }
        keys.len()
    }

    /// Evict the least recently used entries held by `owner` until `need` bytes came back (or
    /// it holds none).
    pub fn shed(&mut self, owner: usize, need: u64, freed: &mut Vec<Freed>) {
        let mut got = 0;
        let victims: Vec<Key> = self
            .lru
            .values()
            .filter(|k| self.map.get(*k).is_some_and(|s| s.entry.owner == owner))
            .take_while(|k| {
                let before = got;
                got += self.map.get(*k).map_or(0, |s| s.size);
                before < need
            })
            .copied()
            .collect();
        for k in victims {
            freed.extend(self.remove(&k));
            self.evictions += 1;
        }
    }

    /// The entry of `group` whose vector is closest to `v` (both normalised) by cosine
    /// similarity, with its score: brute force over the group's vectors, kept inline (an
    /// expired best is found expired by the `get` that follows: a miss).
    pub fn nearest(&self, group: &Key, v: &[f32]) -> Option<(Key, f32)> {
        let mut best: Option<(Key, f32)> = None;
        for (k, w) in self.groups.get(group)? {
            if w.len() != v.len() {
                continue;
            }
            let score = dot(w, v);
            if best.is_none_or(|(_, b)| score > b) {
                best = Some((*k, score));
            }
        }
        best
    }
}

/// Dot product in eight independent lanes (the compiler vectorises it; a plain `sum` over a
/// zip is one serial dependency chain).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, p), q) in acc.iter_mut().zip(x).zip(y) {
            *s += p * q;
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(body: usize, owner: usize, now: Instant) -> Entry {
        Entry {
            body: vec![b'x'; body].into(),
            tenant: "t".into(),
            model: "m".into(),
            usage: Usage::default(),
            expires: now + Duration::from_secs(60),
            owner,
            semantic: None,
        }
    }

    fn key(i: u8) -> Key {
        [i; 16]
    }

    #[test]
    fn lru_eviction_keeps_bytes_under_max() {
        let now = Instant::now();
        let mut s = Store::default();
        let mut freed = Vec::new();
        let size = entry(1000, 0, now).size();
        let max = size * 3;
        for i in 0..3 {
            assert!(s.insert(key(i), entry(1000, 0, now), max, &mut freed));
        }
        // touch 0: 1 is now the least recently used
        assert!(s.get(&key(0), now, &mut freed).is_some());
        assert!(s.insert(key(3), entry(1000, 1, now), max, &mut freed));
        assert!(s.bytes() <= max);
        assert!(s.get(&key(1), now, &mut freed).is_none());
        assert!(s.get(&key(0), now, &mut freed).is_some());
        assert_eq!(freed, vec![(0, size)]);
        assert_eq!(s.evictions, 1);
        // larger than the whole store: refused
        assert!(!s.insert(key(9), entry(10 * max as usize, 0, now), max, &mut freed));
    }

    #[test]
    fn expiry_purge_and_shed() {
        let now = Instant::now();
        let mut s = Store::default();
        let mut freed = Vec::new();
        let mut e = entry(10, 0, now);
        e.expires = now;
        s.insert(key(1), e, 1 << 20, &mut freed);
        assert!(s.get(&key(1), now, &mut freed).is_none());
        assert_eq!(s.bytes(), 0);
        for i in 0..4 {
            s.insert(
                key(i),
                entry(10, (i % 2) as usize, now),
                1 << 20,
                &mut freed,
            );
        }
        freed.clear();
        s.shed(1, 1, &mut freed);
        assert_eq!(freed.len(), 1);
        assert_eq!(freed[0].0, 1);
        assert_eq!(s.purge(|e| e.owner == 0, &mut freed), 2);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn nearest_in_group() {
        let now = Instant::now();
        let mut s = Store::default();
        let mut freed = Vec::new();
        let g = key(7);
        for (i, v) in [[1.0f32, 0.0], [0.6, 0.8]].iter().enumerate() {
            let mut e = entry(10, 0, now);
            e.semantic = Some((g, Arc::from(v.to_vec())));
            s.insert(key(i as u8), e, 1 << 20, &mut freed);
        }
        let (k, score) = s.nearest(&g, &[0.8, 0.6]).unwrap();
        assert_eq!(k, key(1));
        assert!((score - 0.96).abs() < 1e-6);
        assert!(s.nearest(&key(8), &[1.0, 0.0]).is_none());
        s.remove(&key(1));
        assert_eq!(s.nearest(&g, &[0.8, 0.6]).unwrap().0, key(0));
        let a: Vec<f32> = (0..21).map(|i| i as f32).collect();
        assert_eq!(dot(&a, &a), (0..21).map(|i| (i * i) as f32).sum::<f32>());
    }
}
