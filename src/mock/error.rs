//! Error answers of the mock, each in the shape its dialect documents: OpenAI
//! `{"error":{"message","type","param","code"}}`, Anthropic
//! `{"type":"error","error":{"type","message"}}`, Gemini `{"error":{"code","message","status"}}`.
//!
//! Owns: those bodies and their HTTP responses. Must not: decide when a request is invalid.

use std::io::{self, Write};

use monoio::io::AsyncWriteRent;

use super::{pace, Dialect, Profile};
use crate::error::push_json_str;

/// Which error body to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    Anthropic,
    Gemini,
}

impl Shape {
    pub fn of(d: Dialect) -> Shape {
        match d {
            Dialect::Chat | Dialect::Responses => Shape::OpenAi,
            Dialect::Messages => Shape::Anthropic,
            Dialect::Gemini => Shape::Gemini,
        }
    }
}

/// The error body for `status` (400 invalid request, 404 not found, 405 wrong method, 429 rate
/// limited, 5xx server errors, 503 / 529 overloaded).
pub fn body(shape: Shape, status: u16, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + message.len());
    match shape {
        Shape::OpenAi => {
            let ty = match status {
                404 => "not_found_error",
                429 => "rate_limit_error",
                500.. => "server_error",
                _ => "invalid_request_error",
            };
            out.extend_from_slice(b"{\"error\":{\"message\":");
            push_json_str(&mut out, message);
            let _ = write!(out, ",\"type\":\"{ty}\",\"param\":null,\"code\":null}}}}");
        }
        Shape::Anthropic => {
            let ty = match status {
                404 => "not_found_error",
                429 => "rate_limit_error",
                503 | 529 => "overloaded_error",
                500.. => "api_error",
                _ => "invalid_request_error",
            };
            let _ = write!(
                out,
                "{{\"type\":\"error\",\"error\":{{\"type\":\"{ty}\",\"message\":"
            );
            push_json_str(&mut out, message);
            out.extend_from_slice(b"}}");
        }
        Shape::Gemini => {
            let st = match status {
                404 => "NOT_FOUND",
                405 => "UNIMPLEMENTED",
                429 => "RESOURCE_EXHAUSTED",
                503 => "UNAVAILABLE",
                500.. => "INTERNAL",
                _ => "INVALID_ARGUMENT",
            };
            let _ = write!(out, "{{\"error\":{{\"code\":{status},\"message\":");
            push_json_str(&mut out, message);
            let _ = write!(out, ",\"status\":\"{st}\"}}}}");
        }
    }
    out
}

/// Write an error response at once.
pub async fn write<S: AsyncWriteRent>(
    s: &mut S,
    shape: Shape,
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
        let v: serde_json::Value =
            serde_json::from_slice(&body(Shape::Anthropic, 400, "max_tokens: \"x\"")).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let v: serde_json::Value = serde_json::from_slice(&body(Shape::Gemini, 404, "m")).unwrap();
        assert_eq!(
            (v["error"]["code"].as_u64(), v["error"]["status"].as_str()),
            (Some(404), Some("NOT_FOUND"))
        );
        let v: serde_json::Value = serde_json::from_slice(&body(Shape::OpenAi, 400, "m")).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let v: serde_json::Value =
            serde_json::from_slice(&body(Shape::Anthropic, 503, "busy")).unwrap();
        assert_eq!(v["error"]["type"], "overloaded_error");
        let v: serde_json::Value = serde_json::from_slice(&body(Shape::OpenAi, 429, "m")).unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_error");
        let v: serde_json::Value = serde_json::from_slice(&body(Shape::Gemini, 500, "m")).unwrap();
        assert_eq!(v["error"]["status"], "INTERNAL");
    }
}
