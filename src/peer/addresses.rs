//! Open connections per client address, process-wide (connections from one address land on
//! every shard): `enter` on accept, the returned [`Slot`] gives the place back on drop.
//!
//! Cost: one short mutex hold (one of 16 stripes) on accept and on close — the accept path,
//! never a request. Memory: one entry per address with a connection open (bounded by the
//! connection cap), removed when its last connection closes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Peer;

const STRIPES: usize = 16;

/// Connection counts by address, and the cap (`0`: no cap, nothing is counted).
#[derive(Debug)]
pub struct Addresses {
    cap: u32,
    stripes: [Mutex<HashMap<Peer, u32>>; STRIPES],
}

/// One counted connection of `peer`; dropping it gives the place back (an uncounted one,
/// with no cap, holds nothing).
#[derive(Debug)]
pub struct Slot {
    table: Option<Arc<Addresses>>,
    peer: Peer,
}

impl Addresses {
    pub fn new(cap: u32) -> Arc<Addresses> {
        Arc::new(Addresses {
            cap,
            stripes: Default::default(),
        })
    }

    /// The cap (`0`: off).
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// A place for one more connection of `peer`, or `None` when it has `cap` open already.
    /// With no cap every connection gets one without counting.
    pub fn enter(self: &Arc<Self>, peer: Peer) -> Option<Slot> {
        if self.cap == 0 {
            return Some(Slot { table: None, peer });
        }
        let mut m = self.stripes[peer.stripe(STRIPES)].lock().ok()?;
        let n = m.entry(peer).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(Slot {
            table: Some(self.clone()),
            peer,
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
        let Some(table) = &self.table else { return };
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
        let t = Addresses::new(2);
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
        let off = Addresses::new(0);
        let all: Vec<_> = (0..10).filter_map(|_| off.enter(a)).collect();
        assert_eq!((all.len(), off.open(a)), (10, 0));
    }
}
