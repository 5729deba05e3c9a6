//! OpenAI Responses ⇄ Chat Completions (requests and non-stream
//! responses); its stream decoder and encoder are in `stream.rs`.
//!
//! Must not: perform IO, or allocate beyond the values it returns.
//!
//! Mapping notes:
//! * `instructions` ⇄ Chat `system` messages (several are joined with a
//!   blank line); `input` string ⇄ one user message; input items
//!   `message` / `function_call` / `function_call_output` ⇄ user/assistant
//!   messages, assistant `tool_calls`, `role: tool` messages.
//! * `input_image.image_url` ⇄ Chat `image_url.url` (data: or https URL).
//! * `max_output_tokens` ⇄ `max_tokens` (or `max_completion_tokens`).
//! * `text.format` ⇄ `response_format`; `reasoning.effort` ⇄
//!   `reasoning_effort`; `service_tier`, `metadata` ⇄ the same Chat fields;
//!   `tool_choice` `allowed_tools` ⇄ Chat's `allowed_tools`.
//! * Reasoning (see `thinking`): input `reasoning` items (their reasoning
//!   text, else their summary) → `reasoning_content` of the next assistant
//!   turn; output `reasoning` items ⇄ `reasoning_content` (a `reasoning` item
//!   with `reasoning_text` content, before the message).
//! * Response `status: incomplete` + `incomplete_details.reason:
//!   max_output_tokens` ⇄ `finish_reason: length`; any `function_call`
//!   output ⇄ `tool_calls`.
//!
//! Deliberately dropped or rejected:
//!
//! | direction | field | handling |
//! |---|---|---|
//! | Responses → Chat | `previous_response_id`, `item_reference` items | expanded from the gateway's Responses store before translation (`references`, `responses_state`); rejected here when they arrive unexpanded (store off) |
//! | Responses → Chat | `conversation` | rejected: stateful (OpenAI-side conversations), cannot be translated |
//! | Responses → Chat | non-function tools (`web_search`, `file_search`, …) | rejected |
//! | Responses → Chat | `store`, `include`, `truncation`, `background`, `prompt`, `prompt_cache_key`, `safety_identifier`, `reasoning.summary`, `max_tool_calls`, `input_file` parts, reasoning `encrypted_content` | dropped |
//! | Chat → Responses | `n` > 1 | rejected (`translate::chat_to_request`) |
//! | Chat → Responses | `stop`, `presence_penalty`, `frequency_penalty`, `logit_bias`, `logprobs`, `seed`, `stream_options`, `audio`, `modalities`, `prediction`, assistant `reasoning_content` (a reasoning item needs the upstream's own id) | dropped |
//! | responses | Chat `logprobs`, `system_fingerprint`; Responses annotations, `reasoning_tokens` | dropped |

use crate::dialect::util::{self, arr, s, Obj};
use crate::dialect::TranslateError;
use crate::dialect::Wire;
use crate::dialect::{cache, chat, thinking, Dialect};
use crate::dialect::{Decoder, Encoder};
use crate::error::ErrorShape;
use serde_json::{json, Value};

pub(crate) mod stream;

/// OpenAI Responses' wire facts.
pub static WIRE: Wire = Wire {
    dialect: Dialect::Responses,
    name: "responses",
    error_shape: ErrorShape::OpenAi,
    error_type: chat::error_type,
    error_code: chat::error_code,
    error_event: Some("error"),
    terminal_events: &[
        "response.completed",
        "response.incomplete",
        "response.failed",
    ],
    terminal_data: None,
    terminal_key: None,
    usage_at: &[&["response", "usage"]],
    usage_to_hub,
    request_to_chat,
    chat_to_request,
    response_to_chat,
    chat_to_response,
    decoder: || Decoder::Responses(Default::default()),
    encoder: |model| Encoder::Responses(stream::ResponsesOut::new(model)),
};

/// The Responses `error.code` of an error event for an HTTP status.
pub(crate) fn error_code(status: u16) -> &'static str {
    match status {
        429 => "rate_limit_exceeded",
        _ => "server_error",
    }
}
// ---------------------------------------------------------------- requests

fn part_to_chat(p: &Value) -> Option<Value> {
    match s(p, "type") {
        Some("input_text") | Some("output_text") | Some("text") => {
            let mut part = json!({"type": "text", "text": s(p, "text").unwrap_or_default()});
            cache::copy_onto(p, &mut part);
            Some(part)
        }
        Some("refusal") => {
            Some(json!({"type": "text", "text": s(p, "refusal").unwrap_or_default()}))
        }
        Some("input_image") => {
            let url = p
                .get("image_url")
                .and_then(|u| u.as_str().or_else(|| s(u, "url")))?;
            let mut img = Obj::new();
            img.insert("url".into(), url.into());
            util::copy(p, "detail", &mut img, "detail");
            Some(json!({"type": "image_url", "image_url": img}))
        }
        _ => None,
    }
}

fn message_to_chat(item: &Value) -> Result<Value, TranslateError> {
    let role = match s(item, "role") {
        Some("developer") => "system",
        Some(r @ ("user" | "assistant" | "system")) => r,
        other => {
            return Err(TranslateError::new(format!(
                "unsupported input role {:?}",
                other.unwrap_or("<missing>")
            )))
        }
    };
    let content = match item.get("content") {
        Some(Value::String(t)) => Value::from(t.as_str()),
        Some(Value::Array(parts)) => {
            let parts: Vec<Value> = parts.iter().filter_map(part_to_chat).collect();
            let all_text = parts.iter().all(|p| s(p, "type") == Some("text"));
            let marked = parts.iter().any(cache::has);
            if !marked && (role != "user" || (all_text && parts.len() == 1) || parts.is_empty()) {
                Value::from(util::content_text(Some(&Value::Array(parts))))
            } else {
                Value::Array(parts)
            }
        }
        _ => Value::from(""),
    };
    Ok(json!({"role": role, "content": content}))
}

/// Append a tool call to the trailing assistant message, creating it if the
/// last message is not an assistant turn.
fn push_call(messages: &mut Vec<Value>, call: Value) {
    if let Some(last) = messages.last_mut() {
        if s(last, "role") == Some("assistant") {
            if let Some(m) = last.as_object_mut() {
                let calls = m.entry("tool_calls").or_insert_with(|| json!([]));
                if let Some(a) = calls.as_array_mut() {
                    a.push(call);
                    if m.get("content") == Some(&Value::from("")) {
                        m.insert("content".into(), Value::Null);
                    }
                    return;
                }
            }
        }
    }
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
}

/// Request fields Chat and Responses name alike, copied as they are in both directions.
const SAME_NAMED: [&str; 7] = [
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "stream",
    "service_tier",
    "metadata",
];

/// Responses request body → hub Chat request.
pub fn request_to_chat(body: &[u8]) -> Result<Value, TranslateError> {
    let req = util::parse_object(body)?;
    for key in ["previous_response_id", "conversation"] {
        if req.get(key).is_some_and(|v| !v.is_null()) {
            return Err(TranslateError::new(format!(
                "`{key}` cannot be translated to another provider"
            )));
        }
    }
    let mut out = Obj::new();
    util::copy(&req, "model", &mut out, "model");
    let mut messages = Vec::new();
    if let Some(i) = s(&req, "instructions").filter(|i| !i.is_empty()) {
        messages.push(json!({"role": "system", "content": i}));
    }
    // Reasoning items (their summary and reasoning text) go on the next assistant turn.
    let mut reasoning = String::new();
    match req.get("input") {
        Some(Value::String(t)) => messages.push(json!({"role": "user", "content": t})),
        Some(Value::Array(items)) => {
            for item in items {
                match s(item, "type") {
                    None | Some("message") => messages.push(message_to_chat(item)?),
                    Some("function_call") => push_call(
                        &mut messages,
                        json!({
                            "id": s(item, "call_id").unwrap_or_default(),
                            "type": "function",
                            "function": {
                                "name": s(item, "name").unwrap_or_default(),
                                "arguments": s(item, "arguments").unwrap_or_default(),
                            },
                        }),
                    ),
                    Some("function_call_output") => {
                        let output = match item.get("output") {
                            Some(Value::String(t)) => t.clone(),
                            other => util::content_text(other),
                        };
                        messages.push(json!({
                            "role": "tool",
                            "tool_call_id": s(item, "call_id").unwrap_or_default(),
                            "content": output,
                        }));
                    }
                    Some("reasoning") => reasoning.push_str(&reasoning_item_text(item)),
                    Some(other) => {
                        return Err(TranslateError::new(format!(
                            "input item type `{other}` cannot be translated"
                        )))
                    }
                }
                if reasoning.is_empty() || s(item, "type") == Some("reasoning") {
                    continue;
                }
                if let Some(m) = messages.last_mut().and_then(Value::as_object_mut) {
                    if m.get("role").and_then(Value::as_str) == Some("assistant") {
                        let text = std::mem::take(&mut reasoning);
                        m.entry("reasoning_content").or_insert(Value::from(text));
                    }
                }
            }
        }
        _ => return Err(TranslateError::new("`input` must be a string or an array")),
    }
    out.insert("messages".into(), Value::Array(messages));
    util::copy(&req, "max_output_tokens", &mut out, "max_tokens");
    for k in SAME_NAMED {
        util::copy(&req, k, &mut out, k);
    }
    if req.get("stream").and_then(Value::as_bool) == Some(true) {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(e) = req.get("reasoning").and_then(|r| s(r, "effort")) {
        out.insert("reasoning_effort".into(), e.into());
    }
    if let Some(fmt) = req.get("text").and_then(|t| t.get("format")) {
        match s(fmt, "type") {
            Some("json_object") => {
                out.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let mut js = Obj::new();
                for k in ["name", "description", "schema", "strict"] {
                    util::copy(fmt, k, &mut js, k);
                }
                out.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": js}),
                );
            }
            _ => {}
        }
    }
    let mut tools = Vec::new();
    for t in arr(&req, "tools") {
        if s(t, "type") != Some("function") {
            return Err(TranslateError::new(format!(
                "tool type `{}` cannot be translated",
                s(t, "type").unwrap_or("<missing>")
            )));
        }
        let mut f = Obj::new();
        for k in ["name", "description", "parameters", "strict"] {
            util::copy(t, k, &mut f, k);
        }
        let mut tool = json!({"type": "function", "function": f});
        cache::copy_onto(t, &mut tool);
        tools.push(tool);
    }
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
    }
    match req.get("tool_choice") {
        Some(Value::String(c)) => {
            out.insert("tool_choice".into(), c.as_str().into());
        }
        Some(c @ Value::Object(_)) if s(c, "type") == Some("function") => {
            let name = s(c, "name").unwrap_or_default();
            out.insert(
                "tool_choice".into(),
                json!({"type": "function", "function": {"name": name}}),
            );
        }
        Some(c @ Value::Object(_)) if s(c, "type") == Some("allowed_tools") => {
            let tools: Vec<Value> = arr(c, "tools")
                .iter()
                .filter_map(|t| s(t, "name"))
                .map(|n| json!({"type": "function", "function": {"name": n}}))
                .collect();
            out.insert(
                "tool_choice".into(),
                json!({"type": "allowed_tools", "allowed_tools": {
                    "mode": s(c, "mode").unwrap_or("auto"), "tools": tools}}),
            );
        }
        _ => {}
    }
    Ok(Value::Object(out))
}

/// The text of a Responses `reasoning` item: its reasoning text, else its summary.
fn reasoning_item_text(item: &Value) -> String {
    let text: String = arr(item, "content")
        .iter()
        .filter_map(|c| s(c, "text"))
        .collect();
    if !text.is_empty() {
        return text;
    }
    let summary: Vec<&str> = arr(item, "summary")
        .iter()
        .filter_map(|c| s(c, "text"))
        .collect();
    summary.join("\n\n")
}

fn chat_content_to_input(content: Option<&Value>, assistant: bool) -> Value {
    let text_type = if assistant {
        "output_text"
    } else {
        "input_text"
    };
    match content {
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for p in parts {
                match s(p, "type") {
                    Some("text") => out
                        .push(json!({"type": text_type, "text": s(p, "text").unwrap_or_default()})),
                    Some("image_url") if !assistant => {
                        let img = p.get("image_url").unwrap_or(&Value::Null);
                        let url = s(img, "url").or_else(|| img.as_str()).unwrap_or_default();
                        let mut part = Obj::new();
                        part.insert("type".into(), "input_image".into());
                        part.insert("image_url".into(), url.into());
                        part.insert("detail".into(), s(img, "detail").unwrap_or("auto").into());
                        out.push(Value::Object(part));
                    }
                    _ => {}
                }
            }
            Value::Array(out)
        }
        other => {
            let t = util::content_text(other);
            if assistant {
                json!([{"type": "output_text", "text": t}])
            } else {
                Value::from(t)
            }
        }
    }
}

/// Hub Chat request → Responses request, model set to `model`.
pub fn chat_to_request(chat: &Value, model: &str) -> Result<Value, TranslateError> {
    util::as_object(chat)?;
    let mut out = Obj::new();
    out.insert("model".into(), model.into());
    let mut instructions = Vec::new();
    let mut input = Vec::new();
    for m in arr(chat, "messages") {
        match s(m, "role") {
            Some("system") | Some("developer") => {
                let t = util::content_text(m.get("content"));
                if !t.is_empty() {
                    instructions.push(t);
                }
            }
            Some("user") => input.push(json!({
                "role": "user",
                "content": chat_content_to_input(m.get("content"), false),
            })),
            Some("assistant") => {
                let text = util::content_text(m.get("content"));
                if !text.is_empty() {
                    input.push(json!({
                        "type": "message",
                        "role": "assistant",
                        "content": chat_content_to_input(m.get("content"), true),
                    }));
                }
                for tc in arr(m, "tool_calls") {
                    let f = tc.get("function").unwrap_or(&Value::Null);
                    input.push(json!({
                        "type": "function_call",
                        "call_id": s(tc, "id").unwrap_or_default(),
                        "name": s(f, "name").unwrap_or_default(),
                        "arguments": s(f, "arguments").unwrap_or_default(),
                    }));
                }
            }
            Some("tool") => input.push(json!({
                "type": "function_call_output",
                "call_id": s(m, "tool_call_id").unwrap_or_default(),
                "output": util::content_text(m.get("content")),
            })),
            other => {
                return Err(TranslateError::new(format!(
                    "unsupported message role {:?}",
                    other.unwrap_or("<missing>")
                )))
            }
        }
    }
    if !instructions.is_empty() {
        out.insert("instructions".into(), instructions.join("\n\n").into());
    }
    out.insert("input".into(), Value::Array(input));
    let max = util::u(chat, "max_completion_tokens").or_else(|| util::u(chat, "max_tokens"));
    if let Some(m) = max {
        out.insert("max_output_tokens".into(), m.into());
    }
    for k in SAME_NAMED {
        util::copy(chat, k, &mut out, k);
    }
    if let Some(e) = s(chat, "reasoning_effort") {
        out.insert("reasoning".into(), json!({"effort": e}));
    }
    if let Some(rf) = chat.get("response_format") {
        match s(rf, "type") {
            Some("json_object") => {
                out.insert("text".into(), json!({"format": {"type": "json_object"}}));
            }
            Some("json_schema") => {
                let mut f = Obj::new();
                f.insert("type".into(), "json_schema".into());
                let js = rf.get("json_schema").unwrap_or(&Value::Null);
                for k in ["name", "description", "schema", "strict"] {
                    util::copy(js, k, &mut f, k);
                }
                out.insert("text".into(), json!({"format": f}));
            }
            _ => {}
        }
    }
    let tools: Vec<Value> = arr(chat, "tools")
        .iter()
        .filter_map(|t| t.get("function"))
        .map(|f| {
            let mut t = Obj::new();
            t.insert("type".into(), "function".into());
            for k in ["name", "description", "parameters", "strict"] {
                util::copy(f, k, &mut t, k);
            }
            Value::Object(t)
        })
        .collect();
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
    }
    match chat.get("tool_choice") {
        Some(Value::String(c)) => {
            out.insert("tool_choice".into(), c.as_str().into());
        }
        Some(c @ Value::Object(_)) if s(c, "type") == Some("allowed_tools") => {
            let at = c.get("allowed_tools").unwrap_or(c);
            let tools: Vec<Value> = arr(at, "tools")
                .iter()
                .filter_map(|t| t.get("function").and_then(|f| s(f, "name")))
                .map(|n| json!({"type": "function", "name": n}))
                .collect();
            out.insert(
                "tool_choice".into(),
                json!({"type": "allowed_tools", "mode": s(at, "mode").unwrap_or("auto"),
                    "tools": tools}),
            );
        }
        Some(c @ Value::Object(_)) => {
            if let Some(n) = c.get("function").and_then(|f| s(f, "name")) {
                out.insert("tool_choice".into(), json!({"type": "function", "name": n}));
            }
        }
        _ => {}
    }
    Ok(Value::Object(out))
}

// --------------------------------------------------------------- responses

/// Responses usage object → hub usage.
pub(crate) fn usage_to_hub(u: &Value) -> crate::dialect::Usage {
    crate::dialect::Usage {
        prompt_tokens: util::u(u, "input_tokens"),
        completion_tokens: util::u(u, "output_tokens"),
        cached_tokens: u
            .get("input_tokens_details")
            .and_then(|d| util::u(d, "cached_tokens")),
    }
}

/// Hub usage → Responses usage object.
pub(crate) fn usage_from_hub(u: &crate::dialect::Usage) -> Value {
    let i = u.prompt_tokens.unwrap_or(0);
    let o = u.completion_tokens.unwrap_or(0);
    json!({
        "input_tokens": i,
        "input_tokens_details": {"cached_tokens": u.cached_tokens.unwrap_or(0)},
        "output_tokens": o,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": i.saturating_add(o),
    })
}

/// Chat `finish_reason` for a finished Responses object.
pub(crate) fn finish_of(
    status: Option<&str>,
    reason: Option<&str>,
    has_calls: bool,
) -> &'static str {
    if has_calls {
        return "tool_calls";
    }
    match (status, reason) {
        (Some("incomplete"), Some("content_filter")) => "content_filter",
        (Some("incomplete"), _) => "length",
        _ => "stop",
    }
}

/// Responses response body → hub Chat completion.
pub fn response_to_chat(body: &[u8]) -> Result<Value, TranslateError> {
    let resp = util::parse_object(body)?;
    let mut text = String::new();
    let mut refusal = String::new();
    let mut calls = Vec::new();
    let mut reasoning = String::new();
    for item in arr(&resp, "output") {
        match s(item, "type") {
            Some("reasoning") => reasoning.push_str(&reasoning_item_text(item)),
            Some("message") => {
                for p in arr(item, "content") {
                    match s(p, "type") {
                        Some("output_text") => text.push_str(s(p, "text").unwrap_or_default()),
                        Some("refusal") => refusal.push_str(s(p, "refusal").unwrap_or_default()),
                        _ => {}
                    }
                }
            }
            Some("function_call") => calls.push(json!({
                "id": s(item, "call_id").unwrap_or_default(),
                "type": "function",
                "function": {
                    "name": s(item, "name").unwrap_or_default(),
                    "arguments": s(item, "arguments").unwrap_or_default(),
                },
            })),
            _ => {}
        }
    }
    let reason = resp.get("incomplete_details").and_then(|d| s(d, "reason"));
    let finish = finish_of(s(&resp, "status"), reason, !calls.is_empty());
    let mut message = util::assistant(text, !calls.is_empty());
    if !refusal.is_empty() {
        message.insert("refusal".into(), refusal.into());
    }
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    thinking::set_on_message(&mut message, reasoning, Vec::new());
    let usage = usage_to_hub(resp.get("usage").unwrap_or(&Value::Null));
    let (id, model) = (s(&resp, "id").unwrap_or("resp"), s(&resp, "model"));
    let created = util::u(&resp, "created_at").unwrap_or(0);
    let model = model.unwrap_or_default();
    Ok(util::completion(
        id,
        created,
        model,
        message.into(),
        finish,
        &usage,
    ))
}

/// Response id derived from a hub id (`resp_` prefix).
pub(crate) fn resp_id(id: &str) -> String {
    if id.starts_with("resp_") {
        id.to_string()
    } else {
        format!("resp_{id}")
    }
}

/// Hub Chat completion → Responses response body.
pub fn chat_to_response(chat: &Value, client_model: &str) -> Result<Value, TranslateError> {
    let (choice, msg) = util::first_message(chat)?;
    let id = resp_id(s(chat, "id").unwrap_or("ringgate"));
    let mut output = Vec::new();
    if let Some(r) = thinking::reasoning_text(msg) {
        output.push(json!({
            "type": "reasoning",
            "id": format!("rs_{}", id.trim_start_matches("resp_")),
            "summary": [],
            "content": [{"type": "reasoning_text", "text": r}],
            "status": "completed",
        }));
    }
    let text = util::content_text(msg.get("content"));
    let mut parts = Vec::new();
    if !text.is_empty() {
        parts.push(json!({"type": "output_text", "text": text, "annotations": []}));
    }
    if let Some(r) = s(msg, "refusal").filter(|r| !r.is_empty()) {
        parts.push(json!({"type": "refusal", "refusal": r}));
    }
    if !parts.is_empty() {
        output.push(json!({
            "type": "message",
            "id": format!("msg_{}", id.trim_start_matches("resp_")),
            "status": "completed",
            "role": "assistant",
            "content": parts,
        }));
    }
    for tc in arr(msg, "tool_calls") {
        let f = tc.get("function").unwrap_or(&Value::Null);
        let call_id = s(tc, "id").unwrap_or_default();
        output.push(json!({
            "type": "function_call",
            "id": format!("fc_{call_id}"),
            "call_id": call_id,
            "name": s(f, "name").unwrap_or_default(),
            "arguments": s(f, "arguments").unwrap_or_default(),
            "status": "completed",
        }));
    }
    let finish = s(choice, "finish_reason").unwrap_or("stop");
    let (status, details) = match finish {
        "length" => ("incomplete", json!({"reason": "max_output_tokens"})),
        "content_filter" => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    };
    let usage = util::read_chat_usage(chat.get("usage").unwrap_or(&Value::Null));
    Ok(json!({
        "id": id,
        "object": "response",
        "created_at": util::u(chat, "created").unwrap_or(0),
        "status": status,
        "error": null,
        "incomplete_details": details,
        "model": client_model,
        "output": output,
        "usage": usage_from_hub(&usage),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_input_and_instructions() {
        let hub = request_to_chat(
            br#"{"model":"m","instructions":"sys","input":"hi","max_output_tokens":9}"#,
        )
        .unwrap();
        assert_eq!(hub["messages"][0], json!({"role":"system","content":"sys"}));
        assert_eq!(hub["messages"][1], json!({"role":"user","content":"hi"}));
        assert_eq!(hub["max_tokens"], 9);
    }

    #[test]
    fn function_call_items_group() {
        let body = br#"{"model":"m","input":[{"role":"user","content":"x"},
            {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
            {"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"r1"}]}"#;
        let hub = request_to_chat(body).unwrap();
        let msgs = hub["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[1]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(msgs[2]["tool_call_id"], "c1");
    }

    #[test]
    fn stateful_rejected() {
        assert!(request_to_chat(br#"{"input":"x","previous_response_id":"r"}"#).is_err());
        assert!(request_to_chat(br#"{"input":"x","tools":[{"type":"web_search"}]}"#).is_err());
    }

    #[test]
    fn incomplete_is_length() {
        let hub = response_to_chat(br#"{"id":"r","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[]}"#).unwrap();
        assert_eq!(hub["choices"][0]["finish_reason"], "length");
        let back = chat_to_response(&hub, "m").unwrap();
        assert_eq!(back["status"], "incomplete");
        assert_eq!(back["incomplete_details"]["reason"], "max_output_tokens");
    }
}
