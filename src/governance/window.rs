//! A fixed 60-second counting window, anchored at its first charge (the window a Redis
//! `INCR` + `EXPIRE` pair gives): it opens when something is charged into an empty window and
//! closes 60 s later, when the count starts again from zero.
//!
//! Owns: `Window` (plain `Cell`s, one shard's). Must not: be shared between threads or know
//! what it counts (requests or tokens).

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Length of a rate window.
pub const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub struct Window {
    start: Cell<Option<Instant>>,
    used: Cell<u64>,
    /// Bumped whenever a new window opens: a late correction for an old window is not applied
    /// to a new one.
    generation: Cell<u32>,
}

/// Refused: the window frees up after this long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub retry_after: Duration,
}

impl Window {
    /// Close the window if its 60 s are over.
    fn roll(&self, now: Instant) {
        if let Some(s) = self.start.get() {
            if now.saturating_duration_since(s) >= WINDOW {
                self.start.set(None);
                self.used.set(0);
            }
        }
    }

    /// Charge `n` if `used + n <= limit`; returns the window's generation (for a later
    /// `correct`).
    pub fn take(&self, now: Instant, n: u64, limit: u64) -> Result<u32, Full> {
        self.roll(now);
        let used = self.used.get();
        if used.saturating_add(n) > limit {
            return Err(Full {
                retry_after: self.reset_in(now),
            });
        }
        self.charge(now, n);
        Ok(self.generation.get())
    }

    /// Charge `n` unconditionally (real usage that came back over the estimate).
    pub fn charge(&self, now: Instant, n: u64) {
        self.roll(now);
        if self.start.get().is_none() {
            self.start.set(Some(now));
            self.generation.set(self.generation.get().wrapping_add(1));
        }
        self.used.set(self.used.get().saturating_add(n));
    }

    /// Replace an earlier charge of `was` (in window `generation`) by `now_is`: within the same
    /// window the difference is given back or added; if that window has closed meanwhile, the
    /// real amount counts in the current one when it is larger than zero.
    pub fn correct(&self, now: Instant, generation: u32, was: u64, now_is: u64) {
        self.roll(now);
        if self.start.get().is_some() && self.generation.get() == generation {
            self.used
                .set(self.used.get().saturating_sub(was).saturating_add(now_is));
        } else if now_is > 0 {
            self.charge(now, now_is);
        }
    }

    /// Counted so far in the open window (0 when none is open).
    pub fn used(&self, now: Instant) -> u64 {
        self.roll(now);
        self.used.get()
    }

    /// Time until the open window closes (a whole window when none is open).
    pub fn reset_in(&self, now: Instant) -> Duration {
        match self.start.get() {
            Some(s) => (s + WINDOW).saturating_duration_since(now),
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
        let w = Window::default();
        let t0 = Instant::now();
        assert!(w.take(t0, 1, 2).is_ok());
        assert!(w.take(t0 + Duration::from_secs(10), 1, 2).is_ok());
        let full = w.take(t0 + Duration::from_secs(20), 1, 2).unwrap_err();
        assert_eq!(full.retry_after, Duration::from_secs(40));
        assert_eq!(secs_up(full.retry_after), 40);
        // the window closes 60 s after its first charge
        assert!(w.take(t0 + WINDOW, 1, 2).is_ok());
        assert_eq!(w.used(t0 + WINDOW), 1);
        assert_eq!(w.reset_in(t0 + WINDOW), WINDOW);
    }

    #[test]
    fn corrections_stay_in_their_window() {
        let w = Window::default();
        let t0 = Instant::now();
        let g = w.take(t0, 100, 1000).unwrap();
        w.correct(t0, g, 100, 30);
        assert_eq!(w.used(t0), 30);
        assert!(w.take(t0, 971, 1000).is_err(), "30 + 971 > 1000");
        // the window closed: the real amount counts in the new one
        let later = t0 + WINDOW + Duration::from_secs(1);
        w.correct(later, g, 100, 30);
        assert_eq!(w.used(later), 30);
        assert_eq!(secs_up(Duration::from_millis(1)), 1);
        assert_eq!(secs_up(Duration::ZERO), 1);
    }
}
