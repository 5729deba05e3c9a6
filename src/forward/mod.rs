//! Routing and resilience, the IO-free core: which deployment (and API key) an attempt goes
//! to, whether a failure is retried, on what, and until when.
//!
//! - `policy`: a model's resolved `Policy` (lb, max_attempts, breaker, retry_on, deadline,
//!   fallbacks) and `Reason`, why an attempt failed;
//! - `balance`: `Balancer` (smooth weighted round-robin, p2c over peak-EWMA × in-flight);
//! - `breaker`: `Breaker` per deployment (closed → open → half-open, one probe);
//! - `keys`: `KeyRing` per provider (weighted keys, 429 cooldowns, `Retry-After` parsing);
//! - `attempts`: `Attempts`, one request's attempt sequence (same model first, then fallbacks);
//! - `metrics`: attempt/retry/fallback counters and the breaker gauge, Prometheus text.
//!
//! State is per shard (`ForwardState`, `Cell`s, `!Send`): with N shards every shard has its own
//! breakers, latency estimates and key cooldowns, so a dead deployment is probed up to N times
//! per cooldown and a 429 cools a key on the shard that saw it.
//!
//! - `open`: the one async step that performs the attempts (`forward::open::open`): plans
//!   each candidate's request, sends it, reports its outcome, retries or falls back.
//!
//! Owns: the runtime routing state and every retry/fallback/breaker/balancing decision.
//! Must not: write to the client. Everything but `open` is IO-free: no clocks (every call
//! takes `now: Instant`), no sleeping, no HTTP framing.

pub mod attempts;
pub mod balance;
pub mod breaker;
pub mod keys;
pub mod metrics;
pub mod open;
pub mod policy;
pub mod rng;

use balance::{Balancer, EWMA_DECAY};
use breaker::Breaker;
use keys::{KeyPick, KeyRing};
use metrics::ForwardMetrics;
use rng::Rng;

use crate::route::RouteTable;

pub use attempts::{Attempts, Candidate, Step, Stop};
pub use policy::{Lb, Policy, Reason};

/// Runtime state of one model's deployments on this shard.
#[derive(Debug)]
pub struct ModelState {
    pub balancer: Balancer,
    /// One per deployment, same order as `Route::deployments`.
    pub breakers: Vec<Breaker>,
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
    /// Fresh state for `table` (every breaker closed, no latency samples, no cooldowns).
    /// `seed` seeds the p2c choices; give each shard its own.
    pub fn new(table: &RouteTable, seed: u64) -> ForwardState {
        ForwardState {
            models: table
                .routes()
                .iter()
                .map(|r| {
                    let weights: Vec<u32> = r.deployments.iter().map(|d| d.weight).collect();
                    ModelState {
                        balancer: Balancer::new(r.policy.lb, &weights, EWMA_DECAY),
                        breakers: r
                            .deployments
                            .iter()
                            .map(|_| Breaker::new(r.policy.breaker))
                            .collect(),
                        load: (r.policy.lb == Lb::Load).then(|| {
                            crate::engine::load::LoadPicker::new(
                                r.policy.load,
                                r.deployments
                                    .iter()
                                    .map(|d| d.provider.engine.clone())
                                    .collect(),
                            )
                        }),
                    }
                })
                .collect(),
            keys: table
                .providers()
                .iter()
                .map(|p| KeyRing::new(&p.keys.iter().map(|k| k.weight).collect::<Vec<_>>()))
                .collect(),
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

    /// Whether provider `provider` has a key free at `now`.
    fn key_ready(&self, provider: usize, now: std::time::Instant) -> bool {
        self.keys(provider)
            .is_none_or(|k| matches!(k.peek(now), KeyPick::Ready(_)))
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
