//! A fixed 60-second counting window, anchored at its first charge (the window a Redis
//! `INCR` + `EXPIRE` pair gives): it opens when something is charged into an empty window and
//! closes 60 s later, when the count starts again from zero.
//!
//! **Shared and exact.** One window is one `AtomicU64` holding the window's start (32 bits, in
//! ticks of 1/16 s since the process's `Clock` epoch) and its count (32 bits), changed only by
//! compare-and-swap: shards racing for the last unit of a limit can never admit more than the
//! limit, and a window that closes while a charge races its opening is counted once. Counts
//! saturate at 2³² − 1 (a limit above that acts as that); the start wraps after 8.5 years of
//! uptime (wrapping arithmetic keeps windows right, except one left untouched for a multiple of
//! exactly that long, which then counts as open until it is touched).
//!
//! Owns: `Window`, `Clock`, `Tick`. Must not: know what it counts (requests or tokens) or lock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Length of a rate window.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Ticks per second (a window's start is kept to 1/16 s).
const TICKS_PER_SEC: u64 = 16;
const WINDOW_TICKS: u32 = (60 * TICKS_PER_SEC) as u32;
const NANOS_PER_TICK: u64 = 1_000_000_000 / TICKS_PER_SEC;
/// The largest count a window holds.
const MAX_COUNT: u64 = u32::MAX as u64;

/// A point in time as windows see it (1/16 s since the clock's epoch, wrapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick(u32);

/// Turns `Instant`s into `Tick`s; one per process (shared by every window it serves).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch: Instant,
}

impl Default for Clock {
    fn default() -> Clock {
        Clock {
            epoch: Instant::now(),
        }
    }
}

impl Clock {
    /// `at` in ticks. A never-charged window (start 0) is closed at every tick: ticks start one
    /// window after 0.
    pub fn tick(&self, at: Instant) -> Tick {
        let d = at.saturating_duration_since(self.epoch);
        let t = d.as_secs() * TICKS_PER_SEC + u64::from(d.subsec_nanos()) / NANOS_PER_TICK;
        Tick((t as u32).wrapping_add(WINDOW_TICKS))
    }

    pub fn now(&self) -> Tick {
        self.tick(Instant::now())
    }
}

#[derive(Debug, Default)]
pub struct Window {
    /// start tick << 32 | count
    word: AtomicU64,
}

/// Refused: the window frees up after this long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub retry_after: Duration,
}

fn unpack(w: u64) -> (u32, u64) {
    ((w >> 32) as u32, w & MAX_COUNT)
}

fn pack(start: u32, count: u64) -> u64 {
    (u64::from(start) << 32) | count.min(MAX_COUNT)
}

fn ticks(n: u32) -> Duration {
    Duration::from_nanos(u64::from(n) * NANOS_PER_TICK)
}

impl Window {
    /// The open window at `now`: (start, count), or `None` when it has closed.
    fn open(word: u64, now: Tick) -> Option<(u32, u64)> {
        let (start, count) = unpack(word);
        (now.0.wrapping_sub(start) < WINDOW_TICKS).then_some((start, count))
    }

    /// Change the word with `f` (given the open window or `None`); `f` returns the new word or
    /// `None` to leave it as it is. Returns what `f` returned.
    fn update<T>(&self, now: Tick, mut f: impl FnMut(Option<(u32, u64)>) -> (Option<u64>, T)) -> T {
        let mut cur = self.word.load(Relaxed);
        loop {
            let (new, out) = f(Window::open(cur, now));
            let Some(new) = new else {
                return out;
            };
            match self.word.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
                Ok(_) => return out,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Charge `n` if `used + n <= limit`; returns the window's start (for a later `correct`).
    pub fn take(&self, now: Tick, n: u64, limit: u64) -> Result<Tick, Full> {
        let limit = limit.min(MAX_COUNT);
        self.update(now, |open| {
            let (start, used) = open.unwrap_or((now.0, 0));
            if used.saturating_add(n) > limit {
                let left = start.wrapping_add(WINDOW_TICKS).wrapping_sub(now.0);
                let retry_after = if open.is_some() { ticks(left) } else { WINDOW };
                return (None, Err(Full { retry_after }));
            }
            (Some(pack(start, used.saturating_add(n))), Ok(Tick(start)))
        })
    }

    /// Charge `n` unconditionally (real usage that came back over the estimate, or what a
    /// shared store admitted); returns the window's start.
    pub fn charge(&self, now: Tick, n: u64) -> Tick {
        self.update(now, |open| {
            let (start, used) = open.unwrap_or((now.0, 0));
            (Some(pack(start, used.saturating_add(n))), Tick(start))
        })
    }

    /// Replace an earlier charge of `was` (in the window that started at `start`) by `now_is`:
    /// within the same window the difference is given back or added; if that window has closed
    /// meanwhile, the real amount counts in the current one when it is larger than zero.
    pub fn correct(&self, now: Tick, start: Tick, was: u64, now_is: u64) {
        self.update(now, |open| match open {
            Some((s, used)) if s == start.0 => (
                Some(pack(s, used.saturating_sub(was).saturating_add(now_is))),
                (),
            ),
            _ if now_is == 0 => (None, ()),
            open => {
                let (s, used) = open.unwrap_or((now.0, 0));
                (Some(pack(s, used.saturating_add(now_is))), ())
            }
        })
    }

    /// Counted so far in the open window (0 when none is open).
    pub fn used(&self, now: Tick) -> u64 {
        Window::open(self.word.load(Relaxed), now).map_or(0, |(_, c)| c)
    }

    /// Time until the open window closes (a whole window when none is open).
    pub fn reset_in(&self, now: Tick) -> Duration {
        match Window::open(self.word.load(Relaxed), now) {
            Some((s, _)) => ticks(s.wrapping_add(WINDOW_TICKS).wrapping_sub(now.0)),
            None => WINDOW,
        }
    }
}

/// Whole seconds, rounded up, at least 1 (for `Retry-After` and the reset headers).
pub fn secs_up(d: Duration) -> u64 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_window_anchored_at_first_charge() {
        let c = Clock::default();
        let w = Window::default();
        let t0 = Instant::now();
        let at = |s: u64| c.tick(t0 + Duration::from_secs(s));
        assert_eq!(w.used(at(0)), 0);
        assert_eq!(w.reset_in(at(0)), WINDOW);
        assert!(w.take(at(0), 1, 2).is_ok());
        assert!(w.take(at(10), 1, 2).is_ok());
        let full = w.take(at(20), 1, 2).unwrap_err();
        assert_eq!(full.retry_after, Duration::from_secs(40));
        assert_eq!(secs_up(full.retry_after), 40);
        // the window closes 60 s after its first charge
        assert!(w.take(at(60), 1, 2).is_ok());
        assert_eq!(w.used(at(60)), 1);
        assert_eq!(w.reset_in(at(60)), WINDOW);
        // alone over the limit: refused with a whole window, nothing charged
        assert_eq!(w.take(at(200), 3, 2).unwrap_err().retry_after, WINDOW);
        assert_eq!(w.used(at(200)), 0);
    }

    #[test]
    fn corrections_stay_in_their_window() {
        let c = Clock::default();
        let w = Window::default();
        let t0 = c.now();
        let g = w.take(t0, 100, 1000).unwrap();
        w.correct(t0, g, 100, 30);
        assert_eq!(w.used(t0), 30);
        assert!(w.take(t0, 971, 1000).is_err(), "30 + 971 > 1000");
        // the window closed: the real amount counts in the new one
        let later = c.tick(Instant::now() + WINDOW + Duration::from_secs(1));
        w.correct(later, g, 100, 30);
        assert_eq!(w.used(later), 30);
        assert_eq!(secs_up(Duration::from_millis(1)), 1);
        assert_eq!(secs_up(Duration::ZERO), 1);
    }

    #[test]
    fn counts_saturate_and_huge_limits_act_as_the_largest_count() {
        let c = Clock::default();
        let w = Window::default();
        let t = c.now();
        w.charge(t, u64::MAX);
        assert_eq!(w.used(t), MAX_COUNT);
        w.charge(t, 5);
        assert_eq!(w.used(t), MAX_COUNT, "saturated, not wrapped");
        assert!(w.take(t, 1, u64::MAX).is_err());
        let g = w.charge(t, 0);
        w.correct(t, g, u64::MAX, 7);
        assert_eq!(w.used(t), 7);
    }

    #[test]
    fn racing_threads_never_admit_more_than_the_limit() {
        let c = Clock::default();
        let w = std::sync::Arc::new(Window::default());
        let t = c.now();
        let admitted: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let w = w.clone();
                    s.spawn(move || (0..10_000).filter(|_| w.take(t, 1, 5_000).is_ok()).count())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap() as u64).sum()
        });
        assert_eq!(admitted, 5_000);
        assert_eq!(w.used(t), 5_000);
    }
}
