//! OpenAI Chat Completions, the hub dialect: its wire facts, the checks a Chat client body
//! gets, the Chat upstream body (the hub with the upstream model and `include_usage`), the
//! OpenAI error type names, the typed view of a streaming chunk (`chunk`), and the Chat stream's
//! decoder and encoder (`stream`).
//!
//! Must not: perform IO, or allocate beyond the values it returns.

pub(crate) mod chunk;
pub(crate) mod stream;

use serde_json::Value;

use super::util;
use super::Dialect;
use super::TranslateError;
use super::Wire;
use super::{Decoder, Encoder};
use crate::error::ErrorShape;

/// Chat's wire facts.
pub static WIRE: Wire = Wire {
    dialect: Dialect::Chat,
    name: "chat",
    error_shape: ErrorShape::OpenAi,
    error_type,
    error_code,
    error_event: None,
    terminal_events: &[],
    terminal_data: Some("[DONE]"),
    terminal_key: None,
    usage_at: &[&["usage"]],
    usage_to_hub: util::read_chat_usage,
    request_to_chat,
    chat_to_request,
    response_to_chat: util::parse_object,
    chat_to_response,
    decoder: || Decoder::Chat(Default::default()),
    encoder: |model| Encoder::Chat(stream::ChatOut::new(model)),
};

/// OpenAI `error.type` for an HTTP status (Chat and Responses).
pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        400 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        _ if status >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

/// OpenAI `error.code` for an HTTP status, where the API documents one.
pub(crate) fn error_code(status: u16) -> Option<&'static str> {
    match status {
        401 => Some("invalid_api_key"),
        429 => Some("rate_limit_exceeded"),
        _ => None,
    }
}

/// A Chat client body: one object with a `messages` array.
fn request_to_chat(body: &[u8]) -> Result<Value, TranslateError> {
    let v = util::parse_object(body)?;
    if !v.get("messages").is_some_and(Value::is_array) {
        return Err(TranslateError::new("`messages` must be an array"));
    }
    Ok(v)
}

/// The hub as a Chat upstream body: the upstream model, and for a stream
/// `stream_options.include_usage` set (else no `stream_options`).
fn chat_to_request(chat: &Value, model: &str) -> Result<Value, TranslateError> {
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

/// The hub completion as a Chat client body: the client's model.
fn chat_to_response(chat: &Value, client_model: &str) -> Result<Value, TranslateError> {
    let mut c = util::as_object(chat)?.clone();
    c.insert("model".into(), Value::from(client_model));
    Ok(Value::Object(c))
}
