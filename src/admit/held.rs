//! A `Held` charge: bytes a long-lived cache keeps on a shard's behalf (the Responses state
//! store, `responses_state`), charged to that shard's budget like request memory.
//!
//! Owns: moving one charge up or down to a target (`settle`), and giving it back on drop.
//! Must not: take an in-flight slot, wait or queue, count a rejection (a cache that does not fit
//! evicts or refuses to store; it never turns into a 503), or cross shards/threads.
//!
//! Headroom: a growth is allowed only while it leaves `headroom` bytes of the budget free, so a
//! cache never takes the room the next requests need.

use std::cell::Cell;
use std::fmt;

use super::budget::Budget;

/// Bytes of one shard's budget held by a cache; returned on drop.
pub struct Held {
    budget: Budget,
    bytes: Cell<u64>,
    headroom: u64,
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("bytes", &self.bytes.get())
            .field("headroom", &self.headroom)
            .finish()
    }
}

impl Held {
    /// An empty charge on `budget` that never grows into its last `headroom` bytes.
    pub fn new(budget: &Budget, headroom: u64) -> Held {
        Held {
            budget: budget.clone(),
            bytes: Cell::new(0),
            headroom,
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.bytes.get()
    }

    /// Move the charge to `target` bytes. Shrinking always succeeds; growing succeeds when the
    /// budget keeps `headroom` free afterwards. False (and the charge unchanged) otherwise.
    pub fn settle(&self, target: u64) -> bool {
        let now = self.bytes.get();
        if target <= now {
            self.budget.release(now - target, 0);
            self.bytes.set(target);
            return true;
        }
        let extra = target - now;
        if extra.saturating_add(self.headroom) > self.budget.available() {
            return false;
        }
        match self.budget.try_grow(extra) {
            Ok(()) => {
                self.bytes.set(target);
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.release(self.bytes.get(), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settles_within_headroom_and_returns_on_drop() {
        let b = Budget::new(1000, 4, 0);
        let h = Held::new(&b, 200);
        assert!(h.settle(700));
        assert_eq!(b.used(), 700);
        assert!(!h.settle(900), "would leave less than the headroom");
        assert_eq!((h.bytes(), b.used()), (700, 700));
        assert_eq!(b.rejections(crate::admit::Reject::Budget), 0);
        assert!(h.settle(100));
        assert_eq!(b.used(), 100);
        drop(h);
        assert_eq!(b.used(), 0);
    }
}
