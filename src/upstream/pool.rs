//! Per-shard keep-alive pool of idle upstream connections keyed by (host, port, TLS), plus the
//! shard's copy of resolved addresses (`resolve::LocalDns`; lookups run off the shard).
//!
//! Owns: idle connections, their age limit, count limit and before-reuse check (nothing
//! pending on the socket): a plain connection enters the pool with one read armed
//! (`Conn::arm`, into the buffer its last exchange read with, at most `ARMED_BUF_MAX`), so a
//! close or stray bytes are seen without a syscall when it is taken; a TLS one is peeked.
//! Must not: be shared across shards (it is `!Send` by design: `RefCell`, no locks).

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::resolve::{self, LocalDns, ResolveError};
pub use crate::config::endpoint::PoolKey;

struct Idle {
    conn: Conn,
    since: Instant,
}

pub struct Pool {
    idle: RefCell<HashMap<PoolKey, Vec<Idle>>>,
    dns: LocalDns,
    max_idle: usize,
    ttl: Duration,
}

impl Pool {
    pub fn new(max_idle: usize, ttl: Duration) -> Pool {
        Pool {
            idle: RefCell::new(HashMap::new()),
            dns: LocalDns::new(resolve::global().clone()),
            max_idle,
            ttl,
        }
    }

    /// Most recently returned idle connection that is not too old and has nothing pending:
    /// a connection with unread bytes (the peer wrote after its response ended) or a close
    /// pending is dropped, never handed out — its bytes would be read as the next answer.
    /// `now`: the caller's clock read, just taken.
    pub fn take(&self, key: &PoolKey, now: Instant) -> Option<Conn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        while let Some(mut i) = list.pop() {
            if now.saturating_duration_since(i.since) < self.ttl && i.conn.is_quiet() {
                return Some(i.conn);
            }
        }
        None
    }

    /// Keep `conn` for reuse; `buf` (the buffer its exchange read with, emptied) becomes its
    /// armed read's buffer unless it is larger than `ARMED_BUF_MAX`.
    pub fn put(&self, key: &PoolKey, conn: Conn, buf: Vec<u8>) {
        let idle = Idle {
            conn: conn.arm(buf),
            since: Instant::now(),
        };
        let mut map = self.idle.borrow_mut();
        // the key is copied (an allocation) only for a host's first idle list
        if let Some(list) = map.get_mut(key) {
            return self.push(list, idle);
        }
        self.push(map.entry(key.clone()).or_default(), idle);
    }

    fn push(&self, list: &mut Vec<Idle>, idle: Idle) {
        if list.len() >= self.max_idle {
            // Drop the oldest: it is the most likely to have been closed by the peer.
            list.remove(0);
        }
        list.push(idle);
    }

    pub fn idle_count(&self) -> usize {
        self.idle.borrow().values().map(Vec::len).sum()
    }

    /// Resolve `host:port` without blocking the shard (see `resolve`): IP literals cost
    /// nothing, names are answered from the shard's copy, the shared cache, or a helper thread
    /// within `deadline`.
    pub async fn resolve(
        &self,
        host: &str,
        port: u16,
        deadline: Duration,
    ) -> Result<SocketAddr, ResolveError> {
        self.dns.resolve(host, port, deadline).await
    }
}
