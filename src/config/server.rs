//! The client-facing listeners' sections: `[server]` (listen address, shards, driver, head and
//! body bounds, timeouts, connection caps, CORS and `Host` policy, TLS listener, state directory,
//! idle spin) and `[admin]` (the admin API's listener and token env var).
//!
//! Owns: `ServerConfig`, `AdminConfig` and their documented defaults, `MAX_IDLE_SPIN_US`.
//! Must not: open sockets or read the token's value (validation lives in `config::validate`).

use serde::Deserialize;
use toml::Spanned;

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
