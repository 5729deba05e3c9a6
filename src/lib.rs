//! ringgate: a thread-per-core LLM gateway appliance.
//!
//! Module map by pipeline stage (see `pipeline` for the request path, top to bottom):
//! - `shard`, `gateway`, `shutdown`: threads, runtimes, listeners, lifecycle
//! - `http`: HTTP/1.1 heads, bodies, responses, client connections (plain or TLS streams)
//! - `tls`: the optional TLS client listener (certificates, handshake, per-shard accept loop)
//! - `extract`, `nesting`: model/stream lookup (and the body checks before routing), the JSON
//!   depth bound; `gemini_call`: model and stream from a Gemini-dialect request path
//! - `route`, `provider`: model → deployments + policy, the closed provider enum; `models`: the
//!   model list / lookup endpoints in each SDK's shape
//! - `forward`: IO-free routing state and decisions (balancing, breakers, keys, attempt plans)
//! - `upstream`: pooled upstream connections, TLS, response framing; `upstream::target` is what
//!   may enter an upstream request line or header
//! - `governance`: virtual keys (401/403) and per-key limits (429), on the head and after
//!   routing
//! - `guardrail`: PII / secret detectors that mask, block or warn on request text and on
//!   answers, streams included (bounded hold-back)
//! - `relay`, `vet`: upstream → client byte path of passthrough answers (SSE per event), and
//!   the checks that vet what it relays (error shapes, JSON answers, SSE data)
//! - `mock`: the upstream simulator
//! - `trace`, `record`, `accesslog`: what one request did (timings, route, tokens, bytes) and
//!   where it goes when the request ends (metrics, the access log)
//! - `metrics`, `scrape`: per-shard counters and histograms, the Prometheus text of `/metrics`
//! - `config`, `error`, `log`, `sock` (non-consuming socket peeks)

// `unsafe` is denied everywhere but `upstream::pipe` (the one documented module; see its doc).
#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod accesslog;
pub mod admin;
pub mod admit;
pub mod bridge;
pub mod cache;
pub mod config;
pub mod date;
pub mod decimal;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod extract;
pub mod forward;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod gemini_call;
pub mod governance;
pub mod guardrail;
pub mod http;
pub mod json_check;
pub mod log;
pub mod metrics;
pub mod mock;
pub mod models;
pub mod nesting;
pub mod outcome;
pub mod peer;
pub mod pipeline;
pub mod plan;
pub mod provider;
pub mod record;
pub mod relay;
pub mod reload;
pub mod report;
pub mod respond;
pub mod responses_state;
pub mod route;
pub mod scrape;
pub mod shard;
pub mod shutdown;
pub mod sock;
pub mod state;
pub mod tls;
pub mod trace;
pub mod translate;
pub mod upstream;
pub mod versioned;
pub mod vet;
