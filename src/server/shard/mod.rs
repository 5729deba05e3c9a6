//! Shards: one pinned thread per core (`thread`: listeners, driver choice, pinning,
//! lifecycle), the per-core state it serves with (`state::Shard`) and its live routing
//! (`routing`: the route table a reload swaps between requests), and the optional idle spin
//! (`spin`: busy-polling the loop briefly before it sleeps).
//!
//! Owns: nothing itself; see the two modules. Must not: handle requests (`pipeline`).

pub mod routing;
pub mod spin;
pub mod state;
mod thread;

pub use state::Shard;
pub use thread::*;
