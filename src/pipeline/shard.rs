//! One shard's state: everything one core needs to serve requests, shared with nobody (no
//! locks, atomics or `Arc` on the hot path; the per-address tables of `peer` are touched on
//! accept and close, and on a keyed request one relaxed load unless its address is slowed).
//! Lives in an `Rc` on its thread.
//!
//! Owns: the `Shard` struct and the small views of it the stages take (`env`, `cache_env`):
//! only `server` and `pipeline` see a whole `Shard`. Must not: build itself from the config
//! (that is `server`) or handle requests (that is `pipeline`).

use std::rc::Rc;
use std::time::Duration;

use crate::admit::Admission;
use crate::forward::live::LiveRouting;
use crate::governance::Governance;
use crate::http::conn::{Limits, ReadBufs};
use crate::http::edge::EdgePolicy;
use crate::http::request_id::IdGen;
use crate::observe::accesslog::ShardLog;
use crate::observe::metrics::{MetricsHub, ShardMetrics};
use crate::runtime::shutdown::LocalSignal;
use crate::upstream::Client;

/// Everything one shard owns. Lives in an `Rc` on its thread.
pub struct Shard {
    pub id: usize,
    pub driver: &'static str,
    pub limits: Limits,
    pub admission: Admission,
    /// The route table and its routing state (balancers, breakers, key cooldowns), swapped
    /// whole by a reload: a request takes its snapshot with `Shard::routing` (`routing`). The
    /// state's knowledge lives in process-wide atomic cells every shard shares
    /// (`forward::shared`).
    pub live: LiveRouting,
    pub upstream: Client,
    /// Virtual keys and this shard's share of their limits.
    pub governance: Governance,
    pub metrics: ShardMetrics,
    /// `ringgate_guardrail_hits_total` (see `guardrail::hits`).
    pub guardrail_hits: crate::guardrail::hits::Counters,
    pub hub: MetricsHub,
    /// Fired when the process shuts down: idle connections close, in-flight ones finish.
    pub draining: LocalSignal,
    /// Fired when the drain time is up: requests still waiting for an upstream get 503, streams
    /// still running end with their dialect's error event and a proper chunked end.
    pub drain_expired: LocalSignal,
    /// Connections over the cap whose first request is being read, to answer health probes.
    pub over_cap: std::cell::Cell<u32>,
    /// Open connections, process-wide: in all (`server.max_connections`) and per client
    /// address (`server.max_connections_per_address`).
    pub peers: std::sync::Arc<crate::admit::peer::Addresses>,
    /// Addresses presenting unknown API keys, slowed down process-wide (`None`: keys are never
    /// checked, nothing to guess).
    pub key_guesses: Option<std::sync::Arc<crate::admit::peer::Slowdown>>,
    /// Client read buffers (idle connections hold none).
    pub read_bufs: ReadBufs,
    /// `Origin` allow-list and loopback `Host` rule, checked on every head before admission.
    pub edge: EdgePolicy,
    /// TLS listener counters (handshakes, failures by reason).
    pub tls: crate::observe::metrics::tls::TlsStats,
    /// `server.drain_timeout_ms`: how long a stopping shard lets in-flight requests finish.
    pub drain_time: Duration,
    /// Request ids (`x-request-id`) for requests that bring none.
    pub request_ids: IdGen,
    /// This shard's access-log buffer (off: nothing).
    pub access_log: ShardLog,
    /// The request log export (`[log] requests_file`; off: nothing inside).
    pub request_log: ShardLog,
    /// The process-wide drain signal, read only by `/readyz` (503 from the moment it fires).
    pub stopping: crate::runtime::shutdown::Shutdown,
    /// The Responses state store of translated routes (process-wide, this shard's charge).
    pub responses: crate::responses_state::ShardStore,
    /// `/metrics` is served on this listener (loopback, or `server.metrics_on_main`).
    pub metrics_here: bool,
    /// The response cache, shared by every shard (`None`: off; see `cache`).
    pub cache: Option<std::sync::Arc<crate::cache::Cache>>,
    /// This shard's connection to the cache's Redis (`[cache] store = "redis"`).
    pub cache_remote: Option<std::rc::Rc<crate::cache::redis::Remote>>,
    /// OTLP trace export (`[telemetry]`); `None` when off (one branch per request).
    pub telemetry: Option<crate::telemetry::ShardTelemetry>,
    /// The MCP gateway's process-wide state (sessions, series), shared by every shard.
    pub mcp: std::sync::Arc<crate::mcp::Hub>,
}

impl Shard {
    /// What the response cache reads of this shard.
    pub fn cache_env(&self) -> crate::cache::serve::Env<'_> {
        crate::cache::serve::Env {
            fwd: self.env(None),
            cache: self.cache.as_deref(),
            remote: self.cache_remote.as_ref(),
            live: &self.live,
        }
    }

    /// What forwarding and the answer of one request read of this shard.
    pub fn env(&self, guard: Option<Rc<crate::guardrail::Session>>) -> crate::forward::Env<'_> {
        crate::forward::Env {
            id: self.id,
            limits: &self.limits,
            admission: &self.admission,
            upstream: &self.upstream,
            metrics: &self.metrics,
            draining: &self.draining,
            drain_expired: &self.drain_expired,
            responses: &self.responses,
            guard,
            telemetry: &self.telemetry,
        }
    }

    /// Where this shard's own answers go (`answer::Sink`): early errors, local endpoints,
    /// preflights; `keep_alive`: whether the connection may stay after the answer.
    pub fn sink(&self, keep_alive: bool) -> crate::answer::Sink<'_> {
        crate::answer::Sink {
            metrics: &self.metrics,
            keep_alive,
            wt: self.limits.write_timeout,
        }
    }

    /// The routing a request starting now uses (see the module doc); keep it to the request's
    /// end.
    #[inline]
    pub fn routing(&self) -> Rc<crate::forward::live::Routing> {
        let (r, fresh) = self.live.current();
        if fresh {
            self.routing_changed(&r);
        }
        r
    }

    /// A new table became current: per-index names elsewhere follow it.
    #[cold]
    fn routing_changed(&self, r: &crate::forward::live::Routing) {
        self.governance.set_models(&r.routes);
    }
}
