//! Errors: error bodies / mid-stream error events in each client dialect's own shape, and
//! what upstream error bodies and events say (message, status class, retry delay).
//!
//! Shapes (from the providers' documentation; rendered by `crate::error::ErrorShape::render`,
//! the one renderer, with each dialect's type names from its folder):
//! * OpenAI (Chat, Responses): `{"error":{"message","type","param","code"}}`
//! * Anthropic: `{"type":"error","error":{"type","message"}}`
//! * Gemini: `{"error":{"code","message","status"}}`
//!
//! Must not: perform IO, or allocate beyond the returned bytes.

use super::Dialect;
use crate::error::ErrorShape;
use serde_json::{json, Value};

/// An error response body for HTTP `status` in the client's dialect: its shape, with its type
/// names for that status (`crate::error::ErrorShape::render`, the one renderer).
pub fn error_body(client: Dialect, status: u16, message: &str) -> Vec<u8> {
    let w = client.wire();
    let (type_name, code) = ((w.error_type)(status), (w.error_code)(status));
    w.error_shape.render(status, type_name, code, None, message)
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
    match client.wire().error_shape {
        ErrorShape::OpenAi => message && e.get("type").is_some_and(Value::is_string),
        ErrorShape::Anthropic => {
            message
                && e.get("type").is_some_and(Value::is_string)
                && v.get("type").and_then(Value::as_str) == Some("error")
        }
        ErrorShape::Gemini => message && e.get("code").is_some_and(Value::is_number),
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
    let same = upstream.wire().error_shape == client.wire().error_shape;
    if same {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            if is_error_shape(client, &v) {
                return body.to_vec();
            }
        }
    }
    error_body(client, status, &extract_message(status, body))
}

/// The HTTP-status class of an in-stream error event of any dialect (its data as sent):
/// the error `type` / `code` / `status` names (Anthropic `overloaded_error` → 529,
/// `rate_limit_error` / `rate_limit_exceeded` / `RESOURCE_EXHAUSTED` → 429, …) or a numeric
/// `code`; 500 when it names none.
pub(crate) fn stream_error_status(data: &[u8]) -> u16 {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return 500;
    };
    let v = match &v {
        Value::Array(a) => a.first().unwrap_or(&Value::Null),
        other => other,
    };
    let e = v
        .get("error")
        .filter(|e| e.is_object())
        .or_else(|| v.get("response").and_then(|r| r.get("error")))
        .unwrap_or(v);
    if let Some(c) = e.get("code").and_then(Value::as_u64) {
        if (400..600).contains(&c) {
            return c as u16;
        }
    }
    let names = ["type", "code", "status"];
    for n in names
        .iter()
        .filter_map(|k| e.get(*k).and_then(Value::as_str))
    {
        let s = match n {
            "overloaded_error" => 529,
            "UNAVAILABLE" | "service_unavailable" => 503,
            "rate_limit_error"
            | "rate_limit_exceeded"
            | "RESOURCE_EXHAUSTED"
            | "insufficient_quota" => 429,
            "invalid_request_error" | "INVALID_ARGUMENT" => 400,
            "authentication_error" | "UNAUTHENTICATED" => 401,
            "permission_error" | "PERMISSION_DENIED" => 403,
            "not_found_error" | "NOT_FOUND" => 404,
            "request_too_large" => 413,
            "timeout_error" | "DEADLINE_EXCEEDED" => 504,
            _ => continue,
        };
        return s;
    }
    500
}

/// The HTTP status an upstream error answer gets in the client's dialect: the same status,
/// except where the two dialects name one condition differently — Anthropic's "overloaded"
/// is 529 (`overloaded_error`), OpenAI's and Gemini's is 503: an Anthropic upstream's 529
/// reaches OpenAI and Gemini clients as 503, an OpenAI or Gemini upstream's 503 reaches
/// Anthropic clients as 529. Same dialect: unchanged.
pub fn client_status(upstream: Dialect, client: Dialect, status: u16) -> u16 {
    match (
        upstream == Dialect::Messages,
        client == Dialect::Messages,
        status,
    ) {
        (true, false, 529) => 503,
        (false, true, 503) => 529,
        _ => status,
    }
}

/// Seconds to wait from an upstream error body that says so in the body only: Gemini's
/// `error.details[]` `RetryInfo.retryDelay` (`"27s"`, `"1.5s"`; rounded up). For a
/// `Retry-After` header when the upstream sent none.
pub fn retry_delay_secs(body: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let v = match &v {
        Value::Array(a) => a.first()?,
        other => other,
    };
    let details = v.get("error")?.get("details")?.as_array()?;
    details.iter().find_map(|d| {
        let t = d.get("retryDelay")?.as_str()?.strip_suffix('s')?;
        let secs: f64 = t.parse().ok()?;
        (secs.is_finite() && secs >= 0.0).then(|| secs.ceil() as u64)
    })
}

/// A dialect-correct mid-stream error event, appended to `out`:
/// Chat and Gemini get a `data:` line holding their error object, Anthropic
/// an `event: error`, Responses an `event: error` with `code`/`message`.
pub fn stream_error_event(client: Dialect, message: &str, out: &mut Vec<u8>) {
    stream_error_event_seq(client, 500, message, None, out);
}

/// [`stream_error_event`] for an error of HTTP-status class `status` (e.g. 529 → Anthropic
/// `overloaded_error`, 429 → `rate_limit_error`), with the Responses `sequence_number`.
pub(crate) fn stream_error_event_seq(
    client: Dialect,
    status: u16,
    message: &str,
    seq: Option<u64>,
    out: &mut Vec<u8>,
) {
    if client == Dialect::Responses {
        let code = super::responses::error_code(status);
        let mut v = json!({"type": "error", "code": code, "message": message, "param": null});
        if let (Some(n), Some(o)) = (seq, v.as_object_mut()) {
            o.insert("sequence_number".into(), n.into());
        }
        return super::sse::encode_json(Some("error"), &v, out);
    }
    let body = error_body(client, status, message);
    let data = std::str::from_utf8(&body).unwrap_or_default();
    super::sse::encode_event(client.wire().error_event, data, out);
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
        let to = |from, client, status, body: &[u8]| {
            parse(&upstream_error_to_client(from, client, status, body))
        };
        let o = to(Dialect::Messages, Dialect::Chat, 400, up);
        assert_eq!(o["error"]["message"], "max_tokens: too big");
        let g = br#"[{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}]"#;
        let a = to(Dialect::Gemini, Dialect::Messages, 429, g);
        assert_eq!(a["error"]["message"], "quota");
        assert_eq!(a["error"]["type"], "rate_limit_error");
        let raw = to(Dialect::Chat, Dialect::Gemini, 502, b"bad gateway");
        assert_eq!(raw["error"]["message"], "bad gateway");
        let empty = to(Dialect::Chat, Dialect::Chat, 503, b"");
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
    fn overloaded_is_529_for_anthropic_clients_503_for_the_others() {
        use Dialect::*;
        assert_eq!(client_status(Messages, Chat, 529), 503);
        assert_eq!(client_status(Messages, Responses, 529), 503);
        assert_eq!(client_status(Messages, Gemini, 529), 503);
        assert_eq!(client_status(Chat, Messages, 503), 529);
        assert_eq!(client_status(Gemini, Messages, 503), 529);
        assert_eq!(client_status(Messages, Messages, 529), 529);
        assert_eq!(client_status(Chat, Chat, 503), 503);
        for s in [400, 401, 403, 404, 413, 429, 500] {
            assert_eq!(client_status(Chat, Messages, s), s);
            assert_eq!(client_status(Messages, Chat, s), s);
        }
        let a = parse(&error_body(
            Messages,
            client_status(Chat, Messages, 503),
            "busy",
        ));
        assert_eq!(a["error"]["type"], "overloaded_error");
        let a = parse(&error_body(Messages, 413, "big"));
        assert_eq!(a["error"]["type"], "request_too_large");
    }

    #[test]
    fn stream_error_classes() {
        let an = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(stream_error_status(an), 529);
        let oa =
            br#"{"error":{"message":"slow down","type":"tokens","code":"rate_limit_exceeded"}}"#;
        assert_eq!(stream_error_status(oa), 429);
        let rf = br#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"x"}}}"#;
        assert_eq!(stream_error_status(rf), 500);
        let ge = br#"{"error":{"code":503,"message":"busy","status":"UNAVAILABLE"}}"#;
        assert_eq!(stream_error_status(ge), 503);
        assert_eq!(stream_error_status(b"nope"), 500);
        let mut out = Vec::new();
        stream_error_event_seq(Dialect::Responses, 429, "slow", Some(3), &mut out);
        assert!(String::from_utf8(out)
            .unwrap()
            .contains(r#""code":"rate_limit_exceeded""#));
    }

    #[test]
    fn gemini_retry_delay() {
        let g = br#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"26.2s"}]}}"#;
        assert_eq!(retry_delay_secs(g), Some(27));
        assert_eq!(
            retry_delay_secs(br#"[{"error":{"details":[{"retryDelay":"3s"}]}}]"#),
            Some(3)
        );
        assert_eq!(retry_delay_secs(br#"{"error":{"message":"x"}}"#), None);
        assert_eq!(retry_delay_secs(b"<html>"), None);
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
