//! `[telemetry]`: OpenTelemetry trace export over OTLP/HTTP (see `telemetry`,
//! docs/telemetry.md). Off unless `otlp_endpoint` is set.
//!
//! ```toml
//! [telemetry]
//! otlp_endpoint = "http://127.0.0.1:4318"   # OTLP/HTTP; traces go to /v1/traces
//! service_name = "ringgate"
//! sample_ratio = 1.0                        # 0.0–1.0
//! capture_content = false
//! queue_spans = 4096                        # bounded; beyond it spans are dropped and counted
//! headers_env = { "x-honeycomb-team" = "HONEYCOMB_KEY" }
//! content_max_bytes = 4096                  # capture_content: each side truncated to this
//! ```
//!
//! Owns: `TelemetryConfig` and its validation. Must not: read environment variables or open
//! sockets (the exporter does, at start).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::ConfigError;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `http://host:port` (an optional path prefix is kept); spans go to `{this}/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Head sampling of requests without a caller's sampled flag, 0.0–1.0.
    pub sample_ratio: f64,
    /// Prompts and answers as `gen_ai.input.messages` / `gen_ai.output.messages`.
    pub capture_content: bool,
    /// Spans waiting for export, at most; more are dropped and counted.
    pub queue_spans: usize,
    /// Extra export headers: header name → the environment variable holding its value.
    pub headers_env: BTreeMap<String, String>,
    /// With `capture_content`: bytes kept of the request body and of the answer.
    pub content_max_bytes: usize,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: "ringgate".into(),
            sample_ratio: 1.0,
            capture_content: false,
            queue_spans: 4096,
            headers_env: BTreeMap::new(),
            content_max_bytes: 4096,
        }
    }
}

/// Most spans a queue may hold (each is a few hundred bytes, more with content).
pub const MAX_QUEUE_SPANS: usize = 1 << 20;
/// Most content bytes kept per side.
pub const MAX_CONTENT_BYTES: usize = 1 << 20;

impl TelemetryConfig {
    pub fn on(&self) -> bool {
        self.otlp_endpoint.is_some()
    }

    pub(super) fn validate(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut err = |m: String| {
            errors.push(ConfigError {
                line: None,
                message: format!("telemetry.{m}"),
            })
        };
        if let Some(e) = &self.otlp_endpoint {
            if let Err(why) = parse_endpoint(e) {
                err(format!("otlp_endpoint {e:?}: {why}"));
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            err(format!(
                "sample_ratio {}: expected 0.0 to 1.0",
                self.sample_ratio
            ));
        }
        if self.queue_spans == 0 || self.queue_spans > MAX_QUEUE_SPANS {
            err(format!(
                "queue_spans {}: expected 1 to {MAX_QUEUE_SPANS}",
                self.queue_spans
            ));
        }
        if self.content_max_bytes > MAX_CONTENT_BYTES {
            err(format!(
                "content_max_bytes {}: at most {MAX_CONTENT_BYTES}",
                self.content_max_bytes
            ));
        }
        if self.service_name.is_empty() || self.service_name.len() > 256 {
            err("service_name: 1 to 256 bytes".into());
        }
        for (h, v) in &self.headers_env {
            let token = |s: &str| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            };
            if !token(h) || !token(v) {
                err(format!(
                    "headers_env {h:?} = {v:?}: a header name and an environment variable name"
                ));
            }
        }
        errors
    }
}

/// An OTLP/HTTP endpoint: host, port, path prefix (no trailing slash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint {
    pub host: String,
    pub port: u16,
    pub prefix: String,
}

/// `http://host[:port][/prefix]`; `https` is refused (not built: put a local collector in front).
pub fn parse_endpoint(url: &str) -> Result<OtlpEndpoint, String> {
    let rest = match url.strip_prefix("http://") {
        Some(r) => r,
        None if url.starts_with("https://") => {
            return Err("https is not supported: point it at a local collector over http".into())
        }
        None => return Err("expected http://host:port".into()),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.contains('@') || path.contains(['?', '#', ' ']) {
        return Err("expected http://host:port[/path] without credentials or query".into());
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            (h, p.parse::<u16>().map_err(|_| "bad port".to_string())?)
        }
        _ => (authority, 80),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains([' ', '/']) {
        return Err("no host".into());
    }
    Ok(OtlpEndpoint {
        host: host.to_string(),
        port,
        prefix: path.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn contract_shape_parses() {
        let c = Config::parse(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\nservice_name = \"gw\"\n\
             sample_ratio = 0.5\ncapture_content = true\nqueue_spans = 16\n\
             headers_env = { \"x-honeycomb-team\" = \"HONEYCOMB_KEY\" }\n",
        )
        .unwrap();
        let t = &c.telemetry;
        assert!(t.on());
        assert_eq!(t.service_name, "gw");
        assert_eq!(t.sample_ratio, 0.5);
        assert!(t.capture_content);
        assert_eq!(t.queue_spans, 16);
        assert_eq!(t.headers_env["x-honeycomb-team"], "HONEYCOMB_KEY");
        assert!(!Config::parse("").unwrap().telemetry.on());
        for bad in [
            "sample_ratio = 1.5",
            "queue_spans = 0",
            "otlp_endpoint = \"https://x:4318\"",
            "otlp_endpoint = \"127.0.0.1:4318\"",
            "nope = 1",
        ] {
            assert!(
                Config::parse(&format!("[telemetry]\n{bad}\n")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn endpoints() {
        let e = parse_endpoint("http://collector:4318/otlp/").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("collector", 4318, "/otlp")
        );
        let e = parse_endpoint("http://[::1]:9").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 9));
        assert_eq!(parse_endpoint("http://h").unwrap().port, 80);
        assert!(parse_endpoint("http://u:p@h:1").is_err());
    }
}
