//! Admission `Stats`: the plain-data snapshot of a shard, its Prometheus rendering, and the
//! rate-limited rejection log.
//!
//! Owns: the `Stats` snapshot type (plain `Copy` data, safe to send to the shard that serves
//! `/metrics`), the text exposition of admission/pool metrics, and `RejectLog`, which writes at
//! most one summary line per second per shard.
//! Must not: read budgets itself (callers pass snapshots), allocate per request, or log per
//! rejection (a rejection storm must cost at most one line per second).

use std::cell::Cell;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::budget::Reject;
use super::pool::PoolStats;

/// A snapshot of one shard's admission state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Budget capacity in bytes.
    pub capacity: u64,
    /// Bytes held by permits and open connections.
    pub used: u64,
    /// Bytes of `used` held by open connections.
    pub connection_bytes: u64,
    /// Open connections holding a charge.
    pub connections: u32,
    /// Highest `used` seen.
    pub peak: u64,
    /// Permits out.
    pub in_flight: u32,
    /// Permit limit.
    pub max_in_flight: u32,
    /// Waiters queued (block mode).
    pub queued: usize,
    /// Queue limit.
    pub max_queue: usize,
    /// Rejections by reason, indexed by [`Reject::index`].
    pub rejected_by_reason: [u64; Reject::COUNT],
    /// Chunk pool counters.
    pub pool: PoolStats,
}

impl Stats {
    /// Rejections counted for `reason`.
    pub fn rejected(&self, reason: Reject) -> u64 {
        self.rejected_by_reason[reason.index()]
    }

    /// Rejections over all reasons.
    pub fn rejected_total(&self) -> u64 {
        self.rejected_by_reason.iter().sum()
    }
}

type Getter = fn(&Stats) -> u64;

const GAUGES: [(&str, &str, Getter); 9] = [
    ("ringgate_budget_bytes", "Byte budget of the shard.", |s| {
        s.capacity
    }),
    (
        "ringgate_budget_used_bytes",
        "Bytes held by admission permits and open connections.",
        |s| s.used,
    ),
    (
        "ringgate_budget_connection_bytes",
        "Bytes of the budget held by open client connections.",
        |s| s.connection_bytes,
    ),
    (
        "ringgate_budget_peak_bytes",
        "Highest budget use seen.",
        |s| s.peak,
    ),
    (
        "ringgate_permits_in_flight",
        "Admission permits currently held.",
        |s| u64::from(s.in_flight),
    ),
    (
        "ringgate_admission_queue_length",
        "Requests waiting for admission.",
        |s| s.queued as u64,
    ),
    ("ringgate_pool_chunks_live", "Pool chunks in use.", |s| {
        s.pool.live as u64
    }),
    (
        "ringgate_pool_chunks_free",
        "Pool chunks retained for reuse.",
        |s| s.pool.free as u64,
    ),
    (
        "ringgate_pool_chunk_bytes",
        "Size of one pool chunk.",
        |s| s.pool.chunk_size as u64,
    ),
];

/// Writes Prometheus text for several shards, `(shard id, snapshot)`, each metric family once
/// with its `# HELP`/`# TYPE` header and one sample per shard (label `shard`).
pub fn render_prometheus(shards: &[(usize, Stats)], out: &mut String) {
    for (name, help, get) in GAUGES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (id, s) in shards {
            let _ = writeln!(out, "{name}{{shard=\"{id}\"}} {}", get(s));
        }
    }
    let name = "ringgate_admission_rejections_total";
    let _ = writeln!(
        out,
        "# HELP {name} Requests refused by admission, by reason.\n# TYPE {name} counter"
    );
    for (id, s) in shards {
        for r in Reject::ALL {
            let _ = writeln!(
                out,
                "{name}{{shard=\"{id}\",reason=\"{}\"}} {}",
                r.as_str(),
                s.rejected(r)
            );
        }
    }
}

/// At most one rejection summary line per `interval` (1 s) per shard.
pub struct RejectLog {
    interval: Duration,
    last_emit: Cell<Option<Instant>>,
    last_counts: Cell<[u64; Reject::COUNT]>,
}

impl Default for RejectLog {
    fn default() -> Self {
        RejectLog::new(Duration::from_secs(1))
    }
}

impl RejectLog {
    /// A log emitting at most one line per `interval`.
    pub fn new(interval: Duration) -> RejectLog {
        RejectLog {
            interval,
            last_emit: Cell::new(None),
            last_counts: Cell::new([0; Reject::COUNT]),
        }
    }

    /// The summary line due at `now`, if any: rejections since the last line, when there are
    /// some and `interval` has passed since the last line. Marks it emitted.
    pub fn line(&self, shard: usize, s: &Stats, now: Instant) -> Option<String> {
        if let Some(last) = self.last_emit.get() {
            if now.saturating_duration_since(last) < self.interval {
                return None;
            }
        }
        let prev = self.last_counts.get();
        let mut delta = [0u64; Reject::COUNT];
        for (i, d) in delta.iter_mut().enumerate() {
            *d = s.rejected_by_reason[i].saturating_sub(prev[i]);
        }
        let total: u64 = delta.iter().sum();
        if total == 0 {
            return None;
        }
        let mut line = format!("ringgate: shard {shard}: admission rejected {total}");
        if let Some(last) = self.last_emit.get() {
            let secs = now.saturating_duration_since(last).as_secs_f64();
            let _ = write!(line, " in {secs:.1}s");
        }
        line.push_str(" (");
        let mut first = true;
        for r in Reject::ALL {
            let d = delta[r.index()];
            if d > 0 {
                if !first {
                    line.push(' ');
                }
                first = false;
                let _ = write!(line, "{}={d}", r.as_str());
            }
        }
        let _ = write!(
            line,
            "); budget used {}/{} bytes, {} in flight, {} queued",
            s.used, s.capacity, s.in_flight, s.queued
        );
        self.last_emit.set(Some(now));
        self.last_counts.set(s.rejected_by_reason);
        Some(line)
    }

    /// Writes the due line, if any, to stderr.
    pub fn emit(&self, shard: usize, s: &Stats, now: Instant) {
        if let Some(l) = self.line(shard, s, now) {
            eprintln!("{l}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(rej: [u64; 5]) -> Stats {
        Stats {
            capacity: 100,
            used: 40,
            connection_bytes: 16,
            connections: 2,
            peak: 90,
            in_flight: 2,
            max_in_flight: 10,
            queued: 1,
            max_queue: 4,
            rejected_by_reason: rej,
            pool: PoolStats::default(),
        }
    }

    #[test]
    fn prometheus_text() {
        let mut out = String::new();
        render_prometheus(&[(0, stats([1, 2, 3, 4, 5])), (1, stats([0; 5]))], &mut out);
        assert!(out.contains("ringgate_budget_bytes{shard=\"0\"} 100\n"));
        assert!(out.contains("ringgate_budget_bytes{shard=\"1\"} 100\n"));
        assert!(out.contains("ringgate_budget_used_bytes{shard=\"0\"} 40\n"));
        assert!(out.contains("ringgate_budget_connection_bytes{shard=\"0\"} 16\n"));
        assert!(out.contains("ringgate_permits_in_flight{shard=\"0\"} 2\n"));
        assert!(out.contains("ringgate_admission_queue_length{shard=\"0\"} 1\n"));
        assert!(out.contains(
            "ringgate_admission_rejections_total{shard=\"0\",reason=\"queue_timeout\"} 4\n"
        ));
        assert!(out.contains(
            "ringgate_admission_rejections_total{shard=\"1\",reason=\"body_too_large\"} 0\n"
        ));
        assert_eq!(out.matches("# TYPE ringgate_budget_bytes gauge").count(), 1);
        for l in out.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = l.rsplit_once(' ').unwrap();
            v.parse::<u64>().unwrap();
        }
        assert_eq!(stats([1, 2, 3, 4, 5]).rejected_total(), 15);
    }

    #[test]
    fn log_is_rate_limited() {
        let log = RejectLog::default();
        let t0 = Instant::now();
        assert_eq!(log.line(0, &stats([0; 5]), t0), None);
        let l = log.line(3, &stats([2, 0, 1, 0, 0]), t0).unwrap();
        assert!(l.contains("shard 3"), "{l}");
        assert!(l.contains("rejected 3 (budget=2 queue_full=1)"), "{l}");
        assert_eq!(
            log.line(3, &stats([9, 0, 1, 0, 0]), t0 + Duration::from_millis(500)),
            None
        );
        let l = log
            .line(3, &stats([9, 0, 1, 0, 1]), t0 + Duration::from_millis(1500))
            .unwrap();
        assert!(
            l.contains("rejected 8 in 1.5s (budget=7 body_too_large=1)"),
            "{l}"
        );
        assert_eq!(
            log.line(3, &stats([9, 0, 1, 0, 1]), t0 + Duration::from_secs(5)),
            None
        );
        log.emit(3, &stats([9, 0, 1, 0, 1]), t0 + Duration::from_secs(6));
    }
}
