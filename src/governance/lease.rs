//! Limits without a round trip (`[limits] mode = "leased"`): each process leases shares of a
//! key's request window from the shared store and decides its requests locally.
//!
//! - **The grant is atomic in the store**: the limits script's `lease` operation grants
//!   `min(wanted, limit - counted)` units of the key's current wall-clock window and counts
//!   them at once (`store::script`). Every unit any process holds is already in the window's
//!   count, so the fleet never admits more than the limit; the only slack is units a process
//!   holds unused when the window ends (they are lost with it: capacity, never overshoot).
//! - **The request path decides locally**: the units left are one `AtomicU64` per key slot and
//!   process (`Lease`, in the key's `KeyCounters` line: shared by every shard), packed with
//!   their window (`window << 32 | units`); a request takes one unit with one compare-and-swap
//!   — no store round trip. A process with no units of the current window asks the store on
//!   the request path (one round trip, as in `mode = "exact"`: the first request of a key in a
//!   window on a node that did not prefetch it, or a node outrunning its refills); a process
//!   the store told that the window is full refuses at once (429).
//! - **Refills run off the request path**: on the shard that saw the units fall to ¼ of the
//!   last lease or below, in that shard's refill task (`refill_leases`, spawned next to its
//!   store connection: it uses the shard's own pipelined connection, needs no thread, no
//!   cross-thread wake-up and no connection more; the request only queues the key and wakes
//!   the task, both shard-local). One refill per key and window is in flight at a time
//!   process-wide (`refilling`). At each window roll the task leases the new window for the keys
//!   this process used in the old one.
//! - **Lease size** (traffic, bounded by the limit): the first lease of a window is half the
//!   last lease of the previous one (at least 1), each refill in the same window doubles it, up
//!   to `cap = min(ceil(limit / 16), 4096)`. A busy node reaches big leases in a few refills;
//!   an idle node holds 1 unit. One lease of a key is in flight per process at a time (a
//!   request that finds none left while one is in flight leases its own unit only), and a
//!   refill starts when at most ¼ of the last lease is left: a process holds at most
//!   `cap + cap / 4` units unused. What a fleet of N processes may leave unadmitted of a window
//!   is below N × 1.25 × `cap`; it never admits over the limit.
//! - **Store errors**: a refill that fails is counted; the process keeps deciding from the
//!   units it holds; when they are gone the request asks the store itself and, on an error,
//!   `on_store_error` decides (`"local"`: the process's own counters, caught up when the store
//!   is back, as in `exact`; `"closed"`: 503).
//! - Which keys: those with `rpm` and neither `max_in_flight` nor a budget (those ask the store
//!   on the head as in `exact`: their check is one script run anyway); `tpm` is decided as in
//!   `exact` (one round trip after the body).
//!
//! Owns: `Lease`, `Refills`, `Governance::admit_leased`, `refill_leases`, `Grant::confirm_lease`,
//! the `ringgate_limit_lease_*` metrics. Must not: talk RESP (`store`) or wait for the store
//! on the request path while units are left.

use std::cell::{Cell, RefCell};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::keyring::Key;
use super::metrics::Reason;
use super::shared::unix_ms;
use super::store::pipeline::Notify;
use super::store::script::{self, Op};
use super::store::Store;
use super::{limit_lines, over_limit, secs_up, Governance, Grant, KeyState};
use crate::error::{Error, Kind};

const LOW: u64 = u32::MAX as u64;
/// A lease is at most 1 / `SHARE` of the limit.
pub const SHARE: u64 = 16;
/// And at most this many units.
pub const MAX_LEASE: u64 = 4096;
/// Leases asked for on the request path before a request is refused (others took the units).
const TRIES: usize = 3;

fn pack(w: u64, n: u64) -> u64 {
    ((w & LOW) << 32) | n.min(LOW)
}

fn unpack(v: u64) -> (u64, u64) {
    (v >> 32, v & LOW)
}

/// The largest lease for `limit`.
pub fn cap(limit: u64) -> u64 {
    limit.div_ceil(SHARE).clamp(1, MAX_LEASE)
}

/// One key's leased units in this process (every field `window << 32 | value`; 40 bytes, so
/// that a key's `KeyCounters` stays one cache line).
#[derive(Debug, Default)]
pub struct Lease {
    /// Units left.
    left: AtomicU64,
    /// Units granted in the window (units used = granted - left).
    granted: AtomicU64,
    /// The window's count in the store after the last grant (the rate-limit headers).
    counted: AtomicU64,
    /// The last lease's size.
    size: AtomicU64,
    /// `full << 32 | refilling`: the window the store said is full, + 1, and the window of
    /// a refill in flight, + 1 (0: none).
    flags: AtomicU64,
}

/// What `Lease::take` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// One unit taken; this many are left.
    Took(u64),
    /// None left of window `w` (or none leased yet): ask the store.
    Empty,
    /// None left, and the store said the window is full.
    Full,
}

impl Lease {
    /// Take one unit of window `w` (one compare-and-swap); `limit` is the key's `rpm` now (a
    /// window the store said is full has room again when the limit was raised since).
    pub fn take(&self, w: u64, limit: u64) -> Take {
        let w = w & LOW;
        let r = self.left.fetch_update(Relaxed, Relaxed, |v| {
            let (lw, n) = unpack(v);
            (lw == w && n > 0).then(|| v - 1)
        });
        match r {
            Ok(v) => Take::Took(unpack(v).1 - 1),
            Err(_) if self.full(w) && self.remaining(w, limit) == 0 => Take::Full,
            Err(_) => Take::Empty,
        }
    }

    /// Units left of window `w`.
    pub fn left(&self, w: u64) -> u64 {
        match unpack(self.left.load(Relaxed)) {
            (lw, n) if lw == w & LOW => n,
            _ => 0,
        }
    }

    /// Units of window `w` taken so far.
    pub fn used(&self, w: u64) -> u64 {
        match unpack(self.granted.load(Relaxed)) {
            (gw, n) if gw == w & LOW => n.saturating_sub(self.left(w)),
            _ => 0,
        }
    }

    /// What is left of the limit for this process: the store's rest after its last grant,
    /// plus the units this process holds.
    pub fn remaining(&self, w: u64, limit: u64) -> u64 {
        let counted = match unpack(self.counted.load(Relaxed)) {
            (cw, n) if cw == w & LOW => n,
            _ => 0,
        };
        limit.saturating_sub(counted).saturating_add(self.left(w))
    }

    /// The size of the next lease of window `w` for `limit` (and note it as the last one).
    pub fn next_size(&self, w: u64, limit: u64) -> u64 {
        let (sw, s) = unpack(self.size.load(Relaxed));
        let n = if sw == w & LOW {
            s.saturating_mul(2)
        } else {
            s / 2
        }
        .clamp(1, cap(limit));
        self.size.store(pack(w, n), Relaxed);
        n
    }

    /// Whether one unit left of `left` calls for a refill (¼ of the last lease or less).
    pub fn low(&self, left: u64) -> bool {
        let (_, s) = unpack(self.size.load(Relaxed));
        left.saturating_mul(4) <= s
    }

    /// The store granted `units` of window `w`, its count now `counted` of `limit`. A grant
    /// for a window older than the one held is dropped (its window has passed).
    pub fn grant(&self, w: u64, units: u64, counted: u64, limit: u64) {
        let w = w & LOW;
        let mut newer = false;
        let _ = self
            .left
            .fetch_update(Relaxed, Relaxed, |v| match unpack(v) {
                (lw, n) if lw == w => Some(pack(w, n.saturating_add(units))),
                (lw, _) if lw < w => Some(pack(w, units)),
                _ => {
                    newer = true;
                    None
                }
            });
        if newer {
            return;
        }
        let _ = self
            .granted
            .fetch_update(Relaxed, Relaxed, |v| match unpack(v) {
                (gw, n) if gw == w => Some(pack(w, n.saturating_add(units))),
                (gw, _) if gw < w => Some(pack(w, units)),
                _ => None,
            });
        self.counted.store(pack(w, counted), Relaxed);
        if counted >= limit {
            let mark = (w + 1) & LOW;
            let _ = self
                .flags
                .fetch_update(Relaxed, Relaxed, |v| Some(pack(mark, v & LOW)));
        }
    }

    /// Whether the store said window `w` is full.
    fn full(&self, w: u64) -> bool {
        unpack(self.flags.load(Relaxed)).0 == ((w & LOW) + 1) & LOW
    }

    /// Claim the refill of window `w` (false: one is in flight).
    fn begin_refill(&self, w: u64) -> bool {
        let mark = ((w & LOW) + 1) & LOW;
        self.flags
            .fetch_update(Relaxed, Relaxed, |v| {
                let (full, refilling) = unpack(v);
                (refilling != mark).then_some(pack(full, mark))
            })
            .is_ok()
    }

    fn end_refill(&self) {
        let _ = self
            .flags
            .fetch_update(Relaxed, Relaxed, |v| Some(v & (LOW << 32)));
    }
}

/// One shard's refill queue and its lease metrics.
#[derive(Default)]
pub struct Refills {
    /// Key slots to refill (each at most once: `Lease::refilling`).
    queue: RefCell<Vec<u32>>,
    wake: Notify,
    refills: Cell<u64>,
    failures: Cell<u64>,
    waits: Cell<u64>,
}

impl std::fmt::Debug for Refills {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Refills({} queued)", self.queue.borrow().len())
    }
}

/// Whether key `k` is decided from leases (`rpm`, no `max_in_flight`, no budget).
pub(super) fn leases_key(k: &Key, st: &KeyState) -> bool {
    k.rpm.is_some()
        && k.max_in_flight.is_none()
        && !st.ledger.as_deref().is_some_and(|l| l.has_budget())
}

impl Governance {
    /// The head stage of a leased key: one unit of this process's lease (no round trip), or
    /// 429 when the store said the window is full, or — no units left — a grant that asks the
    /// store (`Grant::confirm_lease`).
    pub(super) fn admit_leased(
        &self,
        i: u32,
        hdr_at: usize,
        headers: &mut Vec<u8>,
    ) -> Result<Grant<'_>, Error> {
        let Some((key, st)) = self.key(i) else {
            return Err(Error::new(Kind::Unauthorized, "invalid API key"));
        };
        let limit = key.rpm.unwrap_or(0);
        let (w, left_ms) = script::window(unix_ms());
        let lease = &self.counters.slot(i).lease;
        match lease.take(w, limit) {
            Take::Took(left) => {
                if lease.low(left) {
                    self.queue_refill(i, w);
                }
                let tok_at = self.leased_in(i, &st, limit, w, left_ms, headers);
                let mut g = Grant::new(self, i, tok_at);
                g.hdr_at = hdr_at;
                Ok(g)
            }
            Take::Full => {
                let secs = secs_up(Duration::from_millis(left_ms));
                limit_lines(headers, "requests", limit, 0, secs);
                self.metrics.rejected(Some(i), Reason::Rpm);
                Err(over_limit(&key.name, Reason::Rpm, limit, secs))
            }
            Take::Empty => {
                let mut g = Grant::deferred(self, i, hdr_at);
                g.pending = super::grant::Pending::Lease;
                Ok(g)
            }
        }
    }

    /// A request of key `i` took a unit of window `w`: it counts in this shard's in-flight
    /// count and the process's window (a fallback mid-window starts from it); its header
    /// lines. Returns where the `-tokens` lines start.
    fn leased_in(
        &self,
        i: u32,
        st: &KeyState,
        limit: u64,
        w: u64,
        left_ms: u64,
        headers: &mut Vec<u8>,
    ) -> usize {
        st.in_flight.set(st.in_flight.get().saturating_add(1));
        let c = self.counters.slot(i);
        c.rpm.charge(self.counters.now(), 1);
        let secs = secs_up(Duration::from_millis(left_ms));
        limit_lines(
            headers,
            "requests",
            limit,
            c.lease.remaining(w, limit),
            secs,
        );
        headers.len()
    }

    /// Queue key `i` for a refill of window `w` by this shard's refill task (unless one is in
    /// flight in the process).
    fn queue_refill(&self, i: u32, w: u64) {
        if !self.counters.slot(i).lease.begin_refill(w) {
            return;
        }
        if let Ok(mut q) = self.refills.queue.try_borrow_mut() {
            q.push(i);
            self.refills.wake.notify();
        } else {
            self.counters.slot(i).lease.end_refill();
        }
    }

    /// Lease units of window `w` of key `name` (`limit`) for slot `i`: asks the store, notes
    /// the grant. Counted in the metrics.
    async fn lease_now(
        &self,
        store: &Store,
        i: u32,
        name: &str,
        limit: u64,
        w: u64,
        want: u64,
    ) -> bool {
        let key = script::window_key(store.ns(), "rpm", name, w);
        let op = Op::Lease {
            key: &key,
            limit,
            want,
        };
        let got = match store.eval(op).await {
            Ok(r) => script::leased(&r).or_else(|| {
                store.reply_error(b"unexpected reply from the limits script (lease)");
                None
            }),
            Err(_) => None,
        };
        match got {
            Some((units, counted)) => {
                // (hostile replies: never more than asked for)
                self.counters
                    .slot(i)
                    .lease
                    .grant(w, units.min(want), counted, limit);
                crate::observe::metrics::bump(&self.refills.refills);
                true
            }
            None => {
                crate::observe::metrics::bump(&self.refills.failures);
                false
            }
        }
    }

    /// This shard's refill task (forever, next to its store connection): the keys the request
    /// path queued, and at each window roll the keys this process used in the last window.
    pub(super) async fn refill_leases(&self, store: &Store) {
        let mut rolled = script::window(unix_ms()).0;
        loop {
            let (w, left_ms) = script::window(unix_ms());
            let mut todo: Vec<u32> = match self.refills.queue.try_borrow_mut() {
                Ok(mut q) => std::mem::take(&mut *q),
                Err(_) => Vec::new(),
            };
            if w != rolled {
                rolled = w;
                todo.extend(self.used_in(w.saturating_sub(1)));
            }
            for i in todo {
                let Some((name, limit)) = self
                    .key(i)
                    .filter(|(k, st)| leases_key(k, st))
                    .and_then(|(k, _)| Some((k.name.clone(), k.rpm?)))
                else {
                    self.counters.slot(i).lease.end_refill();
                    continue;
                };
                let lease = &self.counters.slot(i).lease;
                if !lease.full(w) && store.up() {
                    let want = lease.next_size(w, limit);
                    self.lease_now(store, i, &name, limit, w, want).await;
                } else if !store.up() {
                    crate::observe::metrics::bump(&self.refills.failures);
                }
                lease.end_refill();
            }
            // (the roll: a few ms after the window's end, for clocks a little apart)
            let roll = Duration::from_millis(left_ms + 5);
            monoio::select! {
                _ = self.refills.wake.wait() => {}
                _ = monoio::time::sleep(roll) => {}
            }
        }
    }

    /// Leased keys this process took units of in window `w`, claimed for a refill of `w + 1`
    /// (by this shard: every shard's task looks, one claims each key).
    fn used_in(&self, w: u64) -> Vec<u32> {
        let Ok(ring) = self.ring.try_borrow() else {
            return Vec::new();
        };
        let Ok(state) = self.state.try_borrow() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, (k, st)) in ring.keys.iter().zip(state.iter()).enumerate() {
            let Ok(i) = u32::try_from(i) else { break };
            let lease = &self.counters.slot(i).lease;
            if leases_key(k, st) && lease.used(w) > 0 && lease.begin_refill(w + 1) {
                out.push(i);
            }
        }
        out
    }

    /// `ringgate_limit_lease_*`: this shard's refills, failures and waits; on shard 0 the units
    /// the process holds per key.
    pub(super) fn render_leases(&self, shard: usize, out: &mut String) {
        let help = crate::observe::metrics::help;
        let r = &self.refills;
        for (name, text, v) in [
            (
                "ringgate_limit_lease_refills_total",
                "Leases of request-window units granted by the shared store (mode = \"leased\").",
                r.refills.get(),
            ),
            (
                "ringgate_limit_lease_failures_total",
                "Leases the shared store did not grant (an error, no reply in time, or down).",
                r.failures.get(),
            ),
            (
                "ringgate_limit_lease_waits_total",
                "Requests that found no units left and asked the store on the request path.",
                r.waits.get(),
            ),
        ] {
            help(out, name, "counter", text);
            let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {v}");
        }
        if shard != 0 {
            return;
        }
        let (Ok(ring), Ok(state)) = (self.ring.try_borrow(), self.state.try_borrow()) else {
            return;
        };
        help(
            out,
            "ringgate_limit_lease_units_left",
            "gauge",
            "Units of the current window this process holds per key (mode = \"leased\").",
        );
        let (w, _) = script::window(unix_ms());
        for (i, (k, st)) in ring.keys.iter().zip(state.iter()).enumerate() {
            if leases_key(k, st) {
                let left = self.counters.slot(i as u32).lease.left(w);
                let _ = writeln!(
                    out,
                    "ringgate_limit_lease_units_left{{key=\"{}\"}} {left}",
                    k.name
                );
            }
        }
    }
}

impl Grant<'_> {
    /// A leased key's request that found no units: lease now (one round trip), then take one;
    /// the store failing: `on_store_error`.
    pub(super) async fn confirm_lease(&mut self, headers: &mut Vec<u8>) -> Result<(), Error> {
        let gov = self.gov;
        let Some(store) = &gov.store else {
            return Ok(());
        };
        // copied out: nothing of the keyring is borrowed across the round trip
        let Some((name, limit)) = gov
            .key(self.key)
            .and_then(|(k, _)| Some((k.name.clone(), k.rpm?)))
        else {
            return Ok(());
        };
        crate::observe::metrics::bump(&gov.refills.waits);
        for tried in 0..=TRIES {
            let (w, left_ms) = script::window(unix_ms());
            let lease = &gov.counters.slot(self.key).lease;
            let secs = secs_up(Duration::from_millis(left_ms));
            let full = match lease.take(w, limit) {
                Take::Took(left) => {
                    if lease.low(left) {
                        gov.queue_refill(self.key, w);
                    }
                    let Some((_, st)) = gov.key(self.key) else {
                        return Ok(());
                    };
                    headers.truncate(self.hdr_at);
                    self.tok_at = gov.leased_in(self.key, &st, limit, w, left_ms, headers);
                    self.holds = true;
                    return Ok(());
                }
                Take::Full => true,
                Take::Empty => tried == TRIES,
            };
            if full {
                headers.truncate(self.hdr_at);
                limit_lines(headers, "requests", limit, 0, secs);
                self.tok_at = headers.len();
                gov.metrics.rejected(Some(self.key), Reason::Rpm);
                return Err(over_limit(&name, Reason::Rpm, limit, secs));
            }
            // this request's unit and the next lease — or, while another lease of the key is
            // in flight in the process (concurrent requests at a window's start), this
            // request's unit only: what a process holds unused stays within one lease
            let batch = lease.begin_refill(w);
            let want = match batch {
                true => lease.next_size(w, limit).saturating_add(1),
                false => 1,
            };
            let granted = gov.lease_now(store, self.key, &name, limit, w, want).await;
            if batch {
                lease.end_refill();
            }
            if !granted {
                let Some((_, st)) = gov.key(self.key) else {
                    return Ok(());
                };
                return self.store_down(store, &st.outage, w, headers);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_taken_once_per_window_and_never_below_zero() {
        let l = Lease::default();
        assert_eq!(l.take(7, 20), Take::Empty);
        l.grant(7, 3, 3, 20);
        assert_eq!(l.remaining(7, 20), 20);
        assert_eq!(l.take(7, 20), Take::Took(2));
        assert_eq!(l.take(7, 20), Take::Took(1));
        assert_eq!((l.left(7), l.used(7)), (1, 2));
        // another window: nothing held
        assert_eq!(l.take(8, 20), Take::Empty);
        assert_eq!(l.left(8), 0);
        assert_eq!(l.take(7, 20), Take::Took(0));
        assert_eq!(l.take(7, 20), Take::Empty);
        // the store's count reached the limit: full, refused without asking
        l.grant(7, 1, 20, 20);
        assert_eq!(l.take(7, 20), Take::Took(0));
        assert_eq!(l.take(7, 20), Take::Full);
        assert_eq!(l.remaining(7, 20), 0);
        // the limit was raised since: room again (ask the store)
        assert_eq!(l.take(7, 30), Take::Empty);
        // a new window's grant replaces the old window's units; a late one for 7 is dropped
        l.grant(8, 2, 12, 20);
        l.grant(7, 5, 20, 20);
        assert_eq!((l.left(8), l.left(7)), (2, 0));
        assert_eq!(l.take(8, 20), Take::Took(1));
    }

    #[test]
    fn lease_sizes_double_within_a_window_and_halve_at_a_roll() {
        assert_eq!(
            (cap(20), cap(1), cap(1600), cap(u64::MAX)),
            (2, 1, 100, MAX_LEASE)
        );
        let l = Lease::default();
        let sizes: Vec<u64> = (0..9).map(|_| l.next_size(5, 1600)).collect();
        assert_eq!(sizes, [1, 2, 4, 8, 16, 32, 64, 100, 100]);
        assert_eq!(l.next_size(6, 1600), 50);
        assert!(l.low(12) && !l.low(13));
        assert_eq!(l.next_size(6, 20), 2);
    }

    #[test]
    fn one_refill_per_window_is_in_flight() {
        let l = Lease::default();
        assert!(l.begin_refill(3));
        assert!(!l.begin_refill(3));
        assert!(l.begin_refill(4));
        l.end_refill();
        assert!(l.begin_refill(4));
    }

    #[test]
    fn shards_racing_take_each_unit_once() {
        let l = std::sync::Arc::new(Lease::default());
        l.grant(9, 1000, 1000, 5000);
        let took: u64 = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    (0..400)
                        .filter(|_| matches!(l.take(9, 5000), Take::Took(_)))
                        .count() as u64
                })
            })
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(took, 1000);
    }
}
