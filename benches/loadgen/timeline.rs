//! Results over time and response-header tallies, both optional.
//!
//! * `--timeline MS`: measured requests are bucketed by their *intended* send time (relative to
//!   the start of the measured window) into MS-wide buckets; each bucket keeps its successes,
//!   errors and a latency histogram (2 significant digits), so a chart can show latency and
//!   error rate over time (e.g. around a fault injected mid-run). `--phase-at SECS` (repeatable)
//!   also reports merged percentiles per phase of the window (e.g. before/after the fault).
//! * `--count-header NAME`: the values of a response header (e.g. `x-ringgate-provider`) are
//!   counted per target, over responses whose head arrived during the measured window; at most
//!   `MAX_VALUES` distinct values per header, the rest counted as `(other)`; a response without
//!   the header counts as `(none)`.
//!
//! Owns: the bucket and tally bookkeeping and their JSON. Must not: touch sockets or the schedule.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Distinct values kept per counted header.
pub const MAX_VALUES: usize = 64;

struct Bucket {
    ok: u64,
    errors: u64,
    latency: Histogram<u64>,
}

/// Per-interval outcomes of one target's measured requests.
pub struct Timeline {
    origin: Instant,
    bucket: Duration,
    buckets: Vec<Bucket>,
}

impl Timeline {
    pub fn new(origin: Instant, bucket: Duration) -> Timeline {
        Timeline {
            origin,
            bucket: bucket.max(Duration::from_millis(1)),
            buckets: Vec::new(),
        }
    }

    fn at(&mut self, sched: Instant) -> Option<&mut Bucket> {
        let i = (sched.saturating_duration_since(self.origin).as_nanos() / self.bucket.as_nanos())
            as usize;
        // A bound so a bad clock cannot allocate without limit (a day of 1 ms buckets).
        if i > 86_400_000 {
            return None;
        }
        while self.buckets.len() <= i {
            // 1 µs .. 60 s with 2 significant digits: valid bounds, cannot fail.
            let latency = Histogram::new_with_bounds(1, 60_000_000, 2).ok()?;
            self.buckets.push(Bucket {
                ok: 0,
                errors: 0,
                latency,
            });
        }
        self.buckets.get_mut(i)
    }

    /// One measured request, intended at `sched`: `Some(latency)` on success, `None` on error.
    pub fn record(&mut self, sched: Instant, latency: Option<Duration>) {
        let Some(b) = self.at(sched) else { return };
        match latency {
            Some(d) => {
                b.ok += 1;
                b.latency
                    .saturating_record((d.as_micros() as u64).clamp(1, 60_000_000));
            }
            None => b.errors += 1,
        }
    }

    /// The merged latency histogram, successes and errors of the buckets starting in
    /// `[from, to)` (offsets from the window start; bucket granularity).
    pub fn phase(&self, from: Duration, to: Option<Duration>) -> (Histogram<u64>, u64, u64) {
        let mut h = Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid histogram bounds");
        let (mut ok, mut errors) = (0, 0);
        for (i, b) in self.buckets.iter().enumerate() {
            let start = self.bucket * i as u32;
            if start < from || to.is_some_and(|t| start >= t) {
                continue;
            }
            let _ = h.add(&b.latency);
            ok += b.ok;
            errors += b.errors;
        }
        (h, ok, errors)
    }

    pub fn to_json(&self) -> Value {
        let step = self.bucket.as_secs_f64();
        let buckets: Vec<Value> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let q = |p: f64| (!b.latency.is_empty()).then(|| b.latency.value_at_percentile(p));
                json!({
                    "t_s": ((i as f64 * step) * 1000.0).round() / 1000.0,
                    "ok": b.ok,
                    "errors": b.errors,
                    "p50_us": q(50.0),
                    "p90_us": q(90.0),
                    "p99_us": q(99.0),
                    "max_us": (!b.latency.is_empty()).then(|| b.latency.max()),
                })
            })
            .collect();
        json!({ "bucket_ms": self.bucket.as_millis() as u64, "buckets": buckets })
    }
}

/// Counts of response-header values, per header name (index into the configured names).
#[derive(Default)]
pub struct HeaderTally {
    counts: Vec<BTreeMap<String, u64>>,
}

impl HeaderTally {
    /// `values[i]` is the value of the i-th counted header in one response head.
    pub fn record(&mut self, values: Vec<Option<String>>) {
        if self.counts.len() < values.len() {
            self.counts.resize_with(values.len(), BTreeMap::new);
        }
        for (m, v) in self.counts.iter_mut().zip(values) {
            let key = v.unwrap_or_else(|| "(none)".into());
            let key = if m.contains_key(&key) || m.len() < MAX_VALUES {
                key
            } else {
                "(other)".into()
            };
            *m.entry(key).or_insert(0) += 1;
        }
    }

    pub fn to_json(&self, names: &[String]) -> Value {
        let mut out = serde_json::Map::new();
        for (i, name) in names.iter().enumerate() {
            let m = self.counts.get(i).cloned().unwrap_or_default();
            out.insert(name.clone(), json!(m));
        }
        Value::Object(out)
    }
}
