//! Slowing down credential guessing: an address whose requests keep presenting a wrong secret
//! (an unknown API key on the client listeners, a wrong admin token on the admin listener)
//! waits before its next credential check — every request of it, valid or not, so a correct
//! guess is not told apart by answering sooner.
//!
//! A guess is a *new* wrong secret: one the address has not presented among its last
//! [`RECENT`] wrong ones. A client repeating one wrong secret — a revoked key still in use, a
//! misconfigured retry loop — learns nothing and is not slowed (nor are its neighbours).
//!
//! Rule: [`FREE`] guesses cost nothing (typos); each one after pushes the address's
//! next check back by a delay that doubles from [`FIRST_DELAY`] up to [`MAX_DELAY`], so one
//! address gets at most one guess per `MAX_DELAY` once it is slowed (connections in
//! parallel included: they all wait for the same time). An address whose next check is more
//! than [`MAX_WAIT`] away is answered 429 at once without a check. The count is forgotten
//! [`FORGET`] after the address's last wrong secret (and, on the admin listener, by a correct
//! token). Addresses behind one NAT (or one IPv6 /64) share a count.
//!
//! Waiting is the caller's: it sleeps on its own task until [`Wait::Until`] (a timer; no other
//! peer, connection or shard waits with it).
//!
//! Cost: `before` is one relaxed atomic load (the stripe's latest penalty) unless an address
//! in the same one of 16 stripes is slowed right now; then one short mutex hold. Memory: at
//! most [`MAX_PEERS`] addresses (stale ones go first, then the least recent).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Peer;

/// Wrong secrets an address may present before it is slowed.
pub const FREE: u32 = 4;
/// The delay after the first wrong secret past [`FREE`]; each next one doubles it.
pub const FIRST_DELAY: Duration = Duration::from_millis(250);
/// The longest delay one wrong secret adds.
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// A check further away than this is refused (429) instead of waited for.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// An address's count is forgotten this long after its last wrong secret.
pub const FORGET: Duration = Duration::from_secs(60);
/// Addresses remembered at once (the table's bound).
pub const MAX_PEERS: usize = 4096;
/// Wrong secrets remembered per address (by fingerprint): presenting one of them again is
/// not a new guess.
pub const RECENT: usize = 4;

const STRIPES: usize = 16;

/// What a request from an address must do before its credential is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Now,
    /// Sleep until then, then check.
    Until(Instant),
    /// Refuse now (429, `Retry-After` of this), without checking.
    Refuse(Duration),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    fails: u32,
    /// Fingerprints of the last wrong secrets (0: none), written round-robin.
    recent: [u64; RECENT],
    next: usize,
    /// The earliest time the address's next credential check runs.
    ready: Instant,
    last: Instant,
}

#[derive(Debug, Default)]
struct Stripe {
    /// The latest `ready` in this stripe, as nanoseconds since `Slowdown::base` (the fast
    /// path: nothing to look up once it has passed).
    until: AtomicU64,
    map: Mutex<HashMap<Peer, Entry>>,
}

/// The per-address failure table (one per listener kind, shared by its threads).
#[derive(Debug)]
pub struct Slowdown {
    base: Instant,
    stripes: [Stripe; STRIPES],
    /// Keys the secrets' fingerprints (random per process: no one can make two secrets
    /// collide on purpose).
    hasher: std::collections::hash_map::RandomState,
}

impl Default for Slowdown {
    fn default() -> Self {
        Slowdown::new()
    }
}

impl Slowdown {
    pub fn new() -> Slowdown {
        Slowdown {
            base: Instant::now(),
            stripes: Default::default(),
            hasher: Default::default(),
        }
    }

    /// The fingerprint [`Slowdown::failed`] tells wrong secrets apart by.
    pub fn fingerprint(&self, secret: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(secret).max(1)
    }

    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether a request from `peer` arriving at `now` may have its credential checked now.
    #[inline]
    pub fn before(&self, peer: Peer, now: Instant) -> Wait {
        let s = &self.stripes[peer.stripe(STRIPES)];
        if self.ns(now) >= s.until.load(Ordering::Relaxed) {
            return Wait::Now;
        }
        self.look_up(s, peer, now)
    }

    /// [`Slowdown::before`], waited for: returns when `peer`'s credential may be checked (a
    /// timer on the caller's task), or `Err(retry after)` when that is too far away.
    pub async fn wait(&self, peer: Peer, now: Instant) -> Result<(), Duration> {
        match self.before(peer, now) {
            Wait::Now => Ok(()),
            Wait::Until(t) => {
                monoio::time::sleep_until(t.into()).await;
                Ok(())
            }
            Wait::Refuse(d) => Err(d),
        }
    }

    #[cold]
    fn look_up(&self, s: &Stripe, peer: Peer, now: Instant) -> Wait {
        let Ok(m) = s.map.lock() else {
            return Wait::Now;
        };
        let Some(e) = m.get(&peer) else {
            return Wait::Now;
        };
        match e.ready.checked_duration_since(now) {
            Some(d) if d > MAX_WAIT => Wait::Refuse(d),
            Some(d) if d > Duration::ZERO => Wait::Until(e.ready),
            _ => Wait::Now,
        }
    }

    /// `peer` presented a wrong secret (its [`Slowdown::fingerprint`]) at `now`.
    pub fn failed(&self, peer: Peer, now: Instant, secret: u64) {
        let s = &self.stripes[peer.stripe(STRIPES)];
        let Ok(mut m) = s.map.lock() else {
            return;
        };
        if !m.contains_key(&peer) && m.len() >= MAX_PEERS / STRIPES {
            make_room(&mut m, now);
        }
        let e = m.entry(peer).or_insert(Entry {
            fails: 0,
            recent: [0; RECENT],
            next: 0,
            ready: now,
            last: now,
        });
        if now.saturating_duration_since(e.last) > FORGET {
            e.fails = 0;
            e.recent = [0; RECENT];
        }
        if e.recent.contains(&secret) {
            return;
        }
        e.recent[e.next % RECENT] = secret;
        e.next = (e.next + 1) % RECENT;
        e.fails = e.fails.saturating_add(1);
        e.last = now;
        if e.fails > FREE {
            let ready = e.ready.max(now) + delay(e.fails);
            e.ready = ready.min(now + MAX_WAIT + MAX_DELAY);
            s.until.fetch_max(self.ns(e.ready), Ordering::Relaxed);
        }
    }

    /// `peer` proved it holds the secret (the admin token): its count goes.
    pub fn forgive(&self, peer: Peer) {
        if let Ok(mut m) = self.stripes[peer.stripe(STRIPES)].map.lock() {
            m.remove(&peer);
        }
    }

    /// Addresses remembered now (tests, metrics).
    pub fn len(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| s.map.lock().map_or(0, |m| m.len()))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The delay the `fails`-th wrong secret adds (`fails > FREE`).
fn delay(fails: u32) -> Duration {
    let doublings = fails.saturating_sub(FREE + 1).min(16);
    FIRST_DELAY.saturating_mul(1u32 << doublings).min(MAX_DELAY)
}

/// A full stripe: forget stale addresses; if none is, the least recent one.
fn make_room(m: &mut HashMap<Peer, Entry>, now: Instant) {
    m.retain(|_, e| e.ready > now || now.saturating_duration_since(e.last) <= FORGET);
    if m.len() >= MAX_PEERS / STRIPES {
        if let Some(k) = m.iter().min_by_key(|(_, e)| e.last).map(|(k, _)| *k) {
            m.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(i: u32) -> Peer {
        Peer::of(std::net::IpAddr::V4(i.into()))
    }

    /// A new wrong secret each call.
    fn guess(s: &Slowdown) -> u64 {
        use std::sync::atomic::AtomicU32;
        static N: AtomicU32 = AtomicU32::new(0);
        s.fingerprint(&N.fetch_add(1, Ordering::Relaxed).to_le_bytes())
    }

    #[test]
    fn free_failures_then_doubling_delays_up_to_the_cap() {
        let s = Slowdown::new();
        let (a, b) = (peer(1), peer(2));
        let t = Instant::now();
        for _ in 0..FREE {
            s.failed(a, t, guess(&s));
            assert_eq!(s.before(a, t), Wait::Now);
        }
        // the same wrong secret again and again is not a guess
        let same = guess(&s);
        for _ in 0..100 {
            s.failed(a, t, same);
        }
        assert_eq!(s.before(a, t), Wait::Until(t + FIRST_DELAY));
        assert_eq!(s.before(b, t), Wait::Now, "another address is not slowed");
        s.failed(a, t, guess(&s));
        assert_eq!(s.before(a, t), Wait::Until(t + FIRST_DELAY * 3));
        assert_eq!(s.before(a, t + FIRST_DELAY * 3), Wait::Now);
        assert_eq!(delay(FREE + 30), MAX_DELAY);
        // parallel failures pile up, bounded: far away is refused
        for _ in 0..40 {
            s.failed(a, t, guess(&s));
        }
        assert!(matches!(s.before(a, t), Wait::Refuse(d) if d > MAX_WAIT));
        s.forgive(a);
        assert_eq!(s.before(a, t), Wait::Now);
    }

    #[test]
    fn forgets_after_a_quiet_minute() {
        let s = Slowdown::new();
        let t = Instant::now();
        for _ in 0..=FREE {
            s.failed(peer(1), t, guess(&s));
        }
        let later = t + FORGET + Duration::from_secs(1);
        s.failed(peer(1), later, guess(&s));
        assert_eq!(
            s.before(peer(1), later),
            Wait::Now,
            "the count started over"
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let s = Slowdown::new();
        let t = Instant::now();
        for i in 0..(MAX_PEERS as u32 * 3) {
            s.failed(peer(i), t, guess(&s));
        }
        assert!(s.len() <= MAX_PEERS, "{}", s.len());
    }
}
