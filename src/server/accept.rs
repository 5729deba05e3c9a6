//! The accept policy, one copy for the plain and the TLS listener: what a newly accepted
//! connection is charged, and what happens to it over the caps.
//!
//! Owns: charging a connection from accept (its address's slot under `max_connections` and
//! `max_connections_per_address`, `connection_reserve` of the budget, plus what its transport
//! keeps per connection, e.g. the TLS record buffers) and the verdict — serve it, read its first
//! request to answer a health probe (a few per shard), or refuse it. Must not: read from or
//! write to the connection (each listener serves, probes or refuses by the verdict).

use crate::admit::peer::{Peer, Slot};
use crate::admit::ConnCharge;
use crate::pipeline::shard::Shard;

/// Connections over the caps per shard whose first request is still read (to answer `/healthz`
/// and `/readyz`); more are refused without reading.
pub const OVER_CAP_PROBES: u32 = 8;

/// What a connection holds until it closes: dropping it gives the charge back.
pub struct Held {
    _slot: Slot,
    _reserve: ConnCharge,
    _transport: Option<ConnCharge>,
}

/// The accept policy's verdict on one connection.
pub enum Verdict {
    /// Under the caps: serve it, holding this until it closes.
    Serve(Held),
    /// Over a cap (or its charge does not fit the budget), one of the few probes: read its
    /// first request (health probes are answered, everything else gets the 503).
    Probe,
    /// Over a cap and the probes are taken: refuse it.
    Refuse,
}

/// The verdict on a connection from `peer` whose transport keeps `transport_bytes` more than a
/// plain one (0: plain). A connection whose charge does not fit the budget is treated like one
/// over the cap.
pub fn admit(shard: &Shard, peer: Peer, transport_bytes: u64) -> Verdict {
    let held = shard.peers.enter(peer).and_then(|slot| {
        let reserve = shard.admission.connection().ok()?;
        let transport = match transport_bytes {
            0 => None,
            n => Some(shard.admission.budget().charge_connection(n).ok()?),
        };
        Some(Held {
            _slot: slot,
            _reserve: reserve,
            _transport: transport,
        })
    });
    match held {
        Some(h) => Verdict::Serve(h),
        None if shard.over_cap.get() < OVER_CAP_PROBES => Verdict::Probe,
        None => Verdict::Refuse,
    }
}
