//! Client-side stream encoders: hub events (the content of Chat chunks) →
//! SSE bytes in the client's dialect. One encoder per dialect, each holding
//! just the state its wire format needs (open block, indices, usage).
//!
//! Terminal events (`message_delta` + `message_stop`, `response.completed`,
//! `[DONE]`, Gemini's final `finishReason` chunk) are written on
//! [`Hub::Done`], which the translator guarantees to deliver exactly once.
//!
//! Tool calls are assumed sequential (as OpenAI, Anthropic and Gemini send
//! them): a new block/item closes the previous one. If an upstream
//! interleaves argument fragments of several calls, a late fragment is still
//! sent to its call's original Anthropic block index / Responses item
//! (SDKs accumulate by index), after that block's stop event.
//!
//! Must not: perform IO, parse upstream bytes, or allocate beyond the bytes
//! it appends to `out` and the per-stream state.

use super::error::stream_error_event_seq;
use super::gemini;
use super::hub::Hub;
use super::messages;
use super::responses::stream_out::ResponsesOut;
use super::sse::{encode_event, encode_json};
use super::util::{self, Obj};
use super::{Dialect, Usage};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

// -------------------------------------------------------------------- Chat

pub(crate) struct ChatOut {
    model: String,
    id: String,
    created: u64,
    started: bool,
    pub(crate) include_usage: bool,
    usage: Usage,
}

impl ChatOut {
    fn chunk(&self, delta: Value, finish: Value) -> Value {
        json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.started = true;
            let c = self.chunk(json!({"role": "assistant", "content": ""}), Value::Null);
            encode_json(None, &c, out);
        }
    }

    fn handle(&mut self, ev: Hub, out: &mut Vec<u8>) {
        match ev {
            Hub::Start { id, created } => {
                if let Some(id) = id {
                    self.id = id;
                }
                self.created = created.unwrap_or(self.created);
                self.start(out);
            }
            Hub::Text(t) => {
                self.start(out);
                encode_json(None, &self.chunk(json!({"content": t}), Value::Null), out);
            }
            Hub::Reasoning(t) => {
                self.start(out);
                let d = json!({"reasoning_content": t});
                encode_json(None, &self.chunk(d, Value::Null), out);
            }
            // Chat deltas have no place for signatures or redacted reasoning.
            Hub::Signature(_) | Hub::Redacted(_) => {}
            Hub::ToolStart { index, id, name } => {
                self.start(out);
                let d = json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""}}]});
                encode_json(None, &self.chunk(d, Value::Null), out);
            }
            Hub::ToolArgs { index, args } => {
                self.start(out);
                let d = json!({"tool_calls": [{"index": index, "function": {"arguments": args}}]});
                encode_json(None, &self.chunk(d, Value::Null), out);
            }
            Hub::Finish(r) => {
                self.start(out);
                encode_json(None, &self.chunk(json!({}), Value::from(r)), out);
            }
            Hub::Usage(u) => self.usage.merge(u),
            Hub::Error(st, m) => stream_error_event_seq(Dialect::Chat, st, &m, None, out),
            Hub::Done => {
                if self.include_usage && !self.usage.is_empty() {
                    let v = json!({
                        "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": util::chat_usage(&self.usage),
                    });
                    encode_json(None, &v, out);
                }
                encode_event(None, "[DONE]", out);
            }
        }
    }
}

// --------------------------------------------------------------- Anthropic

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Text(u64),
    Tool(u64),
    Thinking(u64),
}

pub(crate) struct MessagesOut {
    model: String,
    id: String,
    started: bool,
    next_block: u64,
    open: Option<Open>,
    tools: HashMap<usize, u64>,
    stop: Option<&'static str>,
    usage: Usage,
}

impl MessagesOut {
    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let mut usage = messages::usage_from_hub(&self.usage);
        if let Some(u) = usage.as_object_mut() {
            u.insert("output_tokens".into(), 0.into());
        }
        let v = json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage}});
        encode_json(Some("message_start"), &v, out);
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some(Open::Text(i) | Open::Tool(i) | Open::Thinking(i)) = self.open.take() {
            let v = json!({"type": "content_block_stop", "index": i});
            encode_json(Some("content_block_stop"), &v, out);
        }
    }

    fn open_block(&mut self, block: Value, out: &mut Vec<u8>) -> u64 {
        self.close(out);
        let i = self.next_block;
        self.next_block += 1;
        let v = json!({"type": "content_block_start", "index": i, "content_block": block});
        encode_json(Some("content_block_start"), &v, out);
        i
    }

    /// One `content_block_delta` event whose delta is `{"type": kind, field: value}`, written
    /// directly (runs once per streamed token). Byte-identical to serialising the equivalent
    /// `json!` value (same field order, serde_json's string escaping).
    fn delta(out: &mut Vec<u8>, index: u64, kind: &str, field: &str, value: &str) {
        // written straight into `out`: serde_json's output is one line (newlines in strings
        // are escaped), so this is what `encode_event` would make of the JSON, without the
        // intermediate buffer and the re-scan for line breaks
        out.reserve(128 + value.len());
        out.extend_from_slice(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
        );
        crate::util::decimal::push_u64(out, index);
        out.extend_from_slice(b",\"delta\":{\"type\":\"");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\",\"");
        out.extend_from_slice(field.as_bytes());
        out.extend_from_slice(b"\":");
        if serde_json::to_writer(&mut *out, value).is_err() {
            out.extend_from_slice(b"\"\"");
        }
        out.extend_from_slice(b"}}\n\n");
    }

    fn handle(&mut self, ev: Hub, out: &mut Vec<u8>) {
        match ev {
            Hub::Start { id, .. } => {
                if let Some(id) = id {
                    self.id = id;
                }
                self.start(out);
            }
            Hub::Text(t) => {
                self.start(out);
                let i = match self.open {
                    Some(Open::Text(i)) => i,
                    _ => {
                        let i = self.open_block(json!({"type": "text", "text": ""}), out);
                        self.open = Some(Open::Text(i));
                        i
                    }
                };
                Self::delta(out, i, "text_delta", "text", &t);
            }
            Hub::Reasoning(t) => {
                self.start(out);
                let i = match self.open {
                    Some(Open::Thinking(i)) => i,
                    _ => {
                        let b = json!({"type": "thinking", "thinking": "", "signature": ""});
                        let i = self.open_block(b, out);
                        self.open = Some(Open::Thinking(i));
                        i
                    }
                };
                Self::delta(out, i, "thinking_delta", "thinking", &t);
            }
            Hub::Signature(sig) => {
                if let Some(Open::Thinking(i)) = self.open {
                    Self::delta(out, i, "signature_delta", "signature", &sig);
                }
            }
            Hub::Redacted(data) => {
                self.start(out);
                self.open_block(json!({"type": "redacted_thinking", "data": data}), out);
                let i = self.next_block - 1;
                self.open = Some(Open::Thinking(i));
                self.close(out);
            }
            Hub::ToolStart { index, id, name } => {
                self.start(out);
                let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                let i = self.open_block(block, out);
                self.open = Some(Open::Tool(i));
                self.tools.insert(index, i);
            }
            Hub::ToolArgs { index, args } => {
                if let Some(&i) = self.tools.get(&index) {
                    Self::delta(out, i, "input_json_delta", "partial_json", &args);
                }
            }
            Hub::Finish(r) => {
                self.start(out);
                self.close(out);
                self.stop = Some(messages::finish_to_stop(&r));
            }
            Hub::Usage(u) => self.usage.merge(u),
            Hub::Error(st, m) => stream_error_event_seq(Dialect::Messages, st, &m, None, out),
            Hub::Done => {
                self.start(out);
                self.close(out);
                let mut usage = Obj::new();
                if self.usage.prompt_tokens.is_some() {
                    if let Value::Object(full) = messages::usage_from_hub(&self.usage) {
                        usage = full;
                    }
                }
                usage.insert(
                    "output_tokens".into(),
                    self.usage.completion_tokens.unwrap_or(0).into(),
                );
                let v = json!({"type": "message_delta",
                    "delta": {"stop_reason": self.stop.unwrap_or("end_turn"), "stop_sequence": null},
                    "usage": usage});
                encode_json(Some("message_delta"), &v, out);
                encode_json(Some("message_stop"), &json!({"type": "message_stop"}), out);
            }
        }
    }
}

// ------------------------------------------------------------------ Gemini

pub(crate) struct GeminiOut {
    model: String,
    id: String,
    tools: BTreeMap<usize, (String, String)>,
    finish: Option<String>,
    usage: Usage,
}

impl GeminiOut {
    fn chunk(&self, parts: Vec<Value>, finish: Option<&str>) -> Value {
        let mut cand = Obj::new();
        cand.insert("content".into(), json!({"role": "model", "parts": parts}));
        if let Some(f) = finish {
            cand.insert("finishReason".into(), f.into());
        }
        cand.insert("index".into(), 0.into());
        let mut v = Obj::new();
        v.insert("candidates".into(), json!([cand]));
        if finish.is_some() && !self.usage.is_empty() {
            v.insert("usageMetadata".into(), gemini::usage_from_hub(&self.usage));
        }
        v.insert("modelVersion".into(), self.model.as_str().into());
        v.insert("responseId".into(), self.id.as_str().into());
        Value::Object(v)
    }

    fn handle(&mut self, ev: Hub, out: &mut Vec<u8>) {
        match ev {
            Hub::Start { id, .. } => {
                if let Some(id) = id {
                    self.id = id;
                }
            }
            Hub::Text(t) => encode_json(None, &self.chunk(vec![json!({"text": t})], None), out),
            Hub::Reasoning(t) => {
                let part = json!({"text": t, "thought": true});
                encode_json(None, &self.chunk(vec![part], None), out);
            }
            Hub::Signature(_) | Hub::Redacted(_) => {}
            Hub::ToolStart { index, name, .. } => {
                self.tools.insert(index, (name, String::new()));
            }
            Hub::ToolArgs { index, args } => {
                if let Some((_, a)) = self.tools.get_mut(&index) {
                    a.push_str(&args);
                }
            }
            Hub::Finish(r) => self.finish = Some(r),
            Hub::Usage(u) => self.usage.merge(u),
            Hub::Error(st, m) => stream_error_event_seq(Dialect::Gemini, st, &m, None, out),
            Hub::Done => {
                let mut parts: Vec<Value> = self
                    .tools
                    .values()
                    .map(|(name, args)| json!({"functionCall": {"name": name, "args": util::args_object(args)}}))
                    .collect();
                if parts.is_empty() {
                    parts.push(json!({"text": ""}));
                }
                let finish = gemini::finish_from_chat(self.finish.as_deref().unwrap_or("stop"));
                encode_json(None, &self.chunk(parts, Some(finish)), out);
            }
        }
    }
}

// ---------------------------------------------------------------- dispatch

pub(crate) enum ClientOut {
    Chat(ChatOut),
    Messages(MessagesOut),
    Responses(ResponsesOut),
    Gemini(GeminiOut),
}

impl ClientOut {
    pub(crate) fn new(client: Dialect, model: &str) -> Self {
        let model = model.to_string();
        match client {
            Dialect::Chat => ClientOut::Chat(ChatOut {
                model,
                id: "chatcmpl-ringgate".into(),
                created: 0,
                started: false,
                include_usage: true,
                usage: Usage::default(),
            }),
            Dialect::Messages => ClientOut::Messages(MessagesOut {
                model,
                id: "msg_ringgate".into(),
                started: false,
                next_block: 0,
                open: None,
                tools: HashMap::new(),
                stop: None,
                usage: Usage::default(),
            }),
            Dialect::Responses => ClientOut::Responses(ResponsesOut::new(model)),
            Dialect::Gemini => ClientOut::Gemini(GeminiOut {
                model,
                id: "ringgate".into(),
                tools: BTreeMap::new(),
                finish: None,
                usage: Usage::default(),
            }),
        }
    }

    pub(crate) fn handle(&mut self, ev: Hub, out: &mut Vec<u8>) {
        match self {
            ClientOut::Chat(c) => c.handle(ev, out),
            ClientOut::Messages(c) => c.handle(ev, out),
            ClientOut::Responses(c) => c.handle(ev, out),
            ClientOut::Gemini(c) => c.handle(ev, out),
        }
    }

    /// Whether a Chat client gets the final usage chunk.
    pub(crate) fn set_chat_usage(&mut self, on: bool) {
        if let ClientOut::Chat(c) = self {
            c.include_usage = on;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written delta event is what serialising the `json!` value and framing it with
    /// `encode_event` gives, for text that needs every kind of escaping.
    #[test]
    fn delta_event_is_byte_identical_to_the_json_value_framed() {
        for text in [
            "hi",
            "",
            "a\nb\r\n\"q\"\\ \u{1}\t é 😀 \u{2028}",
            "data: x\n\nevent: y",
        ] {
            for (kind, field) in [("text_delta", "text"), ("thinking_delta", "thinking")] {
                let mut got = Vec::new();
                MessagesOut::delta(&mut got, 7, kind, field, text);
                let v = json!({"type": "content_block_delta", "index": 7,
                               "delta": {"type": kind, field: text}});
                let mut want = Vec::new();
                encode_event(Some("content_block_delta"), &v.to_string(), &mut want);
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(&want),
                    "{text:?}"
                );
            }
        }
    }
}
