//! `[[model]]`: one client-visible model name (or `prefix*` pattern) and how it is served —
//! its deployments, balancing, fallbacks, retries, timeouts, prices, cache, load-aware
//! balancing and guardrails.
//!
//! Owns: `ModelConfig`, `LoadWeights`.
//! Must not: build route tables (shards build those from it at start-up, see `route`).

use serde::Deserialize;
use toml::Spanned;

use crate::config::policy::Lb;
use crate::config::routing::{BreakerConfig, DeploymentConfig};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// What clients send. A trailing `*` makes it a prefix pattern (`gpt-*`).
    pub name: Spanned<String>,
    /// The one-deployment shorthand (with `upstream_model`); or use `deployments`.
    #[serde(default)]
    pub provider: Option<Spanned<String>>,
    /// Name sent upstream. Default: the client's model name.
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// Several deployments: `[{ provider, upstream_model, weight }]`.
    #[serde(default)]
    pub deployments: Option<Spanned<Vec<DeploymentConfig>>>,
    /// `p2c` | `weighted` (default from `[routing]`, else p2c).
    #[serde(default)]
    pub lb: Option<Lb>,
    /// Model names tried in order after every deployment failed.
    #[serde(default)]
    pub fallbacks: Vec<Spanned<String>>,
    #[serde(default)]
    pub max_attempts: Option<Spanned<i64>>,
    #[serde(default)]
    pub breaker: Option<Spanned<BreakerConfig>>,
    #[serde(default)]
    pub retry_on: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub timeout_ms: Option<Spanned<u64>>,
    #[serde(default)]
    pub first_byte_timeout_ms: Option<Spanned<u64>>,
    /// Longest total wait for a provider key cooling after a 429 (default from `[routing]`,
    /// else 1000; see `config::routing`).
    #[serde(default)]
    pub max_retry_wait_ms: Option<Spanned<u64>>,
    /// USD per 1M input tokens: keyed requests' spend (a deployment's own price wins).
    #[serde(default)]
    pub price_input_per_mtok: Option<f64>,
    /// USD per 1M output tokens (a deployment's own price wins).
    #[serde(default)]
    pub price_output_per_mtok: Option<f64>,
    /// Response cache: `off` (default) | `exact` | `semantic` (needs `[cache] enabled`).
    #[serde(default)]
    pub cache: Option<Spanned<String>>,
    /// Semantic cache: cosine similarity at or above which an entry answers. Default 0.95.
    #[serde(default)]
    pub semantic_threshold: Option<f64>,
    /// Semantic cache: the model (routed by this gateway) that embeds the last user message.
    #[serde(default)]
    pub embedding_model: Option<String>,
    /// Response cache: this model's entries' time to live, seconds (default `[cache] ttl_s`).
    #[serde(default)]
    pub cache_ttl_s: Option<u64>,
    /// `lb = "load"`: a deployment is full when one more request would make its engine's
    /// waiting queue exceed this; all full → 429 + Retry-After at the gateway.
    #[serde(default)]
    pub max_waiting: Option<Spanned<u32>>,
    /// `lb = "load"`: a deployment is full at this many of the gateway's requests on it.
    #[serde(default)]
    pub max_in_flight: Option<Spanned<u32>>,
    /// `lb = "load"`: weights of the queue, KV-cache and prefix scores (default 2 / 2 / 3).
    #[serde(default)]
    pub load_weights: Option<LoadWeights>,
    /// `lb = "load"`: prefix affinity holds while the engine's queue is at most this many
    /// requests longer than the shortest (default 4).
    #[serde(default)]
    pub affinity_slack: Option<u32>,
    /// `[[guardrail]]` names checked on this model's requests and answers.
    #[serde(default)]
    pub guardrails: Vec<Spanned<String>>,
}

/// `load_weights = { queue = 2, kv = 2, prefix = 3 }`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadWeights {
    #[serde(default)]
    pub queue: Option<f64>,
    #[serde(default)]
    pub kv: Option<f64>,
    #[serde(default)]
    pub prefix: Option<f64>,
}
