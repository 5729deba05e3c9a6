//! ringgate: a thread-per-core LLM gateway appliance.
//!
//! The layout in flow order (one request enters at the top and its answer leaves through
//! `answer`; `pipeline::serve` sequences the stages):
//! - `server`: start (build the shards, the published config, the admin listener), the TLS listener
//! - `runtime`: shard threads and I/O drivers, listeners, the accept loop, shutdown signals, idle spin
//! - `pipeline`: one connection's requests, top to bottom; the `Shard`; the end-of-request record
//!   and the `/metrics` scrape
//! - `http`: HTTP/1.1 heads, bodies, responses, client connections
//! - `admit`: admission (connection and request limits, per-address tables, memory, queues, permits)
//! - `governance`: virtual keys (401/403), per-key limits and spend (429)
//! - `route`: client model → deployments and policy; the model list endpoints' catalog
//! - `forward`: routing decisions (balancing, breakers, keys, attempts, the upstream plan), the
//!   live routing a reload swaps, upstream failure reports
//! - `upstream`: pooled upstream connections, TLS, response framing (`upstream::pipe`: the one
//!   `unsafe` module)
//! - `answer`: every byte back to the client, through one `answer::Sink`: whole answers, early
//!   errors, cache hits, local endpoints; the relay (vetted), the bridge (translated back) and the
//!   one stream loop
//! - `dialect`: the four wire dialects and the hub translation between them
//! - `cache`, `responses_state`, `engine`, `mock`, `guardrail`, `telemetry`: the features (answer
//!   cache, stored Responses, local engines, the upstream simulator, PII/secret guardrails,
//!   OpenTelemetry traces and the request log export)
//! - `surface`: the OpenAI surface beyond chat (files, batches, audio, images, moderations,
//!   rerank), passed through with streamed bodies; sits between `cache` and `pipeline`
//! - `mcp`: the MCP gateway on `/mcp` (federated tool servers, per-key tool allow-lists,
//!   process-wide sessions), after the same edge checks and key admission as model requests
//! - `observe`: trace, metrics, access log, log
//! - `control`: reload, admin, doctor
//! - `config`: the TOML file, defaults, validation; the routing, provider and price facts it names
//! - `util`: small leaf helpers (dates, decimals, nesting bound, versioned snapshots, socket
//!   peeks, CPUs, the p2c random source)
//! - `error`: the gateway's error type; `fuzzing`: entry points for `fuzz/`
//!
//! Imports run one way, down this order (no cycles, checked by `.ci/cycles.py`): `util`,
//! `error` < `admit` < `http` < `dialect` < `observe` < `guardrail` < `config` < `runtime` <
//! `upstream` < `engine` < `route` < `governance` < `responses_state` < `mock` < `telemetry` <
//! `mcp` < `forward` < `answer` < `cache` < `surface` < `pipeline` < `control` < `server`.

// `unsafe` is denied everywhere but `upstream::pipe` (the one documented module; see its doc).
#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod server;
pub mod runtime;
pub mod pipeline;
pub mod http;
pub mod admit;
pub mod governance;
pub mod route;
pub mod forward;
pub mod upstream;
pub mod answer;
pub mod dialect;
pub mod cache;
pub mod surface;
pub mod responses_state;
pub mod engine;
pub mod mock;
pub mod guardrail;
pub mod telemetry;
pub mod mcp;
pub mod observe;
pub mod control;
pub mod config;
pub mod util;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
