//! API-key rotation for one provider (per shard): weighted choice among its keys (smooth
//! weighted round-robin), skipping keys that are cooling down after a 429. A key cools for
//! the upstream's `Retry-After` (delta-seconds or an HTTP date), capped at `MAX_COOLDOWN`.
//!
//! Owns: `KeyRing`, `KeyPick`, `parse_retry_after`. Must not: hold or read the keys themselves
//! (they live in `route::Provider::keys` as prebuilt header lines) or read clocks.

use std::cell::Cell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

#[derive(Debug)]
struct Key {
    weight: i64,
    current: Cell<i64>,
    cool_until: Cell<Option<Instant>>,
}

#[derive(Debug)]
pub struct KeyRing {
    keys: Vec<Key>,
}

impl KeyRing {
    /// One entry per key with its weight (≥ 1). A provider without keys gets one keyless slot.
    pub fn new(weights: &[u32]) -> KeyRing {
        let weights = if weights.is_empty() {
            &[1][..]
        } else {
            weights
        };
        KeyRing {
            keys: weights
                .iter()
                .map(|&w| Key {
                    weight: i64::from(w.max(1)),
                    current: Cell::new(0),
                    cool_until: Cell::new(None),
                })
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn is_cooling(&self, key: usize, now: Instant) -> bool {
        self.keys
            .get(key)
            .and_then(|k| k.cool_until.get())
            .is_some_and(|u| now < u)
    }

    /// What `pick` would answer, without advancing the rotation.
    pub fn peek(&self, now: Instant) -> KeyPick {
        if let Some(i) = (0..self.keys.len()).find(|&i| !self.is_cooling(i, now)) {
            return KeyPick::Ready(i);
        }
        self.soonest()
    }

    /// The next key by weight among those not cooling; when all cool, the one free soonest.
    pub fn pick(&self, now: Instant) -> KeyPick {
        let mut total = 0;
        let mut best: Option<usize> = None;
        for (i, k) in self.keys.iter().enumerate() {
            if self.is_cooling(i, now) {
                continue;
            }
            k.current.set(k.current.get() + k.weight);
            total += k.weight;
            if best.is_none_or(|b| k.current.get() > self.keys[b].current.get()) {
                best = Some(i);
            }
        }
        match best {
            Some(b) => {
                let k = &self.keys[b];
                k.current.set(k.current.get() - total);
                KeyPick::Ready(b)
            }
            None => self.soonest(),
        }
    }

    fn soonest(&self) -> KeyPick {
        let mut out = KeyPick::Ready(0);
        let mut best: Option<Instant> = None;
        for (i, k) in self.keys.iter().enumerate() {
            if let Some(u) = k.cool_until.get() {
                if best.is_none_or(|b| u < b) {
                    best = Some(u);
                    out = KeyPick::Cooling { key: i, until: u };
                }
            }
        }
        out
    }

    /// `key` got a 429: cool it for `retry_after` (default `DEFAULT_COOLDOWN`, capped at
    /// `MAX_COOLDOWN`). Returns when it is free again. A longer running cooldown is kept.
    pub fn cool(&self, key: usize, now: Instant, retry_after: Option<Duration>) -> Option<Instant> {
        let k = self.keys.get(key)?;
        let until = now + retry_after.unwrap_or(DEFAULT_COOLDOWN).min(MAX_COOLDOWN);
        let until = k.cool_until.get().map_or(until, |u| u.max(until));
        k.cool_until.set(Some(until));
        Some(until)
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
    let days = u64::try_from(crate::date::days_from_civil(year, month, day as i64)).ok()?;
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
        let picks: Vec<KeyPick> = (0..6).map(|_| r.pick(now)).collect();
        let zeros = picks.iter().filter(|p| **p == KeyPick::Ready(0)).count();
        assert_eq!(zeros, 4, "{picks:?}");
    }

    #[test]
    fn a_429_key_cools_for_its_retry_after_and_is_skipped() {
        let t0 = Instant::now();
        let r = KeyRing::new(&[2, 1]);
        assert_eq!(r.cool(0, t0, Some(s(5))), Some(t0 + s(5)));
        assert!(r.is_cooling(0, t0 + s(4)));
        for _ in 0..10 {
            assert_eq!(r.pick(t0 + s(1)), KeyPick::Ready(1));
        }
        assert!(!r.is_cooling(0, t0 + s(5)));
        assert!((0..3).any(|_| r.pick(t0 + s(5)) == KeyPick::Ready(0)));
    }

    #[test]
    fn all_cooling_reports_the_soonest() {
        let t0 = Instant::now();
        let r = KeyRing::new(&[1, 1, 1]);
        r.cool(0, t0, Some(s(30)));
        r.cool(1, t0, Some(s(3)));
        r.cool(2, t0, None);
        r.cool(2, t0, Some(s(10)));
        let want = KeyPick::Cooling {
            key: 1,
            until: t0 + s(3),
        };
        assert_eq!(r.pick(t0), want);
        assert_eq!(r.peek(t0), want);
        assert_eq!(r.pick(t0 + s(3)), KeyPick::Ready(1));
    }

    #[test]
    fn cooldown_is_capped_and_defaults() {
        let t0 = Instant::now();
        let r = KeyRing::new(&[1]);
        assert_eq!(r.cool(0, t0, Some(s(86_400))), Some(t0 + MAX_COOLDOWN));
        let r = KeyRing::new(&[]);
        assert_eq!(r.len(), 1);
        assert_eq!(r.cool(0, t0, None), Some(t0 + DEFAULT_COOLDOWN));
        assert_eq!(r.cool(3, t0, None), None);
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
        assert_eq!(crate::date::days_from_civil(2000, 3, 1), 11_017);
    }
}
