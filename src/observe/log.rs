//! Minimal line logger to stderr with a timestamp. Bounded by construction: callers on hot
//! paths must rate-limit (see `admit`), this module never queues.
//!
//! Owns: the log line format, the optional process-wide sink that replaces stderr (`set_sink`,
//! for test harnesses that capture output per test), and `RateLimited`, the per-shard line
//! limiter for events that can repeat at request rate (upstream failures). Must not: buffer,
//! allocate per call beyond formatting, or block on anything but the stderr write (or the sink).

use std::cell::Cell;
use std::fmt::Arguments;
use std::io::Write;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where lines go instead of stderr, when set (one line per call, without its newline).
static SINK: OnceLock<fn(Arguments<'_>)> = OnceLock::new();

/// Send every later log line of this process to `sink` instead of stderr. The first call wins;
/// later ones are ignored. The server never calls it: it is for embedders such as the
/// integration tests, whose sink prints with `eprintln!` so the harness shows a gateway's log
/// only for a failing test.
pub fn set_sink(sink: fn(Arguments<'_>)) {
    let _ = SINK.set(sink);
}

pub fn info(args: Arguments<'_>) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let (secs, millis) = (now.as_secs(), now.subsec_millis());
    if cfg!(test) {
        // the unit tests' lines go through the harness's capture (shown for a failing test)
        eprintln!("{secs}.{millis:03} ringgate: {args}");
        return;
    }
    if let Some(sink) = SINK.get() {
        sink(format_args!("{secs}.{millis:03} ringgate: {args}"));
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{secs}.{millis:03} ringgate: {args}");
}

/// At most `per_window` lines per one-second window; the lines over that are counted and the
/// count is reported with the next line let through (or by [`RateLimited::flush`] from a
/// periodic tick). Shard-local (`Cell`s): one per shard and call site.
pub struct RateLimited {
    per_window: u32,
    window_start: Cell<Option<Instant>>,
    used: Cell<u32>,
    suppressed: Cell<u64>,
}

const WINDOW: Duration = Duration::from_secs(1);

impl RateLimited {
    pub const fn new(per_window: u32) -> RateLimited {
        RateLimited {
            per_window,
            window_start: Cell::new(None),
            used: Cell::new(0),
            suppressed: Cell::new(0),
        }
    }

    /// Whether a line may be written at `now`. `Some(n)`: yes, and `n` earlier lines were
    /// suppressed since the last one written (say so in the line). `None`: over the limit; the
    /// line is counted, not written.
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let fresh = self
            .window_start
            .get()
            .is_none_or(|t| now.saturating_duration_since(t) >= WINDOW);
        if fresh {
            self.window_start.set(Some(now));
            self.used.set(0);
        }
        if self.used.get() >= self.per_window {
            self.suppressed.set(self.suppressed.get() + 1);
            return None;
        }
        self.used.set(self.used.get() + 1);
        Some(self.suppressed.replace(0))
    }

    /// Lines suppressed and not yet reported, once the window they fell in is over.
    pub fn flush(&self, now: Instant) -> Option<u64> {
        let over = self
            .window_start
            .get()
            .is_some_and(|t| now.saturating_duration_since(t) >= WINDOW);
        if over && self.suppressed.get() > 0 {
            return Some(self.suppressed.replace(0));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limited_counts_what_it_drops() {
        let r = RateLimited::new(2);
        let t = Instant::now();
        assert_eq!(r.admit(t), Some(0));
        assert_eq!(r.admit(t), Some(0));
        assert_eq!(r.admit(t), None);
        assert_eq!(r.admit(t), None);
        assert_eq!(r.flush(t), None, "window not over yet");
        assert_eq!(
            r.admit(t + WINDOW),
            Some(2),
            "the next line reports the dropped ones"
        );
        assert_eq!(r.admit(t + WINDOW), Some(0));
        assert_eq!(r.admit(t + WINDOW), None);
        assert_eq!(r.flush(t + WINDOW * 2), Some(1));
        assert_eq!(r.flush(t + WINDOW * 3), None);
    }
}
