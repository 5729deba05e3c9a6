//! ringgate: a thread-per-core LLM gateway appliance.
//!
//! The layout in flow order (one request enters at the top and its answer leaves through
//! `answer`; `pipeline::serve` sequences the stages):
//! - `server`: start, shard threads and runtimes, listeners (plain, TLS), per-peer tables, shutdown
//! - `pipeline`: one connection's requests, top to bottom, and the local endpoints (models)
//! - `http`: HTTP/1.1 heads, bodies, responses, client connections
//! - `admit`: admission (connection and request limits, memory, queues, permits)
//! - `governance`: virtual keys (401/403), per-key limits and spend (429)
//! - `route`: client model → deployments and policy; the closed provider enum
//! - `forward`: IO-free routing decisions (balancing, breakers, keys, attempts, the upstream plan)
//! - `upstream`: pooled upstream connections, TLS, response framing (`upstream::pipe`: the one
//!   `unsafe` module)
//! - `answer`: every byte back to the client (relay, translate back, vetting, outcomes, reports)
//! - `dialect`: the four wire dialects and the hub translation between them
//! - `cache`, `responses_state`, `engine`, `mock`, `guardrail`: the features (answer cache,
//!   stored Responses, local engines, the upstream simulator, PII/secret guardrails)
//! - `mcp`: the MCP gateway on `/mcp` (federated tool servers, per-key tool allow-lists,
//!   process-wide sessions), after the same edge checks and key admission as model requests
//! - `observe`: trace, record, metrics, `/metrics` scrape, access log, log
//! - `control`: config, reload, admin, state store, doctor
//! - `util`: small leaf helpers (dates, decimals, nesting bound, versioned snapshots, socket peeks)
//! - `error`: the gateway's error type; `fuzzing`: entry points for `fuzz/`

// `unsafe` is denied everywhere but `upstream::pipe` (the one documented module; see its doc).
#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod server;
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
pub mod responses_state;
pub mod engine;
pub mod mock;
pub mod guardrail;
pub mod mcp;
pub mod observe;
pub mod control;
pub mod util;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
