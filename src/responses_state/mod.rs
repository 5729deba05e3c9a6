//! Responses API state on translated routes: `previous_response_id` and
//! `{"type":"item_reference","id":…}` input items resolve when a Responses client is served by a
//! Chat, Anthropic or Gemini upstream, from a bounded store of the gateway's own recent Responses
//! answers (see docs/dialects.md, "Responses state").
//!
//! The flow: the pipeline names the request's tenant (virtual key when governance is on, else a
//! keyed hash of the client's credential, else one shared namespace); a translated attempt
//! (`forward::open`) expands the request's references before translation ([`ShardStore::expand`],
//! through the pure `translate::references`) and takes a [`Remember`] of its own input; the
//! translated answer (`bridge`) is recorded under its response id and its output items' ids.
//! Same-dialect routes never come here: their references reach the upstream untouched.
//! `store: false` from the client: nothing is recorded. Unknown, expired or evicted ids: 400
//! `invalid_request_error` with the field named in `param`.
//!
//! Where entries live: one process-wide [`store::Store`] behind a short lock (the next request of
//! a tool loop may land on any shard), each entry charged to the budget of the shard that stored
//! it. A request without references costs a byte search on the way in; only translated Responses
//! answers are recorded.
//!
//! Owns: [`ShardStore`] (a shard's handle: the shared store, its budget charge, tenant hashing)
//! and [`Remember`]. Must not: parse dialect JSON itself (that is `translate::references`),
//! do IO, or answer 503 when the store is full (it evicts, or refuses to store).

pub mod store;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::admit::{Budget, Held};
use crate::config::responses::ResponsesConfig;
use crate::dialect::references::{self, Expanded, PastTurn, Recall};
use crate::error::{Error, Kind};
use store::{Store, Stored};

/// The process-wide half, shared by every shard.
pub struct Shared {
    store: Store,
    /// Keys of the tenant hash (random per process: a tenant id says nothing about its key).
    keys: RandomState,
}

impl Shared {
    /// The store `cfg` asks for; `None` when `store_max_bytes` is 0.
    pub fn from_config(cfg: &ResponsesConfig, shards: usize) -> Option<Arc<Shared>> {
        let max = cfg.store_max_bytes.bytes();
        (max > 0).then(|| {
            Arc::new(Shared {
                store: Store::new(max, Duration::from_secs(cfg.ttl_s.max(1)), shards),
                keys: RandomState::new(),
            })
        })
    }

    /// The store's counters.
    pub fn stats(&self) -> store::StoreStats {
        self.store.stats()
    }
}

/// What a translated Responses request leaves for its answer to be recorded with.
#[derive(Debug)]
pub struct Remember {
    tenant: u64,
    previous: Option<String>,
    /// The request's own input items (references expanded), a JSON array.
    input: Vec<u8>,
}

impl Remember {
    /// Bytes it holds (charged to the request's permit while it lives).
    pub fn input(&self) -> &Vec<u8> {
        &self.input
    }
}

/// One shard's handle on the store.
pub struct ShardStore {
    shared: Option<Arc<Shared>>,
    held: Option<Held>,
    shard: usize,
}

impl ShardStore {
    /// Shard `shard`'s handle; entries it stores are charged to `budget`, never into its last
    /// quarter (the room the next requests need).
    pub fn new(shared: Option<Arc<Shared>>, shard: usize, budget: &Budget) -> ShardStore {
        let held = shared
            .as_ref()
            .map(|_| Held::new(budget, budget.capacity() / 4));
        ShardStore {
            shared,
            held,
            shard,
        }
    }

    /// Whether the store is on.
    #[inline]
    pub fn on(&self) -> bool {
        self.shared.is_some()
    }

    /// The store's counters (`None` when off).
    pub fn stats(&self) -> Option<store::StoreStats> {
        self.shared.as_ref().map(|s| s.stats())
    }

    /// The tenant of a virtual key (`key` = its name) or of a client credential (`key` = the
    /// presented secret): a keyed 64-bit hash, the kind prefixed so the two never meet. No key:
    /// tenant 0.
    pub fn tenant(&self, virtual_key: bool, key: Option<&[u8]>) -> u64 {
        let (Some(s), Some(k)) = (&self.shared, key) else {
            return 0;
        };
        let mut h = s.keys.build_hasher();
        std::hash::Hasher::write_u8(&mut h, if virtual_key { b'k' } else { b'c' });
        std::hash::Hasher::write(&mut h, k);
        std::hash::Hasher::finish(&h).max(1)
    }

    /// Expand the references of a Responses `body` for a translated attempt. Unknown, expired or
    /// evicted ids (or the store off): 400 `invalid_request_error` naming the field.
    pub fn expand(&self, tenant: u64, body: &[u8]) -> Result<Expanded, Error> {
        let Some(s) = &self.shared else {
            let param = if memchr::memmem::find(body, b"previous_response_id").is_some() {
                "previous_response_id"
            } else {
                "input"
            };
            return Err(Error::new(
                Kind::InvalidBody,
                "`previous_response_id` and `item_reference` need the gateway's Responses \
                 store on this translated route, and it is off ([responses] store_max_bytes = 0)",
            )
            .with_param(param));
        };
        let mut r = Recaller {
            store: &s.store,
            tenant,
            now: Instant::now(),
        };
        references::expand(body, &mut r)
            .map_err(|e| Error::new(Kind::InvalidBody, e.message).with_param(e.param))
    }

    /// What recording this request's answer needs: its own input (from `expanded` when its
    /// references were expanded), its `previous_response_id`; `None` when the store is off or
    /// the client said `store: false`.
    pub fn remember(
        &self,
        tenant: u64,
        body: &[u8],
        expanded: Option<&Expanded>,
    ) -> Option<Remember> {
        self.shared.as_ref()?;
        let (input, previous) = match expanded {
            Some(e) if !references::store_refused(body) => {
                (e.own_input.clone(), e.previous.clone())
            }
            Some(_) => return None,
            None => references::own_input(body)?,
        };
        Some(Remember {
            tenant,
            previous,
            input,
        })
    }

    /// Record a translated Responses answer (a `response` object): the response's turn under
    /// its id, each output item under its id. A store that cannot take it evicts older entries
    /// or refuses; the answer is unaffected either way.
    pub fn record(&self, r: Remember, response: &serde_json::Value) {
        let (Some(s), Some(held)) = (&self.shared, &self.held) else {
            return;
        };
        let Some((id, items, output)) = references::answer(response) else {
            return;
        };
        let mut entries: Vec<(bool, Box<str>, Stored)> = Vec::with_capacity(items.len() + 1);
        for (item_id, raw) in items {
            entries.push((false, item_id.into(), Stored::Item(raw.into())));
        }
        let mut previous = r.previous;
        let mut input = r.input;
        if previous.as_deref() == Some(id.as_str()) {
            // The upstream repeated the previous answer's id (mocks, some engines): this turn
            // replaces that one, so it takes over its history instead of pointing at itself.
            if let Some(Stored::Turn(old)) = s.store.get(r.tenant, true, &id, Instant::now()) {
                input = references::concat_arrays(&[&old.input, &old.output, &input]);
                previous = old.previous.as_deref().map(str::to_string);
            }
        }
        let turn = PastTurn {
            previous: previous.map(Into::into),
            input: input.into(),
            output: output.into(),
        };
        entries.push((true, id.into(), Stored::Turn(Arc::new(turn))));
        s.store
            .put(self.shard, held, r.tenant, entries, Instant::now());
    }

    /// Once a second: expired entries leave, this shard's charge follows what it owns.
    pub fn settle(&self) {
        if let (Some(s), Some(held)) = (&self.shared, &self.held) {
            s.store.settle(self.shard, held, Instant::now());
        }
    }
}

/// One tenant's view of the store, for `translate::references::expand` (one short lock per
/// lookup).
struct Recaller<'a> {
    store: &'a Store,
    tenant: u64,
    now: Instant,
}

impl Recall for Recaller<'_> {
    fn item(&mut self, id: &str) -> Option<Arc<[u8]>> {
        match self.store.get(self.tenant, false, id, self.now)? {
            Stored::Item(b) => Some(b),
            Stored::Turn(_) => None,
        }
    }

    fn response(&mut self, id: &str) -> Option<Arc<PastTurn>> {
        match self.store.get(self.tenant, true, id, self.now)? {
            Stored::Turn(t) => Some(t),
            Stored::Item(_) => None,
        }
    }
}

/// The tenant of a request (see [`ShardStore::tenant`]): its virtual key when governance
/// identified one, else the credential it presents, else the shared namespace (0). Call while
/// the head is in `buf`.
pub fn tenant_of(
    store: &ShardStore,
    governance: &crate::governance::Governance,
    caller: crate::governance::Caller,
    head: &crate::http::RequestHead,
    buf: &[u8],
) -> u64 {
    if let Some(i) = caller.key() {
        if let Some((key, _)) = governance.key(i) {
            return store.tenant(true, Some(key.name.as_bytes()));
        }
    }
    crate::governance::credential::with_presented(head, buf, |p| match p {
        crate::governance::credential::Presented::Key(secret) => store.tenant(false, Some(secret)),
        _ => 0,
    })
}
