//! The mock's OpenAI Responses dialect (`POST /v1/responses`): the non-stream `response` object
//! and the typed SSE stream (`response.created` … `response.completed`), each event carrying
//! `type` and `sequence_number` with a matching `event:` line.
//!
//! Owns: the exact bytes of those answers. Must not: parse HTTP, decide timing (`pace`) or when
//! to call a tool (`tools`).

use std::io::Write;

use super::chat::CREATED;
use super::speaker::{self, Speaker};
use super::{pace, text, tools, MockRequest};
use crate::error::push_json_str;

/// How the mock speaks Responses: `input` may be one string (a user turn), and a mid-stream
/// failure is `response.failed`, as OpenAI ends a failed response.
pub static SPEAKER: Speaker = Speaker {
    path: Some(b"/v1/responses"),
    turns: "input",
    system: Some("instructions"),
    text: "content",
    string_turns: true,
    limit: |f| Ok(f.u64("max_output_tokens")),
    reasoning: speaker::no_reasoning,
    forced_tool: speaker::never_forced,
    user_turn: |turn| {
        let ty = turn
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or("message");
        ty == "message" && tools::role(turn) == Some("user")
    },
    body: response_body,
    events: |req, _| Box::new(events(req)),
    failed: Some(failed_event),
};

const RESP_ID: &str = "resp_mock";
const MSG_ID: &str = "msg_mock_0";
const FC_ID: &str = "fc_mock_1";

fn answer_text(req: &MockRequest) -> String {
    match req.tool_call {
        Some(_) => tools::TOOL_TEXT.to_string(),
        None => text::tokens(0, req.output_tokens),
    }
}

fn push_text_part(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(b"{\"type\":\"output_text\",\"text\":");
    push_json_str(out, text);
    out.extend_from_slice(b",\"annotations\":[]}");
}

/// The assistant message item; `text: None` while in progress (empty content).
fn push_message_item(out: &mut Vec<u8>, text: Option<&str>) {
    let _ = write!(
        out,
        "{{\"id\":\"{MSG_ID}\",\"type\":\"message\",\"status\":"
    );
    match text {
        Some(t) => {
            out.extend_from_slice(b"\"completed\",\"role\":\"assistant\",\"content\":[");
            push_text_part(out, t);
            out.extend_from_slice(b"]}");
        }
        None => out.extend_from_slice(b"\"in_progress\",\"role\":\"assistant\",\"content\":[]}"),
    }
}

fn push_call_item(out: &mut Vec<u8>, name: &str, done: bool) {
    let (status, args) = if done {
        ("completed", tools::TOOL_ARGS)
    } else {
        ("in_progress", "")
    };
    let _ = write!(
        out,
        "{{\"id\":\"{FC_ID}\",\"type\":\"function_call\",\"status\":\"{status}\",\"arguments\":"
    );
    push_json_str(out, args);
    let _ = write!(out, ",\"call_id\":\"{}\",\"name\":", tools::CALL_ID);
    push_json_str(out, name);
    out.push(b'}');
}

/// The `response` object; `done` adds the output items and usage.
fn push_response(out: &mut Vec<u8>, req: &MockRequest, done: bool) {
    let status = if done { "completed" } else { "in_progress" };
    let _ = write!(
        out,
        "{{\"id\":\"{RESP_ID}\",\"object\":\"response\",\"created_at\":{CREATED},\"status\":\"{status}\",\"error\":null,\"incomplete_details\":null,\"model\":"
    );
    push_json_str(out, &req.model);
    out.extend_from_slice(b",\"output\":[");
    if done {
        push_message_item(out, Some(&answer_text(req)));
        if let Some(name) = &req.tool_call {
            out.push(b',');
            push_call_item(out, name, true);
        }
        let o = req.usage_output_tokens();
        let _ = write!(
            out,
            "],\"usage\":{{\"input_tokens\":{},\"input_tokens_details\":{{\"cached_tokens\":0}},\"output_tokens\":{o},\"output_tokens_details\":{{\"reasoning_tokens\":0}},\"total_tokens\":{}}}}}",
            req.input_tokens,
            req.input_tokens + o
        );
    } else {
        out.extend_from_slice(b"],\"usage\":null}");
    }
}

/// The non-stream response body.
pub fn response_body(req: &MockRequest) -> Vec<u8> {
    let mut out = Vec::with_capacity(512 + req.output_tokens as usize * 5);
    push_response(&mut out, req, true);
    out
}

/// The stream of one answer: units are tokens, or (tool call) the text then argument fragments.
struct ResponsesEvents<'a> {
    req: &'a MockRequest,
    seq: u32,
}

/// The stream's two output items.
#[derive(Debug, Clone, Copy)]
enum Item {
    /// The message (output 0, its one content part).
    Message,
    /// The function call (output 1).
    Call,
}

impl ResponsesEvents<'_> {
    /// Open an event: `event:` line and `data: {"type":…,"sequence_number":…` (caller closes).
    fn open(&mut self, out: &mut Vec<u8>, ty: &str) {
        pace::named_event(out, ty);
        let _ = write!(out, "{{\"type\":\"{ty}\",\"sequence_number\":{}", self.seq);
        self.seq += 1;
    }

    /// Open an event about `item`: its address, then the member `key` (caller writes its value
    /// and closes).
    fn item_event(&mut self, out: &mut Vec<u8>, ty: &str, item: Item, key: &str) {
        self.open(out, ty);
        let _ = match item {
            Item::Message => write!(
                out,
                ",\"item_id\":\"{MSG_ID}\",\"output_index\":0,\"content_index\":0"
            ),
            Item::Call => write!(out, ",\"item_id\":\"{FC_ID}\",\"output_index\":1"),
        };
        let _ = write!(out, ",\"{key}\":");
    }

    fn text_delta(&mut self, out: &mut Vec<u8>, s: &str) {
        self.item_event(out, "response.output_text.delta", Item::Message, "delta");
        push_json_str(out, s);
        out.extend_from_slice(b",\"logprobs\":[]}\n\n");
    }

    fn args_delta(&mut self, out: &mut Vec<u8>, s: &str) {
        self.item_event(
            out,
            "response.function_call_arguments.delta",
            Item::Call,
            "delta",
        );
        push_json_str(out, s);
        out.extend_from_slice(b"}\n\n");
    }

    /// Close the message item: text done, part done, item done.
    fn finish_message(&mut self, out: &mut Vec<u8>) {
        let text = answer_text(self.req);
        self.item_event(out, "response.output_text.done", Item::Message, "text");
        push_json_str(out, &text);
        out.extend_from_slice(b",\"logprobs\":[]}\n\n");
        self.item_event(out, "response.content_part.done", Item::Message, "part");
        push_text_part(out, &text);
        out.extend_from_slice(b"}\n\n");
        self.open(out, "response.output_item.done");
        out.extend_from_slice(b",\"output_index\":0,\"item\":");
        push_message_item(out, Some(&text));
        out.extend_from_slice(b"}\n\n");
    }
}

impl pace::Events for ResponsesEvents<'_> {
    fn head(&mut self, out: &mut Vec<u8>) {
        for ty in ["response.created", "response.in_progress"] {
            self.open(out, ty);
            out.extend_from_slice(b",\"response\":");
            push_response(out, self.req, false);
            out.extend_from_slice(b"}\n\n");
        }
        self.open(out, "response.output_item.added");
        out.extend_from_slice(b",\"output_index\":0,\"item\":");
        push_message_item(out, None);
        out.extend_from_slice(b"}\n\n");
        self.item_event(out, "response.content_part.added", Item::Message, "part");
        push_text_part(out, "");
        out.extend_from_slice(b"}\n\n");
    }

    fn units(&self) -> u32 {
        self.req.stream_units()
    }

    fn unit(&mut self, i: u32, out: &mut Vec<u8>) {
        let req = self.req;
        let Some(name) = &req.tool_call else {
            return self.text_delta(out, text::token(i));
        };
        if i == 0 {
            return self.text_delta(out, tools::TOOL_TEXT);
        }
        if i == 1 {
            self.finish_message(out);
            self.open(out, "response.output_item.added");
            out.extend_from_slice(b",\"output_index\":1,\"item\":");
            push_call_item(out, name, false);
            out.extend_from_slice(b"}\n\n");
        }
        self.args_delta(out, tools::fragment(i - 1));
    }

    fn tail(&mut self, out: &mut Vec<u8>) {
        let req = self.req;
        match &req.tool_call {
            None => self.finish_message(out),
            Some(name) => {
                self.item_event(
                    out,
                    "response.function_call_arguments.done",
                    Item::Call,
                    "arguments",
                );
                push_json_str(out, tools::TOOL_ARGS);
                out.extend_from_slice(b"}\n\n");
                self.open(out, "response.output_item.done");
                out.extend_from_slice(b",\"output_index\":1,\"item\":");
                push_call_item(out, name, true);
                out.extend_from_slice(b"}\n\n");
            }
        }
        self.open(out, "response.completed");
        out.extend_from_slice(b",\"response\":");
        push_response(out, req, true);
        out.extend_from_slice(b"}\n\n");
    }
}

/// A failed response's last event: `response.failed` with sequence number `seq`, the error's
/// code the Responses name of an overloaded upstream (503).
fn failed_event(seq: usize, message: &str, out: &mut Vec<u8>) {
    let code = crate::dialect::responses::error_code(503);
    pace::named_event(out, "response.failed");
    let _ = write!(
        out,
        "{{\"type\":\"response.failed\",\"sequence_number\":{seq},\"response\":{{\"id\":\"{RESP_ID}\",\"object\":\"response\",\"status\":\"failed\",\"error\":{{\"code\":\"{code}\",\"message\":"
    );
    push_json_str(out, message);
    out.extend_from_slice(b"},\"incomplete_details\":null,\"output\":[],\"usage\":null}}\n\n");
}

/// The paced units of `req`'s stream.
pub fn events(req: &MockRequest) -> impl pace::Events + '_ {
    ResponsesEvents { req, seq: 0 }
}
