//! Configuration: the TOML file format, its documented defaults, validation with line numbers,
//! and the embedded default used when `ringgate` runs without a file.
//!
//! Owns: `Config` and its sections, `ConfigError`, `Config::embedded()`; the routing sections
//! (`[routing]`, deployments, fallbacks, breakers, keys) live in `config::routing`.
//! Must not: open sockets, read secrets' values (only env-var *names* live here), or be consulted
//! on the hot path (shards build their own route tables from it at start-up).

pub mod endpoint;
pub mod policy;
pub mod price;
pub mod provider;
pub mod redact;

use std::net::SocketAddr;

use serde::Deserialize;
use toml::Spanned;

use crate::admit::AdmissionConfig;
use crate::config::endpoint::Endpoint;
use crate::config::policy::Lb;
use crate::config::provider::ProviderKind;
use crate::http::target;

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
pub use routing::{ApiKeyConfig, BreakerConfig, DeploymentConfig, DeploymentRef, RoutingConfig};
pub use telemetry::TelemetryConfig;

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
    #[serde(default)]
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

/// `[admin]`: a second listener for the admin API and `/metrics`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Default `127.0.0.1:8081`. A non-loopback address needs a token.
    pub listen: Spanned<String>,
    /// The env var holding the bearer token (read once at start). Default
    /// `RINGGATE_ADMIN_TOKEN`.
    pub token_env: Spanned<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Spanned::new(0..0, "127.0.0.1:8081".to_string()),
            token_env: Spanned::new(0..0, "RINGGATE_ADMIN_TOKEN".to_string()),
        }
    }
}

/// Largest accepted `server.idle_spin_us` (10 ms): beyond that it is not "idle spin" any more.
pub const MAX_IDLE_SPIN_US: u64 = 10_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on. Default `127.0.0.1:8080`.
    pub listen: Spanned<String>,
    /// Number of shards (pinned threads). Default: the CPUs this process may run on.
    pub shards: Option<usize>,
    /// Pin shard i to the i-th allowed CPU. Default true.
    pub pin: bool,
    /// `auto` (io_uring with task-run flags → plain io_uring → epoll), `io_uring`, or `epoll`.
    /// The env var `RINGGATE_DRIVER=epoll` overrides it.
    pub driver: Spanned<String>,
    /// Largest request head (request line + headers). Default 16 KiB → 431 beyond.
    pub max_head_bytes: usize,
    /// Most request headers. Default 64 → 431 beyond.
    pub max_headers: usize,
    /// Time allowed to receive a full head once its first byte arrived. Default 10 s → 408.
    pub header_timeout_ms: u64,
    /// Time allowed to receive the whole body. Default 30 s → 408.
    pub body_timeout_ms: u64,
    /// Idle keep-alive time between requests. Default 60 s, then the connection is closed.
    pub idle_timeout_ms: u64,
    /// A new connection must have sent its first complete request head within this (from
    /// accept; on the TLS listener from the end of the handshake), else it is closed (408 if
    /// part of a head came). Default 10 s; shorter than `idle_timeout_ms`, which only applies
    /// once a connection has sent a request. Connections that send nothing do not stay.
    pub first_request_timeout_ms: u64,
    /// Open connections per client address (IPv6: per /64), process-wide. Beyond it a new
    /// connection is treated like one over `max_connections` (`/healthz` and `/readyz` still
    /// answer; a request with a valid key is served; anything else gets 503 and is closed).
    /// Default 1024; `0` turns the cap off. Behind a reverse proxy every connection comes from
    /// its address: raise it, or set 0.
    pub max_connections_per_address: u32,
    /// Open client connections, process-wide (split across shards). Beyond it a new connection
    /// gets `503` + `Retry-After` and is closed; a few per shard have their first request read
    /// so `/healthz` and `/readyz` still answer. Default 16384. Each idle connection costs a few
    /// KiB outside the admission budget (no buffer once idle, see `idle_release_ms`); this caps
    /// that overhead.
    pub max_connections: usize,
    /// An idle keep-alive connection that received nothing for this long gives its buffers back
    /// and waits holding none (a few hundred bytes per idle connection instead of ~12 KiB).
    /// Default 1000 ms: clients that reuse a connection sooner keep their buffer.
    pub idle_release_ms: u64,
    /// Browser origins (`https://app.example`, `http://localhost:3000`, or `*` for any) allowed
    /// to call the gateway cross-site; they get CORS preflight answers and headers. A request
    /// carrying any other `Origin` gets 403. Default empty: browser pages on other sites are
    /// refused (SDKs and curl send no `Origin` and are unaffected).
    pub cors_allow_origins: Vec<String>,
    /// On a loopback listener, `Host` must be a loopback name or address (`localhost`,
    /// `*.localhost`, `127.0.0.0/8`, `[::1]`; DNS-rebinding guard) or one of these names
    /// (without port), e.g. the name a local reverse proxy forwards. Default empty.
    pub allowed_hosts: Vec<String>,
    /// On shutdown (SIGTERM/SIGINT), how long in-flight requests may run on after the listener
    /// closed. Default 30 s. Streams still running then end with their dialect's error event
    /// and a proper chunked end; requests still waiting for an upstream get 503.
    pub drain_timeout_ms: u64,
    /// `keys` (every API request needs a `[[key]]` secret) or `none`. Default: `keys` when
    /// `[[key]]` entries exist, else `none` — which a non-loopback listener refuses unless it
    /// is written here explicitly.
    pub auth: Option<Spanned<String>>,
    /// Optional TLS listener (`host:port`) next to `listen`; needs `tls_cert` and `tls_key`.
    pub tls_listen: Option<Spanned<String>>,
    /// PEM certificate chain (leaf first) for `tls_listen`; relative to the config file's
    /// directory.
    pub tls_cert: Option<Spanned<String>>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) for `tls_cert`; relative like `tls_cert`.
    pub tls_key: Option<Spanned<String>>,
    /// A TLS client must finish its handshake within this. Default 10 s.
    pub tls_handshake_timeout_ms: u64,
    /// Directory for persistent state: one SQLite file (`state.db`) with the keys made through
    /// the admin API and the spend ledger. `ringgate serve` defaults it to `ringgate` under
    /// `$XDG_DATA_HOME` (else `~/.local/share`), created 0700; the file is only made once
    /// there is something to keep (the admin listener or keys are on). Library users
    /// (`gateway::start`) without it keep state in memory only.
    pub state_dir: Option<String>,
    /// Serve `/metrics` on this listener even when it is not on a loopback address (metrics
    /// name keys, models and providers). Default false: a non-loopback listener answers 404 and
    /// `/metrics` lives on the admin listener.
    pub metrics_on_main: bool,
    /// Idle spin, µs (0 = off, the default; at most 10000): after a request starts or ends,
    /// the shard polls for more work this long before its thread sleeps (adaptive: shrinks to
    /// 1/16 when gaps are longer). Saves the wake-up of a sleeping core on the next packet
    /// (lower latency at low concurrency) at the price of a busy core while traffic flows.
    /// For a shard that owns its core (`pin`, nothing else scheduled there).
    pub idle_spin_us: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: Spanned::new(0..0, "127.0.0.1:8080".to_string()),
            shards: None,
            pin: true,
            driver: Spanned::new(0..0, "auto".to_string()),
            max_head_bytes: 16 * 1024,
            max_headers: 64,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            idle_timeout_ms: 60_000,
            first_request_timeout_ms: 10_000,
            max_connections_per_address: 1024,
            max_connections: 16_384,
            idle_release_ms: 1_000,
            cors_allow_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            drain_timeout_ms: 30_000,
            auth: None,
            tls_listen: None,
            tls_cert: None,
            tls_key: None,
            tls_handshake_timeout_ms: 10_000,
            state_dir: None,
            metrics_on_main: false,
            idle_spin_us: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// TCP (+TLS) connect timeout. Default 5 s → 502.
    pub connect_timeout_ms: u64,
    /// Time from request sent to the first response byte. Default 300 s → 504.
    pub first_byte_timeout_ms: u64,
    /// Longest silence between two chunks of a response body/stream. Default 120 s.
    pub stream_gap_timeout_ms: u64,
    /// Whole exchange. Default 900 s.
    pub total_timeout_ms: u64,
    /// Idle keep-alive connections kept per (host, port, tls) per shard. Default 1024: at
    /// 50 ms upstream latency, 16k req/s keeps ~800 connections busy, and a smaller cap would
    /// close and reopen connections on every burst.
    pub max_idle_per_host: usize,
    /// An idle pooled connection older than this is closed instead of reused. Default 30 s.
    pub idle_ttl_ms: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            connect_timeout_ms: 5_000,
            first_byte_timeout_ms: 300_000,
            stream_gap_timeout_ms: 120_000,
            total_timeout_ms: 900_000,
            max_idle_per_host: 1024,
            idle_ttl_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub name: Spanned<String>,
    pub kind: Spanned<ProviderKind>,
    /// As you would give it to that provider's own SDK, e.g. `https://api.openai.com/v1`.
    /// Not needed for `kind = "mock"`.
    #[serde(default)]
    pub base_url: Option<Spanned<String>>,
    /// Name of the environment variable holding the API key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<Spanned<String>>,
    /// More keys, weighted: `[{ env = "A_KEY", weight = 2 }, { env = "A_KEY2" }]` (besides
    /// `api_key_env`, which counts as one key of weight 1). A key that got a 429 cools down.
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    /// `kind = "mock"` only: `instant` (default) or `seed`.
    #[serde(default)]
    pub profile: Option<Spanned<String>>,
    /// Extra PEM CA certificate(s) trusted for this provider's `https://` base_url (added to the
    /// system roots), e.g. an internal CA in front of a local engine.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// `kind = "azure"`: the `api-version` query parameter (default 2024-10-21).
    #[serde(default)]
    pub api_version: Option<Spanned<String>>,
    /// Engine quirks for `openai-compatible` upstreams: `no_stream_options` (the engine rejects
    /// `stream_options`, so streamed usage is not requested from it).
    #[serde(default)]
    pub quirks: Vec<String>,
    /// The self-hosted inference engine behind this provider (`vllm`, `sglang`, `llamacpp`,
    /// `ollama`, `tgi`): its load signal is polled for `lb = "load"` (see `engine`).
    #[serde(default)]
    pub engine: Option<Spanned<crate::config::engines::EngineKind>>,
    /// The engine's load-signal URL (`http://`); default: the engine's usual path on the
    /// base URL's host (`/metrics`; llama.cpp `/slots`; Ollama has none).
    #[serde(default)]
    pub metrics_url: Option<Spanned<String>>,
    /// How often the load signal is polled (default 100 ms, at least 10).
    #[serde(default)]
    pub poll_ms: Option<Spanned<u64>>,
    /// A signal older than this counts as saturated (default max(1000, 3 × poll_ms)).
    #[serde(default)]
    pub stale_ms: Option<Spanned<u64>>,
    /// `kind = "bedrock"`: the AWS region (the endpoint's and SigV4's signing region).
    #[serde(default)]
    pub region: Option<Spanned<String>>,
    /// `kind = "bedrock"`: a role assumed (STS `AssumeRole`) with the chain's credentials.
    #[serde(default)]
    pub role_arn: Option<Spanned<String>>,
    /// `kind = "bedrock"`: the STS endpoint (default `https://sts.{region}.amazonaws.com`).
    #[serde(default)]
    pub sts_url: Option<Spanned<String>>,
    /// `kind = "vertex"`: the Google Cloud project.
    #[serde(default)]
    pub project: Option<Spanned<String>>,
    /// `kind = "vertex"`: the location (`us-central1`, `global`, …).
    #[serde(default)]
    pub location: Option<Spanned<String>>,
    /// `kind = "vertex"`: a service-account (or authorized-user) JSON key file; else
    /// `GOOGLE_APPLICATION_CREDENTIALS`, else the metadata server.
    #[serde(default)]
    pub credentials_file: Option<Spanned<String>>,
    /// `kind = "vertex"`: the OAuth token endpoint (default: the key file's `token_uri`).
    #[serde(default)]
    pub token_url: Option<Spanned<String>>,
    /// `kind = "vertex"`: `anthropic` or `google` for every model of this provider (default:
    /// `claude*` models are Anthropic's, the rest Google's).
    #[serde(default)]
    pub publisher: Option<crate::config::provider::Publisher>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// What clients send. A trailing `*` makes it a prefix pattern (`gpt-*`).
    pub name: Spanned<String>,
    /// The one-deployment shorthand (with `upstream_model`); or use `deployments`.
    #[serde(default)]
    pub provider: Option<Spanned<String>>,
    /// Name sent upstream. Default: the client's model name.
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// Several deployments: `[{ provider, upstream_model, weight }]`.
    #[serde(default)]
    pub deployments: Option<Spanned<Vec<DeploymentConfig>>>,
    /// `p2c` | `weighted` (default from `[routing]`, else p2c).
    #[serde(default)]
    pub lb: Option<Lb>,
    /// Model names tried in order after every deployment failed.
    #[serde(default)]
    pub fallbacks: Vec<Spanned<String>>,
    #[serde(default)]
    pub max_attempts: Option<Spanned<i64>>,
    #[serde(default)]
    pub breaker: Option<Spanned<BreakerConfig>>,
    #[serde(default)]
    pub retry_on: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub timeout_ms: Option<Spanned<u64>>,
    #[serde(default)]
    pub first_byte_timeout_ms: Option<Spanned<u64>>,
    /// Longest total wait for a provider key cooling after a 429 (default from `[routing]`,
    /// else 1000; see `config::routing`).
    #[serde(default)]
    pub max_retry_wait_ms: Option<Spanned<u64>>,
    /// USD per 1M input tokens: keyed requests' spend (a deployment's own price wins).
    #[serde(default)]
    pub price_input_per_mtok: Option<f64>,
    /// USD per 1M output tokens (a deployment's own price wins).
    #[serde(default)]
    pub price_output_per_mtok: Option<f64>,
    /// Response cache: `off` (default) | `exact` | `semantic` (needs `[cache] enabled`).
    #[serde(default)]
    pub cache: Option<Spanned<String>>,
    /// Semantic cache: cosine similarity at or above which an entry answers. Default 0.95.
    #[serde(default)]
    pub semantic_threshold: Option<f64>,
    /// Semantic cache: the model (routed by this gateway) that embeds the last user message.
    #[serde(default)]
    pub embedding_model: Option<String>,
    /// Response cache: this model's entries' time to live, seconds (default `[cache] ttl_s`).
    #[serde(default)]
    pub cache_ttl_s: Option<u64>,
    /// `lb = "load"`: a deployment is full when one more request would make its engine's
    /// waiting queue exceed this; all full → 429 + Retry-After at the gateway.
    #[serde(default)]
    pub max_waiting: Option<Spanned<u32>>,
    /// `lb = "load"`: a deployment is full at this many of the gateway's requests on it.
    #[serde(default)]
    pub max_in_flight: Option<Spanned<u32>>,
    /// `lb = "load"`: weights of the queue, KV-cache and prefix scores (default 2 / 2 / 3).
    #[serde(default)]
    pub load_weights: Option<LoadWeights>,
    /// `lb = "load"`: prefix affinity holds while the engine's queue is at most this many
    /// requests longer than the shortest (default 4).
    #[serde(default)]
    pub affinity_slack: Option<u32>,
    /// `[[guardrail]]` names checked on this model's requests and answers.
    #[serde(default)]
    pub guardrails: Vec<Spanned<String>>,
}

/// `load_weights = { queue = 2, kv = 2, prefix = 3 }`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadWeights {
    #[serde(default)]
    pub queue: Option<f64>,
    #[serde(default)]
    pub kv: Option<f64>,
    #[serde(default)]
    pub prefix: Option<f64>,
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
