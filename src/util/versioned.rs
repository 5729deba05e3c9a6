//! A process-wide value that changes rarely and is read on every shard: a writer publishes a
//! whole new snapshot (`Arc<T>`), and each shard compares a generation number with one
//! `Relaxed` atomic load when it is about to use its local copy, taking the new snapshot (under
//! the mutex, once per change) only when the number moved.
//!
//! Used by the key directory (`governance::directory`: runtime key changes reach every shard on
//! its next keyed request) and by config hot reload (`reload` publishes the config,
//! `shard::routing` swaps each shard's route table between requests) — anything that must reach
//! every core quickly without putting a lock or a shared write on the request path.
//!
//! Owns: `Versioned<T>` (the snapshot and its generation; a reader keeps the generation of the
//! snapshot it holds and compares). Must not: be written on the request path, or hand out anything but whole snapshots
//! (a reader never sees half of a change).
//!
//! Ordering: `publish` replaces the snapshot and then bumps the generation, both under the
//! mutex; `load` reads both under the same mutex, so the pair it returns is consistent. The
//! generation check itself may be `Relaxed`: a reader that sees the old number one request
//! longer is merely late, and the mutex orders the snapshot it then takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The current snapshot of a `T` and how many times it was replaced.
#[derive(Debug)]
pub struct Versioned<T> {
    generation: AtomicU64,
    current: Mutex<Arc<T>>,
}

impl<T> Versioned<T> {
    pub fn new(value: T) -> Versioned<T> {
        Versioned {
            generation: AtomicU64::new(0),
            current: Mutex::new(Arc::new(value)),
        }
    }

    /// Replace the snapshot; returns the new generation.
    pub fn publish(&self, value: T) -> u64 {
        let mut cur = match self.current.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *cur = Arc::new(value);
        // bumped while the lock is held: `load` never pairs a new number with an old value
        self.generation.fetch_add(1, Ordering::Release) + 1
    }

    /// The generation now (one `Relaxed` load: the per-request check).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// The snapshot and its generation.
    pub fn load(&self) -> (u64, Arc<T>) {
        let cur = match self.current.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        (self.generation.load(Ordering::Acquire), cur.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_whole_snapshots_with_their_generation() {
        let v = Arc::new(Versioned::new((1, "a")));
        let (g0, first) = v.load();
        assert_eq!((g0, *first), (0, (1, "a")));
        assert_eq!(v.publish((2, "b")), 1);
        assert_eq!(v.publish((3, "c")), 2);
        assert_ne!(v.generation(), g0);
        assert_eq!(
            v.load(),
            (2, Arc::new((3, "c"))),
            "the latest, not each step"
        );
        let v2 = v.clone();
        std::thread::spawn(move || {
            v2.publish((4, "d"));
        })
        .join()
        .unwrap();
        assert_eq!(v.load(), (3, Arc::new((4, "d"))));
    }
}
