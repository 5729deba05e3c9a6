//! Redis/Valkey Cluster (`redis_cluster = true`): the slot map of one shard's store, one
//! pipelined connection per master node, and where each command goes.
//!
//! - **Slot map** from `CLUSTER SLOTS` (asked of any connected node, the seed first): 16384
//!   slots, each naming the master that serves it. Fetched on connect, every
//!   [`REFRESH`], and at once after a `MOVED` reply or a node's connection failing (a
//!   failover or a resharding).
//! - **Routing**: a command goes to the master of its key's slot (CRC16 of the key, or of the
//!   part inside the first `{...}`: the limits' keys put the virtual key's name there, so every
//!   script call touches one slot). `MOVED <slot> <ip:port>`: the slot's entry is moved to that
//!   node and the command sent there once more. `ASK <slot> <ip:port>` (a slot being migrated):
//!   `ASKING` and the command are sent to that node, the map is left as it is. `TRYAGAIN`
//!   (a multi-key call while its slot is half migrated) is a store error for that request.
//! - **Nodes**: each master has a [`Node`]: its own connection task (connect, TLS, `AUTH`,
//!   `SCRIPT LOAD`, reconnect with backoff), spawned on the shard's runtime; a node that leaves
//!   the map is retired (its task ends, its waiting calls fail).
//! - **TLS names**: a node is checked against the name it is announced by when that is a host
//!   name, and against the seed's host otherwise (nodes are announced by IP; managed clusters
//!   give every node one certificate for their domain).
//!
//! Owns: [`Cluster`], [`Node`], [`slot`], parsing `CLUSTER SLOTS` and redirections. Must not:
//! decide limits, or know what the commands mean.

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::pipeline::{Fault, Notify, Pipeline};
use super::resp::{self, Arg, Reply};
use super::{open, Conn, Settings, CONNECT_TIMEOUT, MAX_BACKOFF, MIN_BACKOFF};

/// Slots of a Cluster.
pub const SLOTS: usize = 16384;
/// How often the slot map is fetched when nothing asks for it sooner.
pub const REFRESH: Duration = Duration::from_secs(10);
/// Most master nodes followed (a bigger map is refused as hostile).
const MAX_NODES: usize = 256;
/// No node for the slot.
const NONE: u16 = u16::MAX;

/// CRC16/XMODEM of the key's hash tag (or the whole key), mod 16384: the Cluster's slot.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS as u16
}

/// One master node's connection.
pub struct Node {
    pub addr: SocketAddr,
    pub pipe: Pipeline,
    up: Cell<bool>,
    retired: Cell<bool>,
    pub connects: Cell<u64>,
    /// Connections that failed (connect, TLS, AUTH) or broke.
    pub failures: Cell<u64>,
    /// Why its last connection failed (for the store's log line).
    pub reason: RefCell<String>,
}

impl Node {
    pub fn up(&self) -> bool {
        self.up.get()
    }

    /// Connect, handshake, serve, reconnect — until retired. `changed` is notified on every
    /// change of state.
    async fn run(self: Rc<Self>, s: Settings, name: Option<String>, changed: Rc<Notify>) {
        let mut backoff = MIN_BACKOFF;
        while !self.retired.get() {
            let started = Instant::now();
            let fault = match open(&s, self.addr, name.as_deref()).await {
                Ok(c) => {
                    crate::observe::metrics::bump(&self.connects);
                    match c {
                        Conn::Plain(t) => self.serve(&s, t, &changed).await,
                        Conn::Tls(t) => self.serve(&s, *t, &changed).await,
                    }
                }
                Err(why) => {
                    *self.reason.borrow_mut() = why;
                    Fault::Connect
                }
            };
            let _ = fault;
            crate::observe::metrics::bump(&self.failures);
            if self.up.replace(false) {
                changed.notify();
            }
            if self.retired.get() {
                return;
            }
            if started.elapsed() > 4 * MAX_BACKOFF {
                backoff = MIN_BACKOFF;
            }
            monoio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn serve<S>(&self, s: &Settings, stream: S, changed: &Notify) -> Fault
    where
        S: monoio::io::Split + monoio::io::AsyncReadRent + monoio::io::AsyncWriteRent,
    {
        let life = async {
            self.reason.borrow_mut().clear();
            if let Err(why) = handshake(&self.pipe, s).await {
                *self.reason.borrow_mut() = why;
                return Fault::Connect;
            }
            self.up.set(true);
            changed.notify();
            std::future::pending::<Fault>().await
        };
        self.pipe.start();
        let fault = monoio::select! {
            f = self.pipe.serve(stream) => f,
            f = life => f,
        };
        self.pipe.fail(fault);
        if self.reason.borrow().is_empty() {
            *self.reason.borrow_mut() = format!("{}: connection lost", self.addr);
        }
        fault
    }
}

/// One command on `pipe` and its reply until `deadline`.
pub async fn ask(pipe: &Pipeline, args: &[Arg<'_>], deadline: Instant) -> Result<Reply, Fault> {
    let slot = pipe.call(|out| resp::command(out, args))?;
    slot.until(deadline).await.unwrap_or_else(|| {
        pipe.fail(Fault::Timeout);
        Err(Fault::Timeout)
    })
}

/// `AUTH` and `SCRIPT LOAD` on a fresh node connection (a Cluster has database 0 only).
async fn handshake(pipe: &Pipeline, s: &Settings) -> Result<(), String> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let url = &s.url;
    if let Some(pass) = &url.password {
        let r = match &url.username {
            Some(user) => {
                ask(
                    pipe,
                    &[Arg::S("AUTH"), Arg::S(user), Arg::S(pass)],
                    deadline,
                )
                .await
            }
            None => ask(pipe, &[Arg::S("AUTH"), Arg::S(pass)], deadline).await,
        };
        match r {
            Ok(Reply::Simple(_)) => {}
            Ok(other) => return Err(format!("AUTH: {}", text(&other))),
            Err(f) => return Err(format!("AUTH: {}", f.as_str())),
        }
    }
    let r = ask(
        pipe,
        &[
            Arg::S("SCRIPT"),
            Arg::S("LOAD"),
            Arg::S(super::script::SOURCE),
        ],
        deadline,
    )
    .await;
    match r {
        // an error reply is not fatal: EVAL still works (the NOSCRIPT path)
        Ok(_) => Ok(()),
        Err(f) => Err(format!("SCRIPT LOAD: {}", f.as_str())),
    }
}

/// An error reply's text (bounded), for logs.
pub fn text(r: &Reply) -> String {
    match r.error() {
        Some(e) => String::from_utf8_lossy(&e[..e.len().min(200)]).into_owned(),
        None => "unexpected reply".into(),
    }
}

/// Where a reply says the command should have gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirect {
    Moved(u16, SocketAddr),
    Ask(u16, SocketAddr),
}

/// `MOVED 3999 127.0.0.1:6381` / `ASK 3999 127.0.0.1:6381` (`None`: another reply).
pub fn redirect(e: &[u8]) -> Option<Redirect> {
    let e = std::str::from_utf8(e).ok()?;
    let mut parts = e.split(' ');
    let kind = parts.next()?;
    let slot: u16 = parts
        .next()?
        .parse()
        .ok()
        .filter(|&s| usize::from(s) < SLOTS)?;
    let addr = parts.next()?;
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addr = SocketAddr::new(host.parse::<IpAddr>().ok()?, port.parse().ok()?);
    match kind {
        "MOVED" => Some(Redirect::Moved(slot, addr)),
        "ASK" => Some(Redirect::Ask(slot, addr)),
        _ => None,
    }
}

/// `CLUSTER SLOTS` as (first slot, last slot, master address) ranges. `asked`: the address
/// of the node that answered (an empty IP in the reply means it).
pub fn parse_slots(r: &Reply, asked: SocketAddr) -> Result<Vec<(u16, u16, SocketAddr)>, String> {
    let Reply::Array(Some(ranges)) = r else {
        return Err(format!("CLUSTER SLOTS: {}", text(r)));
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Reply::Array(Some(items)) = range else {
            return Err("CLUSTER SLOTS: a range is not an array".into());
        };
        let (Some(lo), Some(hi), Some(Reply::Array(Some(master)))) = (
            items.first().and_then(Reply::int),
            items.get(1).and_then(Reply::int),
            items.get(2),
        ) else {
            return Err("CLUSTER SLOTS: a range without first, last slot and master".into());
        };
        let ok = |v: i64| u16::try_from(v).ok().filter(|&s| usize::from(s) < SLOTS);
        let (Some(lo), Some(hi)) = (ok(lo), ok(hi)) else {
            return Err("CLUSTER SLOTS: a slot out of range".into());
        };
        if lo > hi {
            return Err("CLUSTER SLOTS: a range ends before it starts".into());
        }
        let ip = match master.first() {
            Some(Reply::Bulk(Some(b))) => b.clone(),
            _ => return Err("CLUSTER SLOTS: a master without an address".into()),
        };
        let port = master
            .get(1)
            .and_then(Reply::int)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p > 0)
            .ok_or("CLUSTER SLOTS: a master without a port")?;
        let ip = match ip.as_slice() {
            b"" | b"?" => asked.ip(),
            b => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<IpAddr>().ok())
                .ok_or(
                    "CLUSTER SLOTS: a master announced by a host name (only IPs are followed)",
                )?,
        };
        out.push((lo, hi, SocketAddr::new(ip, port)));
    }
    Ok(out)
}

/// One shard's view of the Cluster.
pub struct Cluster {
    pub nodes: RefCell<Vec<Rc<Node>>>,
    /// slot -> index in `nodes` (`NONE`: unknown).
    slots: RefCell<Vec<u16>>,
    /// A node's state changed, or a redirect asked for a fresh map.
    pub changed: Rc<Notify>,
    pub refresh: Cell<bool>,
    /// `MOVED` and `ASK` replies followed.
    pub redirects: Cell<u64>,
    /// Connections made to nodes that have since been retired.
    retired_connects: Cell<u64>,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            nodes: RefCell::new(Vec::new()),
            slots: RefCell::new(vec![NONE; SLOTS]),
            changed: Rc::new(Notify::default()),
            refresh: Cell::new(false),
            redirects: Cell::new(0),
            retired_connects: Cell::new(0),
        }
    }
}

impl Cluster {
    /// The node for `addr`, created (and its task spawned) if new.
    pub fn node(&self, s: &Settings, addr: SocketAddr) -> Option<Rc<Node>> {
        if let Some(n) = self.nodes.borrow().iter().find(|n| n.addr == addr) {
            return Some(n.clone());
        }
        if self.nodes.borrow().len() >= MAX_NODES {
            return None;
        }
        let node = Rc::new(Node {
            addr,
            pipe: Pipeline::default(),
            up: Cell::new(false),
            retired: Cell::new(false),
            connects: Cell::new(0),
            failures: Cell::new(0),
            reason: RefCell::new(String::new()),
        });
        self.nodes.borrow_mut().push(node.clone());
        // TLS: the seed's host name (nodes are announced by IP)
        let name = s.tls.as_ref().map(|_| s.url.host.clone());
        monoio::spawn(node.clone().run(s.clone(), name, self.changed.clone()));
        Some(node)
    }

    /// The node serving `key`'s slot, if it is known and connected.
    pub fn route(&self, key: &[u8]) -> Option<Rc<Node>> {
        let i = self.slots.borrow()[usize::from(slot(key))];
        let nodes = self.nodes.borrow();
        nodes.get(usize::from(i)).filter(|n| n.up()).cloned()
    }

    /// Follow a `MOVED`: the slot now belongs to `addr`; a fresh map is asked for.
    pub fn moved(&self, s: &Settings, slot: u16, addr: SocketAddr) -> Option<Rc<Node>> {
        let node = self.node(s, addr)?;
        if let Some(i) = self
            .nodes
            .borrow()
            .iter()
            .position(|n| Rc::ptr_eq(n, &node))
        {
            self.slots.borrow_mut()[usize::from(slot)] = i as u16;
        }
        self.refresh.set(true);
        self.changed.notify();
        node.up().then_some(node)
    }

    /// Replace the slot map; nodes no longer in it are retired. Whether every slot is served.
    pub fn apply(&self, s: &Settings, ranges: &[(u16, u16, SocketAddr)]) -> bool {
        let mut table = vec![NONE; SLOTS];
        let mut keep = Vec::new();
        for &(lo, hi, addr) in ranges {
            let Some(node) = self.node(s, addr) else {
                continue;
            };
            keep.push(node.addr);
            let i = self
                .nodes
                .borrow()
                .iter()
                .position(|n| Rc::ptr_eq(n, &node))
                .map_or(NONE, |i| i as u16);
            for t in &mut table[usize::from(lo)..=usize::from(hi)] {
                *t = i;
            }
        }
        // retire the others, keeping indexes stable: rebuild both together
        let old: Vec<Rc<Node>> = self.nodes.borrow().clone();
        let mut nodes = Vec::new();
        let mut remap = vec![NONE; old.len()];
        for (i, n) in old.iter().enumerate() {
            if keep.contains(&n.addr) {
                remap[i] = nodes.len() as u16;
                nodes.push(n.clone());
            } else {
                n.retired.set(true);
                self.retired_connects
                    .set(self.retired_connects.get() + n.connects.get());
                n.pipe.fail(Fault::Down);
            }
        }
        for t in &mut table {
            if *t != NONE {
                *t = remap[usize::from(*t)];
            }
        }
        *self.nodes.borrow_mut() = nodes;
        let full = table.iter().all(|&t| t != NONE);
        *self.slots.borrow_mut() = table;
        full
    }

    /// Whether every mapped node is connected (and the map covers every slot).
    pub fn all_up(&self) -> bool {
        let nodes = self.nodes.borrow();
        self.slots
            .borrow()
            .iter()
            .all(|&t| nodes.get(usize::from(t)).is_some_and(|n| n.up()))
    }

    /// A connected node (to ask for the map), the seed's first.
    pub fn any_up(&self, seed: SocketAddr) -> Option<Rc<Node>> {
        let nodes = self.nodes.borrow();
        nodes
            .iter()
            .find(|n| n.addr == seed && n.up())
            .or_else(|| nodes.iter().find(|n| n.up()))
            .cloned()
    }

    /// Why the store is not usable (first node that is down), for the log.
    pub fn reason(&self) -> String {
        let nodes = self.nodes.borrow();
        match nodes.iter().find(|n| !n.up()) {
            Some(n) => format!("node {}: {}", n.addr, n.reason.borrow()),
            None => "the slot map does not cover every slot".into(),
        }
    }

    /// Failed or broken node connections (live nodes').
    pub fn failures(&self) -> u64 {
        self.nodes.borrow().iter().map(|n| n.failures.get()).sum()
    }

    /// Whether some node's connection has failed (there is a reason to log).
    pub fn failed(&self) -> bool {
        self.nodes.borrow().iter().any(|n| n.failures.get() > 0)
    }

    /// Connections made to nodes, retired ones included.
    pub fn connects(&self) -> u64 {
        self.retired_connects.get()
            + self
                .nodes
                .borrow()
                .iter()
                .map(|n| n.connects.get())
                .sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        // the examples of the Cluster specification and redis' own tests
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"rg:rpm:{team-a}:7"), slot(b"rg:tpm:{team-a}:8"));
        // an empty tag is no tag
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn redirects_and_slot_maps_parse_and_hostile_ones_are_refused() {
        let a: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        assert_eq!(
            redirect(b"MOVED 3999 127.0.0.1:7001"),
            Some(Redirect::Moved(3999, a))
        );
        assert_eq!(redirect(b"ASK 1 127.0.0.1:7001"), Some(Redirect::Ask(1, a)));
        for bad in [
            &b"MOVED 16384 127.0.0.1:7001"[..],
            b"MOVED x h:1",
            b"ERR no",
            b"ASK 1",
        ] {
            assert_eq!(redirect(bad), None);
        }
        let node = |ip: &str, port: i64| {
            Reply::Array(Some(vec![
                Reply::Bulk(Some(ip.as_bytes().to_vec())),
                Reply::Int(port),
                Reply::Bulk(Some(b"id".to_vec())),
            ]))
        };
        let r = Reply::Array(Some(vec![
            Reply::Array(Some(vec![
                Reply::Int(0),
                Reply::Int(100),
                node("127.0.0.1", 7001),
            ])),
            Reply::Array(Some(vec![
                Reply::Int(101),
                Reply::Int(16383),
                node("", 7002),
            ])),
        ]));
        let asked: SocketAddr = "10.0.0.9:7000".parse().unwrap();
        assert_eq!(
            parse_slots(&r, asked).unwrap(),
            vec![(0, 100, a), (101, 16383, "10.0.0.9:7002".parse().unwrap())]
        );
        for bad in [
            Reply::Error(b"ERR This instance has cluster support disabled".to_vec()),
            Reply::Array(Some(vec![Reply::Array(Some(vec![
                Reply::Int(5),
                Reply::Int(1),
                node("127.0.0.1", 1),
            ]))])),
            Reply::Array(Some(vec![Reply::Array(Some(vec![
                Reply::Int(0),
                Reply::Int(16384),
                node("127.0.0.1", 1),
            ]))])),
            Reply::Array(Some(vec![Reply::Array(Some(vec![
                Reply::Int(0),
                Reply::Int(1),
                node("redis.internal", 1),
            ]))])),
        ] {
            assert!(parse_slots(&bad, asked).is_err(), "{bad:?}");
        }
    }
}
