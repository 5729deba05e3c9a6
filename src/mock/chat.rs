//! The mock's OpenAI Chat Completions dialect: non-stream JSON and paced SSE streams with
//! optional usage, tool calls and reasoning (`reasoning_content`, as vLLM and DeepSeek send
//! it), written by `Answer` through `pace`.
//!
//! Owns: the exact bytes the mock answers for `/v1/chat/completions`. Must not: parse HTTP or
//! decide timing (`pace` does) or when to call a tool (`tools` does).

use std::io::Write;

use super::speaker::{self, Speaker};
use super::{pace, text, tools, Fields, MockRequest};
use crate::error::push_json_str;

/// How the mock speaks Chat.
pub static SPEAKER: Speaker = Speaker {
    path: Some(b"/v1/chat/completions"),
    turns: "messages",
    system: None,
    text: "content",
    string_turns: false,
    limit: |f| {
        Ok(f.u64("max_completion_tokens")
            .or_else(|| f.u64("max_tokens")))
    },
    reasoning,
    forced_tool: speaker::never_forced,
    user_turn: |turn| tools::role(turn) == Some("user"),
    body: completion_body,
    events: |req, _| Box::new(events(req)),
    failed: None,
};

/// `reasoning_effort` other than `none`.
fn reasoning(f: &Fields<'_>) -> bool {
    f.str("reasoning_effort").is_some_and(|e| e != "none")
}

pub const CREATED: u64 = 1_700_000_000;

/// The non-stream response body.
pub fn completion_body(req: &MockRequest) -> Vec<u8> {
    let content = match req.tool_call {
        Some(_) => tools::TOOL_TEXT.to_string(),
        None => text::tokens(0, req.output_tokens),
    };
    let mut out = Vec::with_capacity(320 + content.len());
    out.extend_from_slice(b"{\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion\",\"created\":");
    let _ = write!(out, "{CREATED}");
    out.extend_from_slice(b",\"model\":");
    push_json_str(&mut out, &req.model);
    out.extend_from_slice(
        b",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
    );
    push_json_str(&mut out, &content);
    if req.reasoning {
        out.extend_from_slice(b",\"reasoning_content\":");
        push_json_str(&mut out, &text::reasoning());
    }
    let finish = match &req.tool_call {
        Some(name) => {
            out.extend_from_slice(b",\"tool_calls\":[{\"id\":\"");
            out.extend_from_slice(tools::CALL_ID.as_bytes());
            out.extend_from_slice(b"\",\"type\":\"function\",\"function\":{\"name\":");
            push_json_str(&mut out, name);
            out.extend_from_slice(b",\"arguments\":");
            push_json_str(&mut out, tools::TOOL_ARGS);
            out.extend_from_slice(b"}}]");
            "tool_calls"
        }
        None => "stop",
    };
    let _ = write!(
        out,
        ",\"refusal\":null}},\"logprobs\":null,\"finish_reason\":\"{finish}\"}}],"
    );
    push_usage(&mut out, req);
    out.extend_from_slice(b",\"system_fingerprint\":null}");
    out
}

fn push_usage(out: &mut Vec<u8>, req: &MockRequest) {
    let output = req.usage_output_tokens();
    let _ = write!(
        out,
        "\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}}}",
        req.input_tokens,
        output,
        req.input_tokens + output
    );
}

fn chunk_prefix(out: &mut Vec<u8>, req: &MockRequest) {
    out.extend_from_slice(
        b"data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":",
    );
    let _ = write!(out, "{CREATED}");
    out.extend_from_slice(b",\"model\":");
    push_json_str(out, &req.model);
    out.extend_from_slice(b",\"system_fingerprint\":null,\"choices\":[");
}

/// Start of a choice delta event, up to the delta's opening brace.
fn delta_prefix(out: &mut Vec<u8>, req: &MockRequest) {
    chunk_prefix(out, req);
    out.extend_from_slice(b"{\"index\":0,\"delta\":{");
}

const DELTA_END: &[u8] = b"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";

fn push_content(out: &mut Vec<u8>, req: &MockRequest, s: &str) {
    delta_prefix(out, req);
    out.extend_from_slice(b"\"content\":");
    push_json_str(out, s);
    out.extend_from_slice(DELTA_END);
}

/// The stream of one Chat answer, cut into paced units: one per token, or (tool call) the text
/// then one per argument fragment.
struct ChatEvents<'a> {
    req: &'a MockRequest,
}

impl pace::Events for ChatEvents<'_> {
    fn head(&mut self, out: &mut Vec<u8>) {
        delta_prefix(out, self.req);
        out.extend_from_slice(b"\"role\":\"assistant\",\"content\":\"\",\"refusal\":null");
        out.extend_from_slice(DELTA_END);
        if self.req.reasoning {
            for r in text::REASONING {
                delta_prefix(out, self.req);
                out.extend_from_slice(b"\"reasoning_content\":");
                push_json_str(out, r);
                out.extend_from_slice(DELTA_END);
            }
        }
    }

    fn units(&self) -> u32 {
        self.req.stream_units()
    }

    fn unit(&mut self, i: u32, out: &mut Vec<u8>) {
        let req = self.req;
        let Some(name) = &req.tool_call else {
            return push_content(out, req, text::token(i));
        };
        if i == 0 {
            return push_content(out, req, tools::TOOL_TEXT);
        }
        if i == 1 {
            delta_prefix(out, req);
            out.extend_from_slice(b"\"tool_calls\":[{\"index\":0,\"id\":\"");
            out.extend_from_slice(tools::CALL_ID.as_bytes());
            out.extend_from_slice(b"\",\"type\":\"function\",\"function\":{\"name\":");
            push_json_str(out, name);
            out.extend_from_slice(b",\"arguments\":\"\"}}]");
            out.extend_from_slice(DELTA_END);
        }
        delta_prefix(out, req);
        out.extend_from_slice(b"\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":");
        push_json_str(out, tools::fragment(i - 1));
        out.extend_from_slice(b"}}]");
        out.extend_from_slice(DELTA_END);
    }

    fn tail(&mut self, out: &mut Vec<u8>) {
        let req = self.req;
        let finish = if req.tool_call.is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        chunk_prefix(out, req);
        let _ = write!(
            out,
            "{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"{finish}\"}}]}}\n\n"
        );
        if req.include_usage {
            chunk_prefix(out, req);
            out.extend_from_slice(b"],");
            push_usage(out, req);
            out.extend_from_slice(b"}\n\n");
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
    }
}

/// The paced units of `req`'s stream (the engine simulator paces them itself).
pub fn events(req: &MockRequest) -> impl pace::Events + '_ {
    ChatEvents { req }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(stream: bool, n: u32, usage: bool) -> MockRequest {
        MockRequest {
            model: "m".into(),
            stream,
            output_tokens: n,
            include_usage: usage,
            input_tokens: 5,
            tool_call: None,
            reasoning: false,
            forced_tool: false,
        }
    }

    #[test]
    fn body_is_openai_shaped() {
        let v: serde_json::Value =
            serde_json::from_slice(&completion_body(&req(false, 3, false))).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], " the gate ring");
        assert_eq!(v["usage"]["total_tokens"], 8);
        assert_eq!(v["object"], "chat.completion");
        let mut r = req(false, 3, false);
        r.tool_call = Some("f".into());
        let v: serde_json::Value = serde_json::from_slice(&completion_body(&r)).unwrap();
        let call = &v["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["arguments"], tools::TOOL_ARGS);
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn transcript_reassembles() {
        let t = pace::transcript(&mut events(&req(true, 5, true)));
        let t = String::from_utf8(t).unwrap();
        let mut content = String::new();
        let mut usage = None;
        let events: Vec<&str> = t.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.last(), Some(&"data: [DONE]"));
        for e in &events[..events.len() - 1] {
            let v: serde_json::Value =
                serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap();
            if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
                content.push_str(c);
            }
            if !v["usage"].is_null() {
                usage = Some(v["usage"]["completion_tokens"].as_u64().unwrap());
            }
        }
        assert_eq!(content, text::tokens(0, 5));
        assert_eq!(usage, Some(5));
    }
}
