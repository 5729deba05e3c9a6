//! Routing and resilience, the IO-free core: which deployment (and API key) an attempt goes
//! to, whether a failure is retried, on what, and until when.
//!
//! - `Env`: what this stage (and the answer after it) reads of its shard, built per request by
//!   the pipeline; a model's resolved `Policy` and `Reason` are config (`config::policy`);
//! - `balance`: `Balancer` (smooth weighted round-robin, p2c over peak-EWMA × in-flight);
//! - `breaker`: `Breaker` per deployment (closed → open → half-open, one probe);
//! - `keys`: `KeyRing` per provider (weighted keys, 429 cooldowns per key × model or whole
//!   key, `Retry-After` parsing);
//! - `scope`: what a provider's 429 limited (the key for one model, or the whole key);
//! - `shared`: `SharedRouting`, the process-wide cells the state below points into;
//! - `attempts`: `Attempts`, one request's attempt sequence (same model first, then fallbacks);
//! - `metrics`: attempt/retry/fallback counters and the breaker gauge, Prometheus text.
//!
//! What is learnt is per process: each shard's `ForwardState` (`!Send`, built with its route
//! table) holds handles on process-wide cells (`shared`) for breakers, latency estimates,
//! in-flight counts, key cooldowns and prefix indexes, so a failure or a 429 seen on one shard
//! counts on every shard, a dead deployment gets one half-open probe per cooldown per process,
//! and a conversation keeps its engine whichever shard its next turn lands on. Reads on the
//! request path are `Relaxed` atomic loads; writes are atomic stores or compare-and-swaps of
//! one word, made only when something changed (a healthy deployment's breaker is only read).
//! Per shard stay the weighted rotations (of deployments and keys), the p2c random source and
//! the routing counters (`metrics`, labelled by shard). A reload keeps the cells of every
//! deployment and key the new config still has (`shared`).
//!
//! - `live`: a shard's live routing (route table + this state), swapped whole by a reload;
//! - `plan`: one attempt's upstream request (passthrough or translated) and how its answer
//!   comes back;
//! - `call`: `Call`, one routed request as it travels down (dialect, operation, routing
//!   fields, routing and route, forwarded headers, permit, grant, what its attempts did);
//! - `open`: the one async step that performs the attempts (`forward::open::open`, over a
//!   `Call`): plans each candidate's request, sends it, reports its outcome (`report`), retries
//!   or falls back.
//!
//! Owns: the runtime routing state and every retry/fallback/breaker/balancing decision.
//! Must not: write to the client or see the shard (it gets an `Env`). Everything but `open`
//! and `report` (which logs) is IO-free: no clocks (every call takes `now: Instant`), no
//! sleeping, no HTTP framing.

pub mod live;
pub mod report;

pub mod plan;

pub mod attempts;
pub mod call;
pub mod balance;
pub mod breaker;
pub mod keys;
pub mod metrics;
pub mod open;
pub use crate::util::rng;
pub mod scope;
pub mod shared;

use balance::Balancer;
use breaker::Breaker;
use keys::{KeyPick, KeyRing};
use metrics::ForwardMetrics;
use rng::Rng;

use crate::route::RouteTable;

pub use crate::config::policy::{Lb, Policy, Reason};
pub use attempts::{Attempts, Candidate, Step, Stop};

/// What forwarding and the answer read of their shard, built by the pipeline for one request
/// (`pipeline::shard::Shard::env`): only `server` and `pipeline` see the whole shard.
pub struct Env<'a> {
    /// The shard's number (log lines).
    pub id: usize,
    pub limits: &'a crate::http::conn::Limits,
    pub admission: &'a crate::admit::Admission,
    pub upstream: &'a crate::upstream::Client,
    pub metrics: &'a crate::observe::metrics::ShardMetrics,
    /// The shard's drain began / its drain time is up (see `pipeline::shard::Shard`).
    pub draining: &'a crate::runtime::shutdown::LocalSignal,
    pub drain_expired: &'a crate::runtime::shutdown::LocalSignal,
    pub responses: &'a crate::responses_state::ShardStore,
    /// The request's guardrails (`None`: none applies).
    pub guard: Option<std::rc::Rc<crate::guardrail::Session>>,
    /// OTLP trace export (`None`: off).
    pub telemetry: &'a Option<crate::telemetry::ShardTelemetry>,
}

/// Runtime state of one model's deployments on this shard (handles on process-wide cells).
#[derive(Debug)]
pub struct ModelState {
    pub balancer: Balancer,
    /// One per deployment, same order as `Route::deployments`.
    pub breakers: Vec<Breaker>,
    /// Each deployment's cooldown scope in its provider's `KeyRing` (same order).
    pub scopes: Vec<usize>,
    /// `lb = "load"` only: the engine-aware picker (`engine::load`).
    pub load: Option<crate::engine::load::LoadPicker>,
}

/// All routing runtime state of one shard, parallel to its `RouteTable` (rebuild both
/// together on reload).
#[derive(Debug)]
pub struct ForwardState {
    models: Vec<ModelState>,
    keys: Vec<KeyRing>,
    rng: Rng,
    pub metrics: ForwardMetrics,
    /// Requests waiting (block mode) for an `lb = "load"` engine that is not full.
    pub full_waiters: std::cell::Cell<u32>,
}

impl ForwardState {
    /// Fresh state for `table` with cells of its own (every breaker closed, no latency
    /// samples, no cooldowns; tests). `seed` seeds the p2c choices.
    pub fn new(table: &RouteTable, seed: u64) -> ForwardState {
        ForwardState::shared(table, &shared::SharedRouting::default(), seed)
    }

    /// State for `table` over the process's cells in `cells` (found or created by name, see
    /// `shared`). `seed` seeds the p2c choices; give each shard its own.
    pub fn shared(table: &RouteTable, cells: &shared::SharedRouting, seed: u64) -> ForwardState {
        let mut b = cells.builder();
        // each provider's cooldown scopes, in first-seen order
        let mut scopes: Vec<Vec<String>> = vec![Vec::new(); table.providers().len()];
        let mut scope_of = |p: usize, name: String| -> usize {
            let Some(list) = scopes.get_mut(p) else {
                return 0;
            };
            match list.iter().position(|s| *s == name) {
                Some(i) => i,
                None => {
                    list.push(name);
                    list.len() - 1
                }
            }
        };
        let models = table
            .routes()
            .iter()
            .map(|r| {
                let weights: Vec<u32> = r.deployments.iter().map(|d| d.weight).collect();
                let loads = r.deployments.iter().map(|d| b.load(r, d)).collect();
                ModelState {
                    balancer: Balancer::shared(r.policy.lb, &weights, loads),
                    breakers: r
                        .deployments
                        .iter()
                        .map(|d| Breaker::shared(r.policy.breaker, b.breaker(r, d)))
                        .collect(),
                    scopes: r
                        .deployments
                        .iter()
                        .map(|d| scope_of(d.provider.index, shared::scope_name(r, d)))
                        .collect(),
                    load: (r.policy.lb == Lb::Load && !r.retired).then(|| {
                        crate::engine::load::LoadPicker::shared(
                            r.policy.load,
                            r.deployments
                                .iter()
                                .map(|d| d.provider.engine.clone())
                                .collect(),
                            r.deployments.iter().map(|d| b.prefix(r, d)).collect(),
                        )
                    }),
                }
            })
            .collect();
        let keys = table
            .providers()
            .iter()
            .zip(&scopes)
            .map(|(p, names)| {
                let weights: Vec<u32> = p.keys.iter().map(|k| k.weight).collect();
                let n = p.keys.len().max(1);
                let whole = (0..n).map(|k| b.key(p, k)).collect();
                let scoped = names
                    .iter()
                    .map(|s| (0..n).map(|k| b.scoped(p, k, s)).collect())
                    .collect();
                KeyRing::shared(&weights, whole, scoped)
            })
            .collect();
        ForwardState {
            models,
            keys,
            rng: Rng::new(seed),
            metrics: ForwardMetrics::new(table),
            full_waiters: std::cell::Cell::new(0),
        }
    }

    /// State of route `route` (`Route::index`).
    pub fn model(&self, route: usize) -> Option<&ModelState> {
        self.models.get(route)
    }

    /// Key rotation of provider `provider` (`Provider::index`).
    pub fn keys(&self, provider: usize) -> Option<&KeyRing> {
        self.keys.get(provider)
    }

    pub fn rng(&self) -> &Rng {
        &self.rng
    }

    /// Whether provider `provider` has a key free at `now` for cooldown scope `scope`.
    fn key_ready(&self, provider: usize, scope: usize, now: std::time::Instant) -> bool {
        self.keys(provider)
            .is_none_or(|k| matches!(k.peek(now, scope), KeyPick::Ready(_)))
    }

    /// Append this shard's routing metrics (attempts, failures, retries, fallbacks, breaker
    /// state and opens, key cooldowns) in Prometheus text format.
    pub fn render(&self, table: &RouteTable, shard: usize, out: &mut String) {
        self.metrics.render(
            table,
            |r, d| {
                self.model(r)
                    .and_then(|m| m.breakers.get(d))
                    .map_or(breaker::BreakerState::Closed, Breaker::state)
            },
            shard,
            out,
        );
    }
}
