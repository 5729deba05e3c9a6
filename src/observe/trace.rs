//! What one request did, as the request path learns it: which endpoint, model and deployment,
//! when it started, how long it waited on the upstream and on the client's body, when the
//! first piece of a streamed answer arrived, its tokens and bytes. Filled by `pipeline` (a few
//! plain stores and `Instant::now()` calls per request), read once when the request ends by
//! the metrics (`metrics::requests`) and the access log (`accesslog`).
//!
//! Owns: `Trace`, `Endpoint` (the `endpoint` label and access-log field).
//! Must not: allocate (but for the requested model's name while the access log is on, and the
//! guardrail hit summary of a request some guardrail matched), or hold
//! anything borrowed from the connection or the route table (indices only), so it can live in
//! the pipeline's per-request state.

use std::time::{Duration, Instant};

/// The API or gateway endpoint a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    /// `/v1/completions` (text completions, passthrough).
    Completions,
    Responses,
    Messages,
    CountTokens,
    Embeddings,
    Gemini,
    Models,
    /// `/healthz` and `/readyz`.
    Health,
    Metrics,
    /// `/mcp`: the MCP gateway.
    Mcp,
    /// `/v1/files` and its ids (`surface`).
    Files,
    /// `/v1/batches` and its ids.
    Batches,
    /// `/v1/audio/transcriptions`, `/translations`, `/speech`.
    Audio,
    /// `/v1/images/generations`, `/edits`.
    Images,
    Moderations,
    /// `/v1/rerank`.
    Rerank,
    /// Anything else: unknown paths, wrong methods, heads that did not parse.
    Other,
}

impl Endpoint {
    pub const ALL: [Endpoint; 18] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Responses,
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::Embeddings,
        Endpoint::Gemini,
        Endpoint::Models,
        Endpoint::Health,
        Endpoint::Metrics,
        Endpoint::Mcp,
        Endpoint::Files,
        Endpoint::Batches,
        Endpoint::Audio,
        Endpoint::Images,
        Endpoint::Moderations,
        Endpoint::Rerank,
        Endpoint::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "count_tokens",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Gemini => "gemini",
            Endpoint::Models => "models",
            Endpoint::Health => "health",
            Endpoint::Metrics => "metrics",
            Endpoint::Mcp => "mcp",
            Endpoint::Files => "files",
            Endpoint::Batches => "batches",
            Endpoint::Audio => "audio",
            Endpoint::Images => "images",
            Endpoint::Moderations => "moderations",
            Endpoint::Rerank => "rerank",
            Endpoint::Other => "other",
        }
    }
}

/// One request's record (see the module doc). Durations are summed over attempts and reads.
#[derive(Debug, Clone)]
pub struct Trace {
    /// When the request head had been parsed.
    pub start: Instant,
    pub endpoint: Endpoint,
    /// `RouteTable` index of the requested model, once routed.
    pub route: Option<u32>,
    /// The deployment that answered, or the last one tried: (route index, deployment index).
    pub served: Option<(u32, u32)>,
    /// The client asked for a stream.
    pub stream: bool,
    /// Time spent waiting on upstreams: attempts until an answer's head arrived, then every
    /// read of the answer's body.
    pub upstream: Duration,
    /// Time spent waiting for the request body from the client.
    pub client_body: Duration,
    /// When the first piece of the answer's body arrived from the upstream.
    pub first_piece: Option<Instant>,
    /// (input, output) tokens the answer reported, when known.
    pub tokens: Option<(u64, u64)>,
    /// Request bytes received (head and body).
    pub bytes_in: u64,
    /// The caller's virtual key (index), when it named a valid one.
    pub key: Option<u32>,
    /// Upstream attempts made.
    pub attempts: u32,
    /// The model the client asked for: kept only while the access log is on.
    pub model: Option<Box<str>>,
    /// Guardrail hits as `type:count` pairs (`None`: no guardrail matched).
    pub guardrail_hits: Option<Box<str>>,
    /// What an `/mcp` request did (`None`: not one).
    pub mcp: Option<Box<McpCall>>,
}

/// What one `/mcp` request did: its (first) `tools/call`, or its first method.
#[derive(Debug, Clone, Default)]
pub struct McpCall {
    pub method: Box<str>,
    /// The configured server a call went to (`None`: none, e.g. a denied call).
    pub server: Option<Box<str>>,
    /// The tool as the server knows it (a denied call: the name the client sent).
    pub tool: Option<Box<str>>,
    /// `ok`, `error` (the tool or server said so), `denied`, `unavailable`.
    pub result: &'static str,
    /// The forwarded call (traced requests): when it started and ended, and the server's
    /// (host, port).
    pub upstream: Option<(Instant, Instant, Box<str>, u16)>,
}

impl Trace {
    pub fn new(start: Instant) -> Trace {
        Trace {
            start,
            endpoint: Endpoint::Other,
            route: None,
            served: None,
            stream: false,
            upstream: Duration::ZERO,
            client_body: Duration::ZERO,
            first_piece: None,
            tokens: None,
            bytes_in: 0,
            key: None,
            attempts: 0,
            model: None,
            guardrail_hits: None,
            mcp: None,
        }
    }

    /// The gateway's own share of `total`: what was not spent waiting on an upstream or on
    /// the client's request body.
    pub fn overhead(&self, total: Duration) -> Duration {
        total
            .saturating_sub(self.upstream)
            .saturating_sub(self.client_body)
    }

    /// Time to the first piece of a streamed answer.
    pub fn first_token(&self) -> Option<Duration> {
        match (self.stream, self.first_piece) {
            (true, Some(t)) => Some(t.saturating_duration_since(self.start)),
            _ => None,
        }
    }
}
