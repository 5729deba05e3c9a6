//! The end of a request: its `Trace` counted into the shard's request metrics and, when the
//! access log or the request log export is on, written as one line to each (see `accesslog`,
//! `telemetry::requests`).
//!
//! Owns: `request_ended`. Must not: do IO or block (the access log only buffers a line).

use std::time::Instant;

use crate::observe::accesslog::Entry;
use crate::observe::trace::Trace;
use crate::pipeline::shard::Shard;
use crate::route::RouteTable;

/// How a request ended, as its record reads it.
pub struct Ended<'a> {
    pub status: u16,
    pub request_id: &'a str,
    /// Bytes written to its client.
    pub bytes_out: u64,
    /// Its trace's id, when it is traced.
    pub trace_id: Option<[u8; 16]>,
}

/// Count the request `t` that ended now as `end` says. `routes` is the table the request ran
/// on.
pub fn request_ended(shard: &Shard, routes: &RouteTable, t: &Trace, end: &Ended<'_>) {
    let Ended {
        status,
        request_id,
        bytes_out,
        trace_id,
    } = *end;
    let now = Instant::now();
    let dep = t
        .served
        .and_then(|(r, d)| routes.route(r as usize)?.deployments.get(d as usize));
    let provider = dep.map(|d| d.provider.index as u32);
    shard.metrics.requests.observe(t, status, provider, now);
    if !shard.access_log.on() && !shard.request_log.on() {
        return;
    }
    let latency = now.saturating_duration_since(t.start);
    let key = t.key.and_then(|k| shard.governance.key_name(k));
    let mut entry = Entry {
        request_id,
        key: key.as_deref(),
        endpoint: t.endpoint.as_str(),
        model: t.model.as_deref(),
        deployment: dep.map(|d| d.label.as_str()),
        provider: dep.map(|d| d.provider.name.as_str()),
        status,
        stream: t.stream,
        tokens: t.tokens,
        latency,
        overhead: t.overhead(latency),
        upstream: t.upstream,
        first_token: t.first_token(),
        bytes_in: t.bytes_in,
        bytes_out,
        attempts: t.attempts,
        guardrail_hits: t.guardrail_hits.as_deref(),
        mcp: t
            .mcp
            .as_deref()
            .map(|m| (&*m.method, m.server.as_deref(), m.tool.as_deref(), m.result)),
        cost_nano_usd: None,
        trace_id: None,
    };
    shard.access_log.write(&entry);
    if shard.request_log.on() {
        entry.cost_nano_usd = match (dep, t.tokens) {
            (Some(d), Some((i, o))) => Some(d.price.cost_nanos(i, o)),
            _ => None,
        };
        entry.trace_id = trace_id;
        shard.request_log.write(&entry);
    }
}
