//! Routing counters of one shard and their Prometheus text: attempts per deployment, failed
//! attempts by reason, retries and fallbacks per requested model, breaker opens and state, key
//! cooldowns per provider.
//!
//! Owns: `ForwardMetrics` (dense `Cell` arrays sized from the route table at build time).
//! Must not: allocate or look names up on the request path (counters are indexed by route,
//! deployment, reason, chain position and provider index).

use std::cell::Cell;
use std::fmt::Write;

use super::breaker::BreakerState;
use crate::config::policy::Reason;
use crate::observe::metrics::{bump, escape};
use crate::route::RouteTable;

const REASONS: usize = Reason::ALL.len();

#[derive(Debug, Default)]
struct DepCounters {
    attempts: Cell<u64>,
    failures: [Cell<u64>; REASONS],
    opens: Cell<u64>,
}

#[derive(Debug, Default)]
struct ModelCounters {
    retries: [Cell<u64>; REASONS],
    /// Indexed like `Route::chain`.
    fallbacks: Vec<Cell<u64>>,
}

#[derive(Debug, Default)]
pub struct ForwardMetrics {
    deps: Vec<Vec<DepCounters>>,
    models: Vec<ModelCounters>,
    key_cooldowns: Vec<Cell<u64>>,
}

impl ForwardMetrics {
    pub fn new(table: &RouteTable) -> ForwardMetrics {
        ForwardMetrics {
            deps: table
                .routes()
                .iter()
                .map(|r| {
                    r.deployments
                        .iter()
                        .map(|_| DepCounters::default())
                        .collect()
                })
                .collect(),
            models: table
                .routes()
                .iter()
                .map(|r| ModelCounters {
                    retries: Default::default(),
                    fallbacks: r.chain.iter().map(|_| Cell::new(0)).collect(),
                })
                .collect(),
            key_cooldowns: table.providers().iter().map(|_| Cell::new(0)).collect(),
        }
    }

    fn dep(&self, route: usize, dep: usize) -> Option<&DepCounters> {
        self.deps.get(route).and_then(|d| d.get(dep))
    }

    /// An attempt started on deployment `dep` of route `route`.
    pub fn attempt(&self, route: usize, dep: usize) {
        if let Some(d) = self.dep(route, dep) {
            bump(&d.attempts);
        }
    }

    pub fn failure(&self, route: usize, dep: usize, reason: Reason) {
        if let Some(c) = self
            .dep(route, dep)
            .and_then(|d| d.failures.get(reason.index()))
        {
            bump(c);
        }
    }

    pub fn breaker_opened(&self, route: usize, dep: usize) {
        if let Some(d) = self.dep(route, dep) {
            bump(&d.opens);
        }
    }

    /// A request for `route` is retried after a failure for `reason`.
    pub fn retry(&self, route: usize, reason: Reason) {
        if let Some(c) = self
            .models
            .get(route)
            .and_then(|m| m.retries.get(reason.index()))
        {
            bump(c);
        }
    }

    /// A request for `route` moved on to its fallback `Route::chain[pos]`.
    pub fn fallback(&self, route: usize, pos: usize) {
        if let Some(c) = self.models.get(route).and_then(|m| m.fallbacks.get(pos)) {
            bump(c);
        }
    }

    pub fn key_cooldown(&self, provider: usize) {
        if let Some(c) = self.key_cooldowns.get(provider) {
            bump(c);
        }
    }

    pub fn attempts(&self, route: usize, dep: usize) -> u64 {
        self.dep(route, dep).map_or(0, |d| d.attempts.get())
    }

    pub fn failures(&self, route: usize, dep: usize, reason: Reason) -> u64 {
        self.dep(route, dep)
            .and_then(|d| d.failures.get(reason.index()))
            .map_or(0, Cell::get)
    }

    pub fn retries(&self, route: usize, reason: Reason) -> u64 {
        self.models
            .get(route)
            .and_then(|m| m.retries.get(reason.index()))
            .map_or(0, Cell::get)
    }

    pub fn fallbacks(&self, route: usize, pos: usize) -> u64 {
        self.models
            .get(route)
            .and_then(|m| m.fallbacks.get(pos))
            .map_or(0, Cell::get)
    }

    /// Prometheus text. Attempts and the breaker gauge are written for every deployment;
    /// failures, retries, fallbacks, opens and cooldowns only when non-zero.
    pub fn render(
        &self,
        table: &RouteTable,
        breaker: impl Fn(usize, usize) -> BreakerState,
        shard: usize,
        out: &mut String,
    ) {
        for (name, kind, text) in FAMILIES {
            crate::observe::metrics::help(out, name, kind, text);
        }
        for (r, route) in table.routes().iter().enumerate() {
            if route.retired {
                continue;
            }
            let model = escape(&route.name);
            for (d, dep) in route.deployments.iter().enumerate() {
                let Some(c) = self.dep(r, d) else { continue };
                let l = format!(
                    "shard=\"{shard}\",model=\"{model}\",deployment=\"{}\"",
                    escape(&dep.label)
                );
                let _ = writeln!(
                    out,
                    "ringgate_upstream_attempts_total{{{l}}} {}",
                    c.attempts.get()
                );
                for reason in Reason::ALL {
                    let v = self.failures(r, d, reason);
                    if v > 0 {
                        let _ = writeln!(
                            out,
                            "ringgate_upstream_failures_total{{{l},reason=\"{}\"}} {v}",
                            reason.as_str()
                        );
                    }
                }
                let _ = writeln!(
                    out,
                    "ringgate_breaker_state{{{l}}} {}",
                    breaker(r, d).gauge()
                );
                if c.opens.get() > 0 {
                    let _ = writeln!(out, "ringgate_breaker_opens_total{{{l}}} {}", c.opens.get());
                }
            }
            for reason in Reason::ALL {
                let v = self.retries(r, reason);
                if v > 0 {
                    let _ = writeln!(
                        out,
                        "ringgate_retries_total{{shard=\"{shard}\",model=\"{model}\",reason=\"{}\"}} {v}",
                        reason.as_str()
                    );
                }
            }
            for (pos, f) in route.chain.iter().enumerate() {
                let v = self.fallbacks(r, pos);
                if v > 0 {
                    let _ = writeln!(
                        out,
                        "ringgate_fallbacks_total{{shard=\"{shard}\",model=\"{model}\",fallback=\"{}\"}} {v}",
                        escape(&f.name)
                    );
                }
            }
        }
        for (p, prov) in table.providers().iter().enumerate() {
            let v = self.key_cooldowns.get(p).map_or(0, Cell::get);
            if v > 0 {
                let _ = writeln!(
                    out,
                    "ringgate_key_cooldowns_total{{shard=\"{shard}\",provider=\"{}\"}} {v}",
                    escape(&prov.name)
                );
            }
        }
    }
}

/// The routing families: name, type, help.
const FAMILIES: [(&str, &str, &str); 7] = [
    (
        "ringgate_upstream_attempts_total",
        "counter",
        "Upstream attempts by requested model and deployment (provider/upstream model).",
    ),
    (
        "ringgate_upstream_failures_total",
        "counter",
        "Failed upstream attempts by model, deployment and reason.",
    ),
    (
        "ringgate_breaker_state",
        "gauge",
        "Circuit breaker of a deployment on this shard: 0 closed, 1 open, 2 half-open.",
    ),
    (
        "ringgate_breaker_opens_total",
        "counter",
        "Times a deployment's circuit breaker opened.",
    ),
    (
        "ringgate_retries_total",
        "counter",
        "Requests retried after a failed attempt, by model and reason.",
    ),
    (
        "ringgate_fallbacks_total",
        "counter",
        "Requests that moved on to a fallback model.",
    ),
    (
        "ringgate_key_cooldowns_total",
        "counter",
        "Provider API keys put to cool down after a 429.",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn renders_counters_with_labels() {
        let cfg = Config::parse(
            "[[provider]]\nname=\"a\"\nkind=\"mock\"\n[[provider]]\nname=\"b\\\"p\"\nkind=\"mock\"\n\
             [[model]]\nname=\"m\"\ndeployments=[{provider=\"a\",upstream_model=\"x\"},{provider=\"b\\\"p\"}]\nfallbacks=[\"n-q\"]\n\
             [[model]]\nname=\"n-q\"\nprovider=\"b\\\"p\"\n",
        )
        .unwrap();
        let t = RouteTable::build(&cfg);
        let m = ForwardMetrics::new(&t);
        m.attempt(0, 0);
        m.attempt(0, 0);
        m.attempt(0, 1);
        m.failure(0, 1, Reason::Status503);
        m.retry(0, Reason::Status503);
        m.fallback(0, 0);
        m.breaker_opened(0, 1);
        m.key_cooldown(1);
        m.attempt(9, 9); // out of range: ignored
        let mut out = String::new();
        m.render(
            &t,
            |_, d| {
                if d == 1 {
                    BreakerState::Open
                } else {
                    BreakerState::Closed
                }
            },
            3,
            &mut out,
        );
        let want = [
            "ringgate_upstream_attempts_total{shard=\"3\",model=\"m\",deployment=\"a/x\"} 2",
            "ringgate_upstream_attempts_total{shard=\"3\",model=\"m\",deployment=\"b\\\"p/m\"} 1",
            "ringgate_upstream_failures_total{shard=\"3\",model=\"m\",deployment=\"b\\\"p/m\",reason=\"503\"} 1",
            "ringgate_breaker_state{shard=\"3\",model=\"m\",deployment=\"b\\\"p/m\"} 1",
            "ringgate_breaker_state{shard=\"3\",model=\"m\",deployment=\"a/x\"} 0",
            "ringgate_breaker_opens_total{shard=\"3\",model=\"m\",deployment=\"b\\\"p/m\"} 1",
            "ringgate_retries_total{shard=\"3\",model=\"m\",reason=\"503\"} 1",
            "ringgate_fallbacks_total{shard=\"3\",model=\"m\",fallback=\"n-q\"} 1",
            "ringgate_key_cooldowns_total{shard=\"3\",provider=\"b\\\"p\"} 1",
            "ringgate_upstream_attempts_total{shard=\"3\",model=\"n-q\",deployment=\"b\\\"p/n-q\"} 0",
        ];
        for w in want {
            assert!(out.lines().any(|l| l == w), "missing {w}\n{out}");
        }
        assert!(!out.contains("reason=\"429\""));
    }
}
