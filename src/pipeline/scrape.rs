//! The body of `GET /metrics`: this shard's fresh rendering of itself, the other shards'
//! latest snapshots (`MetricsHub`) and the process-wide lines, merged into one Prometheus text
//! exposition (`metrics::expose`). Also renders the snapshot each shard publishes once a
//! second.
//!
//! Owns: what a shard's rendering contains (request series, connection gauges, upstream pool,
//! routing, keys, TLS, admission) and `render`. Must not: run on the request path of API calls
//! (a scrape costs a rendering and a merge, on the shard that serves it; the other shards are
//! not involved).

use std::fmt::Write;

use crate::observe::metrics::help;
use crate::pipeline::shard::Shard;

/// The whole exposition, as served by `shard`.
pub fn render(shard: &Shard) -> String {
    let mut own = String::with_capacity(8192);
    render_shard(shard, &mut own);
    let mut global = String::with_capacity(512);
    shard.hub.process.render(&mut global);
    // engine load signals are process-wide: rendered once, by the shard that serves the scrape
    let routing = shard.live.peek();
    let engines: Vec<(&str, &crate::engine::signal::EngineCell)> = routing
        .routes
        .providers()
        .iter()
        .filter_map(|p| Some((p.name.as_str(), &**p.engine.as_ref()?)))
        .collect();
    crate::engine::render(&engines, &mut global);
    shard.hub.scrape(Some(shard.id), &own, &global)
}

/// Everything `shard` knows about itself; series that must not be summed over shards carry a
/// `shard` label.
pub fn render_shard(shard: &Shard, out: &mut String) {
    let routing = shard.live.peek();
    shard.metrics.render(shard.id, &routing.routes, out);
    shard.guardrail_hits.render(out);
    let id = shard.id;
    help(
        out,
        "ringgate_upstream_idle_connections",
        "gauge",
        "Idle upstream connections kept in the shard's pool.",
    );
    let idle = shard.upstream.pool.idle_count();
    let _ = writeln!(
        out,
        "ringgate_upstream_idle_connections{{shard=\"{id}\"}} {idle}"
    );
    help(
        out,
        "ringgate_upstream_retries_total",
        "counter",
        "Requests resent on a fresh connection after a pooled one failed before answering.",
    );
    let retries = shard.upstream.retries.get();
    let _ = writeln!(
        out,
        "ringgate_upstream_retries_total{{shard=\"{id}\"}} {retries}"
    );
    // routing: attempts, failures by reason, retries, fallbacks, breaker state, key cooldowns
    routing.forward.render(&routing.routes, id, out);
    // virtual keys: requests by key and model, rejections by reason
    shard.governance.render(&routing.routes, id, out);
    // TLS listener: handshakes, failures by reason
    shard.tls.render(out);
    // admission: budget, permits, queue, chunk pool, rejections
    crate::admit::stats::render_prometheus(&[(id, shard.admission.stats())], out);
}
