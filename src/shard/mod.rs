//! Shards: one pinned thread per core (`thread`: listeners, driver choice, pinning,
//! lifecycle) and the per-core state it serves with (`state::Shard`).
//!
//! Owns: nothing itself; see the two modules. Must not: handle requests (`pipeline`).

pub mod state;
mod thread;

pub use state::Shard;
pub use thread::*;
