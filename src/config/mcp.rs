//! The MCP gateway's sections of the config: `[[mcp_server]]` (the tool servers behind `/mcp`)
//! and `[mcp]` (session bounds), with their validation. A key's tool allow-list
//! (`[[key]] mcp_tools`) is in `control::config::keys`.
//!
//! Owns: `McpServerConfig`, `McpConfig` and their rules (names `[a-z0-9_-]{1,32}`, unique;
//! `http://` or `https://` URLs; header names and values that may go on a request line; bounded
//! timeouts). Must not: read the bearer's value (that is `mcp::servers`, when a config is
//! built into a shard's routing) or touch the network.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::Config;

/// Per-request timeout to a server when `timeout_ms` is not set.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// One `[[mcp_server]]`: a Streamable HTTP MCP server whose tools appear as `<name>__<tool>`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// `[a-z0-9_-]`, 1–32 characters: the prefix of the server's tool names.
    pub name: Spanned<String>,
    /// The server's Streamable HTTP endpoint (`http://host:port/mcp`).
    pub url: Spanned<String>,
    /// The env var whose value the server gets as `Authorization: Bearer <value>`.
    pub bearer_env: Option<String>,
    /// Per request to this server, connect to last byte (default 30000).
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
    /// Static header lines sent to this server on every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_MS
}

/// `[mcp]`: bounds of the gateway's MCP sessions.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Open sessions, process-wide (an `initialize` over it: 503 + Retry-After).
    pub max_sessions: usize,
    /// A session unused this long is gone (its next request: 404, the client re-initialises).
    pub session_idle_ms: u64,
    /// Largest answer read from a server for one request (a bigger one is a JSON-RPC error).
    pub max_response_bytes: u64,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            max_sessions: 10_000,
            session_idle_ms: 30 * 60 * 1000,
            max_response_bytes: 8 << 20,
        }
    }
}

/// Whether `name` may name an MCP server.
pub fn server_name_ok(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
        // `__` separates the server from the tool: a name holding it could not be routed
        && !name.contains("__")
}

/// Header names a server's `headers` may not set (the gateway writes them itself).
const RESERVED: [&str; 9] = [
    "host",
    "content-length",
    "content-type",
    "accept",
    "connection",
    "transfer-encoding",
    "mcp-session-id",
    "mcp-protocol-version",
    "authorization",
];

/// Every problem with the `[mcp]` and `[[mcp_server]]` sections, with its span.
pub fn validate(cfg: &Config) -> Vec<(Range<usize>, String)> {
    let mut out = Vec::new();
    let m = &cfg.mcp;
    if m.max_sessions == 0 || m.max_sessions > 1_000_000 {
        out.push((0..0, "mcp.max_sessions must be 1..=1000000".into()));
    }
    if m.session_idle_ms < 1000 {
        out.push((0..0, "mcp.session_idle_ms must be at least 1000".into()));
    }
    if !(1024..=(256 << 20)).contains(&m.max_response_bytes) {
        out.push((
            0..0,
            "mcp.max_response_bytes must be 1024..=268435456".into(),
        ));
    }
    if cfg.mcp_servers.len() > 64 {
        out.push((0..0, "at most 64 [[mcp_server]] entries".into()));
    }
    for (i, s) in cfg.mcp_servers.iter().enumerate() {
        let name = s.name.get_ref();
        let who = format!("mcp_server {name:?}");
        if !server_name_ok(name) {
            out.push((
                s.name.span(),
                format!("{who}: name must be 1-32 characters of a-z, 0-9, _ and - (without `__`)"),
            ));
        }
        if cfg.mcp_servers[..i]
            .iter()
            .any(|o| o.name.get_ref() == name)
        {
            out.push((s.name.span(), format!("duplicate mcp_server name {name:?}")));
        }
        if let Err(e) = crate::config::endpoint::Endpoint::parse(s.url.get_ref()) {
            out.push((s.url.span(), format!("{who}: url: {e}")));
        }
        if !(1..=600_000).contains(&s.timeout_ms) {
            out.push((
                s.name.span(),
                format!("{who}: timeout_ms must be 1..=600000"),
            ));
        }
        if let Some(env) = &s.bearer_env {
            if env.is_empty() || env.contains('=') || env.contains('\0') {
                out.push((
                    s.name.span(),
                    format!("{who}: bearer_env is not an env var name"),
                ));
            }
        }
        for (k, v) in &s.headers {
            let token = !k.is_empty()
                && k.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c));
            if !token {
                out.push((
                    s.name.span(),
                    format!("{who}: header name {k:?} is not a token"),
                ));
            } else if RESERVED.iter().any(|r| r.eq_ignore_ascii_case(k)) {
                out.push((
                    s.name.span(),
                    format!("{who}: header {k:?} is set by the gateway (use bearer_env for Authorization)"),
                ));
            }
            if let Err(why) = crate::http::target::header_value(v) {
                out.push((s.name.span(), format!("{who}: header {k:?} value {why}")));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        assert!(server_name_ok("files"));
        assert!(server_name_ok("a-b_9"));
        assert!(!server_name_ok(""));
        assert!(!server_name_ok("Files"));
        assert!(!server_name_ok("a.c"));
        assert!(!server_name_ok("a__b"));
        assert!(!server_name_ok(&"a".repeat(33)));
    }
}
