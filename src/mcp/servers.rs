//! The configured MCP servers as one generation of a shard's routing sees them: endpoint,
//! request target, the header lines each gets (its bearer and static headers, rendered once)
//! and its timeout. Built with the route table (`server::shard::routing`), so a reload swaps the list
//! for the next request while requests in flight finish on theirs.
//!
//! Owns: `Server`, `Servers` and reading `bearer_env` (once per build: the value never leaves
//! this struct but as the header line to that server). Must not: do IO.

use std::sync::Arc;
use std::time::Duration;

use crate::config::endpoint::Endpoint;
use crate::config::Config;

/// One `[[mcp_server]]`, ready to be spoken to.
#[derive(Debug)]
pub struct Server {
    pub name: Box<str>,
    /// The configured URL: what an upstream session is bound to (a reload that moves a server
    /// starts new sessions with it).
    pub url: Box<str>,
    pub endpoint: Endpoint,
    /// The request target (`/mcp`).
    pub target: String,
    /// `authorization: Bearer …` and the static headers, each line ending in CRLF.
    pub lines: Vec<u8>,
    pub timeout: Duration,
}

/// Every configured server of one config generation.
#[derive(Debug, Default)]
pub struct Servers {
    pub list: Vec<Arc<Server>>,
    /// `[mcp] max_response_bytes`.
    pub max_response: usize,
}

impl Servers {
    /// The servers of `cfg` (a validated config: an entry that does not parse is left out).
    pub fn build(cfg: &Config) -> Servers {
        let mut list = Vec::with_capacity(cfg.mcp_servers.len());
        for s in &cfg.mcp_servers {
            let Ok(endpoint) = Endpoint::parse(s.url.get_ref()) else {
                continue;
            };
            let mut lines = Vec::new();
            if let Some(env) = &s.bearer_env {
                match std::env::var(env) {
                    Ok(v) if crate::http::target::header_value(&v).is_ok() => {
                        lines.extend_from_slice(b"authorization: Bearer ");
                        lines.extend_from_slice(v.as_bytes());
                        lines.extend_from_slice(b"\r\n");
                    }
                    _ => crate::observe::log::info(format_args!(
                        "mcp_server {:?}: bearer_env {env} is not set (or not a header value): the server gets no Authorization",
                        s.name.get_ref()
                    )),
                }
            }
            for (k, v) in &s.headers {
                lines.extend_from_slice(k.as_bytes());
                lines.extend_from_slice(b": ");
                lines.extend_from_slice(v.as_bytes());
                lines.extend_from_slice(b"\r\n");
            }
            let target = match endpoint.base_path.is_empty() {
                true => "/".to_string(),
                false => endpoint.base_path.clone(),
            };
            list.push(Arc::new(Server {
                name: s.name.get_ref().as_str().into(),
                url: s.url.get_ref().as_str().into(),
                endpoint,
                target,
                lines,
                timeout: Duration::from_millis(s.timeout_ms),
            }));
        }
        Servers {
            list,
            max_response: usize::try_from(cfg.mcp.max_response_bytes).unwrap_or(usize::MAX),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Server>> {
        self.list.iter().find(|s| &*s.name == name)
    }
}
