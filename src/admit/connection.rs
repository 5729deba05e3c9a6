//! A `ConnCharge`: one open client connection's fixed claim on the shard budget.
//!
//! Owns: charging `connection_reserve` bytes (the connection's task state and its head read
//! buffer) when a connection is accepted, and giving them back exactly once when it closes.
//! Must not: take an in-flight slot (a connection is not a request), wait or queue (a
//! connection that does not fit is refused at once), or cross shards/threads.
//!
//! Share: connections hold at most `connection_share` of the budget (default 50 %): however
//! many connections send nothing, the rest stays for requests — with keys on, only requests
//! that passed the key check take permits, so idle unauthenticated connections cannot starve
//! keyed clients. A connection over the share whose first request has a valid key is charged
//! past it (`charge_keyed_connection`, see `pipeline::serve_over_cap`).
//!
//! Why: per-connection memory is paid whether or not the connection carries a request — idle
//! keep-alive connections and connections whose request waits in the block-mode queue hold it
//! too. Charging it makes `used` cover it, so the budget bounds connections and requests
//! together and RSS stays within budget + a fixed overhead however many connections are open
//! (see docs/memory.md). Request memory is charged separately, by `Permit`s.

use std::fmt;

use super::budget::{Budget, Reject};

/// `bytes` of a budget held for one open connection; returned on drop.
pub struct ConnCharge {
    budget: Budget,
    bytes: u64,
}

impl ConnCharge {
    /// Bytes this connection holds in the budget.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl fmt::Debug for ConnCharge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnCharge")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Budget {
    /// Charges `bytes` for one open connection, now or never: no slot, no queueing (it does
    /// not wait behind queued requests, and they do not wait for it), and only while
    /// connections hold at most `connection_limit` (the connection share): the rest of the
    /// budget stays for requests. A refusal is counted as a `budget` rejection.
    pub fn charge_connection(&self, bytes: u64) -> Result<ConnCharge, Reject> {
        if self.connection_bytes().saturating_add(bytes) > self.connection_limit() {
            self.record_rejection(Reject::Budget);
            return Err(Reject::Budget);
        }
        self.charge_keyed_connection(bytes)
    }

    /// [`Budget::charge_connection`] past the connection share, for a connection whose first
    /// request carries a valid key (it may use the part kept for such requests).
    pub fn charge_keyed_connection(&self, bytes: u64) -> Result<ConnCharge, Reject> {
        self.try_grow(bytes)?;
        self.add_connection(bytes);
        Ok(ConnCharge {
            budget: self.clone(),
            bytes,
        })
    }
}

impl Drop for ConnCharge {
    fn drop(&mut self) {
        self.budget.remove_connection(self.bytes);
        self.budget.release(self.bytes, 0);
    }
}

/// Budget charged per TLS connection on top of `connection_reserve`: monoio-rustls's two
/// 16 KiB record buffers and rustls's connection state (measured: see docs/tls.md).
pub const TLS_CONNECTION_EXTRA: u64 = 40 << 10;
