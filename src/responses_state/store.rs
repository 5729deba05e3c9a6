//! The process-wide store of recent Responses output items and responses, per tenant: bounded
//! in bytes, entries living `ttl` after they were stored, evicted oldest first.
//!
//! Why process-wide: a client's next request may land on any shard (`SO_REUSEPORT` spreads
//! connections; an SDK's tool loop opens a new one whenever it likes), so an entry stored by one
//! shard must be found by every other. One `Mutex` guards the map; each hold is one map
//! operation and a few deque pops (no parsing, no allocation beyond the entry itself), measured
//! in `benches/micro.rs` (group `responses_state`).
//!
//! Byte accounting: each entry is charged to the budget of the shard that stored it
//! (`admit::Held`, settled while the lock is held, so the per-shard totals and the charges
//! agree); a shard whose budget cannot take an entry refuses to store it (never a 503). An
//! entry's bytes stay counted until its turn comes to leave the queue, also when a newer entry
//! with the same id replaced it (conservative: never under-charged). Entries evicted by another
//! shard lower the owner's charge at its next store operation or its once-a-second `settle`.
//!
//! Owns: `Store`, its queue and counters. Must not: parse JSON, do IO, or hold the lock across
//! anything but map and queue operations.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::admit::Held;
use crate::dialect::references::PastTurn;

/// Bytes counted per entry on top of its payload: map slot, queue ticket, the id twice.
const ENTRY_OVERHEAD: u64 = 160;

/// What is stored under an id.
#[derive(Debug, Clone)]
pub enum Stored {
    /// One output item (raw JSON), for `item_reference`.
    Item(Arc<[u8]>),
    /// One response's turn, for `previous_response_id`.
    Turn(Arc<PastTurn>),
}

impl Stored {
    fn bytes(&self) -> u64 {
        match self {
            Stored::Item(b) => b.len() as u64,
            Stored::Turn(t) => (t.input.len() + t.output.len()) as u64 + 64,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    tenant: u64,
    response: bool,
    id: Box<str>,
}

struct Slot {
    seq: u64,
    born: Instant,
    value: Stored,
}

/// One entry's place in the queue (oldest first) and what it is charged.
struct Ticket {
    seq: u64,
    key: Key,
    bytes: u64,
    owner: usize,
    born: Instant,
}

/// Counters (for tests, `/metrics` and the bench).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub entries: u64,
    pub bytes: u64,
    pub evicted: u64,
    pub expired: u64,
    /// Entries not stored: larger than the store, or the shard's budget had no room.
    pub refused: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Slot>,
    queue: VecDeque<Ticket>,
    /// Bytes charged per owning shard (sum = `stats.bytes`).
    held: Vec<u64>,
    seq: u64,
    stats: StoreStats,
}

/// The process-wide store (shared by every shard through an `Arc`).
pub struct Store {
    inner: Mutex<Inner>,
    max_bytes: u64,
    ttl: Duration,
}

impl Store {
    /// A store of at most `max_bytes`, entries living `ttl`, for `shards` shards.
    pub fn new(max_bytes: u64, ttl: Duration, shards: usize) -> Store {
        Store {
            inner: Mutex::new(Inner {
                held: vec![0; shards.max(1)],
                ..Inner::default()
            }),
            max_bytes,
            ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding it leaves consistent data (every operation completes
        // its bookkeeping before it can fail): keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counters now.
    pub fn stats(&self) -> StoreStats {
        self.lock().stats
    }

    /// Store `entries` (response flag, id, value) of `tenant`, charged to `shard` through
    /// `held`. All or nothing: false when they are larger than the store or the shard's budget
    /// cannot take them (older entries are evicted to make room within `max_bytes` first).
    pub fn put(
        &self,
        shard: usize,
        held: &Held,
        tenant: u64,
        entries: Vec<(bool, Box<str>, Stored)>,
        now: Instant,
    ) -> bool {
        let cost = |id: &str, v: &Stored| v.bytes() + 2 * id.len() as u64 + ENTRY_OVERHEAD;
        let need: u64 = entries.iter().map(|(_, id, v)| cost(id, v)).sum();
        let mut g = self.lock();
        let inner = &mut *g;
        expire(inner, now, self.ttl);
        if need > self.max_bytes || shard >= inner.held.len() {
            inner.stats.refused += entries.len() as u64;
            return false;
        }
        while inner.stats.bytes + need > self.max_bytes {
            if !pop(inner) {
                break;
            }
            inner.stats.evicted += 1;
        }
        let mine = inner.held[shard];
        if !held.settle(mine + need) {
            held.settle(mine);
            inner.stats.refused += entries.len() as u64;
            return false;
        }
        for (response, id, value) in entries {
            inner.seq += 1;
            let seq = inner.seq;
            let bytes = cost(&id, &value);
            let key = Key {
                tenant,
                response,
                id,
            };
            inner.queue.push_back(Ticket {
                seq,
                key: key.clone(),
                bytes,
                owner: shard,
                born: now,
            });
            inner.map.insert(
                key,
                Slot {
                    seq,
                    born: now,
                    value,
                },
            );
        }
        inner.held[shard] = mine + need;
        inner.stats.bytes += need;
        inner.stats.entries = inner.map.len() as u64;
        true
    }

    /// The live entry `id` of `tenant` (a response when `response`), if any.
    pub fn get(&self, tenant: u64, response: bool, id: &str, now: Instant) -> Option<Stored> {
        let key = Key {
            tenant,
            response,
            id: id.into(),
        };
        let g = self.lock();
        let slot = g.map.get(&key)?;
        (now.saturating_duration_since(slot.born) < self.ttl).then(|| slot.value.clone())
    }

    /// Drop expired entries and bring `shard`'s charge to what it owns now.
    pub fn settle(&self, shard: usize, held: &Held, now: Instant) {
        let mut g = self.lock();
        expire(&mut g, now, self.ttl);
        if let Some(&mine) = g.held.get(shard) {
            held.settle(mine);
        }
    }
}

/// Pop the oldest ticket (its entry leaves the map unless a newer one replaced it).
fn pop(inner: &mut Inner) -> bool {
    let Some(t) = inner.queue.pop_front() else {
        return false;
    };
    if inner.map.get(&t.key).is_some_and(|s| s.seq == t.seq) {
        inner.map.remove(&t.key);
    }
    if let Some(h) = inner.held.get_mut(t.owner) {
        *h = h.saturating_sub(t.bytes);
    }
    inner.stats.bytes = inner.stats.bytes.saturating_sub(t.bytes);
    inner.stats.entries = inner.map.len() as u64;
    true
}

fn expire(inner: &mut Inner, now: Instant, ttl: Duration) {
    while inner
        .queue
        .front()
        .is_some_and(|t| now.saturating_duration_since(t.born) >= ttl)
    {
        pop(inner);
        inner.stats.expired += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admit::Budget;

    fn item(n: usize) -> Stored {
        Stored::Item(vec![b'x'; n].into())
    }

    #[test]
    fn evicts_oldest_first_and_charges_the_owner() {
        let b = Budget::new(1 << 20, 4, 0);
        let held = Held::new(&b, 0);
        let s = Store::new(1000, Duration::from_secs(60), 2);
        let t0 = Instant::now();
        assert!(s.put(0, &held, 1, vec![(false, "a".into(), item(300))], t0));
        assert!(s.put(0, &held, 1, vec![(false, "b".into(), item(300))], t0));
        assert_eq!(b.used(), s.stats().bytes);
        // a third does not fit in 1000: the oldest goes
        assert!(s.put(0, &held, 1, vec![(false, "c".into(), item(300))], t0));
        assert!(s.get(1, false, "a", t0).is_none());
        assert!(s.get(1, false, "b", t0).is_some());
        assert_eq!(s.stats().evicted, 1);
        assert_eq!(b.used(), s.stats().bytes);
        // tenants and kinds are separate namespaces
        assert!(s.get(2, false, "b", t0).is_none());
        assert!(s.get(1, true, "b", t0).is_none());
        // larger than the whole store: refused, nothing evicted
        assert!(!s.put(0, &held, 1, vec![(false, "d".into(), item(5000))], t0));
        assert!(s.get(1, false, "c", t0).is_some());
    }

    #[test]
    fn ttl_and_budget_refusal() {
        let b = Budget::new(2000, 4, 0);
        let held = Held::new(&b, 1500);
        let s = Store::new(1 << 20, Duration::from_secs(10), 1);
        let t0 = Instant::now();
        assert!(s.put(0, &held, 1, vec![(false, "a".into(), item(100))], t0));
        // the budget keeps its headroom: refused, never a rejection counted
        assert!(!s.put(0, &held, 1, vec![(false, "b".into(), item(400))], t0));
        assert_eq!(s.stats().refused, 1);
        assert_eq!(b.rejections(crate::admit::Reject::Budget), 0);
        let later = t0 + Duration::from_secs(11);
        assert!(s.get(1, false, "a", later).is_none());
        s.settle(0, &held, later);
        assert_eq!((b.used(), s.stats().bytes, s.stats().expired), (0, 0, 1));
    }

    #[test]
    fn another_shards_eviction_is_settled_later() {
        let b0 = Budget::new(1 << 20, 4, 0);
        let b1 = Budget::new(1 << 20, 4, 0);
        let (h0, h1) = (Held::new(&b0, 0), Held::new(&b1, 0));
        let s = Store::new(700, Duration::from_secs(60), 2);
        let t0 = Instant::now();
        assert!(s.put(0, &h0, 7, vec![(false, "a".into(), item(300))], t0));
        assert!(s.put(1, &h1, 7, vec![(false, "b".into(), item(300))], t0));
        // shard 1 evicted shard 0's entry: shard 0 still holds its charge until it settles
        assert!(b0.used() > 0);
        s.settle(0, &h0, t0);
        assert_eq!((h0.bytes(), b0.used()), (0, 0));
        assert_eq!(h1.bytes(), s.stats().bytes);
    }
}
