//! The gateway's error type: every failure knows its HTTP status, which side caused it
//! (client, upstream, internal), whether retrying it on another connection may help, and how to
//! render itself in the client's dialect.
//!
//! Owns: `Error`, `Kind`, `Side`, and the OpenAI-, Anthropic- and Gemini-shaped error bodies.
//! Must not: do IO or log; callers decide what to do with an error.

use std::fmt;

/// Which party is at fault. Drives status codes, metrics labels and retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Upstream,
    Internal,
}

/// What went wrong, coarse enough to be a metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Malformed HTTP framing or head (400, connection closed).
    BadRequest,
    /// Well-framed request whose JSON body is unusable (400).
    InvalidBody,
    /// Refused by policy before admission: a foreign `Origin`, a non-loopback `Host` on a
    /// loopback listener (403).
    Forbidden,
    /// No valid virtual key: missing, unknown, expired or disabled (401).
    Unauthorized,
    /// The virtual key may not use the requested model (403).
    ModelNotAllowed,
    /// Unknown path (404).
    NotFound,
    /// Wrong method for a known path (405).
    MethodNotAllowed,
    /// The change conflicts with what exists (409): a name already taken, a key that comes
    /// from the config file (admin API).
    Conflict,
    /// Model name not routed (404).
    UnknownModel,
    /// Head too large (431) or body over the limit (413).
    HeadTooLarge,
    BodyTooLarge,
    /// Client too slow to send its head/body (408).
    ClientTimeout,
    /// Transfer-Encoding other than chunked (501).
    NotImplemented,
    /// Admission refused the request (503 + Retry-After).
    Overloaded,
    /// Every deployment's provider keys are cooling down after 429s (429 + Retry-After).
    RateLimited,
    /// The virtual key spent its budget for the period (429, OpenAI `insufficient_quota`,
    /// Anthropic `billing_error`).
    BudgetExceeded,
    /// The shared rate-limit store is unreachable and `on_store_error = "closed"` (503).
    LimitStoreDown,
    /// Could not connect to the upstream (502).
    UpstreamConnect,
    /// Upstream timed out (504): connect, the request not taken or no response head within the
    /// first-byte timeout, a body stalled past the gap timeout, the total deadline.
    UpstreamTimeout,
    /// Upstream spoke broken HTTP or closed early (502).
    UpstreamProtocol,
    /// Missing credentials or configuration problem discovered at request time (500).
    Internal,
    /// A `block` guardrail matched the request's text or a non-stream answer (400,
    /// `guardrail_blocked`; the message names the guardrail and the detector type only).
    GuardrailBlocked,
}

/// A dialect's family (OpenAI: Chat and Responses; Anthropic; Google: Gemini): the shape its
/// error bodies are rendered in and the naming of its headers (`upstream::headers`). Each
/// dialect's is in its wire table (`Wire::error_shape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    OpenAi,
    Anthropic,
    /// Google's `{"error":{"code","message","status"}}` (Gemini-dialect paths).
    Gemini,
}

#[derive(Debug, Clone)]
pub struct Error {
    pub kind: Kind,
    pub message: String,
    /// True when a retry on a fresh connection may succeed (nothing reached the client yet).
    pub retryable: bool,
    /// Set on upstream failures shown to a client (`rg-<shard>-<n>`, also in the log line with
    /// the details); sent as `x-request-id` on error responses.
    pub request_id: Option<Box<str>>,
    /// For upstream failures before a valid response head: how the attempt failed (drives
    /// the routing layer's retry decision).
    pub cause: Option<Cause>,
    /// Seconds for the `Retry-After` header of this error's response (503s default to 1).
    pub retry_after: Option<u32>,
    /// The request field at fault (OpenAI `error.param`), when one is.
    pub param: Option<Box<str>>,
}

/// How an upstream attempt failed before a valid response head arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Resolving or connecting failed (refused, unreachable, TLS handshake).
    Connect,
    /// Connecting took longer than `connect_timeout_ms`.
    ConnectTimeout,
    /// The connection broke, closed or spoke garbage before a valid response head.
    Reset,
    /// No response head within the first-byte timeout, or a request write the upstream did not
    /// take within it (it accepted the connection and stopped reading).
    FirstByteTimeout,
}

impl Error {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            retryable: false,
            request_id: None,
            cause: None,
            retry_after: None,
            param: None,
        }
    }

    /// Name the request field at fault (OpenAI `error.param`).
    pub fn with_param(mut self, param: impl Into<Box<str>>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Answer with `Retry-After: secs`.
    pub fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// The `Retry-After` seconds this error's response carries, if any.
    pub fn retry_after_secs(&self) -> Option<u32> {
        self.retry_after
            .or((self.kind == Kind::Overloaded).then_some(1))
    }

    /// Tag an upstream failure with how it happened.
    pub fn caused(mut self, cause: Cause) -> Self {
        self.cause = Some(cause);
        self
    }

    /// The same failure as the client may see it: upstream-side errors lose their details
    /// (hosts, addresses, resolver and TLS output, which stay in the log under `request_id`)
    /// for a generic message carrying the id. Other errors only gain the id.
    pub fn for_client(&self, request_id: &str) -> Error {
        let generic = match self.kind {
            Kind::UpstreamConnect => Some("the gateway could not reach the upstream provider"),
            Kind::UpstreamTimeout => Some("the upstream provider did not answer in time"),
            Kind::UpstreamProtocol => {
                Some("the upstream provider sent an invalid or incomplete response")
            }
            _ => None,
        };
        let message = match generic {
            Some(g) => format!("{g} (request id {request_id})"),
            None => format!("{} (request id {request_id})", self.message),
        };
        Error {
            kind: self.kind,
            message,
            retryable: self.retryable,
            request_id: Some(request_id.into()),
            cause: self.cause,
            retry_after: self.retry_after,
            param: self.param.clone(),
        }
    }

    /// Admission refused the request (or its buffers' growth): 503 + Retry-After.
    pub fn overloaded(reason: &str) -> Self {
        Error::new(
            Kind::Overloaded,
            format!("the gateway is at capacity ({reason}); retry later"),
        )
    }

    pub fn retryable(mut self) -> Self {
        self.retryable = true;
        self
    }

    pub fn status(&self) -> u16 {
        match self.kind {
            Kind::BadRequest | Kind::InvalidBody | Kind::GuardrailBlocked => 400,
            Kind::Unauthorized => 401,
            Kind::Forbidden | Kind::ModelNotAllowed => 403,
            Kind::NotFound | Kind::UnknownModel => 404,
            Kind::MethodNotAllowed => 405,
            Kind::Conflict => 409,
            Kind::ClientTimeout => 408,
            Kind::BodyTooLarge => 413,
            Kind::HeadTooLarge => 431,
            Kind::NotImplemented => 501,
            Kind::UpstreamConnect | Kind::UpstreamProtocol => 502,
            Kind::Overloaded | Kind::LimitStoreDown => 503,
            Kind::RateLimited | Kind::BudgetExceeded => 429,
            Kind::UpstreamTimeout => 504,
            Kind::Internal => 500,
        }
    }

    pub fn side(&self) -> Side {
        match self.kind {
            Kind::BadRequest
            | Kind::InvalidBody
            | Kind::Forbidden
            | Kind::Unauthorized
            | Kind::ModelNotAllowed
            | Kind::NotFound
            | Kind::MethodNotAllowed
            | Kind::Conflict
            | Kind::UnknownModel
            | Kind::HeadTooLarge
            | Kind::BodyTooLarge
            | Kind::ClientTimeout
            | Kind::NotImplemented
            | Kind::GuardrailBlocked => Side::Client,
            Kind::UpstreamConnect | Kind::UpstreamTimeout | Kind::UpstreamProtocol => {
                Side::Upstream
            }
            Kind::Overloaded
            | Kind::RateLimited
            | Kind::BudgetExceeded
            | Kind::LimitStoreDown
            | Kind::Internal => Side::Internal,
        }
    }

    /// The connection must be closed after answering: framing can no longer be trusted.
    pub fn closes_connection(&self) -> bool {
        matches!(
            self.kind,
            Kind::BadRequest
                | Kind::HeadTooLarge
                | Kind::BodyTooLarge
                | Kind::ClientTimeout
                | Kind::NotImplemented
        )
    }

    /// OpenAI `error.type` / Anthropic `error.type`.
    fn type_str(&self, shape: ErrorShape) -> &'static str {
        match (shape, self.kind) {
            (ErrorShape::OpenAi, Kind::Overloaded) => "server_error",
            (ErrorShape::OpenAi, Kind::RateLimited) => "rate_limit_error",
            (ErrorShape::OpenAi, Kind::BudgetExceeded) => "insufficient_quota",
            (ErrorShape::OpenAi, k) if self.side() == Side::Client => match k {
                Kind::NotFound | Kind::UnknownModel => "not_found_error",
                _ => "invalid_request_error",
            },
            (ErrorShape::OpenAi, _) => {
                if self.side() == Side::Upstream {
                    "upstream_error"
                } else {
                    "server_error"
                }
            }
            (ErrorShape::Anthropic, Kind::Overloaded) => "overloaded_error",
            (ErrorShape::Anthropic, Kind::RateLimited) => "rate_limit_error",
            (ErrorShape::Anthropic, Kind::BudgetExceeded) => "billing_error",
            (ErrorShape::Anthropic, Kind::NotFound | Kind::UnknownModel) => "not_found_error",
            (ErrorShape::Anthropic, Kind::BodyTooLarge) => "request_too_large",
            (ErrorShape::Anthropic, Kind::Forbidden | Kind::ModelNotAllowed) => "permission_error",
            (ErrorShape::Anthropic, Kind::Unauthorized) => "authentication_error",
            (ErrorShape::Anthropic, _) if self.side() == Side::Client => "invalid_request_error",
            (ErrorShape::Anthropic, Kind::UpstreamTimeout) => "timeout_error",
            (ErrorShape::Anthropic, _) => "api_error",
            (ErrorShape::Gemini, _) => self.grpc_status(),
        }
    }

    /// Google's canonical status name for this error (Gemini `error.status`).
    fn grpc_status(&self) -> &'static str {
        match self.kind {
            Kind::Unauthorized => "UNAUTHENTICATED",
            Kind::Forbidden | Kind::ModelNotAllowed => "PERMISSION_DENIED",
            Kind::NotFound | Kind::UnknownModel => "NOT_FOUND",
            Kind::MethodNotAllowed | Kind::NotImplemented => "UNIMPLEMENTED",
            Kind::ClientTimeout | Kind::UpstreamTimeout => "DEADLINE_EXCEEDED",
            Kind::RateLimited | Kind::BudgetExceeded => "RESOURCE_EXHAUSTED",
            Kind::Overloaded
            | Kind::LimitStoreDown
            | Kind::UpstreamConnect
            | Kind::UpstreamProtocol => "UNAVAILABLE",
            Kind::Internal => "INTERNAL",
            Kind::Conflict => "ALREADY_EXISTS",
            Kind::BadRequest
            | Kind::InvalidBody
            | Kind::HeadTooLarge
            | Kind::BodyTooLarge
            | Kind::GuardrailBlocked => "INVALID_ARGUMENT",
        }
    }

    /// OpenAI `error.code`: a stable machine-readable string.
    pub fn code(&self) -> &'static str {
        match self.kind {
            Kind::BadRequest => "bad_request",
            Kind::InvalidBody => "invalid_body",
            Kind::Forbidden => "forbidden",
            Kind::Unauthorized => "invalid_api_key",
            Kind::ModelNotAllowed => "model_not_allowed",
            Kind::NotFound => "not_found",
            Kind::MethodNotAllowed => "method_not_allowed",
            Kind::Conflict => "conflict",
            Kind::UnknownModel => "model_not_found",
            Kind::HeadTooLarge => "head_too_large",
            Kind::BodyTooLarge => "body_too_large",
            Kind::ClientTimeout => "client_timeout",
            Kind::NotImplemented => "not_implemented",
            Kind::Overloaded => "overloaded",
            Kind::RateLimited => "rate_limited",
            Kind::BudgetExceeded => "insufficient_quota",
            Kind::LimitStoreDown => "limit_store_unavailable",
            Kind::UpstreamConnect => "upstream_connect_error",
            Kind::UpstreamTimeout => "upstream_timeout",
            Kind::UpstreamProtocol => "upstream_protocol_error",
            Kind::Internal => "internal_error",
            Kind::GuardrailBlocked => "guardrail_blocked",
        }
    }

    /// Render the JSON error body in the client's dialect.
    pub fn body(&self, shape: ErrorShape) -> Vec<u8> {
        let (code, param) = (Some(self.code()), self.param.as_deref());
        shape.render(
            self.status(),
            self.type_str(shape),
            code,
            param,
            &self.message,
        )
    }
}

impl ErrorShape {
    /// The one error-body renderer: OpenAI `{"error":{"message","type","param","code"}}`,
    /// Anthropic `{"type":"error","error":{"type","message"}}`, Google
    /// `{"error":{"code":status,"message","status":type_name}}`. `code` and `param` are OpenAI's
    /// (`null` when `None`).
    pub fn render(
        self,
        status: u16,
        type_name: &str,
        code: Option<&str>,
        param: Option<&str>,
        message: &str,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + message.len());
        // `lit` then `v` as a JSON string (`null` when `None`)
        let mut put = |lit: &[u8], v: Option<&str>| {
            out.extend_from_slice(lit);
            match v {
                Some(v) => push_json_str(&mut out, v),
                None => out.extend_from_slice(b"null"),
            }
        };
        match self {
            ErrorShape::OpenAi => {
                put(b"{\"error\":{\"message\":", Some(message));
                put(b",\"type\":", Some(type_name));
                put(b",\"param\":", param);
                put(b",\"code\":", code);
            }
            ErrorShape::Anthropic => {
                put(b"{\"type\":\"error\",\"error\":{\"type\":", Some(type_name));
                put(b",\"message\":", Some(message));
            }
            ErrorShape::Gemini => {
                let code = format!("{{\"error\":{{\"code\":{status},\"message\":");
                put(code.as_bytes(), Some(message));
                put(b",\"status\":", Some(type_name));
            }
        }
        out.extend_from_slice(b"}}");
        out
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code(), self.status(), self.message)
    }
}

impl std::error::Error for Error {}

/// Append `s` as a JSON string literal (with quotes), escaping as RFC 8259 requires (and DEL,
/// as `\u007f`). A string with nothing to escape is copied whole.
pub fn push_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    if !bytes
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f)
    {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    for &b in bytes {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0..=0x1f | 0x7f => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_bodies_byte_for_byte() {
        let r = |shape: ErrorShape, code, param| {
            String::from_utf8(shape.render(429, "rate_limit_error", code, param, "a \"b\""))
        };
        assert_eq!(
            r(ErrorShape::OpenAi, Some("c"), None).as_deref(),
            Ok(
                r#"{"error":{"message":"a \"b\"","type":"rate_limit_error","param":null,"code":"c"}}"#
            )
        );
        assert_eq!(
            r(ErrorShape::OpenAi, None, Some("p")).as_deref(),
            Ok(
                r#"{"error":{"message":"a \"b\"","type":"rate_limit_error","param":"p","code":null}}"#
            )
        );
        assert_eq!(
            r(ErrorShape::Anthropic, Some("c"), Some("p")).as_deref(),
            Ok(r#"{"type":"error","error":{"type":"rate_limit_error","message":"a \"b\""}}"#)
        );
        assert_eq!(
            r(ErrorShape::Gemini, Some("c"), Some("p")).as_deref(),
            Ok(r#"{"error":{"code":429,"message":"a \"b\"","status":"rate_limit_error"}}"#)
        );
    }

    #[test]
    fn openai_shape_is_valid_json_with_fields() {
        let e = Error::new(Kind::UnknownModel, "model \"x\"\n not found");
        let v: serde_json::Value = serde_json::from_slice(&e.body(ErrorShape::OpenAi)).unwrap();
        assert_eq!(v["error"]["message"], "model \"x\"\n not found");
        assert_eq!(v["error"]["type"], "not_found_error");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(e.status(), 404);
        assert_eq!(e.side(), Side::Client);
    }

    #[test]
    fn anthropic_shape() {
        let e = Error::new(Kind::Overloaded, "busy");
        let v: serde_json::Value = serde_json::from_slice(&e.body(ErrorShape::Anthropic)).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "overloaded_error");
        assert_eq!(e.status(), 503);
    }

    #[test]
    fn gemini_shape() {
        for (kind, status, name) in [
            (Kind::InvalidBody, 400, "INVALID_ARGUMENT"),
            (Kind::Unauthorized, 401, "UNAUTHENTICATED"),
            (Kind::ModelNotAllowed, 403, "PERMISSION_DENIED"),
            (Kind::UnknownModel, 404, "NOT_FOUND"),
            (Kind::RateLimited, 429, "RESOURCE_EXHAUSTED"),
            (Kind::Overloaded, 503, "UNAVAILABLE"),
            (Kind::UpstreamTimeout, 504, "DEADLINE_EXCEEDED"),
            (Kind::Internal, 500, "INTERNAL"),
        ] {
            let e = Error::new(kind, "m \"q\"");
            let v: serde_json::Value = serde_json::from_slice(&e.body(ErrorShape::Gemini)).unwrap();
            assert_eq!(v["error"]["code"], status, "{kind:?}");
            assert_eq!(v["error"]["status"], name, "{kind:?}");
            assert_eq!(v["error"]["message"], "m \"q\"");
            assert!(crate::dialect::is_error_shape(
                crate::dialect::Dialect::Gemini,
                &v
            ));
        }
    }

    #[test]
    fn client_view_of_an_upstream_failure_is_generic() {
        let e = Error::new(Kind::UpstreamConnect, "connect api.internal:8443: refused");
        let c = e.for_client("rg-0-7");
        assert_eq!(c.status(), 502);
        assert!(!c.message.contains("api.internal") && !c.message.contains("8443"));
        assert!(c.message.contains("rg-0-7"));
        assert_eq!(c.request_id.as_deref(), Some("rg-0-7"));
    }

    #[test]
    fn key_errors_in_both_dialects() {
        // (kind, status, OpenAI `type` and `code` when checked, Anthropic `type`)
        let cases = [
            (
                Kind::Unauthorized,
                401,
                Some(("invalid_request_error", "invalid_api_key")),
                "authentication_error",
            ),
            (Kind::ModelNotAllowed, 403, None, "permission_error"),
            (
                Kind::BudgetExceeded,
                429,
                Some(("insufficient_quota", "insufficient_quota")),
                "billing_error",
            ),
        ];
        for (kind, status, openai, anthropic) in cases {
            let e = Error::new(kind, "no");
            assert_eq!(e.status(), status, "{kind:?}");
            let error_of = |shape| {
                let v: serde_json::Value = serde_json::from_slice(&e.body(shape)).unwrap();
                v["error"].clone()
            };
            if let Some((ty, code)) = openai {
                let o = error_of(ErrorShape::OpenAi);
                assert_eq!(
                    (o["type"].as_str(), o["code"].as_str()),
                    (Some(ty), Some(code))
                );
            }
            assert_eq!(
                error_of(ErrorShape::Anthropic)["type"],
                anthropic,
                "{kind:?}"
            );
        }
        assert!(!Error::new(Kind::ModelNotAllowed, "not yours").closes_connection());
    }

    #[test]
    fn control_chars_escaped() {
        let mut out = Vec::new();
        push_json_str(&mut out, "a\u{1}b");
        assert_eq!(out, b"\"a\\u0001b\"");
    }
}
