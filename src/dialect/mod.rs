//! Pure, sans-IO translation between LLM API dialects, with OpenAI Chat
//! Completions as the hub: every dialect converts to and from Chat, so N
//! converters each way suffice instead of N².
//!
//! Layout: one folder per dialect — `chat/`, `responses/`, `messages/` (Anthropic), `gemini/`,
//! `converse/` (Bedrock, upstream only) — each holding that dialect's [`Wire`] facts (error
//! family — `ErrorShape`, which also names its headers — type names, terminal events, usage
//! keys), its request / response translators, and its stream decoder and encoder
//! (`<dialect>/stream.rs`; Converse streams arrive as Chat chunks); beside them the hub's
//! shared parts: the one SSE codec (`sse`), the stream translator (`stream`: carries `hub`
//! events from a dialect's decoder to another's encoder), error bodies and events
//! (`error`), passthrough routing fields and the body splice (`extract`), and the features
//! every dialect maps (`thinking`, `structured`, `cache` markers, `extensions`, `references`).
//!
//! Owns: the [`Dialect`] enum, its [`Wire`] table type, [`TranslateError`], the top-level
//! dispatch functions (and the stream's: `Decoder`, `Encoder`, one variant per dialect's stream
//! state), and the shared [`Usage`] record. Must not: perform IO, read clocks or
//! randomness, log, or allocate beyond the values it returns.
//!
//! Conventions of the hub request (a `serde_json::Value` holding a Chat
//! Completions request):
//! * `max_tokens` carries the output limit (clients' `max_completion_tokens`
//!   is kept as sent); a provider layer that needs `max_completion_tokens`
//!   renames it.
//! * A hub produced from a Gemini body has no `model` and no `stream`: Gemini
//!   carries both in the URL, so the caller inserts them.
//! * [`chat_to_request`] for [`Dialect::Gemini`] does not write the model
//!   into the body (it belongs in the URL) and ignores `stream` (the caller
//!   picks `:streamGenerateContent?alt=sse`).
//!
//! Build requirement: `serde_json` with the `preserve_order` feature, so
//! emitted JSON keeps the documented field order (golden SSE files compare
//! byte for byte).

pub mod extract;
pub mod op;

// One folder per dialect: its wire facts (`WIRE`) and its translators.
pub mod chat;
pub mod converse;
pub mod gemini;
pub mod messages;
pub mod responses;

mod cache;
mod hub;
pub mod error;
pub mod extensions;
pub mod references;
mod schema;
pub mod sse;
pub mod stream;
pub mod structured;
pub mod thinking;
mod util;

pub use error::{
    error_body, error_message, is_error_shape, stream_error_event, upstream_error_to_client,
};
pub use sse::{encode_event, SseDecoder, SseEvent};
pub use stream::StreamTranslator;

use serde_json::Value;
use std::fmt;

use crate::error::ErrorShape;
use hub::{Core, Decoded, Hub};

/// An API dialect spoken by a client or an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// OpenAI Chat Completions (`/v1/chat/completions`), the hub.
    Chat,
    /// OpenAI Responses (`/v1/responses`).
    Responses,
    /// Anthropic Messages (`/v1/messages`).
    Messages,
    /// Google Gemini (`:generateContent` / `:streamGenerateContent`).
    Gemini,
}

impl Dialect {
    /// Every dialect, in a fixed order.
    pub const ALL: [Dialect; 4] = [
        Dialect::Chat,
        Dialect::Responses,
        Dialect::Messages,
        Dialect::Gemini,
    ];

    /// This dialect's wire facts and translators (kept in its folder).
    pub fn wire(self) -> &'static Wire {
        match self {
            Dialect::Chat => &chat::WIRE,
            Dialect::Responses => &responses::WIRE,
            Dialect::Messages => &messages::WIRE,
            Dialect::Gemini => &gemini::WIRE,
        }
    }

    /// A short stable name (`chat`, `responses`, `messages`, `gemini`).
    pub fn name(self) -> &'static str {
        self.wire().name
    }
}

/// Token usage in hub terms. `None` means "not reported".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Chat `prompt_tokens` (includes cached tokens).
    pub prompt_tokens: Option<u64>,
    /// Chat `completion_tokens` (includes reasoning tokens).
    pub completion_tokens: Option<u64>,
    /// Chat `prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
}

impl Usage {
    /// Overwrite every field that `other` reports.
    pub fn merge(&mut self, other: Usage) {
        if other.prompt_tokens.is_some() {
            self.prompt_tokens = other.prompt_tokens;
        }
        if other.completion_tokens.is_some() {
            self.completion_tokens = other.completion_tokens;
        }
        if other.cached_tokens.is_some() {
            self.cached_tokens = other.cached_tokens;
        }
    }

    /// True when nothing was reported.
    pub fn is_empty(&self) -> bool {
        self.prompt_tokens.is_none() && self.completion_tokens.is_none()
    }
}

/// The client sent something that cannot be translated; answer 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranslateError {
    /// Human-readable reason, safe to show to the client.
    pub message: String,
}

impl TranslateError {
    /// Build an error from any message.
    pub fn new(message: impl Into<String>) -> Self {
        TranslateError {
            message: message.into(),
        }
    }
}

impl fmt::Display for TranslateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TranslateError {}

/// One dialect's wire facts and translators, one table per dialect (each in its own folder:
/// `chat::WIRE`, `responses::WIRE`, `messages::WIRE`, `gemini::WIRE`), read through
/// [`Dialect::wire`]: how its errors look, how its streams end, where its usage is, which header
/// family it belongs to, and its request / response / stream translators to and from the hub.
/// Code that differs by dialect reads these facts instead of matching on the dialect.
pub struct Wire {
    pub dialect: Dialect,
    /// A short stable name (`chat`, `responses`, `messages`, `gemini`).
    pub name: &'static str,
    /// Its family (OpenAI for Chat and Responses, Anthropic, Google): the shape of its error
    /// bodies and the naming of its headers.
    pub error_shape: ErrorShape,
    /// Its error `type` name (Gemini: `status`) for an HTTP status.
    pub error_type: fn(u16) -> &'static str,
    /// Its error `code` for an HTTP status, where it has one (OpenAI).
    pub error_code: fn(u16) -> Option<&'static str>,
    /// The `event:` name of a mid-stream error event (`None`: a bare `data:` event).
    pub error_event: Option<&'static str>,
    /// Names of the events that end a stream (as the `event:` line or the JSON `type`).
    pub terminal_events: &'static [&'static str],
    /// The data of the event that ends a stream (Chat `[DONE]`).
    pub terminal_data: Option<&'static str>,
    /// A key whose presence ends a stream (Gemini `finishReason`).
    pub terminal_key: Option<&'static str>,
    /// Where a stream event or a response carries usage: the first path holding an object.
    pub usage_at: &'static [&'static [&'static str]],
    /// That usage object in hub terms.
    pub usage_to_hub: fn(&Value) -> Usage,
    /// A client body of this dialect → hub Chat request.
    pub request_to_chat: fn(&[u8]) -> Result<Value, TranslateError>,
    /// Hub Chat request → an upstream body of this dialect, for an upstream model.
    pub chat_to_request: fn(&Value, &str) -> Result<Value, TranslateError>,
    /// A non-stream upstream body of this dialect → hub Chat completion.
    pub response_to_chat: fn(&[u8]) -> Result<Value, TranslateError>,
    /// Hub Chat completion → a client body of this dialect, for the client's model.
    pub chat_to_response: fn(&Value, &str) -> Result<Value, TranslateError>,
    /// A decoder of this dialect's upstream stream events into hub events (`<dialect>/stream.rs`).
    pub(crate) decoder: fn() -> Decoder,
    /// An encoder of hub events into this dialect's client stream, for the client's model.
    pub(crate) encoder: fn(String) -> Encoder,
}

impl Wire {
    /// Whether one whole raw SSE event is this dialect's terminal event. Only the event's first
    /// bytes are looked at (its `event:` line and the JSON `type`, which comes first) except
    /// for a terminal key; a JSON string cannot hold a raw newline or an unescaped quote, so
    /// these patterns never match inside content. A few short scans per relayed piece.
    pub fn is_terminal_event(&self, ev: &[u8]) -> bool {
        let head = ev.get(..ev.len().min(256)).unwrap_or(ev);
        let at_line_start = |field: &[u8], value: &[u8]| {
            memchr::memmem::find_iter(head, field).any(|i| {
                (i == 0 || matches!(head.get(i - 1), Some(b'\n' | b'\r')))
                    && head.get(i + field.len()..).is_some_and(|rest| {
                        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
                        rest.strip_prefix(value)
                            .is_some_and(|end| matches!(end.first(), None | Some(b'\n' | b'\r')))
                    })
            })
        };
        // `"type":"<name>"` and `"<key>"`, matched in place (no pattern is built: this runs per
        // relayed piece)
        let typed = |name: &str| {
            memchr::memmem::find_iter(head, b"\"type\":\"").any(|i| {
                head.get(i + 8..)
                    .and_then(|rest| rest.strip_prefix(name.as_bytes()))
                    .is_some_and(|end| end.first() == Some(&b'"'))
            })
        };
        let keyed = |key: &str| {
            memchr::memmem::find_iter(ev, key.as_bytes()).any(|i| {
                i > 0 && ev.get(i - 1) == Some(&b'"') && ev.get(i + key.len()) == Some(&b'"')
            })
        };
        self.terminal_data
            .is_some_and(|d| at_line_start(b"data:", d.as_bytes()))
            || self
                .terminal_events
                .iter()
                .any(|n| at_line_start(b"event:", n.as_bytes()) || typed(n))
            || self.terminal_key.is_some_and(keyed)
    }

    /// The usage a parsed event or response of this dialect reports, if any.
    pub fn usage_of(&self, v: &Value) -> Option<Usage> {
        self.usage_at.iter().find_map(|path| {
            let u = path.iter().try_fold(v, |v, k| v.get(k))?;
            u.is_object().then(|| (self.usage_to_hub)(u))
        })
    }
}

/// One stream's upstream decoder: its dialect's own state and code (in that dialect's folder,
/// `<dialect>/stream.rs`), made by [`Wire::decoder`].
pub(crate) enum Decoder {
    Chat(chat::stream::ChatIn),
    Messages(messages::stream::MessagesIn),
    Responses(responses::stream::ResponsesIn),
    Gemini,
}

impl Decoder {
    pub(crate) fn decode(&mut self, core: &mut Core, ev: &SseEvent, hub: &mut Vec<Hub>) -> Decoded {
        match self {
            Decoder::Chat(d) => d.decode(core, ev, hub),
            Decoder::Messages(d) => d.decode(core, ev, hub),
            Decoder::Responses(d) => d.decode(core, ev, hub),
            Decoder::Gemini => gemini::stream::decode(core, ev, hub),
        }
    }
}

/// One stream's client encoder: its dialect's own state and code (in that dialect's folder),
/// made by [`Wire::encoder`].
pub(crate) enum Encoder {
    Chat(chat::stream::ChatOut),
    Messages(messages::stream::MessagesOut),
    Responses(responses::stream::ResponsesOut),
    Gemini(gemini::stream::GeminiOut),
}

impl Encoder {
    pub(crate) fn handle(&mut self, ev: Hub, out: &mut Vec<u8>) {
        match self {
            Encoder::Chat(c) => c.handle(ev, out),
            Encoder::Messages(c) => c.handle(ev, out),
            Encoder::Responses(c) => c.handle(ev, out),
            Encoder::Gemini(c) => c.handle(ev, out),
        }
    }

    /// Whether a Chat client gets the final usage chunk.
    pub(crate) fn set_chat_usage(&mut self, on: bool) {
        if let Encoder::Chat(c) = self {
            c.include_usage = on;
        }
    }
}

/// Inbound: a client body in dialect `from` → hub Chat request.
pub fn request_to_chat(from: Dialect, body: &[u8]) -> Result<Value, TranslateError> {
    let mut hub = (from.wire().request_to_chat)(body)?;
    // Chat APIs reject `tool_choice` / `parallel_tool_calls` without tools.
    if let Some(o) = hub.as_object_mut() {
        let has_tools = o
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if !has_tools {
            o.remove("tool_choice");
            o.remove("parallel_tool_calls");
        }
    }
    Ok(hub)
}

/// Outbound: hub Chat request → provider body in dialect `to`, with the model
/// set to `upstream_model` (except Gemini, whose model lives in the URL).
/// For a streaming Chat upstream this sets `stream_options.include_usage`.
/// `n > 1` is refused for every other dialect (each answers one choice; dropping `n` would
/// answer differently); Chat's `allowed_tools` reaches Anthropic and Gemini as a narrowed
/// tool list (`structured::narrow_allowed_tools`).
pub fn chat_to_request(
    to: Dialect,
    chat: &Value,
    upstream_model: &str,
) -> Result<Vec<u8>, TranslateError> {
    if to != Dialect::Chat && chat.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err(TranslateError::new(format!(
            "`n` > 1 cannot be translated to a {} provider: it answers one choice per request",
            to.name()
        )));
    }
    let narrowed = match to {
        Dialect::Messages | Dialect::Gemini => structured::narrow_allowed_tools(chat),
        _ => None,
    };
    let chat = narrowed.as_ref().unwrap_or(chat);
    util::to_bytes(&(to.wire().chat_to_request)(chat, upstream_model)?)
}

/// Non-stream upstream response body in dialect `from` → hub Chat completion.
pub fn response_to_chat(from: Dialect, body: &[u8]) -> Result<Value, TranslateError> {
    (from.wire().response_to_chat)(body)
}

/// Hub Chat completion → client response body in dialect `to`, reporting
/// `client_model` as the model.
pub fn chat_to_response(
    to: Dialect,
    chat: &Value,
    client_model: &str,
) -> Result<Vec<u8>, TranslateError> {
    util::to_bytes(&(to.wire().chat_to_response)(chat, client_model)?)
}

/// Hub Chat completion → Responses response body, with the `response` value it was written
/// from (kept by the Responses state store, `translate::references::answer`, without parsing the
/// body again).
pub fn chat_to_responses_answer(
    chat: &Value,
    client_model: &str,
) -> Result<(Value, Vec<u8>), TranslateError> {
    let v = responses::chat_to_response(chat, client_model)?;
    let bytes = util::to_bytes(&v)?;
    Ok((v, bytes))
}

/// The usage of a hub Chat completion (`usage.prompt_tokens`, `usage.completion_tokens`), as
/// `response_to_chat` left it.
pub fn chat_usage(chat: &Value) -> Usage {
    chat.get("usage")
        .map(util::read_chat_usage)
        .unwrap_or_default()
}

/// Crude token estimate (~4 bytes per token, rounded up) for `count_tokens`
/// when the upstream cannot count.
pub fn estimate_tokens(body: &[u8]) -> u64 {
    (body.len() as u64).div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_stream_sets_include_usage() {
        let hub = json!({"model":"a","stream":true,"messages":[]});
        let out = chat_to_request(Dialect::Chat, &hub, "up").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "up");
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    #[test]
    fn chat_request_requires_messages() {
        assert!(request_to_chat(Dialect::Chat, b"{}").is_err());
        assert!(request_to_chat(Dialect::Chat, b"[1]").is_err());
        assert!(request_to_chat(Dialect::Chat, b"{\"messages\":[]}").is_ok());
    }

    #[test]
    fn estimate() {
        assert_eq!(estimate_tokens(b""), 0);
        assert_eq!(estimate_tokens(b"abcde"), 2);
    }

    fn t(d: Dialect, ev: &[u8]) -> bool {
        d.wire().is_terminal_event(ev)
    }

    #[test]
    fn terminal_events_by_the_facts() {
        use Dialect::*;
        assert!(t(Chat, b"data: [DONE]\n\n"));
        assert!(t(Chat, b"data:[DONE]\n\n"));
        assert!(!t(Chat, b"data: {\"c\":\"x data: [DONE]\"}\n\n"));
        assert!(!t(Chat, b"data: [DONE]x\n\n"));
        assert!(t(Messages, b"event: message_stop\ndata: {}\n\n"));
        assert!(t(Messages, b"data: {\"type\":\"message_stop\"}\n\n"));
        assert!(!t(Messages, b"event: message_stop_x\ndata: {}\n\n"));
        assert!(!t(Messages, b"event: message_delta\ndata: {}\n\n"));
        for n in [
            "response.completed",
            "response.incomplete",
            "response.failed",
        ] {
            assert!(t(
                Responses,
                format!("event: {n}\ndata: {{}}\n\n").as_bytes()
            ));
            assert!(t(
                Responses,
                format!("data: {{\"type\":\"{n}\"}}\n\n").as_bytes()
            ));
        }
        assert!(!t(Responses, b"data: {\"type\":\"response.created\"}\n\n"));
        assert!(t(
            Gemini,
            b"data: {\"candidates\":[{\"finishReason\":\"STOP\"}]}\n\n"
        ));
        assert!(!t(Gemini, b"data: {\"candidates\":[]}\n\n"));
    }

    #[test]
    fn usage_where_each_dialect_puts_it() {
        use serde_json::json;
        let u = |d: Dialect, v: Value| d.wire().usage_of(&v).and_then(|u| u.prompt_tokens);
        assert_eq!(
            u(Dialect::Chat, json!({"usage": {"prompt_tokens": 3}})),
            Some(3)
        );
        assert_eq!(u(Dialect::Chat, json!({"usage": null})), None);
        let start = json!({"message": {"usage": {"input_tokens": 4}}});
        assert_eq!(u(Dialect::Messages, start), Some(4));
        let done = json!({"response": {"usage": {"input_tokens": 5}}});
        assert_eq!(u(Dialect::Responses, done), Some(5));
        let g = json!({"usageMetadata": {"promptTokenCount": 6}});
        assert_eq!(u(Dialect::Gemini, g), Some(6));
    }
}
