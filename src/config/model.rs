//! `[[model]]`: one client-visible model name (or `prefix*` pattern) and how it is served —
//! its deployments, balancing, fallbacks, retries, timeouts, prices, cache, load-aware
//! balancing and guardrails.
//!
//! Owns: `ModelConfig`, `LoadWeights`.
//! Must not: build route tables (shards build those from it at start-up, see `route`).

use serde::Deserialize;
use toml::Spanned;

use crate::config::routing::DeploymentConfig;

super::routing::with_knobs! {
    /// `[[model]]`; its routing knobs (`lb`, `max_attempts`, `breaker`, `retry_on`, `timeout_ms`,
    /// `first_byte_timeout_ms`, `max_retry_wait_ms`: `with_knobs!`) win over `[routing]`'s.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ModelConfig {
        /// What clients send. A trailing `*` makes it a prefix pattern (`gpt-*`).
        pub name: Spanned<String>,
        /// The one-deployment shorthand (with `upstream_model`); or use `deployments`.
        pub provider: Option<Spanned<String>>,
        /// Name sent upstream. Default: the client's model name.
        pub upstream_model: Option<String>,
        /// Several deployments: `[{ provider, upstream_model, weight }]`.
        pub deployments: Option<Spanned<Vec<DeploymentConfig>>>,
        /// Model names tried in order after every deployment failed.
        #[serde(default)]
        pub fallbacks: Vec<Spanned<String>>,
        /// USD per 1M input tokens: keyed requests' spend (a deployment's own price wins).
        pub price_input_per_mtok: Option<f64>,
        /// USD per 1M output tokens (a deployment's own price wins).
        pub price_output_per_mtok: Option<f64>,
        /// Response cache: `off` (default) | `exact` | `semantic` (needs `[cache] enabled`).
        pub cache: Option<Spanned<String>>,
        /// Semantic cache: cosine similarity at or above which an entry answers. Default 0.95.
        pub semantic_threshold: Option<f64>,
        /// Semantic cache: the model (routed by this gateway) that embeds the last user message.
        pub embedding_model: Option<String>,
        /// Response cache: this model's entries' time to live, seconds (default `[cache] ttl_s`).
        pub cache_ttl_s: Option<u64>,
        /// `lb = "load"`: a deployment is full when one more request would make its engine's
        /// waiting queue exceed this; all full → 429 + Retry-After at the gateway.
        pub max_waiting: Option<Spanned<u32>>,
        /// `lb = "load"`: a deployment is full at this many of the gateway's requests on it.
        pub max_in_flight: Option<Spanned<u32>>,
        /// `lb = "load"`: weights of the queue, KV-cache and prefix scores (default 2 / 2 / 3).
        pub load_weights: Option<LoadWeights>,
        /// `lb = "load"`: prefix affinity holds while the engine's queue is at most this many
        /// requests longer than the shortest (default 4).
        pub affinity_slack: Option<u32>,
        /// `[[guardrail]]` names checked on this model's requests and answers.
        #[serde(default)]
        pub guardrails: Vec<Spanned<String>>,
    }
}

/// `load_weights = { queue = 2, kv = 2, prefix = 3 }`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadWeights {
    pub queue: Option<f64>,
    pub kv: Option<f64>,
    pub prefix: Option<f64>,
}
