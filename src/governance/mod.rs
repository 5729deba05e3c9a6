//! Governance: who may call (virtual keys) and how much (per-key limits), decided on the
//! request path in two stages — on the head, before admission (the key: 401; its request rate
//! and concurrency: 429), and after routing (the model allow-list: 403; the token rate: 429).
//!
//! - **Keys** (`keyring`): `[[key]]` entries, held as SHA-256 digests; a request presents one the
//!   way its SDK sends it (`credential`; Gemini paths also take `?key=`). Keys never reach logs,
//!   metrics or errors (the key's name does) and are never forwarded upstream: upstream requests
//!   carry the provider's header lines (`route::Provider::auth_headers`) and only the client
//!   headers `upstream::headers` forwards, never a credential.
//! - **Runtime keys** (`registry`, `spec`, `directory`, `trie`): the admin API changes the
//!   process-wide key list (`registry`, admin thread only) and publishes a new keyring snapshot
//!   (O(log n): it shares every unchanged key with the last one); each shard's `Governance`
//!   compares the directory generation once per request and refreshes its view, visiting only
//!   the slots that changed since its view (O(changes × log n), not O(keys)), keeping each
//!   key's state by slot (a key keeps its slot, by name, for the process's life) and giving
//!   new keys their `SpendBook` ledger.
//! - **Shared keys** (`[fleet] share = ["keys"]`, `fleet`): runtime keys live in the limits
//!   store too; a fleet thread follows its change feed into the registry (docs/fleet.md).
//! - **Secure by default** (`exposure`): a non-loopback listener with no keys refuses to start
//!   unless `auth = "none"` is written explicitly.
//! - **Limits per key, across shards** (`counters`). A key's `rpm`, `tpm` and `max_in_flight`
//!   are counted once for the whole process, whatever shard a connection lands on
//!   (SO_REUSEPORT hashes connections, not keys): one process-wide table of atomics indexed by
//!   the key's slot, its windows and in-flight counts taken by compare-and-swap, so shards
//!   racing for a key's last request can never admit more than the limit. The price is that a
//!   keyed request with limits touches one cache line shared between cores (a few atomic
//!   operations; measured in `bench-results/2026-12-01-limits-per-key.md`); keys without limits
//!   touch nothing shared.
//! - **Limits shared** (`[limits] store = "redis"`, `store` and `shared`): the full limits are
//!   counted in Redis/Valkey, one count for every shard of every process using it; `admit`
//!   and `Grant::check_model` leave the decision to `Grant::confirm`, which asks the store
//!   (one round trip on the head for `rpm`/`max_in_flight`, one after the body for `tpm`). When
//!   the store fails, the process-wide counters above decide (or 503, `on_store_error =
//!   "closed"`). With `mode = "leased"` (`lease`) a key's `rpm` is decided from units of its
//!   window the process leased from the store ahead: no round trip per request.
//! - **Windows** (`window`): fixed 60 s windows anchored at their first charge (shared store:
//!   wall-clock minutes, see `store::script`). RPM and
//!   in-flight are charged on the head; TPM reserves an `estimate` (prompt bytes / 4 + the output
//!   cap) when the body is read, and the `Grant` reconciles it when the request ends with the
//!   usage the answer reported (`usage`: scanned from relayed bodies and streams, or handed
//!   over by the translator). No usage and an error (or no) answer: the reservation is given
//!   back.
//! - **Usage and spend** (`spend`): every successful answer's input and output tokens are
//!   recorded per key × model, priced at the answering deployment's price, in this shard's
//!   metrics and in the process-wide `SpendBook` (one per process, shared by the shards).
//! - **Budgets**: a key whose spend in its current UTC period (`day`, `month`, `total`) reached
//!   `budget_usd` gets 429 `insufficient_quota` on the head (Anthropic: `billing_error`), with
//!   `Retry-After` until the next period and `x-should-retry: false`. A request reserves its
//!   estimated cost in the key's ledger when its body is read (the token estimate above, priced
//!   at the route's dearest deployment) and gives it back when it ends, after its real cost was
//!   recorded; it is admitted while spend + reservations are under the budget, so concurrent
//!   requests overshoot the budget by at most one request's estimate (plus what requests without
//!   an output cap spend over theirs: `check` and the admin API warn about a budget without
//!   `max_in_flight`).
//! - Over a limit: 429 in the client's dialect with `Retry-After` (seconds until the window
//!   frees; 1 for in-flight). Every response to a keyed request with `rpm`/`tpm` carries
//!   `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`: the key's limit and what is left
//!   of it in the whole process.
//!
//! Cost: with keys off for good (no keys and no admin listener, or `auth = "none"`),
//! `identify` is one branch and nothing else runs; with an admin listener but no key yet, one
//! relaxed atomic load more. With keys on, one
//! SHA-256 of the presented key and one digest-map probe per request, plus two `Instant::now()`
//! when the key has limits (see `benches/micro.rs`, group `governance`).
//!
//! Owns: `Governance` (per shard, in `Shard`), `Caller`, `Gate`. Must not: share mutable state
//! across shards other than through atomics (the `Counters`, the `SpendBook`) and the shared
//! limits `store` (the keyring snapshot is shared read-only), do IO other than through its
//! `store`, or see a secret after `identify` returns.

pub mod state;

use std::cell::{Cell, Ref, RefCell};
use std::sync::Arc;

pub mod counters;
pub(crate) mod credential;
pub mod directory;
mod estimate;
pub mod exposure;
pub mod fleet;
mod grant;
pub mod keyring;
pub mod lease;
mod metrics;
pub mod registry;
mod shared;
pub mod spec;
pub mod spend;
pub mod store;
mod trie;
pub mod usage;
pub mod window;

pub use counters::Counters;
pub use directory::Directory;
pub use grant::Grant;
pub use keyring::{Key, Keyring};
pub use metrics::Reason;
pub use spend::{Price, SpendBook};

use crate::error::{Error, Kind};
use crate::http::RequestHead;
use crate::route::RouteTable;
use crate::util::decimal::push_u64;
use credential::Presented;
use metrics::KeyMetrics;
use shared::Outage;
use spend::{unix_now, KeyLedger, Period, Tally};
use window::{secs_up, Tick, Window};

/// Who sent a request, decided on its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Keys are not checked (`auth = "none"`).
    Open,
    /// A valid secret of key `n` (enabled and expiry are checked at `admit`).
    Key(u32),
    /// No key header.
    Missing,
    /// A secret that matches no key.
    Unknown,
    /// A key header sent twice.
    Ambiguous,
}

impl Caller {
    /// The key index when the caller presented a valid key.
    pub fn key(self) -> Option<u32> {
        match self {
            Caller::Key(k) => Some(k),
            _ => None,
        }
    }
}

/// What a request's target asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Health, readiness, metrics: nothing.
    Open,
    /// The model list: a valid key, no limits.
    Key,
    /// Provider API calls: a valid key and its limits.
    Limits,
}

/// What this shard keeps of one key (its limit counters are process-wide: `Counters`).
#[derive(Debug, Default)]
pub(crate) struct KeyState {
    /// This shard's requests of the key in flight (what a shared store's count of this shard
    /// mirrors, see `shared`).
    pub in_flight: Cell<u64>,
    /// The key's ledger in the process-wide `SpendBook` (`None` without one).
    pub ledger: Option<Arc<KeyLedger>>,
    /// This shard's ledger rows of the key, by route (a key uses few models).
    pub tallies: RefCell<Vec<(u32, Tally)>>,
    /// Admitted here while the shared store was failing (added to it when it is back).
    pub outage: Outage,
}

/// One shard's governance: its view of the keyring, its own state of each key, and the
/// process's limit counters (`Counters`, shared by every shard).
///
/// The keyring is a shared snapshot (`Arc<Keyring>`, read-only); with a live `directory` the
/// shard checks its generation once per request (one `Relaxed` load, `identify`) and takes a
/// new snapshot when it moved, keeping each key's state by slot. Keys off for good (no
/// keys and none can be added, or `auth = "none"`): `identify` is one branch.
#[derive(Debug, Default)]
pub struct Governance {
    /// Keys are never checked and the ring never changes: the one-branch path.
    off: bool,
    /// Where runtime key changes come from (`None`: this view never changes).
    dir: Option<Arc<Directory>>,
    /// The directory generation `ring` belongs to.
    seen: Cell<u64>,
    ring: RefCell<Arc<Keyring>>,
    checked: Cell<bool>,
    /// This shard's state by key slot (grows with the ring, never shrinks: slots are stable).
    state: RefCell<Vec<KeyState>>,
    /// The process-wide limit counters by key slot (shared by every shard).
    pub(crate) counters: Arc<Counters>,
    pub(crate) metrics: KeyMetrics,
    /// This shard's number (its rows in the `SpendBook`).
    shard: usize,
    /// Model (route) names by route index, for ledger rows (set with the `SpendBook`, and again
    /// by a reload: route indices are stable, new models are appended).
    models: RefCell<Vec<Box<str>>>,
    /// Slots the last `install` visited (tests: a change visits its slots, not every key).
    installed: Cell<usize>,
    /// The shared store (`[limits] store = "redis"`); `None`: per-shard counters only.
    pub(crate) store: Option<store::Store>,
    /// The process-wide ledger new keys get their rows in (set by `with_spend`).
    book: Option<Arc<SpendBook>>,
    /// This shard's lease refills (`mode = "leased"`).
    refills: lease::Refills,
}

/// "1 request", "5 requests".
fn requests(n: u64) -> String {
    if n == 1 {
        "1 request".into()
    } else {
        format!("{n} requests")
    }
}

/// The 429 of the API key `name` at its request `limit` (`Reason::Rpm`: per minute; else in
/// flight), to retry in `secs`.
fn over_limit(name: &str, reason: Reason, limit: u64, secs: u64) -> Error {
    let per = match reason {
        Reason::Rpm => "per minute",
        _ => "in flight",
    };
    Error::new(
        Kind::RateLimited,
        format!(
            "rate limit: {} {per} is the limit of the API key {name:?}; retry in {secs} s",
            requests(limit)
        ),
    )
    .retry_after(secs.min(u64::from(u32::MAX)) as u32)
}

impl Governance {
    /// Keys off: every request is `Caller::Open`.
    pub fn off() -> Governance {
        Governance {
            off: true,
            ..Governance::default()
        }
    }

    /// Shard `shard`, with a fixed `ring` (it never changes) and counters of its own (share
    /// a process's with `with_counters`).
    pub fn new(ring: Keyring, shard: usize) -> Governance {
        let g = Governance {
            off: !ring.checked,
            shard,
            ..Governance::default()
        };
        g.install(Arc::new(ring), true);
        g
    }

    /// Shard `shard`, following `dir` (runtime key changes). With `live` false the directory
    /// never changes and keys are off when its first snapshot says so.
    pub fn follow(dir: Arc<Directory>, live: bool, shard: usize) -> Governance {
        let (generation, ring) = dir.load();
        let g = Governance {
            off: !live && !ring.checked,
            dir: live.then_some(dir),
            seen: Cell::new(generation),
            shard,
            ..Governance::default()
        };
        g.install(ring, true);
        g
    }

    /// Count limits in `counters`, the process's table every shard shares (by key slot).
    pub fn with_counters(mut self, counters: Arc<Counters>) -> Governance {
        counters.reserve(self.ring.try_borrow().map_or(0, |r| r.keys.len()));
        self.counters = counters;
        self
    }

    /// Record every key's usage and spend in `book` (shared by all shards) and enforce the
    /// keys' budgets against it. Each key's ledger gets the key's budget and period; ledger
    /// rows name the model by `routes`' names. Keys added later get theirs when they arrive.
    pub fn with_spend(mut self, book: &Arc<SpendBook>, routes: &RouteTable) -> Governance {
        self.set_models(routes);
        self.book = Some(book.clone());
        let ring = self.ring.try_borrow().map(|r| r.clone()).ok();
        if let Some(ring) = ring {
            self.install(ring, true);
        }
        self
    }

    /// Name ledger rows by `routes` (at start and after a reload swapped the route table).
    pub fn set_models(&self, routes: &RouteTable) {
        if let Ok(mut m) = self.models.try_borrow_mut() {
            *m = routes
                .routes()
                .iter()
                .map(|r| r.name.as_str().into())
                .collect();
        }
    }

    /// Take `ring` as this shard's view: the state of the keys it already had is kept (by
    /// slot; a slot whose name changed starts fresh), new keys get theirs (and their ledger),
    /// and each changed key's budget is set again. Only the slots set since the current view
    /// are visited (`Slots::changed_since`: the snapshots share everything else), so a
    /// directory change costs O(changes × log n) per shard; `all` visits every slot (the same
    /// ring again, with a ledger book now). (The limit counters are the process's, by slot:
    /// slots are stable, so nothing of them changes here.)
    fn install(&self, ring: Arc<Keyring>, all: bool) -> bool {
        let (Ok(mut cur), Ok(mut state)) =
            (self.ring.try_borrow_mut(), self.state.try_borrow_mut())
        else {
            return false;
        };
        let changed: Vec<(usize, &Key)> = match all {
            true => ring.keys.iter().enumerate().collect(),
            false => ring.keys.changed_since(&cur.keys),
        };
        self.installed.set(changed.len());
        // slots are dense: new ones (in `changed`) get fresh state below
        if state.len() < ring.keys.len() {
            state.resize_with(ring.keys.len(), KeyState::default);
        }
        for (i, k) in changed {
            let same = cur.keys.get(i).is_some_and(|old| old.name == k.name);
            let Some(st) = state.get_mut(i) else {
                continue;
            };
            if !same {
                *st = KeyState::default();
            }
            if let Some(book) = &self.book {
                let ledger = st
                    .ledger
                    .clone()
                    .unwrap_or_else(|| book.ensure_key(&k.name));
                ledger.set_budget(k.budget_nanos, Some(k.period));
                st.ledger = Some(ledger);
            }
        }
        self.metrics.grow(ring.keys.len());
        self.counters.reserve(ring.keys.len());
        self.checked.set(ring.checked);
        *cur = ring;
        true
    }

    /// Take the directory's new snapshot if it changed (cold: once per change per shard).
    #[cold]
    #[inline(never)]
    fn refresh(&self, dir: &Directory) {
        let (generation, ring) = dir.load();
        // refused only while a view is borrowed (never between requests): retried next request
        if self.install(ring, false) {
            self.seen.set(generation);
        }
    }

    /// A finished request of key `key` answered by route `route`: `input`/`output` tokens at
    /// `price`, into the metrics and the ledger (one row per key × model per shard).
    pub(crate) fn record(&self, key: u32, route: usize, (input, output): (u64, u64), price: Price) {
        let Some((_, st)) = self.key(key) else {
            return;
        };
        let nanos = price.cost_nanos(input, output);
        self.metrics.usage(key, route, (input, output), nanos);
        if nanos > 0 && self.store.is_some() {
            self.spend_shared(key, nanos);
        }
        let Some(ledger) = &st.ledger else {
            return;
        };
        let Ok(mut tallies) = st.tallies.try_borrow_mut() else {
            return;
        };
        let r = route as u32;
        let at = match tallies.iter().position(|(t, _)| *t == r) {
            Some(at) => at,
            None => {
                let models = self.models.try_borrow();
                let model = models.as_ref().ok().and_then(|m| m.get(route));
                tallies.push((r, ledger.tally(model.map_or("", |m| &**m), self.shard)));
                tallies.len() - 1
            }
        };
        // (`total` periods never roll: no clock read)
        let now = match ledger.period() {
            Period::Total => 0,
            _ => unix_now(),
        };
        tallies[at].1.add(input, output, nanos, now);
    }

    /// Keep the counters in a shared store (when keys are checked).
    pub fn with_store(mut self, store: Option<store::Store>) -> Governance {
        // keys checked now, or possibly later (a live directory: keys made at runtime)
        self.store = store.filter(|_| self.checked.get() || self.dir.is_some());
        self
    }

    /// Whether requests need a key.
    pub fn checked(&self) -> bool {
        self.checked.get()
    }

    /// Key `i`'s name (access log).
    pub fn key_name(&self, i: u32) -> Option<Ref<'_, str>> {
        self.key(i).map(|(k, _)| Ref::map(k, |k| &*k.name))
    }

    /// Key `i` and this shard's state of it.
    pub(crate) fn key(&self, i: u32) -> Option<(Ref<'_, Key>, Ref<'_, KeyState>)> {
        let ring = self.ring.try_borrow().ok()?;
        let key = Ref::filter_map(ring, |r| r.keys.get(i as usize)).ok()?;
        let state = self.state.try_borrow().ok()?;
        let st = Ref::filter_map(state, |s| s.get(i as usize)).ok()?;
        Some((key, st))
    }

    /// Who sent `head` (its ranges point into `buf`). Pure: call it while the head is still in
    /// the buffer; the answer is acted on by `admit`.
    #[inline]
    pub fn identify(&self, head: &RequestHead, buf: &[u8]) -> Caller {
        if self.off {
            return Caller::Open;
        }
        if let Some(dir) = &self.dir {
            if dir.generation() != self.seen.get() {
                self.refresh(dir);
            }
        }
        if !self.checked.get() {
            return Caller::Open;
        }
        credential::with_presented(head, buf, |p| match p {
            Presented::Nothing => Caller::Missing,
            Presented::Ambiguous => Caller::Ambiguous,
            Presented::Key(secret) => self
                .ring
                .try_borrow()
                .ok()
                .and_then(|r| r.lookup(secret))
                .map_or(Caller::Unknown, Caller::Key),
        })
    }

    /// The head stage: the caller's key must be valid for `gate` (401), and for API calls its
    /// in-flight count and request rate must have room (429). On success an API call holds a
    /// `Grant` until it ends. Rate-limit header lines go to `headers` (every response of the
    /// request carries them, refusals included).
    pub fn admit(
        &self,
        caller: Caller,
        gate: Gate,
        headers: &mut Vec<u8>,
    ) -> Result<Option<Grant<'_>>, Error> {
        if gate == Gate::Open {
            return Ok(None);
        }
        let i = match caller {
            Caller::Open => return Ok(None),
            Caller::Key(i) => i,
            refused => {
                self.metrics.rejected(None, Reason::Auth);
                let why = match refused {
                    Caller::Missing => "missing API key: send a key of this gateway as `Authorization: Bearer <key>` (or x-api-key, api-key, x-goog-api-key)",
                    Caller::Ambiguous => "more than one API key was sent; send one",
                    _ => "invalid API key",
                };
                return Err(Error::new(Kind::Unauthorized, why));
            }
        };
        let Some((key, st)) = self.key(i) else {
            return Err(Error::new(Kind::Unauthorized, "invalid API key"));
        };
        if !key.enabled || key.expires.is_some_and(|t| unix_now() >= t) {
            self.metrics.rejected(Some(i), Reason::Auth);
            let state = if key.enabled {
                "has expired"
            } else {
                "is disabled"
            };
            return Err(Error::new(
                Kind::Unauthorized,
                format!("the API key {:?} {state}", &*key.name),
            ));
        }
        if gate == Gate::Key {
            return Ok(None);
        }
        if let Some(l) = st.ledger.as_deref().filter(|l| l.has_budget()) {
            self.budget_left(i, &key.name, l, headers)?;
        }
        let hdr_at = headers.len();
        let budgeted = || st.ledger.as_deref().is_some_and(|l| l.has_budget());
        if self.store.is_some() && (key.limited() || budgeted()) {
            if self.store.as_ref().is_some_and(store::Store::leased) && lease::leases_key(&key, &st)
            {
                drop((key, st));
                return self.admit_leased(i, hdr_at, headers).map(Some);
            }
            return Ok(Some(self.admit_shared(i, hdr_at)));
        }
        if !key.limited() {
            st.in_flight.set(st.in_flight.get().saturating_add(1));
            return Ok(Some(Grant::new(self, i, hdr_at)));
        }
        let (tok_at, counted) = self.admit_local(i, hdr_at, headers)?;
        let mut g = Grant::new(self, i, tok_at);
        g.counted = counted;
        Ok(Some(g))
    }

    /// Key `i`'s in-flight count and request rate in the process's counters (429), counted on
    /// success (and in this shard's in-flight count); returns where the `-tokens` header lines
    /// start and whether the request counts in the process's in-flight count.
    pub(crate) fn admit_local(
        &self,
        i: u32,
        hdr_at: usize,
        headers: &mut Vec<u8>,
    ) -> Result<(usize, bool), Error> {
        let Some((key, st)) = self.key(i) else {
            return Ok((headers.len(), false));
        };
        let c = self.counters.slot(i);
        let now = self.counters.now();
        let mut refuse = |reason: Reason, limit: u64, secs: u64| {
            self.rate_headers(i, now, hdr_at, headers);
            self.metrics.rejected(Some(i), reason);
            Err(over_limit(&key.name, reason, limit, secs))
        };
        let counted = key.max_in_flight.is_some();
        if let Some(max) = key.max_in_flight {
            if !c.enter(max) {
                return refuse(Reason::InFlight, max, 1);
            }
        }
        if let Some(limit) = key.rpm {
            if let Err(full) = c.rpm.take(now, 1, limit) {
                if counted {
                    c.leave();
                }
                let secs = secs_up(full.retry_after);
                return refuse(Reason::Rpm, limit, secs);
            }
        }
        st.in_flight.set(st.in_flight.get().saturating_add(1));
        Ok((self.rate_headers(i, now, hdr_at, headers), counted))
    }

    /// 429 `insufficient_quota` when key `i` spent its budget for the current period, with
    /// `Retry-After` (seconds until the next period; none for `total`) and
    /// `x-should-retry: false` (the official SDKs would otherwise retry a 429).
    #[cold]
    fn budget_left(
        &self,
        i: u32,
        name: &str,
        l: &KeyLedger,
        headers: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let now = unix_now();
        let Some((budget, spent)) = l.over_budget(now) else {
            return Ok(());
        };
        Err(self.budget_refusal(i, name, (budget, spent), l.period(), now, headers))
    }

    /// The 429 `insufficient_quota` for key `i` that spent `spent` of `budget` nano-USD in its
    /// `period` (here or, with a shared store, in the whole fleet).
    #[cold]
    pub(crate) fn budget_refusal(
        &self,
        i: u32,
        name: &str,
        (budget, spent): (u64, u64),
        period: Period,
        now: i64,
        headers: &mut Vec<u8>,
    ) -> Error {
        self.metrics.rejected(Some(i), Reason::Budget);
        headers.extend_from_slice(b"x-should-retry: false\r\n");
        let usd = |n: u64| n as f64 / spend::NANOS_PER_USD as f64;
        let when = match period {
            Period::Total => "in total".to_string(),
            p => format!("this {} (UTC)", p.as_str()),
        };
        // under the budget yet refused: requests in flight reserved the rest
        let rest = if spent < budget {
            "; requests in flight have reserved the rest"
        } else {
            ""
        };
        let e = Error::new(
            Kind::BudgetExceeded,
            format!(
                "budget: the API key {name:?} has spent {:.6} USD of its {:.6} USD budget {when}{rest}",
                usd(spent),
                usd(budget)
            ),
        );
        match period.next_start(now) {
            Some(t) => e.retry_after((t - now).clamp(1, i64::from(u32::MAX)) as u32),
            None => e,
        }
    }

    /// Write key `i`'s `x-ratelimit-*` lines at `at` in `headers` (the lines after `at` are
    /// this stage's own); returns where the `-tokens` lines start.
    fn rate_headers(&self, i: u32, now: Tick, at: usize, headers: &mut Vec<u8>) -> usize {
        headers.truncate(at);
        if let Some((key, _)) = self.key(i) {
            if let Some(limit) = key.rpm {
                window_lines(headers, "requests", limit, &self.counters.slot(i).rpm, now);
            }
        }
        let tok_at = headers.len();
        self.token_headers(i, now, tok_at, headers);
        tok_at
    }

    /// (Re)write key `i`'s `x-ratelimit-*-tokens` lines at `at` in `headers`.
    pub(crate) fn token_headers(&self, i: u32, now: Tick, at: usize, headers: &mut Vec<u8>) {
        headers.truncate(at);
        if let Some((key, _)) = self.key(i) {
            if let Some(limit) = key.tpm {
                window_lines(headers, "tokens", limit, &self.counters.slot(i).tpm, now);
            }
        }
    }

    /// Append this shard's key metrics (nothing when keys are off).
    pub fn render(&self, routes: &RouteTable, shard: usize, out: &mut String) {
        if !self.checked.get() {
            return;
        }
        let Ok(ring) = self.ring.try_borrow() else {
            return;
        };
        let name = |i: usize| ring.keys.get(i).map_or("", |k| &*k.name);
        self.metrics.render(&name, routes, shard, out);
        if let Some(s) = &self.store {
            s.render(out);
            if s.leased() {
                self.render_leases(shard, out);
            }
        }
    }

    /// Requests key `key` made for route `route` on this shard (tests, benches).
    pub fn requests(&self, key: u32, route: usize) -> u64 {
        self.metrics.requests(key, route)
    }

    /// (input tokens, output tokens, nano-USD) key `key` used on route `route` on this shard.
    pub fn usage(&self, key: u32, route: usize) -> (u64, u64, u64) {
        self.metrics.usage_of(key, route)
    }
}

/// `x-ratelimit-{limit,remaining,reset}-{what}` lines for window `w` with `limit` (numbers
/// written by hand: `fmt` costs several times more, on every keyed response).
fn window_lines(out: &mut Vec<u8>, what: &str, limit: u64, w: &Window, now: Tick) {
    let left = limit.saturating_sub(w.used(now));
    limit_lines(out, what, limit, left, secs_up(w.reset_in(now)));
}

/// `x-ratelimit-{limit,remaining,reset}-{what}` lines.
fn limit_lines(out: &mut Vec<u8>, what: &str, limit: u64, left: u64, reset_secs: u64) {
    for (name, v, unit) in [
        ("limit", limit, ""),
        ("remaining", left, ""),
        ("reset", reset_secs, "s"),
    ] {
        out.extend_from_slice(b"x-ratelimit-");
        out.extend_from_slice(name.as_bytes());
        out.push(b'-');
        out.extend_from_slice(what.as_bytes());
        out.extend_from_slice(b": ");
        push_u64(out, v);
        out.extend_from_slice(unit.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests;
