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
//! A fleet (`[fleet] share = ["responses"]`): each shard also writes its entries to the shared
//! store and reads there what the process does not hold (`remote`; the process store is the
//! cache in front), with fleet-wide tenant digests. A request whose references are all held
//! here makes no store round trip; store down: what this process holds.
//!
//! Owns: [`ShardStore`] (a shard's handle: the shared store, its budget charge, tenant hashing,
//! its `remote` connection) and [`Remember`]. Must not: parse dialect JSON itself (that is
//! `translate::references`), do IO other than through `remote`, or answer 503 when the store is
//! full (it evicts, or refuses to store).

pub mod remote;
pub mod store;

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::admit::{Budget, Held};
use crate::config::responses::ResponsesConfig;
use crate::dialect::references::{self, Expanded, PastTurn, Recall};
use crate::error::{Error, Kind};
use remote::{Found, Remote, RemoteStats};
use store::{Store, Stored};

/// The process-wide half, shared by every shard.
pub struct Shared {
    store: Store,
    /// Keys of the tenant hash (random per process: a tenant id says nothing about its key).
    keys: RandomState,
    /// `[fleet] share = ["responses"]`: the fleet's store holds every entry too (`remote`);
    /// tenants are then fleet-wide digests, the same on every node.
    fleet: Option<Arc<RemoteStats>>,
    max_bytes: u64,
    ttl: Duration,
}

impl Shared {
    /// The store `cfg` asks for; `None` when `store_max_bytes` is 0. `fleet`: the entries are
    /// shared through the fleet's store (each shard then connects with [`Shared::remote`]).
    pub fn from_config(cfg: &ResponsesConfig, shards: usize, fleet: bool) -> Option<Arc<Shared>> {
        let max = cfg.store_max_bytes.bytes();
        let ttl = Duration::from_secs(cfg.ttl_s.max(1));
        (max > 0).then(|| {
            Arc::new(Shared {
                store: Store::new(max, ttl, shards),
                keys: RandomState::new(),
                fleet: fleet.then(Default::default),
                max_bytes: max,
                ttl,
            })
        })
    }

    /// Shard `shard`'s connection to the fleet's store (`None` unless shared).
    pub fn remote(
        &self,
        settings: Option<crate::governance::store::Settings>,
        shard: usize,
    ) -> Option<Rc<Remote>> {
        let stats = self.fleet.clone()?;
        Some(Rc::new(Remote::new(
            settings?,
            shard,
            self.ttl,
            self.max_bytes,
            stats,
        )))
    }

    /// `ringgate_responses_fleet_*` (nothing unless shared).
    pub fn render(&self, out: &mut String) {
        if let Some(s) = &self.fleet {
            s.render(out);
        }
    }

    /// The fleet counters (`None` unless shared).
    pub fn fleet_stats(&self) -> Option<&RemoteStats> {
        self.fleet.as_deref()
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
    /// `[fleet] share = ["responses"]`: this shard's connection to the fleet's store.
    remote: Option<Rc<Remote>>,
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
            remote: None,
        }
    }

    /// Share the entries through the fleet's store (`Shared::remote`).
    pub fn with_remote(mut self, remote: Option<Rc<Remote>>) -> ShardStore {
        self.remote = remote;
        self
    }

    /// This shard's connection to the fleet's store, to be maintained on the shard's runtime.
    pub fn remote(&self) -> Option<Rc<Remote>> {
        self.remote.clone()
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
    /// tenant 0. Shared through the fleet's store: 64 bits of a SHA-256 over a fixed label,
    /// the kind and the key, the same on every node (the store sees the digest, never the key).
    pub fn tenant(&self, virtual_key: bool, key: Option<&[u8]>) -> u64 {
        let (Some(s), Some(k)) = (&self.shared, key) else {
            return 0;
        };
        if s.fleet.is_some() {
            let mut d = ring::digest::Context::new(&ring::digest::SHA256);
            d.update(b"ringgate responses tenant\0");
            d.update(if virtual_key { b"k" } else { b"c" });
            d.update(k);
            let mut first = [0u8; 8];
            first.copy_from_slice(&d.finish().as_ref()[..8]);
            return u64::from_le_bytes(first).max(1);
        }
        let mut h = s.keys.build_hasher();
        std::hash::Hasher::write_u8(&mut h, if virtual_key { b'k' } else { b'c' });
        std::hash::Hasher::write(&mut h, k);
        std::hash::Hasher::finish(&h).max(1)
    }

    /// Expand the references of a Responses `body` for a translated attempt. Unknown, expired or
    /// evicted ids (or the store off): 400 `invalid_request_error` naming the field.
    ///
    /// Shared through the fleet's store: what this node does not hold is read from the store
    /// (items at once, a `previous_response_id` chain link by link), kept for this request and
    /// offered to the local store as the cache. Store down or slow: what this node holds.
    pub async fn expand(&self, tenant: u64, body: &[u8]) -> Result<Expanded, Error> {
        if let (Some(s), Some(r)) = (&self.shared, &self.remote) {
            return self.expand_shared(s, r, tenant, body).await;
        }
        self.expand_with(tenant, body, &HashMap::new())
    }

    /// [`ShardStore::expand`] from what this node holds only (no store read).
    pub fn expand_local(&self, tenant: u64, body: &[u8]) -> Result<Expanded, Error> {
        self.expand_with(tenant, body, &HashMap::new())
    }

    async fn expand_shared(
        &self,
        s: &Shared,
        remote: &Remote,
        tenant: u64,
        body: &[u8],
    ) -> Result<Expanded, Error> {
        let mut got = Gathered {
            tenant,
            bytes: 0,
            fetched: HashMap::new(),
        };
        // round 1 finds what is missing; the reads fill in the items and walk the chain; round
        // 2 normally expands; a third covers a chain that met an entry evicted meanwhile
        for _ in 0..3 {
            let mut probe = Probe {
                local: Recaller {
                    store: &s.store,
                    tenant,
                    now: Instant::now(),
                    fetched: &got.fetched,
                },
                items: Vec::new(),
                turn: None,
            };
            let done = references::expand(body, &mut probe);
            let (items, turn) = (probe.items, probe.turn);
            if items.is_empty() && turn.is_none() {
                return done
                    .map_err(|e| Error::new(Kind::InvalidBody, e.message).with_param(e.param));
            }
            if !remote.up() {
                if let Some(st) = s.fleet_stats() {
                    remote::add_error(st);
                }
                break;
            }
            let before = got.fetched.len();
            for id in items {
                if let Found::Entry(v, age) = remote.get(tenant, false, &id).await {
                    self.keep(s, &mut got, (false, &id), (&v, age));
                }
            }
            let mut next = turn;
            let mut links = 0;
            while let Some(id) = next.take() {
                if links >= references::MAX_CHAIN || got.bytes > s.max_bytes {
                    break;
                }
                links += 1;
                let Found::Entry(v, age) = remote.get(tenant, true, &id).await else {
                    break;
                };
                if let Stored::Turn(t) = &v {
                    next = t.previous.as_deref().map(str::to_string).filter(|p| {
                        !got.fetched.contains_key(&(true, p.as_str().into()))
                            && s.store.get(tenant, true, p, Instant::now()).is_none()
                    });
                }
                self.keep(s, &mut got, (true, &id), (&v, age));
            }
            if got.fetched.len() == before {
                break;
            }
        }
        self.expand_with(tenant, body, &got.fetched)
    }

    /// Keep an entry read from the fleet's store for this request (at most the local store's
    /// size in all) and offer it to the local store, as old as the store says it is. `key`:
    /// (is a turn, id); `entry`: what the store holds and its age.
    fn keep(
        &self,
        s: &Shared,
        got: &mut Gathered,
        (response, id): (bool, &str),
        (v, age): (&Stored, Duration),
    ) {
        let (tenant, bytes, fetched) = (got.tenant, &mut got.bytes, &mut got.fetched);
        let size = match v {
            Stored::Item(b) => b.len(),
            Stored::Turn(t) => t.input.len() + t.output.len(),
        } as u64;
        *bytes = bytes.saturating_add(size);
        if *bytes > s.max_bytes {
            return;
        }
        if let Some(held) = &self.held {
            let born = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
            s.store.put(
                self.shard,
                held,
                tenant,
                vec![(response, id.into(), v.clone())],
                born,
            );
        }
        fetched.insert((response, id.into()), v.clone());
    }

    fn expand_with(&self, tenant: u64, body: &[u8], fetched: &Fetched) -> Result<Expanded, Error> {
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
            fetched,
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
        if let Some(remote) = &self.remote {
            remote.put(r.tenant, &entries);
        }
        s.store
            .put(self.shard, held, r.tenant, entries, Instant::now());
    }

    /// Wait until this shard's writes to the fleet's store are answered (at most
    /// `redis_timeout_ms`; nothing shared or pending: no wait). Call after [`ShardStore::record`]
    /// and before the answer's last bytes go out.
    pub async fn written(&self) {
        if let Some(r) = &self.remote {
            r.written().await;
        }
    }

    /// Once a second: expired entries leave, this shard's charge follows what it owns.
    pub fn settle(&self) {
        if let (Some(s), Some(held)) = (&self.shared, &self.held) {
            s.store.settle(self.shard, held, Instant::now());
        }
    }
}

/// Entries read from the fleet's store for one request, by (response flag, id).
type Fetched = HashMap<(bool, Box<str>), Stored>;

/// What one request read from the fleet's store for `tenant`: the entries, and their bytes
/// (bounded by the local store's size).
struct Gathered {
    tenant: u64,
    bytes: u64,
    fetched: Fetched,
}

/// One tenant's view of the store, for `translate::references::expand` (one short lock per
/// lookup), and of what this request read from the fleet's store.
struct Recaller<'a> {
    store: &'a Store,
    tenant: u64,
    now: Instant,
    fetched: &'a Fetched,
}

impl Recaller<'_> {
    fn find(&self, response: bool, id: &str) -> Option<Stored> {
        self.store
            .get(self.tenant, response, id, self.now)
            .or_else(|| self.fetched.get(&(response, id.into())).cloned())
    }
}

impl Recall for Recaller<'_> {
    fn item(&mut self, id: &str) -> Option<Arc<[u8]>> {
        match self.find(false, id)? {
            Stored::Item(b) => Some(b),
            Stored::Turn(_) => None,
        }
    }

    fn response(&mut self, id: &str) -> Option<Arc<PastTurn>> {
        match self.find(true, id)? {
            Stored::Turn(t) => Some(t),
            Stored::Item(_) => None,
        }
    }
}

/// A first pass over a request's references: what this node holds answers; a missing item is
/// noted and stood in for (so the pass reaches the chain), a missing turn is noted and ends it.
struct Probe<'a> {
    local: Recaller<'a>,
    items: Vec<String>,
    turn: Option<String>,
}

impl Recall for Probe<'_> {
    fn item(&mut self, id: &str) -> Option<Arc<[u8]>> {
        self.local.item(id).or_else(|| {
            if self.items.len() < references::MAX_CHAIN {
                self.items.push(id.to_string());
            }
            Some(Arc::from(&b"{}"[..]))
        })
    }

    fn response(&mut self, id: &str) -> Option<Arc<PastTurn>> {
        let t = self.local.response(id);
        if t.is_none() {
            self.turn = Some(id.to_string());
        }
        t
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
