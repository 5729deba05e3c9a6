//! Gemini `generateContent` ⇄ Chat Completions (requests and non-stream
//! responses); its stream decoder and encoder are in `stream.rs`.
//!
//! Must not: perform IO, or allocate beyond the values it returns.
//!
//! Mapping notes:
//! * `systemInstruction.parts[].text` ⇄ Chat `system` message(s).
//! * `contents[]` role `user`/`model` ⇄ `user`/`assistant`; parts `text`,
//!   `inlineData` (⇄ `data:` URL), `fileData` (⇄ https URL), `functionCall`
//!   (⇄ `tool_calls`, args object ⇄ arguments string), `functionResponse`
//!   (⇄ `role: tool`). Gemini matches responses to calls by name: going to
//!   Chat, ids come from `functionCall.id` or are generated (`call_<n>`) and
//!   each `functionResponse` takes the oldest pending id of its name; going
//!   to Gemini, a tool message's name is looked up from its `tool_call_id`.
//! * Input keys are read in camelCase or snake_case; output is camelCase.
//! * The model and `stream` live in the URL: the hub built from a Gemini
//!   body has neither, and `chat_to_request` writes neither.
//! * `finishReason` STOP ⇄ stop, MAX_TOKENS ⇄ length, SAFETY / RECITATION /
//!   BLOCKLIST / PROHIBITED_CONTENT / SPII / IMAGE_SAFETY → content_filter;
//!   a response holding `functionCall` parts → tool_calls.
//!
//! Deliberately dropped or rejected:
//!
//! | direction | field | handling |
//! |---|---|---|
//! | Gemini → Chat | non-function tools (`googleSearch`, `codeExecution`, …) | rejected |
//! | Gemini → Chat | `safetySettings`, `cachedContent`, `candidateCount`, `thinkingConfig.includeThoughts`, `responseModalities`, non-image `inlineData` | dropped |
//! | Chat → Gemini | `logit_bias`, `logprobs`, `user`, `metadata`, `service_tier`, `parallel_tool_calls`, `stream_options`, `audio`, `modalities`, `cache_control` markers | dropped |
//! | Chat → Gemini | `n` > 1 | rejected (`translate::chat_to_request`) |
//!
//! Reasoning (see `thinking`): `thinkingConfig.thinkingBudget` ⇄ `reasoning_effort` (the
//! effort table; 0 ⇄ `none`; -1 or a `thinkingLevel` → `low`/`medium`/`high`), with
//! `includeThoughts` on; `thought` parts ⇄ `reasoning_content`. `topK` ⇄ `top_k`.
//! | Chat → Gemini | JSON-schema keys `$schema`, `additionalProperties` in tool parameters | stripped (rejected by Gemini's OpenAPI subset) |
//! | responses | Chat `logprobs`, `system_fingerprint`; Gemini `safetyRatings`, `citationMetadata` | dropped |

use crate::dialect::schema::{schema_to_gemini, schema_to_json};
use crate::dialect::thinking::{budget_to_effort, effort_to_budget, reasoning_text};
use crate::dialect::util::{self, arr, get_any, s, Obj};
use crate::dialect::Dialect;
use crate::dialect::TranslateError;
use crate::dialect::Wire;
use crate::dialect::{Decoder, Encoder};
use crate::error::ErrorShape;
use serde_json::{json, Value};
use std::collections::HashMap;

pub mod call;
pub(crate) mod stream;

/// Gemini's wire facts. The model (and for a stream the method) is in the URL: its
/// `chat_to_request` ignores the upstream model.
pub static WIRE: Wire = Wire {
    dialect: Dialect::Gemini,
    name: "gemini",
    error_shape: ErrorShape::Gemini,
    error_type: error_status,
    error_code: |_| None,
    error_event: None,
    terminal_events: &[],
    terminal_data: None,
    terminal_key: Some("finishReason"),
    usage_at: &[&["usageMetadata"]],
    usage_to_hub,
    request_to_chat,
    chat_to_request: |chat, _model| chat_to_request(chat),
    response_to_chat,
    chat_to_response,
    decoder: || Decoder::Gemini,
    encoder: |model| Encoder::Gemini(stream::GeminiOut::new(model)),
};

/// Google's canonical status name (`error.status`) for an HTTP status.
pub(crate) fn error_status(status: u16) -> &'static str {
    match status {
        400 | 413 | 422 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        405 | 501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ if status >= 500 => "INTERNAL",
        _ => "FAILED_PRECONDITION",
    }
}

/// Gemini `finishReason` → Chat `finish_reason` (without the tool-call rule).
pub fn finish_to_chat(reason: &str) -> &'static str {
    match reason {
        "MAX_TOKENS" => "length",
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            "content_filter"
        }
        _ => "stop",
    }
}

/// Chat `finish_reason` → Gemini `finishReason`.
pub fn finish_from_chat(finish: &str) -> &'static str {
    match finish {
        "length" => "MAX_TOKENS",
        "content_filter" => "SAFETY",
        _ => "STOP",
    }
}

// ---------------------------------------------------------------- requests

struct IdMap {
    next: usize,
    pending: HashMap<String, Vec<String>>,
}

impl IdMap {
    fn call_id(&mut self, call: &Value) -> String {
        let id = match s(call, "id") {
            Some(id) => id.to_string(),
            None => format!("call_{}", self.next),
        };
        self.next += 1;
        let name = s(call, "name").unwrap_or_default().to_string();
        self.pending.entry(name).or_default().push(id.clone());
        id
    }

    fn response_id(&mut self, resp: &Value) -> String {
        let name = s(resp, "name").unwrap_or_default();
        if let Some(id) = s(resp, "id") {
            if let Some(q) = self.pending.get_mut(name) {
                q.retain(|p| p != id);
            }
            return id.to_string();
        }
        match self.pending.get_mut(name) {
            Some(q) if !q.is_empty() => q.remove(0),
            _ => format!("call_{name}"),
        }
    }
}

/// Gemini request body → hub Chat request (no `model`, no `stream`).
pub fn request_to_chat(body: &[u8]) -> Result<Value, TranslateError> {
    let req = util::parse_object(body)?;
    let mut out = Obj::new();
    let mut messages = Vec::new();
    if let Some(si) = get_any(&req, &["systemInstruction", "system_instruction"]) {
        let text: Vec<&str> = arr(si, "parts")
            .iter()
            .filter_map(|p| s(p, "text"))
            .collect();
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text.join("\n")}));
        }
    }
    let Some(contents) = req.get("contents").and_then(Value::as_array) else {
        return Err(TranslateError::new("`contents` must be an array"));
    };
    let mut ids = IdMap {
        next: 0,
        pending: HashMap::new(),
    };
    for c in contents {
        let model = s(c, "role") == Some("model");
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut calls = Vec::new();
        for p in arr(c, "parts") {
            if p.get("thought").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            if let Some(t) = s(p, "text") {
                text.push_str(t);
                parts.push(json!({"type": "text", "text": t}));
            } else if let Some(d) = get_any(p, &["inlineData", "inline_data"]) {
                let mime = get_any(d, &["mimeType", "mime_type"])
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if mime.starts_with("image/") {
                    let url = format!("data:{mime};base64,{}", s(d, "data").unwrap_or_default());
                    parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
                }
            } else if let Some(d) = get_any(p, &["fileData", "file_data"]) {
                if let Some(uri) = get_any(d, &["fileUri", "file_uri"]).and_then(Value::as_str) {
                    parts.push(json!({"type": "image_url", "image_url": {"url": uri}}));
                }
            } else if let Some(fc) = get_any(p, &["functionCall", "function_call"]) {
                calls.push(json!({
                    "id": ids.call_id(fc),
                    "type": "function",
                    "function": {
                        "name": s(fc, "name").unwrap_or_default(),
                        "arguments": util::compact(fc.get("args").unwrap_or(&json!({}))),
                    },
                }));
            } else if let Some(fr) = get_any(p, &["functionResponse", "function_response"]) {
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": ids.response_id(fr),
                    "content": util::compact(fr.get("response").unwrap_or(&json!({}))),
                }));
            }
        }
        if model {
            let mut m = util::assistant(text, !calls.is_empty());
            if !calls.is_empty() {
                m.insert("tool_calls".into(), Value::Array(calls));
            }
            messages.push(Value::Object(m));
        } else if !parts.is_empty() {
            let content = match parts.as_slice() {
                [one] if s(one, "type") == Some("text") => Value::from(text),
                _ => Value::Array(parts),
            };
            messages.push(json!({"role": "user", "content": content}));
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(gc) = get_any(&req, &["generationConfig", "generation_config"]) {
        let pairs = [
            (&["maxOutputTokens", "max_output_tokens"][..], "max_tokens"),
            (&["temperature"][..], "temperature"),
            (&["topP", "top_p"][..], "top_p"),
            (&["topK", "top_k"][..], "top_k"),
            (&["stopSequences", "stop_sequences"][..], "stop"),
            (&["seed"][..], "seed"),
            (
                &["presencePenalty", "presence_penalty"][..],
                "presence_penalty",
            ),
            (
                &["frequencyPenalty", "frequency_penalty"][..],
                "frequency_penalty",
            ),
        ];
        for (keys, to) in pairs {
            if let Some(v) = get_any(gc, keys) {
                out.insert(to.into(), v.clone());
            }
        }
        // thinkingConfig: a budget → the table's effort (see `thinking`); 0 = off.
        let tc = get_any(gc, &["thinkingConfig", "thinking_config"]);
        let budget = tc.and_then(|t| get_any(t, &["thinkingBudget", "thinking_budget"]));
        let level = tc
            .and_then(|t| get_any(t, &["thinkingLevel", "thinking_level"]))
            .and_then(Value::as_str);
        let effort = match (budget.and_then(Value::as_i64), level) {
            (Some(0), _) => None,
            (Some(b), _) if b > 0 => Some(budget_to_effort(b as u64)),
            (_, Some(l)) if l.eq_ignore_ascii_case("high") => Some("high"),
            (_, Some(l)) if l.eq_ignore_ascii_case("low") || l.eq_ignore_ascii_case("minimal") => {
                Some("low")
            }
            (_, Some(_)) | (Some(_), None) => Some("medium"), // -1: dynamic
            (None, None) => None,
        };
        if let Some(e) = effort {
            out.insert("reasoning_effort".into(), e.into());
        }
        let schema = get_any(
            gc,
            &[
                "responseJsonSchema",
                "response_json_schema",
                "responseSchema",
                "response_schema",
            ],
        );
        let mime = get_any(gc, &["responseMimeType", "response_mime_type"]).and_then(Value::as_str);
        if let Some(schema) = schema {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "response", "schema": schema_to_json(schema)}}),
            );
        } else if mime == Some("application/json") {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
    }
    let mut tools = Vec::new();
    for t in arr(&req, "tools") {
        let Some(decls) = get_any(t, &["functionDeclarations", "function_declarations"])
            .and_then(Value::as_array)
        else {
            return Err(TranslateError::new(
                "only functionDeclarations tools can be translated",
            ));
        };
        for d in decls {
            let mut f = Obj::new();
            util::copy(d, "name", &mut f, "name");
            util::copy(d, "description", &mut f, "description");
            if let Some(p) = get_any(
                d,
                &[
                    "parametersJsonSchema",
                    "parameters_json_schema",
                    "parameters",
                ],
            ) {
                f.insert("parameters".into(), schema_to_json(p));
            }
            tools.push(json!({"type": "function", "function": f}));
        }
    }
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
    }
    let fcc = get_any(&req, &["toolConfig", "tool_config"])
        .and_then(|tc| get_any(tc, &["functionCallingConfig", "function_calling_config"]));
    if let Some(fcc) = fcc {
        let allowed = get_any(fcc, &["allowedFunctionNames", "allowed_function_names"])
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let choice = match (s(fcc, "mode"), allowed) {
            (Some("ANY"), [one]) => json!({"type": "function", "function": {"name": one}}),
            (Some("ANY"), _) => json!("required"),
            (Some("NONE"), _) => json!("none"),
            (Some("AUTO"), _) => json!("auto"),
            _ => Value::Null,
        };
        if !choice.is_null() {
            out.insert("tool_choice".into(), choice);
        }
    }
    Ok(Value::Object(out))
}

fn part_from_chat(p: &Value) -> Option<Value> {
    match s(p, "type") {
        Some("text") => Some(json!({"text": s(p, "text").unwrap_or_default()})),
        Some("image_url") => {
            let img = p.get("image_url")?;
            let url = s(img, "url").or_else(|| img.as_str())?;
            Some(match util::parse_data_url(url) {
                Some((mime, data)) => json!({"inlineData": {"mimeType": mime, "data": data}}),
                None => json!({"fileData": {"mimeType": util::guess_mime(url), "fileUri": url}}),
            })
        }
        _ => None,
    }
}

/// Append parts as a turn of `role`, merging with a previous same-role turn.
fn push_turn(contents: &mut Vec<Value>, role: &str, parts: Vec<Value>) {
    util::push_turn(contents, role, "parts", parts);
}

/// Hub Chat request → Gemini request body (model and stream go in the URL).
pub fn chat_to_request(chat: &Value) -> Result<Value, TranslateError> {
    util::as_object(chat)?;
    let mut out = Obj::new();
    let mut system = Vec::new();
    let mut contents = Vec::new();
    let mut names: HashMap<String, String> = HashMap::new();
    for m in arr(chat, "messages") {
        match s(m, "role") {
            Some("system") | Some("developer") => {
                let t = util::content_text(m.get("content"));
                if !t.is_empty() {
                    system.push(json!({"text": t}));
                }
            }
            Some("user") => {
                let parts = match m.get("content") {
                    Some(Value::Array(ps)) => ps.iter().filter_map(part_from_chat).collect(),
                    other => vec![json!({"text": util::content_text(other)})],
                };
                push_turn(&mut contents, "user", parts);
            }
            Some("assistant") => {
                let mut parts = Vec::new();
                let text = util::content_text(m.get("content"));
                if !text.is_empty() {
                    parts.push(json!({"text": text}));
                }
                for tc in arr(m, "tool_calls") {
                    let f = tc.get("function").unwrap_or(&Value::Null);
                    let name = s(f, "name").unwrap_or_default();
                    if let Some(id) = s(tc, "id") {
                        names.insert(id.to_string(), name.to_string());
                    }
                    let args = util::args_object(s(f, "arguments").unwrap_or_default());
                    parts.push(json!({"functionCall": {"name": name, "args": args}}));
                }
                push_turn(&mut contents, "model", parts);
            }
            Some("tool") => {
                let id = s(m, "tool_call_id").unwrap_or_default();
                let name = names.get(id).cloned().unwrap_or_default();
                let text = util::content_text(m.get("content"));
                let response = match serde_json::from_str::<Value>(&text) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => json!({"result": text}),
                };
                let part = json!({"functionResponse": {"name": name, "response": response}});
                push_turn(&mut contents, "user", vec![part]);
            }
            other => {
                return Err(TranslateError::new(format!(
                    "unsupported message role {:?}",
                    other.unwrap_or("<missing>")
                )))
            }
        }
    }
    if !system.is_empty() {
        out.insert("systemInstruction".into(), json!({"parts": system}));
    }
    out.insert("contents".into(), Value::Array(contents));
    let decls: Vec<Value> = arr(chat, "tools")
        .iter()
        .filter_map(|t| t.get("function"))
        .map(|f| {
            let mut d = Obj::new();
            util::copy(f, "name", &mut d, "name");
            util::copy(f, "description", &mut d, "description");
            if let Some(p) = f.get("parameters") {
                d.insert("parameters".into(), schema_to_gemini(p));
            }
            Value::Object(d)
        })
        .collect();
    if !decls.is_empty() {
        out.insert("tools".into(), json!([{"functionDeclarations": decls}]));
        let fcc = match chat.get("tool_choice") {
            Some(Value::String(c)) if c == "required" => Some(json!({"mode": "ANY"})),
            Some(Value::String(c)) if c == "none" => Some(json!({"mode": "NONE"})),
            Some(Value::String(c)) if c == "auto" => Some(json!({"mode": "AUTO"})),
            Some(c @ Value::Object(_)) => c
                .get("function")
                .and_then(|f| s(f, "name"))
                .map(|n| json!({"mode": "ANY", "allowedFunctionNames": [n]})),
            _ => None,
        };
        if let Some(f) = fcc {
            out.insert("toolConfig".into(), json!({"functionCallingConfig": f}));
        }
    }
    let mut gc = Obj::new();
    let max = util::u(chat, "max_completion_tokens").or_else(|| util::u(chat, "max_tokens"));
    if let Some(m) = max {
        gc.insert("maxOutputTokens".into(), m.into());
    }
    util::copy(chat, "temperature", &mut gc, "temperature");
    util::copy(chat, "top_p", &mut gc, "topP");
    match chat.get("stop") {
        Some(Value::String(st)) => {
            gc.insert("stopSequences".into(), json!([st]));
        }
        Some(v @ Value::Array(_)) => {
            gc.insert("stopSequences".into(), v.clone());
        }
        _ => {}
    }
    util::copy(chat, "seed", &mut gc, "seed");
    util::copy(chat, "top_k", &mut gc, "topK");
    if let Some(e) = s(chat, "reasoning_effort") {
        let budget = effort_to_budget(e).unwrap_or(0);
        let mut tc = json!({"thinkingBudget": budget});
        if budget > 0 {
            tc["includeThoughts"] = true.into();
        }
        gc.insert("thinkingConfig".into(), tc);
    }
    util::copy(chat, "presence_penalty", &mut gc, "presencePenalty");
    util::copy(chat, "frequency_penalty", &mut gc, "frequencyPenalty");
    if let Some(rf) = chat.get("response_format") {
        match s(rf, "type") {
            Some("json_object") => {
                gc.insert("responseMimeType".into(), "application/json".into());
            }
            Some("json_schema") => {
                gc.insert("responseMimeType".into(), "application/json".into());
                if let Some(schema) = rf.get("json_schema").and_then(|j| j.get("schema")) {
                    gc.insert("responseSchema".into(), schema_to_gemini(schema));
                }
            }
            _ => {}
        }
    }
    if !gc.is_empty() {
        out.insert("generationConfig".into(), Value::Object(gc));
    }
    Ok(Value::Object(out))
}

// --------------------------------------------------------------- responses

/// Gemini `usageMetadata` → hub usage.
pub(crate) fn usage_to_hub(u: &Value) -> crate::dialect::Usage {
    let cand = util::u(u, "candidatesTokenCount");
    let thoughts = util::u(u, "thoughtsTokenCount");
    let completion = match (cand, thoughts) {
        (None, None) => None,
        (c, t) => Some(c.unwrap_or(0).saturating_add(t.unwrap_or(0))),
    };
    crate::dialect::Usage {
        prompt_tokens: util::u(u, "promptTokenCount"),
        completion_tokens: completion,
        cached_tokens: util::u(u, "cachedContentTokenCount"),
    }
}

/// Hub usage → Gemini `usageMetadata`.
pub(crate) fn usage_from_hub(u: &crate::dialect::Usage) -> Value {
    let p = u.prompt_tokens.unwrap_or(0);
    let c = u.completion_tokens.unwrap_or(0);
    let mut o = Obj::new();
    o.insert("promptTokenCount".into(), p.into());
    o.insert("candidatesTokenCount".into(), c.into());
    o.insert("totalTokenCount".into(), p.saturating_add(c).into());
    if let Some(cached) = u.cached_tokens {
        o.insert("cachedContentTokenCount".into(), cached.into());
    }
    Value::Object(o)
}

/// Text and function calls of `candidates[0]` (thought parts skipped).
/// Call ids come from `functionCall.id` or are `call_<first_index + i>`.
pub(crate) fn candidate_parts(
    resp: &Value,
    first_index: usize,
) -> (String, Vec<(String, String, String)>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    let cand = arr(resp, "candidates").first().unwrap_or(&Value::Null);
    let parts = cand.get("content").map(|c| arr(c, "parts")).unwrap_or(&[]);
    for p in parts {
        if p.get("thought").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        if let Some(t) = s(p, "text") {
            text.push_str(t);
        } else if let Some(fc) = get_any(p, &["functionCall", "function_call"]) {
            let id = s(fc, "id")
                .map(str::to_string)
                .unwrap_or_else(|| format!("call_{}", first_index + calls.len()));
            let name = s(fc, "name").unwrap_or_default().to_string();
            let args = util::compact(fc.get("args").unwrap_or(&json!({})));
            calls.push((id, name, args));
        }
    }
    (text, calls)
}

/// Gemini response body → hub Chat completion.
pub fn response_to_chat(body: &[u8]) -> Result<Value, TranslateError> {
    let resp = util::parse_object(body)?;
    let (text, calls) = candidate_parts(&resp, 0);
    let cand = arr(&resp, "candidates").first().unwrap_or(&Value::Null);
    let blocked = resp
        .get("promptFeedback")
        .and_then(|f| s(f, "blockReason"))
        .is_some();
    let finish = if !calls.is_empty() {
        "tool_calls"
    } else if blocked {
        "content_filter"
    } else {
        finish_to_chat(s(cand, "finishReason").unwrap_or("STOP"))
    };
    let mut message = util::assistant(text, !calls.is_empty());
    let thoughts: String = cand
        .get("content")
        .map(|c| arr(c, "parts"))
        .unwrap_or(&[])
        .iter()
        .filter(|p| p.get("thought").and_then(Value::as_bool) == Some(true))
        .filter_map(|p| s(p, "text"))
        .collect();
    if !thoughts.is_empty() {
        message.insert("reasoning_content".into(), thoughts.into());
    }
    if !calls.is_empty() {
        let tc: Vec<Value> = calls
            .into_iter()
            .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
            .collect();
        message.insert("tool_calls".into(), Value::Array(tc));
    }
    let usage = usage_to_hub(resp.get("usageMetadata").unwrap_or(&Value::Null));
    let id = s(&resp, "responseId").unwrap_or("gemini");
    let model = s(&resp, "modelVersion").unwrap_or_default();
    Ok(util::completion(
        id,
        0,
        model,
        message.into(),
        finish,
        &usage,
    ))
}

/// Hub Chat completion → Gemini response body.
pub fn chat_to_response(chat: &Value, client_model: &str) -> Result<Value, TranslateError> {
    let (choice, msg) = util::first_message(chat)?;
    let mut parts = Vec::new();
    if let Some(r) = reasoning_text(msg) {
        parts.push(json!({"text": r, "thought": true}));
    }
    let text = util::content_text(msg.get("content"));
    if !text.is_empty() {
        parts.push(json!({"text": text}));
    }
    for tc in arr(msg, "tool_calls") {
        let f = tc.get("function").unwrap_or(&Value::Null);
        let args = util::args_object(s(f, "arguments").unwrap_or_default());
        parts.push(
            json!({"functionCall": {"name": s(f, "name").unwrap_or_default(), "args": args}}),
        );
    }
    let finish = finish_from_chat(s(choice, "finish_reason").unwrap_or("stop"));
    let usage = util::read_chat_usage(chat.get("usage").unwrap_or(&Value::Null));
    Ok(json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}],
        "usageMetadata": usage_from_hub(&usage),
        "modelVersion": client_model,
        "responseId": s(chat, "id").unwrap_or("ringgate"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_response_ids_match_calls() {
        let body = br#"{"contents":[
            {"role":"user","parts":[{"text":"w"}]},
            {"role":"model","parts":[{"functionCall":{"name":"f","args":{"a":1}}},{"functionCall":{"name":"f","args":{"a":2}}}]},
            {"role":"user","parts":[{"functionResponse":{"name":"f","response":{"r":1}}},{"functionResponse":{"name":"f","response":{"r":2}}}]}]}"#;
        let hub = request_to_chat(body).unwrap();
        let m = hub["messages"].as_array().unwrap();
        assert_eq!(m[1]["tool_calls"][0]["id"], "call_0");
        assert_eq!(m[1]["tool_calls"][1]["id"], "call_1");
        assert_eq!(m[2]["tool_call_id"], "call_0");
        assert_eq!(m[3]["tool_call_id"], "call_1");
        let back = chat_to_request(&hub).unwrap();
        assert_eq!(
            back["contents"][2]["parts"][0]["functionResponse"]["name"],
            "f"
        );
        assert_eq!(
            back["contents"][2]["parts"][1]["functionResponse"]["response"]["r"],
            2
        );
    }

    #[test]
    fn function_call_means_tool_calls() {
        let body = br#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"f","args":{}}}]},"finishReason":"STOP"}]}"#;
        let hub = response_to_chat(body).unwrap();
        assert_eq!(hub["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(
            hub["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
    }
}
