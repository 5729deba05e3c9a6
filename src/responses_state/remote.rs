//! Shared Responses state (`[fleet] share = ["responses"]`): every stored response and output
//! item is also written to the `[limits]` store, so a tool loop whose next step lands on another
//! node finds its `previous_response_id` / `item_reference` there. The process's bounded
//! [`super::store::Store`] stays the cache in front: a node looks there first and reads the
//! store only for what it does not hold.
//!
//! Layout: `<prefix>resp:<tenant, 16 hex>:<r|i>:<id>` → one value (`encode`), `SET … PX <ttl>`
//! (the entry's TTL, `[responses] ttl_s`). The tenant is a fleet-wide digest (see
//! `ShardStore::tenant`): the same key or credential names the same namespace on every node,
//! and never appears itself. Redis's `maxmemory` bounds the store's side; each node's own
//! cache stays within `store_max_bytes`.
//!
//! Reads are `GETRANGE` pieces of `PIECE` bytes (a value may be larger than one RESP bulk the
//! client accepts, `resp::MAX_BULK`), at most `max_entry` bytes in all. What comes back is
//! hostile like any reply: the header, every length, the ids (the id rule of `id_ok`) and the
//! JSON (input and output must be JSON arrays, an item a JSON object) are checked, and a
//! record that fails is refused and counted. Writes are queued on the shard's pipelined
//! connection as tasks of the shard, and the answer's last bytes wait for their replies
//! (`Remote::written`, at most `redis_timeout_ms`): a client's next request, on any node, finds
//! them.
//!
//! Store down, slow (past `redis_timeout_ms`) or a refused record: the node answers from what
//! it holds (the local behaviour), and `ringgate_responses_fleet_*` says how often.
//!
//! Owns: `Remote` (one shard's connection), `RemoteStats`, the value layout. Must not: decide
//! what is stored (that is `ShardStore`), parse Responses JSON beyond validating it, or block
//! the shard.

use std::cell::{Cell, RefCell};
use std::fmt::Write;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::store::Stored;
use crate::dialect::references::PastTurn;
use crate::governance::store::resp::{Arg, Reply};
use crate::governance::store::{Settings, Store};

/// Bytes read per `GETRANGE` (well under `resp::MAX_BULK`).
const PIECE: usize = 32 * 1024;
/// Largest entry written or read, whatever `store_max_bytes` allows.
const MAX_ENTRY: u64 = 8 << 20;
const MAGIC: &[u8; 4] = b"RGR1";
/// Magic, kind, stored-at (Unix ms), total length.
const HEAD: usize = 4 + 1 + 8 + 4;
/// Longest response or item id written to or read from the store.
pub const MAX_ID: usize = 256;

/// An id the store may hold: 1 to `MAX_ID` printable ASCII bytes, no spaces.
pub fn id_ok(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Counters of the fleet's Responses state, whole process (`ringgate_responses_fleet_*`).
#[derive(Debug, Default)]
pub struct RemoteStats {
    /// Entries read from the store (this node did not hold them).
    pub fetched: AtomicU64,
    /// Entries asked for that the store does not hold either.
    pub missing: AtomicU64,
    /// Reads or writes that could not be made (store down, too slow, an error reply): the
    /// node answered with what it holds.
    pub errors: AtomicU64,
    /// Records in the store this node refused (malformed, too large).
    pub refused: AtomicU64,
    /// Entries written to the store.
    pub written: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

/// Count one read or write that could not be made.
pub fn add_error(s: &RemoteStats) {
    add(&s.errors, 1);
}

impl RemoteStats {
    pub fn render(&self, out: &mut String) {
        let help = crate::observe::metrics::help;
        let rows: [(&str, &str, &AtomicU64); 5] = [
            (
                "ringgate_responses_fleet_fetched_total",
                "Responses entries read from the shared store (this node did not hold them).",
                &self.fetched,
            ),
            (
                "ringgate_responses_fleet_missing_total",
                "Responses entries looked up in the shared store that it does not hold.",
                &self.missing,
            ),
            (
                "ringgate_responses_fleet_errors_total",
                "Shared-store reads and writes of Responses state that failed (down, slow, an error): answered with what this node holds.",
                &self.errors,
            ),
            (
                "ringgate_responses_fleet_refused_total",
                "Responses records in the shared store this node refused (malformed or too large).",
                &self.refused,
            ),
            (
                "ringgate_responses_fleet_written_total",
                "Responses entries written to the shared store.",
                &self.written,
            ),
        ];
        for (name, text, v) in rows {
            help(out, name, "counter", text);
            let _ = writeln!(out, "{name} {}", v.load(Ordering::Relaxed));
        }
    }
}

/// What a read found.
#[derive(Debug)]
pub enum Found {
    /// The entry and how long ago it was stored.
    Entry(Stored, Duration),
    /// The store does not hold it (or it expired).
    Missing,
    /// The store could not answer (or its record was refused): local behaviour.
    Failed,
}

/// One shard's connection to the store, for the Responses state.
pub struct Remote {
    store: Store,
    prefix: String,
    ttl: Duration,
    max_entry: u64,
    stats: Arc<RemoteStats>,
    /// Writes started and answered (or failed) on this shard; tasks waiting for them.
    sent: Cell<u64>,
    done: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Remote {
    /// Shard `shard`'s connection; entries live `ttl`, none larger than `max_bytes` (the local
    /// store's size) or `MAX_ENTRY`.
    pub fn new(
        s: Settings,
        shard: usize,
        ttl: Duration,
        max_bytes: u64,
        stats: Arc<RemoteStats>,
    ) -> Remote {
        Remote {
            prefix: format!("{}resp:", s.prefix),
            store: Store::for_user(
                s,
                shard,
                "responses",
                "Responses state is this node's own until it is back",
            ),
            ttl,
            max_entry: max_bytes.min(MAX_ENTRY),
            stats,
            sent: Cell::new(0),
            done: Cell::new(0),
            waiters: RefCell::new(Vec::new()),
        }
    }

    /// Connect and reconnect for as long as the shard runs.
    pub async fn maintain(&self) {
        self.store.maintain(&String::new, &|| {}).await
    }

    /// Whether the connection is up.
    pub fn up(&self) -> bool {
        self.store.up()
    }

    fn key(&self, tenant: u64, response: bool, id: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 20 + id.len());
        let _ = write!(
            k,
            "{}{tenant:016x}:{}:{id}",
            self.prefix,
            if response { 'r' } else { 'i' }
        );
        k
    }

    /// Start the writes of `entries` of `tenant` (each a task on this shard awaiting its
    /// reply; [`Remote::written`] waits for them). Entries too large or with an id the store
    /// does not take are skipped; a store that is down is counted.
    pub fn put(self: &Rc<Self>, tenant: u64, entries: &[(bool, Box<str>, Stored)]) {
        let ms = self.ttl.as_millis().max(1) as u64;
        let at = now_ms();
        for (response, id, value) in entries {
            if !id_ok(id) {
                continue;
            }
            let Some(v) = encode(value, at, self.max_entry) else {
                continue;
            };
            if !self.store.up() {
                add(&self.stats.errors, 1);
                continue;
            }
            let key = self.key(tenant, *response, id);
            self.sent.set(self.sent.get() + 1);
            let me = self.clone();
            monoio::spawn(async move {
                let r = me
                    .store
                    .call(&[
                        Arg::S("SET"),
                        Arg::S(&key),
                        Arg::B(&v),
                        Arg::S("PX"),
                        Arg::U(ms),
                    ])
                    .await;
                let ok = matches!(r, Ok(Reply::Simple(_)));
                add(
                    if ok {
                        &me.stats.written
                    } else {
                        &me.stats.errors
                    },
                    1,
                );
                me.done.set(me.done.get() + 1);
                for w in me.waiters.borrow_mut().drain(..) {
                    w.wake();
                }
            });
        }
    }

    /// Wait (at most `redis_timeout_ms`) until every write started so far is answered: the
    /// answer's last bytes go out after its entries are in the store, so the client's next
    /// request finds them on any node. Nothing pending: no wait.
    pub async fn written(&self) {
        let target = self.sent.get();
        if self.done.get() >= target {
            return;
        }
        let wait = std::future::poll_fn(|cx| {
            if self.done.get() >= target {
                return Poll::Ready(());
            }
            self.waiters.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        });
        let _ = monoio::time::timeout(self.store.timeout(), wait).await;
    }

    /// Read entry `id` of `tenant` (a response when `response`).
    pub async fn get(&self, tenant: u64, response: bool, id: &str) -> Found {
        if !id_ok(id) {
            return Found::Missing;
        }
        let key = self.key(tenant, response, id);
        let mut value: Vec<u8> = Vec::new();
        let mut total = None;
        loop {
            let from = value.len();
            let to = from + PIECE - 1;
            let got = self
                .store
                .call(&[
                    Arg::S("GETRANGE"),
                    Arg::S(&key),
                    Arg::U(from as u64),
                    Arg::U(to as u64),
                ])
                .await;
            let piece = match got {
                Ok(Reply::Bulk(Some(p))) => p,
                Ok(Reply::Bulk(None)) => Vec::new(),
                _ => {
                    add(&self.stats.errors, 1);
                    return Found::Failed;
                }
            };
            if piece.is_empty() {
                if from == 0 {
                    add(&self.stats.missing, 1);
                    return Found::Missing;
                }
                // shorter than its header said (replaced or expired while read): refused
                return self.refused();
            }
            if piece.len() > PIECE {
                return self.refused();
            }
            value.extend_from_slice(&piece);
            if total.is_none() {
                match header(&value) {
                    Some((_, _, t)) if t as u64 <= self.max_entry + HEAD as u64 => {
                        total = Some(t as usize)
                    }
                    _ => return self.refused(),
                }
            }
            let t = total.unwrap_or(0);
            if value.len() > t {
                return self.refused();
            }
            if value.len() == t {
                break;
            }
        }
        match decode(&value, response, now_ms(), self.ttl) {
            Decoded::Entry(v, age) => {
                add(&self.stats.fetched, 1);
                Found::Entry(v, age)
            }
            Decoded::Expired => {
                add(&self.stats.missing, 1);
                Found::Missing
            }
            Decoded::Bad => self.refused(),
        }
    }

    fn refused(&self) -> Found {
        add(&self.stats.refused, 1);
        Found::Failed
    }
}

/// The value of `v` stored at `at` (Unix ms): `MAGIC`, kind (`t` turn, `i` item), `at`
/// (u64 LE), the whole value's length (u32 LE), then for a turn the previous id (u16 LE length,
/// bytes), the input (u32 LE length, bytes) and the output (the rest); for an item its JSON.
/// `None` when it is larger than `max`.
pub fn encode(v: &Stored, at: u64, max: u64) -> Option<Vec<u8>> {
    let (kind, len) = match v {
        Stored::Item(b) => (b'i', b.len()),
        Stored::Turn(t) => (
            b't',
            2 + t.previous.as_deref().map_or(0, str::len) + 4 + t.input.len() + t.output.len(),
        ),
    };
    if len as u64 > max {
        return None;
    }
    let total = u32::try_from(HEAD + len).ok()?;
    let mut out = Vec::with_capacity(HEAD + len);
    out.extend_from_slice(MAGIC);
    out.push(kind);
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&total.to_le_bytes());
    match v {
        Stored::Item(b) => out.extend_from_slice(b),
        Stored::Turn(t) => {
            let prev = t.previous.as_deref().unwrap_or_default();
            if !prev.is_empty() && !id_ok(prev) {
                return None;
            }
            out.extend_from_slice(&(prev.len() as u16).to_le_bytes());
            out.extend_from_slice(prev.as_bytes());
            out.extend_from_slice(&u32::try_from(t.input.len()).ok()?.to_le_bytes());
            out.extend_from_slice(&t.input);
            out.extend_from_slice(&t.output);
        }
    }
    Some(out)
}

/// Kind, stored-at and total length of a value's header.
fn header(v: &[u8]) -> Option<(u8, u64, u32)> {
    if v.len() < HEAD || &v[..4] != MAGIC {
        return None;
    }
    let at = u64::from_le_bytes(v[5..13].try_into().ok()?);
    let total = u32::from_le_bytes(v[13..17].try_into().ok()?);
    Some((v[4], at, total))
}

#[derive(Debug)]
pub enum Decoded {
    Entry(Stored, Duration),
    Expired,
    Bad,
}

/// Valid JSON whose first byte is `open` (`[` or `{`), within serde_json's depth limit.
fn json_ok(b: &[u8], open: u8) -> bool {
    b.trim_ascii_start().first() == Some(&open)
        && serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
}

/// Parse and check a value read back (`response`: a turn is expected, else an item), as of
/// `now` (Unix ms) for entries living `ttl`.
pub fn decode(v: &[u8], response: bool, now: u64, ttl: Duration) -> Decoded {
    let Some((kind, at, total)) = header(v) else {
        return Decoded::Bad;
    };
    if total as usize != v.len() || kind != if response { b't' } else { b'i' } {
        return Decoded::Bad;
    }
    let age = Duration::from_millis(now.saturating_sub(at));
    if age >= ttl {
        return Decoded::Expired;
    }
    let body = &v[HEAD..];
    if !response {
        return match json_ok(body, b'{') {
            true => Decoded::Entry(Stored::Item(body.into()), age),
            false => Decoded::Bad,
        };
    }
    let Some((plen, rest)) = body.split_first_chunk::<2>() else {
        return Decoded::Bad;
    };
    let plen = u16::from_le_bytes(*plen) as usize;
    if rest.len() < plen + 4 {
        return Decoded::Bad;
    }
    let (prev, rest) = rest.split_at(plen);
    let previous = match std::str::from_utf8(prev) {
        Ok("") => None,
        Ok(p) if id_ok(p) => Some(p.into()),
        _ => return Decoded::Bad,
    };
    let Some((ilen, rest)) = rest.split_first_chunk::<4>() else {
        return Decoded::Bad;
    };
    let ilen = u32::from_le_bytes(*ilen) as usize;
    if rest.len() < ilen {
        return Decoded::Bad;
    }
    let (input, output) = rest.split_at(ilen);
    if !json_ok(input, b'[') || !json_ok(output, b'[') {
        return Decoded::Bad;
    }
    Decoded::Entry(
        Stored::Turn(Arc::new(PastTurn {
            previous,
            input: input.into(),
            output: output.into(),
        })),
        age,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(prev: Option<&str>) -> Stored {
        Stored::Turn(Arc::new(PastTurn {
            previous: prev.map(Into::into),
            input: br#"[{"type":"message","role":"user","content":"hi"}]"#[..].into(),
            output: br#"[{"type":"message","id":"msg_1"}]"#[..].into(),
        }))
    }

    fn same(a: &Stored, b: &Stored) -> bool {
        match (a, b) {
            (Stored::Item(x), Stored::Item(y)) => x == y,
            (Stored::Turn(x), Stored::Turn(y)) => x == y,
            _ => false,
        }
    }

    #[test]
    fn values_round_trip_with_their_age() {
        let ttl = Duration::from_secs(60);
        for (v, response) in [
            (turn(Some("resp_0")), true),
            (turn(None), true),
            (
                Stored::Item(br#"{"type":"function_call","id":"fc_1"}"#[..].into()),
                false,
            ),
        ] {
            let e = encode(&v, 1_000, 1 << 20).unwrap();
            match decode(&e, response, 3_000, ttl) {
                Decoded::Entry(back, age) => {
                    assert!(same(&v, &back), "{back:?}");
                    assert_eq!(age, Duration::from_secs(2));
                }
                other => panic!("{other:?}"),
            }
            assert!(matches!(
                decode(&e, response, 61_000, ttl),
                Decoded::Expired
            ));
            // asked as the other kind: refused
            assert!(matches!(decode(&e, !response, 3_000, ttl), Decoded::Bad));
        }
        // too large for the bound: not written
        assert!(encode(&turn(None), 0, 10).is_none());
    }

    #[test]
    fn hostile_values_are_refused() {
        let ttl = Duration::from_secs(60);
        let good = encode(&turn(Some("resp_0")), 0, 1 << 20).unwrap();
        let mut cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"RGR1".to_vec(),
            good[..good.len() - 1].to_vec(),
            [&good[..], b"x"].concat(),
        ];
        let mut magic = good.clone();
        magic[0] = b'X';
        cases.push(magic);
        // a previous id with a space, then one longer than the value
        let mut sp = good.clone();
        sp[HEAD + 2 + 4] = b' ';
        cases.push(sp);
        let mut long = good.clone();
        long[HEAD..HEAD + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        cases.push(long);
        // input that is not a JSON array, output that is not JSON
        for (input, output) in [(&b"{}"[..], &b"[]"[..]), (b"[]", b"[1,"), (b"[]]", b"[]")] {
            let t = Stored::Turn(Arc::new(PastTurn {
                previous: None,
                input: input.into(),
                output: output.into(),
            }));
            cases.push(encode(&t, 0, 1 << 20).unwrap());
        }
        cases.push(encode(&Stored::Item(b"[1]"[..].into()), 0, 1 << 20).unwrap());
        for (i, c) in cases.iter().enumerate() {
            let response = c.get(4) != Some(&b'i');
            assert!(
                matches!(decode(c, response, 1, ttl), Decoded::Bad),
                "case {i}"
            );
        }
        assert!(id_ok("resp_abc-123"));
        assert!(!id_ok("") && !id_ok("a b") && !id_ok(&"x".repeat(MAX_ID + 1)));
    }
}
