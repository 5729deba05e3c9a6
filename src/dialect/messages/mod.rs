//! Anthropic Messages ⇄ Chat Completions (requests and non-stream
//! responses); its stream decoder and encoder are in `stream.rs`.
//!
//! Must not: perform IO, or allocate beyond the values it returns.
//!
//! Mapping notes:
//! * `system` (string or text-block array) ⇄ leading Chat `system`
//!   message(s); Chat `developer` is treated as `system`.
//! * `tool_result` blocks in a user turn ⇄ Chat `role: tool` messages;
//!   `tool_use` blocks ⇄ assistant `tool_calls` (input object ⇄ arguments
//!   JSON string).
//! * Images: `source.type` `base64` ⇄ `data:` URL, `url` ⇄ https URL.
//! * `max_tokens` is required by Anthropic: Chat → Messages without
//!   `max_tokens`/`max_completion_tokens` uses [`DEFAULT_MAX_TOKENS`].
//! * Usage: Anthropic `input_tokens` excludes cache reads/writes, Chat
//!   `prompt_tokens` includes them: `prompt_tokens = input_tokens +
//!   cache_read_input_tokens + cache_creation_input_tokens`, and back
//!   (`cached_tokens` ⇄ `cache_read_input_tokens`).
//! * Thinking (see `thinking`): `thinking.budget_tokens` ⇄ `reasoning_effort`
//!   (documented table); `thinking` / `redacted_thinking` blocks ⇄ assistant
//!   `reasoning_content` + `thinking_blocks` (verbatim, signatures kept). Going
//!   to Anthropic, thinking is left off when a tool is forced or structured
//!   output is asked for, or when the last tool-calling assistant turn has no
//!   thinking blocks (Anthropic refuses those combinations), and it drops
//!   `temperature` / `top_p` / `top_k` (refused with thinking).
//! * `cache_control` markers (see `cache`) stay on their system block, content
//!   block, tool result, tool use or tool, both ways.
//! * `top_k` ⇄ hub `top_k`; `service_tier` `auto` ⇄ `auto`, `standard_only` ⇄
//!   `default`; `metadata.user_id` ⇄ `user`.
//! * Structured output (see `structured`): hub `response_format` → a forced
//!   answer tool whose input comes back as the text; Anthropic `output_format`
//!   → hub `response_format`.
//!
//! Deliberately dropped:
//!
//! | direction | field | why |
//! |---|---|---|
//! | Messages → Chat | `container`, `mcp_servers`, `metadata` other than `user_id` | no Chat equivalent |
//! | Messages → Chat | `document` blocks, images inside `tool_result`, `is_error` | Chat tool messages carry text only |
//! | Chat → Messages | `presence_penalty`, `frequency_penalty`, `logit_bias`, `logprobs`, `top_logprobs`, `seed`, `metadata`, `stream_options`, `audio`, `modalities`, `prediction`, `store`, `service_tier` other than `auto`/`default` | no Messages equivalent |
//! | Chat → Messages | `reasoning_content` without `thinking_blocks` in history | no signature: Anthropic would refuse the block |
//! | Chat → Messages | `input_audio` / `file` content parts | not expressible |
//! | Chat → Messages | `n` > 1 | rejected (`translate::chat_to_request`) |
//! | responses | Chat `logprobs`, `system_fingerprint`; Anthropic `stop_sequence` value; cache-write count (folded into `prompt_tokens`) | no equivalent |
//!
//! Messages server tools (those with a `type` other than `custom`) are
//! rejected with [`TranslateError`] rather than dropped, as is a client tool
//! named like the structured-output tool.

use crate::dialect::util::{self, arr, s, Obj};
use crate::dialect::TranslateError;
use crate::dialect::Wire;
use crate::dialect::{cache, structured, thinking, Dialect};
use crate::dialect::{Decoder, Encoder};
use crate::error::ErrorShape;

pub(crate) mod stream;

/// Anthropic Messages' wire facts.
pub static WIRE: Wire = Wire {
    dialect: Dialect::Messages,
    name: "messages",
    error_shape: ErrorShape::Anthropic,
    error_type,
    error_code: |_| None,
    error_event: Some("error"),
    terminal_events: &["message_stop"],
    terminal_data: None,
    terminal_key: None,
    usage_at: &[&["usage"], &["message", "usage"]],
    usage_to_hub,
    request_to_chat,
    chat_to_request,
    response_to_chat,
    chat_to_response,
    decoder: || Decoder::Messages(Default::default()),
    encoder: |model| Encoder::Messages(stream::MessagesOut::new(model)),
};

/// Anthropic `error.type` for an HTTP status.
pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        503 | 529 => "overloaded_error",
        _ if status >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}
use serde_json::{json, Map, Value};

/// `max_tokens` used for Chat → Messages when the client set none.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Anthropic `stop_reason` → Chat `finish_reason`.
pub fn stop_to_finish(stop: &str) -> &'static str {
    match stop {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// Chat `finish_reason` → Anthropic `stop_reason`.
pub fn finish_to_stop(finish: &str) -> &'static str {
    match finish {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

// ---------------------------------------------------------------- requests

/// Messages request body → hub Chat request.
pub fn request_to_chat(body: &[u8]) -> Result<Value, TranslateError> {
    let req = util::parse_object(body)?;
    let mut out = Obj::new();
    util::copy(&req, "model", &mut out, "model");
    let mut messages = Vec::new();
    match req.get("system") {
        Some(Value::String(t)) if !t.is_empty() => {
            messages.push(json!({"role": "system", "content": t}));
        }
        Some(Value::Array(blocks)) if blocks.iter().any(cache::has) => {
            // Cache markers stay on their blocks: the system prompt stays a part array.
            let parts: Vec<Value> = blocks
                .iter()
                .filter_map(|b| {
                    let mut p = json!({"type": "text", "text": s(b, "text")?});
                    cache::copy_onto(b, &mut p);
                    Some(p)
                })
                .collect();
            messages.push(json!({"role": "system", "content": parts}));
        }
        Some(Value::Array(blocks)) => {
            let text: Vec<&str> = blocks.iter().filter_map(|b| s(b, "text")).collect();
            if !text.is_empty() {
                messages.push(json!({"role": "system", "content": text.join("\n")}));
            }
        }
        _ => {}
    }
    let Some(msgs) = req.get("messages").and_then(Value::as_array) else {
        return Err(TranslateError::new("`messages` must be an array"));
    };
    for m in msgs {
        match s(m, "role") {
            Some("user") => user_to_chat(m.get("content"), &mut messages),
            Some("assistant") => messages.push(assistant_to_chat(m.get("content"), false)),
            other => {
                return Err(TranslateError::new(format!(
                    "unsupported message role {:?}",
                    other.unwrap_or("<missing>")
                )))
            }
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    util::copy(&req, "max_tokens", &mut out, "max_tokens");
    util::copy(&req, "temperature", &mut out, "temperature");
    util::copy(&req, "top_p", &mut out, "top_p");
    util::copy(&req, "top_k", &mut out, "top_k");
    util::copy(&req, "stop_sequences", &mut out, "stop");
    if let Some(user) = req.get("metadata").and_then(|m| s(m, "user_id")) {
        out.insert("user".into(), user.into());
    }
    if let Some(e) = req.get("thinking").and_then(thinking::thinking_to_effort) {
        out.insert("reasoning_effort".into(), e.into());
    }
    match s(&req, "service_tier") {
        Some("auto") => {
            out.insert("service_tier".into(), "auto".into());
        }
        Some("standard_only") => {
            out.insert("service_tier".into(), "default".into());
        }
        _ => {}
    }
    if let Some(rf) = req
        .get("output_format")
        .and_then(structured::output_format_to_hub)
    {
        out.insert("response_format".into(), rf);
    }
    if let Some(tools) = req.get("tools").and_then(Value::as_array) {
        let mut chat_tools = Vec::new();
        for t in tools {
            match s(t, "type") {
                None | Some("custom") => {}
                Some(other) => {
                    return Err(TranslateError::new(format!(
                        "Anthropic server tool `{other}` cannot be translated"
                    )))
                }
            }
            structured::check_tool_name(s(t, "name"))?;
            let mut f = Obj::new();
            util::copy(t, "name", &mut f, "name");
            util::copy(t, "description", &mut f, "description");
            util::copy(t, "input_schema", &mut f, "parameters");
            let mut tool = json!({"type": "function", "function": f});
            cache::copy_onto(t, &mut tool);
            chat_tools.push(tool);
        }
        if !chat_tools.is_empty() {
            out.insert("tools".into(), Value::Array(chat_tools));
        }
    }
    if let Some(tc) = req.get("tool_choice") {
        match s(tc, "type") {
            Some("auto") => {
                out.insert("tool_choice".into(), "auto".into());
            }
            Some("any") => {
                out.insert("tool_choice".into(), "required".into());
            }
            Some("none") => {
                out.insert("tool_choice".into(), "none".into());
            }
            Some("tool") => {
                let name = s(tc, "name").unwrap_or_default();
                out.insert(
                    "tool_choice".into(),
                    json!({"type": "function", "function": {"name": name}}),
                );
            }
            _ => {}
        }
        if tc.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
            out.insert("parallel_tool_calls".into(), false.into());
        }
    }
    if let Some(stream) = req.get("stream").and_then(Value::as_bool) {
        out.insert("stream".into(), stream.into());
        if stream {
            out.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    Ok(Value::Object(out))
}

fn image_to_chat(block: &Value) -> Option<Value> {
    let src = block.get("source")?;
    let url = match s(src, "type") {
        Some("base64") => format!(
            "data:{};base64,{}",
            s(src, "media_type").unwrap_or("image/png"),
            s(src, "data").unwrap_or_default()
        ),
        Some("url") => s(src, "url")?.to_string(),
        _ => return None,
    };
    Some(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn user_to_chat(content: Option<&Value>, messages: &mut Vec<Value>) {
    let blocks = match content {
        Some(Value::String(t)) => {
            messages.push(json!({"role": "user", "content": t}));
            return;
        }
        Some(Value::Array(b)) => b,
        _ => return,
    };
    let mut parts = Vec::new();
    for b in blocks {
        match s(b, "type") {
            Some("text") => {
                let mut p = json!({"type": "text", "text": s(b, "text").unwrap_or_default()});
                cache::copy_onto(b, &mut p);
                parts.push(p);
            }
            Some("image") => parts.extend(image_to_chat(b).map(|mut p| {
                cache::copy_onto(b, &mut p);
                p
            })),
            Some("tool_result") => {
                let text = util::content_text(b.get("content"));
                // A marker on the result (or on its last content block) stays on it.
                let marked = cache::marker(b).or_else(|| match b.get("content") {
                    Some(Value::Array(c)) => c.last().and_then(cache::marker),
                    _ => None,
                });
                let content = match marked {
                    Some(c) => json!([{"type": "text", "text": text, "cache_control": c}]),
                    None => Value::from(text),
                };
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": s(b, "tool_use_id").unwrap_or_default(),
                    "content": content,
                }));
            }
            _ => {}
        }
    }
    match parts.as_slice() {
        [] => {}
        [one] if s(one, "type") == Some("text") && !cache::has(one) => {
            let t = s(one, "text").unwrap_or_default();
            messages.push(json!({"role": "user", "content": t}));
        }
        _ => messages.push(json!({"role": "user", "content": parts})),
    }
}

/// Anthropic assistant content → hub assistant message: text, `tool_calls`, reasoning
/// (`thinking`), cache markers (a marked text block keeps the content a part array). In an
/// `answer`, a `tool_use` of the structured-output tool is the answer's text.
fn assistant_to_chat(content: Option<&Value>, answer: bool) -> Value {
    let mut text = String::new();
    let mut parts: Vec<Value> = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning = (String::new(), Vec::new());
    match content {
        Some(Value::String(t)) => text.push_str(t),
        Some(Value::Array(blocks)) => {
            reasoning = thinking::blocks_to_hub(blocks);
            for b in blocks {
                match s(b, "type") {
                    Some("text") => {
                        let t = s(b, "text").unwrap_or_default();
                        text.push_str(t);
                        let mut p = json!({"type": "text", "text": t});
                        cache::copy_onto(b, &mut p);
                        parts.push(p);
                    }
                    Some("tool_use") if answer && s(b, "name") == Some(structured::JSON_TOOL) => {
                        let t = util::compact(b.get("input").unwrap_or(&json!({})));
                        text.push_str(&t);
                        parts.push(json!({"type": "text", "text": t}));
                    }
                    Some("tool_use") => {
                        let mut call = json!({
                            "id": s(b, "id").unwrap_or_default(),
                            "type": "function",
                            "function": {
                                "name": s(b, "name").unwrap_or_default(),
                                "arguments": util::compact(b.get("input").unwrap_or(&json!({}))),
                            },
                        });
                        cache::copy_onto(b, &mut call);
                        calls.push(call);
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    let mut m = Obj::new();
    m.insert("role".into(), "assistant".into());
    let content = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else if parts.iter().any(cache::has) {
        Value::Array(parts)
    } else {
        Value::from(text)
    };
    m.insert("content".into(), content);
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    thinking::set_on_message(&mut m, reasoning.0, reasoning.1);
    Value::Object(m)
}

/// Chat content parts (or string) → Anthropic content blocks.
fn chat_parts_to_blocks(content: Option<&Value>) -> Vec<Value> {
    let mut blocks = Vec::new();
    match content {
        Some(Value::String(t)) if !t.is_empty() => blocks.push(json!({"type": "text", "text": t})),
        Some(Value::Array(parts)) => {
            for p in parts {
                match s(p, "type") {
                    Some("text") | Some("input_text") | Some("output_text") => {
                        if let Some(t) = s(p, "text").filter(|t| !t.is_empty()) {
                            let mut b = json!({"type": "text", "text": t});
                            cache::copy_onto(p, &mut b);
                            blocks.push(b);
                        }
                    }
                    Some("refusal") => {
                        if let Some(t) = s(p, "refusal").filter(|t| !t.is_empty()) {
                            blocks.push(json!({"type": "text", "text": t}));
                        }
                    }
                    Some("image_url") => {
                        let url = p
                            .get("image_url")
                            .and_then(|i| s(i, "url").or_else(|| i.as_str()))
                            .unwrap_or_default();
                        let mut b = image_block(url);
                        cache::copy_onto(p, &mut b);
                        blocks.push(b);
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    blocks
}

fn image_block(url: &str) -> Value {
    match util::parse_data_url(url) {
        Some((mime, data)) => json!({"type": "image", "source": {
            "type": "base64", "media_type": mime, "data": data}}),
        None => json!({"type": "image", "source": {"type": "url", "url": url}}),
    }
}

/// Append `blocks` as a turn of `role`, merging with the previous turn when
/// it has the same role (Messages expects alternating turns).
fn push_turn(messages: &mut Vec<Value>, role: &str, blocks: Vec<Value>) {
    util::push_turn(messages, role, "content", blocks);
}

/// Hub Chat request → Messages request, model set to `model`.
pub fn chat_to_request(chat: &Value, model: &str) -> Result<Value, TranslateError> {
    let chat = util::as_object(chat)?;
    let chat_v = Value::Object(chat.clone());
    let mut out = Obj::new();
    out.insert("model".into(), model.into());
    let client_max =
        util::u(&chat_v, "max_completion_tokens").or_else(|| util::u(&chat_v, "max_tokens"));
    out.insert(
        "max_tokens".into(),
        client_max.unwrap_or(DEFAULT_MAX_TOKENS).into(),
    );
    let mut system: Vec<(String, Option<Value>)> = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for m in util::arr(&chat_v, "messages") {
        match s(m, "role") {
            Some("system") | Some("developer") => match m.get("content") {
                Some(Value::Array(parts)) => {
                    for p in parts {
                        if let Some(t) = s(p, "text").filter(|t| !t.is_empty()) {
                            system.push((t.to_string(), cache::marker(p).cloned()));
                        }
                    }
                }
                other => {
                    let t = util::content_text(other);
                    if !t.is_empty() {
                        system.push((t, cache::marker(m).cloned()));
                    }
                }
            },
            Some("user") => {
                let mut blocks = chat_parts_to_blocks(m.get("content"));
                cache::mark_last(m, &mut blocks);
                push_turn(&mut messages, "user", blocks);
            }
            Some("assistant") => {
                let mut blocks = thinking::message_blocks(m, false);
                blocks.extend(chat_parts_to_blocks(m.get("content")));
                if let Some(r) = s(m, "refusal").filter(|r| !r.is_empty()) {
                    blocks.push(json!({"type": "text", "text": r}));
                }
                for tc in arr(m, "tool_calls") {
                    let f = tc.get("function").unwrap_or(&Value::Null);
                    let mut b = json!({
                        "type": "tool_use",
                        "id": s(tc, "id").unwrap_or_default(),
                        "name": s(f, "name").unwrap_or_default(),
                        "input": util::args_object(s(f, "arguments").unwrap_or_default()),
                    });
                    cache::copy_onto(tc, &mut b);
                    blocks.push(b);
                }
                cache::mark_last(m, &mut blocks);
                push_turn(&mut messages, "assistant", blocks);
            }
            Some("tool") => {
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": s(m, "tool_call_id").unwrap_or_default(),
                    "content": util::content_text(m.get("content")),
                });
                let part_marker = match m.get("content") {
                    Some(Value::Array(parts)) => parts.iter().rev().find_map(cache::marker),
                    _ => None,
                };
                if let (Some(c), Some(o)) = (
                    part_marker.or_else(|| cache::marker(m)),
                    block.as_object_mut(),
                ) {
                    o.insert("cache_control".into(), c.clone());
                }
                push_turn(&mut messages, "user", vec![block]);
            }
            other => {
                return Err(TranslateError::new(format!(
                    "unsupported message role {:?}",
                    other.unwrap_or("<missing>")
                )))
            }
        }
    }
    if system.iter().any(|(_, c)| c.is_some()) {
        let blocks: Vec<Value> = system
            .into_iter()
            .map(|(t, c)| {
                let mut b = json!({"type": "text", "text": t});
                if let (Some(c), Some(o)) = (c, b.as_object_mut()) {
                    o.insert("cache_control".into(), c);
                }
                b
            })
            .collect();
        out.insert("system".into(), Value::Array(blocks));
    } else {
        match system.len() {
            0 => {}
            1 => {
                let text: String = system.into_iter().map(|(t, _)| t).collect();
                out.insert("system".into(), text.into());
            }
            _ => {
                let blocks: Vec<Value> = system
                    .iter()
                    .map(|(t, _)| json!({"type": "text", "text": t}))
                    .collect();
                out.insert("system".into(), Value::Array(blocks));
            }
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    match chat_v.get("stop") {
        Some(Value::String(st)) => {
            out.insert("stop_sequences".into(), json!([st]));
        }
        Some(v @ Value::Array(_)) => {
            out.insert("stop_sequences".into(), v.clone());
        }
        _ => {}
    }
    util::copy(&chat_v, "temperature", &mut out, "temperature");
    util::copy(&chat_v, "top_p", &mut out, "top_p");
    util::copy(&chat_v, "top_k", &mut out, "top_k");
    util::copy(&chat_v, "stream", &mut out, "stream");
    if let Some(user) = s(&chat_v, "user") {
        out.insert("metadata".into(), json!({"user_id": user}));
    }
    match s(&chat_v, "service_tier") {
        Some("auto") => {
            out.insert("service_tier".into(), "auto".into());
        }
        Some("default") => {
            out.insert("service_tier".into(), "standard_only".into());
        }
        _ => {}
    }
    let mut tools: Vec<Value> = Vec::new();
    for t in arr(&chat_v, "tools") {
        if s(t, "type").unwrap_or("function") != "function" {
            continue;
        }
        structured::check_tool_name(t.get("function").and_then(|f| s(f, "name")))?;
        tools.extend(structured::anthropic_tool(t));
    }
    let client_tools = !tools.is_empty();
    let mut choice: Option<Map<String, Value>> = match chat_v.get("tool_choice") {
        Some(Value::String(c)) => match c.as_str() {
            "auto" => Some(json_obj(json!({"type": "auto"}))),
            "required" => Some(json_obj(json!({"type": "any"}))),
            "none" => Some(json_obj(json!({"type": "none"}))),
            _ => None,
        },
        Some(v @ Value::Object(_)) => v
            .get("function")
            .and_then(|f| s(f, "name"))
            .map(|n| json_obj(json!({"type": "tool", "name": n}))),
        _ => None,
    };
    let answer_tool = structured::anthropic_answer_tool(&chat_v, client_tools)?;
    let structured_output = answer_tool.is_some();
    if let Some((tool, forced)) = answer_tool {
        if choice.as_ref().and_then(|c| c.get("type")) == Some(&json!("none")) {
            tools.clear(); // `none`: the client's tools are not called; the answer tool is
        }
        tools.push(tool);
        if !matches!(choice.as_ref().and_then(|c| s_obj(c, "type")), Some("tool")) {
            choice = Some(json_obj(forced));
        }
    }
    let has_tools = !tools.is_empty();
    if has_tools {
        out.insert("tools".into(), Value::Array(tools));
    }
    if chat_v.get("parallel_tool_calls").and_then(Value::as_bool) == Some(false) && has_tools {
        let c = choice.get_or_insert_with(|| json_obj(json!({"type": "auto"})));
        c.insert("disable_parallel_tool_use".into(), true.into());
    }
    let forced = matches!(
        choice.as_ref().and_then(|c| s_obj(c, "type")),
        Some("any" | "tool")
    );
    if let Some(c) = choice {
        if has_tools || s_obj(&c, "type") == Some("none") {
            out.insert("tool_choice".into(), Value::Object(c));
        }
    }
    // Thinking, where Anthropic accepts it: not with a forced tool (structured output wins),
    // not when the last tool-calling assistant turn lost its thinking blocks (Anthropic
    // refuses such a history), and without sampling overrides (refused with thinking).
    let effort = s(&chat_v, "reasoning_effort");
    let history_ok = arr(&chat_v, "messages")
        .iter()
        .rev()
        .find(|m| s(m, "role") == Some("assistant"))
        .is_none_or(|m| arr(m, "tool_calls").is_empty() || m.get("thinking_blocks").is_some());
    if let Some(e) = effort.filter(|_| !forced && !structured_output && history_ok) {
        if let Some((t, max)) = thinking::effort_to_thinking(e, client_max, DEFAULT_MAX_TOKENS) {
            out.insert("thinking".into(), t);
            out.insert("max_tokens".into(), max.into());
            for k in ["temperature", "top_p", "top_k"] {
                out.remove(k);
            }
        }
    }
    Ok(Value::Object(out))
}

fn s_obj<'a>(o: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    o.get(key).and_then(Value::as_str)
}

fn json_obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

// --------------------------------------------------------------- responses

/// Anthropic usage object → hub usage.
pub(crate) fn usage_to_hub(u: &Value) -> crate::dialect::Usage {
    let input = util::u(u, "input_tokens");
    let read = util::u(u, "cache_read_input_tokens");
    let create = util::u(u, "cache_creation_input_tokens").unwrap_or(0);
    crate::dialect::Usage {
        prompt_tokens: input.map(|i| i.saturating_add(read.unwrap_or(0)).saturating_add(create)),
        completion_tokens: util::u(u, "output_tokens"),
        cached_tokens: read,
    }
}

/// Hub usage → Anthropic usage object.
pub(crate) fn usage_from_hub(u: &crate::dialect::Usage) -> Value {
    let cached = u.cached_tokens.unwrap_or(0);
    let mut o = Obj::new();
    o.insert(
        "input_tokens".into(),
        u.prompt_tokens.unwrap_or(0).saturating_sub(cached).into(),
    );
    if u.cached_tokens.is_some() {
        o.insert("cache_read_input_tokens".into(), cached.into());
    }
    o.insert(
        "output_tokens".into(),
        u.completion_tokens.unwrap_or(0).into(),
    );
    Value::Object(o)
}

/// Messages response body → hub Chat completion.
pub fn response_to_chat(body: &[u8]) -> Result<Value, TranslateError> {
    let resp = util::parse_object(body)?;
    let message = assistant_to_chat(resp.get("content"), true);
    let mut finish = stop_to_finish(s(&resp, "stop_reason").unwrap_or("end_turn"));
    if finish == "tool_calls" && message.get("tool_calls").is_none() {
        finish = "stop"; // the structured-output tool was the answer
    }
    let usage = usage_to_hub(resp.get("usage").unwrap_or(&Value::Null));
    let (id, model) = (s(&resp, "id").unwrap_or("msg"), s(&resp, "model"));
    Ok(util::completion(
        id,
        0,
        model.unwrap_or_default(),
        message,
        finish,
        &usage,
    ))
}

/// Hub Chat completion → Messages response body.
pub fn chat_to_response(chat: &Value, client_model: &str) -> Result<Value, TranslateError> {
    let (choice, msg) = util::first_message(chat)?;
    let mut content = thinking::message_blocks(msg, true);
    content.extend(chat_parts_to_blocks(msg.get("content")));
    if let Some(r) = s(msg, "refusal").filter(|r| !r.is_empty()) {
        content.push(json!({"type": "text", "text": r}));
    }
    for tc in arr(msg, "tool_calls") {
        let f = tc.get("function").unwrap_or(&Value::Null);
        content.push(json!({
            "type": "tool_use",
            "id": s(tc, "id").unwrap_or_default(),
            "name": s(f, "name").unwrap_or_default(),
            "input": util::args_object(s(f, "arguments").unwrap_or_default()),
        }));
    }
    let stop = finish_to_stop(s(choice, "finish_reason").unwrap_or("stop"));
    let usage = util::read_chat_usage(chat.get("usage").unwrap_or(&Value::Null));
    Ok(json!({
        "id": s(chat, "id").unwrap_or("msg"),
        "type": "message",
        "role": "assistant",
        "model": client_model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage_from_hub(&usage),
    }))
}

#[cfg(test)]
mod tests;
