//! The response cache's counters (process-wide atomics: the cache is shared by every shard)
//! and their Prometheus lines, rendered once per scrape with the process-wide lines.
//!
//! Owns: `Stats` and `render`. Must not: be touched on the request path of a model that is not
//! cached.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::observe::metrics::help;

/// Upper bounds (seconds) of the lookup latency histogram's buckets.
const BOUNDS: [f64; 10] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 1e-3, 1e-2, 1e-1,
];

/// Counters of the cache.
#[derive(Default)]
pub struct Stats {
    pub hits: AtomicU64,
    pub semantic_hits: AtomicU64,
    pub misses: AtomicU64,
    /// Requests to a cached model the cache did not take part in (directives, no tenant,
    /// not cacheable) by reason.
    pub skips: [AtomicU64; Skip::COUNT],
    pub stores: AtomicU64,
    /// Answers not stored (error, cut, too large, over budget).
    pub refused: AtomicU64,
    pub evictions: AtomicU64,
    pub bytes: AtomicU64,
    pub entries: AtomicU64,
    pub tokens_saved_input: AtomicU64,
    pub tokens_saved_output: AtomicU64,
    /// Pico-USD.
    pub spend_saved: AtomicU64,
    pub embedding_failures: AtomicU64,
    lookup_buckets: [AtomicU64; BOUNDS.len()],
    lookup_count: AtomicU64,
    lookup_sum_ns: AtomicU64,
}

/// Why a request skipped the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// `cache-control: no-store` (or `x-ringgate-cache: bypass`).
    NoStore,
    /// No virtual key, no client key, no shared namespace.
    NoTenant,
    /// Not a cacheable body (not a JSON object, `n` > 1).
    Uncacheable,
}

impl Skip {
    pub const COUNT: usize = 3;
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NoStore => "no_store",
            Skip::NoTenant => "no_tenant",
            Skip::Uncacheable => "uncacheable",
        }
    }
    const ALL: [Skip; 3] = [Skip::NoStore, Skip::NoTenant, Skip::Uncacheable];
}

fn add(c: &AtomicU64, n: u64) {
    crate::observe::metrics::add_atomic(c, n);
}

impl Stats {
    pub fn skip(&self, why: Skip) {
        add(&self.skips[why as usize], 1);
    }

    /// One lookup took `d`.
    pub fn lookup(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BOUNDS.iter().position(|b| s <= *b) {
            add(&self.lookup_buckets[i], 1);
        }
        add(&self.lookup_count, 1);
        add(&self.lookup_sum_ns, d.as_nanos() as u64);
    }

    /// A hit saved these tokens and this much spend (pico-USD).
    pub fn saved(&self, input: u64, output: u64, pico: u64) {
        add(&self.tokens_saved_input, input);
        add(&self.tokens_saved_output, output);
        add(&self.spend_saved, pico);
    }

    /// The cache's lines (families `ringgate_cache_*`).
    pub fn render(&self, max_bytes: u64, out: &mut String) {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut counter = |name: &str, text: &str, v: u64| {
            help(out, name, "counter", text);
            let _ = writeln!(out, "{name} {v}");
        };
        counter(
            "ringgate_cache_hits_total",
            "Requests answered from the exact cache.",
            g(&self.hits),
        );
        counter(
            "ringgate_cache_semantic_hits_total",
            "Requests answered from the semantic cache.",
            g(&self.semantic_hits),
        );
        counter(
            "ringgate_cache_misses_total",
            "Requests to a cached model sent upstream after a lookup.",
            g(&self.misses),
        );
        counter(
            "ringgate_cache_stores_total",
            "Answers stored.",
            g(&self.stores),
        );
        counter(
            "ringgate_cache_refused_total",
            "Answers not stored (error, cut or length-stopped, too large, over budget).",
            g(&self.refused),
        );
        counter(
            "ringgate_cache_evictions_total",
            "Entries evicted to stay within max_bytes or the admission budget.",
            g(&self.evictions),
        );
        counter(
            "ringgate_cache_embedding_failures_total",
            "Semantic lookups whose embedding call failed (answered as misses).",
            g(&self.embedding_failures),
        );
        help(
            out,
            "ringgate_cache_skips_total",
            "counter",
            "Requests to a cached model that bypassed the cache, by reason.",
        );
        for s in Skip::ALL {
            let _ = writeln!(
                out,
                "ringgate_cache_skips_total{{reason=\"{}\"}} {}",
                s.as_str(),
                g(&self.skips[s as usize])
            );
        }
        help(
            out,
            "ringgate_cache_tokens_saved_total",
            "counter",
            "Tokens hits did not spend upstream (as reported by the stored answers).",
        );
        let _ = writeln!(
            out,
            "ringgate_cache_tokens_saved_total{{direction=\"input\"}} {}",
            g(&self.tokens_saved_input)
        );
        let _ = writeln!(
            out,
            "ringgate_cache_tokens_saved_total{{direction=\"output\"}} {}",
            g(&self.tokens_saved_output)
        );
        help(
            out,
            "ringgate_cache_spend_saved_usd_total",
            "counter",
            "USD hits did not spend upstream (configured prices).",
        );
        let _ = writeln!(
            out,
            "ringgate_cache_spend_saved_usd_total {}",
            g(&self.spend_saved) as f64 / 1e12
        );
        help(
            out,
            "ringgate_cache_bytes",
            "gauge",
            "Bytes held by cache entries.",
        );
        let _ = writeln!(out, "ringgate_cache_bytes {}", g(&self.bytes));
        help(
            out,
            "ringgate_cache_max_bytes",
            "gauge",
            "The cache's max_bytes.",
        );
        let _ = writeln!(out, "ringgate_cache_max_bytes {max_bytes}");
        help(out, "ringgate_cache_entries", "gauge", "Cache entries.");
        let _ = writeln!(out, "ringgate_cache_entries {}", g(&self.entries));
        help(
            out,
            "ringgate_cache_lookup_seconds",
            "histogram",
            "Time of one exact lookup (key, lock, map).",
        );
        let mut cum = 0u64;
        for (i, b) in BOUNDS.iter().enumerate() {
            cum = g(&self.lookup_buckets[i]).saturating_add(cum);
            let _ = writeln!(
                out,
                "ringgate_cache_lookup_seconds_bucket{{le=\"{b}\"}} {cum}"
            );
        }
        let count = g(&self.lookup_count);
        let _ = writeln!(
            out,
            "ringgate_cache_lookup_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "ringgate_cache_lookup_seconds_sum {}",
            g(&self.lookup_sum_ns) as f64 / 1e9
        );
        let _ = writeln!(out, "ringgate_cache_lookup_seconds_count {count}");
    }
}
