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
    errs.extend(super::validate::one_of(
        "cache.store",
        &c.store,
        &["memory", "redis"],
    ));
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

#[cfg(test)]
mod tests {
    use crate::config::Config;

    /// The issue's config contract, as written.
    #[test]
    fn contract_shape_parses() {
        let text = r#"
[cache]
enabled = true
max_bytes = "64MiB"            # charged to the admission budget
ttl_s = 3600
store = "memory"               # "memory" | "redis" (exact layer)

[[provider]]
name = "local"
kind = "mock"

[[model]]
name = "gpt-4o-mini"
provider = "local"
cache = "exact"                # "off" | "exact" | "semantic"
semantic_threshold = 0.95
embedding_model = "text-embedding-3-small"   # a model name routed by this gateway
"#;
        let cfg = Config::parse(text).unwrap();
        assert!(cfg.cache.enabled);
        assert_eq!(cfg.cache.max_bytes.bytes(), 64 << 20);
        let c = crate::cache::Cache::build(&cfg, 2).unwrap();
        let p = c.policy("gpt-4o-mini").unwrap();
        assert_eq!(p.mode, crate::cache::Mode::Exact);
        assert_eq!(p.ttl.as_secs(), 3600);
        let bad = text.replace("cache = \"exact\"", "cache = \"fuzzy\"");
        assert!(Config::parse(&bad).is_err());
        let sem = text.replace(
            "embedding_model = \"text-embedding-3-small\"   # a model name routed by this gateway",
            "",
        );
        let sem = sem.replace("cache = \"exact\"", "cache = \"semantic\"");
        assert!(
            Config::parse(&sem).is_err(),
            "semantic needs embedding_model"
        );
        // a reload's [[model]] changes reach the policies (by name)
        let later = text.replace("cache = \"exact\"", "cache = \"off\"");
        c.reconfigure(&Config::parse(&later).unwrap());
        assert!(c.policy("gpt-4o-mini").is_none());
        // off unless enabled
        let off = text.replace("enabled = true", "enabled = false");
        assert!(crate::cache::Cache::build(&Config::parse(&off).unwrap(), 2).is_none());
    }
}
