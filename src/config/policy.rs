//! A model's routing policy, resolved from the config: balancing method, attempt bound,
//! deadline, breaker settings, and which failures are retried.
//!
//! Owns: `Policy`, `Lb`, `Reason` (why an attempt failed), `RetrySet`, `BreakerSettings`.
//! Must not: hold runtime state (that is `ModelState`/`Breaker`/`KeyRing`) or do IO.

use std::time::Duration;

use serde::Deserialize;

/// How a model spreads requests over its deployments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lb {
    /// Power of two choices over peak-EWMA latency × (in-flight + 1).
    #[default]
    P2c,
    /// Smooth weighted round-robin (nginx): deterministic, exact over a full cycle.
    Weighted,
    /// Engine-aware: queue, KV usage and prefix affinity from the engines' own load signals
    /// (`engine::load`), with shedding (`max_waiting`, `max_in_flight`).
    Load,
}

impl Lb {
    pub fn as_str(self) -> &'static str {
        match self {
            Lb::P2c => "p2c",
            Lb::Weighted => "weighted",
            Lb::Load => "load",
        }
    }
}

/// Why one upstream attempt failed. The first nine are the `retry_on` vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// TCP/TLS connect failed (refused, unreachable, handshake error).
    Connect,
    /// Connect timed out.
    Timeout,
    /// The connection was reset/closed before any response byte.
    Reset,
    /// No response head within the first-byte timeout.
    FirstByteTimeout,
    Status429,
    Status500,
    Status502,
    Status503,
    Status504,
    /// Anything else that makes the deployment look unhealthy (other 5xx, broken HTTP).
    /// Counts for the breaker; never retried.
    Other,
}

impl Reason {
    /// Every reason, in metrics/label order (`Reason::index`).
    pub const ALL: [Reason; 10] = [
        Reason::Connect,
        Reason::Timeout,
        Reason::Reset,
        Reason::FirstByteTimeout,
        Reason::Status429,
        Reason::Status500,
        Reason::Status502,
        Reason::Status503,
        Reason::Status504,
        Reason::Other,
    ];

    /// The config/metrics spelling: `connect`, `timeout`, `reset`, `first-byte-timeout`,
    /// `429`, `500`, `502`, `503`, `504`, `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Connect => "connect",
            Reason::Timeout => "timeout",
            Reason::Reset => "reset",
            Reason::FirstByteTimeout => "first-byte-timeout",
            Reason::Status429 => "429",
            Reason::Status500 => "500",
            Reason::Status502 => "502",
            Reason::Status503 => "503",
            Reason::Status504 => "504",
            Reason::Other => "other",
        }
    }

    /// Parse a `retry_on` entry (`other` is not accepted: it is never retried).
    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL
            .into_iter()
            .find(|r| *r != Reason::Other && r.as_str() == s)
    }

    /// The failure an upstream status stands for; `None` for an answer that is passed to the
    /// client as it is and says nothing bad about the deployment (2xx, 3xx, 4xx but 429).
    pub fn from_status(status: u16) -> Option<Reason> {
        match status {
            429 => Some(Reason::Status429),
            500 => Some(Reason::Status500),
            502 => Some(Reason::Status502),
            503 => Some(Reason::Status503),
            504 => Some(Reason::Status504),
            501 | 505..=599 => Some(Reason::Other),
            _ => None,
        }
    }

    /// Dense index (position in `ALL`), for counter arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether this failure counts against the deployment's circuit breaker. A 429 does not:
    /// it cools the API key down instead (the deployment is healthy, the key is rate limited).
    pub fn trips_breaker(self) -> bool {
        self != Reason::Status429
    }
}

/// A set of retryable reasons (`retry_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySet(u16);

impl RetrySet {
    /// The default: every reason but `Other`.
    pub fn all() -> RetrySet {
        Reason::ALL
            .into_iter()
            .filter(|r| *r != Reason::Other)
            .fold(RetrySet::empty(), RetrySet::with)
    }

    pub fn empty() -> RetrySet {
        RetrySet(0)
    }

    pub fn with(self, r: Reason) -> RetrySet {
        RetrySet(self.0 | 1 << r.index())
    }

    pub fn contains(self, r: Reason) -> bool {
        self.0 & (1 << r.index()) != 0
    }
}

impl Default for RetrySet {
    fn default() -> Self {
        RetrySet::all()
    }
}

/// Circuit-breaker settings for each deployment of a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerSettings {
    /// Consecutive failures that open the breaker; 0 disables this rule.
    pub failures: u32,
    /// How long an open breaker stays open before a half-open probe.
    pub cooldown: Duration,
    /// Optional error-rate rule: open when, within one `window`, at least `min_requests`
    /// attempts finished and this share of them failed (0 < rate ≤ 1).
    pub error_rate: Option<f64>,
    pub window: Duration,
    pub min_requests: u32,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            failures: 5,
            cooldown: Duration::from_millis(10_000),
            error_rate: None,
            window: Duration::from_millis(10_000),
            min_requests: 20,
        }
    }
}

/// One entry of a model's `fallbacks`, resolved against the route table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback {
    /// The name as written in `fallbacks` (what is sent upstream when the fallback model is a
    /// `prefix*` pattern or has no `upstream_model`).
    pub name: String,
    /// Index of the fallback model's route (`RouteTable::route`).
    pub route: usize,
}

/// Default `max_retry_wait_ms`.
pub const MAX_RETRY_WAIT_MS: u64 = 1_000;

/// Everything a model's request needs to know to pick and retry deployments.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub lb: Lb,
    /// Total upstream attempts for one client request (first try included), ≥ 1.
    pub max_attempts: u32,
    pub breaker: BreakerSettings,
    pub retry_on: RetrySet,
    /// Overall budget for all attempts, from the request's start: no attempt starts after it,
    /// and no 429 `Retry-After` is waited on beyond it.
    pub deadline: Duration,
    /// Per-attempt wait for the response head (capped by what is left of `deadline`).
    pub first_byte_timeout: Duration,
    /// Longest total time one request waits for cooling keys (`max_retry_wait_ms`): a
    /// `Retry-After` beyond it is answered to the client at once.
    pub max_retry_wait: Duration,
    /// Direct fallbacks in config order. The attempt plan follows them transitively
    /// (breadth-first, each model once); the config rejects cycles.
    pub fallbacks: Vec<Fallback>,
    /// `lb = "load"` knobs (weights, affinity slack, `max_waiting`, `max_in_flight`).
    pub load: LoadSettings,
}

impl Policy {
    /// Whether a failure for `reason` may be retried on another candidate (nothing reached
    /// the client yet; the caller guarantees that).
    pub fn retryable(&self, reason: Reason) -> bool {
        self.retry_on.contains(reason)
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            lb: Lb::P2c,
            max_attempts: 3,
            breaker: BreakerSettings::default(),
            retry_on: RetrySet::all(),
            deadline: Duration::from_millis(900_000),
            first_byte_timeout: Duration::from_millis(300_000),
            max_retry_wait: Duration::from_millis(MAX_RETRY_WAIT_MS),
            fallbacks: Vec::new(),
            load: Default::default(),
        }
    }
}

/// A model's `lb = "load"` knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadSettings {
    /// Weights of the queue, KV and prefix scores (default 2, 2, 3).
    pub weights: [f64; 3],
    /// Prefix affinity counts while the queue is at most this much above the shortest.
    pub affinity_slack: u32,
    pub max_waiting: Option<u32>,
    pub max_in_flight: Option<u32>,
}

impl Default for LoadSettings {
    fn default() -> Self {
        LoadSettings {
            weights: [2.0, 2.0, 3.0],
            affinity_slack: 4,
            max_waiting: None,
            max_in_flight: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_vocabulary_round_trips() {
        for r in Reason::ALL {
            if r == Reason::Other {
                assert_eq!(Reason::parse("other"), None);
            } else {
                assert_eq!(Reason::parse(r.as_str()), Some(r));
            }
            assert_eq!(Reason::ALL[r.index()], r);
        }
        assert_eq!(Reason::parse("404"), None);
    }

    #[test]
    fn statuses_map_to_reasons() {
        let table = [
            (200, None),
            (400, None),
            (404, None),
            (429, Some(Reason::Status429)),
            (500, Some(Reason::Status500)),
            (501, Some(Reason::Other)),
            (502, Some(Reason::Status502)),
            (503, Some(Reason::Status503)),
            (504, Some(Reason::Status504)),
            (529, Some(Reason::Other)),
        ];
        for (status, want) in table {
            assert_eq!(Reason::from_status(status), want, "{status}");
        }
    }

    #[test]
    fn retry_set_membership() {
        let all = RetrySet::all();
        assert!(Reason::ALL
            .iter()
            .all(|r| all.contains(*r) == (*r != Reason::Other)));
        let some = RetrySet::empty()
            .with(Reason::Connect)
            .with(Reason::Status503);
        assert!(some.contains(Reason::Connect) && some.contains(Reason::Status503));
        assert!(!some.contains(Reason::Status429));
        let p = Policy {
            retry_on: some,
            ..Policy::default()
        };
        assert!(p.retryable(Reason::Connect) && !p.retryable(Reason::Status500));
    }
}
