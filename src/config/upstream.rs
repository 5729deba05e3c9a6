//! `[upstream]`: how the gateway talks to every provider — connect, first-byte, stream-gap and
//! total timeouts, and the per-shard keep-alive pool's bounds.
//!
//! Owns: `UpstreamConfig` and its documented defaults.
//! Must not: open connections (the pool and exchanges live in `upstream`).

use serde::Deserialize;

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
