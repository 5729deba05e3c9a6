//! The upstream client: per-shard keep-alive pools keyed by (host, port, TLS), HTTP/1.1 request
//! writing, response-head parsing and body framing (Content-Length, chunked, close), TLS via
//! rustls, and the connect / first-byte / gap / total timeouts.
//!
//! Owns: connections to providers and their reuse. Must not: build request bodies, translate,
//! or touch the client connection (the pipeline relays what `Exchange` yields).

pub mod conn;
pub mod endpoint;
pub mod exchange;
pub mod pool;
pub mod tls;

pub use exchange::{Client, Exchange, RespFraming, ResponseHead, UpstreamRequest};
