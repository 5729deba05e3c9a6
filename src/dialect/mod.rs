//! Pure, sans-IO translation between LLM API dialects, with OpenAI Chat
//! Completions as the hub: every dialect converts to and from Chat, so N
//! converters each way suffice instead of N².
//!
//! Owns: the [`Dialect`] enum, the top-level dispatch functions, and the
//! shared [`Usage`] record. Must not: perform IO, read clocks or randomness,
//! log, or allocate beyond the values it returns.
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
pub mod gemini_call;
pub mod op;

pub mod anthropic;
mod cache;
mod chat_chunk;
pub mod converse;
pub mod converse_stream;
pub mod error;
pub mod extensions;
pub mod gemini;
pub mod references;
pub mod responses;
mod schema;
pub mod sse;
pub mod stream;
mod stream_out;
mod stream_responses;
pub mod structured;
pub mod thinking;
mod util;

pub use error::{
    error_body, error_message, is_error_shape, stream_error_event, upstream_error_to_client,
    TranslateError,
};
pub use sse::{encode_event, SseDecoder, SseEvent};
pub use stream::StreamTranslator;

use serde_json::Value;

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

    /// A short stable name (`chat`, `responses`, `messages`, `gemini`).
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Chat => "chat",
            Dialect::Responses => "responses",
            Dialect::Messages => "messages",
            Dialect::Gemini => "gemini",
        }
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

/// Inbound: a client body in dialect `from` → hub Chat request.
pub fn request_to_chat(from: Dialect, body: &[u8]) -> Result<Value, TranslateError> {
    let mut hub = match from {
        Dialect::Chat => {
            let v = util::parse_object(body)?;
            if !v.get("messages").is_some_and(Value::is_array) {
                return Err(TranslateError::new("`messages` must be an array"));
            }
            v
        }
        Dialect::Responses => responses::request_to_chat(body)?,
        Dialect::Messages => anthropic::request_to_chat(body)?,
        Dialect::Gemini => gemini::request_to_chat(body)?,
    };
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
    let v = match to {
        Dialect::Chat => chat_to_chat_request(chat, upstream_model)?,
        Dialect::Responses => responses::chat_to_request(chat, upstream_model)?,
        Dialect::Messages => anthropic::chat_to_request(chat, upstream_model)?,
        Dialect::Gemini => gemini::chat_to_request(chat)?,
    };
    util::to_bytes(&v)
}

/// Non-stream upstream response body in dialect `from` → hub Chat completion.
pub fn response_to_chat(from: Dialect, body: &[u8]) -> Result<Value, TranslateError> {
    match from {
        Dialect::Chat => util::parse_object(body),
        Dialect::Responses => responses::response_to_chat(body),
        Dialect::Messages => anthropic::response_to_chat(body),
        Dialect::Gemini => gemini::response_to_chat(body),
    }
}

/// Hub Chat completion → client response body in dialect `to`, reporting
/// `client_model` as the model.
pub fn chat_to_response(
    to: Dialect,
    chat: &Value,
    client_model: &str,
) -> Result<Vec<u8>, TranslateError> {
    let v = match to {
        Dialect::Chat => {
            let mut c = util::as_object(chat)?.clone();
            c.insert("model".into(), Value::from(client_model));
            Value::Object(c)
        }
        Dialect::Responses => responses::chat_to_response(chat, client_model)?,
        Dialect::Messages => anthropic::chat_to_response(chat, client_model)?,
        Dialect::Gemini => gemini::chat_to_response(chat, client_model)?,
    };
    util::to_bytes(&v)
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

fn chat_to_chat_request(chat: &Value, model: &str) -> Result<Value, TranslateError> {
    let mut c = util::as_object(chat)?.clone();
    c.insert("model".into(), Value::from(model));
    if c.get("stream").and_then(Value::as_bool) == Some(true) {
        let opts = c
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(o) = opts.as_object_mut() {
            o.insert("include_usage".into(), Value::Bool(true));
        } else {
            *opts = serde_json::json!({"include_usage": true});
        }
    } else {
        c.remove("stream_options");
    }
    Ok(Value::Object(c))
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
}
