//! The mock's OpenAI Chat Completions dialect: non-stream JSON and paced SSE streams with
//! optional usage, written straight to any monoio stream.
//!
//! Owns: the exact bytes the mock answers for `/v1/chat/completions`. Must not: parse HTTP.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use monoio::io::AsyncWriteRent;

use super::{text, MockRequest, Profile};
use crate::error::push_json_str;
use crate::http::io::write_all;
use crate::http::response::{write_chunk, write_head, Framing, LAST_CHUNK};

pub const CREATED: u64 = 1_700_000_000;
/// At most this many SSE writes per stream (tokens are batched into frames beyond that).
const MAX_FRAMES: u32 = 50;

/// The non-stream response body.
pub fn completion_body(req: &MockRequest) -> Vec<u8> {
    let content = text::tokens(0, req.output_tokens);
    let mut out = Vec::with_capacity(256 + content.len());
    out.extend_from_slice(b"{\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion\",\"created\":");
    let _ = write!(out, "{CREATED}");
    out.extend_from_slice(b",\"model\":");
    push_json_str(&mut out, &req.model);
    out.extend_from_slice(
        b",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
    );
    push_json_str(&mut out, &content);
    out.extend_from_slice(b",\"refusal\":null},\"logprobs\":null,\"finish_reason\":\"stop\"}],");
    push_usage(&mut out, req);
    out.extend_from_slice(b",\"system_fingerprint\":null}");
    out
}

fn push_usage(out: &mut Vec<u8>, req: &MockRequest) {
    let _ = write!(
        out,
        "\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}}}",
        req.input_tokens,
        req.output_tokens,
        req.input_tokens + req.output_tokens
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

/// SSE event carrying tokens `from..to` as one content delta each.
fn push_token_events(out: &mut Vec<u8>, req: &MockRequest, from: u32, to: u32) {
    for i in from..to {
        chunk_prefix(out, req);
        out.extend_from_slice(b"{\"index\":0,\"delta\":{\"content\":");
        push_json_str(out, text::token(i));
        out.extend_from_slice(b"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
}

fn push_role_event(out: &mut Vec<u8>, req: &MockRequest) {
    chunk_prefix(out, req);
    out.extend_from_slice(b"{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
}

fn push_end_events(out: &mut Vec<u8>, req: &MockRequest) {
    chunk_prefix(out, req);
    out.extend_from_slice(
        b"{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n",
    );
    if req.include_usage {
        chunk_prefix(out, req);
        out.extend_from_slice(b"],");
        push_usage(out, req);
        out.extend_from_slice(b"}\n\n");
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
}

/// The whole SSE transcript without pacing (used by tests and the instant profile).
pub fn stream_transcript(req: &MockRequest) -> Vec<u8> {
    let mut out = Vec::new();
    push_role_event(&mut out, req);
    push_token_events(&mut out, req, 0, req.output_tokens);
    push_end_events(&mut out, req);
    out
}

/// Write a complete HTTP response for `req` to `s`, paced by `profile`.
pub async fn respond<S: AsyncWriteRent>(
    s: &mut S,
    req: &MockRequest,
    profile: Profile,
    keep_alive: bool,
) -> io::Result<()> {
    let delay = profile.first_token_delay();
    if !req.stream {
        if !delay.is_zero() {
            monoio::time::sleep(delay).await;
        }
        let body = completion_body(req);
        let mut out = Vec::with_capacity(160 + body.len());
        write_head(
            &mut out,
            200,
            b"application/json",
            Framing::Length(body.len()),
            keep_alive,
            b"x-request-id: mock\r\n",
        );
        out.extend_from_slice(&body);
        return write_all(s, out).await.0;
    }
    let mut out = Vec::with_capacity(4096);
    write_head(
        &mut out,
        200,
        b"text/event-stream",
        Framing::Chunked,
        keep_alive,
        b"cache-control: no-cache\r\nx-request-id: mock\r\n",
    );
    let mut ev = Vec::with_capacity(1024);
    push_role_event(&mut ev, req);
    if delay.is_zero() {
        push_token_events(&mut ev, req, 0, req.output_tokens);
        push_end_events(&mut ev, req);
        write_chunk(&mut out, &ev);
        out.extend_from_slice(LAST_CHUNK);
        return write_all(s, out).await.0;
    }
    write_chunk(&mut out, &ev);
    let (r, mut out) = write_all(s, out).await;
    r?;
    let start = Instant::now();
    let n = req.output_tokens;
    let frames = n.min(MAX_FRAMES);
    let span = profile.stream_span();
    let mut sent = 0u32;
    for f in 0..frames {
        let at = delay + span.mul_f64(f64::from(f) / f64::from(frames));
        let wait = (start + at).saturating_duration_since(Instant::now());
        if wait > Duration::ZERO {
            monoio::time::sleep(wait).await;
        }
        let upto = ((u64::from(n) * u64::from(f + 1)) / u64::from(frames)) as u32;
        ev.clear();
        push_token_events(&mut ev, req, sent, upto);
        sent = upto;
        if f + 1 == frames {
            push_end_events(&mut ev, req);
        }
        write_chunk(&mut out, &ev);
        if f + 1 == frames {
            out.extend_from_slice(LAST_CHUNK);
        }
        let (r, back) = write_all(s, out).await;
        r?;
        out = back;
    }
    Ok(())
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
        }
    }

    #[test]
    fn body_is_openai_shaped() {
        let v: serde_json::Value =
            serde_json::from_slice(&completion_body(&req(false, 3, false))).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], " the gate ring");
        assert_eq!(v["usage"]["total_tokens"], 8);
        assert_eq!(v["object"], "chat.completion");
    }

    #[test]
    fn transcript_reassembles() {
        let t = stream_transcript(&req(true, 5, true));
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
