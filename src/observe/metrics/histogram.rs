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

/// Whole-request, upstream and first-token times: 0.5 ms to 5 min (`le` values, seconds).
const LATENCY_LE: [&str; 18] = [
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1",
    "2.5", "5", "10", "30", "60", "120", "300",
];
const LATENCY_NS: [u64; 18] = bounds_ns(&LATENCY_LE);
pub const LATENCY: Buckets = Buckets {
    bounds_ns: &LATENCY_NS,
    le: &LATENCY_LE,
};

/// Gateway overhead: 10 µs to 1 s (the gateway's own work is tens of microseconds).
const OVERHEAD_LE: [&str; 15] = [
    "0.00001", "0.000025", "0.00005", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005",
    "0.01", "0.025", "0.05", "0.1", "0.25", "1",
];
const OVERHEAD_NS: [u64; 15] = bounds_ns(&OVERHEAD_LE);
pub const OVERHEAD: Buckets = Buckets {
    bounds_ns: &OVERHEAD_NS,
    le: &OVERHEAD_LE,
};

/// The `le` values (decimal seconds, at most 9 fractional digits) in nanoseconds, computed at
/// compile time so the two tables of a layout cannot disagree.
const fn bounds_ns<const N: usize>(le: &[&str; N]) -> [u64; N] {
    let mut out = [0u64; N];
    let mut k = 0;
    while k < N {
        let b = le[k].as_bytes();
        let (mut i, mut ns, mut unit, mut frac) = (0, 0u64, 1_000_000_000u64, false);
        while i < b.len() {
            if b[i] == b'.' {
                frac = true;
            } else {
                assert!(b[i].is_ascii_digit() && (!frac || unit > 1));
                let d = (b[i] - b'0') as u64;
                if frac {
                    unit /= 10;
                    ns += d * unit;
                } else {
                    ns = ns * 10 + d * 1_000_000_000;
                }
            }
            i += 1;
        }
        out[k] = ns;
        k += 1;
    }
    out
}

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
    fn bounds_are_the_le_values_in_nanoseconds() {
        assert_eq!(LATENCY.bounds_ns[..3], [500_000, 1_000_000, 2_500_000]);
        assert_eq!(LATENCY.bounds_ns.last(), Some(&300_000_000_000));
        assert_eq!(OVERHEAD.bounds_ns[..2], [10_000, 25_000]);
        assert_eq!(bounds_ns(&["0.000000001", "12.5"]), [1, 12_500_000_000]);
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
