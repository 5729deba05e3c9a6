//! Open client connections, process-wide (connections from one address land on every shard):
//! in all (`server.max_connections`, one count for the process whatever the shard count) and
//! per client address (`server.max_connections_per_address`). `enter` on accept, the returned
//! [`Slot`] gives the places back on drop.
//!
//! Cost: one relaxed compare-and-swap on the process count, and with a per-address cap one
//! short mutex hold (one of 16 stripes), on accept and on close — the accept path, never a
//! request. Memory: one entry per address with a connection open (bounded by the connection
//! cap), removed when its last connection closes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::Peer;

const STRIPES: usize = 16;

/// Connection counts: in all (against `max_total`) and by address (against `cap`; `0`: no
/// per-address cap, addresses are not counted).
#[derive(Debug)]
pub struct Addresses {
    cap: u32,
    max_total: u64,
    total: AtomicU64,
    stripes: [Mutex<HashMap<Peer, u32>>; STRIPES],
}

/// One counted connection of `peer`; dropping it gives its places back (the process count,
/// and the address's when addresses are counted).
#[derive(Debug)]
pub struct Slot {
    table: Arc<Addresses>,
    peer: Peer,
    by_address: bool,
}

impl Addresses {
    /// `cap` per address (`0`: off), `max_total` for the whole process.
    pub fn new(cap: u32, max_total: u64) -> Arc<Addresses> {
        Arc::new(Addresses {
            cap,
            max_total: max_total.max(1),
            total: AtomicU64::new(0),
            stripes: Default::default(),
        })
    }

    /// Connections open in the process (counted ones).
    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }

    /// Whether one more connection fits under `max_connections`.
    pub fn room(&self) -> bool {
        self.total() < self.max_total
    }

    /// One place in the process count, or `None` at `max_connections`.
    fn take_total(&self) -> bool {
        self.total
            .fetch_update(Relaxed, Relaxed, |v| (v < self.max_total).then_some(v + 1))
            .is_ok()
    }

    /// A place for a connection whose first request carried a valid key: under
    /// `max_connections` it is counted, its address too, but the per-address cap does not
    /// refuse it (the cap is there for unauthenticated floods).
    pub fn enter_keyed(self: &Arc<Self>, peer: Peer) -> Option<Slot> {
        if !self.take_total() {
            return None;
        }
        let by_address = self.cap != 0;
        if by_address {
            match self.stripes[peer.stripe(STRIPES)].lock() {
                Ok(mut m) => {
                    let n = m.entry(peer).or_insert(0);
                    *n = n.saturating_add(1);
                }
                Err(_) => {
                    self.total.fetch_sub(1, Relaxed);
                    return None;
                }
            }
        }
        Some(Slot {
            table: self.clone(),
            peer,
            by_address,
        })
    }

    /// The cap (`0`: off).
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// A place for one more connection of `peer`, or `None` when the process has
    /// `max_connections` open or `peer` has `cap` open already. With no per-address cap only
    /// the process count is kept.
    pub fn enter(self: &Arc<Self>, peer: Peer) -> Option<Slot> {
        if !self.take_total() {
            return None;
        }
        if self.cap == 0 {
            return Some(Slot {
                table: self.clone(),
                peer,
                by_address: false,
            });
        }
        let entered = match self.stripes[peer.stripe(STRIPES)].lock() {
            Ok(mut m) => {
                let n = m.entry(peer).or_insert(0);
                let fits = *n < self.cap;
                if fits {
                    *n += 1;
                }
                fits
            }
            Err(_) => false,
        };
        if !entered {
            self.total.fetch_sub(1, Relaxed);
            return None;
        }
        Some(Slot {
            table: self.clone(),
            peer,
            by_address: true,
        })
    }

    /// Connections `peer` has open (counted ones).
    pub fn open(&self, peer: Peer) -> u32 {
        self.stripes[peer.stripe(STRIPES)]
            .lock()
            .map_or(0, |m| m.get(&peer).copied().unwrap_or(0))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let table = &self.table;
        let _ = table
            .total
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(1)));
        if !self.by_address {
            return;
        }
        if let Ok(mut m) = table.stripes[self.peer.stripe(STRIPES)].lock() {
            if let Some(n) = m.get_mut(&self.peer) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&self.peer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_address_and_gives_places_back() {
        let t = Addresses::new(2, 100);
        let (a, b) = (
            Peer::of("10.0.0.1".parse().unwrap()),
            Peer::of("10.0.0.2".parse().unwrap()),
        );
        let s1 = t.enter(a).unwrap();
        let _s2 = t.enter(a).unwrap();
        assert!(t.enter(a).is_none(), "a third from one address");
        assert!(t.enter(b).is_some(), "another address is not affected");
        drop(s1);
        assert_eq!(t.open(a), 1);
        assert!(t.enter(a).is_some());
        let off = Addresses::new(0, 100);
        let all: Vec<_> = (0..10).filter_map(|_| off.enter(a)).collect();
        assert_eq!((all.len(), off.open(a)), (10, 0));
    }

    #[test]
    fn the_process_count_caps_every_address_together() {
        let t = Addresses::new(0, 3);
        let a = Peer::of("10.0.0.1".parse().unwrap());
        let b = Peer::of("10.0.0.2".parse().unwrap());
        let held: Vec<_> = [a, b, a].iter().filter_map(|&p| t.enter(p)).collect();
        assert_eq!((held.len(), t.total()), (3, 3));
        assert!(t.enter(b).is_none() && t.enter_keyed(b).is_none() && !t.room());
        drop(held);
        assert_eq!(t.total(), 0);
        // a keyed connection passes the per-address cap, not the process one
        let capped = Addresses::new(1, 3);
        let _one = capped.enter(a).unwrap();
        assert!(capped.enter(a).is_none());
        let k = capped.enter_keyed(a).unwrap();
        assert_eq!((capped.open(a), capped.total()), (2, 2));
        drop(k);
        assert_eq!((capped.open(a), capped.total()), (1, 1));
        // a refused address gives its process place back
        assert!(capped.enter(a).is_none());
        assert_eq!(capped.total(), 1);
    }
}
