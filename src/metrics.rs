//! Per-shard counters and the Prometheus text rendering of `GET /metrics`.
//!
//! Owns: `ShardMetrics` (plain `Cell`s, touched only by its shard) and `MetricsHub`, the rare
//! cross-shard path: every shard publishes a rendered snapshot of itself once a second, and a
//! scrape on any shard returns its own fresh numbers plus the others' latest snapshots.
//! Must not: put locks or atomics on the request path (the hub's mutexes are touched once a
//! second per shard and once per scrape).

use std::cell::Cell;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use crate::admit::Stats;

/// Request outcome buckets.
const CLASSES: [&str; 4] = ["2xx", "4xx", "5xx", "other"];
pub const ENDPOINTS: [&str; 6] = [
    "chat_completions",
    "models",
    "health",
    "metrics",
    "not_found",
    "other",
];

#[derive(Default)]
pub struct ShardMetrics {
    requests: [[Cell<u64>; 4]; 9],
    pub in_flight: Cell<u64>,
    pub connections: Cell<u64>,
    pub connections_total: Cell<u64>,
    pub upstream_errors: Cell<u64>,
    pub client_disconnects: Cell<u64>,
    pub connections_refused: Cell<u64>,
}

impl ShardMetrics {
    pub fn count(&self, endpoint: usize, status: u16) {
        let class = match status {
            200..=299 => 0,
            400..=499 => 1,
            500..=599 => 2,
            _ => 3,
        };
        if let Some(c) = self.requests.get(endpoint).and_then(|r| r.get(class)) {
            c.set(c.get() + 1);
        }
    }

    pub fn requests(&self, endpoint: usize, class: usize) -> u64 {
        self.requests
            .get(endpoint)
            .and_then(|r| r.get(class))
            .map_or(0, Cell::get)
    }

    pub fn render(&self, shard: usize, out: &mut String) {
        for (e, name) in ENDPOINTS.iter().enumerate() {
            for (c, class) in CLASSES.iter().enumerate() {
                let v = self.requests(e, c);
                if v > 0 {
                    let _ = writeln!(
                        out,
                        "ringgate_requests_total{{shard=\"{shard}\",endpoint=\"{name}\",status=\"{class}\"}} {v}"
                    );
                }
            }
        }
        let g = [
            ("ringgate_requests_in_flight", self.in_flight.get()),
            ("ringgate_connections_open", self.connections.get()),
            ("ringgate_connections_total", self.connections_total.get()),
            (
                "ringgate_connections_refused_total",
                self.connections_refused.get(),
            ),
            ("ringgate_upstream_errors_total", self.upstream_errors.get()),
            (
                "ringgate_client_disconnects_total",
                self.client_disconnects.get(),
            ),
        ];
        for (name, v) in g {
            let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {v}");
        }
    }
}

pub fn bump(c: &Cell<u64>) {
    c.set(c.get() + 1);
}

pub fn dec(c: &Cell<u64>) {
    c.set(c.get().saturating_sub(1));
}

/// Snapshots published by each shard, read on scrape.
#[derive(Clone)]
pub struct MetricsHub {
    slots: Arc<Vec<Mutex<Snapshot>>>,
}

/// One shard's published metrics: rendered counters and admission stats.
type Snapshot = (String, Option<Stats>);

impl MetricsHub {
    pub fn new(shards: usize) -> MetricsHub {
        MetricsHub {
            slots: Arc::new(
                (0..shards)
                    .map(|_| Mutex::new((String::new(), None)))
                    .collect(),
            ),
        }
    }

    pub fn shards(&self) -> usize {
        self.slots.len()
    }

    pub fn publish(&self, shard: usize, text: String, admission: Stats) {
        if let Some(Ok(mut s)) = self.slots.get(shard).map(|m| m.lock()) {
            *s = (text, Some(admission));
        }
    }

    /// Append every other shard's latest snapshot; collect their admission stats.
    pub fn others(&self, me: usize, out: &mut String, admission: &mut Vec<(usize, Stats)>) {
        for (i, slot) in self.slots.iter().enumerate() {
            if i != me {
                if let Ok(s) = slot.lock() {
                    out.push_str(&s.0);
                    if let Some(st) = s.1 {
                        admission.push((i, st));
                    }
                }
            }
        }
    }
}
