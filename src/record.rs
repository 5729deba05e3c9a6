//! The end of a request: its `Trace` counted into the shard's request metrics (and, when on,
//! written to the access log).
//!
//! Owns: `request_ended`. Must not: do IO or block (the access log only queues a line).

use std::time::Instant;

use crate::shard::Shard;
use crate::trace::Trace;

/// Count the request `t` that ended now with `status`.
pub fn request_ended(shard: &Shard, t: &Trace, status: u16) {
    let now = Instant::now();
    let provider = t.served.and_then(|(r, d)| {
        let dep = shard
            .routes
            .route(r as usize)?
            .deployments
            .get(d as usize)?;
        Some(dep.provider.index as u32)
    });
    shard.metrics.requests.observe(t, status, provider, now);
}
