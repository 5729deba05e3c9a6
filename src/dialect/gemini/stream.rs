//! The Gemini stream, both ways: the upstream decoder (`decode`: `streamGenerateContent?alt=sse`
//! chunks → hub events) and the client encoder (`GeminiOut`: hub events → chunks; tool calls
//! are gathered and sent whole with the final `finishReason` chunk, as Gemini sends them).
//!
//! Must not: perform IO, or allocate beyond per-stream state and the bytes it appends to `out`.

use serde_json::{json, Value};
use std::collections::BTreeMap;

use crate::dialect::error::stream_error_event_seq;
use crate::dialect::hub::{parse, push_args, upstream_error, Core, Decoded, Hub};
use crate::dialect::sse::encode_json;
use crate::dialect::util::{self, arr, s, Obj};
use crate::dialect::{gemini, Dialect, SseEvent, Usage};

// ----------------------------------------------------------------- decoder

/// One upstream Gemini chunk → hub events (a Gemini upstream needs no state of its own).
pub(crate) fn decode(core: &mut Core, ev: &SseEvent, hub: &mut Vec<Hub>) -> Decoded {
    let v = parse(&ev.data)?;
    if v.get("error").is_some_and(|e| !e.is_null()) {
        hub.push(upstream_error(&ev.data));
        return Ok(());
    }
    if !core.started {
        if let Some(u) = v.get("usageMetadata") {
            hub.push(Hub::Usage(gemini::usage_to_hub(u)));
        }
    }
    core.start(hub, s(&v, "responseId"), None);
    let cand = arr(&v, "candidates").first().unwrap_or(&Value::Null);
    for p in cand.get("content").map(|c| arr(c, "parts")).unwrap_or(&[]) {
        if p.get("thought").and_then(Value::as_bool) == Some(true) {
            if let Some(t) = s(p, "text").filter(|t| !t.is_empty()) {
                hub.push(Hub::Reasoning(t.to_string()));
            }
        }
    }
    let (text, calls) = gemini::candidate_parts(&v, core.next_tool);
    if !text.is_empty() {
        hub.push(Hub::Text(text));
    }
    for (id, name, args) in calls {
        let i = core.tool(hub, &id, &name);
        push_args(hub, i, &args);
    }
    if let Some(u) = v.get("usageMetadata") {
        hub.push(Hub::Usage(gemini::usage_to_hub(u)));
    }
    let cand = arr(&v, "candidates").first().unwrap_or(&Value::Null);
    let blocked = v
        .get("promptFeedback")
        .and_then(|f| s(f, "blockReason"))
        .is_some();
    if let Some(r) = s(cand, "finishReason") {
        let f = if core.next_tool > 0 {
            "tool_calls"
        } else {
            gemini::finish_to_chat(r)
        };
        hub.push(Hub::Finish(f.to_string()));
    } else if blocked {
        hub.push(Hub::Finish("content_filter".into()));
    }
    Ok(())
}

// ----------------------------------------------------------------- encoder

/// A Gemini client's encoding state.
pub(crate) struct GeminiOut {
    model: String,
    id: String,
    tools: BTreeMap<usize, (String, String)>,
    finish: Option<String>,
    usage: Usage,
}

impl GeminiOut {
    pub(crate) fn new(model: String) -> Self {
        GeminiOut {
            model,
            id: "ringgate".into(),
            tools: BTreeMap::new(),
            finish: None,
            usage: Usage::default(),
        }
    }

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

    pub(crate) fn handle(&mut self, ev: Hub, out: &mut Vec<u8>) {
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
