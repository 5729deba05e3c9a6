//! Request-head parsing on httparse. The head stays in the connection's read buffer; a parsed
//! `RequestHead` holds byte ranges into that buffer (zero-copy), plus the few facts the pipeline
//! needs (method, framing, keep-alive, auth headers).
//!
//! Owns: RFC 9112 request framing decisions (CL/TE conflicts, duplicate or invalid
//! Content-Length, unsupported Transfer-Encoding, obs-fold, missing Host, bare LF line ends,
//! absolute-form targets split into authority and path) and head limits; it also notes where `Host`, `Origin` and the CORS preflight headers are,
//! for `edge` to judge, where the API-key headers each SDK sends are (`Authorization`,
//! `x-api-key`, `api-key`, `x-goog-api-key`), for `governance`, `x-request-id`, and where the
//! few other client headers an upstream may be sent are (`Passed`), for `upstream::headers` to
//! judge — ranges only, no copy.
//! Must not: read from sockets or look at the body.

use std::ops::Range;

use crate::error::{Error, Kind};

/// Hard ceiling on header count regardless of configuration (stack array size).
pub const MAX_HEADERS_CAP: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Head,
    Options,
    /// The admin API's updates and revocations.
    Patch,
    Delete,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// Client request headers the header policy (`upstream::headers`) may forward upstream; every
/// other client header is never forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passed {
    AnthropicVersion,
    AnthropicBeta,
    OpenAiOrganization,
    OpenAiProject,
    IdempotencyKey,
}

impl Passed {
    /// The header name as sent upstream.
    pub fn name(self) -> &'static str {
        match self {
            Passed::AnthropicVersion => "anthropic-version",
            Passed::AnthropicBeta => "anthropic-beta",
            Passed::OpenAiOrganization => "openai-organization",
            Passed::OpenAiProject => "openai-project",
            Passed::IdempotencyKey => "idempotency-key",
        }
    }
}

#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: Method,
    /// Request target, as a range into the read buffer (path + query). For an absolute-form
    /// target (`http://host/path?q`, RFC 9112 §3.2.2) only its path and query.
    pub target: Range<usize>,
    /// Bytes taken by the head, including the final CRLF CRLF.
    pub len: usize,
    pub body: BodyFraming,
    pub keep_alive: bool,
    pub expect_continue: bool,
    /// `Authorization` value (OpenAI SDKs: `Bearer <key>`).
    pub authorization: Option<Range<usize>>,
    /// `x-api-key` value (Anthropic SDKs).
    pub x_api_key: Option<Range<usize>>,
    /// `api-key` value (Azure OpenAI SDKs).
    pub api_key: Option<Range<usize>>,
    /// `x-goog-api-key` value (Gemini SDKs).
    pub x_goog_api_key: Option<Range<usize>>,
    /// One of the four key headers above came more than once (the first one is recorded).
    pub dup_credential: bool,
    pub anthropic_version: Option<Range<usize>>,
    /// `Host` value (checked against loopback names on a loopback listener).
    pub host: Option<Range<usize>>,
    /// The authority of an absolute-form target (`host[:port]`, no userinfo). It names the
    /// host instead of `Host` (RFC 9112 §3.2.2); the edge checks both.
    pub authority: Option<Range<usize>>,
    /// `Origin` value: present on browser-borne requests (checked against the CORS allow-list).
    pub origin: Option<Range<usize>>,
    /// `Access-Control-Request-Method` was sent: with `OPTIONS`, a CORS preflight.
    pub ac_request_method: bool,
    /// `Access-Control-Request-Headers` value (echoed by an allowed preflight).
    pub ac_request_headers: Option<Range<usize>>,
    /// `x-request-id` value (kept as the request's id when acceptable, see `request_id`).
    pub x_request_id: Option<Range<usize>>,
    /// `Cache-Control` value (`no-cache` / `no-store` steer the response cache).
    pub cache_control: Option<Range<usize>>,
    /// `x-ringgate-cache` value (`refresh`: answer from upstream, store the new answer).
    pub x_ringgate_cache: Option<Range<usize>>,
    /// W3C trace context (read only while `[telemetry]` is on).
    pub traceparent: Option<Range<usize>>,
    pub tracestate: Option<Range<usize>>,
    /// Where the `Passed` headers are, every occurrence in order (usually none).
    pub passed: smallvec::SmallVec<[(Passed, Range<usize>); 2]>,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Head => "HEAD",
            Method::Options => "OPTIONS",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
            Method::Other => "_OTHER",
        }
    }
}

impl RequestHead {
    /// The path without the query string.
    pub fn path<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        let t = buf.get(self.target.clone()).unwrap_or_default();
        match memchr::memchr(b'?', t) {
            Some(i) => &t[..i],
            None => t,
        }
    }

    /// The query string without the `?`, if any.
    pub fn query<'b>(&self, buf: &'b [u8]) -> Option<&'b [u8]> {
        let t = buf.get(self.target.clone())?;
        memchr::memchr(b'?', t).map(|i| &t[i + 1..])
    }

    pub fn header<'b>(&self, buf: &'b [u8], r: &Option<Range<usize>>) -> Option<&'b [u8]> {
        r.as_ref().and_then(|r| buf.get(r.clone()))
    }
}

/// Parse a head from the start of `buf`. `Ok(None)` means "need more bytes".
pub fn parse(
    buf: &[u8],
    max_head: usize,
    max_headers: usize,
) -> Result<Option<RequestHead>, Error> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS_CAP];
    let n = max_headers.clamp(1, MAX_HEADERS_CAP);
    let mut req = httparse::Request::new(&mut storage[..n]);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            if buf.len() >= max_head {
                return Err(Error::new(Kind::HeadTooLarge, "request head too large"));
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Error::new(Kind::HeadTooLarge, "too many request headers"));
        }
        Err(e) => {
            return Err(Error::new(
                Kind::BadRequest,
                format!("malformed request head: {e}"),
            ));
        }
    };
    if len > max_head {
        return Err(Error::new(Kind::HeadTooLarge, "request head too large"));
    }
    let method = match req.method {
        Some("GET") => Method::Get,
        Some("POST") => Method::Post,
        Some("HEAD") => Method::Head,
        Some("OPTIONS") => Method::Options,
        Some("PATCH") => Method::Patch,
        Some("DELETE") => Method::Delete,
        _ => Method::Other,
    };
    let version = req.version.unwrap_or(1);
    let (target, authority) = split_target(req.path.unwrap_or("").as_bytes())?;
    let (target, authority) = (range_of(buf, target), authority.map(|a| range_of(buf, a)));

    // RFC 9112 §2.2: a recipient MAY accept a bare LF as a line terminator. httparse does; a
    // gateway in front of other HTTP servers must not (a server that disagrees on where a line
    // ends is a request-smuggling vector), so every LF of the head must follow a CR. One memchr
    // pass over the head: a few ns per header line.
    let head_bytes = buf.get(..len).unwrap_or_default();
    for i in memchr::memchr_iter(b'\n', head_bytes) {
        if i == 0 || head_bytes[i - 1] != b'\r' {
            return Err(Error::new(
                Kind::BadRequest,
                "bare LF in the request head (lines must end in CRLF)",
            ));
        }
    }

    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut te_seen = false;
    let mut host_count = 0usize;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut expect_continue = false;
    let mut authorization = None;
    let mut x_api_key = None;
    let mut api_key = None;
    let mut x_goog_api_key = None;
    let mut dup_credential = false;
    // The first occurrence of a key header is kept; a repeat is flagged (an error when keys
    // are checked: two keys in one request is ambiguous).
    let mut first = |slot: &mut Option<Range<usize>>, value: &[u8]| {
        if slot.is_some() {
            dup_credential = true;
        } else {
            *slot = Some(range_of(buf, value));
        }
    };
    let mut anthropic_version = None;
    let mut host = None;
    let mut origin = None;
    let mut ac_request_method = false;
    let mut ac_request_headers = None;
    let mut x_request_id = None;
    let mut cache_control = None;
    let mut x_ringgate_cache = None;
    let mut traceparent = None;
    let mut tracestate = None;
    let mut passed = smallvec::SmallVec::new();

    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let value = h.value;
        if memchr::memchr2(b'\r', b'\n', value).is_some() {
            return Err(Error::new(
                Kind::BadRequest,
                "obsolete line folding is not allowed",
            ));
        }
        // Dispatch on the name's length first: most headers cost one integer compare.
        let is = |want: &[u8]| name.eq_ignore_ascii_case(want);
        match name.len() {
            4 if is(b"host") => {
                host_count += 1;
                host = Some(range_of(buf, value));
            }
            6 if is(b"origin") => {
                if origin.is_some() {
                    return Err(Error::new(Kind::BadRequest, "duplicate Origin"));
                }
                origin = Some(range_of(buf, value));
            }
            6 if is(b"expect") && trim(value).eq_ignore_ascii_case(b"100-continue") => {
                expect_continue = true;
            }
            7 if is(b"api-key") => first(&mut api_key, value),
            9 if is(b"x-api-key") => first(&mut x_api_key, value),
            10 if is(b"connection") => {
                for tok in value.split(|&b| b == b',') {
                    let tok = trim(tok);
                    if tok.eq_ignore_ascii_case(b"close") {
                        conn_close = true;
                    } else if tok.eq_ignore_ascii_case(b"keep-alive") {
                        conn_keep_alive = true;
                    }
                }
            }
            12 if is(b"x-request-id") => x_request_id = Some(range_of(buf, value)),
            13 if is(b"authorization") => first(&mut authorization, value),
            13 if is(b"cache-control") => cache_control = Some(range_of(buf, value)),
            16 if is(b"x-ringgate-cache") => x_ringgate_cache = Some(range_of(buf, value)),
            11 if is(b"traceparent") => traceparent = Some(range_of(buf, value)),
            10 if is(b"tracestate") => tracestate = Some(range_of(buf, value)),
            14 if is(b"content-length") => {
                if content_length.is_some() {
                    return Err(Error::new(Kind::BadRequest, "duplicate Content-Length"));
                }
                content_length = Some(parse_content_length(value)?);
            }
            14 if is(b"x-goog-api-key") => first(&mut x_goog_api_key, value),
            14 if is(b"anthropic-beta") => {
                passed.push((Passed::AnthropicBeta, range_of(buf, value)))
            }
            14 if is(b"openai-project") => {
                passed.push((Passed::OpenAiProject, range_of(buf, value)))
            }
            15 if is(b"idempotency-key") => {
                passed.push((Passed::IdempotencyKey, range_of(buf, value)))
            }
            19 if is(b"openai-organization") => {
                passed.push((Passed::OpenAiOrganization, range_of(buf, value)))
            }
            17 if is(b"transfer-encoding") => {
                if te_seen {
                    return Err(Error::new(Kind::BadRequest, "duplicate Transfer-Encoding"));
                }
                te_seen = true;
                if trim(value).eq_ignore_ascii_case(b"chunked") {
                    chunked = true;
                } else {
                    return Err(Error::new(
                        Kind::NotImplemented,
                        "only Transfer-Encoding: chunked is supported",
                    ));
                }
            }
            17 if is(b"anthropic-version") => {
                anthropic_version = Some(range_of(buf, value));
                passed.push((Passed::AnthropicVersion, range_of(buf, value)));
            }
            29 if is(b"access-control-request-method") => ac_request_method = true,
            30 if is(b"access-control-request-headers") => {
                ac_request_headers = Some(range_of(buf, value));
            }
            _ => {}
        }
    }

    if te_seen && content_length.is_some() {
        return Err(Error::new(
            Kind::BadRequest,
            "Content-Length and Transfer-Encoding must not both be present",
        ));
    }
    if te_seen && version == 0 {
        return Err(Error::new(
            Kind::BadRequest,
            "Transfer-Encoding in an HTTP/1.0 request",
        ));
    }
    if version == 1 && host_count != 1 {
        return Err(Error::new(
            Kind::BadRequest,
            "HTTP/1.1 requests need exactly one Host header",
        ));
    }
    let body = if chunked {
        BodyFraming::Chunked
    } else {
        match content_length {
            Some(0) | None => BodyFraming::None,
            Some(n) => BodyFraming::Length(n),
        }
    };
    let keep_alive = if version == 0 {
        conn_keep_alive && !conn_close
    } else {
        !conn_close
    };
    Ok(Some(RequestHead {
        method,
        target,
        len,
        body,
        keep_alive,
        expect_continue,
        authorization,
        x_api_key,
        api_key,
        x_goog_api_key,
        dup_credential,
        anthropic_version,
        host,
        authority,
        origin,
        ac_request_method,
        ac_request_headers,
        x_request_id,
        cache_control,
        x_ringgate_cache,
        traceparent,
        tracestate,
        passed,
    }))
}

/// An absolute-form target (`http://` or `https://`, any case) → (its path and query, its
/// authority); any other target is returned whole. RFC 9112 §3.2.2: a server MUST accept the
/// absolute form. An empty host (RFC 9110 §4.2.1) or a userinfo part (`user@host`, which would
/// let a name that is not the host lead the authority) is a 400.
fn split_target(t: &[u8]) -> Result<(&[u8], Option<&[u8]>), Error> {
    let scheme = if t.len() >= 7 && t[..7].eq_ignore_ascii_case(b"http://") {
        7
    } else if t.len() >= 8 && t[..8].eq_ignore_ascii_case(b"https://") {
        8
    } else {
        return Ok((t, None));
    };
    let rest = &t[scheme..];
    let end = rest
        .iter()
        .position(|&b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains(&b'@') {
        return Err(Error::new(
            Kind::BadRequest,
            "an absolute-form request target needs a host and no userinfo",
        ));
    }
    Ok((path, Some(authority)))
}

/// Strict Content-Length: 1*DIGIT, no sign, no list, at most 19 digits.
pub fn parse_content_length(v: &[u8]) -> Result<u64, Error> {
    let v = trim(v);
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return Err(Error::new(Kind::BadRequest, "invalid Content-Length"));
    }
    Ok(v.iter()
        .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0')))
}

pub fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// Position of `part` (a sub-slice of `buf`) as a range of `buf`.
fn range_of(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = (part.as_ptr() as usize).saturating_sub(buf.as_ptr() as usize);
    start..start + part.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Option<RequestHead>, Error> {
        parse(s.as_bytes(), 16 * 1024, 64)
    }

    #[test]
    fn framing_table() {
        // (request, expected Ok framing or Err status)
        let cases: &[(&str, Result<BodyFraming, u16>)] = &[
            ("GET / HTTP/1.1\r\nHost: a\r\n\r\n", Ok(BodyFraming::None)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n", Ok(BodyFraming::Length(5))),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", Ok(BodyFraming::None)),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", Ok(BodyFraming::Chunked)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", Err(501)),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", Err(501)),
            ("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", Err(400)),
            ("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", Err(400)),
            ("GET / HTTP/1.1\r\n\r\n", Err(400)),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", Err(400)),
            ("GET / HTTP/1.1\r\nHost: a\r\nX-Long: a\r\n b\r\n\r\n", Err(400)),
            ("GET / HTTP/1.1\r\nHo st: a\r\n\r\n", Err(400)),
            ("GARBAGE\r\n\r\n", Err(400)),
        ];
        for (req, want) in cases {
            let got = p(req).map(|h| h.map(|h| h.body));
            match (got, want) {
                (Ok(Some(f)), Ok(w)) => assert_eq!(f, *w, "{req:?}"),
                (Err(e), Err(s)) => assert_eq!(e.status(), *s, "{req:?}: {e}"),
                (g, w) => panic!("{req:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn bare_lf_rejected() {
        let cases = [
            "GET / HTTP/1.1\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n\n",
            "GET / HTTP/1.1\nHost: a\n\n",
            "\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nX: 1\nContent-Length: 5\r\n\r\n",
        ];
        for req in cases {
            match p(req) {
                Err(e) => assert_eq!(e.status(), 400, "{req:?}: {e}"),
                other => panic!("{req:?}: accepted: {other:?}"),
            }
        }
        // CRLF throughout (with the leading empty line RFC 9112 §2.2 allows) is fine.
        assert!(p("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap()
            .is_some());
    }

    #[test]
    fn origin_host_and_preflight_fields() {
        let raw = b"OPTIONS /v1/messages HTTP/1.1\r\nHost: localhost:8080\r\nOrigin: https://a.example\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: x-api-key\r\n\r\n";
        let h = parse(raw, 4096, 64).unwrap().unwrap();
        assert_eq!(h.method, Method::Options);
        assert_eq!(h.header(raw, &h.host), Some(&b"localhost:8080"[..]));
        assert_eq!(h.header(raw, &h.origin), Some(&b"https://a.example"[..]));
        assert!(h.ac_request_method);
        assert_eq!(
            h.header(raw, &h.ac_request_headers),
            Some(&b"x-api-key"[..])
        );
        let dup = "GET / HTTP/1.1\r\nHost: a\r\nOrigin: https://a\r\nOrigin: https://b\r\n\r\n";
        assert_eq!(p(dup).unwrap_err().status(), 400);
    }

    #[test]
    fn partial_and_limits() {
        assert!(p("GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none());
        let big = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
            "a".repeat(200)
        );
        assert_eq!(parse(big.as_bytes(), 64, 64).unwrap_err().status(), 431);
        let partial_big = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(200));
        assert_eq!(
            parse(partial_big.as_bytes(), 64, 64).unwrap_err().status(),
            431
        );
        let many: String = (0..10).map(|i| format!("X{i}: v\r\n")).collect();
        let req = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        assert_eq!(parse(req.as_bytes(), 4096, 5).unwrap_err().status(), 431);
    }

    #[test]
    fn zero_copy_fields() {
        let raw = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k\r\nx-api-key: sk\r\nConnection: close\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}";
        let h = parse(raw, 4096, 64).unwrap().unwrap();
        assert_eq!(h.path(raw), b"/v1/chat/completions");
        assert_eq!(h.query(raw), Some(&b"x=1"[..]));
        assert_eq!(h.header(raw, &h.authorization), Some(&b"Bearer k"[..]));
        assert_eq!(h.header(raw, &h.x_api_key), Some(&b"sk"[..]));
        assert!(!h.keep_alive);
        assert!(h.expect_continue);
        assert_eq!(&raw[h.len..], b"{}");
    }

    #[test]
    fn api_key_headers_of_every_sdk() {
        let raw = b"POST / HTTP/1.1\r\nHost: a\r\nApi-Key: az\r\nX-Goog-Api-Key: gm\r\nx-api-key: an\r\n\r\n";
        let h = parse(raw, 4096, 64).unwrap().unwrap();
        assert_eq!(h.header(raw, &h.api_key), Some(&b"az"[..]));
        assert_eq!(h.header(raw, &h.x_goog_api_key), Some(&b"gm"[..]));
        assert_eq!(h.header(raw, &h.x_api_key), Some(&b"an"[..]));
        assert!(h.authorization.is_none() && !h.dup_credential);
        let raw = b"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer one\r\nAuthorization: Bearer two\r\n\r\n";
        let h = parse(raw, 4096, 64).unwrap().unwrap();
        assert_eq!(h.header(raw, &h.authorization), Some(&b"Bearer one"[..]));
        assert!(h.dup_credential);
    }

    #[test]
    fn passed_headers_are_noted_in_order() {
        let raw = b"POST / HTTP/1.1\r\nHost: a\r\nAnthropic-Beta: b1\r\nX-Request-Id: r\r\nanthropic-beta: b2\r\nOpenAI-Organization: o\r\nOpenAI-Project: p\r\nIdempotency-Key: i\r\nanthropic-version: v\r\nCookie: c\r\n\r\n";
        let h = parse(raw, 4096, 64).unwrap().unwrap();
        let got: Vec<(Passed, &[u8])> = h
            .passed
            .iter()
            .map(|(p, r)| (*p, &raw[r.clone()]))
            .collect();
        assert_eq!(
            got,
            [
                (Passed::AnthropicBeta, &b"b1"[..]),
                (Passed::AnthropicBeta, b"b2"),
                (Passed::OpenAiOrganization, b"o"),
                (Passed::OpenAiProject, b"p"),
                (Passed::IdempotencyKey, b"i"),
                (Passed::AnthropicVersion, b"v"),
            ]
        );
        assert!(p("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap()
            .unwrap()
            .passed
            .is_empty());
    }

    #[test]
    fn http10_keep_alive_rules() {
        let h = p("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive);
        let h = p("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
    }

    #[test]
    fn absolute_form_targets() {
        let raw = b"GET http://localhost:8080/v1/models?x=1 HTTP/1.1\r\nHost: localhost\r\n\r\n";
        let h = parse(raw, 4096, 64).unwrap().unwrap();
        assert_eq!(h.path(raw), b"/v1/models");
        assert_eq!(h.query(raw), Some(&b"x=1"[..]));
        assert_eq!(h.header(raw, &h.authority), Some(&b"localhost:8080"[..]));
        assert_eq!(h.header(raw, &h.host), Some(&b"localhost"[..]));
        let raw = b"POST HTTPS://[::1]?a HTTP/1.1\r\nHost: x\r\n\r\n";
        let h = parse(raw, 4096, 64).unwrap().unwrap();
        assert_eq!((h.path(raw), h.query(raw)), (&b""[..], Some(&b"a"[..])));
        assert_eq!(h.header(raw, &h.authority), Some(&b"[::1]"[..]));
        let raw = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(parse(raw, 4096, 64).unwrap().unwrap().authority, None);
        for bad in [
            "GET http:///v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET http:// HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET http://evil@localhost/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET http://localhost/v1/models HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(
                p(bad).map(|_| ()).map_err(|e| e.status()),
                Err(400),
                "{bad:?}"
            );
        }
    }
}
