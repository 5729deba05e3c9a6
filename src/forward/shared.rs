//! Routing knowledge per process: the cells every shard's routing state points into, so what
//! one shard learns counts on all of them — a deployment's breaker (`BreakerCell`), latency
//! estimate and in-flight count (`LoadCell`), its `lb = "load"` prefix index (`PrefixIndex`),
//! and each provider key's cooldowns, whole-key and per model (`CoolCell`).
//!
//! `SharedRouting` is the registry the cells are found in, by name: a deployment by (model,
//! `provider/upstream model`), a key by (provider, key env var), a key's model scope by (provider,
//! key, scope). A shard builds its `ForwardState` from it at start-up and when a reload gives it
//! a new route table (`shard::routing`): a deployment, key or scope that the new config still
//! has keeps its cells — an open breaker stays open, a cooling key cools on, a conversation's
//! engine stays warm — and new ones get fresh cells. The registry holds the cells weakly: a cell
//! lives while some shard's routing snapshot (current or still held by an in-flight request)
//! uses it, and dead entries are swept at the next build, so memory is bounded by the config
//! (plus, for one reload, the previous one).
//!
//! The registry's lock is taken only while a table is built (start-up, once per shard per
//! reload), never on the request path: there, every read is a `Relaxed` atomic load of a cell.
//!
//! Owns: `SharedRouting`, the identity rules above. Must not: decide anything (the cells'
//! own modules do), or be locked per request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::balance::{LoadCell, EWMA_DECAY};
use super::breaker::BreakerCell;
use super::keys::CoolCell;
use crate::engine::load::{INDEX_BLOCKS, INDEX_TTL_MS};
use crate::engine::prefix::PrefixIndex;
use crate::route::{Deployment, Route};

#[derive(Debug, Default)]
struct Registry {
    breakers: HashMap<String, Weak<BreakerCell>>,
    loads: HashMap<String, Weak<LoadCell>>,
    prefixes: HashMap<String, Weak<PrefixIndex>>,
    cools: HashMap<String, Weak<CoolCell>>,
}

fn cell<T>(map: &mut HashMap<String, Weak<T>>, key: String, make: impl FnOnce() -> T) -> Arc<T> {
    if let Some(c) = map.get(&key).and_then(Weak::upgrade) {
        return c;
    }
    let c = Arc::new(make());
    map.insert(key, Arc::downgrade(&c));
    c
}

/// The process's routing cells (see the module doc). Clones share the registry.
#[derive(Debug, Clone, Default)]
pub struct SharedRouting {
    inner: Arc<Mutex<Registry>>,
}

/// The cells of one build, found under the registry's lock.
pub(super) struct Builder<'a> {
    reg: std::sync::MutexGuard<'a, Registry>,
}

/// A deployment's identity: (model, `provider/upstream model`).
fn dep_id(route: &Route, dep: &Deployment) -> String {
    format!("{}\u{1f}{}", route.name, dep.label)
}

/// A key's identity: (provider, its env var; a keyless provider's one slot by position).
fn key_id(provider: &crate::route::Provider, key: usize) -> String {
    match provider.keys.get(key).and_then(|k| k.env.as_deref()) {
        Some(env) => format!("{}\u{1f}{env}", provider.name),
        None => format!("{}\u{1f}#{key}", provider.name),
    }
}

/// What a deployment's 429 cools (besides a whole-key limit): the upstream model it sends, or
/// for a `prefix*` model without one, the pattern.
pub fn scope_name(route: &Route, dep: &Deployment) -> String {
    dep.upstream_model
        .clone()
        .unwrap_or_else(|| route.name.clone())
}

impl SharedRouting {
    /// Lock the registry for one build, sweeping cells no routing uses any more.
    pub(super) fn builder(&self) -> Builder<'_> {
        let mut reg = match self.inner.lock() {
            Ok(r) => r,
            Err(p) => p.into_inner(),
        };
        reg.breakers.retain(|_, w| w.strong_count() > 0);
        reg.loads.retain(|_, w| w.strong_count() > 0);
        reg.prefixes.retain(|_, w| w.strong_count() > 0);
        reg.cools.retain(|_, w| w.strong_count() > 0);
        Builder { reg }
    }

    /// Cells alive in the registry: (breakers, load cells, prefix indexes, cooldowns).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let reg = match self.inner.lock() {
            Ok(r) => r,
            Err(p) => p.into_inner(),
        };
        (
            alive(&reg.breakers),
            alive(&reg.loads),
            alive(&reg.prefixes),
            alive(&reg.cools),
        )
    }
}

/// How many of `cells` some route table still holds.
fn alive<T>(cells: &HashMap<String, Weak<T>>) -> usize {
    cells.values().filter(|w| w.strong_count() > 0).count()
}

impl Builder<'_> {
    pub(super) fn breaker(&mut self, route: &Route, dep: &Deployment) -> Arc<BreakerCell> {
        cell(
            &mut self.reg.breakers,
            dep_id(route, dep),
            BreakerCell::default,
        )
    }

    pub(super) fn load(&mut self, route: &Route, dep: &Deployment) -> Arc<LoadCell> {
        cell(&mut self.reg.loads, dep_id(route, dep), || {
            LoadCell::new(EWMA_DECAY)
        })
    }

    pub(super) fn prefix(&mut self, route: &Route, dep: &Deployment) -> Arc<PrefixIndex> {
        cell(&mut self.reg.prefixes, dep_id(route, dep), || {
            PrefixIndex::new(INDEX_BLOCKS, INDEX_TTL_MS)
        })
    }

    /// Key `key` of `provider`, whole-key cooldown.
    pub(super) fn key(&mut self, provider: &crate::route::Provider, key: usize) -> Arc<CoolCell> {
        cell(
            &mut self.reg.cools,
            key_id(provider, key),
            CoolCell::default,
        )
    }

    /// Key `key` of `provider`, cooldown for `scope` only.
    pub(super) fn scoped(
        &mut self,
        provider: &crate::route::Provider,
        key: usize,
        scope: &str,
    ) -> Arc<CoolCell> {
        let id = format!("{}\u{1f}{scope}", key_id(provider, key));
        cell(&mut self.reg.cools, id, CoolCell::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::forward::breaker::BreakerState;
    use crate::forward::ForwardState;
    use crate::route::RouteTable;
    use std::time::{Duration, Instant};

    const CFG: &str = r#"
[[provider]]
name = "p"
kind = "openai"
base_url = "http://127.0.0.1:9001/v1"

[[provider]]
name = "q"
kind = "openai"
base_url = "http://127.0.0.1:9002/v1"

[[model]]
name = "m"
deployments = [{ provider = "p" }, { provider = "q" }]
breaker = { failures = 2, cooldown_ms = 60000 }

[[model]]
name = "n"
provider = "p"
"#;

    #[test]
    fn shards_share_breakers_latency_and_cooldowns_and_a_reload_keeps_them() {
        let cells = SharedRouting::default();
        let t = RouteTable::build(&Config::parse(CFG).unwrap());
        let (a, b) = (
            ForwardState::shared(&t, &cells, 1),
            ForwardState::shared(&t, &cells, 2),
        );
        let now = Instant::now();
        let (ma, mb) = (a.model(0).unwrap(), b.model(0).unwrap());
        // one failure on each shard: two in all, the breaker opens for both
        assert!(!ma.breakers[0].on_failure(now));
        assert!(mb.breakers[0].on_failure(now));
        assert_eq!(ma.breakers[0].state(), BreakerState::Open);
        assert!(!ma.breakers[0].available(now + Duration::from_secs(1)));
        // latency seen by one shard is the other's estimate
        ma.balancer.observe(0, now, Duration::from_millis(40));
        assert_eq!(mb.balancer.score(0, now), 40e6);
        mb.balancer.start(0);
        assert_eq!(ma.balancer.in_flight(0), 1);
        mb.balancer.end(0);
        // a 429 for model m cools the key for m on every shard, not for n
        let (ka, kb) = (a.keys(0).unwrap(), b.keys(0).unwrap());
        let (sm, sn) = (ma.scopes[0], a.model(1).unwrap().scopes[0]);
        assert_ne!(sm, sn);
        ka.cool(0, sm, false, now, Some(Duration::from_secs(7)));
        assert!(kb.is_cooling(0, sm, now + Duration::from_secs(6)));
        assert!(!kb.is_cooling(0, sn, now));
        // the whole key: every model
        kb.cool(0, sn, true, now, Some(Duration::from_secs(3)));
        assert!(ka.is_cooling(0, sn, now + Duration::from_secs(2)));
        // a reload's new table (built while the old one lives) keeps every cell
        let t2 = RouteTable::build_after(&Config::parse(CFG).unwrap(), Some(&t));
        let c = ForwardState::shared(&t2, &cells, 3);
        assert_eq!(c.model(0).unwrap().breakers[0].state(), BreakerState::Open);
        assert!(c
            .keys(0)
            .unwrap()
            .is_cooling(0, sm, now + Duration::from_secs(6)));
        // cells nobody uses any more are dropped at the next build
        drop((a, b, c));
        let fresh = ForwardState::shared(&t, &cells, 4);
        assert_eq!(
            fresh.model(0).unwrap().breakers[0].state(),
            BreakerState::Closed
        );
        assert_eq!(cells.counts(), (3, 3, 0, 5));
    }
}
