//! API-key rotation for one provider: weighted choice among its keys (smooth weighted
//! round-robin), skipping keys that are cooling down after a 429. A key cools for the
//! upstream's `Retry-After` (delta-seconds or an HTTP date), capped at `MAX_COOLDOWN`.
//!
//! A cooldown is scoped to what the provider limited (see `forward::scope`): the key for one
//! model (the deployment's upstream model; a `prefix*` model without one is one scope), or the
//! whole key when the answer says the whole key is limited. A model's 429 never holds back
//! another model on the same key. Cooldowns are process-wide: each is a `CoolCell` (an
//! `AtomicU64` holding the ms routing-clock instant it ends) shared by every shard
//! (`forward::shared`), so a 429 seen on one shard cools the key on all of them; checking one
//! is a `Relaxed` load. The rotation's running scores stay per shard.
//!
//! Owns: `KeyRing`, `KeyPick`, `CoolCell`, `parse_retry_after`. Must not: hold or read the
//! keys themselves (they live in `route::Provider::keys` as prebuilt header lines) or read
//! clocks.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::balance::Rotation;
use crate::engine::signal::ms_of;

/// Longest cooldown a `Retry-After` can impose on a key.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(120);
/// Cooldown after a 429 that gave no (parsable) `Retry-After`.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPick {
    /// Use this key (index into `Provider::keys`).
    Ready(usize),
    /// Every key is cooling; this one is free again first, at `until`.
    Cooling { key: usize, until: Instant },
}

/// When one cooldown ends (ms routing clock, `engine::signal::ms_of`; 0: not cooling), shared
/// by every shard.
#[derive(Debug, Default)]
pub struct CoolCell(AtomicU64);

impl CoolCell {
    fn until(&self) -> u64 {
        self.0.load(Relaxed)
    }

    /// Cool until `until` unless a longer cooldown runs; returns the end that holds.
    fn extend(&self, until: u64) -> u64 {
        self.0.fetch_max(until, Relaxed).max(until)
    }

    /// A cooldown found over at `now` (ms) goes back to 0, so later checks need no clock.
    fn clear_if_over(&self, now: u64) {
        let u = self.until();
        if u != 0 && now >= u {
            let _ = self.0.compare_exchange(u, 0, Relaxed, Relaxed);
        }
    }
}

/// `now` in ms, converted at most once (most checks find no cooldown and need none).
struct Clock {
    now: Instant,
    ms: Cell<u64>,
}

impl Clock {
    fn new(now: Instant) -> Clock {
        Clock {
            now,
            ms: Cell::new(0),
        }
    }

    fn ms(&self) -> u64 {
        if self.ms.get() == 0 {
            self.ms.set(ms_of(self.now));
        }
        self.ms.get()
    }

    /// Whether a cooldown ending at `until` (0: none) still runs.
    fn cooling(&self, until: u64) -> bool {
        until != 0 && self.ms() < until
    }
}

#[derive(Debug)]
pub struct KeyRing {
    /// `whole[key]`: the whole key is limited (every model).
    whole: Vec<Arc<CoolCell>>,
    rotation: Rotation,
    /// `scoped[scope][key]`: the key limited for one scope (model) only.
    scoped: Vec<Vec<Arc<CoolCell>>>,
}

impl KeyRing {
    /// One entry per key with its weight (≥ 1), one scope, cooldown cells of its own (tests).
    /// A provider without keys gets one keyless slot.
    pub fn new(weights: &[u32]) -> KeyRing {
        let n = weights.len().max(1);
        let cells = |_| (0..n).map(|_| Arc::default()).collect::<Vec<_>>();
        KeyRing::shared(weights, cells(0), vec![cells(1)])
    }

    /// A ring over shared cells: `whole[k]` for key k, `scoped[s][k]` for key k in scope s
    /// (`forward::shared`). A provider without keys gets one keyless slot.
    pub fn shared(
        weights: &[u32],
        whole: Vec<Arc<CoolCell>>,
        scoped: Vec<Vec<Arc<CoolCell>>>,
    ) -> KeyRing {
        let weights = if weights.is_empty() {
            &[1][..]
        } else {
            weights
        };
        let mut whole = whole;
        let n = whole.len().min(weights.len());
        whole.truncate(n);
        KeyRing {
            whole,
            rotation: Rotation::new(&weights[..n]),
            scoped,
        }
    }

    pub fn len(&self) -> usize {
        self.whole.len()
    }

    pub fn is_empty(&self) -> bool {
        self.whole.is_empty()
    }

    /// When key `key` is free for `scope` (ms; 0 or past: now).
    fn until(&self, key: usize, scope: usize) -> u64 {
        let whole = self.whole.get(key).map_or(0, |c| c.until());
        let scoped = self
            .scoped
            .get(scope)
            .and_then(|s| s.get(key))
            .map_or(0, |c| c.until());
        whole.max(scoped)
    }

    pub fn is_cooling(&self, key: usize, scope: usize, now: Instant) -> bool {
        Clock::new(now).cooling(self.until(key, scope))
    }

    /// What `pick` would answer, without advancing the rotation.
    pub fn peek(&self, now: Instant, scope: usize) -> KeyPick {
        let clock = Clock::new(now);
        if let Some(i) = (0..self.whole.len()).find(|&i| !clock.cooling(self.until(i, scope))) {
            return KeyPick::Ready(i);
        }
        self.soonest(now, scope)
    }

    /// The next key by weight among those not cooling for `scope`; when all cool, the one
    /// free soonest.
    pub fn pick(&self, now: Instant, scope: usize) -> KeyPick {
        let clock = Clock::new(now);
        let free = |i: usize| {
            let until = self.until(i, scope);
            if clock.cooling(until) {
                return false;
            }
            if until != 0 {
                // over: back to 0 (this key's later checks read no clock)
                let scoped = self.scoped.get(scope).and_then(|s| s.get(i));
                for c in self.whole.get(i).into_iter().chain(scoped) {
                    c.clear_if_over(clock.ms());
                }
            }
            true
        };
        match self.rotation.pick(free) {
            Some(b) => KeyPick::Ready(b),
            None => self.soonest(now, scope),
        }
    }

    fn soonest(&self, now: Instant, scope: usize) -> KeyPick {
        let ms = ms_of(now);
        let mut out = KeyPick::Ready(0);
        let mut best: Option<u64> = None;
        for i in 0..self.whole.len() {
            let u = self.until(i, scope);
            if u > ms && best.is_none_or(|b| u < b) {
                best = Some(u);
                out = KeyPick::Cooling {
                    key: i,
                    until: now + Duration::from_millis(u - ms),
                };
            }
        }
        out
    }

    /// `key` got a 429 for `scope` (or, `whole`, for every scope): cool it for `retry_after`
    /// (default `DEFAULT_COOLDOWN`, capped at `MAX_COOLDOWN`). Returns when it is free again.
    /// A longer running cooldown is kept.
    pub fn cool(
        &self,
        key: usize,
        scope: usize,
        whole: bool,
        now: Instant,
        retry_after: Option<Duration>,
    ) -> Option<Instant> {
        let cell = match whole {
            true => self.whole.get(key)?,
            false => self.scoped.get(scope).and_then(|s| s.get(key))?,
        };
        let ms = ms_of(now);
        let wait = retry_after.unwrap_or(DEFAULT_COOLDOWN).min(MAX_COOLDOWN);
        let until = cell.extend(ms + wait.as_millis() as u64);
        Some(now + Duration::from_millis(until - ms))
    }
}

/// Parse a `Retry-After` value: delta-seconds (`"7"`) or an IMF-fixdate
/// (`"Sun, 06 Nov 1994 08:49:37 GMT"`), relative to the wall clock `now`. A date in the past
/// gives zero; anything else gives `None`. Fractional seconds (`"1.5"`, sent by some
/// OpenAI-compatible servers) are accepted too.
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let s = std::str::from_utf8(value).ok()?.trim();
    if s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() {
        return Some(Duration::from_secs(s.parse::<u64>().unwrap_or(u64::MAX)));
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let f: f64 = s.parse().ok()?;
        return (f.is_finite() && f >= 0.0).then(|| Duration::from_secs_f64(f.min(1e9)));
    }
    let at = parse_imf_fixdate(s)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` (RFC 9110 §5.6.7 IMF-fixdate; the obsolete formats are not
/// accepted).
fn parse_imf_fixdate(s: &str) -> Option<SystemTime> {
    let (_, rest) = s.split_once(", ")?;
    let mut it = rest.split(' ');
    let day: u64 = it.next()?.parse().ok()?;
    let month = match it.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = it.next()?.parse().ok()?;
    let mut hms = it.next()?.split(':');
    let (h, m, sec): (u64, u64, u64) = (
        hms.next()?.parse().ok()?,
        hms.next()?.parse().ok()?,
        hms.next()?.parse().ok()?,
    );
    if it.next()? != "GMT" || it.next().is_some() || hms.next().is_some() {
        return None;
    }
    if !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 || year < 1970 {
        return None;
    }
    let days = u64::try_from(crate::util::date::days_from_civil(year, month, day as i64)).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(days * 86_400 + h * 3_600 + m * 60 + sec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn weighted_rotation_2_to_1() {
        let r = KeyRing::new(&[2, 1]);
        let now = Instant::now();
        let picks: Vec<KeyPick> = (0..6).map(|_| r.pick(now, 0)).collect();
        let zeros = picks.iter().filter(|p| **p == KeyPick::Ready(0)).count();
        assert_eq!(zeros, 4, "{picks:?}");
    }

    #[test]
    fn a_429_key_cools_for_its_retry_after_and_is_skipped() {
        let t0 = Instant::now();
        let r = KeyRing::new(&[2, 1]);
        assert_eq!(r.cool(0, 0, false, t0, Some(s(5))), Some(t0 + s(5)));
        assert!(r.is_cooling(0, 0, t0 + s(4)));
        for _ in 0..10 {
            assert_eq!(r.pick(t0 + s(1), 0), KeyPick::Ready(1));
        }
        assert!(!r.is_cooling(0, 0, t0 + s(5)));
        assert!((0..3).any(|_| r.pick(t0 + s(5), 0) == KeyPick::Ready(0)));
    }

    #[test]
    fn all_cooling_reports_the_soonest() {
        let t0 = Instant::now();
        let r = KeyRing::new(&[1, 1, 1]);
        r.cool(0, 0, false, t0, Some(s(30)));
        r.cool(1, 0, false, t0, Some(s(3)));
        r.cool(2, 0, false, t0, None);
        r.cool(2, 0, false, t0, Some(s(10)));
        let want = KeyPick::Cooling {
            key: 1,
            until: t0 + s(3),
        };
        assert_eq!(r.pick(t0, 0), want);
        assert_eq!(r.peek(t0, 0), want);
        assert_eq!(r.pick(t0 + s(3), 0), KeyPick::Ready(1));
    }

    #[test]
    fn cooldown_is_capped_and_defaults() {
        let t0 = Instant::now();
        let r = KeyRing::new(&[1]);
        assert_eq!(
            r.cool(0, 0, false, t0, Some(s(86_400))),
            Some(t0 + MAX_COOLDOWN)
        );
        let r = KeyRing::new(&[]);
        assert_eq!(r.len(), 1);
        assert_eq!(r.cool(0, 0, false, t0, None), Some(t0 + DEFAULT_COOLDOWN));
        assert_eq!(r.cool(3, 0, false, t0, None), None);
    }

    #[test]
    fn retry_after_values() {
        let now = UNIX_EPOCH + s(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        let cases: [(&str, Option<Duration>); 9] = [
            ("7", Some(s(7))),
            (" 0 ", Some(s(0))),
            ("1.5", Some(Duration::from_millis(1_500))),
            ("Sun, 06 Nov 1994 08:49:37 GMT", Some(s(0))),
            ("Sun, 06 Nov 1994 08:50:07 GMT", Some(s(30))),
            ("Mon, 07 Nov 1994 08:49:37 GMT", Some(s(86_400))),
            ("Sat, 05 Nov 1994 08:49:37 GMT", Some(s(0))),
            ("Sunday, 06-Nov-94 08:49:37 GMT", None),
            ("soon", None),
        ];
        for (v, want) in cases {
            assert_eq!(parse_retry_after(v.as_bytes(), now), want, "{v:?}");
        }
        assert_eq!(parse_retry_after(b"", now), None);
        assert_eq!(crate::util::date::days_from_civil(2000, 3, 1), 11_017);
    }
}
