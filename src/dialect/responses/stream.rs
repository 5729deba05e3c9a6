//! The OpenAI Responses stream, both ways. The upstream decoder (`ResponsesIn`): semantic
//! events (`response.created`, `response.output_item.added`, `…function_call_arguments.*`,
//! `…output_text.delta`, `…reasoning_*.delta`, `response.completed` / `.incomplete` /
//! `.failed`, `error`) → hub events; function-call items are keyed by item id and output
//! index. The client encoder (`ResponsesOut`): hub events → OpenAI Responses semantic
//! SSE events (`response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.reasoning_text.delta/.done` (reasoning
//! items), `response.content_part.added`,
//! `response.output_text.delta/.done`, `response.content_part.done`,
//! `response.function_call_arguments.delta/.done`,
//! `response.output_item.done`, then `response.completed` or
//! `response.incomplete`; after an upstream error `response.failed`, with the
//! error and the output so far), each with an increasing `sequence_number`.
//!
//! Must not: perform IO, or allocate beyond the bytes it appends to `out` and the per-stream
//! state (the encoder's output items, kept to build the final `response` object).

use crate::dialect::error::{extract_message, stream_error_status};
use crate::dialect::hub::{parse, push_args, Core, Decoded, Hub};
use crate::dialect::responses;
use crate::dialect::sse::encode_json;
use crate::dialect::util::{self, s, Obj};
use crate::dialect::{SseEvent, Usage};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};

// ----------------------------------------------------------------- decoder

/// A Responses upstream's decoding state.
#[derive(Default)]
pub(crate) struct ResponsesIn {
    /// Function-call item id (and `#<output_index>`) → hub tool index.
    item_tools: HashMap<String, usize>,
    /// Hub tool indices that got argument fragments (`…arguments.done` repeats them).
    args_seen: HashSet<usize>,
}

impl ResponsesIn {
    fn args(&mut self, hub: &mut Vec<Hub>, index: usize, args: &str) {
        if !args.is_empty() {
            self.args_seen.insert(index);
        }
        push_args(hub, index, args);
    }

    /// One upstream Responses event → hub events.
    pub(crate) fn decode(&mut self, core: &mut Core, ev: &SseEvent, hub: &mut Vec<Hub>) -> Decoded {
        let v = parse(&ev.data)?;
        let kind = s(&v, "type").or(ev.event.as_deref()).unwrap_or_default();
        let item_key = |v: &Value| {
            s(v, "item_id")
                .map(str::to_string)
                .or_else(|| util::u(v, "output_index").map(|i| format!("#{i}")))
                .unwrap_or_default()
        };
        match kind {
            "response.created" | "response.in_progress" => {
                let r = v.get("response").unwrap_or(&Value::Null);
                core.start(hub, s(r, "id"), util::u(r, "created_at"));
            }
            "response.output_item.added" => {
                let item = v.get("item").unwrap_or(&Value::Null);
                if s(item, "type") == Some("function_call") {
                    core.start(hub, None, None);
                    let i = core.tool(
                        hub,
                        s(item, "call_id").unwrap_or_default(),
                        s(item, "name").unwrap_or_default(),
                    );
                    if let Some(id) = s(item, "id") {
                        self.item_tools.insert(id.to_string(), i);
                    }
                    if let Some(o) = util::u(&v, "output_index") {
                        self.item_tools.insert(format!("#{o}"), i);
                    }
                    self.args(hub, i, s(item, "arguments").unwrap_or_default());
                }
            }
            "response.function_call_arguments.delta" => {
                if let Some(&i) = self.item_tools.get(&item_key(&v)) {
                    self.args(hub, i, s(&v, "delta").unwrap_or_default());
                }
            }
            "response.function_call_arguments.done" => {
                if let Some(&i) = self.item_tools.get(&item_key(&v)) {
                    if !self.args_seen.contains(&i) {
                        self.args(hub, i, s(&v, "arguments").unwrap_or_default());
                    }
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                core.start(hub, None, None);
                if let Some(t) = s(&v, "delta").filter(|t| !t.is_empty()) {
                    hub.push(Hub::Text(t.to_string()));
                }
            }
            "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
                core.start(hub, None, None);
                if let Some(t) = s(&v, "delta").filter(|t| !t.is_empty()) {
                    hub.push(Hub::Reasoning(t.to_string()));
                }
            }
            "response.completed" | "response.incomplete" => {
                let r = v.get("response").unwrap_or(&Value::Null);
                core.start(hub, s(r, "id"), util::u(r, "created_at"));
                let reason = r.get("incomplete_details").and_then(|d| s(d, "reason"));
                let finish = responses::finish_of(s(r, "status"), reason, core.next_tool > 0);
                hub.push(Hub::Finish(finish.to_string()));
                if let Some(u) = r.get("usage").filter(|u| u.is_object()) {
                    hub.push(Hub::Usage(responses::usage_to_hub(u)));
                }
                hub.push(Hub::Done);
            }
            "response.failed" => {
                let r = v.get("response").unwrap_or(&Value::Null);
                let m = r
                    .get("error")
                    .and_then(|e| s(e, "message"))
                    .unwrap_or("response failed");
                hub.push(Hub::Error(
                    stream_error_status(ev.data.as_bytes()),
                    m.into(),
                ));
            }
            "error" => hub.push(Hub::Error(
                stream_error_status(ev.data.as_bytes()),
                s(&v, "message")
                    .map(str::to_string)
                    .unwrap_or_else(|| extract_message(500, ev.data.as_bytes())),
            )),
            _ => {}
        }
        Ok(())
    }
}

// ----------------------------------------------------------------- encoder

enum Item {
    Reasoning {
        id: String,
        text: String,
        done: bool,
    },
    Message {
        id: String,
        text: String,
        done: bool,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        args: String,
        done: bool,
    },
}

impl Item {
    fn json(&self, status: &str) -> Value {
        match self {
            Item::Reasoning { id, text, .. } => {
                let content = if status != "in_progress" {
                    json!([{"type": "reasoning_text", "text": text}])
                } else {
                    json!([])
                };
                json!({"id": id, "type": "reasoning", "status": status, "summary": [],
                    "content": content})
            }
            Item::Message { id, text, .. } => {
                let content = if status != "in_progress" {
                    json!([{"type": "output_text", "text": text, "annotations": []}])
                } else {
                    json!([])
                };
                json!({"id": id, "type": "message", "status": status, "role": "assistant", "content": content})
            }
            Item::Call {
                id,
                call_id,
                name,
                args,
                ..
            } => {
                let args = if status != "in_progress" {
                    args.as_str()
                } else {
                    ""
                };
                json!({"id": id, "type": "function_call", "status": status,
                    "arguments": args, "call_id": call_id, "name": name})
            }
        }
    }
}

pub(crate) struct ResponsesOut {
    model: String,
    id: String,
    created: u64,
    seq: u64,
    started: bool,
    items: Vec<Item>,
    open: Option<usize>,
    tools: HashMap<usize, usize>,
    finish: Option<String>,
    usage: Usage,
    /// The stream ended with `response.failed`.
    failed: bool,
}

impl ResponsesOut {
    pub(crate) fn new(model: String) -> Self {
        ResponsesOut {
            model,
            id: "resp_ringgate".into(),
            created: 0,
            seq: 0,
            started: false,
            items: Vec::new(),
            open: None,
            tools: HashMap::new(),
            finish: None,
            usage: Usage::default(),
            failed: false,
        }
    }

    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut v: Value) {
        // `type` and `sequence_number` first, as OpenAI sends them.
        let mut ordered = Obj::new();
        ordered.insert("type".into(), kind.into());
        ordered.insert("sequence_number".into(), self.seq.into());
        self.seq += 1;
        if let Value::Object(o) = v.take() {
            for (k, val) in o {
                ordered.entry(k).or_insert(val);
            }
        }
        encode_json(Some(kind), &Value::Object(ordered), out);
    }

    fn response(&self, status: &str, output: Vec<Value>) -> Value {
        let (usage, details) = if status == "in_progress" {
            (Value::Null, Value::Null)
        } else {
            let d = match self.finish.as_deref() {
                Some("length") => json!({"reason": "max_output_tokens"}),
                Some("content_filter") => json!({"reason": "content_filter"}),
                _ => Value::Null,
            };
            let u = if self.usage.is_empty() {
                Value::Null
            } else {
                responses::usage_from_hub(&self.usage)
            };
            (u, d)
        };
        json!({"id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": null, "incomplete_details": details, "model": self.model,
            "output": output, "usage": usage})
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let r = self.response("in_progress", vec![]);
        self.emit(out, "response.created", json!({"response": r}));
        self.emit(out, "response.in_progress", json!({"response": r}));
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        let Some(pos) = self.open.take() else { return };
        let Some(item) = self.items.get_mut(pos) else {
            return;
        };
        let events: Vec<(&str, Value)> = match item {
            Item::Reasoning { id, text, done } => {
                *done = true;
                vec![(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": pos, "content_index": 0, "text": text}),
                )]
            }
            Item::Message { id, text, done } => {
                *done = true;
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                vec![
                    (
                        "response.output_text.done",
                        json!({"item_id": id, "output_index": pos,
                        "content_index": 0, "text": text, "logprobs": []}),
                    ),
                    (
                        "response.content_part.done",
                        json!({"item_id": id, "output_index": pos,
                        "content_index": 0, "part": part}),
                    ),
                ]
            }
            Item::Call { id, args, done, .. } => {
                *done = true;
                vec![(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": pos, "arguments": args}),
                )]
            }
        };
        let full = item.json("completed");
        for (k, v) in events {
            self.emit(out, k, v);
        }
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": pos, "item": full}),
        );
    }

    /// Close the open item and open `item` at the next output index, announced
    /// (`response.output_item.added`); its index.
    fn open_item(&mut self, out: &mut Vec<u8>, item: Item) -> usize {
        self.close(out);
        let pos = self.items.len();
        let added = item.json("in_progress");
        self.items.push(item);
        self.open = Some(pos);
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": pos, "item": added}),
        );
        pos
    }

    pub(crate) fn handle(&mut self, ev: Hub, out: &mut Vec<u8>) {
        match ev {
            Hub::Start { id, created } => {
                if let Some(id) = id {
                    self.id = responses::resp_id(&id);
                }
                self.created = created.unwrap_or(self.created);
                self.start(out);
            }
            Hub::Text(t) => {
                self.start(out);
                let open_msg = self
                    .open
                    .filter(|p| matches!(self.items.get(*p), Some(Item::Message { .. })));
                let pos = match open_msg {
                    Some(p) => p,
                    None => {
                        let (resp, pos) = (self.id.trim_start_matches("resp_"), self.items.len());
                        let id = format!("msg_{resp}_{pos}");
                        let pos = self.open_item(
                            out,
                            Item::Message {
                                id: id.clone(),
                                text: String::new(),
                                done: false,
                            },
                        );
                        let part = json!({"type": "output_text", "text": "", "annotations": []});
                        self.emit(out, "response.content_part.added",
                            json!({"item_id": id, "output_index": pos, "content_index": 0, "part": part}));
                        pos
                    }
                };
                let mut item_id = String::new();
                if let Some(Item::Message { id, text, .. }) = self.items.get_mut(pos) {
                    text.push_str(&t);
                    item_id.clone_from(id);
                }
                self.emit(
                    out,
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": pos,
                    "content_index": 0, "delta": t, "logprobs": []}),
                );
            }
            Hub::Reasoning(t) => {
                self.start(out);
                let open = self
                    .open
                    .filter(|p| matches!(self.items.get(*p), Some(Item::Reasoning { .. })));
                let pos = match open {
                    Some(p) => p,
                    None => {
                        let (resp, pos) = (self.id.trim_start_matches("resp_"), self.items.len());
                        let id = format!("rs_{resp}_{pos}");
                        self.open_item(
                            out,
                            Item::Reasoning {
                                id,
                                text: String::new(),
                                done: false,
                            },
                        )
                    }
                };
                let mut item_id = String::new();
                if let Some(Item::Reasoning { id, text, .. }) = self.items.get_mut(pos) {
                    text.push_str(&t);
                    item_id.clone_from(id);
                }
                self.emit(
                    out,
                    "response.reasoning_text.delta",
                    json!({"item_id": item_id, "output_index": pos, "content_index": 0,
                        "delta": t}),
                );
            }
            // Responses reasoning items carry no Anthropic signatures.
            Hub::Signature(_) | Hub::Redacted(_) => {}
            Hub::ToolStart { index, id, name } => {
                self.start(out);
                let item = Item::Call {
                    id: format!("fc_{id}"),
                    call_id: id,
                    name,
                    args: String::new(),
                    done: false,
                };
                let pos = self.open_item(out, item);
                self.tools.insert(index, pos);
            }
            Hub::ToolArgs { index, args } => {
                let Some(&pos) = self.tools.get(&index) else {
                    return;
                };
                let mut item_id = String::new();
                if let Some(Item::Call { id, args: a, .. }) = self.items.get_mut(pos) {
                    a.push_str(&args);
                    item_id.clone_from(id);
                }
                self.emit(
                    out,
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": pos, "delta": args}),
                );
            }
            Hub::Finish(r) => {
                self.start(out);
                self.close(out);
                self.finish = Some(r);
            }
            Hub::Usage(u) => self.usage.merge(u),
            Hub::Error(st, m) => {
                // `response.failed` ends the stream: the SDKs see a failed response (the Python
                // SDK's `get_final_response()` raises), never a truncated one as completed.
                self.start(out);
                self.failed = true;
                let output: Vec<Value> = self.items.iter().map(|i| i.json("incomplete")).collect();
                let mut r = self.response("failed", output);
                if let Some(o) = r.as_object_mut() {
                    o.insert(
                        "error".into(),
                        json!({"code": responses::error_code(st), "message": m}),
                    );
                }
                self.emit(out, "response.failed", json!({"response": r}));
            }
            Hub::Done => {
                self.start(out);
                self.close(out);
                let (kind, r) = self.finished();
                self.emit(out, kind, json!({"response": r}));
            }
        }
    }

    /// The terminal event's kind and its `response` object (`completed` or `incomplete`).
    fn finished(&self) -> (&'static str, Value) {
        let output: Vec<Value> = self.items.iter().map(|i| i.json("completed")).collect();
        let incomplete = matches!(self.finish.as_deref(), Some("length" | "content_filter"));
        let (kind, status) = if incomplete {
            ("response.incomplete", "incomplete")
        } else {
            ("response.completed", "completed")
        };
        (kind, self.response(status, output))
    }

    /// The finished `response` object, as the terminal event carried it; `None` when the
    /// stream failed (for the Responses state store, which keeps only finished answers).
    pub(crate) fn finished_response(&self) -> Option<Value> {
        (!self.failed).then(|| self.finished().1)
    }
}
