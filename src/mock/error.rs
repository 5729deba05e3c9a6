//! Error answers of the mock, each in the shape its dialect documents, rendered by the
//! gateway's one error renderer with the dialect's own type names (`crate::dialect::error_body`,
//! from `Dialect::wire`): OpenAI `{"error":{"message","type","param","code"}}`, Anthropic
//! `{"type":"error","error":{"type","message"}}`, Gemini `{"error":{"code","message","status"}}`;
//! and the event a stream carries when the provider fails mid-answer.
//!
//! Owns: those HTTP responses and the mid-stream failure. Must not: decide when a request is
//! invalid, or name a dialect's error types itself.

use std::io;

use monoio::io::AsyncWriteRent;

use super::speaker_of;
use super::{pace, Dialect, Profile};

/// The message of a mid-stream failure.
pub const MID_STREAM: &str = "mock fault: overloaded mid-stream";

/// The error body for `status` in dialect `d`'s shape (400 invalid request, 404 not found,
/// 405 wrong method, 429 rate limited, 5xx server errors, 503 / 529 overloaded).
pub fn body(d: Dialect, status: u16, message: &str) -> Vec<u8> {
    crate::dialect::error_body(d, status, message)
}

/// Write an error response at once.
pub async fn write<S: AsyncWriteRent>(
    s: &mut S,
    d: Dialect,
    status: u16,
    message: &str,
    keep_alive: bool,
) -> io::Result<()> {
    let b = body(d, status, message);
    pace::json(s, status, &b, Profile::Instant, keep_alive).await
}

/// Append the event a stream of `d` carries when the provider fails mid-answer (`seq`: the
/// events before it): the dialect's own failure event (`Speaker::failed`: Responses
/// `response.failed`), else its error event for an overloaded provider (503; Anthropic's
/// overloaded is 529) and then its terminal data (Chat `[DONE]`, as vLLM sends it).
pub fn stream_event(d: Dialect, seq: usize, out: &mut Vec<u8>) {
    if let Some(failed) = speaker_of(d).failed {
        return failed(seq, MID_STREAM, out);
    }
    let status = crate::dialect::error::client_status(Dialect::Chat, d, 503);
    let b = body(d, status, MID_STREAM);
    let wire = d.wire();
    crate::dialect::encode_event(wire.error_event, &String::from_utf8_lossy(&b), out);
    if let Some(end) = wire.terminal_data {
        crate::dialect::encode_event(None, end, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        let v = |d, status, msg| -> serde_json::Value {
            serde_json::from_slice(&body(d, status, msg)).unwrap()
        };
        let a = v(Dialect::Messages, 400, "max_tokens: \"x\"");
        assert_eq!(a["type"], "error");
        assert_eq!(a["error"]["type"], "invalid_request_error");
        let g = &v(Dialect::Gemini, 404, "m")["error"];
        assert_eq!(
            (g["code"].as_u64(), g["status"].as_str()),
            (Some(404), Some("NOT_FOUND"))
        );
        for (d, status, path, want) in [
            (Dialect::Chat, 400, "type", "invalid_request_error"),
            (Dialect::Messages, 503, "type", "overloaded_error"),
            (Dialect::Responses, 429, "type", "rate_limit_error"),
            (Dialect::Gemini, 500, "status", "INTERNAL"),
        ] {
            assert_eq!(v(d, status, "m")["error"][path], want, "{d:?} {status}");
        }
    }

    /// The mid-stream failure of every dialect, byte for byte as providers send it (the fault
    /// tests' SDKs read these).
    #[test]
    fn mid_stream_failures() {
        let ev = |d, seq| {
            let mut out = Vec::new();
            stream_event(d, seq, &mut out);
            String::from_utf8(out).unwrap()
        };
        let msg = MID_STREAM;
        assert_eq!(
            ev(Dialect::Chat, 2),
            format!("data: {{\"error\":{{\"message\":\"{msg}\",\"type\":\"server_error\",\"param\":null,\"code\":null}}}}\n\ndata: [DONE]\n\n")
        );
        assert_eq!(
            ev(Dialect::Messages, 2),
            format!("event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"overloaded_error\",\"message\":\"{msg}\"}}}}\n\n")
        );
        assert_eq!(
            ev(Dialect::Responses, 3),
            format!("event: response.failed\ndata: {{\"type\":\"response.failed\",\"sequence_number\":3,\"response\":{{\"id\":\"resp_mock\",\"object\":\"response\",\"status\":\"failed\",\"error\":{{\"code\":\"server_error\",\"message\":\"{msg}\"}},\"incomplete_details\":null,\"output\":[],\"usage\":null}}}}\n\n")
        );
        assert_eq!(
            ev(Dialect::Gemini, 0),
            format!("data: {{\"error\":{{\"code\":503,\"message\":\"{msg}\",\"status\":\"UNAVAILABLE\"}}}}\n\n")
        );
    }
}
