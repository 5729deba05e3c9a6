//! The routing part of the config: `[routing]` defaults, a model's `deployments`, `lb`,
//! `fallbacks`, `max_attempts`, `breaker`, `retry_on`, `timeout_ms`, `first_byte_timeout_ms`,
//! `max_retry_wait_ms`, a provider's weighted `api_keys`; their validation (unknown providers/models, fallback
//! cycles, weights ≤ 0, …, with line numbers) and the effective `Policy` of a model.
//!
//! Owns: `RoutingConfig`, `BreakerConfig`, `DeploymentConfig`, `ApiKeyConfig`, model lookup by
//! name for fallbacks (`Config::find_model`, same rule as the route table).
//! Must not: read env vars' values or build runtime state (`route`, `forward` do that).

use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{Config, ModelConfig, ProviderConfig};
use crate::config::policy::{BreakerSettings, Policy, Reason, RetrySet};

/// Largest accepted `weight` (deployments and keys).
pub const MAX_WEIGHT: i64 = 1_000_000;
/// Largest accepted `max_attempts`.
pub const MAX_ATTEMPTS: i64 = 100;

/// Declares a config table with the routing knobs — `[routing]` (every model's defaults) and
/// `[[model]]` (its own, which win) — after its own fields: one list of the knobs for both
/// (serde's `flatten` does not go with `deny_unknown_fields`). Also gives the table
/// `knobs()`, the validated ones borrowed.
macro_rules! with_knobs {
    ($(#[$meta:meta])* pub struct $name:ident { $($own:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            $($own)*
            /// `p2c` (the default), `weighted` or `load`.
            pub lb: Option<$crate::config::policy::Lb>,
            /// Total upstream attempts per client request (1 to `MAX_ATTEMPTS`). Default 3.
            pub max_attempts: Option<toml::Spanned<i64>>,
            /// Default `{ failures = 5, cooldown_ms = 10000 }`, field by field.
            pub breaker: Option<toml::Spanned<$crate::config::routing::BreakerConfig>>,
            /// Default: every reason (`connect`, `timeout`, `reset`, `first-byte-timeout`,
            /// `429`, `500`, `502`, `503`, `504`).
            pub retry_on: Option<Vec<toml::Spanned<String>>>,
            /// Overall deadline for all attempts of one request. Default
            /// `upstream.total_timeout_ms`.
            pub timeout_ms: Option<toml::Spanned<u64>>,
            /// Per-attempt wait for the response head. Default `upstream.first_byte_timeout_ms`.
            pub first_byte_timeout_ms: Option<toml::Spanned<u64>>,
            /// Longest total time one request waits for provider keys cooling after 429s
            /// (their `Retry-After`) before the client gets the 429 at once. Default 1000; 0:
            /// never wait.
            pub max_retry_wait_ms: Option<toml::Spanned<u64>>,
        }

        impl $name {
            /// The knobs `check_knobs` validates, borrowed.
            pub(super) fn knobs(&self) -> $crate::config::routing::Knobs<'_> {
                $crate::config::routing::Knobs {
                    max_attempts: self.max_attempts.as_ref(),
                    breaker: self.breaker.as_ref(),
                    retry_on: self.retry_on.as_ref(),
                    timeout_ms: self.timeout_ms.as_ref(),
                    first_byte_timeout_ms: self.first_byte_timeout_ms.as_ref(),
                }
            }
        }
    };
}
pub(super) use with_knobs;

with_knobs! {
    /// `[routing]`: defaults for every model; a model's own knobs override them.
    #[derive(Debug, Clone, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct RoutingConfig {
        /// The provider `/v1/files` and `/v1/batches` requests (which name no model) go to.
        /// Default: the one provider of an OpenAI-style kind (`config::surface`).
        pub files_provider: Option<Spanned<String>>,
    }
}

/// Circuit breaker per deployment; unset fields come from `[routing]`, then the defaults.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    /// Consecutive failures that open it (default 5; 0 turns this rule off).
    pub failures: Option<u32>,
    /// Time open before one half-open probe (default 10000).
    pub cooldown_ms: Option<u64>,
    /// Also open when this share of attempts failed within `window_ms` (off by default).
    pub error_rate: Option<f64>,
    /// Error-rate window (default 10000).
    pub window_ms: Option<u64>,
    /// Attempts needed in a window before the error rate counts (default 20).
    pub min_requests: Option<u32>,
}

/// One `deployments` entry: `{ provider, upstream_model, weight }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentConfig {
    pub provider: Spanned<String>,
    /// Default: the client's model name (as with the one-deployment shorthand).
    pub upstream_model: Option<String>,
    /// Share of traffic relative to the other deployments (default 1, must be > 0).
    #[serde(default = "one")]
    pub weight: Spanned<i64>,
    /// USD per 1M input tokens on this deployment (wins over the model's, field by field).
    pub price_input_per_mtok: Option<f64>,
    /// USD per 1M output tokens on this deployment (wins over the model's, field by field).
    pub price_output_per_mtok: Option<f64>,
}

/// One `api_keys` entry of a provider: `{ env, weight }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Name of the env var holding the key.
    pub env: Spanned<String>,
    #[serde(default = "one")]
    pub weight: Spanned<i64>,
}

fn one() -> Spanned<i64> {
    Spanned::new(0..0, 1)
}

/// A deployment as the route table sees it, from either config shape.
#[derive(Debug, Clone, Copy)]
pub struct DeploymentRef<'a> {
    pub provider: &'a Spanned<String>,
    pub upstream_model: Option<&'a str>,
    pub weight: u32,
    /// USD per 1M (input, output) tokens: the deployment's own, else the model's.
    pub price_per_mtok: (Option<f64>, Option<f64>),
}

impl ModelConfig {
    /// Whether the model or one of its deployments has a price.
    pub fn has_price(&self) -> bool {
        self.deployment_refs()
            .iter()
            .any(|d| d.price_per_mtok.0.is_some() || d.price_per_mtok.1.is_some())
            || self.price_input_per_mtok.is_some()
            || self.price_output_per_mtok.is_some()
    }

    /// The model's deployments: `deployments`, or the shorthand's one (weight 1).
    pub fn deployment_refs(&self) -> Vec<DeploymentRef<'_>> {
        if let Some(ds) = &self.deployments {
            return ds
                .get_ref()
                .iter()
                .map(|d| DeploymentRef {
                    provider: &d.provider,
                    upstream_model: d.upstream_model.as_deref(),
                    weight: u32::try_from(*d.weight.get_ref()).unwrap_or(1).max(1),
                    price_per_mtok: (
                        d.price_input_per_mtok.or(self.price_input_per_mtok),
                        d.price_output_per_mtok.or(self.price_output_per_mtok),
                    ),
                })
                .collect();
        }
        self.provider
            .iter()
            .map(|p| DeploymentRef {
                provider: p,
                upstream_model: self.upstream_model.as_deref(),
                weight: 1,
                price_per_mtok: (self.price_input_per_mtok, self.price_output_per_mtok),
            })
            .collect()
    }

    /// The first deployment's provider (`owned_by` in `/v1/models`).
    pub fn first_provider(&self) -> Option<&str> {
        self.deployment_refs()
            .first()
            .map(|d| d.provider.get_ref().as_str())
    }
}

impl ProviderConfig {
    /// Key env-var names with weights: `api_key_env` first (weight 1), then `api_keys`.
    pub fn key_refs(&self) -> Vec<(&str, u32)> {
        let mut out: Vec<(&str, u32)> = self
            .api_key_env
            .iter()
            .map(|e| (e.get_ref().as_str(), 1))
            .collect();
        out.extend(self.api_keys.iter().map(|k| {
            let w = u32::try_from(*k.weight.get_ref()).unwrap_or(1).max(1);
            (k.env.get_ref().as_str(), w)
        }));
        out
    }
}

impl Config {
    /// The model a name (a client's or a `fallbacks` entry) resolves to: an exact name first,
    /// then the longest matching `prefix*` (the route table's rule).
    pub fn find_model(&self, name: &str) -> Option<usize> {
        let exact = self.models.iter().position(|m| m.name.get_ref() == name);
        exact.or_else(|| {
            self.models
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let p = m.name.get_ref().strip_suffix('*')?;
                    name.starts_with(p).then_some((p.len(), i))
                })
                .max_by_key(|&(len, i)| (len, std::cmp::Reverse(i)))
                .map(|(_, i)| i)
        })
    }

    /// A model's effective policy: its own fields, else `[routing]`, else the defaults.
    /// `fallbacks` is left empty: the route table resolves them to its own indices.
    pub fn policy(&self, m: &ModelConfig) -> Policy {
        let r = &self.routing;
        let d = BreakerSettings::default();
        let b = |f: fn(&BreakerConfig) -> Option<u64>| {
            m.breaker
                .as_ref()
                .and_then(|b| f(b.get_ref()))
                .or_else(|| r.breaker.as_ref().and_then(|b| f(b.get_ref())))
        };
        let ms = Duration::from_millis;
        let breaker = BreakerSettings {
            failures: b(|b| b.failures.map(u64::from)).map_or(d.failures, |v| v as u32),
            cooldown: b(|b| b.cooldown_ms).map_or(d.cooldown, ms),
            error_rate: m
                .breaker
                .as_ref()
                .and_then(|b| b.get_ref().error_rate)
                .or_else(|| r.breaker.as_ref().and_then(|b| b.get_ref().error_rate)),
            window: b(|b| b.window_ms).map_or(d.window, ms),
            min_requests: b(|b| b.min_requests.map(u64::from)).map_or(d.min_requests, |v| v as u32),
        };
        let retry_on =
            m.retry_on
                .as_ref()
                .or(r.retry_on.as_ref())
                .map_or_else(RetrySet::all, |list| {
                    list.iter()
                        .filter_map(|s| Reason::parse(s.get_ref()))
                        .fold(RetrySet::empty(), RetrySet::with)
                });
        let attempts = m.max_attempts.as_ref().or(r.max_attempts.as_ref());
        let timeout = m.timeout_ms.as_ref().or(r.timeout_ms.as_ref());
        let first_byte = m
            .first_byte_timeout_ms
            .as_ref()
            .or(r.first_byte_timeout_ms.as_ref());
        let retry_wait = m
            .max_retry_wait_ms
            .as_ref()
            .or(r.max_retry_wait_ms.as_ref())
            .map_or(crate::config::policy::MAX_RETRY_WAIT_MS, |t| *t.get_ref());
        Policy {
            lb: m.lb.or(r.lb).unwrap_or_default(),
            max_attempts: attempts.map_or(3, |a| (*a.get_ref()).clamp(1, MAX_ATTEMPTS) as u32),
            breaker,
            retry_on,
            deadline: ms(timeout.map_or(self.upstream.total_timeout_ms, |t| *t.get_ref())),
            first_byte_timeout: ms(
                first_byte.map_or(self.upstream.first_byte_timeout_ms, |t| *t.get_ref())
            ),
            max_retry_wait: ms(retry_wait),
            fallbacks: Vec::new(),
            load: super::engines::load_settings(m),
        }
    }
}

/// Knobs shared by `[routing]` and `[[model]]`, borrowed for validation (`knobs()`).
pub(super) struct Knobs<'a> {
    pub(super) max_attempts: Option<&'a Spanned<i64>>,
    pub(super) breaker: Option<&'a Spanned<BreakerConfig>>,
    pub(super) retry_on: Option<&'a Vec<Spanned<String>>>,
    pub(super) timeout_ms: Option<&'a Spanned<u64>>,
    pub(super) first_byte_timeout_ms: Option<&'a Spanned<u64>>,
}

type Sink<'e> = dyn FnMut(Range<usize>, String) + 'e;

fn check_knobs(who: &str, k: Knobs<'_>, err: &mut Sink<'_>) {
    if let Some(a) = k.max_attempts {
        if !(1..=MAX_ATTEMPTS).contains(a.get_ref()) {
            err(
                a.span(),
                format!("{who}: max_attempts must be between 1 and {MAX_ATTEMPTS}"),
            );
        }
    }
    if let Some(b) = k.breaker {
        let c = b.get_ref();
        if c.cooldown_ms == Some(0) || c.window_ms == Some(0) {
            err(
                b.span(),
                format!("{who}: breaker cooldown_ms and window_ms must be > 0"),
            );
        }
        if c.error_rate.is_some_and(|r| !(r > 0.0 && r <= 1.0)) {
            err(
                b.span(),
                format!("{who}: breaker error_rate must be in (0, 1]"),
            );
        }
    }
    for r in k.retry_on.into_iter().flatten() {
        if Reason::parse(r.get_ref()).is_none() {
            err(
                r.span(),
                format!(
                    "{who}: unknown retry_on {:?} (connect, timeout, reset, first-byte-timeout, 429, 500, 502, 503, 504)",
                    r.get_ref()
                ),
            );
        }
    }
    for (field, t) in [
        ("timeout_ms", k.timeout_ms),
        ("first_byte_timeout_ms", k.first_byte_timeout_ms),
    ] {
        if let Some(t) = t.filter(|t| *t.get_ref() == 0) {
            err(t.span(), format!("{who}: {field} must be > 0"));
        }
    }
}

fn check_weight(who: &str, w: &Spanned<i64>, err: &mut Sink<'_>) {
    if !(1..=MAX_WEIGHT).contains(w.get_ref()) {
        err(
            w.span(),
            format!(
                "{who}: weight {} must be > 0 (and at most {MAX_WEIGHT})",
                w.get_ref()
            ),
        );
    }
}

/// Validate the routing parts: provider keys, model shapes, deployments, fallbacks, cycles.
pub(super) fn validate(cfg: &Config, err: &mut Sink<'_>) {
    let r = &cfg.routing;
    check_knobs("[routing]", r.knobs(), err);
    for p in &cfg.providers {
        let who = format!("provider {:?}", p.name.get_ref());
        for (i, k) in p.api_keys.iter().enumerate() {
            let env = k.env.get_ref();
            if !is_env_name(env) {
                err(
                    k.env.span(),
                    format!("{who}: api_keys env must be an env var NAME like OPENAI_API_KEY, not a key"),
                );
            }
            let dup = p.api_key_env.as_ref().is_some_and(|e| e.get_ref() == env)
                || p.api_keys[..i].iter().any(|o| o.env.get_ref() == env);
            if dup {
                err(
                    k.env.span(),
                    format!("{who}: key env {env} is listed twice"),
                );
            }
            check_weight(&who, &k.weight, err);
        }
    }
    for m in &cfg.models {
        validate_model(cfg, m, err);
    }
    check_cycles(cfg, err);
}

fn validate_model(cfg: &Config, m: &ModelConfig, err: &mut Sink<'_>) {
    let name = m.name.get_ref();
    let who = format!("model {name:?}");
    match (&m.provider, &m.deployments) {
        (Some(_), Some(ds)) => err(
            ds.span(),
            format!("{who}: give either provider (+ upstream_model) or deployments, not both"),
        ),
        (None, Some(ds)) if m.upstream_model.is_some() => err(
            ds.span(),
            format!(
                "{who}: upstream_model belongs inside each deployment when deployments is given"
            ),
        ),
        (None, Some(ds)) if ds.get_ref().is_empty() => {
            err(ds.span(), format!("{who}: deployments must not be empty"))
        }
        (None, None) => err(
            m.name.span(),
            format!("{who} needs a provider (or a deployments list)"),
        ),
        _ => {}
    }
    if let Some(p) = &m.provider {
        if cfg.provider(p.get_ref()).is_none() {
            err(
                p.span(),
                format!("{who} refers to unknown provider {:?}", p.get_ref()),
            );
        }
    }
    if let Some(ds) = &m.deployments {
        for (i, d) in ds.get_ref().iter().enumerate() {
            if cfg.provider(d.provider.get_ref()).is_none() {
                err(
                    d.provider.span(),
                    format!(
                        "{who}: deployment refers to unknown provider {:?}",
                        d.provider.get_ref()
                    ),
                );
            }
            check_weight(&who, &d.weight, err);
            let same = |o: &DeploymentConfig| {
                o.provider.get_ref() == d.provider.get_ref() && o.upstream_model == d.upstream_model
            };
            if ds.get_ref()[..i].iter().any(same) {
                err(
                    d.provider.span(),
                    format!(
                        "{who}: deployment {}/{} is listed twice",
                        d.provider.get_ref(),
                        d.upstream_model.as_deref().unwrap_or(name)
                    ),
                );
            }
        }
    }
    check_knobs(&who, m.knobs(), err);
    for f in &m.fallbacks {
        if cfg.find_model(f.get_ref()).is_none() {
            err(
                f.span(),
                format!(
                    "{who}: fallback {:?} is not a configured model",
                    f.get_ref()
                ),
            );
        }
    }
}

/// Reject fallback cycles (A → B → A, via `prefix*` models too, and self-fallback), each
/// reported once at the `fallbacks` entry that closes it.
fn check_cycles(cfg: &Config, err: &mut Sink<'_>) {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        cfg: &Config,
        i: usize,
        marks: &mut [Mark],
        path: &mut Vec<usize>,
        err: &mut Sink<'_>,
    ) {
        marks[i] = Mark::Open;
        path.push(i);
        for f in &cfg.models[i].fallbacks {
            let Some(j) = cfg.find_model(f.get_ref()) else {
                continue;
            };
            match marks[j] {
                Mark::New => visit(cfg, j, marks, path, err),
                Mark::Open => {
                    let from = cfg.models[i].name.get_ref();
                    let msg = if i == j {
                        format!(
                            "model {from:?} falls back to itself (via {:?})",
                            f.get_ref()
                        )
                    } else {
                        let start = path.iter().position(|&p| p == j).unwrap_or(0);
                        let names: Vec<&str> = path[start..]
                            .iter()
                            .chain([&j])
                            .map(|&k| cfg.models[k].name.get_ref().as_str())
                            .collect();
                        format!("model {from:?}: fallback cycle {}", names.join(" → "))
                    };
                    err(f.span(), msg);
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks[i] = Mark::Done;
    }
    let mut marks = vec![Mark::New; cfg.models.len()];
    for i in 0..cfg.models.len() {
        if marks[i] == Mark::New {
            visit(cfg, i, &mut marks, &mut Vec::new(), err);
        }
    }
}

pub(super) fn is_env_name(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;
