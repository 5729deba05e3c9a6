//! Bedrock ConverseStream events → hub Chat chunks. The AWS event-stream framing is decoded
//! (CRCs, bounds) by `upstream::bedrock::eventstream`; each message arrives here as its
//! `:event-type` (or, for an exception, its `:exception-type`) and its JSON payload, and leaves
//! as Chat `chat.completion.chunk` events that the `StreamTranslator` (upstream dialect Chat)
//! writes in the client's dialect — so every client dialect gets Converse streams through the
//! one Chat decoder.
//!
//! Mapped: `messageStart` → the role chunk; `contentBlockStart` with `toolUse` → a tool call
//! (id, name) at the next tool index; `contentBlockDelta` `text` → content, `toolUse.input` →
//! argument fragments of that block's call (unmodified: concatenated they are the upstream's
//! input JSON), `reasoningContent.text` → `reasoning_content`; `messageStop` → the finish
//! reason, held until `metadata` brings usage (sent together, or the usage in its own
//! `choices: []` chunk when the Chat client asked for it); an exception → an `error` chunk
//! (`throttlingException` → `rate_limit_exceeded`, 429; `validationException` → 400; others
//! server errors), which ends the stream.
//!
//! Owns: `ConverseChunks`. Must not: do IO or read clocks (id and time are given).

use serde_json::{json, Value};

use crate::dialect::converse::{stop_to_finish, usage_to_chat};
use crate::dialect::util::{s, u};
use crate::dialect::{SseEvent, TranslateError};

/// One stream's Converse → Chat chunk state.
pub struct ConverseChunks {
    id: String,
    created: u64,
    model: String,
    /// Separate usage chunk (`choices: []`) vs usage on the finish chunk.
    usage_chunk: bool,
    /// contentBlockIndex → Chat tool index.
    tools: Vec<(u64, usize)>,
    finish: Option<&'static str>,
    done: bool,
}

impl ConverseChunks {
    /// `usage_chunk`: the Chat client asked for `stream_options.include_usage`.
    pub fn new(id: &str, created: u64, model: &str, usage_chunk: bool) -> ConverseChunks {
        ConverseChunks {
            id: id.to_string(),
            created,
            model: model.to_string(),
            usage_chunk,
            tools: Vec::new(),
            finish: None,
            done: false,
        }
    }

    /// Whether the upstream's last event (`metadata` after `messageStop`, or an exception)
    /// arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    fn chunk(&self, delta: Value, finish: Option<&str>, out: &mut Vec<SseEvent>) {
        let v = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        out.push(SseEvent::new(None, &v.to_string()));
    }

    /// One Converse event (`kind`: its event type; `exception`: an exception message, `kind`
    /// then names the exception) → Chat chunks appended to `out`.
    pub fn push(
        &mut self,
        kind: &str,
        exception: bool,
        payload: &[u8],
        out: &mut Vec<SseEvent>,
    ) -> Result<(), TranslateError> {
        if self.done {
            return Ok(());
        }
        let v: Value = serde_json::from_slice(payload)
            .map_err(|e| TranslateError::new(format!("malformed Converse stream event: {e}")))?;
        if exception {
            let (typ, code) = match kind {
                "throttlingException" => ("rate_limit_exceeded", 429),
                "validationException" => ("invalid_request_error", 400),
                "serviceUnavailableException" => ("server_error", 503),
                _ => ("server_error", 500),
            };
            let msg = s(&v, "message")
                .or_else(|| s(&v, "Message"))
                .unwrap_or(kind);
            let e = json!({"error": {"message": msg, "type": typ, "code": code}});
            out.push(SseEvent::new(None, &e.to_string()));
            self.done = true;
            return Ok(());
        }
        match kind {
            "messageStart" => self.chunk(json!({"role": "assistant", "content": ""}), None, out),
            "contentBlockStart" => {
                let block = u(&v, "contentBlockIndex").unwrap_or(0);
                if let Some(tu) = v.get("start").and_then(|st| st.get("toolUse")) {
                    let index = self.tools.len();
                    self.tools.push((block, index));
                    let call = json!([{"index": index, "id": s(tu, "toolUseId").unwrap_or_default(),
                        "type": "function",
                        "function": {"name": s(tu, "name").unwrap_or_default(), "arguments": ""}}]);
                    self.chunk(json!({ "tool_calls": call }), None, out);
                }
            }
            "contentBlockDelta" => {
                let block = u(&v, "contentBlockIndex").unwrap_or(0);
                let d = v.get("delta").unwrap_or(&Value::Null);
                if let Some(t) = s(d, "text") {
                    if !t.is_empty() {
                        self.chunk(json!({ "content": t }), None, out);
                    }
                } else if let Some(input) = d.get("toolUse").and_then(|t| s(t, "input")) {
                    let Some(&(_, index)) = self.tools.iter().find(|(b, _)| *b == block) else {
                        return Err(TranslateError::new(
                            "Converse tool input for a block that did not start a tool call",
                        ));
                    };
                    if !input.is_empty() {
                        let call = json!([{"index": index, "function": {"arguments": input}}]);
                        self.chunk(json!({ "tool_calls": call }), None, out);
                    }
                } else if let Some(r) = d.get("reasoningContent").and_then(|r| s(r, "text")) {
                    if !r.is_empty() {
                        self.chunk(json!({ "reasoning_content": r }), None, out);
                    }
                }
            }
            "messageStop" => {
                let f = stop_to_finish(s(&v, "stopReason").unwrap_or("end_turn"));
                let f = if f == "stop" && !self.tools.is_empty() {
                    "tool_calls"
                } else {
                    f
                };
                self.finish = Some(f);
            }
            "metadata" => {
                let usage = v.get("usage").filter(|u| u.is_object()).map(usage_to_chat);
                self.end(usage, out);
            }
            // contentBlockStop, and event types added later: nothing to say
            _ => {}
        }
        Ok(())
    }

    /// The finish chunk (and usage) once: on `metadata`, or at the end of the body.
    fn end(&mut self, usage: Option<Value>, out: &mut Vec<SseEvent>) {
        if self.done {
            return;
        }
        self.done = true;
        let finish = self.finish.take().unwrap_or("stop");
        match usage {
            Some(u) if self.usage_chunk => {
                self.chunk(json!({}), Some(finish), out);
                let v = json!({"id": self.id, "object": "chat.completion.chunk",
                    "created": self.created, "model": self.model, "choices": [], "usage": u});
                out.push(SseEvent::new(None, &v.to_string()));
            }
            Some(u) => {
                let v = json!({"id": self.id, "object": "chat.completion.chunk",
                    "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": u});
                out.push(SseEvent::new(None, &v.to_string()));
            }
            None => self.chunk(json!({}), Some(finish), out),
        }
        out.push(SseEvent::new(None, "[DONE]"));
    }

    /// The body ended: a stream that said `messageStop` but no `metadata` still finishes
    /// (`true`); one that never said `messageStop` was cut (`false`).
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> bool {
        if self.done {
            return true;
        }
        if self.finish.is_some() {
            self.end(None, out);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_tool_and_usage() {
        let mut c = ConverseChunks::new("id1", 7, "m", false);
        let mut out = Vec::new();
        let evs: [(&str, &str); 7] = [
            ("messageStart", r#"{"role":"assistant"}"#),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":0,"delta":{"text":"hi"}}"#,
            ),
            (
                "contentBlockStart",
                r#"{"contentBlockIndex":1,"start":{"toolUse":{"toolUseId":"t","name":"f"}}}"#,
            ),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{\"a\""}}}"#,
            ),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":":1}"}}}"#,
            ),
            ("messageStop", r#"{"stopReason":"tool_use"}"#),
            (
                "metadata",
                r#"{"usage":{"inputTokens":1,"outputTokens":2,"totalTokens":3},"metrics":{"latencyMs":1}}"#,
            ),
        ];
        for (k, p) in evs {
            c.push(k, false, p.as_bytes(), &mut out).unwrap();
        }
        assert!(c.is_done());
        let data: Vec<&str> = out.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data.len(), 7, "{data:?}");
        assert!(data[3].contains(r#""arguments":"{\"a\"""#));
        assert!(
            data[5].contains(r#""finish_reason":"tool_calls""#) && data[5].contains("\"usage\"")
        );
        assert_eq!(data[6], "[DONE]");
        // a delta for a block that never started a tool call is malformed
        let mut c = ConverseChunks::new("i", 0, "m", true);
        let bad = br#"{"contentBlockIndex":4,"delta":{"toolUse":{"input":"{"}}}"#;
        assert!(c.push("contentBlockDelta", false, bad, &mut out).is_err());
        assert!(!c.finish(&mut out), "no messageStop: cut");
    }

    #[test]
    fn exceptions_end_the_stream() {
        let mut c = ConverseChunks::new("i", 0, "m", false);
        let mut out = Vec::new();
        c.push(
            "throttlingException",
            true,
            br#"{"message":"slow down"}"#,
            &mut out,
        )
        .unwrap();
        assert!(c.is_done());
        assert!(out[0].data.contains("rate_limit_exceeded") && out[0].data.contains("slow down"));
    }
}
