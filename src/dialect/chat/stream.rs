//! The Chat stream, both ways: the upstream decoder (`ChatIn`: Chat chunks, read through the
//! typed [`chunk`](super::chunk) view, → hub events) and the client encoder (`ChatOut`: hub
//! events → `chat.completion.chunk` events, then `[DONE]`). Bedrock Converse streams reach the
//! hub through this decoder too (`converse::stream` writes Chat chunks).
//!
//! Must not: perform IO, or allocate beyond per-stream state and the bytes it appends to `out`.

use serde_json::{json, Value};
use std::collections::HashSet;

use crate::dialect::error::stream_error_event_seq;
use crate::dialect::hub::{push_args, upstream_error, Core, Decoded, Hub};
use crate::dialect::sse::{encode_event, encode_json};
use crate::dialect::util;
use crate::dialect::{chat, Dialect, SseEvent, TranslateError, Usage};

// ----------------------------------------------------------------- decoder

/// A Chat upstream's decoding state: the `tool_calls` indices already started.
#[derive(Default)]
pub(crate) struct ChatIn {
    tools: HashSet<u64>,
}

impl ChatIn {
    /// One upstream Chat chunk (or `[DONE]`) → hub events.
    pub(crate) fn decode(&mut self, core: &mut Core, ev: &SseEvent, hub: &mut Vec<Hub>) -> Decoded {
        let data = ev.data.trim();
        if data == "[DONE]" {
            hub.push(Hub::Done);
            return Ok(());
        }
        // Typed, borrowing parse: this runs once per streamed token.
        let v: chat::chunk::Chunk = serde_json::from_str(data)
            .map_err(|e| TranslateError::new(format!("malformed upstream stream event: {e}")))?;
        if v.error.as_ref().is_some_and(|e| !e.is_null()) {
            hub.push(upstream_error(data));
            return Ok(());
        }
        core.start(hub, v.id.as_deref(), v.created);
        for choice in v.choices.iter().flatten() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = &choice.delta {
                if let Some(r) = delta
                    .reasoning_content
                    .as_ref()
                    .or(delta.reasoning.as_ref())
                {
                    if !r.is_empty() {
                        hub.push(Hub::Reasoning(r.to_string()));
                    }
                }
                for t in [&delta.content, &delta.refusal].into_iter().flatten() {
                    if !t.is_empty() {
                        hub.push(Hub::Text(t.to_string()));
                    }
                }
                for (pos, tc) in delta.tool_calls.iter().flatten().enumerate() {
                    let key = tc.index.unwrap_or(pos as u64);
                    let f = tc.function.as_ref();
                    if self.tools.insert(key) {
                        // Chat indices are dense from 0; keep them as hub indices.
                        let index = usize::try_from(key).unwrap_or(usize::MAX);
                        let id = tc
                            .id
                            .as_deref()
                            .map(str::to_string)
                            .unwrap_or_else(|| format!("call_{key}"));
                        hub.push(Hub::ToolStart {
                            index,
                            id,
                            name: f
                                .and_then(|f| f.name.as_deref())
                                .unwrap_or_default()
                                .to_string(),
                        });
                        core.next_tool = core.next_tool.max(index.saturating_add(1));
                    }
                    let index = usize::try_from(key).unwrap_or(usize::MAX);
                    let args = f.and_then(|f| f.arguments.as_deref()).unwrap_or_default();
                    push_args(hub, index, args);
                }
            }
            if let Some(r) = choice.finish_reason.as_deref() {
                let r = if r == "stop" && !self.tools.is_empty() {
                    "tool_calls"
                } else {
                    r
                };
                hub.push(Hub::Finish(r.to_string()));
            }
        }
        if let Some(u) = v.usage.as_ref().filter(|u| u.is_object()) {
            hub.push(Hub::Usage(util::read_chat_usage(u)));
        }
        Ok(())
    }
}

// ----------------------------------------------------------------- encoder

/// A Chat client's encoding state.
pub(crate) struct ChatOut {
    model: String,
    id: String,
    created: u64,
    started: bool,
    pub(crate) include_usage: bool,
    usage: Usage,
}

impl ChatOut {
    pub(crate) fn new(model: String) -> Self {
        ChatOut {
            model,
            id: "chatcmpl-ringgate".into(),
            created: 0,
            started: false,
            include_usage: true,
            usage: Usage::default(),
        }
    }

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

    pub(crate) fn handle(&mut self, ev: Hub, out: &mut Vec<u8>) {
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
