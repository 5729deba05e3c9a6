//! AWS Bedrock Converse ↔ the hub (Chat Completions): requests out, whole answers back; the
//! stream's events are in `converse_stream`. Converse is an upstream dialect only (no client
//! speaks it), so it converts at the hub's edge: a Converse answer becomes a hub Chat answer,
//! which the client's own converter writes as usual.
//!
//! Mapped: system and developer messages → `system[]`; user text and `data:` images →
//! `text` / `image` blocks (`png`, `jpeg`, `gif`, `webp` as base64 bytes); assistant text and
//! `tool_calls` → `text` / `toolUse` blocks (`input` the parsed arguments); tool messages →
//! `toolResult` blocks in a user turn (a JSON object result as `json`, else `text`); turns of
//! one role merged (Converse alternates roles); tools → `toolConfig.tools[].toolSpec`,
//! `tool_choice` `auto` / `required` (`any`) / a named function (`tool`); `max_tokens`,
//! `temperature`, `top_p`, `stop` → `inferenceConfig`; `top_k` →
//! `additionalModelRequestFields.top_k`. Back: `text`, `toolUse` (arguments serialised),
//! `reasoningContent` (`reasoning_content`), the stop reason (`end_turn` / `stop_sequence` →
//! `stop`, `tool_use` → `tool_calls`, `max_tokens` / `model_context_window_exceeded` →
//! `length`, `guardrail_intervened` / `content_filtered` → `content_filter`) and usage (prompt
//! tokens = input + cache read + cache write; cached = cache read).
//!
//! Refused (400): an image by `http(s)` URL (Converse takes bytes or S3 only), an image type
//! other than the four, `n` > 1 (checked by the caller). Dropped: `tool_choice: "none"` (Converse
//! has no such choice: the tools stay offered), penalties, seed, logprobs, response_format.
//!
//! Owns: the Converse request and response shapes. Must not: do IO, read clocks (the caller
//! passes the answer's id and creation time), or log.

use serde_json::{json, Value};

use crate::dialect::util::{self, arr, s, Obj};
use crate::dialect::TranslateError;

pub mod stream;

/// Hub Chat request → Converse request body (the model id goes in the URL, not the body).
pub fn chat_to_request(chat: &Value) -> Result<Vec<u8>, TranslateError> {
    util::as_object(chat)?;
    let mut out = Obj::new();
    let mut system = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for m in arr(chat, "messages") {
        match s(m, "role") {
            Some("system") | Some("developer") => {
                let t = util::content_text(m.get("content"));
                if !t.is_empty() {
                    system.push(json!({ "text": t }));
                }
            }
            Some("user") => {
                let blocks = user_blocks(m.get("content"))?;
                push_turn(&mut messages, "user", blocks);
            }
            Some("assistant") => {
                let mut blocks = Vec::new();
                if let Some(r) = s(m, "reasoning_content").filter(|r| !r.is_empty()) {
                    blocks.push(json!({"reasoningContent": {"reasoningText": {"text": r}}}));
                }
                let text = util::content_text(m.get("content"));
                if !text.is_empty() {
                    blocks.push(json!({ "text": text }));
                }
                for tc in arr(m, "tool_calls") {
                    let f = tc.get("function").unwrap_or(&Value::Null);
                    let input = util::args_object(s(f, "arguments").unwrap_or_default());
                    blocks.push(json!({"toolUse": {
                        "toolUseId": s(tc, "id").unwrap_or_default(),
                        "name": s(f, "name").unwrap_or_default(),
                        "input": input,
                    }}));
                }
                push_turn(&mut messages, "assistant", blocks);
            }
            Some("tool") => {
                let text = util::content_text(m.get("content"));
                let content = match serde_json::from_str::<Value>(&text) {
                    Ok(v @ Value::Object(_)) => json!([{ "json": v }]),
                    _ => json!([{ "text": text }]),
                };
                let block = json!({"toolResult": {
                    "toolUseId": s(m, "tool_call_id").unwrap_or_default(),
                    "content": content,
                }});
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
    out.insert("messages".into(), Value::Array(messages));
    if !system.is_empty() {
        out.insert("system".into(), Value::Array(system));
    }
    let mut inf = Obj::new();
    let max = util::u(chat, "max_completion_tokens").or_else(|| util::u(chat, "max_tokens"));
    if let Some(m) = max {
        inf.insert("maxTokens".into(), m.into());
    }
    util::copy(chat, "temperature", &mut inf, "temperature");
    util::copy(chat, "top_p", &mut inf, "topP");
    match chat.get("stop") {
        Some(Value::String(st)) => {
            inf.insert("stopSequences".into(), json!([st]));
        }
        Some(v @ Value::Array(_)) => {
            inf.insert("stopSequences".into(), v.clone());
        }
        _ => {}
    }
    if !inf.is_empty() {
        out.insert("inferenceConfig".into(), Value::Object(inf));
    }
    let tools: Vec<Value> = arr(chat, "tools")
        .iter()
        .filter_map(|t| t.get("function"))
        .map(|f| {
            let mut spec = Obj::new();
            util::copy(f, "name", &mut spec, "name");
            if s(f, "description").is_some_and(|d| !d.is_empty()) {
                util::copy(f, "description", &mut spec, "description");
            }
            let schema = f
                .get("parameters")
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            spec.insert("inputSchema".into(), json!({ "json": schema }));
            json!({ "toolSpec": Value::Object(spec) })
        })
        .collect();
    if !tools.is_empty() {
        let mut tc = Obj::new();
        tc.insert("tools".into(), Value::Array(tools));
        let choice = match chat.get("tool_choice") {
            Some(Value::String(c)) if c == "required" => Some(json!({"any": {}})),
            Some(Value::String(c)) if c == "auto" => Some(json!({"auto": {}})),
            Some(c @ Value::Object(_)) => c
                .get("function")
                .and_then(|f| s(f, "name"))
                .map(|n| json!({"tool": {"name": n}})),
            _ => None,
        };
        if let Some(c) = choice {
            tc.insert("toolChoice".into(), c);
        }
        out.insert("toolConfig".into(), Value::Object(tc));
    }
    if let Some(k) = chat.get("top_k").filter(|k| k.is_number()) {
        out.insert(
            "additionalModelRequestFields".into(),
            json!({ "top_k": k.clone() }),
        );
    }
    util::to_bytes(&Value::Object(out))
}

/// The content blocks of a user message (text parts and `data:` images).
fn user_blocks(content: Option<&Value>) -> Result<Vec<Value>, TranslateError> {
    let Some(Value::Array(parts)) = content else {
        let t = util::content_text(content);
        return Ok(if t.is_empty() {
            Vec::new()
        } else {
            vec![json!({ "text": t })]
        });
    };
    let mut blocks = Vec::with_capacity(parts.len());
    for p in parts {
        match s(p, "type") {
            Some("text") | Some("input_text") => {
                if let Some(t) = s(p, "text").filter(|t| !t.is_empty()) {
                    blocks.push(json!({ "text": t }));
                }
            }
            Some("image_url") => {
                let url = p
                    .get("image_url")
                    .and_then(|i| s(i, "url").or_else(|| i.as_str()))
                    .unwrap_or_default();
                blocks.push(image_block(url)?);
            }
            _ => {}
        }
    }
    Ok(blocks)
}

/// A Converse `image` block from a `data:` URL.
fn image_block(url: &str) -> Result<Value, TranslateError> {
    let Some((mime, data)) = util::parse_data_url(url) else {
        return Err(TranslateError::new(
            "Bedrock Converse takes images as data: URLs (base64) only, not by http(s) URL",
        ));
    };
    let format = match mime {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpeg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        other => {
            return Err(TranslateError::new(format!(
                "Bedrock Converse takes png, jpeg, gif or webp images, not {other:?}"
            )))
        }
    };
    Ok(json!({"image": {"format": format, "source": {"bytes": data}}}))
}

/// Append `blocks` as a `role` turn, merged into the previous turn of the same role.
fn push_turn(messages: &mut Vec<Value>, role: &str, mut blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    if let Some(last) = messages.last_mut() {
        if s(last, "role") == Some(role) {
            if let Some(Value::Array(c)) = last.get_mut("content") {
                c.append(&mut blocks);
                return;
            }
        }
    }
    messages.push(json!({"role": role, "content": blocks}));
}

/// Converse `stopReason` → Chat `finish_reason`.
pub fn stop_to_finish(stop: &str) -> &'static str {
    match stop {
        "tool_use" => "tool_calls",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "guardrail_intervened" | "content_filtered" => "content_filter",
        _ => "stop",
    }
}

/// Converse `usage` → hub Chat `usage` (prompt tokens include the cached ones).
pub(crate) fn usage_to_chat(u: &Value) -> Value {
    let cached = util::u(u, "cacheReadInputTokens").unwrap_or(0);
    let written = util::u(u, "cacheWriteInputTokens").unwrap_or(0);
    let input = util::u(u, "inputTokens").unwrap_or(0);
    let output = util::u(u, "outputTokens").unwrap_or(0);
    let prompt = input.saturating_add(cached).saturating_add(written);
    let mut out = json!({
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt.saturating_add(output),
    });
    if cached > 0 {
        out["prompt_tokens_details"] = json!({ "cached_tokens": cached });
    }
    out
}

/// A Converse answer → hub Chat completion, with the id and creation time the caller gives
/// (Converse answers carry neither).
pub fn response_to_chat(body: &[u8], id: &str, created: u64) -> Result<Value, TranslateError> {
    let v = util::parse_object(body)?;
    let msg = v
        .get("output")
        .and_then(|o| o.get("message"))
        .ok_or_else(|| TranslateError::new("Converse answer without output.message"))?;
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for b in arr(msg, "content") {
        if let Some(t) = s(b, "text") {
            text.push_str(t);
        } else if let Some(tu) = b.get("toolUse") {
            let input = tu.get("input").cloned().unwrap_or_else(|| json!({}));
            calls.push(json!({
                "id": s(tu, "toolUseId").unwrap_or_default(),
                "type": "function",
                "function": {"name": s(tu, "name").unwrap_or_default(), "arguments": util::compact(&input)},
            }));
        } else if let Some(r) = b.get("reasoningContent") {
            if let Some(t) = r.get("reasoningText").and_then(|t| s(t, "text")) {
                reasoning.push_str(t);
            }
        }
    }
    let mut message = util::assistant(text, !calls.is_empty());
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), reasoning.into());
    }
    let finish = match s(&v, "stopReason") {
        Some(r) => stop_to_finish(r),
        None => "stop",
    };
    let finish = if !calls.is_empty() && finish == "stop" {
        "tool_calls"
    } else {
        finish
    };
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let mut out = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": "",
        "choices": [{"index": 0, "message": Value::Object(message), "finish_reason": finish}],
    });
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        out["usage"] = usage_to_chat(u);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(chat: Value) -> Value {
        serde_json::from_slice(&chat_to_request(&chat).unwrap()).unwrap()
    }

    #[test]
    fn turns_merge_and_tools_map() {
        let v = req(json!({
            "model": "m", "max_tokens": 10, "stop": "X", "top_k": 5,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
                    {"id": "t2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "{\"ok\":true}"},
                {"role": "tool", "tool_call_id": "t2", "content": "plain"},
                {"role": "user", "content": "and?"}
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": "required"
        }));
        assert_eq!(v["system"], json!([{"text": "be brief"}]));
        let msgs = v["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3, "{v}");
        assert_eq!(msgs[1]["content"][0]["toolUse"]["input"], json!({"a": 1}));
        let results = msgs[2]["content"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        assert_eq!(
            results[0]["toolResult"]["content"],
            json!([{"json": {"ok": true}}])
        );
        assert_eq!(
            results[1]["toolResult"]["content"],
            json!([{"text": "plain"}])
        );
        assert_eq!(results[2], json!({"text": "and?"}));
        assert_eq!(v["toolConfig"]["toolChoice"], json!({"any": {}}));
        assert_eq!(
            v["inferenceConfig"],
            json!({"maxTokens": 10, "stopSequences": ["X"]})
        );
        assert_eq!(v["additionalModelRequestFields"], json!({"top_k": 5}));
        assert!(v.get("model").is_none());
    }

    #[test]
    fn images_by_url_are_refused() {
        let bad = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]});
        assert!(chat_to_request(&bad).is_err());
        let tiff = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AA"}}]}]});
        assert!(chat_to_request(&tiff).is_err());
    }

    #[test]
    fn answer_with_tool_use_and_cached_usage() {
        let body = br#"{"output":{"message":{"role":"assistant","content":[{"text":"ok "},{"toolUse":{"toolUseId":"tu1","name":"f","input":{"x":"y"}}}]}},"stopReason":"tool_use","usage":{"inputTokens":3,"outputTokens":4,"totalTokens":7,"cacheReadInputTokens":2},"metrics":{"latencyMs":1}}"#;
        let c = response_to_chat(body, "chatcmpl-1", 5).unwrap();
        assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(
            c["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"x\":\"y\"}"
        );
        assert_eq!(c["usage"]["prompt_tokens"], 5);
        assert_eq!(c["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
        assert!(response_to_chat(b"{}", "i", 0).is_err());
    }
}
