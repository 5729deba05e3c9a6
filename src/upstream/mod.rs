//! The upstream client: per-shard keep-alive pools keyed by (host, port, TLS), HTTP/1.1 request
//! writing, response-head parsing and body framing (Content-Length, chunked, close), TLS via
//! rustls, and the connect / first-byte / gap / total timeouts; `target`: the rules and encoders
//! for every byte that enters an upstream request line or header; `headers`: the header policy
//! (which client headers reach which provider kind, which response headers come back);
//! `resolve`: host names looked up on helper threads, never on a shard; `bedrock` and
//! `vertex`: the cloud kinds' request signing and credentials (resolved and refreshed on helper
//! threads, `cloud`, with the blocking client `fetch`) and Bedrock's event-stream framing;
//! `unix`: connecting to a co-located engine's Unix socket (`base_url = "unix:/path:/v1"`);
//! `slow`: the signal that an answer's head is late (the caller's cue to watch its client).
//!
//! Owns: connections to providers and their reuse. Must not: build request bodies, translate,
//! or touch the client connection (the pipeline relays what `Exchange` yields).

pub mod auth;
pub mod bedrock;
pub mod cloud;
pub mod conn;
pub mod exchange;
pub mod fetch;
pub mod headers;
pub mod pipe;
pub mod pool;
pub mod resolve;
pub mod slow;
pub mod tls;
pub mod unix;
pub mod upload;
pub mod vertex;

pub use exchange::{Client, Exchange, RespFraming, ResponseHead, UpstreamRequest};
