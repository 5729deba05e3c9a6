//! The response phase of a stream: whole SSE events in the client's dialect (relayed as they
//! came, or written by the translator) rewritten in flight. Each text — a choice's content or
//! reasoning, a content block, a tool call's arguments, a Responses content part — is its own
//! `Chain`: a delta carries what its text may release now (possibly nothing); what is held
//! back goes out at the end of the block (Chat `finish_reason`, Messages `content_block_stop`,
//! Responses `*.done`, Gemini `finishReason`) in the block's last delta, or in a delta event
//! of the block's own shape written just before the block's end, and at the end of the stream.
//! Responses' whole-text events (`*.done`, `output_item.done`, `response.completed`) are masked
//! whole, the same way (their hits are not counted twice). Events without text pass as bytes.
//!
//! Owns: `StreamGuard`. Must not: reorder events, drop an event (a delta whose text is all held
//! back goes out with empty text), or let a byte of a `block` match out: the caller ends the
//! stream with the dialect's error event instead.

use std::rc::Rc;

use serde_json::{json, Map, Value};

use super::json_str::JsonText;
use super::request::Walk;
use super::{Blocked, Chain, Phase, Session};
use crate::dialect::{sse, Dialect, SseEvent};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Content,
    /// Chat `reasoning_content` / `reasoning`, Messages `thinking`, Gemini `thought` parts,
    /// Responses reasoning deltas.
    Reasoning,
    /// Tool-call arguments (a JSON text).
    Args,
}

/// Which text of the stream: (choice / block / output index, tool / content index, field).
type Key = (u64, u64, Field);

enum Text {
    Plain(Chain),
    Json(JsonText),
}

struct Open {
    key: Key,
    text: Text,
    /// Chat: the reasoning field's name; Messages: the delta type; Responses: the last delta
    /// event (the shape a closing delta copies).
    shape: Value,
}

/// One stream's guardrail state.
pub struct StreamGuard {
    sess: Rc<Session>,
    /// The same guardrails with a tally that is thrown away: Responses' whole-text events
    /// repeat what the deltas already counted.
    quiet: Session,
    dialect: Dialect,
    open: Vec<Open>,
    /// Chat: `id`, `object`, `created`, `model` of the last chunk (a closing chunk copies them).
    chat_head: Map<String, Value>,
    /// Responses: every event carries a `sequence_number`, increasing by one. A closing delta
    /// the guard adds takes the next one (`last_seq` + 1), and every later upstream event's
    /// number moves up by the closing deltas added so far (`seq_shift`).
    last_seq: Option<u64>,
    seq_shift: u64,
}

impl StreamGuard {
    /// `None` when the session has no response guardrails.
    pub fn new(sess: &Rc<Session>, dialect: Dialect) -> Option<StreamGuard> {
        if sess.response.is_empty() {
            return None;
        }
        Some(StreamGuard {
            sess: sess.clone(),
            quiet: Session {
                request: Vec::new(),
                response: sess.response.clone(),
                hits: Default::default(),
            },
            dialect,
            open: Vec::new(),
            chat_head: Map::new(),
            last_seq: None,
            seq_shift: 0,
        })
    }

    /// Bytes held back over all open texts (charged to the request's permit by the caller).
    pub fn held(&self) -> usize {
        self.open
            .iter()
            .map(|o| match &o.text {
                Text::Plain(c) => c.held(),
                Text::Json(j) => j.held(),
            })
            .sum()
    }

    /// Rewrite the whole SSE `events` into `out`. `Err`: a `block` match; `out` holds the
    /// events before the one that matched, and nothing of the match.
    pub fn rewrite(&mut self, events: &[u8], out: &mut Vec<u8>) -> Result<(), Blocked> {
        for ev in sse::events(events) {
            self.event(ev, out)?;
        }
        Ok(())
    }

    /// The stream ends (upstream end, before the chunked end): whatever is still held goes out
    /// in closing deltas.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), Blocked> {
        self.close_where(|_| true, out)
    }

    fn event(&mut self, ev: &[u8], out: &mut Vec<u8>) -> Result<(), Blocked> {
        let Some(SseEvent { event: name, data }) = sse::parse(ev) else {
            out.extend_from_slice(ev);
            return Ok(());
        };
        if data.trim() == "[DONE]" {
            self.close_where(|_| true, out)?;
            out.extend_from_slice(ev);
            return Ok(());
        }
        let Ok(mut v) = serde_json::from_str::<Value>(&data) else {
            out.extend_from_slice(ev);
            return Ok(());
        };
        let mut changed = match self.dialect {
            Dialect::Chat => self.chat(&mut v, out)?,
            Dialect::Messages => self.messages(&mut v, out)?,
            Dialect::Responses => self.responses(&mut v, out)?,
            Dialect::Gemini => self.gemini(&mut v)?,
        };
        if self.dialect == Dialect::Responses {
            changed |= self.renumber(&mut v);
        }
        if changed {
            sse::encode_json(name.as_deref(), &v, out);
        } else {
            out.extend_from_slice(ev);
        }
        if self.dialect == Dialect::Responses {
            let key = responses_key(&v);
            if let Some(o) = self.open.iter_mut().find(|o| Some(o.key) == key) {
                o.shape = v;
            }
        }
        Ok(())
    }

    /// Responses: move an upstream event's `sequence_number` up by the closing deltas added
    /// before it (true when it changed), and remember it as the last number sent.
    fn renumber(&mut self, v: &mut Value) -> bool {
        let Some(n) = v.get("sequence_number").and_then(Value::as_u64) else {
            return false;
        };
        let moved = n.saturating_add(self.seq_shift);
        self.last_seq = Some(moved);
        if self.seq_shift == 0 {
            return false;
        }
        if let Some(o) = v.as_object_mut() {
            o.insert("sequence_number".into(), Value::from(moved));
        }
        true
    }

    /// Feed `s` (a text value, replaced by what it may release now) to the text `key`.
    fn feed(&mut self, key: Key, s: &mut String, last: bool) -> Result<(), Blocked> {
        let sess = &*self.sess;
        let i = match self.open.iter().position(|o| o.key == key) {
            Some(i) => i,
            None => {
                let text = match key.2 {
                    Field::Args => Text::Json(JsonText::new(&sess.response)),
                    _ => Text::Plain(Chain::new(&sess.response)),
                };
                self.open.push(Open {
                    key,
                    text,
                    shape: Value::Null,
                });
                self.open.len() - 1
            }
        };
        let Some(o) = self.open.get_mut(i) else {
            return Ok(());
        };
        let mut released = String::with_capacity(s.len());
        let g = &sess.response;
        match &mut o.text {
            Text::Plain(c) => c.feed(g, sess, Phase::Response, s, last, &mut released)?,
            Text::Json(j) => j.feed(g, sess, Phase::Response, s, last, &mut released)?,
        }
        *s = released;
        if last {
            self.open.remove(i);
        }
        Ok(())
    }

    /// Close every open text `which` selects; each non-empty tail goes out in a closing delta
    /// event written to `out` (Chat, Messages, Responses, Gemini shapes).
    fn close_where(
        &mut self,
        which: impl Fn(&Key) -> bool,
        out: &mut Vec<u8>,
    ) -> Result<(), Blocked> {
        let keys: Vec<(Key, Value)> = self
            .open
            .iter()
            .filter(|o| which(&o.key))
            .map(|o| (o.key, o.shape.clone()))
            .collect();
        for (key, shape) in keys {
            let mut tail = String::new();
            self.feed(key, &mut tail, true)?;
            if tail.is_empty() {
                continue;
            }
            let (name, mut v) = self.closing_delta(key, shape, tail);
            if self.dialect == Dialect::Responses {
                if let (Some(o), Some(last)) = (v.as_object_mut(), self.last_seq) {
                    let next = last.saturating_add(1);
                    o.insert("sequence_number".into(), Value::from(next));
                    self.last_seq = Some(next);
                    self.seq_shift = self.seq_shift.saturating_add(1);
                }
            }
            sse::encode_json(name, &v, out);
        }
        Ok(())
    }

    /// A delta event carrying `tail` for the text `key`, in the stream's dialect.
    fn closing_delta(&self, key: Key, shape: Value, tail: String) -> (Option<&'static str>, Value) {
        let (a, b, field) = key;
        match self.dialect {
            Dialect::Chat => {
                let mut delta = Map::new();
                match field {
                    Field::Content => {
                        delta.insert("content".into(), Value::String(tail));
                    }
                    Field::Reasoning => {
                        let name = shape.as_str().unwrap_or("reasoning_content").to_string();
                        delta.insert(name, Value::String(tail));
                    }
                    Field::Args => {
                        delta.insert(
                            "tool_calls".into(),
                            json!([{"index": b, "function": {"arguments": tail}}]),
                        );
                    }
                }
                let mut v = self.chat_head.clone();
                v.insert(
                    "choices".into(),
                    json!([{"index": a, "delta": delta, "finish_reason": null}]),
                );
                (None, Value::Object(v))
            }
            Dialect::Messages => {
                let delta = match field {
                    Field::Content => json!({"type": "text_delta", "text": tail}),
                    Field::Reasoning => json!({"type": "thinking_delta", "thinking": tail}),
                    Field::Args => json!({"type": "input_json_delta", "partial_json": tail}),
                };
                (
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": a, "delta": delta}),
                )
            }
            Dialect::Responses => {
                let mut v = shape;
                if let Some(o) = v.as_object_mut() {
                    o.insert("delta".into(), Value::String(tail));
                }
                let name = v
                    .get("type")
                    .and_then(Value::as_str)
                    .map(|t| -> &'static str {
                        match t {
                            "response.function_call_arguments.delta" => {
                                "response.function_call_arguments.delta"
                            }
                            "response.reasoning_summary_text.delta" => {
                                "response.reasoning_summary_text.delta"
                            }
                            "response.reasoning_text.delta" => "response.reasoning_text.delta",
                            _ => "response.output_text.delta",
                        }
                    });
                (name, v)
            }
            Dialect::Gemini => {
                let mut part = json!({"text": tail});
                if field == Field::Reasoning {
                    part["thought"] = Value::Bool(true);
                }
                (
                    None,
                    json!({"candidates": [{"content": {"role": "model", "parts": [part]}, "index": a}]}),
                )
            }
        }
    }

    fn chat(&mut self, v: &mut Value, out: &mut Vec<u8>) -> Result<bool, Blocked> {
        let Some(o) = v.as_object_mut() else {
            return Ok(false);
        };
        if self.chat_head.is_empty() {
            // the first chunk's (every chunk of a stream repeats them)
            for k in ["id", "object", "created", "model", "system_fingerprint"] {
                if let Some(x) = o.get(k) {
                    self.chat_head.insert(k.into(), x.clone());
                }
            }
        }
        let Some(Value::Array(choices)) = o.get_mut("choices") else {
            return Ok(false);
        };
        let mut changed = false;
        for (pos, c) in choices.iter_mut().enumerate() {
            let (idx, finished) = index_and_end(c, pos, "finish_reason");
            let Some(delta) = c.get_mut("delta").and_then(Value::as_object_mut) else {
                continue;
            };
            if let Some(Value::String(s)) = delta.get_mut("content") {
                self.feed((idx, 0, Field::Content), s, false)?;
                changed = true;
            }
            for name in ["reasoning_content", "reasoning"] {
                if let Some(Value::String(s)) = delta.get_mut(name) {
                    self.feed((idx, 0, Field::Reasoning), s, false)?;
                    if let Some(o) = self
                        .open
                        .iter_mut()
                        .find(|o| o.key == (idx, 0, Field::Reasoning))
                    {
                        o.shape = Value::String(name.into());
                    }
                    changed = true;
                }
            }
            if let Some(Value::Array(calls)) = delta.get_mut("tool_calls") {
                for (tpos, call) in calls.iter_mut().enumerate() {
                    let t = call
                        .get("index")
                        .and_then(Value::as_u64)
                        .unwrap_or(tpos as u64);
                    if let Some(Value::String(s)) = call
                        .get_mut("function")
                        .and_then(|f| f.get_mut("arguments"))
                    {
                        self.feed((idx, t, Field::Args), s, false)?;
                        changed = true;
                    }
                }
            }
            if finished {
                changed |= self.close_choice(idx, delta)?;
            }
        }
        let _ = out;
        Ok(changed)
    }

    /// Chat: choice `idx` finished; its held tails go into this (last) chunk's delta.
    fn close_choice(&mut self, idx: u64, delta: &mut Map<String, Value>) -> Result<bool, Blocked> {
        let keys: Vec<(Key, Value)> = self
            .open
            .iter()
            .filter(|o| o.key.0 == idx)
            .map(|o| (o.key, o.shape.clone()))
            .collect();
        let mut changed = false;
        for (key, shape) in keys {
            let mut tail = String::new();
            self.feed(key, &mut tail, true)?;
            if tail.is_empty() {
                continue;
            }
            changed = true;
            let field = match key.2 {
                Field::Content => "content".to_string(),
                Field::Reasoning => shape.as_str().unwrap_or("reasoning_content").to_string(),
                Field::Args => {
                    let calls = delta
                        .entry("tool_calls")
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Some(a) = calls.as_array_mut() {
                        a.push(json!({"index": key.1, "function": {"arguments": tail}}));
                    }
                    continue;
                }
            };
            let prev = delta
                .get(&field)
                .and_then(Value::as_str)
                .unwrap_or_default();
            let joined = format!("{prev}{tail}");
            delta.insert(field, Value::String(joined));
        }
        Ok(changed)
    }

    fn messages(&mut self, v: &mut Value, out: &mut Vec<u8>) -> Result<bool, Blocked> {
        let ty = v.get("type").and_then(Value::as_str).unwrap_or_default();
        let idx = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match ty {
            "content_block_start" => {
                let Some(b) = v.get_mut("content_block") else {
                    return Ok(false);
                };
                let mut changed = false;
                for (name, field) in [("text", Field::Content), ("thinking", Field::Reasoning)] {
                    if let Some(Value::String(s)) = b.get_mut(name) {
                        if !s.is_empty() {
                            self.feed((idx, 0, field), s, false)?;
                            changed = true;
                        }
                    }
                }
                Ok(changed)
            }
            "content_block_delta" => {
                let Some(d) = v.get_mut("delta") else {
                    return Ok(false);
                };
                for (name, field) in [
                    ("text", Field::Content),
                    ("thinking", Field::Reasoning),
                    ("partial_json", Field::Args),
                ] {
                    if let Some(Value::String(s)) = d.get_mut(name) {
                        self.feed((idx, 0, field), s, false)?;
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            "content_block_stop" => {
                self.close_where(|k| k.0 == idx, out)?;
                Ok(false)
            }
            "message_stop" | "message_delta" => {
                self.close_where(|_| true, out)?;
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    fn responses(&mut self, v: &mut Value, out: &mut Vec<u8>) -> Result<bool, Blocked> {
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let key = responses_key(v);
        match ty.as_str() {
            "response.output_text.delta"
            | "response.reasoning_summary_text.delta"
            | "response.reasoning_text.delta"
            | "response.function_call_arguments.delta" => {
                let (Some(key), Some(Value::String(s))) = (key, v.get_mut("delta")) else {
                    return Ok(false);
                };
                self.feed(key, s, false)?;
                Ok(true)
            }
            "response.output_text.done"
            | "response.reasoning_summary_text.done"
            | "response.reasoning_text.done"
            | "response.function_call_arguments.done" => {
                if let Some(key) = key {
                    self.close_where(|k| *k == key, out)?;
                }
                let mut w = self.quiet_walk();
                w.text(v.get_mut("text"))?;
                w.json_text(v.get_mut("arguments"))?;
                Ok(w.changed)
            }
            "response.content_part.done" | "response.reasoning_summary_part.done" => {
                let mut w = self.quiet_walk();
                if let Some(p) = v.get_mut("part") {
                    w.part(p)?;
                }
                Ok(w.changed)
            }
            "response.output_item.done" => {
                let mut w = self.quiet_walk();
                if let Some(p) = v.get_mut("item") {
                    w.part(p)?;
                }
                Ok(w.changed)
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.close_where(|_| true, out)?;
                let mut w = self.quiet_walk();
                if let Some(r) = v.get_mut("response") {
                    super::answer::walk_answer(&mut w, Dialect::Responses, r)?;
                }
                Ok(w.changed)
            }
            _ => Ok(false),
        }
    }

    fn quiet_walk(&self) -> Walk<'_> {
        Walk::response(&self.quiet)
    }

    fn gemini(&mut self, v: &mut Value) -> Result<bool, Blocked> {
        let Some(Value::Array(cands)) = v.get_mut("candidates") else {
            return Ok(false);
        };
        let mut changed = false;
        for (pos, c) in cands.iter_mut().enumerate() {
            let (idx, finished) = index_and_end(c, pos, "finishReason");
            if let Some(Value::Array(parts)) = c.get_mut("content").and_then(|x| x.get_mut("parts"))
            {
                for p in parts.iter_mut() {
                    let field = if p.get("thought").and_then(Value::as_bool) == Some(true) {
                        Field::Reasoning
                    } else {
                        Field::Content
                    };
                    if let Some(Value::String(s)) = p.get_mut("text") {
                        self.feed((idx, 0, field), s, false)?;
                        changed = true;
                    } else if p.get("functionCall").is_some() {
                        // whole calls: masked at once (args are a JSON value, not a text)
                        let sess = self.sess.clone();
                        let mut w = Walk::response(&sess);
                        w.part(p)?;
                        changed |= w.changed;
                    }
                }
            }
            if finished {
                for field in [Field::Reasoning, Field::Content] {
                    let key = (idx, 0, field);
                    if !self.open.iter().any(|o| o.key == key) {
                        continue;
                    }
                    let mut tail = String::new();
                    self.feed(key, &mut tail, true)?;
                    if tail.is_empty() {
                        continue;
                    }
                    changed = true;
                    let content = c.as_object_mut().map(|o| {
                        o.entry("content")
                            .or_insert_with(|| json!({"role": "model"}))
                    });
                    let Some(Value::Object(content)) = content else {
                        continue;
                    };
                    let parts = content.entry("parts").or_insert_with(|| json!([]));
                    let Some(parts) = parts.as_array_mut() else {
                        continue;
                    };
                    let thought = field == Field::Reasoning;
                    let last = parts.iter_mut().rev().find(|p| {
                        p.get("text").is_some()
                            && (p.get("thought").and_then(Value::as_bool) == Some(true)) == thought
                    });
                    match last.and_then(|p| p.get_mut("text")) {
                        Some(Value::String(s)) => s.push_str(&tail),
                        _ => {
                            let mut part = json!({"text": tail});
                            if thought {
                                part["thought"] = Value::Bool(true);
                            }
                            parts.push(part);
                        }
                    }
                }
            }
        }
        Ok(changed)
    }
}

/// A streamed choice's (Gemini: candidate's) index, else its position, and whether it ends
/// there (a non-null `finish` field).
fn index_and_end(c: &Value, pos: usize, finish: &str) -> (u64, bool) {
    let idx = c.get("index").and_then(Value::as_u64).unwrap_or(pos as u64);
    (idx, c.get(finish).is_some_and(|f| !f.is_null()))
}

/// The text a Responses delta / done event belongs to.
fn responses_key(v: &Value) -> Option<Key> {
    let ty = v.get("type")?.as_str()?;
    let out = v.get("output_index").and_then(Value::as_u64).unwrap_or(0);
    let part = v
        .get("content_index")
        .or_else(|| v.get("summary_index"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let field = if ty.starts_with("response.output_text.") {
        Field::Content
    } else if ty.starts_with("response.function_call_arguments.") {
        Field::Args
    } else if ty.starts_with("response.reasoning") {
        Field::Reasoning
    } else {
        return None;
    };
    Some((out, part, field))
}
