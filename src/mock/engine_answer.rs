//! llama.cpp's own Chat answers for the engine simulator (`--engine llamacpp`), in the shape
//! `llama-server` sends them (recorded: tests/fixtures/engines/llamacpp/chat.json,
//! chat-stream.txt): `finish_reason` `"length"` (the simulator always generates `max_tokens`),
//! keys in its order, `system_fingerprint` the build, `usage.prompt_tokens_details.cached_tokens`
//! (the prefix-cache hit) and its `timings`; a stream's first chunk is
//! `{"role":"assistant","content":null}`, the usage chunk (with `stream_options.include_usage`)
//! has empty `choices`.
//!
//! Owns: the bytes of those answers. Must not: decide timing (`engine` paces the units) or
//! render the engine's pages (`engine_page`).

use std::cell::Cell;
use std::io::Write;

use super::{chat::CREATED, pace, text, MockRequest};
use crate::error::push_json_str;

/// What the engine knows of one answer: the request, the prompt split between the prefix
/// cache and prefill, the prefill time, and the decode time so far (µs, read at the end).
pub struct Answer<'a> {
    pub req: &'a MockRequest,
    pub cached: u64,
    pub processed: u64,
    pub prompt_us: u64,
    pub gen_us: &'a Cell<u64>,
}

const FINGERPRINT: &str = "b1-mock";
const ID: &str = "chatcmpl-mockllamacppengine00000";

impl Answer<'_> {
    fn usage(&self, out: &mut Vec<u8>) {
        let (p, n) = (u64::from(self.req.input_tokens), self.n());
        let _ = write!(
            out,
            r#""usage":{{"completion_tokens":{n},"prompt_tokens":{p},"total_tokens":{},"prompt_tokens_details":{{"cached_tokens":{}}}}}"#,
            p + n,
            self.cached
        );
    }

    fn n(&self) -> u64 {
        u64::from(self.req.output_tokens.max(1))
    }

    fn timings(&self, out: &mut Vec<u8>) {
        let prompt_ms = self.prompt_us as f64 / 1e3;
        let predicted_ms = self.gen_us.get() as f64 / 1e3;
        let per = |ms: f64, n: u64| ms / n.max(1) as f64;
        let rate = |ms: f64, n: u64| if ms > 0.0 { n as f64 / ms * 1e3 } else { 0.0 };
        let (pn, n) = (self.processed, self.n());
        let _ = write!(
            out,
            r#""timings":{{"cache_n":{},"prompt_n":{pn},"prompt_ms":{:?},"prompt_per_token_ms":{:?},"prompt_per_second":{:?},"predicted_n":{n},"predicted_ms":{:?},"predicted_per_token_ms":{:?},"predicted_per_second":{:?}}}"#,
            self.cached,
            prompt_ms,
            per(prompt_ms, pn),
            rate(prompt_ms, pn),
            predicted_ms,
            per(predicted_ms, n),
            rate(predicted_ms, n),
        );
    }

    /// `,"created":…,"id":…,"model":…,"system_fingerprint":…,"object":"chat.completion.chunk"`
    fn chunk_tail(&self, out: &mut Vec<u8>) {
        let _ = write!(out, r#","created":{CREATED},"id":"{ID}","model":"#);
        push_json_str(out, &self.req.model);
        let _ = write!(
            out,
            r#","system_fingerprint":"{FINGERPRINT}","object":"chat.completion.chunk""#
        );
    }

    fn delta(&self, out: &mut Vec<u8>, finish: &str, delta: &[u8]) {
        let _ = write!(
            out,
            r#"data: {{"choices":[{{"finish_reason":{finish},"index":0,"delta":"#
        );
        out.extend_from_slice(delta);
        out.extend_from_slice(b"}]");
        self.chunk_tail(out);
        out.extend_from_slice(b"}\n\n");
    }

    /// The non-stream body.
    pub fn body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(768);
        out.extend_from_slice(
            br#"{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"#,
        );
        push_json_str(&mut out, &text::tokens(0, self.req.output_tokens.max(1)));
        let _ = write!(out, r#"}}}}],"created":{CREATED},"model":"#);
        push_json_str(&mut out, &self.req.model);
        let _ = write!(
            out,
            r#","system_fingerprint":"{FINGERPRINT}","object":"chat.completion","#
        );
        self.usage(&mut out);
        let _ = write!(out, r#","id":"{ID}","#);
        self.timings(&mut out);
        out.push(b'}');
        out
    }
}

impl pace::Events for Answer<'_> {
    fn head(&mut self, out: &mut Vec<u8>) {
        self.delta(out, "null", br#"{"role":"assistant","content":null}"#);
    }

    fn units(&self) -> u32 {
        self.req.output_tokens.max(1)
    }

    fn unit(&mut self, i: u32, out: &mut Vec<u8>) {
        let mut d = b"{\"content\":".to_vec();
        push_json_str(&mut d, text::token(i));
        d.push(b'}');
        self.delta(out, "null", &d);
    }

    fn tail(&mut self, out: &mut Vec<u8>) {
        self.delta(out, "\"length\"", b"{}");
        if self.req.include_usage {
            out.extend_from_slice(br#"data: {"choices":[]"#);
            self.chunk_tail(out);
            out.push(b',');
            self.usage(out);
            out.push(b',');
            self.timings(out);
            out.extend_from_slice(b"}\n\n");
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
    }
}
