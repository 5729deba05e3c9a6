//! Error answers of the mock, each in the shape its dialect documents: OpenAI
//! `{"error":{"message","type","param","code"}}`, Anthropic
//! `{"type":"error","error":{"type","message"}}`, Gemini `{"error":{"code","message","status"}}`.
//!
//! Owns: those bodies and their HTTP responses. Must not: decide when a request is invalid.

use std::io::{self, Write};

use monoio::io::AsyncWriteRent;

use super::{pace, Dialect, Profile};
use crate::error::{push_json_str, ErrorShape};

/// The error body shape of dialect `d`'s clients.
pub fn shape(d: Dialect) -> ErrorShape {
    match d {
        Dialect::Chat | Dialect::Responses => ErrorShape::OpenAi,
        Dialect::Messages => ErrorShape::Anthropic,
        Dialect::Gemini => ErrorShape::Gemini,
    }
}

/// The error type (Gemini: status) name `shape` documents for `status`.
fn type_name(shape: ErrorShape, status: u16) -> &'static str {
    use ErrorShape::{Anthropic, Gemini, OpenAi};
    match (shape, status) {
        (OpenAi | Anthropic, 404) => "not_found_error",
        (OpenAi | Anthropic, 429) => "rate_limit_error",
        (OpenAi, 500..) => "server_error",
        (Anthropic, 503 | 529) => "overloaded_error",
        (Anthropic, 500..) => "api_error",
        (OpenAi | Anthropic, _) => "invalid_request_error",
        (Gemini, 404) => "NOT_FOUND",
        (Gemini, 405) => "UNIMPLEMENTED",
        (Gemini, 429) => "RESOURCE_EXHAUSTED",
        (Gemini, 503) => "UNAVAILABLE",
        (Gemini, 500..) => "INTERNAL",
        (Gemini, _) => "INVALID_ARGUMENT",
    }
}

/// The error body for `status` (400 invalid request, 404 not found, 405 wrong method, 429 rate
/// limited, 5xx server errors, 503 / 529 overloaded).
pub fn body(shape: ErrorShape, status: u16, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + message.len());
    let ty = type_name(shape, status);
    match shape {
        ErrorShape::OpenAi => {
            out.extend_from_slice(b"{\"error\":{\"message\":");
            push_json_str(&mut out, message);
            let _ = write!(out, ",\"type\":\"{ty}\",\"param\":null,\"code\":null}}}}");
        }
        ErrorShape::Anthropic => {
            let _ = write!(
                out,
                "{{\"type\":\"error\",\"error\":{{\"type\":\"{ty}\",\"message\":"
            );
            push_json_str(&mut out, message);
            out.extend_from_slice(b"}}");
        }
        ErrorShape::Gemini => {
            let _ = write!(out, "{{\"error\":{{\"code\":{status},\"message\":");
            push_json_str(&mut out, message);
            let _ = write!(out, ",\"status\":\"{ty}\"}}}}");
        }
    }
    out
}

/// Write an error response at once.
pub async fn write<S: AsyncWriteRent>(
    s: &mut S,
    shape: ErrorShape,
    status: u16,
    message: &str,
    keep_alive: bool,
) -> io::Result<()> {
    let b = body(shape, status, message);
    pace::json(s, status, &b, Profile::Instant, keep_alive).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        let v = |shape, status, msg| -> serde_json::Value {
            serde_json::from_slice(&body(shape, status, msg)).unwrap()
        };
        let a = v(ErrorShape::Anthropic, 400, "max_tokens: \"x\"");
        assert_eq!(a["type"], "error");
        assert_eq!(a["error"]["type"], "invalid_request_error");
        let g = &v(ErrorShape::Gemini, 404, "m")["error"];
        assert_eq!(
            (g["code"].as_u64(), g["status"].as_str()),
            (Some(404), Some("NOT_FOUND"))
        );
        for (shape, status, path, want) in [
            (ErrorShape::OpenAi, 400, "type", "invalid_request_error"),
            (ErrorShape::Anthropic, 503, "type", "overloaded_error"),
            (ErrorShape::OpenAi, 429, "type", "rate_limit_error"),
            (ErrorShape::Gemini, 500, "status", "INTERNAL"),
        ] {
            assert_eq!(
                v(shape, status, "m")["error"][path],
                want,
                "{shape:?} {status}"
            );
        }
    }
}
