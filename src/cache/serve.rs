//! The response cache on the request path: `ask` (on the head: directives and tenant),
//! `lookup` (after routing and governance: a hit is replayed through the answer stage's sink,
//! `answer::Sink`; a miss arranges for its answer to be recorded), `store` (after the answer
//! went out: the recording becomes an entry).
//!
//! Response header `x-ringgate-cache`: `hit`, `semantic-hit (0.973)`, `miss`, or `skip` (a
//! cached model's request the cache did not take part in).
//!
//! Owns: the order of those steps. Must not: forward upstream requests itself (the semantic
//! layer's embedding call goes through `semantic`, which uses `forward`), write to the client
//! other than through `answer::Sink`, or touch other shards' budgets.

use std::sync::Arc;
use std::time::Instant;

use super::answer;
use super::key::{self, Directives, Key};
use super::metrics::Skip;
use super::store::Entry;
use super::{semantic, Cache, Mode};
use crate::answer::outcome::Outcome;
use crate::answer::{Sink, Whole};
use crate::config::provider::Op;
use crate::dialect::extract::UsageOption;
use crate::dialect::Dialect;
use crate::forward::live::LiveRouting;
use crate::forward::open::Call;
use crate::governance::credential::{with_presented, Presented};
use crate::http::conn::{ClientConn, Tee};
use crate::http::RequestHead;

/// What the request head says to the cache, read while it is in the buffer (the tenant's name
/// is made only for a cached model's request, `Ask::tenant`).
#[derive(Debug, Clone, Default)]
pub struct Ask {
    who: Who,
    pub directives: Directives,
}

#[derive(Debug, Clone, Default)]
enum Who {
    /// A virtual key's name.
    Key(String),
    /// The key the client presents (the secret, as governance reads it).
    Credential(Vec<u8>),
    Shared,
    #[default]
    Nobody,
}

impl Ask {
    /// `key:<virtual key>` | `client:<hash of the credential>` | `shared` | none (not cached).
    pub fn tenant(&self) -> Option<Arc<str>> {
        match &self.who {
            Who::Key(k) => Some(Arc::from(format!("key:{k}"))),
            Who::Credential(c) => Some(Arc::from(key::client_tenant(c))),
            Who::Shared => Some(Arc::from("shared")),
            Who::Nobody => None,
        }
    }
}

/// What the cache reads of its env, built by the pipeline (`pipeline::shard::Shard::cache_env`).
pub struct Env<'a> {
    pub fwd: crate::forward::Env<'a>,
    /// This shard's connection to the cache's Redis (`[cache] store = "redis"`).
    pub remote: Option<&'a std::rc::Rc<super::redis::Remote>>,
    /// The cache itself (`None`: off).
    pub cache: Option<&'a Cache>,
    /// The shard's live routing (the semantic mode routes its embedding requests).
    pub live: &'a LiveRouting,
}

/// [`ask`] for a request from `caller` (its key's name from `governance`).
pub fn ask_of(
    cache: &Cache,
    head: &RequestHead,
    conn: &ClientConn,
    governance: &crate::governance::Governance,
    caller: crate::governance::Caller,
) -> Ask {
    let name = caller
        .key()
        .and_then(|k| governance.key_name(k).map(|n| n.to_string()));
    ask(cache, head, &conn.buf, name.as_deref())
}

/// Read the directives and the tenant off `head`; `key_name`: the caller's virtual key.
pub fn ask(cache: &Cache, head: &RequestHead, buf: &[u8], key_name: Option<&str>) -> Ask {
    let directives = Directives::of(
        head.header(buf, &head.cache_control),
        head.header(buf, &head.x_ringgate_cache),
    );
    // The credential as governance reads it (one reader for every header and Gemini's `?key=`);
    // a request presenting two keys is not cached.
    let who = if let Some(k) = key_name {
        Who::Key(k.to_string())
    } else {
        with_presented(head, buf, |p| match p {
            Presented::Key(secret) => Who::Credential(secret.to_vec()),
            Presented::Ambiguous => Who::Nobody,
            Presented::Nothing if cache.settings.shared_namespace => Who::Shared,
            Presented::Nothing => Who::Nobody,
        })
    };
    Ask { who, directives }
}

/// What `lookup` decided.
pub enum Lookup {
    /// Not a cached request: go on as if there were no cache.
    Pass,
    /// Answered from the cache.
    Hit(Outcome),
    /// Go upstream; `store` the answer afterwards.
    Miss(Miss),
}

/// A miss waiting for its answer.
pub struct Miss {
    key: Key,
    tenant: Arc<str>,
    model: Arc<str>,
    dialect: Dialect,
    ttl: std::time::Duration,
    semantic: Option<(Key, std::sync::Arc<[f32]>)>,
    store: bool,
}

fn header(conn: &mut ClientConn, value: &str) {
    conn.resp_headers.extend_from_slice(b"x-ringgate-cache: ");
    conn.resp_headers.extend_from_slice(value.as_bytes());
    conn.resp_headers.extend_from_slice(b"\r\n");
}

/// Look `call` (body `body`, cache directives and tenant `ask`) up. A hit is written to the
/// client here.
pub async fn lookup(
    conn: &mut ClientConn,
    env: &Env<'_>,
    call: &Call<'_>,
    body: &[u8],
    ask: &Ask,
) -> Lookup {
    let (dialect, op, route, fields) = (call.dialect, call.op, call.route, call.fields);
    let permit = call.permit;
    let Some(cache) = env.cache else {
        return Lookup::Pass;
    };
    if op != Op::Generate || dialect == Dialect::Gemini {
        return Lookup::Pass;
    }
    let Some(policy) = cache.policy(&route.name) else {
        return Lookup::Pass;
    };
    let skip = |conn: &mut ClientConn, why: Skip| {
        cache.stats.skip(why);
        header(conn, "skip");
        Lookup::Pass
    };
    if ask.directives.no_store {
        return skip(conn, Skip::NoStore);
    }
    let Some(tenant) = ask.tenant() else {
        return skip(conn, Skip::NoTenant);
    };
    let Some(canon) = key::canonical(body) else {
        return skip(conn, Skip::Uncacheable);
    };
    if fields.model.is_empty() || several_choices(body) {
        return skip(conn, Skip::Uncacheable);
    }
    let key = key::exact_key(&tenant, &fields.model, dialect, &canon);
    drop(canon);
    let look = !ask.directives.no_lookup;
    if look {
        let t0 = Instant::now();
        let found = match &env.remote {
            Some(r) => r
                .get(&key, cache.settings.max_entry_bytes)
                .await
                .map(|(body, usage)| Entry {
                    body: body.into(),
                    tenant: tenant.clone(),
                    model: Arc::from(fields.model.as_str()),
                    usage,
                    expires: t0,
                    owner: env.fwd.id,
                    semantic: None,
                }),
            None => cache
                .with_store(|s, freed| s.get(&key, t0, freed))
                .flatten(),
        };
        cache.stats.lookup(t0.elapsed());
        if let Some(e) = found {
            if let Some(o) = answer_with(conn, env, call, &e, "hit").await {
                crate::observe::metrics::add_atomic(&cache.stats.hits, 1);
                return Lookup::Hit(o);
            }
        }
    }
    let mut vector = None;
    if policy.mode == Mode::Semantic {
        if let Some(q) = semantic::Query::of(cache, dialect, body, &tenant, &fields.model) {
            match semantic::embed(cache, &env.fwd, env.live, conn, permit, &policy, &q.text).await {
                Some(v) => {
                    if look {
                        let now = Instant::now();
                        let best = cache
                            .with_store(|s, freed| {
                                let (k, score) = s.nearest(&q.group, &v)?;
                                Some((s.get(&k, now, freed)?, score))
                            })
                            .flatten();
                        if let Some((e, score)) = best.filter(|(_, s)| *s >= policy.threshold) {
                            let label = format!("semantic-hit ({score:.3})");
                            if let Some(o) = answer_with(conn, env, call, &e, &label).await {
                                crate::observe::metrics::add_atomic(&cache.stats.semantic_hits, 1);
                                return Lookup::Hit(o);
                            }
                        }
                    }
                    vector = Some((q.group, std::sync::Arc::from(v)));
                }
                None => {
                    crate::observe::metrics::add_atomic(&cache.stats.embedding_failures, 1);
                }
            }
        }
    }
    crate::observe::metrics::add_atomic(&cache.stats.misses, 1);
    header(conn, "miss");
    // The recording of the answer is request memory: charged to the permit, or not kept.
    let cap = (cache.settings.max_entry_bytes as usize).saturating_mul(4);
    let store = permit.grow(cap as u64).is_ok();
    if store {
        conn.capture = Some(Tee::new(cap));
    }
    Lookup::Miss(Miss {
        key,
        tenant,
        model: Arc::from(fields.model.as_str()),
        dialect,
        ttl: policy.ttl,
        semantic: vector,
        store,
    })
}

/// `n` > 1 answers several choices: not cached.
fn several_choices(body: &[u8]) -> bool {
    sonic_rs::get(body, &["n"])
        .ok()
        .and_then(|v| sonic_rs::JsonValueTrait::as_u64(&v))
        .is_some_and(|n| n > 1)
}

/// Write entry `e` to the client through the answer stage's sink (`label` in
/// `x-ringgate-cache`); `None` when it cannot be replayed in this mode (then the request goes
/// upstream).
async fn answer_with(
    conn: &mut ClientConn,
    env: &Env<'_>,
    call: &Call<'_>,
    e: &Entry,
    label: &str,
) -> Option<Outcome> {
    let (route, dialect, fields, keep_alive) =
        (call.route, call.dialect, call.fields, call.keep_alive);
    let chat_usage = matches!(fields.usage_option, UsageOption::Asked);
    let (body, ct) =
        answer::replay(&e.body, dialect, fields.stream, &fields.model, chat_usage).ok()?;
    header(conn, label);
    let (i, o) = (
        e.usage.prompt_tokens.unwrap_or(0),
        e.usage.completion_tokens.unwrap_or(0),
    );
    let price = route.deployments.first().map_or(route.price, |d| d.price);
    let pico = i
        .saturating_mul(price.input_pico)
        .saturating_add(o.saturating_mul(price.output_pico));
    if let Some(c) = env.cache {
        c.stats.saved(i, o, pico);
    }
    let w = Whole {
        status: 200,
        content_type: ct,
        extra: b"",
        body: &body,
    };
    Some(Sink::of(&env.fwd, keep_alive).whole(conn, w).await)
}

/// The answer to `miss` went out with `status`: keep it when complete, within the entry size,
/// the store's bytes and this shard's budget.
pub fn store(conn: &mut ClientConn, env: &Env<'_>, miss: Miss, status: u16) {
    let tee = conn.capture.take();
    let Some(cache) = env.cache.filter(|_| miss.store) else {
        return;
    };
    let refused = || {
        crate::observe::metrics::add_atomic(&cache.stats.refused, 1);
    };
    let Some(tee) = tee.filter(|t| status == 200 && !t.over) else {
        return refused();
    };
    let stored = match answer::record(
        &tee.buf,
        miss.dialect,
        &miss.model,
        cache.settings.allow_length,
    ) {
        Ok(s) if s.body.len() as u64 <= cache.settings.max_entry_bytes => s,
        _ => return refused(),
    };
    drop(tee);
    if let Some(r) = &env.remote {
        // the exact layer lives in Redis; only semantic entries (vectors) stay here too
        if r.set(&miss.key, &stored.body, stored.usage, miss.ttl) {
            crate::observe::metrics::add_atomic(&cache.stats.stores, 1);
        } else {
            refused();
        }
        if miss.semantic.is_none() {
            return;
        }
    }
    let entry = Entry {
        body: stored.body.into(),
        tenant: miss.tenant,
        model: miss.model,
        usage: stored.usage,
        expires: Instant::now() + miss.ttl,
        owner: env.fwd.id,
        semantic: miss.semantic,
    };
    let size = entry.size();
    let budget = env.fwd.admission.budget();
    // the cache only takes memory requests are not using: half the shard's budget stays free
    if !budget.try_hold(size, budget.capacity() / 2) {
        return refused();
    }
    let max = cache.settings.max_bytes;
    let key = miss.key;
    let inserted = cache
        .with_store(|s, freed| s.insert(key, entry, max, freed))
        .unwrap_or(false);
    if inserted {
        crate::observe::metrics::add_atomic(&cache.stats.stores, 1);
    } else {
        budget.release_hold(size);
        refused();
    }
}
