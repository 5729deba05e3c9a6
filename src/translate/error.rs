//! Errors: the translation error type, and error bodies / mid-stream error
//! events in each client dialect's own shape.
//!
//! Shapes (from the providers' documentation):
//! * OpenAI (Chat, Responses): `{"error":{"message","type","param","code"}}`
//! * Anthropic: `{"type":"error","error":{"type","message"}}`
//! * Gemini: `{"error":{"code","message","status"}}`
//!
//! Must not: perform IO, or allocate beyond the returned bytes.

use super::Dialect;
use serde_json::{json, Value};
use std::fmt;

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

fn openai_type(status: u16) -> &'static str {
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

fn openai_code(status: u16) -> Value {
    match status {
        401 => Value::from("invalid_api_key"),
        429 => Value::from("rate_limit_exceeded"),
        _ => Value::Null,
    }
}

fn anthropic_type(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        503 | 529 => "overloaded_error",
        _ if status >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

fn gemini_status(status: u16) -> &'static str {
    match status {
        400 | 413 | 422 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ if status >= 500 => "INTERNAL",
        _ => "FAILED_PRECONDITION",
    }
}

fn error_value(client: Dialect, status: u16, message: &str) -> Value {
    match client {
        Dialect::Chat | Dialect::Responses => json!({"error": {
            "message": message,
            "type": openai_type(status),
            "param": null,
            "code": openai_code(status),
        }}),
        Dialect::Messages => json!({"type": "error", "error": {
            "type": anthropic_type(status),
            "message": message,
        }}),
        Dialect::Gemini => json!({"error": {
            "code": status,
            "message": message,
            "status": gemini_status(status),
        }}),
    }
}

/// An error response body for HTTP `status` in the client's dialect.
pub fn error_body(client: Dialect, status: u16, message: &str) -> Vec<u8> {
    serde_json::to_vec(&error_value(client, status, message)).unwrap_or_default()
}

/// Longest upstream text quoted back to the client when the upstream error
/// body is not structured.
const MAX_RAW: usize = 1024;

/// Pull a human-readable message out of an upstream error body of any
/// dialect (`error.message`, `message`, `detail`, `error` string, Gemini's
/// array form), falling back to the raw text (truncated) or a status line.
pub fn extract_message(status: u16, body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if let Some(m) = error_message(&v) {
            return m.to_string();
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return format!("upstream returned HTTP {status}");
    }
    let mut end = text.len().min(MAX_RAW);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default().to_string()
}

/// The message of a parsed upstream error body of any dialect (`error.message`, `error` string,
/// `message`, `detail`; Gemini's array form looks at its first element).
pub fn error_message(v: &Value) -> Option<&str> {
    let v = match v {
        Value::Array(a) => a.first()?,
        _ => v,
    };
    v.get("error")
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .or_else(|| v.get("error").and_then(Value::as_str))
        .or_else(|| v.get("message").and_then(Value::as_str))
        .or_else(|| v.get("detail").and_then(Value::as_str))
}

/// Whether a parsed error body is in `client`'s own error shape, as its SDKs read it: OpenAI
/// (Chat, Responses) an `error` object with string `message` and `type`; Anthropic the same
/// under `"type":"error"`; Gemini an `error` object with a string `message` and a numeric
/// `code`.
pub fn is_error_shape(client: Dialect, v: &Value) -> bool {
    let Some(e) = v.get("error").filter(|e| e.is_object()) else {
        return false;
    };
    let message = e.get("message").is_some_and(Value::is_string);
    match client {
        Dialect::Chat | Dialect::Responses => {
            message && e.get("type").is_some_and(Value::is_string)
        }
        Dialect::Messages => {
            message
                && e.get("type").is_some_and(Value::is_string)
                && v.get("type").and_then(Value::as_str) == Some("error")
        }
        Dialect::Gemini => message && e.get("code").is_some_and(Value::is_number),
    }
}

/// Reshape an upstream error body into the client's dialect, keeping the
/// upstream's message. Same dialect and a body already in the client's error
/// shape (`is_error_shape`): forwarded unchanged.
pub fn upstream_error_to_client(
    upstream: Dialect,
    client: Dialect,
    status: u16,
    body: &[u8],
) -> Vec<u8> {
    let same = upstream == client
        || matches!(
            (upstream, client),
            (Dialect::Chat, Dialect::Responses) | (Dialect::Responses, Dialect::Chat)
        );
    if same {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            if is_error_shape(client, &v) {
                return body.to_vec();
            }
        }
    }
    error_body(client, status, &extract_message(status, body))
}

/// A dialect-correct mid-stream error event, appended to `out`:
/// Chat and Gemini get a `data:` line holding their error object, Anthropic
/// an `event: error`, Responses an `event: error` with `code`/`message`.
pub fn stream_error_event(client: Dialect, message: &str, out: &mut Vec<u8>) {
    stream_error_event_seq(client, message, None, out);
}

pub(crate) fn stream_error_event_seq(
    client: Dialect,
    message: &str,
    seq: Option<u64>,
    out: &mut Vec<u8>,
) {
    match client {
        Dialect::Chat | Dialect::Gemini => {
            let v = error_value(client, 500, message);
            super::sse::encode_event(None, &v.to_string(), out);
        }
        Dialect::Messages => {
            let v = error_value(client, 500, message);
            super::sse::encode_event(Some("error"), &v.to_string(), out);
        }
        Dialect::Responses => {
            let mut v =
                json!({"type": "error", "code": "server_error", "message": message, "param": null});
            if let (Some(n), Some(o)) = (seq, v.as_object_mut()) {
                o.insert("sequence_number".into(), n.into());
            }
            super::sse::encode_event(Some("error"), &v.to_string(), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn shapes() {
        let o = parse(&error_body(Dialect::Chat, 429, "slow"));
        assert_eq!(o["error"]["message"], "slow");
        assert_eq!(o["error"]["type"], "rate_limit_error");
        let a = parse(&error_body(Dialect::Messages, 529, "busy"));
        assert_eq!(a["type"], "error");
        assert_eq!(a["error"]["type"], "overloaded_error");
        let g = parse(&error_body(Dialect::Gemini, 400, "bad"));
        assert_eq!(g["error"]["code"], 400);
        assert_eq!(g["error"]["status"], "INVALID_ARGUMENT");
    }

    #[test]
    fn reshape() {
        let up = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too big"}}"#;
        let o = parse(&upstream_error_to_client(
            Dialect::Messages,
            Dialect::Chat,
            400,
            up,
        ));
        assert_eq!(o["error"]["message"], "max_tokens: too big");
        let g = br#"[{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}]"#;
        let a = parse(&upstream_error_to_client(
            Dialect::Gemini,
            Dialect::Messages,
            429,
            g,
        ));
        assert_eq!(a["error"]["message"], "quota");
        assert_eq!(a["error"]["type"], "rate_limit_error");
        let raw = parse(&upstream_error_to_client(
            Dialect::Chat,
            Dialect::Gemini,
            502,
            b"bad gateway",
        ));
        assert_eq!(raw["error"]["message"], "bad gateway");
        let empty = parse(&upstream_error_to_client(
            Dialect::Chat,
            Dialect::Chat,
            503,
            b"",
        ));
        assert_eq!(empty["error"]["message"], "upstream returned HTTP 503");
        let same = br#"{"error":{"message":"x","type":"t","code":null}}"#;
        assert_eq!(
            upstream_error_to_client(Dialect::Chat, Dialect::Chat, 400, same),
            same.to_vec()
        );
    }

    #[test]
    fn error_shapes_per_dialect() {
        let oa = json!({"error": {"message": "m", "type": "t", "param": null, "code": null}});
        let an = json!({"type": "error", "error": {"type": "t", "message": "m"}});
        let ge = json!({"error": {"code": 400, "message": "m", "status": "INVALID_ARGUMENT"}});
        assert!(is_error_shape(Dialect::Chat, &oa) && is_error_shape(Dialect::Responses, &oa));
        assert!(is_error_shape(Dialect::Messages, &an));
        assert!(is_error_shape(Dialect::Gemini, &ge));
        assert!(!is_error_shape(Dialect::Messages, &oa), "no top-level type");
        assert!(!is_error_shape(Dialect::Chat, &ge), "no error.type");
        assert!(!is_error_shape(Dialect::Chat, &json!({"error": "m"})));
        assert!(!is_error_shape(
            Dialect::Chat,
            &json!({"error": {"message": 1, "type": "t"}})
        ));
        // A same-dialect body not in the client's shape is reshaped, its message kept.
        let bare = br#"{"error":{"message":"too long"}}"#;
        let o = parse(&upstream_error_to_client(
            Dialect::Chat,
            Dialect::Chat,
            400,
            bare,
        ));
        assert_eq!(o["error"]["message"], "too long");
        assert_eq!(o["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn truncates_on_char_boundary() {
        let body = "é".repeat(1000);
        let m = extract_message(500, body.as_bytes());
        assert!(m.len() <= MAX_RAW);
    }

    #[test]
    fn stream_errors() {
        let mut out = Vec::new();
        stream_error_event(Dialect::Messages, "boom", &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n"
        );
        let mut out = Vec::new();
        stream_error_event(Dialect::Chat, "boom", &mut out);
        assert!(out.starts_with(b"data: {\"error\":"));
    }
}
