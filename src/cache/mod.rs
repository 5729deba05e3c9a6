//! Response cache: exact (and opt-in semantic) answers per tenant, bounded, charged to the
//! admission budget, replayed in the client's dialect and mode.
//!
//! Where entries live: one `Store` for the whole process behind a `Mutex` held for one map
//! operation (a lookup ~0.1 µs, see bench-results/cache.md), so a hit on any shard counts —
//! connections land on shards at random, per-shard caches would multiply misses and memory by
//! the shard count. Every entry's bytes are also held in the admission budget of the shard that
//! stored it (`Budget::try_hold`, only while half that shard's budget stays free: the cache never
//! takes memory requests need); an entry removed on any shard is reported to its owner through
//! `pending` (one atomic per shard) and given back at that shard's next request, and a shard
//! short of budget for a request sheds its own entries first (`settle`), so the cache never
//! causes a 503 that would not happen without it.
//!
//! Pieces: `key` (canonical body, key, tenant, directives), `store` (map, LRU, expiry, vectors),
//! `answer` (stored form, replay), `hub_stream` (completion ⇄ Chat chunks), `serve` (the request
//! path's lookup and store), `semantic` (embedding call, the mock-compatible vector),
//! `metrics`, `redis` (the exact layer in a shared Redis).
//!
//! Owns: `Cache` (process-wide, `Arc`, shared by every shard) and the per-model policies,
//! rebuilt by name from a config (`reconfigure`). Must not: decide routing, or touch a shard's
//! budget from another thread.

pub mod answer;
pub mod hub_stream;
pub mod key;
pub mod metrics;
pub mod redis;
pub mod semantic;
pub mod serve;
pub mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use crate::admit::Budget;
use crate::config::Config;
pub use key::{Directives, Key};
use store::{Freed, Store};

/// How a model is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Exact,
    Semantic,
}

/// One model's cache policy (by configured model name).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub mode: Mode,
    pub ttl: Duration,
    pub threshold: f32,
    pub embedding_model: Option<String>,
}

/// Process-wide settings from `[cache]`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub max_bytes: u64,
    pub max_entry_bytes: u64,
    pub shared_namespace: bool,
    pub allow_length: bool,
    pub max_turns: usize,
    pub allow_temperature: bool,
    pub embedding_timeout: Duration,
}

/// The response cache of the process.
pub struct Cache {
    store: Mutex<Store>,
    policies: RwLock<HashMap<String, Policy>>,
    pub settings: Settings,
    /// Bytes each shard's budget holds for entries that are gone (given back at its next
    /// request).
    pending: Vec<AtomicU64>,
    pub stats: metrics::Stats,
}

impl Cache {
    /// The cache `cfg` asks for (`None`: off, nothing on the request path but a branch), for
    /// `shards` shards.
    pub fn build(cfg: &Config, shards: usize) -> Option<Cache> {
        let policies = policies(cfg);
        if !cfg.cache.enabled || policies.is_empty() {
            return None;
        }
        let c = &cfg.cache;
        Some(Cache {
            store: Mutex::new(Store::default()),
            policies: RwLock::new(policies),
            settings: Settings {
                max_bytes: c.max_bytes.bytes(),
                max_entry_bytes: c.max_entry_bytes.bytes(),
                shared_namespace: c.shared_namespace,
                allow_length: c.cache_length_stops,
                max_turns: c.max_turns,
                allow_temperature: c.semantic_allow_temperature,
                embedding_timeout: Duration::from_millis(c.embedding_timeout_ms),
            },
            pending: (0..shards.max(1)).map(|_| AtomicU64::new(0)).collect(),
            stats: metrics::Stats::default(),
        })
    }

    /// New per-model policies from a reloaded config (entries stay; a model no longer cached
    /// is simply not looked up).
    pub fn reconfigure(&self, cfg: &Config) {
        if let Ok(mut p) = self.policies.write() {
            *p = policies(cfg);
        }
    }

    /// The policy of the model configured as `name`.
    pub fn policy(&self, name: &str) -> Option<Policy> {
        self.policies.read().ok()?.get(name).cloned()
    }

    /// Run `f` on the store under its lock; bytes of removed entries go back to their owners.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store, &mut Vec<Freed>) -> R) -> Option<R> {
        let mut freed = Vec::new();
        let r = {
            let mut s = self.store.lock().ok()?;
            let r = f(&mut s, &mut freed);
            self.stats.bytes.store(s.bytes(), Ordering::Relaxed);
            self.stats.entries.store(s.len() as u64, Ordering::Relaxed);
            self.stats.evictions.store(s.evictions, Ordering::Relaxed);
            r
        };
        for (owner, bytes) in freed {
            if let Some(p) = self.pending.get(owner) {
                p.fetch_add(bytes, Ordering::Relaxed);
            }
        }
        Some(r)
    }

    /// Shard `shard`'s bookkeeping before a request that needs `need` bytes of `budget`: bytes
    /// of its entries removed elsewhere are given back, and when the budget is still short, its
    /// own least recently used entries are shed.
    pub fn settle(&self, shard: usize, budget: &Budget, need: u64) {
        let give_back = |budget: &Budget| {
            if let Some(p) = self.pending.get(shard) {
                let n = p.swap(0, Ordering::Relaxed);
                if n > 0 {
                    budget.release_hold(n);
                }
            }
        };
        give_back(budget);
        if budget.available() < need {
            let short = need - budget.available();
            self.with_store(|s, freed| s.shed(shard, short, freed));
            give_back(budget);
        }
    }

    /// Remove the entries of `model` and/or `tenant` (both `None`: everything); how many.
    pub fn purge(&self, model: Option<&str>, tenant: Option<&str>) -> usize {
        self.with_store(|s, freed| {
            s.purge(
                |e| {
                    model.is_none_or(|m| &*e.model == m)
                        && tenant.is_none_or(|t| {
                            &*e.tenant == t || e.tenant.strip_prefix("key:") == Some(t)
                        })
                },
                freed,
            )
        })
        .unwrap_or(0)
    }
}

/// The cached models of `cfg` by configured name.
fn policies(cfg: &Config) -> HashMap<String, Policy> {
    let mut out = HashMap::new();
    for m in &cfg.models {
        let mode = match m.cache.as_ref().map(|c| c.get_ref().as_str()) {
            Some("exact") => Mode::Exact,
            Some("semantic") => Mode::Semantic,
            _ => continue,
        };
        out.insert(
            m.name.get_ref().clone(),
            Policy {
                mode,
                ttl: Duration::from_secs(m.cache_ttl_s.unwrap_or(cfg.cache.ttl_s)),
                threshold: m.semantic_threshold.unwrap_or(0.95) as f32,
                embedding_model: m.embedding_model.clone(),
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    fn cache(shards: usize) -> Cache {
        let text = "[cache]\nenabled = true\nmax_bytes = \"1MiB\"\n\
                    [[provider]]\nname = \"p\"\nkind = \"mock\"\n\
                    [[model]]\nname = \"m\"\nprovider = \"p\"\ncache = \"exact\"\n";
        let cfg = Config::parse(text).unwrap();
        Cache::build(&cfg, shards).unwrap()
    }

    fn entry(owner: usize, body: usize) -> store::Entry {
        store::Entry {
            body: Arc::from(vec![b'x'; body]),
            tenant: "t".into(),
            model: "m".into(),
            usage: Default::default(),
            expires: Instant::now() + Duration::from_secs(60),
            owner,
            semantic: None,
        }
    }

    /// The cache only takes budget requests do not need, and gives it back before a request
    /// would be refused: a request that fits without the cache fits with it.
    #[test]
    fn entries_are_charged_and_shed_before_a_request_would_not_fit() {
        let c = cache(2);
        let budget = Budget::new(100_000, 100, 0);
        let mut held = 0;
        for i in 0..60u32 {
            let e = entry(0, 1000);
            let size = e.size();
            if !budget.try_hold(size, budget.capacity() / 2) {
                break;
            }
            held += size;
            let k = key::digest(&[&i.to_le_bytes()]);
            assert!(c.with_store(|s, f| s.insert(k, e, u64::MAX, f)).unwrap());
        }
        // the cache stopped at half the budget
        assert!(held <= 50_000 && held > 40_000, "{held}");
        assert_eq!(budget.used(), held);
        // a request needing 90 % of the budget: its shard sheds its own entries first
        c.settle(0, &budget, 90_000);
        assert!(budget.available() >= 90_000, "{}", budget.available());
        let p = budget
            .try_acquire(90_000)
            .expect("admitted as without the cache");
        drop(p);
        // entries owned by another shard are given back at that shard's next request
        let e = entry(1, 1000);
        let size = e.size();
        let other = Budget::new(100_000, 100, 0);
        assert!(other.try_hold(size, 0));
        let k = key::digest(&[b"other"]);
        c.with_store(|s, f| s.insert(k, e, u64::MAX, f));
        assert!(c.purge(Some("other-model"), None) == 0);
        assert!(c.purge(Some("m"), Some("t")) >= 1);
        assert_eq!(c.stats.entries.load(Ordering::Relaxed), 0);
        c.settle(1, &other, 0);
        assert_eq!(other.used(), 0);
    }
}
