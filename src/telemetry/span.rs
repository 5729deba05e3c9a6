//! A finished request turned into spans: the SERVER span (GenAI, HTTP and `ringgate.*`
//! attributes) and its CLIENT children, one per upstream attempt, queued for export.
//!
//! Owns: `request_ended`, the attribute names, `params_of`, `provider_name`. Must not: block
//! or do IO (the span is only offered to the bounded queue).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sonic_rs::JsonValueTrait;

use super::proto::{self, KeyValue, Value};
use super::{Params, Request, ShardTelemetry};
use crate::config::provider::ProviderKind;
use crate::dialect::Dialect;
use crate::observe::trace::Trace;
use crate::route::RouteTable;

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

/// The request's `max_tokens`, `temperature` and `top_p`, in its dialect's spelling.
pub fn params_of(dialect: Dialect, body: &[u8]) -> Params {
    let int = |path: &[&str]| sonic_rs::get(body, path).ok().and_then(|v| v.as_i64());
    let float = |path: &[&str]| sonic_rs::get(body, path).ok().and_then(|v| v.as_f64());
    match dialect {
        Dialect::Gemini => Params {
            max_tokens: int(&["generationConfig", "maxOutputTokens"]),
            temperature: float(&["generationConfig", "temperature"]),
            top_p: float(&["generationConfig", "topP"]),
        },
        Dialect::Responses => Params {
            max_tokens: int(&["max_output_tokens"]),
            temperature: float(&["temperature"]),
            top_p: float(&["top_p"]),
        },
        Dialect::Chat | Dialect::Messages => Params {
            max_tokens: int(&["max_completion_tokens"]).or_else(|| int(&["max_tokens"])),
            temperature: float(&["temperature"]),
            top_p: float(&["top_p"]),
        },
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
    let mut a = Vec::with_capacity(24);
    let s = |v: &str| Value::String(v.to_string());
    a.push(KeyValue::new("gen_ai.operation.name", s(req.operation)));
    a.push(KeyValue::new("gen_ai.request.model", s(model)));
    if let Some(d) = dep {
        a.push(KeyValue::new(
            "gen_ai.provider.name",
            s(provider_name(d.provider.kind)),
        ));
        if e.status < 400 {
            a.push(KeyValue::new(
                "gen_ai.response.model",
                s(d.upstream_model_or(model)),
            ));
        }
    }
    let p = &req.params;
    if let Some(v) = p.max_tokens {
        a.push(KeyValue::new("gen_ai.request.max_tokens", Value::Int(v)));
    }
    if let Some(v) = p.temperature {
        a.push(KeyValue::new(
            "gen_ai.request.temperature",
            Value::Double(v),
        ));
    }
    if let Some(v) = p.top_p {
        a.push(KeyValue::new("gen_ai.request.top_p", Value::Double(v)));
    }
    if let Some(f) = req.answer.as_deref() {
        if let Some(id) = &f.id {
            a.push(KeyValue::new("gen_ai.response.id", s(id)));
        }
        let reasons = f.finish_reasons();
        if !reasons.is_empty() {
            let values = reasons
                .iter()
                .map(|r| proto::AnyValue { value: Some(s(r)) })
                .collect();
            a.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                Value::Array(proto::ArrayValue { values }),
            ));
        }
        if let Some(text) = f.text() {
            a.push(KeyValue::new(
                "gen_ai.output.messages",
                Value::String(output_messages(&text, reasons.first().map(|r| &**r))),
            ));
        }
    }
    if let Some((i, o)) = req.usage.or(t.tokens) {
        a.push(KeyValue::new("gen_ai.usage.input_tokens", int(i)));
        a.push(KeyValue::new("gen_ai.usage.output_tokens", int(o)));
    }
    if let Some(n) = req.cache_tokens.0 {
        a.push(KeyValue::new(
            "gen_ai.usage.cache_read.input_tokens",
            int(n),
        ));
    }
    if let Some(n) = req.cache_tokens.1 {
        a.push(KeyValue::new(
            "gen_ai.usage.cache_creation.input_tokens",
            int(n),
        ));
    }
    a.push(KeyValue::new("http.request.method", s(req.method)));
    a.push(KeyValue::new("url.path", s(&req.path)));
    a.push(KeyValue::new(
        "http.response.status_code",
        Value::Int(e.status as i64),
    ));
    let failed = e.status >= 400;
    if failed {
        let et = req
            .error
            .map(str::to_string)
            .unwrap_or(e.status.to_string());
        a.push(KeyValue::new("error.type", Value::String(et)));
    }
    if let Some(k) = e.key {
        a.push(KeyValue::new("ringgate.key", s(k)));
    }
    if let Some(r) = route {
        a.push(KeyValue::new("ringgate.route", s(&r.name)));
    }
    if let Some(d) = dep {
        a.push(KeyValue::new("ringgate.deployment", s(&d.label)));
    }
    a.push(KeyValue::new(
        "ringgate.attempts",
        Value::Int(t.attempts as i64),
    ));
    if let Some(c) = req.cache {
        a.push(KeyValue::new("ringgate.cache", s(c)));
    }
    a.push(KeyValue::new("ringgate.request_id", s(e.request_id)));
    let latency = now.saturating_duration_since(t.start);
    a.push(KeyValue::new(
        "ringgate.overhead_us",
        int(t.overhead(latency).as_micros() as u64),
    ));
    if let Some(ft) = t.first_token() {
        a.push(KeyValue::new(
            "ringgate.ttft_ms",
            Value::Double(ft.as_secs_f64() * 1e3),
        ));
    }
    if let Some(i) = &req.input {
        a.push(KeyValue::new("gen_ai.input.messages", s(i)));
    }
    let status = (e.status >= 500).then(|| proto::Status {
        message: String::new(),
        code: proto::STATUS_ERROR,
    });
    let trace_id = req.ctx.trace_id.to_vec();
    let state = req.ctx.state.as_deref().unwrap_or("").to_string();
    let remote = if req.ctx.parent.is_some() {
        0x300
    } else {
        0x100
    };
    let name = if model.is_empty() {
        req.operation.to_string()
    } else {
        format!("{} {model}", req.operation)
    };
    for at_ in &req.attempts {
        let mut c = Vec::with_capacity(12);
        c.push(KeyValue::new("gen_ai.operation.name", s(req.operation)));
        c.push(KeyValue::new("gen_ai.request.model", s(&at_.model)));
        c.push(KeyValue::new("gen_ai.provider.name", s(at_.provider)));
        c.push(KeyValue::new("http.request.method", s("POST")));
        if let Some((h, port)) = &at_.server {
            c.push(KeyValue::new("server.address", s(h)));
            c.push(KeyValue::new("server.port", Value::Int(*port as i64)));
        }
        if let Some(st) = at_.status {
            c.push(KeyValue::new(
                "http.response.status_code",
                Value::Int(st as i64),
            ));
        }
        let err = at_
            .error
            .map(str::to_string)
            .or_else(|| at_.status.filter(|&s| s >= 400).map(|s| s.to_string()));
        let bad = err.is_some();
        if let Some(et) = err {
            c.push(KeyValue::new("error.type", Value::String(et)));
        }
        if let Some(r) = at_.retry {
            c.push(KeyValue::new("ringgate.retry_reason", s(r)));
        }
        c.push(KeyValue::new("ringgate.deployment", s(&at_.deployment)));
        req.tel.send(proto::Span {
            trace_id: trace_id.clone(),
            span_id: at_.span_id.to_vec(),
            trace_state: state.clone(),
            parent_span_id: req.ctx.span_id.to_vec(),
            name: format!("{} {}", req.operation, at_.model),
            kind: proto::KIND_CLIENT,
            start_time_unix_nano: at(at_.start),
            end_time_unix_nano: at(at_.end.unwrap_or(now)),
            attributes: c,
            status: bad.then(|| proto::Status {
                message: String::new(),
                code: proto::STATUS_ERROR,
            }),
            flags: 0x101,
        });
    }
    req.tel.send(proto::Span {
        trace_id,
        span_id: req.ctx.span_id.to_vec(),
        trace_state: state,
        parent_span_id: req.ctx.parent.map(|p| p.to_vec()).unwrap_or_default(),
        name,
        kind: proto::KIND_SERVER,
        start_time_unix_nano: at(t.start),
        end_time_unix_nano: wall,
        attributes: a,
        status,
        flags: remote | 1,
    });
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
) -> proto::Span {
    let s = |v: &str| Value::String(v.to_string());
    let tool = m.tool.as_deref().unwrap_or("");
    let mut a = Vec::with_capacity(12);
    a.push(KeyValue::new("gen_ai.operation.name", s("execute_tool")));
    a.push(KeyValue::new("gen_ai.tool.name", s(tool)));
    a.push(KeyValue::new("mcp.method.name", s(&m.method)));
    if let Some(srv) = &m.server {
        a.push(KeyValue::new("ringgate.mcp_server", s(srv)));
    }
    a.push(KeyValue::new("http.request.method", s(req.method)));
    a.push(KeyValue::new("url.path", s(&req.path)));
    a.push(KeyValue::new(
        "http.response.status_code",
        Value::Int(e.status as i64),
    ));
    let error = match m.result {
        "ok" if e.status < 400 => None,
        "ok" => Some(
            req.error
                .map(str::to_string)
                .unwrap_or(e.status.to_string()),
        ),
        "error" => Some("tool_error".to_string()),
        other => Some(other.to_string()),
    };
    if let Some(et) = &error {
        a.push(KeyValue::new("error.type", s(et)));
    }
    if let Some(k) = e.key {
        a.push(KeyValue::new("ringgate.key", s(k)));
    }
    a.push(KeyValue::new("ringgate.request_id", s(e.request_id)));
    let remote = if req.ctx.parent.is_some() {
        0x300
    } else {
        0x100
    };
    proto::Span {
        trace_id: req.ctx.trace_id.to_vec(),
        span_id: req.ctx.span_id.to_vec(),
        trace_state: req.ctx.state.as_deref().unwrap_or("").to_string(),
        parent_span_id: req.ctx.parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: if tool.is_empty() {
            m.method.to_string()
        } else {
            format!("{} {tool}", m.method)
        },
        kind: proto::KIND_SERVER,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes: a,
        status: error.map(|_| proto::Status {
            message: String::new(),
            code: proto::STATUS_ERROR,
        }),
        flags: remote | 1,
    }
}

/// The CLIENT span of a `tools/call` forwarded to its MCP server (child of the SERVER span;
/// the server got a `traceparent` naming it).
fn tool_client_span(
    req: &Request,
    m: &crate::observe::trace::McpCall,
    id: [u8; 8],
    (start, end): (u64, u64),
    (host, port): (&str, u16),
) -> proto::Span {
    let s = |v: &str| Value::String(v.to_string());
    let tool = m.tool.as_deref().unwrap_or("");
    let mut a = vec![
        KeyValue::new("gen_ai.operation.name", s("execute_tool")),
        KeyValue::new("gen_ai.tool.name", s(tool)),
        KeyValue::new("mcp.method.name", s("tools/call")),
        KeyValue::new("server.address", s(host)),
        KeyValue::new("server.port", Value::Int(port as i64)),
    ];
    if let Some(srv) = &m.server {
        a.push(KeyValue::new("ringgate.mcp_server", s(srv)));
    }
    let error = match m.result {
        "ok" => None,
        "error" => Some("tool_error"),
        other => Some(other),
    };
    if let Some(et) = error {
        a.push(KeyValue::new("error.type", s(et)));
    }
    proto::Span {
        trace_id: req.ctx.trace_id.to_vec(),
        span_id: id.to_vec(),
        trace_state: req.ctx.state.as_deref().unwrap_or("").to_string(),
        parent_span_id: req.ctx.span_id.to_vec(),
        name: format!("tools/call {tool}"),
        kind: proto::KIND_CLIENT,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes: a,
        status: error.map(|_| proto::Status {
            message: String::new(),
            code: proto::STATUS_ERROR,
        }),
        flags: 0x101,
    }
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

fn int(v: u64) -> Value {
    Value::Int(v.min(i64::MAX as u64) as i64)
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
