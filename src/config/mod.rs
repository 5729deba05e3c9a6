//! Configuration: the TOML file format, its documented defaults, validation with line numbers,
//! and the embedded default used when `ringgate` runs without a file.
//!
//! Owns: `Config` (the whole file, one field per section), `ConfigError`, `Config::embedded()`,
//! loading and parsing. Each section lives in its own file: `[server]` and `[admin]` in
//! `config::server`, `[upstream]` in `config::upstream`, `[[provider]]` in `config::provider`,
//! `[[model]]` in `config::model`, the routing sections (`[routing]`, deployments, fallbacks,
//! breakers, keys) in `config::routing`; all re-exported here.
//! Must not: open sockets, read secrets' values (only env-var *names* live here), or be consulted
//! on the hot path (shards build their own route tables from it at start-up).

pub mod endpoint;
pub mod model;
pub mod policy;
pub mod price;
pub mod provider;
pub mod redact;
pub mod server;
pub mod upstream;

use std::net::SocketAddr;

use serde::Deserialize;

use crate::admit::AdmissionConfig;

pub mod admin_token;
pub mod cache;
pub mod cloud;
pub mod engines;
pub mod keys;
pub mod limits;
pub mod log;
pub mod mcp;
pub mod origin;
pub mod reload;
pub mod responses;
pub mod routing;
pub mod surface;
pub mod telemetry;
mod validate;
pub use cache::CacheConfig;
pub use keys::{AuthMode, KeyConfig};
pub use limits::LimitsConfig;
pub use log::{AccessLog, LogConfig};
pub use model::{LoadWeights, ModelConfig};
pub use provider::ProviderConfig;
pub use routing::{ApiKeyConfig, BreakerConfig, DeploymentConfig, DeploymentRef, RoutingConfig};
pub use server::{AdminConfig, ServerConfig, MAX_IDLE_SPIN_US};
pub use telemetry::TelemetryConfig;
pub use upstream::UpstreamConfig;

/// The whole file. Every field has a default; see docs/configuration.md.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub upstream: UpstreamConfig,
    /// Byte budget, admission mode and limits (see `admit::AdmissionConfig` for defaults).
    #[serde(default)]
    pub admission: AdmissionConfig,
    /// Defaults for every model's routing policy (see docs/routing.md).
    #[serde(default)]
    pub routing: RoutingConfig,
    #[serde(default, rename = "provider")]
    pub providers: Vec<ProviderConfig>,
    #[serde(default, rename = "model")]
    pub models: Vec<ModelConfig>,
    /// Virtual keys (see docs/keys-and-limits.md and `config::keys`).
    #[serde(default, rename = "key")]
    pub keys: Vec<KeyConfig>,
    /// Where per-key counters live: each process, or a shared Redis (`config::limits`).
    #[serde(default)]
    pub limits: LimitsConfig,
    /// `[fleet]`: what else a fleet shares through the limits store (`config::limits`).
    #[serde(default)]
    pub fleet: limits::FleetConfig,
    /// `[log]`: the access log (see `config::log`).
    #[serde(default)]
    pub log: LogConfig,
    /// `[responses]`: the Responses state store of translated routes (`config::responses`).
    #[serde(default)]
    pub responses: responses::ResponsesConfig,
    /// `[reload]`: what a reload may remove (`config::reload`).
    #[serde(default)]
    pub reload: reload::ReloadConfig,
    /// First 16 hex digits of the SHA-256 of the text this config was parsed from
    /// (`ringgate_config_info`).
    #[serde(skip)]
    pub hash: String,
    /// The file it was read from and the command line's overrides (a reload keeps both).
    #[serde(skip)]
    pub origin: origin::Origin,
    /// The admin listener (`/admin/*`, `/metrics`); off unless the section is present (see
    /// docs/admin-api.md).
    pub admin: Option<AdminConfig>,
    /// `[cache]`: the response cache (see `config::cache`, docs/cache.md).
    #[serde(default)]
    pub cache: CacheConfig,
    /// `[[guardrail]]`: PII and secret detectors (see `guardrail`, docs/guardrails.md).
    #[serde(default, rename = "guardrail")]
    pub guardrails: Vec<crate::guardrail::config::GuardrailConfig>,
    /// `[telemetry]`: OTLP trace export (see `config::telemetry`, docs/telemetry.md).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// `[[mcp_server]]`: the MCP servers federated behind `/mcp` (see `config::mcp`, docs/mcp.md).
    #[serde(default, rename = "mcp_server")]
    pub mcp_servers: Vec<mcp::McpServerConfig>,
    /// `[mcp]`: MCP session bounds.
    #[serde(default)]
    pub mcp: mcp::McpConfig,
}

/// First 16 hex digits of the SHA-256 of `text`.
pub fn text_hash(text: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// One problem in a config file, with the 1-based line it was found on when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub line: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "line {l}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

impl Config {
    /// Parse and validate. Returns every problem found, not just the first.
    pub fn parse(text: &str) -> Result<Config, Vec<ConfigError>> {
        match Config::parse_all(text) {
            (Some(cfg), errors) if errors.is_empty() => Ok(cfg),
            (_, errors) => Err(errors),
        }
    }

    /// Parse and validate, keeping the parsed config even when it does not validate (`check`
    /// also reports what `serve` would refuse about it). `None` when the text is not TOML or
    /// does not fit the shape (that problem is the only one: the parser stops there).
    pub fn parse_all(text: &str) -> (Option<Config>, Vec<ConfigError>) {
        let mut cfg: Config = match toml::from_str(text) {
            Ok(c) => c,
            Err(e) => {
                let problem = ConfigError {
                    line: e.span().map(|s| line_of(text, s.start)),
                    message: e.message().trim().to_string(),
                };
                return (None, vec![problem]);
            }
        };
        let mut errors = cfg.validate(text);
        errors.extend(cfg.log.validate(text));
        errors.extend(cfg.telemetry.validate());
        cfg.hash = text_hash(text);
        (Some(cfg), errors)
    }

    pub fn load(path: &str) -> Result<Config, Vec<ConfigError>> {
        Config::load_text(path).map(|(cfg, _)| cfg)
    }

    /// `load`, also returning the text it parsed (a reload's redacted view and diff).
    pub fn load_text(path: &str) -> Result<(Config, String), Vec<ConfigError>> {
        match Config::load_all(path) {
            (Some((cfg, text)), errors) if errors.is_empty() => Ok((cfg, text)),
            (_, errors) => Err(errors),
        }
    }

    /// `load_text` as `parse_all`: the config read from `path` even when it does not
    /// validate, and every problem.
    pub fn load_all(path: &str) -> (Option<(Config, String)>, Vec<ConfigError>) {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                let message = format!("cannot read {path}: {e}");
                return (
                    None,
                    vec![ConfigError {
                        line: None,
                        message,
                    }],
                );
            }
        };
        let (cfg, errors) = Config::parse_all(&text);
        let cfg = cfg.map(|mut cfg| {
            cfg.resolve_paths(std::path::Path::new(path).parent());
            cfg.origin.path = Some(path.into());
            cfg.origin.text = Some(text.as_str().into());
            (cfg, text)
        });
        (cfg, errors)
    }

    /// Relative `tls_cert` / `tls_key` paths name files next to the config file.
    fn resolve_paths(&mut self, dir: Option<&std::path::Path>) {
        let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) else {
            return;
        };
        for p in [&mut self.server.tls_cert, &mut self.server.tls_key]
            .into_iter()
            .flatten()
        {
            if std::path::Path::new(p.get_ref()).is_relative() {
                *p.get_mut() = dir.join(p.get_ref()).to_string_lossy().into_owned();
            }
        }
    }

    /// The built-in default: loopback, a model `mock` served in-process, and OpenAI/Anthropic
    /// model names routed to the real providers when their API-key env vars are set.
    pub fn embedded() -> Config {
        let mut text = String::from(
            "[server]\nlisten = \"127.0.0.1:8080\"\n\n\
             [[provider]]\nname = \"mock\"\nkind = \"mock\"\nprofile = \"instant\"\n\n\
             [[model]]\nname = \"mock\"\nprovider = \"mock\"\n",
        );
        if std::env::var_os("OPENAI_API_KEY").is_some() {
            text.push_str(
                "\n[[provider]]\nname = \"openai\"\nkind = \"openai\"\n\
                 base_url = \"https://api.openai.com/v1\"\napi_key_env = \"OPENAI_API_KEY\"\n",
            );
            for pat in [
                "gpt-*",
                "o1*",
                "o3*",
                "o4*",
                "chatgpt-*",
                "text-embedding-*",
            ] {
                text.push_str(&format!(
                    "\n[[model]]\nname = \"{pat}\"\nprovider = \"openai\"\n"
                ));
            }
        }
        // The embedded text is a constant shape; failing to parse it is a programming error
        // caught by the `embedded_parses` test, so fall back to a bare config rather than panic.
        Config::parse(&text).unwrap_or_else(|_| Config::bare())
    }

    fn bare() -> Config {
        Config {
            server: ServerConfig::default(),
            upstream: UpstreamConfig::default(),
            admission: AdmissionConfig::default(),
            routing: RoutingConfig::default(),
            providers: Vec::new(),
            models: Vec::new(),
            keys: Vec::new(),
            limits: LimitsConfig::default(),
            fleet: Default::default(),
            log: LogConfig::default(),
            responses: Default::default(),
            reload: Default::default(),
            hash: String::new(),
            origin: Default::default(),
            admin: None,
            cache: CacheConfig::default(),
            guardrails: Vec::new(),
            telemetry: TelemetryConfig::default(),
            mcp_servers: Vec::new(),
            mcp: Default::default(),
        }
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.server
            .listen
            .get_ref()
            .parse::<SocketAddr>()
            .map_err(|e| format!("listen {:?}: {e}", self.server.listen.get_ref()))
    }

    /// `server.tls_listen` parsed, when set.
    pub fn tls_listen_addr(&self) -> Result<Option<SocketAddr>, String> {
        let Some(l) = &self.server.tls_listen else {
            return Ok(None);
        };
        l.get_ref()
            .parse::<SocketAddr>()
            .map(Some)
            .map_err(|e| format!("tls_listen {:?}: {e}", l.get_ref()))
    }

    /// The admin listener's address, when `[admin]` is present.
    pub fn admin_addr(&self) -> Option<Result<SocketAddr, String>> {
        let a = self.admin.as_ref()?;
        Some(
            a.listen
                .get_ref()
                .parse::<SocketAddr>()
                .map_err(|e| format!("admin listen {:?}: {e}", a.listen.get_ref())),
        )
    }

    /// Whether API requests need a virtual key (`server.auth`, else keys when any exist).
    pub fn auth_mode(&self) -> AuthMode {
        keys::auth_mode(self)
    }

    pub fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name.get_ref() == name)
    }
}

/// `url` fit to display or log (userinfo and `key=`/secret query parameters masked): the one
/// URL redactor, `reload::redact::url`.
pub use crate::config::redact::url as redact_url;

fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::provider::ProviderKind;

    const CONTRACT: &str = r#"
[server]
listen = "127.0.0.1:8080"
shards = 1

[[provider]]
name = "local"
kind = "openai"                    # later: anthropic, gemini, azure, openai-compatible
base_url = "http://127.0.0.1:9000/v1"   # as you would give it to that provider's own SDK
api_key_env = "LOCAL_API_KEY"      # optional; the env var that holds the key

[[model]]
name = "gpt-4o-mini"               # what clients send
provider = "local"
upstream_model = "gpt-4o-mini"     # optional, defaults to name
"#;

    #[test]
    fn contract_file_parses() {
        let c = Config::parse(CONTRACT).unwrap();
        assert_eq!(c.server.shards, Some(1));
        assert_eq!(c.providers[0].kind.get_ref(), &ProviderKind::OpenAi);
        assert_eq!(c.models[0].upstream_model.as_deref(), Some("gpt-4o-mini"));
    }

    #[test]
    fn idle_spin_is_off_by_default_and_bounded() {
        assert_eq!(Config::parse(CONTRACT).unwrap().server.idle_spin_us, 0);
        let on = CONTRACT.replace("shards = 1", "shards = 1\nidle_spin_us = 200");
        assert_eq!(Config::parse(&on).unwrap().server.idle_spin_us, 200);
        let over = CONTRACT.replace("shards = 1", "shards = 1\nidle_spin_us = 10001");
        let e = format!("{:?}", Config::parse(&over).unwrap_err());
        assert!(e.contains("idle_spin_us must be at most 10000"), "{e}");
    }

    #[test]
    fn embedded_parses() {
        let c = Config::embedded();
        assert!(c.models.iter().any(|m| m.name.get_ref() == "mock"));
    }

    #[test]
    fn errors_carry_line_numbers() {
        let text = "[[provider]]\nname = \"a\"\nkind = \"openai\"\nbase_url = \"ftp://x\"\n\n[[model]]\nname = \"m\"\nprovider = \"nope\"\n";
        let errs = Config::parse(text).unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(errs[0].line, Some(4));
        assert!(errs[0].message.contains("http://"));
        assert_eq!(errs[1].line, Some(8));
        assert!(errs[1].message.contains("unknown provider"));
    }

    #[test]
    fn syntax_and_unknown_fields_have_lines() {
        let errs = Config::parse("[server]\nlisten = \"x\"\nlisen = 3\n").unwrap_err();
        assert_eq!(errs[0].line, Some(3), "{errs:?}");
        let errs = Config::parse("[[provider]]\nname = \"a\"\nkind = \"bogus\"\n").unwrap_err();
        assert_eq!(errs[0].line, Some(3), "{errs:?}");
        let errs = Config::parse("[server]\nlisten = \"nope\"\n").unwrap_err();
        assert_eq!(errs[0].line, Some(2));
    }

    #[test]
    fn admission_contract_section_parses() {
        let c = Config::parse(
            "[admission]\nmemory_budget = \"64MiB\"\nmode = \"drop\"\nqueue_timeout_ms = 2000\nmax_in_flight = 10000\nmax_body = \"32MiB\"\n",
        )
        .unwrap();
        assert_eq!(c.admission.memory_budget, 64 << 20);
        assert_eq!(c.admission.max_body, 32 << 20);
        let errs = Config::parse("[admission]\nmode = \"sometimes\"\n").unwrap_err();
        assert_eq!(errs[0].line, Some(2), "{errs:?}");
    }

    #[test]
    fn cors_and_host_lists_are_checked() {
        let c = Config::parse(
            "[server]\ncors_allow_origins = [\"https://app.example\", \"http://localhost:3000\", \"*\"]\nallowed_hosts = [\"gw.internal\"]\n",
        )
        .unwrap();
        assert_eq!(c.server.cors_allow_origins.len(), 3);
        for bad in ["app.example", "https://app.example/", "https://a/b", ""] {
            let text = format!("[server]\ncors_allow_origins = [{bad:?}]\n");
            assert!(Config::parse(&text).is_err(), "{bad}");
        }
        assert!(Config::parse("[server]\nallowed_hosts = [\"gw:80\"]\n").is_err());
    }

    #[test]
    fn redacts_url_credentials() {
        let cases = [
            ("http://alice:s3cret@h:1/v1", "http://alice:***@h:1/v1"),
            ("https://tok@h/v1?a=b@c", "https://***@h/v1?a=b@c"),
            ("http://a:b:c@d@h", "http://a:***@h"),
            ("http://h/p@q", "http://h/p@q"),
            ("http://h:80", "http://h:80"),
            (
                "https://h/v1beta?key=AIzaS3cret&alt=sse",
                "https://h/v1beta?key=***&alt=sse",
            ),
            (
                "http://u:p@h/v1?api_key=x#f",
                "http://u:***@h/v1?api_key=***",
            ),
            ("http://h/v1?alt=sse", "http://h/v1?alt=sse"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
        let errs = Config::parse(
            "[[provider]]\nname=\"a\"\nkind=\"openai\"\nbase_url=\"http://alice:s3cret@h/v1\"\n",
        )
        .unwrap_err();
        assert!(!errs[0].message.contains("s3cret"), "{errs:?}");
        assert!(errs[0].message.contains("alice:***@h"), "{errs:?}");
        // a refused base_url with a `?key=` secret: the problem shows it masked
        let errs = Config::parse(
            "[[provider]]\nname=\"g\"\nkind=\"gemini\"\nbase_url=\"https://h/v1beta?key=AIzaS3cret\"\n",
        )
        .unwrap_err();
        assert!(!errs[0].message.contains("AIzaS3cret"), "{errs:?}");
        assert!(errs[0].message.contains("key=***"), "{errs:?}");
    }

    #[test]
    fn request_line_and_header_bytes_are_validated_with_lines() {
        let text = "[[provider]]\nname = \"az\"\nkind = \"azure\"\nbase_url = \"http://h/v1 HTTP/1.1\"\n\
                    api_version = \"1\\r\\nX: y\"\n\n\
                    [[model]]\nname = \"ok\"\nprovider = \"az\"\nupstream_model = \"../admin\"\n\n\
                    [[model]]\nname = \"has space\"\nprovider = \"az\"\n\n\
                    [[model]]\nname = \"/abs*\"\nprovider = \"az\"\n\n\
                    [[model]]\nname = \"org/*\"\nprovider = \"az\"\nupstream_model = \"dep.1:x@y+z\"\n\n\
                    [[model]]\nname = \"multi\"\ndeployments = [\n  { provider = \"az\", upstream_model = \"ok-1\" },\n  { provider = \"az\", upstream_model = \"a b\" },\n]\n";
        let errs = Config::parse(text).unwrap_err();
        let lines: Vec<_> = errs.iter().map(|e| e.line).collect();
        assert_eq!(
            lines,
            [Some(4), Some(5), Some(9), Some(13), Some(17), Some(29)],
            "{errs:?}"
        );
        assert!(errs[0].message.contains("path"), "{errs:?}");
        assert!(errs[1].message.contains("api_version"), "{errs:?}");
        assert!(errs[2].message.contains("upstream_model"), "{errs:?}");
        assert!(errs[3].message.contains("A-Z a-z 0-9"), "{errs:?}");
        assert!(errs[5].message.contains("\"a b\""), "{errs:?}");
    }

    #[test]
    fn key_in_api_key_env_is_refused() {
        let errs = Config::parse(
            "[[provider]]\nname=\"a\"\nkind=\"openai\"\nbase_url=\"http://h\"\napi_key_env=\"sk-abc-123\"\n",
        )
        .unwrap_err();
        assert!(errs[0].message.contains("NAME"));
    }
}
