//! The circuit breaker of one deployment (per shard): closed → open after N consecutive
//! failures (or an error rate over a tumbling window) → half-open after the cooldown, where
//! exactly one probe goes through; the probe's success closes it, its failure re-opens it for
//! another cooldown.
//!
//! Owns: `Breaker`, `BreakerState`. Must not: read clocks (every call takes `now`), do IO, or
//! know why a failure happened (the caller decides what counts, see `Reason::trips_breaker`).

use std::cell::Cell;
use std::time::{Duration, Instant};

use super::policy::BreakerSettings;

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

#[derive(Debug, Clone, Copy)]
struct Inner {
    state: BreakerState,
    /// Consecutive failures while closed.
    streak: u32,
    /// Open: when the cooldown ends. Half-open: when the probe lease expires (a probe that
    /// never reports back frees the slot after one more cooldown).
    until: Option<Instant>,
    /// Half-open: whether the one probe is out.
    probing: bool,
    window_start: Option<Instant>,
    window_total: u32,
    window_failed: u32,
}

#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    inner: Cell<Inner>,
}

impl Breaker {
    pub fn new(settings: BreakerSettings) -> Breaker {
        Breaker {
            settings,
            inner: Cell::new(Inner {
                state: BreakerState::Closed,
                streak: 0,
                until: None,
                probing: false,
                window_start: None,
                window_total: 0,
                window_failed: 0,
            }),
        }
    }

    pub fn state(&self) -> BreakerState {
        self.inner.get().state
    }

    /// Whether `allow(now)` would let a request through, without taking the probe slot
    /// (the balancer filters with this; the plan then calls `allow` on its pick).
    pub fn available(&self, now: Instant) -> bool {
        let i = self.inner.get();
        match i.state {
            BreakerState::Closed => true,
            BreakerState::Open => i.until.is_none_or(|u| now >= u),
            BreakerState::HalfOpen => !i.probing || i.until.is_none_or(|u| now >= u),
        }
    }

    /// Let a request through? Closed: yes. Open: no until the cooldown ended, then the
    /// breaker turns half-open and this request is its one probe. Half-open: no while the
    /// probe is out.
    pub fn allow(&self, now: Instant) -> bool {
        let mut i = self.inner.get();
        let ok = match i.state {
            BreakerState::Closed => true,
            BreakerState::Open | BreakerState::HalfOpen if self.available(now) => {
                i.state = BreakerState::HalfOpen;
                i.probing = true;
                i.until = Some(now + self.settings.cooldown);
                true
            }
            _ => false,
        };
        self.inner.set(i);
        ok
    }

    /// A probe that ended without a verdict (the client went away): let another through.
    pub fn release_probe(&self) {
        let mut i = self.inner.get();
        if i.state == BreakerState::HalfOpen {
            i.probing = false;
            self.inner.set(i);
        }
    }

    pub fn on_success(&self, now: Instant, _latency: Duration) {
        let mut i = self.inner.get();
        match i.state {
            BreakerState::Closed => {
                i.streak = 0;
                self.count(&mut i, now, false);
            }
            BreakerState::HalfOpen => i = self.closed(),
            // A late success from before the breaker opened does not close it.
            BreakerState::Open => {}
        }
        self.inner.set(i);
    }

    /// Record a failure; returns true when this failure opened the breaker.
    pub fn on_failure(&self, now: Instant) -> bool {
        let mut i = self.inner.get();
        let opened = match i.state {
            BreakerState::Closed => {
                i.streak = i.streak.saturating_add(1);
                let rate_trip = self.count(&mut i, now, true);
                let streak_trip = self.settings.failures > 0 && i.streak >= self.settings.failures;
                streak_trip || rate_trip
            }
            BreakerState::HalfOpen => true,
            // Late failures of requests started before it opened do not extend the cooldown.
            BreakerState::Open => false,
        };
        if opened {
            i.state = BreakerState::Open;
            i.until = Some(now + self.settings.cooldown);
            i.probing = false;
        }
        self.inner.set(i);
        opened
    }

    fn closed(&self) -> Inner {
        Breaker::new(self.settings).inner.get()
    }

    /// Count an outcome in the error-rate window; true when the rate rule trips.
    fn count(&self, i: &mut Inner, now: Instant, failed: bool) -> bool {
        let Some(rate) = self.settings.error_rate else {
            return false;
        };
        if i.window_start
            .is_none_or(|s| now.saturating_duration_since(s) >= self.settings.window)
        {
            i.window_start = Some(now);
            i.window_total = 0;
            i.window_failed = 0;
        }
        i.window_total += 1;
        i.window_failed += u32::from(failed);
        failed
            && i.window_total >= self.settings.min_requests.max(1)
            && f64::from(i.window_failed) >= rate * f64::from(i.window_total)
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
