//! Fixed-bucket histograms for one shard: a count per bucket and a sum, in nanoseconds, plain
//! integers (the owner holds them behind its one `RefCell`; no atomics). Rendered in the
//! Prometheus text format in seconds (cumulative `_bucket` lines, `_sum`, `_count`).
//!
//! Owns: `Histogram`, the bucket layouts (`LATENCY`, `OVERHEAD`). Must not: allocate when
//! observing (a bucket lookup is a short scan of a static table).

use std::fmt::Write;

/// A bucket layout: upper bounds in nanoseconds and the same bounds as `le` label values.
pub struct Buckets {
    pub bounds_ns: &'static [u64],
    pub le: &'static [&'static str],
}

/// Most bounds a layout may have (the `+Inf` bucket comes on top).
pub const MAX_BOUNDS: usize = 20;

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

/// Whole-request, upstream and first-token times: 0.5 ms to 5 min.
pub const LATENCY: Buckets = Buckets {
    bounds_ns: &[
        500 * US,
        MS,
        2_500 * US,
        5 * MS,
        10 * MS,
        25 * MS,
        50 * MS,
        100 * MS,
        250 * MS,
        500 * MS,
        1_000 * MS,
        2_500 * MS,
        5_000 * MS,
        10_000 * MS,
        30_000 * MS,
        60_000 * MS,
        120_000 * MS,
        300_000 * MS,
    ],
    le: &[
        "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1",
        "2.5", "5", "10", "30", "60", "120", "300",
    ],
};

/// Gateway overhead: 10 µs to 1 s (the gateway's own work is tens of microseconds).
pub const OVERHEAD: Buckets = Buckets {
    bounds_ns: &[
        10 * US,
        25 * US,
        50 * US,
        100 * US,
        250 * US,
        500 * US,
        MS,
        2_500 * US,
        5 * MS,
        10 * MS,
        25 * MS,
        50 * MS,
        100 * MS,
        250 * MS,
        1_000 * MS,
    ],
    le: &[
        "0.00001", "0.000025", "0.00005", "0.0001", "0.00025", "0.0005", "0.001", "0.0025",
        "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "1",
    ],
};

/// Counts per bucket (not cumulative; index `bounds.len()` is `+Inf`) and the sum.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: [u64; MAX_BOUNDS + 1],
    sum_ns: u64,
}

impl Histogram {
    /// Count one observation of `ns` nanoseconds in layout `b`.
    #[inline]
    pub fn observe(&mut self, b: &Buckets, ns: u64) {
        let i = b
            .bounds_ns
            .iter()
            .position(|&bound| ns <= bound)
            .unwrap_or(b.bounds_ns.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c = c.saturating_add(1);
        }
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// Observations counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// `{name}_bucket{labels,le=..}` (cumulative), `{name}_sum` (seconds) and `{name}_count`.
    /// `labels` is the rendered label list without braces (may be empty).
    pub fn render(&self, b: &Buckets, name: &str, labels: &str, out: &mut String) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        for (i, le) in b.le.iter().enumerate() {
            cumulative = cumulative.saturating_add(self.counts.get(i).copied().unwrap_or(0));
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let total = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {total}");
        let (open, close) = if labels.is_empty() {
            ("", "")
        } else {
            ("{", "}")
        };
        let secs = self.sum_ns as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{open}{labels}{close} {secs}");
        let _ = writeln!(out, "{name}_count{open}{labels}{close} {total}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_sorted_and_labelled() {
        for b in [&LATENCY, &OVERHEAD] {
            assert!(b.bounds_ns.len() <= MAX_BOUNDS);
            assert_eq!(b.bounds_ns.len(), b.le.len());
            assert!(b.bounds_ns.windows(2).all(|w| w[0] < w[1]));
            for (ns, le) in b.bounds_ns.iter().zip(b.le) {
                let secs: f64 = le.parse().unwrap();
                assert!((secs * 1e9 - *ns as f64).abs() < 1.0, "{le} vs {ns}");
            }
        }
    }

    #[test]
    fn observes_into_the_right_bucket_and_renders_cumulative() {
        let mut h = Histogram::default();
        h.observe(&OVERHEAD, 10_000); // exactly on the first bound: le="0.00001"
        h.observe(&OVERHEAD, 10_001);
        h.observe(&OVERHEAD, 2_000_000_000); // over the last bound: +Inf only
        assert_eq!(h.count(), 3);
        let mut out = String::new();
        h.render(&OVERHEAD, "x", "a=\"b\"", &mut out);
        assert!(
            out.contains("x_bucket{a=\"b\",le=\"0.00001\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{a=\"b\",le=\"0.000025\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("x_bucket{a=\"b\",le=\"1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count{a=\"b\"} 3\n"), "{out}");
        assert!(out.contains("x_sum{a=\"b\"} 2.000020001\n"), "{out}");
        let mut bare = String::new();
        h.render(&OVERHEAD, "y", "", &mut bare);
        assert!(bare.contains("y_bucket{le=\"+Inf\"} 3\n"), "{bare}");
        assert!(bare.contains("y_count 3\n"), "{bare}");
    }

    #[test]
    fn counts_saturate() {
        let mut h = Histogram::default();
        h.counts[0] = u64::MAX;
        h.counts[1] = u64::MAX;
        h.observe(&OVERHEAD, 1);
        h.observe(&OVERHEAD, 2_000_000_000);
        assert_eq!(h.counts[0], u64::MAX);
        assert_eq!(h.count(), u64::MAX);
        let mut out = String::new();
        h.render(&OVERHEAD, "x", "", &mut out);
        assert!(out.contains(&format!("x_count {}\n", u64::MAX)), "{out}");
    }
}
