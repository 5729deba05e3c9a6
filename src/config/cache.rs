//! `[cache]` and the per-model cache fields (`cache`, `semantic_threshold`, `embedding_model`,
//! `cache_ttl_s`, ...): what the response cache may keep, how much, for how long, and where.
//!
//! Owns: `CacheConfig`, its defaults and validation. Must not: build the cache (that is
//! `cache::Cache::build`), connect anywhere, or be consulted on the hot path.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::Config;
use crate::admit::ByteSize;

/// `[cache]`. Off unless `enabled = true` and at least one model says `cache = "exact"` or
/// `"semantic"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    pub enabled: bool,
    /// Bytes of cached answers (keys, bodies, vectors), whole process, charged to the admission
    /// budget of the shard that stored each entry. Default 64 MiB.
    pub max_bytes: ByteSize,
    /// Default time to live of an entry, seconds (a model's `cache_ttl_s` wins). Default 3600.
    pub ttl_s: u64,
    /// `memory` | `redis` (the exact layer in the `[limits]` Redis, shared by a fleet).
    pub store: Spanned<String>,
    /// Largest answer kept (its stored JSON). Default 256 KiB; larger answers are skipped.
    pub max_entry_bytes: ByteSize,
    /// Requests without any credential share one namespace (`"shared"`) instead of being
    /// skipped. Default false: an anonymous request is never cached.
    pub shared_namespace: bool,
    /// Store answers that stopped at the token limit (`finish_reason = "length"`). Default false.
    pub cache_length_stops: bool,
    /// Semantic layer: longest conversation (messages) looked up. Default 4.
    pub max_turns: usize,
    /// Semantic layer: requests with `temperature > 0` are looked up too. Default false.
    pub semantic_allow_temperature: bool,
    /// Semantic layer: time allowed for the embedding call, ms. Default 2000.
    pub embedding_timeout_ms: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: false,
            max_bytes: ByteSize(64 << 20),
            ttl_s: 3600,
            store: Spanned::new(0..0, "memory".into()),
            max_entry_bytes: ByteSize(256 << 10),
            shared_namespace: false,
            cache_length_stops: false,
            max_turns: 4,
            semantic_allow_temperature: false,
            embedding_timeout_ms: 2000,
        }
    }
}

impl CacheConfig {
    /// `store = "redis"`.
    pub fn redis(&self) -> bool {
        self.store.get_ref() == "redis"
    }
}

/// Problems in `[cache]` and the models' cache fields, with their spans.
pub fn validate(cfg: &Config) -> Vec<(Range<usize>, String)> {
    let mut errs = Vec::new();
    let c = &cfg.cache;
    if !matches!(c.store.get_ref().as_str(), "memory" | "redis") {
        errs.push((
            c.store.span(),
            format!(
                "cache.store {:?}: expected \"memory\" or \"redis\"",
                c.store.get_ref()
            ),
        ));
    }
    for m in &cfg.models {
        let Some(mode) = &m.cache else { continue };
        match mode.get_ref().as_str() {
            "off" | "exact" => {}
            "semantic" => {
                if m.embedding_model.is_none() {
                    errs.push((
                        mode.span(),
                        format!(
                            "model {:?}: cache = \"semantic\" needs embedding_model",
                            m.name.get_ref()
                        ),
                    ));
                }
            }
            other => errs.push((
                mode.span(),
                format!("model cache {other:?}: expected \"off\", \"exact\" or \"semantic\""),
            )),
        }
        if let Some(t) = m.semantic_threshold {
            if !(0.0..=1.0).contains(&t) {
                errs.push((
                    m.name.span(),
                    format!(
                        "model {:?}: semantic_threshold {t} is outside 0..1",
                        m.name.get_ref()
                    ),
                ));
            }
        }
    }
    errs
}
