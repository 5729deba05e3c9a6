//! The mock's Anthropic Messages dialect (`POST /v1/messages`, `/v1/messages/count_tokens`):
//! the non-stream `message` object and the SSE stream `message_start`, `content_block_start`,
//! `ping`, `content_block_delta` (`text_delta` / `input_json_delta`; with `thinking` enabled a
//! `thinking` block first: `thinking_delta`s and a `signature_delta`), `content_block_stop`,
//! `message_delta`, `message_stop`. A forced tool call (`tool_choice` `any` / `tool`) comes
//! without the text before it, as Anthropic answers one.
//!
//! Owns: the exact bytes of those answers. Must not: parse HTTP, decide timing (`pace`) or when
//! to call a tool (`tools`).

use std::io::Write;

use sonic_rs::JsonValueTrait;

use super::speaker::Speaker;
use super::{pace, text, tools, Fields, MockRequest};
use crate::error::push_json_str;

/// How the mock speaks Anthropic Messages: `max_tokens` required, `thinking` enabled (or
/// adaptive) asks for reasoning, `tool_choice` `any` / `tool` forces the call.
pub static SPEAKER: Speaker = Speaker {
    path: Some(b"/v1/messages"),
    turns: "messages",
    system: Some("system"),
    text: "content",
    string_turns: false,
    limit: |f| {
        Ok(Some(
            f.u64("max_tokens").ok_or("max_tokens: Field required")?,
        ))
    },
    reasoning,
    forced_tool,
    user_turn,
    body: message_body,
    events: |req, _| Box::new(events(req)),
    failed: None,
};

fn reasoning(f: &Fields<'_>) -> bool {
    f.nested("thinking", "type")
        .and_then(|t| t.as_str().map(|t| t == "enabled" || t == "adaptive"))
        .unwrap_or(false)
}

/// `tool_choice` `any`, or `tool` (whose `name` becomes the tool called).
fn forced_tool(f: &Fields<'_>, call: &mut Option<String>) -> bool {
    match f.nested("tool_choice", "type") {
        Some(t) if t.as_str() == Some("tool") => {
            let named = f.nested("tool_choice", "name");
            if let (Some(call), Some(n)) = (call.as_mut(), named) {
                if let Some(n) = n.as_str() {
                    *call = n.to_string();
                }
            }
            true
        }
        Some(t) => t.as_str() == Some("any"),
        None => false,
    }
}

/// A user turn without `tool_result` blocks.
fn user_turn(turn: &serde_json::Value) -> bool {
    let tool_result = tools::has_part(turn, "content", |b| {
        b.get("type").and_then(|t| t.as_str()) == Some("tool_result")
    });
    tools::role(turn) == Some("user") && !tool_result
}

const MSG_ID: &str = "msg_mock";

fn stop_reason(req: &MockRequest) -> &'static str {
    if req.tool_call.is_some() {
        "tool_use"
    } else {
        "end_turn"
    }
}

fn push_message_open(out: &mut Vec<u8>, req: &MockRequest) {
    let _ = write!(
        out,
        "{{\"id\":\"{MSG_ID}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":"
    );
    push_json_str(out, &req.model);
    out.extend_from_slice(b",\"content\":[");
}

fn push_tool_use(out: &mut Vec<u8>, name: &str, input: &str) {
    let _ = write!(
        out,
        "{{\"type\":\"tool_use\",\"id\":\"{}\",\"name\":",
        tools::TOOLU_ID
    );
    push_json_str(out, name);
    out.extend_from_slice(b",\"input\":");
    out.extend_from_slice(input.as_bytes());
    out.push(b'}');
}

/// The non-stream response body.
pub fn message_body(req: &MockRequest) -> Vec<u8> {
    let mut out = Vec::with_capacity(320 + req.output_tokens as usize * 5);
    push_message_open(&mut out, req);
    if req.reasoning {
        out.extend_from_slice(b"{\"type\":\"thinking\",\"thinking\":");
        push_json_str(&mut out, &text::reasoning());
        let _ = write!(out, ",\"signature\":\"{}\"}},", text::SIGNATURE);
    }
    match &req.tool_call {
        Some(name) if req.forced_tool => push_tool_use(&mut out, name, tools::TOOL_ARGS),
        Some(name) => {
            out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
            push_json_str(&mut out, tools::TOOL_TEXT);
            out.extend_from_slice(b"},");
            push_tool_use(&mut out, name, tools::TOOL_ARGS);
        }
        None => {
            out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
            push_json_str(&mut out, &text::tokens(0, req.output_tokens));
            out.push(b'}');
        }
    }
    let _ = write!(
        out,
        "],\"stop_reason\":\"{}\",\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{},\"output_tokens\":{}}}}}",
        stop_reason(req),
        req.input_tokens,
        req.usage_output_tokens()
    );
    out
}

/// `count_tokens` answer: `{"input_tokens": N}` with N = body bytes / 4.
pub fn count_tokens_body(body: &[u8]) -> Vec<u8> {
    format!("{{\"input_tokens\":{}}}", (body.len() / 4).max(1)).into_bytes()
}

/// The stream of one answer: units are tokens, or (tool call) the text then argument fragments.
struct MessagesEvents<'a> {
    req: &'a MockRequest,
}

fn text_delta(out: &mut Vec<u8>, index: u32, s: &str) {
    pace::named_event(out, "content_block_delta");
    let _ = write!(
        out,
        "{{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"text_delta\",\"text\":"
    );
    push_json_str(out, s);
    out.extend_from_slice(b"}}\n\n");
}

/// The first content block's index: 1 after a thinking block.
fn base(req: &MockRequest) -> u32 {
    u32::from(req.reasoning)
}

/// A forced tool call (`tool_choice` `any` / `tool`) has no text before it.
fn preamble(req: &MockRequest) -> bool {
    !(req.tool_call.is_some() && req.forced_tool)
}

/// The tool_use block's index.
fn tool_block(req: &MockRequest) -> u32 {
    base(req) + u32::from(preamble(req))
}

/// The thinking block of a reasoning answer: start, `thinking_delta`s, `signature_delta`, stop.
fn thinking_block(out: &mut Vec<u8>) {
    pace::named_event(out, "content_block_start");
    out.extend_from_slice(b"{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n");
    for r in text::REASONING {
        pace::named_event(out, "content_block_delta");
        out.extend_from_slice(b"{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":");
        push_json_str(out, r);
        out.extend_from_slice(b"}}\n\n");
    }
    pace::named_event(out, "content_block_delta");
    let _ = write!(
        out,
        "{{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"signature_delta\",\"signature\":\"{}\"}}}}\n\n",
        text::SIGNATURE
    );
    block_stop(out, 0);
}

fn block_stop(out: &mut Vec<u8>, index: u32) {
    pace::named_event(out, "content_block_stop");
    let _ = write!(
        out,
        "{{\"type\":\"content_block_stop\",\"index\":{index}}}\n\n"
    );
}

impl pace::Events for MessagesEvents<'_> {
    fn head(&mut self, out: &mut Vec<u8>) {
        pace::named_event(out, "message_start");
        out.extend_from_slice(b"{\"type\":\"message_start\",\"message\":");
        push_message_open(out, self.req);
        let _ = write!(
            out,
            "],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{},\"output_tokens\":1}}}}}}\n\n",
            self.req.input_tokens
        );
        if self.req.reasoning {
            thinking_block(out);
        }
        if preamble(self.req) {
            pace::named_event(out, "content_block_start");
            let _ = write!(
                out,
                "{{\"type\":\"content_block_start\",\"index\":{},\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n",
                base(self.req)
            );
        }
        pace::named_event(out, "ping");
        out.extend_from_slice(b"{\"type\":\"ping\"}\n\n");
    }

    fn units(&self) -> u32 {
        match self.req.tool_call {
            Some(_) => u32::from(preamble(self.req)) + tools::fragment_count(),
            None => self.req.output_tokens,
        }
    }

    fn unit(&mut self, i: u32, out: &mut Vec<u8>) {
        let (b, tb) = (base(self.req), tool_block(self.req));
        let Some(name) = &self.req.tool_call else {
            return text_delta(out, b, text::token(i));
        };
        let fragment = if preamble(self.req) {
            if i == 0 {
                return text_delta(out, b, tools::TOOL_TEXT);
            }
            i - 1
        } else {
            i
        };
        if fragment == 0 {
            if preamble(self.req) {
                block_stop(out, b);
            }
            pace::named_event(out, "content_block_start");
            let _ = write!(
                out,
                "{{\"type\":\"content_block_start\",\"index\":{tb},\"content_block\":"
            );
            push_tool_use(out, name, "{}");
            out.extend_from_slice(b"}\n\n");
        }
        pace::named_event(out, "content_block_delta");
        let _ = write!(
            out,
            "{{\"type\":\"content_block_delta\",\"index\":{tb},\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":"
        );
        push_json_str(out, tools::fragment(fragment));
        out.extend_from_slice(b"}}\n\n");
    }

    fn tail(&mut self, out: &mut Vec<u8>) {
        let req = self.req;
        let last = if req.tool_call.is_some() {
            tool_block(req)
        } else {
            base(req)
        };
        block_stop(out, last);
        pace::named_event(out, "message_delta");
        let _ = write!(
            out,
            "{{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{}}}}}\n\n",
            stop_reason(req),
            req.usage_output_tokens()
        );
        pace::named_event(out, "message_stop");
        out.extend_from_slice(b"{\"type\":\"message_stop\"}\n\n");
    }
}

/// The paced units of `req`'s stream.
pub fn events(req: &MockRequest) -> impl pace::Events + '_ {
    MessagesEvents { req }
}
