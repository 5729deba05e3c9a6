//! Per-shard counters and the Prometheus text rendering of `GET /metrics`.
//!
//! Owns: `ShardMetrics` (plain `Cell`s, touched only by its shard) and `MetricsHub`, the rare
//! cross-shard path: every shard publishes a rendered snapshot of itself once a second, and a
//! scrape on any shard returns its own fresh numbers plus the others' latest snapshots.
//! Must not: put locks or atomics on the request path (the hub's mutexes are touched once a
//! second per shard and once per scrape).

//! Per-shard counters, the cross-shard snapshot hub, and the Prometheus text of `GET /metrics`.
//!
//! Owns: `ShardMetrics` (plain `Cell`s and the request series of `requests`, touched only by
//! its shard) and `MetricsHub`, the rare cross-shard path: every shard publishes a rendered
//! snapshot of itself once a second (an `Arc<str>` swapped under a mutex held for a pointer
//! copy), and a scrape merges its own fresh rendering with the others' latest snapshots and the
//! process-wide lines (`expose::merge`: every family once with `# HELP`/`# TYPE`, identical
//! series summed). Snapshots are at most one second stale. Every counter saturates at
//! `u64::MAX` (`bump`, `add`, `add_atomic`): none wraps or runs backwards.
//! Must not: put locks or atomics on the request path (the hub's mutexes are touched once a
//! second per shard and once per scrape per shard).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub mod expose;
pub mod histogram;
pub mod process;
pub mod requests;
pub mod tls;

pub use expose::{help, single};
pub use process::ProcessMetrics;
pub use requests::RequestMetrics;

#[derive(Default)]
pub struct ShardMetrics {
    /// Requests by endpoint, model, provider: counts, latency histograms, tokens.
    pub requests: RequestMetrics,
    pub in_flight: Cell<u64>,
    pub connections: Cell<u64>,
    pub connections_total: Cell<u64>,
    pub upstream_errors: Cell<u64>,
    pub client_disconnects: Cell<u64>,
    pub connections_refused: Cell<u64>,
}

impl ShardMetrics {
    /// This shard's request series and connection gauges (the latter with a `shard` label).
    pub fn render(&self, shard: usize, names: &dyn requests::Names, out: &mut String) {
        self.requests.render(names, out);
        let g = [
            (
                "ringgate_requests_in_flight",
                "gauge",
                "Requests being served.",
                self.in_flight.get(),
            ),
            (
                "ringgate_connections_open",
                "gauge",
                "Open client connections.",
                self.connections.get(),
            ),
            (
                "ringgate_connections_total",
                "counter",
                "Client connections accepted.",
                self.connections_total.get(),
            ),
            (
                "ringgate_connections_refused_total",
                "counter",
                "Client connections refused over max_connections (503 without reading).",
                self.connections_refused.get(),
            ),
            (
                "ringgate_upstream_errors_total",
                "counter",
                "Upstream failures: errors before an answer and 5xx answers.",
                self.upstream_errors.get(),
            ),
            (
                "ringgate_client_disconnects_total",
                "counter",
                "Requests whose client went away before the answer was written.",
                self.client_disconnects.get(),
            ),
        ];
        let labels = format!("shard=\"{shard}\"");
        for (name, kind, text, v) in g {
            single(out, (name, kind, text), &labels, v);
        }
    }
}

/// Prometheus label-value escaping: backslash, double quote, newline.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// Count one more. Every counter saturates at `u64::MAX`: it never wraps and never runs
/// backwards, whatever an upstream reports (token counts are hostile numbers).
pub fn bump(c: &Cell<u64>) {
    add(c, 1);
}

/// Add `n` to a counter, saturating.
pub fn add(c: &Cell<u64>, n: u64) {
    c.set(c.get().saturating_add(n));
}

/// Add `n` to a shared counter, saturating (a compare-and-swap loop; uncontended, one
/// read-modify-write as `fetch_add` is).
pub fn add_atomic(c: &AtomicU64, n: u64) {
    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

pub fn dec(c: &Cell<u64>) {
    c.set(c.get().saturating_sub(1));
}

/// Snapshots published by each shard, read on scrape.
#[derive(Clone)]
pub struct MetricsHub {
    slots: Arc<Vec<Mutex<Arc<str>>>>,
    /// Process-wide metrics (config hash, reloads).
    pub process: Arc<ProcessMetrics>,
}

impl MetricsHub {
    pub fn new(shards: usize, config_hash: &str) -> MetricsHub {
        MetricsHub {
            slots: Arc::new((0..shards).map(|_| Mutex::new(Arc::from(""))).collect()),
            process: Arc::new(ProcessMetrics::new(config_hash)),
        }
    }

    pub fn shards(&self) -> usize {
        self.slots.len()
    }

    /// Replace shard `shard`'s snapshot (its rendering of itself).
    pub fn publish(&self, shard: usize, text: String) {
        let text: Arc<str> = Arc::from(text);
        if let Some(Ok(mut s)) = self.slots.get(shard).map(|m| m.lock()) {
            *s = text;
        }
    }

    /// Every shard's latest published snapshot and the process-wide lines (the admin
    /// listener's `/metrics`, served off the shards: at most one publishing interval, 1 s, old).
    pub fn render_published(&self) -> String {
        let mut global = String::with_capacity(512);
        self.process.render(&mut global);
        self.scrape(None, "", &global)
    }

    /// One exposition: `fresh` stands for shard `me`'s snapshot (pass `None` for none, e.g. a
    /// scrape served off the shards), then the other shards' latest snapshots, then `global`
    /// (process-wide lines), merged (see the module doc).
    pub fn scrape(&self, me: Option<usize>, fresh: &str, global: &str) -> String {
        let others: Vec<Arc<str>> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != me)
            .filter_map(|(_, slot)| slot.lock().ok().map(|s| s.clone()))
            .collect();
        let mut parts: Vec<&str> = Vec::with_capacity(others.len() + 2);
        parts.push(fresh);
        parts.extend(others.iter().map(|s| &**s));
        parts.push(global);
        expose::merge(&parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::governance::spend::SpendBook;

    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let c = Cell::new(u64::MAX - 1);
        bump(&c);
        bump(&c);
        assert_eq!(c.get(), u64::MAX);
        add(&c, u64::MAX);
        assert_eq!(c.get(), u64::MAX);
        let a = AtomicU64::new(u64::MAX - 3);
        add_atomic(&a, 2);
        add_atomic(&a, u64::MAX);
        add_atomic(&a, 1);
        assert_eq!(a.load(Ordering::Relaxed), u64::MAX);

        // the spend ledger: rows of two shards, the key's period spend, the summed rows
        let book = SpendBook::new();
        let l = book.ensure_key("k");
        let (a, b) = (l.tally("m", 0), l.tally("m", 1));
        let now = crate::governance::spend::unix_now();
        let mut last = 0;
        for t in [&a, &b, &a, &b] {
            t.add(u64::MAX, 7, u64::MAX / 2 + 1, now);
            let spent = l.spent(now);
            assert!(spent >= last, "spend ran backwards: {spent} < {last}");
            last = spent;
        }
        assert_eq!(last, u64::MAX);
        let rows = book.snapshot();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(
            (r.requests, r.input_tokens, r.output_tokens, r.spend_nanos),
            (4, u64::MAX, 28, u64::MAX)
        );
    }
}
