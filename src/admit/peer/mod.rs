//! Per-client-address state shared by every shard and by the admin listener: how many
//! connections each address has open (`addresses`, `server.max_connections_per_address`) and
//! the slowdown of addresses that keep presenting wrong credentials (`slowdown`: API keys on
//! the client listeners, the admin token on the admin listener).
//!
//! An address is the client's IP; IPv6 clients count by their /64 (one host gets a whole /64,
//! so counting single IPv6 addresses would cap nothing) and IPv4-mapped IPv6 addresses as the
//! IPv4 address.
//!
//! Owns: [`Peer`], [`addresses::Addresses`], [`slowdown::Slowdown`]. Must not: be touched on
//! the request path except when keys are checked and a peer has failed (`Slowdown::before`
//! is one relaxed load while nobody has), or grow without bound (both tables are capped).

pub mod addresses;
pub mod slowdown;

use std::net::IpAddr;

pub use addresses::{Addresses, Slot};
pub use slowdown::{Slowdown, Wait};

/// A client address as the per-address tables key it (IPv6 by /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer(u128);

impl Peer {
    pub fn of(ip: IpAddr) -> Peer {
        match ip {
            IpAddr::V4(v4) => Peer(v4.to_ipv6_mapped().to_bits()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Peer::of(IpAddr::V4(v4)),
                None => Peer(v6.to_bits() & !u128::from(u64::MAX)),
            },
        }
    }

    /// A stripe index for tables split to keep lock holders apart.
    fn stripe(self, n: usize) -> usize {
        let h = (self.0 as u64 ^ (self.0 >> 64) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 32) as usize % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_counts_by_slash_64_and_mapped_v4_as_v4() {
        let p = |s: &str| Peer::of(s.parse().unwrap());
        assert_eq!(p("2001:db8:1:2::1"), p("2001:db8:1:2:ffff::9"));
        assert_ne!(p("2001:db8:1:2::1"), p("2001:db8:1:3::1"));
        assert_eq!(p("::ffff:10.0.0.1"), p("10.0.0.1"));
        assert_ne!(p("10.0.0.1"), p("10.0.0.2"));
    }
}
