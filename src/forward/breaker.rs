//! The circuit breaker of one deployment: closed → open after N consecutive failures (or an
//! error rate over a tumbling window) → half-open after the cooldown, where exactly one probe
//! goes through; the probe's success closes it, its failure re-opens it for another cooldown.
//!
//! The state is process-wide (`BreakerCell`, shared by every shard through
//! `forward::shared`): a failure seen on one shard counts for all of them, an open breaker is
//! open on every shard, and the half-open probe is one per process. It is two `AtomicU64`s:
//! the state word (state, probe bit, streak, `until`) changed by compare-and-swap, and the
//! error-rate window (start, attempts, failures). Reads (`available`, `allow` while closed, a
//! success while the streak is 0) are one `Relaxed` load and write nothing, so a healthy
//! deployment's cache line is only read by the shards. `Breaker` is a shard's handle: its
//! model's settings plus the shared cell.
//!
//! Owns: `Breaker`, `BreakerCell`, `BreakerState`. Must not: read clocks (every call takes
//! `now`), do IO, or know why a failure happened (the caller decides what counts, see
//! `Reason::trips_breaker`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::policy::BreakerSettings;
use crate::engine::signal::ms_of;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    /// Gauge value: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

/// Largest streak the state word holds (it saturates there).
const MAX_STREAK: u32 = (1 << 21) - 1;
/// `until` is 40 bits of milliseconds (the routing clock, `engine::signal::ms_of`).
const UNTIL_MASK: u64 = (1 << 40) - 1;

/// The decoded state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Word {
    state: BreakerState,
    /// Half-open: whether the one probe is out.
    probing: bool,
    /// Consecutive failures while closed.
    streak: u32,
    /// Open: when the cooldown ends. Half-open: when the probe lease expires (a probe that
    /// never reports back frees the slot after one more cooldown). 0: none.
    until: u64,
}

impl Word {
    const CLOSED: Word = Word {
        state: BreakerState::Closed,
        probing: false,
        streak: 0,
        until: 0,
    };

    fn decode(w: u64) -> Word {
        Word {
            state: match w & 3 {
                1 => BreakerState::Open,
                2 => BreakerState::HalfOpen,
                _ => BreakerState::Closed,
            },
            probing: w & 4 != 0,
            streak: ((w >> 3) as u32) & MAX_STREAK,
            until: w >> 24,
        }
    }

    fn encode(self) -> u64 {
        let state = match self.state {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        };
        state
            | u64::from(self.probing) << 2
            | u64::from(self.streak.min(MAX_STREAK)) << 3
            | (self.until & UNTIL_MASK) << 24
    }

    fn available(self, now: u64) -> bool {
        match self.state {
            BreakerState::Closed => true,
            BreakerState::Open => now >= self.until,
            BreakerState::HalfOpen => !self.probing || now >= self.until,
        }
    }
}

/// One deployment's breaker state, shared by every shard (see the module doc).
#[derive(Debug)]
pub struct BreakerCell {
    word: AtomicU64,
    /// Error-rate window: start (low 32 bits of the ms clock, compared wrapping), attempts
    /// (16 bits) and failures (16 bits), both saturating.
    window: AtomicU64,
}

impl Default for BreakerCell {
    fn default() -> Self {
        BreakerCell {
            word: AtomicU64::new(Word::CLOSED.encode()),
            window: AtomicU64::new(0),
        }
    }
}

impl BreakerCell {
    /// Apply `f` to the state word until the compare-and-swap succeeds; returns what `f`
    /// returned for the word that was stored (`None` from `f`: leave it, and return `None`).
    fn update<T>(&self, mut f: impl FnMut(Word) -> Option<(Word, T)>) -> Option<T> {
        let mut cur = self.word.load(Relaxed);
        loop {
            let (next, out) = f(Word::decode(cur))?;
            match self
                .word
                .compare_exchange_weak(cur, next.encode(), Relaxed, Relaxed)
            {
                Ok(_) => return Some(out),
                Err(seen) => cur = seen,
            }
        }
    }
}

/// A shard's handle on one deployment's breaker: the model's settings and the shared cell.
#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    cell: Arc<BreakerCell>,
}

impl Breaker {
    /// A breaker with a cell of its own (tests, library users without shared state).
    pub fn new(settings: BreakerSettings) -> Breaker {
        Breaker::shared(settings, Arc::default())
    }

    /// A handle on `cell` (`forward::shared`) with these settings.
    pub fn shared(settings: BreakerSettings, cell: Arc<BreakerCell>) -> Breaker {
        Breaker { settings, cell }
    }

    fn word(&self) -> Word {
        Word::decode(self.cell.word.load(Relaxed))
    }

    fn cooldown_ms(&self) -> u64 {
        self.settings
            .cooldown
            .as_millis()
            .min(u128::from(UNTIL_MASK)) as u64
    }

    pub fn state(&self) -> BreakerState {
        self.word().state
    }

    /// Whether `allow(now)` would let a request through, without taking the probe slot
    /// (the balancer filters with this; the plan then calls `allow` on its pick).
    pub fn available(&self, now: Instant) -> bool {
        let w = self.word();
        w.state == BreakerState::Closed || w.available(ms_of(now))
    }

    /// Let a request through? Closed: yes. Open: no until the cooldown ended, then the
    /// breaker turns half-open and this request is its one probe (one per process). Half-open:
    /// no while the probe is out.
    pub fn allow(&self, now: Instant) -> bool {
        if self.word().state == BreakerState::Closed {
            return true;
        }
        let now = ms_of(now);
        let until = now.saturating_add(self.cooldown_ms());
        self.cell
            .update(|w| match w.state {
                BreakerState::Closed => Some((w, ())),
                _ if w.available(now) => Some((
                    Word {
                        state: BreakerState::HalfOpen,
                        probing: true,
                        streak: w.streak,
                        until,
                    },
                    (),
                )),
                _ => None,
            })
            .is_some()
    }

    /// A probe that ended without a verdict (the client went away): let another through.
    pub fn release_probe(&self) {
        self.cell.update(|w| {
            (w.state == BreakerState::HalfOpen && w.probing).then_some((
                Word {
                    probing: false,
                    ..w
                },
                (),
            ))
        });
    }

    pub fn on_success(&self, now: Instant, _latency: Duration) {
        let w = self.word();
        match w.state {
            BreakerState::Closed => {
                self.count(ms_of(now), false);
                if w.streak != 0 {
                    self.cell.update(|w| {
                        (w.state == BreakerState::Closed && w.streak != 0)
                            .then_some((Word { streak: 0, ..w }, ()))
                    });
                }
            }
            BreakerState::HalfOpen => {
                let closed = self
                    .cell
                    .update(|w| (w.state == BreakerState::HalfOpen).then_some((Word::CLOSED, ())));
                if closed.is_some() {
                    self.cell.window.store(0, Relaxed);
                }
            }
            // A late success from before the breaker opened does not close it.
            BreakerState::Open => {}
        }
    }

    /// Record a failure; returns true when this failure opened the breaker.
    pub fn on_failure(&self, now: Instant) -> bool {
        let now = ms_of(now);
        let until = now.saturating_add(self.cooldown_ms());
        let rate_trip = self.word().state == BreakerState::Closed && self.count(now, true);
        let failures = self.settings.failures.min(MAX_STREAK);
        let open = Word {
            state: BreakerState::Open,
            probing: false,
            streak: 0,
            until,
        };
        self.cell
            .update(|w| match w.state {
                BreakerState::Closed => {
                    let streak = w.streak.saturating_add(1).min(MAX_STREAK);
                    let trip = (failures > 0 && streak >= failures) || rate_trip;
                    Some(if trip {
                        (open, true)
                    } else {
                        (Word { streak, ..w }, false)
                    })
                }
                BreakerState::HalfOpen => Some((open, true)),
                // Late failures of requests started before it opened do not extend the
                // cooldown.
                BreakerState::Open => None,
            })
            .unwrap_or(false)
    }

    /// Count an outcome in the error-rate window; true when the rate rule trips.
    fn count(&self, now: u64, failed: bool) -> bool {
        let Some(rate) = self.settings.error_rate else {
            return false;
        };
        let window = self.settings.window.as_millis().min(u128::from(u32::MAX)) as u32;
        let now32 = now as u32;
        let mut cur = self.cell.window.load(Relaxed);
        loop {
            let (start, total, bad) = (cur as u32, (cur >> 32) as u16, (cur >> 48) as u16);
            let fresh = cur == 0 || now32.wrapping_sub(start) >= window;
            let (start, total, bad) = if fresh {
                (now32, 0u16, 0u16)
            } else {
                (start, total, bad)
            };
            let total = total.saturating_add(1);
            let bad = bad.saturating_add(u16::from(failed)).min(total);
            let next = u64::from(start) | u64::from(total) << 32 | u64::from(bad) << 48;
            match self
                .cell
                .window
                .compare_exchange_weak(cur, next, Relaxed, Relaxed)
            {
                Ok(_) => {
                    return failed
                        && u32::from(total) >= self.settings.min_requests.max(1)
                        && f64::from(bad) >= rate * f64::from(total)
                }
                Err(seen) => cur = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(failures: u32, cooldown_ms: u64) -> BreakerSettings {
        BreakerSettings {
            failures,
            cooldown: Duration::from_millis(cooldown_ms),
            ..BreakerSettings::default()
        }
    }

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    /// A deployment that always fails, offered a request every 10 ms for 35 s: it gets exactly
    /// `failures` requests, then one probe per cooldown.
    #[test]
    fn always_failing_gets_failures_plus_one_probe_per_cooldown() {
        let t0 = Instant::now();
        let b = Breaker::new(settings(5, 10_000));
        let mut let_through = Vec::new();
        for step in 0..3_500 {
            let now = ms(t0, step * 10);
            if b.allow(now) {
                let_through.push(step * 10);
                b.on_failure(now);
            }
        }
        assert_eq!(let_through, vec![0, 10, 20, 30, 40, 10_040, 20_040, 30_040]);
        assert_eq!(b.state(), BreakerState::Open);
        // per cooldown window after the first: exactly one probe
        for w in 1..3u64 {
            let n = let_through
                .iter()
                .filter(|&&t| t >= 40 + w * 10_000 && t < 40 + (w + 1) * 10_000)
                .count();
            assert_eq!(n, 1, "window {w}");
        }
    }

    #[test]
    fn half_open_lets_exactly_one_probe_and_success_closes() {
        let t0 = Instant::now();
        let b = Breaker::new(settings(2, 1_000));
        assert!(b.allow(t0));
        assert!(!b.on_failure(t0));
        assert!(b.on_failure(t0));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.available(ms(t0, 999)) && !b.allow(ms(t0, 999)));
        assert!(b.available(ms(t0, 1_000)));
        assert!(b.allow(ms(t0, 1_000)));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(!b.available(ms(t0, 1_001)));
        assert!(!b.allow(ms(t0, 1_001)), "second probe while one is out");
        b.on_success(ms(t0, 1_050), Duration::from_millis(50));
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow(ms(t0, 1_051)) && b.allow(ms(t0, 1_052)));
        // the streak restarted from zero
        assert!(!b.on_failure(ms(t0, 1_060)));
    }

    #[test]
    fn failed_probe_reopens_for_a_full_cooldown() {
        let t0 = Instant::now();
        let b = Breaker::new(settings(1, 1_000));
        b.on_failure(t0);
        assert!(b.allow(ms(t0, 1_500)));
        assert!(b.on_failure(ms(t0, 1_600)));
        assert!(!b.allow(ms(t0, 2_599)));
        assert!(b.allow(ms(t0, 2_600)));
    }

    #[test]
    fn lost_probe_is_released_or_expires() {
        let t0 = Instant::now();
        let b = Breaker::new(settings(1, 1_000));
        b.on_failure(t0);
        assert!(b.allow(ms(t0, 1_000)));
        b.release_probe();
        assert!(b.allow(ms(t0, 1_001)), "released slot");
        // never reported: a new probe after one more cooldown
        assert!(!b.allow(ms(t0, 1_500)));
        assert!(b.allow(ms(t0, 2_001)));
    }

    #[test]
    fn successes_reset_the_streak_and_late_results_do_not_move_an_open_breaker() {
        let t0 = Instant::now();
        let b = Breaker::new(settings(3, 1_000));
        for _ in 0..10 {
            b.on_failure(t0);
            b.on_failure(t0);
            b.on_success(t0, Duration::ZERO);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.on_failure(t0);
        b.on_failure(t0);
        assert!(b.on_failure(t0));
        assert!(!b.on_failure(ms(t0, 900)), "late failure does not extend");
        b.on_success(ms(t0, 900), Duration::ZERO);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.allow(ms(t0, 1_000)));
    }

    #[test]
    fn error_rate_window_opens_without_a_streak() {
        let t0 = Instant::now();
        let b = Breaker::new(BreakerSettings {
            failures: 0,
            error_rate: Some(0.5),
            min_requests: 10,
            window: Duration::from_secs(10),
            ..settings(0, 1_000)
        });
        // alternate ok/fail: 50 % errors, never two failures in a row
        let mut opened_at = None;
        for n in 0..20u64 {
            let now = ms(t0, n * 100);
            if n % 2 == 0 {
                b.on_success(now, Duration::ZERO);
            } else if b.on_failure(now) {
                opened_at = Some(n);
                break;
            }
        }
        assert_eq!(
            opened_at,
            Some(9),
            "opens at the 10th outcome (5 of 10 failed)"
        );
        // a fresh window forgets old outcomes
        let b = Breaker::new(BreakerSettings {
            failures: 0,
            error_rate: Some(0.5),
            min_requests: 4,
            window: Duration::from_secs(1),
            ..settings(0, 1_000)
        });
        b.on_failure(t0);
        b.on_failure(t0);
        b.on_success(t0, Duration::ZERO);
        assert!(
            !b.on_failure(ms(t0, 1_000)),
            "new window: 1 of 1 < min_requests"
        );
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn zero_failures_disables_the_streak_rule() {
        let t0 = Instant::now();
        let b = Breaker::new(settings(0, 1_000));
        for _ in 0..1_000 {
            assert!(b.allow(t0));
            assert!(!b.on_failure(t0));
        }
    }
}
