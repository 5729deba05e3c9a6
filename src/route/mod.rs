//! The route table: client model name → a `Route`: the model's deployments (provider +
//! upstream model + weight) and its routing `Policy` (balancing, fallbacks, attempts, breaker,
//! retry reasons, deadline). Built per shard from the config at start-up and again on every
//! reload (`build_after`: immutable once built; the shard swaps whole tables, `shard::routing`).
//!
//! Indices are stable across reloads: a model or provider name keeps its route / provider index
//! for the life of the shard, a removed one stays as a retired entry (no longer resolved or
//! listed) and a new one gets the next free index, so per-index state and metric series
//! (`metrics::requests`, key counters) never change label under a reload.
//!
//! Owns: resolved providers (endpoint, auth header lines per API key, read from env vars once),
//! model lookup (exact names first, then `prefix*` patterns, longest prefix wins) and fallback
//! resolution to route indices; the compiled guardrails and who uses them (`guardrail::Guards`).
//! Must not: do IO per request, hold runtime state (breakers, balancers, key cooldowns live in
//! `forward`), or hold secrets anywhere but the prebuilt header lines.

pub mod models;

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use crate::config::endpoint::Endpoint;
use crate::config::policy::{Fallback, Policy};
use crate::config::price::Price;
use crate::config::provider::Profile;
use crate::config::provider::ProviderKind;
use crate::config::Config;
use crate::http::target;

/// One API key of a provider, as prebuilt header lines.
#[derive(Debug)]
pub struct ApiKey {
    /// The env var it came from (`None`: the provider has no usable key).
    pub env: Option<String>,
    pub weight: u32,
    /// Raw auth header lines for this key, e.g. `authorization: Bearer …\r\n`.
    pub auth_headers: Vec<u8>,
}

#[derive(Debug)]
pub struct Provider {
    pub name: String,
    /// Position in `RouteTable::providers` (indexes per-provider runtime state).
    pub index: usize,
    pub kind: ProviderKind,
    pub endpoint: Option<Endpoint>,
    /// Raw auth header lines of the first key (`keys[0]`), e.g. `authorization: Bearer …\r\n`.
    pub auth_headers: Vec<u8>,
    /// Every usable key (at least one entry; a keyless provider has one with `env: None`).
    pub keys: Vec<ApiKey>,
    pub mock_profile: Profile,
    pub api_version: Option<String>,
    /// Do not send `stream_options` (engines that reject it).
    pub no_stream_options: bool,
    /// The engine's load signal (`engine = …` and a started `engine::Engines`), shared by
    /// every shard.
    pub engine: Option<std::sync::Arc<crate::engine::signal::EngineCell>>,
    /// `kind = "bedrock"` (SigV4) and `"vertex"` (OAuth): the per-request authorisation,
    /// shared by every shard (`upstream::cloud`); `None` for other kinds and Bedrock API keys.
    pub cloud: Option<crate::upstream::auth::Auth>,
    /// `kind = "vertex"`: the configured publisher (else the model name decides).
    pub publisher: Option<crate::config::provider::Publisher>,
}

impl Provider {
    /// Base path of the endpoint ("" for the mock, which has none).
    pub fn base_path(&self) -> &str {
        self.endpoint.as_ref().map_or("", |e| e.base_path.as_str())
    }

    /// Auth header lines for key `key` (falls back to the first key).
    pub fn key_auth(&self, key: usize) -> &[u8] {
        self.keys
            .get(key)
            .map_or(&self.auth_headers[..], |k| &k.auth_headers[..])
    }
}

/// One deployment of a model.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub provider: Rc<Provider>,
    /// `None`: send the requested model name unchanged (no splice needed).
    pub upstream_model: Option<String>,
    pub weight: u32,
    /// `provider/upstream_model` (or `provider/<model name>`): the metrics label.
    pub label: String,
    /// What its tokens cost (its own `price_*_per_mtok`, else the model's; free without).
    pub price: Price,
}

impl Deployment {
    /// The model name to send upstream when the request asked for `requested`.
    pub fn upstream_model_or<'a>(&'a self, requested: &'a str) -> &'a str {
        self.upstream_model.as_deref().unwrap_or(requested)
    }
}

#[derive(Debug, Clone)]
pub struct Route {
    /// The first deployment's provider (today's single-deployment request path).
    pub provider: Rc<Provider>,
    /// The first deployment's upstream model. `None`: send the client's model name unchanged.
    pub upstream_model: Option<String>,
    /// The model's name as configured (`gpt-*` for a pattern).
    pub name: String,
    /// Position in `RouteTable::routes`.
    pub index: usize,
    /// At least one.
    pub deployments: Vec<Deployment>,
    pub policy: Policy,
    /// Every model this one falls back to, transitively: breadth-first from
    /// `policy.fallbacks`, each model once, never this one.
    pub chain: Vec<Fallback>,
    /// The model's own price (answers the gateway gives itself; deployments carry theirs).
    pub price: Price,
    /// Removed by a reload: kept so its index keeps its name; never resolved or listed.
    pub retired: bool,
}

#[derive(Debug, Default)]
pub struct RouteTable {
    routes: Vec<Route>,
    providers: Vec<Rc<Provider>>,
    exact: HashMap<String, usize>,
    prefixes: Vec<(String, usize)>,
    models: crate::route::models::Catalog,
    /// The compiled `[[guardrail]]`s and which models and keys use them (rebuilt with the
    /// table, so a reload changes them).
    pub guards: crate::guardrail::Guards,
    /// Where requests that name no model (`/v1/files`, `/v1/batches`) go: an index into
    /// `providers` (`config::surface::files_provider`; `None`: none, or several to choose from).
    pub files_provider: Option<usize>,
}

impl RouteTable {
    pub fn build(cfg: &Config) -> RouteTable {
        RouteTable::build_after(cfg, None)
    }

    /// The table for `cfg` with the indices of `prev` (the table it replaces): names that stay
    /// keep their index, removed ones stay retired, new ones are appended (see the module doc).
    pub fn build_after(cfg: &Config, prev: Option<&RouteTable>) -> RouteTable {
        RouteTable::build_with(cfg, None, prev)
    }

    /// [`RouteTable::build_after`], with the providers' engine load cells from `engines`.
    pub fn build_with(
        cfg: &Config,
        engines: Option<&crate::engine::Engines>,
        prev: Option<&RouteTable>,
    ) -> RouteTable {
        let mut table = RouteTable::default();
        let mut by_name: HashMap<&str, Rc<Provider>> = HashMap::new();
        let prev_providers = prev.map_or(&[][..], |p| &p.providers[..]);
        let mut providers: Vec<Option<Rc<Provider>>> = vec![None; prev_providers.len()];
        for p in &cfg.providers {
            let name = p.name.get_ref().as_str();
            let index = match prev_providers.iter().position(|o| o.name == name) {
                Some(i) if providers[i].is_none() => i,
                _ => {
                    providers.push(None);
                    providers.len() - 1
                }
            };
            let mut prov = build_provider(p, index);
            prov.engine = engines.and_then(|e| e.cell(p.name.get_ref()));
            let prov = Rc::new(prov);
            providers[index] = Some(prov.clone());
            by_name.entry(name).or_insert(prov);
        }
        table.providers = providers
            .into_iter()
            .enumerate()
            .map(|(i, p)| p.unwrap_or_else(|| prev_providers[i].clone()))
            .collect();
        let prev_routes = prev.map_or(&[][..], |p| &p.routes[..]);
        let mut slots: Vec<Option<Route>> = vec![None; prev_routes.len()];
        // config model index → route index (models without a known provider are skipped)
        let mut route_of = vec![None; cfg.models.len()];
        for (ci, m) in cfg.models.iter().enumerate() {
            let name = m.name.get_ref();
            let deployments: Vec<Deployment> = m
                .deployment_refs()
                .into_iter()
                .filter_map(|d| {
                    let provider = by_name.get(d.provider.get_ref().as_str())?.clone();
                    let upstream_model = d.upstream_model.filter(|u| u != name).map(String::from);
                    let label = format!("{}/{}", provider.name, d.upstream_model.unwrap_or(name));
                    let (pi, po) = d.price_per_mtok;
                    Some(Deployment {
                        provider,
                        upstream_model,
                        weight: d.weight,
                        label,
                        price: Price::per_mtok(pi, po).unwrap_or_default(),
                    })
                })
                .collect();
            let Some(first) = deployments.first() else {
                continue;
            };
            let index = match prev_routes.iter().position(|r| &r.name == name) {
                Some(i) if slots[i].is_none() => i,
                _ => {
                    slots.push(None);
                    slots.len() - 1
                }
            };
            route_of[ci] = Some(index);
            slots[index] = Some(Route {
                provider: first.provider.clone(),
                upstream_model: first.upstream_model.clone(),
                name: name.clone(),
                index,
                deployments,
                policy: cfg.policy(m),
                chain: Vec::new(),
                price: Price::per_mtok(m.price_input_per_mtok, m.price_output_per_mtok)
                    .unwrap_or_default(),
                retired: false,
            });
            match name.strip_suffix('*') {
                Some(prefix) => table.prefixes.push((prefix.to_string(), index)),
                None => {
                    table.exact.insert(name.clone(), index);
                }
            }
        }
        // retired: a removed model keeps its slot (and a shell of its route) under its name
        table.routes = slots
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.unwrap_or_else(|| Route {
                    retired: true,
                    chain: Vec::new(),
                    ..prev_routes[i].clone()
                })
            })
            .collect();
        for r in table.routes.iter_mut().filter(|r| r.retired) {
            r.policy.fallbacks.clear();
        }
        for (ci, m) in cfg.models.iter().enumerate() {
            let Some(ri) = route_of[ci] else { continue };
            table.routes[ri].policy.fallbacks = m
                .fallbacks
                .iter()
                .filter_map(|f| {
                    let route = cfg.find_model(f.get_ref()).and_then(|c| route_of[c])?;
                    Some(Fallback {
                        name: f.get_ref().clone(),
                        route,
                    })
                })
                .filter(|f| f.route != ri)
                .collect();
        }
        for ri in 0..table.routes.len() {
            table.routes[ri].chain = table.chain_of(ri);
        }
        table.files_provider = crate::config::surface::files_provider(cfg)
            .and_then(|name| table.providers.iter().position(|p| p.name == name));
        table.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        table.models = crate::route::models::Catalog::build(&table.routes);
        table.guards = crate::guardrail::Guards::build(
            &cfg.guardrails,
            cfg.models
                .iter()
                .map(|m| (m.name.get_ref().as_str(), &m.guardrails[..])),
            cfg.keys
                .iter()
                .map(|k| (k.name.get_ref().as_str(), &k.guardrails[..])),
        );
        table
    }

    fn chain_of(&self, start: usize) -> Vec<Fallback> {
        let mut out: Vec<Fallback> = Vec::new();
        let mut queue = VecDeque::from([start]);
        while let Some(r) = queue.pop_front() {
            for f in &self.routes[r].policy.fallbacks {
                if f.route != start && !out.iter().any(|o| o.route == f.route) {
                    out.push(f.clone());
                    queue.push_back(f.route);
                }
            }
        }
        out
    }

    pub fn resolve(&self, model: &str) -> Option<&Route> {
        self.resolve_index(model).and_then(|i| self.routes.get(i))
    }

    /// Route index for a model name: exact first, then the longest matching `prefix*`.
    pub fn resolve_index(&self, model: &str) -> Option<usize> {
        self.exact.get(model).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| model.starts_with(p.as_str()))
                .map(|(_, r)| *r)
        })
    }

    pub fn route(&self, index: usize) -> Option<&Route> {
        self.routes.get(index)
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    pub fn providers(&self) -> &[Rc<Provider>] {
        &self.providers
    }

    /// The `GET /v1/models` body in OpenAI's shape (exact model names only; patterns cannot
    /// be listed).
    pub fn models_body(&self) -> &[u8] {
        self.models.list(crate::route::models::Shape::OpenAi)
    }

    /// The model lists in every SDK's shape (`models`).
    pub fn catalog(&self) -> &crate::route::models::Catalog {
        &self.models
    }
}

fn build_provider(p: &crate::config::ProviderConfig, index: usize) -> Provider {
    let kind = *p.kind.get_ref();
    let mut refs = p.key_refs();
    if kind == ProviderKind::Bedrock && refs.is_empty() {
        // the AWS SDKs' Bedrock API key variable, used when set
        refs.push((crate::upstream::auth::BEDROCK_KEY_ENV, 1));
    }
    let mut keys: Vec<ApiKey> = refs
        .into_iter()
        .filter_map(|(env, weight)| {
            let key = api_key(env)?;
            Some(ApiKey {
                env: Some(env.to_string()),
                weight,
                auth_headers: auth_headers(kind, Some(&key)),
            })
        })
        .collect();
    if keys.is_empty() {
        keys.push(ApiKey {
            env: None,
            weight: 1,
            auth_headers: auth_headers(kind, None),
        });
    }
    let keyed = keys.iter().any(|k| k.env.is_some());
    let cloud = crate::upstream::auth::Auth::for_provider(p, keyed);
    Provider {
        name: p.name.get_ref().clone(),
        index,
        kind,
        endpoint: match crate::config::cloud::base_url(p) {
            Some(u) => Endpoint::parse(&u).ok(),
            None => p
                .base_url
                .as_ref()
                .and_then(|u| Endpoint::parse(u.get_ref()).ok()),
        },
        auth_headers: keys[0].auth_headers.clone(),
        keys,
        mock_profile: p
            .profile
            .as_ref()
            .and_then(|s| Profile::parse(s.get_ref()))
            .unwrap_or(Profile::Instant),
        api_version: p.api_version.as_ref().map(|v| v.get_ref().clone()),
        no_stream_options: p.quirks.iter().any(|q| q == "no_stream_options"),
        engine: None,
        cloud,
        publisher: p.publisher,
    }
}

/// The API key in env var `env`, if set and usable as a header value (`upstream::target`): a
/// key with CR, LF, NUL or other controls would end the header line, so it is dropped with a
/// log line (`ringgate check` warns about it too).
fn api_key(env: &str) -> Option<String> {
    let key = std::env::var(env).ok()?;
    match target::header_value(&key) {
        Ok(()) => Some(key),
        Err(why) => {
            crate::observe::log::info(format_args!(
                "env var {env} cannot be sent as an API key header: it {why}; ignoring it"
            ));
            None
        }
    }
}

/// The header lines that carry `key` to a provider of `kind` (and Anthropic's version line).
pub fn auth_headers(kind: ProviderKind, key: Option<&str>) -> Vec<u8> {
    let mut h = Vec::new();
    if kind == ProviderKind::Anthropic {
        // first line: a client's own `anthropic-version` replaces it (`upstream::headers`)
        h.extend_from_slice(b"anthropic-version: ");
        h.extend_from_slice(crate::upstream::headers::DEFAULT_ANTHROPIC_VERSION.as_bytes());
        h.extend_from_slice(b"\r\n");
    }
    let Some(key) = key else { return h };
    let (name, prefix) = match kind {
        ProviderKind::OpenAi | ProviderKind::OpenAiCompatible => ("authorization", "Bearer "),
        ProviderKind::Azure => ("api-key", ""),
        ProviderKind::Anthropic => ("x-api-key", ""),
        ProviderKind::Gemini => ("x-goog-api-key", ""),
        // a Bedrock API key (else SigV4, `upstream::bedrock`); Vertex: OAuth tokens only
        ProviderKind::Bedrock => ("authorization", "Bearer "),
        ProviderKind::Mock | ProviderKind::Vertex => return h,
    };
    h.extend_from_slice(name.as_bytes());
    h.extend_from_slice(b": ");
    h.extend_from_slice(prefix.as_bytes());
    h.extend_from_slice(key.as_bytes());
    h.extend_from_slice(b"\r\n");
    h
}

impl crate::observe::metrics::requests::Names for RouteTable {
    fn model(&self, route: u32) -> Option<&str> {
        self.route(route as usize).map(|r| &*r.name)
    }

    fn provider(&self, provider: u32) -> Option<&str> {
        self.providers().get(provider as usize).map(|p| &*p.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_then_longest_prefix() {
        let cfg = Config::parse(
            "[[provider]]\nname=\"a\"\nkind=\"openai\"\nbase_url=\"http://h/v1\"\n\
             [[provider]]\nname=\"b\"\nkind=\"mock\"\n\
             [[model]]\nname=\"gpt-*\"\nprovider=\"a\"\n\
             [[model]]\nname=\"gpt-4o-*\"\nprovider=\"b\"\n\
             [[model]]\nname=\"gpt-x\"\nprovider=\"b\"\nupstream_model=\"real\"\n\
             [[model]]\nname=\"same\"\nprovider=\"a\"\nupstream_model=\"same\"\n",
        )
        .unwrap();
        let t = RouteTable::build(&cfg);
        assert_eq!(t.resolve("gpt-3").unwrap().provider.name, "a");
        assert_eq!(t.resolve("gpt-4o-mini").unwrap().provider.name, "b");
        assert_eq!(
            t.resolve("gpt-x").unwrap().upstream_model.as_deref(),
            Some("real")
        );
        assert_eq!(t.resolve("same").unwrap().upstream_model, None);
        assert!(t.resolve("claude").is_none());
        let v: serde_json::Value = serde_json::from_slice(t.models_body()).unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn deployments_policy_and_fallbacks_resolve() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/routing.toml");
        let cfg = Config::load(path).unwrap();
        let t = RouteTable::build(&cfg);
        let r = t.resolve("gpt-4o-mini").unwrap();
        // today's single-deployment path sees the first deployment
        assert_eq!(r.provider.name, "a");
        assert_eq!(
            r.upstream_model, None,
            "same as the client's name: no splice"
        );
        let labels: Vec<(&str, u32)> = r
            .deployments
            .iter()
            .map(|d| (d.label.as_str(), d.weight))
            .collect();
        assert_eq!(labels, [("a/gpt-4o-mini", 3), ("a2/gpt-4o-mini", 1)]);
        assert_eq!(r.policy.max_attempts, 3);
        let haiku = t.resolve_index("claude-haiku").unwrap();
        assert_eq!(
            r.policy.fallbacks,
            [Fallback {
                name: "claude-haiku".into(),
                route: haiku
            }]
        );
        assert_eq!(r.chain, r.policy.fallbacks);
        let h = t.route(haiku).unwrap();
        assert_eq!(h.provider.kind, ProviderKind::Anthropic);
        assert_eq!(
            h.deployments[0].upstream_model_or("claude-haiku"),
            "claude-3-5-haiku-latest"
        );
        assert!(h.chain.is_empty());
        assert_eq!(t.providers().len(), 3);
        assert!(t.providers().iter().enumerate().all(|(i, p)| p.index == i));
        let v: serde_json::Value = serde_json::from_slice(t.models_body()).unwrap();
        assert_eq!(v["data"][0]["owned_by"], "a");
    }

    #[test]
    fn weighted_keys_become_header_lines() {
        std::env::set_var("RINGGATE_ROUTE_TEST_K1", "one");
        std::env::set_var("RINGGATE_ROUTE_TEST_K2", "two");
        let cfg = Config::parse(
            "[[provider]]\nname=\"a\"\nkind=\"anthropic\"\nbase_url=\"http://h\"\n\
             api_key_env=\"RINGGATE_ROUTE_TEST_UNSET\"\n\
             api_keys=[{env=\"RINGGATE_ROUTE_TEST_K1\",weight=3},{env=\"RINGGATE_ROUTE_TEST_K2\"}]\n\
             [[provider]]\nname=\"b\"\nkind=\"openai\"\nbase_url=\"http://h/v1\"\n",
        )
        .unwrap();
        let t = RouteTable::build(&cfg);
        let a = &t.providers()[0];
        let keys: Vec<(Option<&str>, u32)> = a
            .keys
            .iter()
            .map(|k| (k.env.as_deref(), k.weight))
            .collect();
        assert_eq!(
            keys,
            [
                (Some("RINGGATE_ROUTE_TEST_K1"), 3),
                (Some("RINGGATE_ROUTE_TEST_K2"), 1)
            ]
        );
        assert_eq!(
            a.key_auth(1),
            b"anthropic-version: 2023-06-01\r\nx-api-key: two\r\n"
        );
        assert_eq!(a.auth_headers, a.key_auth(0));
        let b = &t.providers()[1];
        assert_eq!(b.keys.len(), 1);
        assert!(b.keys[0].env.is_none() && b.auth_headers.is_empty());
    }

    #[test]
    fn keys_that_would_break_a_header_line_are_dropped() {
        std::env::set_var("RINGGATE_TEST_KEY_CRLF", "sk-1\r\nX-Evil: 1");
        std::env::set_var("RINGGATE_TEST_KEY_CTL", "sk-1\x01");
        std::env::set_var("RINGGATE_TEST_KEY_OK", "sk-ok_1");
        assert_eq!(api_key("RINGGATE_TEST_KEY_CRLF"), None);
        assert_eq!(api_key("RINGGATE_TEST_KEY_CTL"), None);
        assert_eq!(api_key("RINGGATE_TEST_KEY_OK").as_deref(), Some("sk-ok_1"));
        assert_eq!(api_key("RINGGATE_TEST_KEY_UNSET_XYZ"), None);
    }

    #[test]
    fn auth_header_shapes() {
        assert_eq!(
            auth_headers(ProviderKind::OpenAi, Some("k")),
            b"authorization: Bearer k\r\n"
        );
        assert_eq!(
            auth_headers(ProviderKind::Azure, Some("k")),
            b"api-key: k\r\n"
        );
        assert!(auth_headers(ProviderKind::OpenAi, None).is_empty());
    }
}
