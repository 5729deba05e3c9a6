//! The route table: client model name → provider + upstream model name. Built per shard at
//! start-up from the config (immutable afterwards; a reload will build a new one and swap it).
//!
//! Owns: resolved providers (endpoint, auth header lines read from env vars once) and model
//! lookup (exact names first, then `prefix*` patterns, longest prefix wins).
//! Must not: do IO per request or hold secrets anywhere but the prebuilt header lines.

use std::collections::HashMap;
use std::rc::Rc;

use crate::config::Config;
use crate::error::push_json_str;
use crate::mock::Profile;
use crate::provider::ProviderKind;
use crate::upstream::endpoint::Endpoint;

#[derive(Debug)]
pub struct Provider {
    pub name: String,
    pub kind: ProviderKind,
    pub endpoint: Option<Endpoint>,
    /// Raw auth header lines for this provider, e.g. `authorization: Bearer …\r\n`.
    pub auth_headers: Vec<u8>,
    pub mock_profile: Profile,
    pub api_version: Option<String>,
    /// Do not send `stream_options` (engines that reject it).
    pub no_stream_options: bool,
}

impl Provider {
    /// Base path of the endpoint ("" for the mock, which has none).
    pub fn base_path(&self) -> &str {
        self.endpoint.as_ref().map_or("", |e| e.base_path.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct Route {
    pub provider: Rc<Provider>,
    /// `None`: send the client's model name unchanged (no splice needed).
    pub upstream_model: Option<String>,
}

#[derive(Debug, Default)]
pub struct RouteTable {
    exact: HashMap<String, Route>,
    prefixes: Vec<(String, Route)>,
    models_body: Vec<u8>,
}

impl RouteTable {
    pub fn build(cfg: &Config) -> RouteTable {
        let providers: HashMap<&str, Rc<Provider>> = cfg
            .providers
            .iter()
            .map(|p| {
                let kind = *p.kind.get_ref();
                let key = p
                    .api_key_env
                    .as_ref()
                    .and_then(|e| std::env::var(e.get_ref()).ok())
                    .filter(|k| !k.is_empty() && !k.contains(['\r', '\n']));
                let prov = Provider {
                    name: p.name.get_ref().clone(),
                    kind,
                    endpoint: p
                        .base_url
                        .as_ref()
                        .and_then(|u| Endpoint::parse(u.get_ref()).ok()),
                    auth_headers: auth_headers(kind, key.as_deref()),
                    mock_profile: p
                        .profile
                        .as_ref()
                        .and_then(|s| Profile::parse(s.get_ref()))
                        .unwrap_or(Profile::Instant),
                    api_version: p.api_version.clone(),
                    no_stream_options: p.quirks.iter().any(|q| q == "no_stream_options"),
                };
                (p.name.get_ref().as_str(), Rc::new(prov))
            })
            .collect();
        let mut table = RouteTable::default();
        for m in &cfg.models {
            let Some(provider) = providers.get(m.provider.get_ref().as_str()) else {
                continue;
            };
            let name = m.name.get_ref();
            let upstream_model = m.upstream_model.clone().filter(|u| u != name);
            let route = Route {
                provider: provider.clone(),
                upstream_model,
            };
            match name.strip_suffix('*') {
                Some(prefix) => table.prefixes.push((prefix.to_string(), route)),
                None => {
                    table.exact.insert(name.clone(), route);
                }
            }
        }
        table.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        table.models_body = models_body(cfg);
        table
    }

    pub fn resolve(&self, model: &str) -> Option<&Route> {
        self.exact.get(model).or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| model.starts_with(p.as_str()))
                .map(|(_, r)| r)
        })
    }

    /// The `GET /v1/models` body (exact model names only; patterns cannot be listed).
    pub fn models_body(&self) -> &[u8] {
        &self.models_body
    }
}

fn auth_headers(kind: ProviderKind, key: Option<&str>) -> Vec<u8> {
    let mut h = Vec::new();
    if kind == ProviderKind::Anthropic {
        h.extend_from_slice(b"anthropic-version: 2023-06-01\r\n");
    }
    let Some(key) = key else { return h };
    let (name, prefix) = match kind {
        ProviderKind::OpenAi | ProviderKind::OpenAiCompatible => ("authorization", "Bearer "),
        ProviderKind::Azure => ("api-key", ""),
        ProviderKind::Anthropic => ("x-api-key", ""),
        ProviderKind::Gemini => ("x-goog-api-key", ""),
        ProviderKind::Mock => return h,
    };
    h.extend_from_slice(name.as_bytes());
    h.extend_from_slice(b": ");
    h.extend_from_slice(prefix.as_bytes());
    h.extend_from_slice(key.as_bytes());
    h.extend_from_slice(b"\r\n");
    h
}

fn models_body(cfg: &Config) -> Vec<u8> {
    let mut out = b"{\"object\":\"list\",\"data\":[".to_vec();
    let mut first = true;
    for m in cfg
        .models
        .iter()
        .filter(|m| !m.name.get_ref().ends_with('*'))
    {
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(b"{\"id\":");
        push_json_str(&mut out, m.name.get_ref());
        out.extend_from_slice(b",\"object\":\"model\",\"created\":0,\"owned_by\":");
        push_json_str(&mut out, m.provider.get_ref());
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    out
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
