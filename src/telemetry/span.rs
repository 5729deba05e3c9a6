//! A finished request turned into spans: the SERVER span (GenAI, HTTP and `ringgate.*`
//! attributes) and its CLIENT children, one per upstream attempt, queued for export.
//!
//! Owns: `request_ended`, the attribute names, `params_of`, `provider_name`. Must not: block
//! or do IO (the span is only offered to the bounded queue).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sonic_rs::{JsonValueTrait, PointerTree};

use super::context::Context;
use super::proto;
use super::wire::{Head, SpanWriter};
use super::{Params, Request, ShardTelemetry};
use crate::config::provider::ProviderKind;
use crate::dialect::Dialect;
use crate::observe::trace::Trace;
use crate::route::RouteTable;

/// The writer of one of the request's spans: its SERVER span (`client` None: `ctx.span_id`,
/// child of the caller's span), or the CLIENT span `client` under it.
fn span_writer(
    ctx: &Context,
    client: Option<&[u8; 8]>,
    name: &[&str],
    (start, end): (u64, u64),
    capacity: usize,
) -> SpanWriter {
    let (span_id, parent, kind) = match client {
        None => (&ctx.span_id, ctx.parent.as_ref(), proto::KIND_SERVER),
        Some(id) => (id, Some(&ctx.span_id), proto::KIND_CLIENT),
    };
    let head = Head {
        trace_id: &ctx.trace_id,
        span_id,
        state: ctx.state.as_deref().unwrap_or(""),
        parent,
        name,
        kind,
        start,
        end,
    };
    SpanWriter::start(&head, capacity)
}

/// A SERVER span's OTLP flags: sampled, and whether its parent is remote is known (0x100) and
/// true (0x200: a caller's `traceparent` named it).
fn server_flags(ctx: &Context) -> u32 {
    let remote = if ctx.parent.is_some() { 0x300 } else { 0x100 };
    remote | 1
}

/// `gen_ai.provider.name` of a provider kind (the semantic conventions' well-known values).
pub fn provider_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::OpenAi | ProviderKind::OpenAiCompatible => "openai",
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::Gemini => "gcp.gemini",
        ProviderKind::Azure => "azure.ai.openai",
        ProviderKind::Bedrock => "aws.bedrock",
        ProviderKind::Vertex => "gcp.vertex_ai",
        ProviderKind::Mock => "ringgate.mock",
    }
}

/// `gen_ai.operation.name` of a call.
pub fn operation(dialect: Dialect, op: crate::config::provider::Op) -> &'static str {
    use crate::config::provider::Op;
    match (dialect, op) {
        (_, Op::Embeddings) => "embeddings",
        (_, Op::CountTokens) => "count_tokens",
        (_, Op::Completions) => "text_completion",
        (Dialect::Gemini, Op::Generate) => "generate_content",
        (_, Op::Generate) => "chat",
    }
}

/// The request's `max_tokens`, `temperature` and `top_p`, in its dialect's spelling: one pass
/// over the body (`sonic_rs::get_many`; a `sonic_rs::get` per key scanned the body once per
/// key and built a formatted error for every key the body lacks: ~26k instructions a small
/// chat request, a quarter of tracing's cost).
pub fn params_of(dialect: Dialect, body: &[u8]) -> Params {
    use std::sync::OnceLock;
    static GEMINI: OnceLock<PointerTree> = OnceLock::new();
    static RESPONSES: OnceLock<PointerTree> = OnceLock::new();
    static CHAT: OnceLock<PointerTree> = OnceLock::new();
    fn tree(paths: &[&[&str]]) -> PointerTree {
        let mut t = PointerTree::new();
        for p in paths {
            t.add_path(p.iter().copied());
        }
        t
    }
    // (max_tokens, temperature, top_p[, max_tokens' older spelling])
    let tree = match dialect {
        Dialect::Gemini => GEMINI.get_or_init(|| {
            tree(&[
                &["generationConfig", "maxOutputTokens"],
                &["generationConfig", "temperature"],
                &["generationConfig", "topP"],
            ])
        }),
        Dialect::Responses => {
            RESPONSES.get_or_init(|| tree(&[&["max_output_tokens"], &["temperature"], &["top_p"]]))
        }
        Dialect::Chat | Dialect::Messages => CHAT.get_or_init(|| {
            tree(&[
                &["max_completion_tokens"],
                &["temperature"],
                &["top_p"],
                &["max_tokens"],
            ])
        }),
    };
    let Ok(found) = sonic_rs::get_many(body, tree) else {
        return Params::default();
    };
    let at = |i: usize| found.get(i).and_then(Option::as_ref);
    Params {
        max_tokens: at(0)
            .and_then(|v| v.as_i64())
            .or_else(|| at(3).and_then(|v| v.as_i64())),
        temperature: at(1).and_then(|v| v.as_f64()),
        top_p: at(2).and_then(|v| v.as_f64()),
    }
}

/// What the pipeline knows at the end of a request beyond its `Trace`.
pub struct Ended<'a> {
    pub status: u16,
    pub request_id: &'a str,
    pub key: Option<&'a str>,
}

/// The request `t` ended now: its spans built and queued (sampled requests only).
pub fn request_ended(
    _tel: &ShardTelemetry,
    routes: &RouteTable,
    t: &Trace,
    req: Box<Request>,
    e: &Ended<'_>,
) {
    if !req.ctx.sampled {
        return;
    }
    let now = Instant::now();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let at = |i: Instant| wall.saturating_sub(now.saturating_duration_since(i).as_nanos() as u64);
    if t.endpoint == crate::observe::trace::Endpoint::Mcp {
        if let Some(m) = t.mcp.as_deref().filter(|m| &*m.method == "tools/call") {
            if let (Some(id), Some((start, end, host, port))) = (req.tool_span, &m.upstream) {
                let span = tool_client_span(&req, m, id, (at(*start), at(*end)), (host, *port));
                req.tel.send(span);
            }
            req.tel.send(tool_span(&req, m, e, at(t.start), wall));
        }
        return;
    }
    let route = t.route.and_then(|r| routes.route(r as usize));
    let dep = t
        .served
        .and_then(|(r, d)| routes.route(r as usize)?.deployments.get(d as usize));
    let model = req
        .request_model
        .as_deref()
        .or(route.map(|r| r.name.as_str()))
        .unwrap_or("");
    let mut a = span_writer(
        &req.ctx,
        None,
        &[req.operation, model],
        (at(t.start), wall),
        768,
    );
    a.str("gen_ai.operation.name", req.operation);
    a.str("gen_ai.request.model", model);
    if let Some(d) = dep {
        a.str("gen_ai.provider.name", provider_name(d.provider.kind));
        if e.status < 400 {
            a.str("gen_ai.response.model", d.upstream_model_or(model));
        }
    }
    let p = &req.params;
    if let Some(v) = p.max_tokens {
        a.int("gen_ai.request.max_tokens", v);
    }
    if let Some(v) = p.temperature {
        a.double("gen_ai.request.temperature", v);
    }
    if let Some(v) = p.top_p {
        a.double("gen_ai.request.top_p", v);
    }
    if let Some(f) = req.answer.as_deref() {
        if let Some(id) = &f.id {
            a.str("gen_ai.response.id", id);
        }
        let reasons = f.finish_reasons();
        if !reasons.is_empty() {
            a.strs("gen_ai.response.finish_reasons", &reasons);
        }
        if let Some(text) = f.text() {
            a.str(
                "gen_ai.output.messages",
                &output_messages(&text, reasons.first().map(|r| &**r)),
            );
        }
    }
    if let Some((i, o)) = req.usage.or(t.tokens) {
        a.uint("gen_ai.usage.input_tokens", i);
        a.uint("gen_ai.usage.output_tokens", o);
    }
    if let Some(n) = req.cache_tokens.0 {
        a.uint("gen_ai.usage.cache_read.input_tokens", n);
    }
    if let Some(n) = req.cache_tokens.1 {
        a.uint("gen_ai.usage.cache_creation.input_tokens", n);
    }
    a.str("http.request.method", req.method);
    a.str("url.path", &req.path);
    a.int("http.response.status_code", e.status as i64);
    if e.status >= 400 {
        match req.error {
            Some(et) => a.str("error.type", et),
            None => a.code("error.type", e.status),
        }
    }
    if let Some(k) = e.key {
        a.str("ringgate.key", k);
    }
    if let Some(r) = route {
        a.str("ringgate.route", &r.name);
    }
    if let Some(d) = dep {
        a.str("ringgate.deployment", &d.label);
    }
    a.int("ringgate.attempts", t.attempts as i64);
    if let Some(c) = req.cache {
        a.str("ringgate.cache", c);
    }
    a.str("ringgate.request_id", e.request_id);
    let latency = now.saturating_duration_since(t.start);
    a.uint(
        "ringgate.overhead_us",
        t.overhead(latency).as_micros() as u64,
    );
    if let Some(ft) = t.first_token() {
        a.double("ringgate.ttft_ms", ft.as_secs_f64() * 1e3);
    }
    if let Some(i) = &req.input {
        a.str("gen_ai.input.messages", i);
    }
    let server = a.finish(e.status >= 500, server_flags(&req.ctx));
    for at_ in &req.attempts {
        let mut c = span_writer(
            &req.ctx,
            Some(&at_.span_id),
            &[req.operation, &at_.model],
            (at(at_.start), at(at_.end.unwrap_or(now))),
            384,
        );
        c.str("gen_ai.operation.name", req.operation);
        c.str("gen_ai.request.model", &at_.model);
        c.str("gen_ai.provider.name", at_.provider);
        c.str("http.request.method", "POST");
        match &at_.server {
            Some((path, 0)) => {
                c.str("server.address", path);
                c.str("network.transport", "unix");
            }
            Some((h, port)) => {
                c.str("server.address", h);
                c.int("server.port", *port as i64);
            }
            None => {}
        }
        if let Some(st) = at_.status {
            c.int("http.response.status_code", st as i64);
        }
        let bad = match (at_.error, at_.status.filter(|&s| s >= 400)) {
            (Some(et), _) => {
                c.str("error.type", et);
                true
            }
            (None, Some(st)) => {
                c.code("error.type", st);
                true
            }
            (None, None) => false,
        };
        if let Some(r) = at_.retry {
            c.str("ringgate.retry_reason", r);
        }
        c.str("ringgate.deployment", &at_.deployment);
        req.tel.send(c.finish(bad, 0x101));
    }
    req.tel.send(server);
}

/// An MCP `tools/call` request's SERVER span (the GenAI `execute_tool` and MCP conventions):
/// named `tools/call {tool}`, with `gen_ai.tool.name` (the tool as its server knows it),
/// `mcp.method.name`, `ringgate.mcp_server`; a tool that answered `isError`, a denied call and
/// an unreachable server are errors (`error.type` `tool_error`, `denied`, `unavailable`).
fn tool_span(
    req: &Request,
    m: &crate::observe::trace::McpCall,
    e: &Ended<'_>,
    start: u64,
    end: u64,
) -> Vec<u8> {
    let tool = m.tool.as_deref().unwrap_or("");
    let mut a = span_writer(&req.ctx, None, &[&m.method, tool], (start, end), 512);
    a.str("gen_ai.operation.name", "execute_tool");
    a.str("gen_ai.tool.name", tool);
    a.str("mcp.method.name", &m.method);
    if let Some(srv) = &m.server {
        a.str("ringgate.mcp_server", srv);
    }
    a.str("http.request.method", req.method);
    a.str("url.path", &req.path);
    a.int("http.response.status_code", e.status as i64);
    let error = match (m.result, req.error) {
        ("ok", _) if e.status < 400 => false,
        ("ok", Some(et)) => {
            a.str("error.type", et);
            true
        }
        ("ok", None) => {
            a.code("error.type", e.status);
            true
        }
        ("error", _) => {
            a.str("error.type", "tool_error");
            true
        }
        (other, _) => {
            a.str("error.type", other);
            true
        }
    };
    if let Some(k) = e.key {
        a.str("ringgate.key", k);
    }
    a.str("ringgate.request_id", e.request_id);
    a.finish(error, server_flags(&req.ctx))
}

/// The CLIENT span of a `tools/call` forwarded to its MCP server (child of the SERVER span;
/// the server got a `traceparent` naming it).
fn tool_client_span(
    req: &Request,
    m: &crate::observe::trace::McpCall,
    id: [u8; 8],
    (start, end): (u64, u64),
    (host, port): (&str, u16),
) -> Vec<u8> {
    let tool = m.tool.as_deref().unwrap_or("");
    let mut a = span_writer(
        &req.ctx,
        Some(&id),
        &["tools/call", tool],
        (start, end),
        384,
    );
    a.str("gen_ai.operation.name", "execute_tool");
    a.str("gen_ai.tool.name", tool);
    a.str("mcp.method.name", "tools/call");
    a.str("server.address", host);
    a.int("server.port", port as i64);
    if let Some(srv) = &m.server {
        a.str("ringgate.mcp_server", srv);
    }
    let error = match m.result {
        "ok" => None,
        "error" => Some("tool_error"),
        other => Some(other),
    };
    if let Some(et) = error {
        a.str("error.type", et);
    }
    a.finish(error.is_some(), 0x101)
}

/// `gen_ai.output.messages` (the conventions' JSON shape): one assistant message with one text
/// part; `text` is already the contents of a JSON string (escaped as the answer sent it).
fn output_messages(text: &str, finish: Option<&str>) -> String {
    let mut out = String::with_capacity(text.len() + 96);
    out.push_str(r#"[{"role":"assistant","parts":[{"type":"text","content":""#);
    out.push_str(text);
    out.push_str("\"}]");
    if let Some(r) = finish {
        out.push_str(r#","finish_reason":""#);
        out.push_str(r);
        out.push('"');
    }
    out.push_str("}]");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_in_each_dialect() {
        let p = params_of(
            Dialect::Chat,
            br#"{"model":"m","max_tokens":7,"temperature":0.5,"top_p":0.9}"#,
        );
        assert_eq!(
            (p.max_tokens, p.temperature, p.top_p),
            (Some(7), Some(0.5), Some(0.9))
        );
        let p = params_of(
            Dialect::Gemini,
            br#"{"generationConfig":{"maxOutputTokens":9,"topP":0.1}}"#,
        );
        assert_eq!(
            (p.max_tokens, p.temperature, p.top_p),
            (Some(9), None, Some(0.1))
        );
        let p = params_of(Dialect::Responses, br#"{"max_output_tokens":3}"#);
        assert_eq!(p.max_tokens, Some(3));
        let p = params_of(Dialect::Messages, b"not json");
        assert_eq!(p.max_tokens, None);
    }
}
