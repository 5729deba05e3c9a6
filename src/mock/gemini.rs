//! The mock's Google Gemini dialect (`POST /v1beta/models/{model}:generateContent`,
//! `:streamGenerateContent` and `:countTokens`): a `GenerateContentResponse`, or a stream of them
//! (SSE `data:` lines with `alt=sse`, a JSON array without), the last chunk carrying
//! `finishReason` and `usageMetadata`; token counts as `{"totalTokens": N}`. Function calls arrive whole (`functionCall {name, args}`), as Gemini
//! documents, never in fragments.
//!
//! Owns: the exact bytes of those answers. Must not: parse HTTP or URLs, decide timing (`pace`)
//! or when to call a tool (`tools`).

use std::io::Write;

use sonic_rs::JsonValueTrait;

use super::speaker::{self, Speaker};
use super::{pace, text, tools, MockRequest};
use crate::error::push_json_str;

/// How the mock speaks Gemini (served under `/v1beta/models/{model}:…`, no fixed path).
pub static SPEAKER: Speaker = Speaker {
    path: None,
    turns: "contents",
    system: Some("systemInstruction"),
    text: "parts",
    string_turns: false,
    limit: |f| {
        Ok(f.nested("generationConfig", "maxOutputTokens")
            .and_then(|v| v.as_u64()))
    },
    reasoning: speaker::no_reasoning,
    forced_tool: speaker::never_forced,
    user_turn,
    body: response_body,
    events: |req, sse| Box::new(events(req, sse)),
    failed: None,
};

/// A `user` (or role-less) turn without `functionResponse` parts.
fn user_turn(turn: &serde_json::Value) -> bool {
    let function_response = tools::has_part(turn, "parts", |p| {
        p.get("functionResponse").is_some() || p.get("function_response").is_some()
    });
    matches!(tools::role(turn), None | Some("user")) && !function_response
}

const RESPONSE_ID: &str = "mock";

fn push_text_part(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(b"{\"text\":");
    push_json_str(out, s);
    out.push(b'}');
}

fn push_call_part(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b"{\"functionCall\":{\"name\":");
    push_json_str(out, name);
    out.extend_from_slice(b",\"args\":");
    out.extend_from_slice(tools::TOOL_ARGS.as_bytes());
    out.extend_from_slice(b"}}");
}

/// One `GenerateContentResponse` whose parts are written by `parts`; `last` adds
/// `finishReason`. Every response carries `usageMetadata`, as Gemini's stream chunks do, with
/// the output tokens so far (`so_far`; the last one: the answer's).
fn push_response(
    out: &mut Vec<u8>,
    req: &MockRequest,
    (last, so_far): (bool, u32),
    parts: impl FnOnce(&mut Vec<u8>),
) {
    out.extend_from_slice(b"{\"candidates\":[{\"content\":{\"parts\":[");
    parts(out);
    out.extend_from_slice(b"],\"role\":\"model\"},");
    if last {
        out.extend_from_slice(b"\"finishReason\":\"STOP\",");
    }
    out.extend_from_slice(b"\"index\":0}],");
    {
        let o = if last {
            req.usage_output_tokens()
        } else {
            so_far
        };
        let _ = write!(
            out,
            "\"usageMetadata\":{{\"promptTokenCount\":{},\"candidatesTokenCount\":{o},\"totalTokenCount\":{}}},",
            req.input_tokens,
            req.input_tokens + o
        );
    }
    out.extend_from_slice(b"\"modelVersion\":");
    push_json_str(out, &req.model);
    let _ = write!(out, ",\"responseId\":\"{RESPONSE_ID}\"}}");
}

/// `countTokens` answer: `{"totalTokens": N}` with N = body bytes / 4 (at least 1).
pub fn count_tokens_body(body: &[u8]) -> Vec<u8> {
    format!("{{\"totalTokens\":{}}}", (body.len() / 4).max(1)).into_bytes()
}

/// The non-stream response body.
pub fn response_body(req: &MockRequest) -> Vec<u8> {
    let mut out = Vec::with_capacity(320 + req.output_tokens as usize * 5);
    push_response(&mut out, req, (true, 0), |out| match &req.tool_call {
        Some(name) => {
            push_text_part(out, tools::TOOL_TEXT);
            out.push(b',');
            push_call_part(out, name);
        }
        None => push_text_part(out, &text::tokens(0, req.output_tokens)),
    });
    out
}

/// The chunks of one streamed answer: one per token, or (tool call) the text then the call.
struct GeminiEvents<'a> {
    req: &'a MockRequest,
    /// `true`: SSE `data:` lines; `false`: elements of one JSON array.
    sse: bool,
}

impl pace::Events for GeminiEvents<'_> {
    fn head(&mut self, out: &mut Vec<u8>) {
        if !self.sse {
            out.push(b'[');
        }
    }

    fn units(&self) -> u32 {
        match self.req.tool_call {
            Some(_) => 2,
            None => self.req.output_tokens,
        }
    }

    fn unit(&mut self, i: u32, out: &mut Vec<u8>) {
        let req = self.req;
        let last = i + 1 == self.units();
        if self.sse {
            out.extend_from_slice(b"data: ");
        } else if i > 0 {
            out.extend_from_slice(b",\n");
        }
        push_response(out, req, (last, i + 1), |out| match &req.tool_call {
            Some(name) if i > 0 => push_call_part(out, name),
            Some(_) => push_text_part(out, tools::TOOL_TEXT),
            None => push_text_part(out, text::token(i)),
        });
        if self.sse {
            out.extend_from_slice(b"\n\n");
        }
    }

    fn tail(&mut self, out: &mut Vec<u8>) {
        if !self.sse {
            out.push(b']');
        }
    }
}

/// The paced units of `req`'s stream: SSE events (`sse`) or the elements of one JSON array.
pub fn events(req: &MockRequest, sse: bool) -> impl pace::Events + '_ {
    GeminiEvents { req, sse }
}
