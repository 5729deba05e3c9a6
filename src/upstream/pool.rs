//! Per-shard keep-alive pool of idle upstream connections keyed by (host, port, TLS), plus a
//! small DNS cache.
//!
//! Owns: idle connections, their age limit, count limit and before-reuse check (nothing
//! pending on the socket); resolved addresses.
//! Must not: be shared across shards (it is `!Send` by design: `RefCell`, no locks).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::conn::Conn;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

pub struct Pool {
    idle: RefCell<HashMap<PoolKey, Vec<Idle>>>,
    dns: RefCell<HashMap<(String, u16), (SocketAddr, Instant)>>,
    max_idle: usize,
    ttl: Duration,
}

/// How long a resolved address is reused.
const DNS_TTL: Duration = Duration::from_secs(60);

impl Pool {
    pub fn new(max_idle: usize, ttl: Duration) -> Pool {
        Pool {
            idle: RefCell::new(HashMap::new()),
            dns: RefCell::new(HashMap::new()),
            max_idle,
            ttl,
        }
    }

    /// Most recently returned idle connection that is not too old and has nothing pending:
    /// a connection with unread bytes (the peer wrote after its response ended) or a close
    /// pending is dropped, never handed out — its bytes would be read as the next answer.
    pub fn take(&self, key: &PoolKey) -> Option<Conn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        while let Some(i) = list.pop() {
            if i.since.elapsed() < self.ttl && i.conn.is_quiet() {
                return Some(i.conn);
            }
        }
        None
    }

    pub fn put(&self, key: &PoolKey, conn: Conn) {
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(key.clone()).or_default();
        if list.len() >= self.max_idle {
            // Drop the oldest: it is the most likely to have been closed by the peer.
            list.remove(0);
        }
        list.push(Idle {
            conn,
            since: Instant::now(),
        });
    }

    pub fn idle_count(&self) -> usize {
        self.idle.borrow().values().map(Vec::len).sum()
    }

    /// Resolve `host:port`. IP literals cost nothing; names are cached for a minute.
    /// Note: a cache miss on a host name resolves synchronously (getaddrinfo) on the shard.
    pub fn resolve(&self, host: &str, port: u16) -> io::Result<SocketAddr> {
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        let key = (host.to_string(), port);
        if let Some((addr, at)) = self.dns.borrow().get(&key) {
            if at.elapsed() < DNS_TTL {
                return Ok(*addr);
            }
        }
        let addr = (host, port).to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"))
        })?;
        self.dns.borrow_mut().insert(key, (addr, Instant::now()));
        Ok(addr)
    }
}
