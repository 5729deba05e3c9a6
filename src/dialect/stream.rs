//! Streaming translation: [`StreamTranslator`] turns upstream SSE events in
//! one dialect into client SSE bytes in another, through hub events that
//! carry exactly what a Chat Completions chunk can say (text, tool-call
//! start with id+name, tool-call argument fragments keyed by index, finish
//! reason, usage). This file owns the translator; each dialect's decoder and encoder live in
//! that dialect's folder (`chat/stream.rs`, `messages/stream.rs`, `responses/stream.rs`,
//! `gemini/stream.rs`; Bedrock Converse streams arrive as Chat chunks, `converse/stream.rs`),
//! made through its wire table (`Wire::decoder`, `Wire::encoder`); what every decoder shares is
//! in `hub`.
//!
//! Guarantees: every tool call is started exactly once; argument fragments
//! are forwarded unmodified, so concatenated `partial_json` / `arguments`
//! deltas equal the upstream arguments byte for byte; the terminal events of
//! the client dialect are written exactly once (on the upstream's own end
//! marker, or by [`StreamTranslator::finish`]); an error — the upstream's own
//! in-stream error event, or [`StreamTranslator::error`] — ends the client's
//! stream instead, and nothing claiming a normal end follows it (Responses
//! clients get `response.failed`, never `response.completed`). An upstream
//! event nested deeper than `nesting::MAX_DEPTH` is an error in every
//! dialect (`push` fails before any decoder sees it).
//!
//! Reasoning travels as its own hub event (see `thinking`): Chat
//! `reasoning_content` / `reasoning` deltas, Anthropic `thinking_delta` (+
//! `signature_delta`, `redacted_thinking` blocks), Responses
//! `response.reasoning_text.delta` / `response.reasoning_summary_text.delta`,
//! Gemini `thought` parts; each client gets it in its own form (Chat
//! `reasoning_content`, Anthropic `thinking` blocks, a Responses `reasoning`
//! item, Gemini `thought` parts). Signatures and redacted blocks reach
//! Anthropic clients only. The structured-output tool's input (see
//! `structured`) streams as text.
//!
//! Deliberately dropped in streams: logprobs, citations and annotations,
//! server-tool blocks, choices other than index 0.
//!
//! Same dialect in and out is passthrough: events are re-framed unchanged
//! (only a missing Chat `[DONE]` is added by `finish`).
//!
//! Must not: perform IO, or allocate beyond per-stream state and `out`.

use super::error::{client_status, stream_error_event_seq};
use super::hub::{Core, Hub};
use super::{Decoder, Dialect, Encoder, SseEvent, TranslateError, Usage};
use serde_json::Value;

/// Stateful stream converter: upstream dialect SSE events → client dialect
/// SSE bytes.
pub struct StreamTranslator {
    upstream: Dialect,
    client: Dialect,
    core: Core,
    decoder: Decoder,
    encoder: Encoder,
    scratch: Vec<Hub>,
    usage: Usage,
    done: bool,
}

impl StreamTranslator {
    /// A translator for one stream; `client_model` is the model name the
    /// client asked for (reported back in every chunk/event).
    ///
    /// Chat clients get the final usage chunk (`choices: []`) only after
    /// [`StreamTranslator::with_chat_usage`]`(true)` — set it from the
    /// client's `stream_options.include_usage`.
    pub fn new(upstream: Dialect, client: Dialect, client_model: &str) -> Self {
        let mut encoder = (client.wire().encoder)(client_model.to_string());
        encoder.set_chat_usage(false);
        StreamTranslator {
            upstream,
            client,
            core: Core::default(),
            decoder: (upstream.wire().decoder)(),
            encoder,
            scratch: Vec::new(),
            usage: Usage::default(),
            done: false,
        }
    }

    /// Whether a Chat client gets the final usage chunk.
    pub fn with_chat_usage(mut self, include: bool) -> Self {
        self.encoder.set_chat_usage(include);
        self
    }

    /// True when same-dialect events are forwarded unchanged.
    pub fn is_passthrough(&self) -> bool {
        self.upstream == self.client
    }

    /// Usage seen so far (for metrics and budgets).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// True once the client stream's terminal events were written.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// A Responses client's finished `response` object (the terminal event's), once the stream
    /// ended normally; `None` for other clients, a stream still running, or one that failed.
    /// Built on demand: for the Responses state store (`responses_state`).
    pub fn finished_response(&self) -> Option<serde_json::Value> {
        match &self.encoder {
            Encoder::Responses(r) if self.done => r.finished_response(),
            _ => None,
        }
    }

    /// Translate one upstream event, appending client bytes to `out`.
    /// Events after the end are ignored. A malformed upstream event yields
    /// an error (the caller ends the stream with [`StreamTranslator::error`]).
    pub fn push(&mut self, ev: &SseEvent, out: &mut Vec<u8>) -> Result<(), TranslateError> {
        if self.done {
            return Ok(());
        }
        // The nesting bound holds for every upstream event, whatever decodes it: the typed
        // Chat decoder skips unknown members without serde_json's depth limit, so a member
        // nested past the bound would otherwise pass unseen (the same-dialect relay refuses
        // such an event in `vet::sse_events`).
        if let Err(e) = crate::util::nesting::check(ev.data.as_bytes()) {
            return Err(TranslateError::new(format!(
                "an upstream stream event's data is {e}"
            )));
        }
        if self.is_passthrough() {
            self.observe_passthrough(ev);
            super::sse::encode_event(ev.event.as_deref(), &ev.data, out);
            return Ok(());
        }
        let mut hub = std::mem::take(&mut self.scratch);
        hub.clear();
        let r = self.decoder.decode(&mut self.core, ev, &mut hub);
        for h in hub.drain(..) {
            self.deliver(h, out);
        }
        self.scratch = hub;
        r
    }

    /// End of upstream: write the client dialect's terminal events if the
    /// upstream ended without them. Idempotent.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if self.is_passthrough() {
            self.done = true;
            if let Some(end) = self.client.wire().terminal_data {
                super::sse::encode_event(None, end, out);
            }
            return;
        }
        self.deliver(Hub::Done, out);
    }

    /// Write a dialect-correct mid-stream error event; it ends the client's stream (nothing
    /// follows it, [`StreamTranslator::finish`] included). Ignored once the stream ended.
    pub fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if self.is_passthrough() {
            self.done = true;
            stream_error_event_seq(self.client, 500, message, None, out);
        } else {
            self.deliver(Hub::Error(500, message.to_string()), out);
        }
    }

    /// Hand one hub event to the client encoder. An error ends the stream as `Done` does:
    /// no terminal events claiming a normal end may follow it (Messages: `error` is last;
    /// Responses: `response.failed` is last; Chat and Gemini: the error chunk is last).
    fn deliver(&mut self, mut h: Hub, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if let Hub::Error(st, _) = &mut h {
            *st = client_status(self.upstream, self.client, *st);
        }
        match &h {
            Hub::Usage(u) => self.usage.merge(*u),
            Hub::Done | Hub::Error(..) => self.done = true,
            _ => {}
        }
        self.encoder.handle(h, out);
    }

    fn observe_passthrough(&mut self, ev: &SseEvent) {
        let data = ev.data.trim();
        if self.client.wire().terminal_data == Some(data) {
            self.done = true;
            return;
        }
        if memchr::memmem::find(data.as_bytes(), b"sage").is_none() {
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let u = self.client.wire().usage_of(&v);
        if let Some(u) = u {
            self.usage.merge(u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::SseDecoder;

    fn run(t: &mut StreamTranslator, events: &[&str]) -> String {
        let mut out = Vec::new();
        for e in events {
            t.push(&SseEvent::new(None, e), &mut out).unwrap();
        }
        t.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    fn events(s: &str) -> Vec<SseEvent> {
        let mut d = SseDecoder::new();
        d.feed(s.as_bytes());
        std::iter::from_fn(|| d.next_event()).collect()
    }

    #[test]
    fn chat_tool_call_once_even_if_id_repeats_and_stop_fixed() {
        let mut t = StreamTranslator::new(Dialect::Chat, Dialect::Messages, "m");
        let out = run(
            &mut t,
            &[
                r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\""}}]}}]}"#,
                r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"arguments":":1}"}}]}}]}"#,
                r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                "[DONE]",
            ],
        );
        let evs = events(&out);
        let starts = evs
            .iter()
            .filter(|e| e.event.as_deref() == Some("content_block_start"))
            .count();
        assert_eq!(starts, 1);
        let args: String = evs
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
            .filter_map(|v| v["delta"]["partial_json"].as_str().map(str::to_string))
            .collect();
        assert_eq!(args, "{\"a\":1}");
        assert!(out.contains("\"stop_reason\":\"tool_use\""));
        assert_eq!(out.matches("message_stop").count(), 2); // event name + type
    }

    #[test]
    fn finish_is_idempotent_and_events_after_end_ignored() {
        let mut t = StreamTranslator::new(Dialect::Messages, Dialect::Chat, "m");
        let mut out = Vec::new();
        t.push(
            &SseEvent::new(Some("message_stop"), r#"{"type":"message_stop"}"#),
            &mut out,
        )
        .unwrap();
        t.finish(&mut out);
        t.push(&SseEvent::new(None, r#"{"type":"ping"}"#), &mut out)
            .unwrap();
        t.finish(&mut out);
        let s = String::from_utf8(out).unwrap();
        assert_eq!(s.matches("[DONE]").count(), 1);
        assert!(t.is_done());
    }

    #[test]
    fn passthrough_adds_missing_done_and_tracks_usage() {
        let mut t = StreamTranslator::new(Dialect::Chat, Dialect::Chat, "m");
        assert!(t.is_passthrough());
        let out = run(
            &mut t,
            &[r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#],
        );
        assert!(out.ends_with("data: [DONE]\n\n"));
        assert_eq!(t.usage().prompt_tokens, Some(3));
        assert_eq!(t.usage().completion_tokens, Some(4));
    }

    #[test]
    fn malformed_upstream_event_is_an_error() {
        let mut t = StreamTranslator::new(Dialect::Gemini, Dialect::Messages, "m");
        let mut out = Vec::new();
        assert!(t.push(&SseEvent::new(None, "{nope"), &mut out).is_err());
        // nested past the bound, in a member the decoder would skip: an error in every dialect
        let n = crate::util::nesting::MAX_DEPTH; // with the event's own object: one over the bound
        let deep = "[".repeat(n) + &"]".repeat(n);
        let ok = format!(r#"{{"choices":[],"x":{}}}"#, &deep[n - 90..n + 90]);
        for up in [
            Dialect::Chat,
            Dialect::Messages,
            Dialect::Responses,
            Dialect::Gemini,
        ] {
            let mut t = StreamTranslator::new(up, Dialect::Messages, "m");
            assert!(
                t.push(&SseEvent::new(None, &ok), &mut out).is_ok(),
                "{up:?}"
            );
            let bad = format!(r#"{{"choices":[],"x":{deep}}}"#);
            let e = t.push(&SseEvent::new(None, &bad), &mut out).unwrap_err();
            assert!(e.message.contains("nested deeper than 128"), "{up:?} {e:?}");
        }
    }

    #[test]
    fn responses_stream_ends_with_response_failed_after_an_error() {
        let mut t = StreamTranslator::new(Dialect::Chat, Dialect::Responses, "m");
        let mut out = Vec::new();
        t.push(
            &SseEvent::new(
                None,
                r#"{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}]}"#,
            ),
            &mut out,
        )
        .unwrap();
        t.error("boom", &mut out);
        assert!(t.is_done());
        t.finish(&mut out);
        t.error("again", &mut out);
        let evs = events(&String::from_utf8(out).unwrap());
        let last = evs.last().unwrap();
        assert_eq!(last.event.as_deref(), Some("response.failed"));
        let v: Value = serde_json::from_str(&last.data).unwrap();
        assert_eq!(v["response"]["status"], "failed");
        assert_eq!(v["response"]["error"]["message"], "boom");
        assert_eq!(v["response"]["output"][0]["content"][0]["text"], "x");
        assert_eq!(v["sequence_number"], evs.len() as u64 - 1);
        assert!(!evs
            .iter()
            .any(|e| e.event.as_deref() == Some("response.completed")));
    }

    #[test]
    fn upstream_error_chunk_ends_a_messages_stream() {
        let mut t = StreamTranslator::new(Dialect::Chat, Dialect::Messages, "m");
        let out = run(
            &mut t,
            &[
                r#"{"id":"c","choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
                r#"{"error":{"message":"upstream overloaded","type":"server_error"}}"#,
                r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                "[DONE]",
            ],
        );
        let evs = events(&out);
        let last = evs.last().unwrap();
        assert_eq!(last.event.as_deref(), Some("error"));
        assert!(!out.contains("message_stop") && !out.contains("message_delta"));
    }

    #[test]
    fn upstream_error_event_reaches_client_in_its_dialect() {
        let mut t = StreamTranslator::new(Dialect::Messages, Dialect::Gemini, "m");
        let out = run(
            &mut t,
            &[r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#],
        );
        let first = events(&out).into_iter().next().unwrap();
        let v: Value = serde_json::from_str(&first.data).unwrap();
        assert_eq!(v["error"]["message"], "Overloaded");
    }

    #[test]
    fn single_chunk_tool_call_is_split_into_start_and_args() {
        let mut t = StreamTranslator::new(Dialect::Chat, Dialect::Responses, "m");
        let out = run(
            &mut t,
            &[
                r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"k","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#,
            ],
        );
        assert_eq!(out.matches("event: response.output_item.added").count(), 1);
        assert!(out.contains(r#""delta":"{}""#));
        assert!(out.contains("event: response.completed"));
    }
}
