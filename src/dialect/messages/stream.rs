//! The Anthropic Messages stream, both ways: the upstream decoder (`MessagesIn`: `message_start`,
//! `content_block_*`, `message_delta`, `message_stop`, `error` → hub events; the
//! structured-output tool's input streams as text) and the client encoder (`MessagesOut`: hub
//! events → the same events, one content block open at a time).
//!
//! Must not: perform IO, or allocate beyond per-stream state and the bytes it appends to `out`.

use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};

use crate::dialect::error::stream_error_event_seq;
use crate::dialect::hub::{parse, push_args, upstream_error, Core, Decoded, Hub};
use crate::dialect::sse::encode_json;
use crate::dialect::util::{self, s, Obj};
use crate::dialect::{messages, structured, Dialect, SseEvent, Usage};

// ----------------------------------------------------------------- decoder

/// A Messages upstream's decoding state.
#[derive(Default)]
pub(crate) struct MessagesIn {
    /// Content block index → hub tool index.
    block_tools: HashMap<u64, usize>,
    /// Blocks of the structured-output tool (their input is answer text).
    json_blocks: HashSet<u64>,
}

impl MessagesIn {
    /// One upstream Messages event → hub events.
    pub(crate) fn decode(&mut self, core: &mut Core, ev: &SseEvent, hub: &mut Vec<Hub>) -> Decoded {
        let v = parse(&ev.data)?;
        let kind = s(&v, "type").or(ev.event.as_deref()).unwrap_or_default();
        match kind {
            "message_start" => {
                let m = v.get("message").unwrap_or(&Value::Null);
                let u = messages::usage_to_hub(m.get("usage").unwrap_or(&Value::Null));
                hub.push(Hub::Usage(Usage {
                    completion_tokens: None,
                    ..u
                }));
                core.start(hub, s(m, "id"), None);
            }
            "content_block_start" => {
                core.start(hub, None, None);
                let cb = v.get("content_block").unwrap_or(&Value::Null);
                let block = util::u(&v, "index").unwrap_or(0);
                match s(cb, "type") {
                    Some("text") => {
                        if let Some(t) = s(cb, "text").filter(|t| !t.is_empty()) {
                            hub.push(Hub::Text(t.to_string()));
                        }
                    }
                    Some("thinking") => {
                        if let Some(t) = s(cb, "thinking").filter(|t| !t.is_empty()) {
                            hub.push(Hub::Reasoning(t.to_string()));
                        }
                    }
                    Some("redacted_thinking") => {
                        hub.push(Hub::Redacted(s(cb, "data").unwrap_or_default().to_string()));
                    }
                    Some("tool_use") if s(cb, "name") == Some(structured::JSON_TOOL) => {
                        // The structured-output answer: its input is the answer's text.
                        self.json_blocks.insert(block);
                        if let Some(input) = cb
                            .get("input")
                            .filter(|x| x.as_object().is_some_and(|o| !o.is_empty()))
                        {
                            hub.push(Hub::Text(util::compact(input)));
                        }
                    }
                    Some("tool_use") => {
                        let i = core.tool(
                            hub,
                            s(cb, "id").unwrap_or_default(),
                            s(cb, "name").unwrap_or_default(),
                        );
                        self.block_tools.insert(block, i);
                        if let Some(input) = cb
                            .get("input")
                            .filter(|x| x.as_object().is_some_and(|o| !o.is_empty()))
                        {
                            push_args(hub, i, &util::compact(input));
                        }
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let d = v.get("delta").unwrap_or(&Value::Null);
                let block = util::u(&v, "index").unwrap_or(0);
                match s(d, "type") {
                    Some("text_delta") => {
                        if let Some(t) = s(d, "text").filter(|t| !t.is_empty()) {
                            hub.push(Hub::Text(t.to_string()));
                        }
                    }
                    Some("input_json_delta") if self.json_blocks.contains(&block) => {
                        if let Some(t) = s(d, "partial_json").filter(|t| !t.is_empty()) {
                            hub.push(Hub::Text(t.to_string()));
                        }
                    }
                    Some("input_json_delta") => {
                        if let Some(&i) = self.block_tools.get(&block) {
                            push_args(hub, i, s(d, "partial_json").unwrap_or_default());
                        }
                    }
                    Some("thinking_delta") => {
                        if let Some(t) = s(d, "thinking").filter(|t| !t.is_empty()) {
                            hub.push(Hub::Reasoning(t.to_string()));
                        }
                    }
                    Some("signature_delta") => {
                        hub.push(Hub::Signature(s(d, "signature").unwrap_or_default().into()));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(r) = v.get("delta").and_then(|d| s(d, "stop_reason")) {
                    let mut f = messages::stop_to_finish(r);
                    if f == "tool_calls" && core.next_tool == 0 {
                        f = "stop"; // the structured-output tool was the answer
                    }
                    hub.push(Hub::Finish(f.to_string()));
                }
                if let Some(u) = v.get("usage") {
                    hub.push(Hub::Usage(messages::usage_to_hub(u)));
                }
            }
            "message_stop" => hub.push(Hub::Done),
            "error" => hub.push(upstream_error(&ev.data)),
            _ => {}
        }
        Ok(())
    }
}

// ----------------------------------------------------------------- encoder

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Text(u64),
    Tool(u64),
    Thinking(u64),
}

/// A Messages client's encoding state.
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
    pub(crate) fn new(model: String) -> Self {
        MessagesOut {
            model,
            id: "msg_ringgate".into(),
            started: false,
            next_block: 0,
            open: None,
            tools: HashMap::new(),
            stop: None,
            usage: Usage::default(),
        }
    }

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

    pub(crate) fn handle(&mut self, ev: Hub, out: &mut Vec<u8>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::sse::encode_event;

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
