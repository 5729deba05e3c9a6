//! The process-wide limit counters: per key slot, its `rpm` and `tpm` windows and its in-flight
//! count, shared by every shard (one `Arc<Counters>` per process), so that a key's limits hold
//! for the key whatever shard its connections land on.
//!
//! The table is indexed by the key's stable slot (a key keeps its slot, by name, for the
//! process's life: `registry`) and grows without a lock on the request path: slots live in
//! chunks of doubling size (64, 128, 256, … entries), each allocated once (`OnceLock`) when a
//! keyring with that many keys is installed (`reserve`; off the request path), never moved or
//! freed; a lookup is one `Acquire` load.
//! Entries are one cache line each, so two keys busy on two cores never share a line.
//!
//! In-flight counts are taken by compare-and-swap (never over `max_in_flight`, however many
//! shards race); windows are `window::Window`s (exact the same way). Every count saturates.
//!
//! Owns: `Counters`, `KeyCounters`. Must not: know keys' names or limits (callers pass the
//! limit), or lock on a lookup of an allocated chunk.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use super::lease::Lease;
use super::window::{Clock, Tick, Window};

/// Slots in the first chunk (chunk c holds `FIRST << c`).
const FIRST: u64 = 64;
const FIRST_BITS: u32 = FIRST.trailing_zeros();
/// Enough chunks for every `u32` slot.
const CHUNKS: usize = 33 - FIRST_BITS as usize;

/// One key's counters (one cache line).
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct KeyCounters {
    pub rpm: Window,
    pub tpm: Window,
    in_flight: AtomicU64,
    /// The units of the key's request window this process leased (`mode = "leased"`).
    pub lease: Lease,
}

impl KeyCounters {
    /// Count one more request in flight if fewer than `max` are (`false`: at the limit).
    pub fn enter(&self, max: u64) -> bool {
        self.in_flight
            .fetch_update(Relaxed, Relaxed, |n| (n < max).then(|| n + 1))
            .is_ok()
    }

    /// Count one more request in flight, whatever the count (saturating).
    pub fn enter_anyway(&self) {
        let _ = self
            .in_flight
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_add(1)));
    }

    /// One request in flight ended (never below zero).
    pub fn leave(&self) {
        let _ = self
            .in_flight
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }
}

/// Every key's counters, by slot, and the clock their windows run on.
#[derive(Debug)]
pub struct Counters {
    clock: Clock,
    chunks: [OnceLock<Box<[KeyCounters]>>; CHUNKS],
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            clock: Clock::default(),
            chunks: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

/// (chunk, index in it) of `slot`.
fn place(slot: u32) -> (usize, usize) {
    let v = u64::from(slot) + FIRST;
    let chunk = (63 - v.leading_zeros() - FIRST_BITS) as usize;
    (chunk, (v - (FIRST << chunk)) as usize)
}

impl Counters {
    pub fn new() -> Counters {
        Counters::default()
    }

    /// Now, in the windows' ticks.
    #[inline]
    pub fn now(&self) -> Tick {
        self.clock.now()
    }

    /// Allocate the chunks of the first `slots` slots now (when a keyring is installed), so
    /// that requests never do.
    pub fn reserve(&self, slots: usize) {
        let Some(last) = slots.checked_sub(1) else {
            return;
        };
        let (top, _) = place(u32::try_from(last).unwrap_or(u32::MAX));
        for chunk in 0..=top.min(CHUNKS - 1) {
            self.chunk(chunk);
        }
    }

    fn chunk(&self, chunk: usize) -> &[KeyCounters] {
        self.chunks[chunk.min(CHUNKS - 1)].get_or_init(|| {
            (0..FIRST << chunk)
                .map(|_| KeyCounters::default())
                .collect()
        })
    }

    /// Slot `slot`'s counters (its chunk is allocated on first use, if `reserve` did not).
    #[inline]
    pub fn slot(&self, slot: u32) -> &KeyCounters {
        let (chunk, at) = place(slot);
        let entries = self.chunk(chunk);
        // (always in range: a chunk holds every index `place` gives it)
        &entries[at.min(entries.len() - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_map_to_distinct_entries_across_chunks() {
        assert_eq!(place(0), (0, 0));
        assert_eq!(place(63), (0, 63));
        assert_eq!(place(64), (1, 0));
        assert_eq!(place(191), (1, 127));
        assert_eq!(place(192), (2, 0));
        let (c, at) = place(u32::MAX);
        assert!(c < CHUNKS && (at as u64) < FIRST << c);
        let t = Counters::new();
        t.reserve(200);
        assert!(t.chunks[2].get().is_some() && t.chunks[3].get().is_none());
        for s in [0u32, 1, 63, 64, 65, 191, 192, 5000] {
            t.slot(s).enter_anyway();
        }
        for s in [0u32, 1, 63, 64, 65, 191, 192, 5000] {
            assert_eq!(t.slot(s).in_flight(), 1, "slot {s}");
        }
        assert_eq!(t.slot(2).in_flight(), 0);
        assert_eq!(std::mem::size_of::<KeyCounters>(), 64);
        assert_eq!(std::mem::size_of::<Lease>(), 40);
    }

    #[test]
    fn in_flight_never_passes_its_max_and_never_goes_below_zero() {
        let t = std::sync::Arc::new(Counters::new());
        let k = t.slot(7);
        k.leave();
        assert_eq!(k.in_flight(), 0);
        let admitted: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1000).filter(|_| t.slot(7).enter(100)).count()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
        assert_eq!(k.in_flight(), 100);
    }
}
