//! A shard's live routing: the route table and the routing state built for it (`Routing`),
//! replaced whole when a reload publishes a new config (`reload`).
//!
//! A request takes the current `Rc<Routing>` once, when it starts (`Shard::routing`): one
//! `Relaxed` atomic load of the published generation and a non-atomic `Rc` increment. It keeps
//! that snapshot to its end, so an in-flight request or an open stream finishes on the config it
//! started with, while the next request on any connection sees the new one. When the generation
//! moved, the first request after it builds the shard's new table from the published config
//! (`RouteTable::build_after`: stable indices, so metric series and key counters keep their
//! labels) — once per shard per reload, off every other request's path.
//!
//! Owns: `Routing`, `LiveRouting` and the swap. Must not: validate or read a config (that is
//! `reload`, before anything is published) or be written from another thread (it only reads
//! the published snapshot).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use crate::config::Config;
use crate::forward::ForwardState;
use crate::route::RouteTable;
use crate::util::versioned::Versioned;

/// What every shard follows (`reload::Reloader` publishes into it).
pub type Published = Versioned<Setup>;

/// One published generation: the config, and the runtime cells held beside it (the config
/// itself is plain data).
pub struct Setup {
    pub config: Config,
    /// The engine load-signal cells (started by the gateway, `engine::Engines::start`; empty
    /// elsewhere).
    pub engines: crate::engine::Engines,
    /// The process's routing knowledge (breakers, latency, cooldowns, prefix indexes) every
    /// shard's routing state points into (`forward::shared`); a reload passes the running one on.
    pub routing_cells: crate::forward::shared::SharedRouting,
}

impl Setup {
    /// `config` with no engines started and fresh routing knowledge.
    pub fn plain(config: Config) -> Setup {
        Setup {
            config,
            engines: Default::default(),
            routing_cells: Default::default(),
        }
    }
}

/// One generation of a shard's routing: the table and its runtime state (balancers, breakers,
/// key cooldowns, routing counters), built together. The state's knowledge (breakers, latency,
/// cooldowns, prefix indexes) is process-wide cells found by name (`forward::shared`): every
/// shard's `Routing` points into the same ones, and a rebuild keeps those of what it keeps.
pub struct Routing {
    pub routes: RouteTable,
    pub forward: ForwardState,
    /// The published generation it was built from (0: the start-up config).
    pub generation: u64,
    /// The `[[mcp_server]]`s of this generation (`mcp::servers`).
    pub mcp: crate::mcp::Servers,
}

/// The shard's current `Routing` and where new ones come from.
pub struct LiveRouting {
    /// `None`: this shard never reloads (library users without a reloader, tests).
    source: Option<Arc<Published>>,
    /// The generation `current` was built from.
    seen: Cell<u64>,
    current: RefCell<Rc<Routing>>,
    /// Seeds each new `ForwardState`'s p2c choices (per shard).
    seed: u64,
}

impl LiveRouting {
    /// Start with the table built from `cfg` (generation `generation` of `source`).
    pub fn new(setup: &Setup, source: Option<Arc<Published>>, generation: u64, seed: u64) -> Self {
        let routes = RouteTable::build_with(&setup.config, Some(&setup.engines), None);
        let forward = ForwardState::shared(&routes, &setup.routing_cells, seed);
        LiveRouting {
            source,
            seen: Cell::new(generation),
            current: RefCell::new(Rc::new(Routing {
                routes,
                forward,
                generation,
                mcp: crate::mcp::Servers::build(&setup.config),
            })),
            seed,
        }
    }

    /// The routing a request starting now uses, and whether it was just rebuilt (a new
    /// generation was published since the last call).
    #[inline]
    pub fn current(&self) -> (Rc<Routing>, bool) {
        let mut fresh = false;
        if let Some(src) = &self.source {
            if src.generation() != self.seen.get() {
                fresh = self.refresh(src);
            }
        }
        (self.peek(), fresh)
    }

    /// The current routing without looking for a newer one (scrapes, the end of a request).
    pub fn peek(&self) -> Rc<Routing> {
        match self.current.try_borrow() {
            Ok(r) => r.clone(),
            // only `refresh` borrows mutably, and never across an await
            Err(_) => Rc::new(Routing {
                routes: RouteTable::default(),
                forward: ForwardState::new(&RouteTable::default(), self.seed),
                generation: self.seen.get(),
                mcp: crate::mcp::Servers::default(),
            }),
        }
    }

    /// Build the table of the newest published config and make it current. Requests that hold
    /// the previous one keep it until they end.
    #[cold]
    fn refresh(&self, src: &Published) -> bool {
        let (generation, setup) = src.load();
        let prev = self.peek();
        let routes =
            RouteTable::build_with(&setup.config, Some(&setup.engines), Some(&prev.routes));
        // built while `prev` is held: what the new table keeps finds its cells
        let forward = ForwardState::shared(&routes, &setup.routing_cells, self.seed ^ generation);
        let next = Rc::new(Routing {
            routes,
            forward,
            generation,
            mcp: crate::mcp::Servers::build(&setup.config),
        });
        match self.current.try_borrow_mut() {
            Ok(mut cur) => {
                *cur = next;
                self.seen.set(generation);
                true
            }
            Err(_) => false,
        }
    }

    /// The generation the shard runs now.
    pub fn generation(&self) -> u64 {
        self.seen.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(models: &[&str]) -> Config {
        let mut text = String::from("[[provider]]\nname = \"mock\"\nkind = \"mock\"\n");
        for m in models {
            text.push_str(&format!("[[model]]\nname = \"{m}\"\nprovider = \"mock\"\n"));
        }
        Config::parse(&text).unwrap()
    }

    #[test]
    fn a_request_keeps_its_snapshot_and_the_next_one_sees_the_new_table() {
        let published = Arc::new(Published::new(Setup::plain(cfg(&["a", "b"]))));
        let live = LiveRouting::new(
            &Setup::plain(cfg(&["a", "b"])),
            Some(published.clone()),
            0,
            1,
        );
        let (before, fresh) = live.current();
        assert!(!fresh);
        assert!(before.routes.resolve("b").is_some());
        published.publish(Setup::plain(cfg(&["a", "c"])));
        let (after, fresh) = live.current();
        assert!(fresh, "the first request after a publish rebuilds");
        assert_eq!(after.generation, 1);
        assert!(after.routes.resolve("b").is_none(), "removed");
        assert!(after.routes.resolve("c").is_some(), "added");
        assert!(
            before.routes.resolve("b").is_some(),
            "in flight: the old table"
        );
        // stable indices: `a` keeps 0, `b` stays retired at 1, `c` is appended
        assert_eq!(after.routes.resolve_index("a"), Some(0));
        assert_eq!(after.routes.resolve_index("c"), Some(2));
        assert!(after
            .routes
            .route(1)
            .is_some_and(|r| r.retired && r.name == "b"));
        let (again, fresh) = live.current();
        assert!(!fresh);
        assert!(Rc::ptr_eq(&after, &again), "no rebuild without a publish");
        // re-adding a removed model takes its old index back
        published.publish(Setup::plain(cfg(&["b"])));
        let (third, _) = live.current();
        assert_eq!(third.routes.resolve_index("b"), Some(1));
        assert!(third.routes.route(0).is_some_and(|r| r.retired));
        assert_eq!(third.routes.routes().len(), 3);
    }
}
