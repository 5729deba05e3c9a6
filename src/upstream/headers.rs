//! The header policy: the one place that decides which client request headers reach an upstream
//! (per provider kind), and which upstream response headers come back to the client (renamed to
//! the client dialect's names when the dialects differ). docs/dialects.md ("Headers") shows the same table.
//!
//! Request headers (client → upstream); every other client header is dropped — hop-by-hop
//! headers, `Cookie`, `Host`, framing, and the client's own credentials (`Authorization`,
//! `x-api-key`, `api-key`, `x-goog-api-key`, `?key=`) are never forwarded: upstream requests carry
//! the gateway's framing and the provider's key only.
//!
//! | client header | openai | openai-compatible | azure | anthropic | gemini | mock |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | `anthropic-version` | – | – | – | replaces the default `2023-06-01` | – | – |
//! | `anthropic-beta` | – | – | – | ✓ | – | – |
//! | `OpenAI-Organization`, `OpenAI-Project` | ✓ | – | – | – | – | – |
//! | `Idempotency-Key` | ✓ | – | – | – | – | – |
//! | `x-request-id` (as the request's id) | ✓ | ✓ | ✓ | ✓ | ✓ | – |
//!
//! `x-request-id` goes up as the request's id (`http::request_id`): the client's own when it is
//! an acceptable id, else the one the gateway gave the request — so the upstream's logs and the
//! gateway's name the request alike. Every other forwarded value passes `target::header_value`
//! (visible ASCII, inner spaces; no CR, LF, NUL or other controls) and is at most [`MAX_VALUE`]
//! bytes; a value that does not, or a single-valued header sent twice, is a 400 in the client's
//! dialect before anything is read or sent (an empty value is skipped). Repeated
//! `anthropic-beta` lines are joined with `, ` (a list header).
//!
//! Response headers (upstream → client), on every proxied answer, errors included: `retry-after`,
//! the upstream's request id (`x-request-id`, passed on as `x-upstream-request-id` since the
//! client's `x-request-id` is the gateway's; Anthropic's `request-id`), `x-ratelimit-*`,
//! `anthropic-ratelimit-*`, `openai-*`; nothing else (no `set-cookie`, `server`, …). When the
//! client's dialect differs from the upstream's (a translated answer) the names follow the
//! client:
//!
//! | upstream line | OpenAI client (Chat, Responses) | Anthropic client | Gemini client |
//! | --- | --- | --- | --- |
//! | `x-ratelimit-{limit,remaining}-{requests,tokens}` | as is | `anthropic-ratelimit-{requests,tokens}-{limit,remaining}` | as is |
//! | `anthropic-ratelimit-{requests,tokens}-{limit,remaining}` | `x-ratelimit-{limit,remaining}-{requests,tokens}` | as is | `x-ratelimit-…` |
//! | `x-ratelimit-reset-*`, `anthropic-ratelimit-*-reset` | as is (same dialect) | dropped (a duration vs an RFC 3339 instant) | as `x-ratelimit-reset-*` from OpenAI, else dropped |
//! | `anthropic-ratelimit-{input,output}-tokens-*` | dropped | as is | dropped |
//! | `x-upstream-request-id` / `request-id` | `x-upstream-request-id` | `request-id` | `x-upstream-request-id` |
//! | `openai-*` | as is | dropped | dropped |
//! | `retry-after` | as is | as is | as is |
//!
//! (Gemini has no rate-limit headers of its own; its clients get OpenAI's names, as the
//! gateway's own per-key limit headers use.)
//!
//! Owns: both tables, `ClientHeaders` (the captured values of one request) and the default
//! `anthropic-version`. Must not: do IO, or forward anything not in the tables. Cost: nothing
//! is allocated when a request carries none of the headers above (the provider's prebuilt
//! header lines are sent as they are); response lines are renamed only on translated answers.

use std::borrow::Cow;

use crate::config::provider::ProviderKind;
use crate::dialect::Dialect;
use crate::error::ErrorShape;
use crate::error::{Error, Kind};
use crate::http::head::Passed;
use crate::http::request_id::RequestId;
use crate::http::target;
use crate::http::RequestHead;

/// The `anthropic-version` sent to Anthropic providers when the client chose none (first line
/// of their prebuilt header lines, see `route`).
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// Longest forwarded value (after joining repeated `anthropic-beta` lines).
pub const MAX_VALUE: usize = 1024;

/// Whether a provider of `kind` is sent client header `h` (the request table above).
pub fn forwards(kind: ProviderKind, h: Passed) -> bool {
    match h {
        Passed::AnthropicVersion | Passed::AnthropicBeta => kind == ProviderKind::Anthropic,
        Passed::OpenAiOrganization | Passed::OpenAiProject | Passed::IdempotencyKey => {
            kind == ProviderKind::OpenAi
        }
    }
}

/// Whether a provider of `kind` is sent the request's id (when the client sent one).
fn forwards_request_id(kind: ProviderKind) -> bool {
    kind != ProviderKind::Mock
}

/// The forwardable client headers of one request, copied off the head (which is gone once the
/// body is read) and checked. Empty (no allocation) for most requests.
#[derive(Debug, Default, Clone)]
pub struct ClientHeaders {
    items: Vec<(Passed, String)>,
    /// The request's id, when the client sent an `x-request-id`.
    request_id: Option<RequestId>,
}

impl ClientHeaders {
    /// Copy and check the `Passed` headers of `head` (ranges into `buf`); `id` is the request's
    /// id (sent up when the client sent an `x-request-id`).
    pub fn capture(head: &RequestHead, buf: &[u8], id: RequestId) -> Result<ClientHeaders, Error> {
        let request_id = (head.x_request_id.is_some() && !id.is_empty()).then_some(id);
        if head.passed.is_empty() {
            return Ok(ClientHeaders {
                items: Vec::new(),
                request_id,
            });
        }
        let mut items: Vec<(Passed, String)> = Vec::new();
        for (h, r) in &head.passed {
            let raw = buf.get(r.clone()).unwrap_or_default();
            let bad = |why: &str| {
                Error::new(
                    Kind::InvalidBody,
                    format!("header {} cannot be forwarded: it {why}", h.name()),
                )
            };
            let value = std::str::from_utf8(crate::http::head::trim(raw))
                .map_err(|_| bad("is not ASCII"))?;
            if value.is_empty() {
                continue; // says nothing: not forwarded
            }
            if *h == Passed::AnthropicVersion && value == DEFAULT_ANTHROPIC_VERSION {
                // what every Anthropic SDK sends, and what the provider's lines carry already:
                // nothing to replace (and nothing to copy on the common path)
                continue;
            }
            target::header_value(value).map_err(bad)?;
            match items.iter_mut().find(|(p, _)| p == h) {
                Some((_, joined)) if *h == Passed::AnthropicBeta => {
                    joined.push_str(", ");
                    joined.push_str(value);
                }
                Some(_) => return Err(bad("was sent more than once")),
                None => items.push((*h, value.to_string())),
            }
            if items.iter().any(|(_, v)| v.len() > MAX_VALUE) {
                return Err(bad("is longer than 1024 bytes"));
            }
        }
        Ok(ClientHeaders { items, request_id })
    }

    /// The header lines of one attempt to a provider of `kind` whose own lines (key, default
    /// version) are `auth`: `auth` itself when nothing is forwarded, else the forwarded lines
    /// and `auth` (a client `anthropic-version` replacing the default one).
    pub fn upstream_lines<'a>(&self, kind: ProviderKind, auth: &'a [u8]) -> Cow<'a, [u8]> {
        if !self.forwards_any(kind) {
            return Cow::Borrowed(auth);
        }
        let mut out = Vec::with_capacity(auth.len() + 64 * self.items.len());
        self.push_upstream_lines(kind, auth, &mut out);
        Cow::Owned(out)
    }

    /// Whether an attempt to a provider of `kind` carries any forwarded line.
    fn forwards_any(&self, kind: ProviderKind) -> bool {
        (self.request_id.is_some() && forwards_request_id(kind))
            || self.items.iter().any(|(h, _)| forwards(kind, *h))
    }

    /// [`ClientHeaders::upstream_lines`], appended to `out` (a buffer the caller reuses).
    pub fn push_upstream_lines(&self, kind: ProviderKind, auth: &[u8], out: &mut Vec<u8>) {
        if !self.forwards_any(kind) {
            return out.extend_from_slice(auth);
        }
        let id = self.request_id.filter(|_| forwards_request_id(kind));
        let own_version = self
            .items
            .iter()
            .any(|(h, _)| *h == Passed::AnthropicVersion);
        for (h, v) in self.items.iter().filter(|(h, _)| forwards(kind, *h)) {
            out.extend_from_slice(h.name().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some(id) = id {
            id.header_line(out);
        }
        for line in auth.split_inclusive(|&b| b == b'\n') {
            if !(own_version && starts_with_ci(line, b"anthropic-version:")) {
                out.extend_from_slice(line);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.request_id.is_none()
    }
}

fn starts_with_ci(s: &[u8], prefix: &[u8]) -> bool {
    s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// Whether an upstream response header named `name` may come back to the client (before any
/// renaming): the response table's rows.
pub fn response_header(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"retry-after")
        || name.eq_ignore_ascii_case(b"x-request-id")
        || name.eq_ignore_ascii_case(b"request-id")
        || starts_with_ci(name, b"x-ratelimit-")
        || starts_with_ci(name, b"anthropic-ratelimit-")
        || starts_with_ci(name, b"openai-")
}

/// A rate-limit line's meaning, whatever its naming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// One of [`COUNTS`] (limit or remaining, of requests or tokens).
    Count(usize),
    /// A reset time in the naming's own format.
    Reset,
    /// Anthropic-only (input/output token buckets, priority tiers…).
    Other,
}

/// Rate-limit counts in both spellings: after `x-ratelimit-`, after `anthropic-ratelimit-`.
const COUNTS: [(&[u8], &[u8]); 4] = [
    (b"limit-requests", b"requests-limit"),
    (b"remaining-requests", b"requests-remaining"),
    (b"limit-tokens", b"tokens-limit"),
    (b"remaining-tokens", b"tokens-remaining"),
];

fn limit_of(rest: &[u8], anthropic: bool) -> Limit {
    for (i, (openai, anth)) in COUNTS.iter().enumerate() {
        if rest.eq_ignore_ascii_case(if anthropic { anth } else { openai }) {
            return Limit::Count(i);
        }
    }
    let reset = if anthropic {
        rest.len() >= 6 && rest[rest.len() - 6..].eq_ignore_ascii_case(b"-reset")
    } else {
        starts_with_ci(rest, b"reset-")
    };
    if reset {
        Limit::Reset
    } else {
        Limit::Other
    }
}

/// Rename the upstream's forwarded response lines (CRLF lines that passed [`response_header`])
/// from `up`'s dialect to `client`'s, as the response table says. Same naming family: unchanged.
/// No allocation but the new lines' buffer.
pub fn to_client(lines: &mut Vec<u8>, up: Dialect, client: Dialect) {
    let (from, to) = (up.wire().error_shape, client.wire().error_shape);
    if from == to || lines.is_empty() {
        return;
    }
    let mut out = Vec::with_capacity(lines.len() + 64);
    for line in lines.split_inclusive(|&b| b == b'\n') {
        let Some(colon) = memchr::memchr(b':', line) else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon..]);
        let mut put = |prefix: &[u8], rest: &[u8]| {
            out.extend_from_slice(prefix);
            out.extend_from_slice(rest);
            out.extend_from_slice(value);
        };
        if name.eq_ignore_ascii_case(b"retry-after") {
            put(name, b"");
        } else if name.eq_ignore_ascii_case(b"x-upstream-request-id")
            || name.eq_ignore_ascii_case(b"request-id")
            || name.eq_ignore_ascii_case(b"x-request-id")
        {
            // the upstream's request id (the client's `x-request-id` is the gateway's)
            match to {
                ErrorShape::Anthropic => put(b"request-id", b""),
                ErrorShape::OpenAi | ErrorShape::Gemini => put(b"x-upstream-request-id", b""),
            }
        } else if starts_with_ci(name, b"openai-") {
            // OpenAI's own (processing time, version): meaningless to other SDKs
        } else if let Some(rest) = strip_ci(name, b"x-ratelimit-") {
            match (limit_of(rest, false), to) {
                (Limit::Count(i), ErrorShape::Anthropic) => {
                    put(b"anthropic-ratelimit-", COUNTS[i].1)
                }
                (Limit::Count(_) | Limit::Reset, ErrorShape::OpenAi | ErrorShape::Gemini) => {
                    put(name, b"")
                }
                _ => {}
            }
        } else if let Some(rest) = strip_ci(name, b"anthropic-ratelimit-") {
            match (limit_of(rest, true), to) {
                (Limit::Count(i), ErrorShape::OpenAi | ErrorShape::Gemini) => {
                    put(b"x-ratelimit-", COUNTS[i].0)
                }
                (_, ErrorShape::Anthropic) => put(name, b""),
                _ => {}
            }
        }
    }
    *lines = out;
}

fn strip_ci<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    starts_with_ci(s, prefix).then(|| &s[prefix.len()..])
}

/// Keep only `retry-after` from the upstream's forwarded headers, for error answers rebuilt in
/// the client's dialect on the passthrough path.
pub fn retry_after(forward: &[u8]) -> Vec<u8> {
    forward
        .split(|&b| b == b'\n')
        .filter(|l| l.len() > 12 && l[..12].eq_ignore_ascii_case(b"retry-after:"))
        .flat_map(|l| l.iter().copied().chain(std::iter::once(b'\n')))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head::parse;

    #[test]
    fn retry_after_is_kept() {
        assert_eq!(
            retry_after(b"x-request-id: 1\r\nRetry-After: 3\r\n"),
            b"Retry-After: 3\r\n"
        );
        assert!(retry_after(b"x-request-id: 1\r\n").is_empty());
    }

    fn capture(headers: &str) -> Result<ClientHeaders, Error> {
        let raw = format!("POST /v1/x HTTP/1.1\r\nHost: a\r\n{headers}\r\n");
        let h = parse(raw.as_bytes(), 8192, 64).unwrap().unwrap();
        let id = h.header(raw.as_bytes(), &h.x_request_id);
        let id = id.and_then(RequestId::from_client).unwrap_or_default();
        ClientHeaders::capture(&h, raw.as_bytes(), id)
    }

    const KINDS: [ProviderKind; 6] = [
        ProviderKind::OpenAi,
        ProviderKind::OpenAiCompatible,
        ProviderKind::Azure,
        ProviderKind::Anthropic,
        ProviderKind::Gemini,
        ProviderKind::Mock,
    ];

    #[test]
    fn request_table_per_kind() {
        let c = capture(
            "anthropic-version: 2024-01-01\r\nanthropic-beta: a\r\nAnthropic-Beta: b\r\n\
             OpenAI-Organization: org-1\r\nOpenAI-Project: proj_1\r\nIdempotency-Key: idem-1\r\n\
             X-Request-Id: req-1\r\nCookie: s=1\r\nConnection: keep-alive\r\n\
             Authorization: Bearer client\r\nx-api-key: client\r\n",
        )
        .unwrap();
        let lines = |kind: ProviderKind, auth: &'static [u8]| {
            String::from_utf8(c.upstream_lines(kind, auth).into_owned()).unwrap()
        };
        let an_auth = b"anthropic-version: 2023-06-01\r\nx-api-key: sk-p\r\n";
        assert_eq!(
            lines(ProviderKind::Anthropic, an_auth),
            "anthropic-version: 2024-01-01\r\nanthropic-beta: a, b\r\nx-request-id: req-1\r\nx-api-key: sk-p\r\n"
        );
        assert_eq!(
            lines(ProviderKind::OpenAi, b"authorization: Bearer sk-p\r\n"),
            "openai-organization: org-1\r\nopenai-project: proj_1\r\nidempotency-key: idem-1\r\n\
             x-request-id: req-1\r\nauthorization: Bearer sk-p\r\n"
        );
        for kind in [
            ProviderKind::OpenAiCompatible,
            ProviderKind::Azure,
            ProviderKind::Gemini,
        ] {
            assert_eq!(lines(kind, b"k: v\r\n"), "x-request-id: req-1\r\nk: v\r\n");
        }
        assert!(matches!(
            c.upstream_lines(ProviderKind::Mock, b""),
            Cow::Borrowed(b"")
        ));
        for kind in KINDS {
            let l = lines(kind, b"");
            assert!(!l.contains("client") && !l.to_ascii_lowercase().contains("cookie"));
            assert!(!l.contains("keep-alive"));
        }
    }

    #[test]
    fn nothing_to_forward_borrows() {
        let c = capture("Cookie: x\r\nUser-Agent: sdk\r\n").unwrap();
        assert!(c.is_empty());
        // the Anthropic SDKs' own version is the default one: nothing to replace
        let c = capture("anthropic-version: 2023-06-01\r\n").unwrap();
        assert!(c.is_empty());
        let auth: &[u8] = b"anthropic-version: 2023-06-01\r\nx-api-key: k\r\n";
        for kind in KINDS {
            assert!(matches!(c.upstream_lines(kind, auth), Cow::Borrowed(a) if a == auth));
        }
        // only headers other kinds take: still borrowed
        let c = capture("anthropic-beta: x\r\n").unwrap();
        assert!(matches!(
            c.upstream_lines(ProviderKind::OpenAi, auth),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn bad_values_are_refused() {
        for h in [
            "openai-project: caf\u{e9}\r\n",
            "OpenAI-Organization: a\r\nopenai-organization: b\r\n",
            "openai-project: a\r\nOpenAI-Project: a\r\n",
        ] {
            let e = capture(h).unwrap_err();
            assert_eq!(e.status(), 400, "{h:?}");
        }
        let long = format!("anthropic-beta: {}\r\n", "b".repeat(MAX_VALUE + 1));
        assert_eq!(capture(&long).unwrap_err().status(), 400);
        let many = format!("anthropic-beta: {}\r\n", "b".repeat(100)).repeat(12);
        assert_eq!(capture(&many).unwrap_err().status(), 400, "joined too long");
        // an empty value says nothing: not forwarded
        assert!(capture("idempotency-key: \r\n").unwrap().is_empty());
        // no id of the client's, or an unacceptable one: nothing about ids goes up either
        assert!(capture("x-request-id: \r\n").unwrap().is_empty());
    }

    #[test]
    fn response_lines_follow_the_client() {
        let oa = b"x-upstream-request-id: r1\r\nx-ratelimit-limit-requests: 60\r\nx-ratelimit-remaining-tokens: 9\r\n\
x-ratelimit-reset-requests: 1s\r\nopenai-processing-ms: 7\r\nretry-after: 2\r\n";
        let mut l = oa.to_vec();
        to_client(&mut l, Dialect::Chat, Dialect::Messages);
        assert_eq!(
            String::from_utf8(l).unwrap(),
            "request-id: r1\r\nanthropic-ratelimit-requests-limit: 60\r\n\
             anthropic-ratelimit-tokens-remaining: 9\r\nretry-after: 2\r\n"
        );
        let mut l = oa.to_vec();
        to_client(&mut l, Dialect::Chat, Dialect::Gemini);
        assert_eq!(
            String::from_utf8(l).unwrap(),
            "x-upstream-request-id: r1\r\nx-ratelimit-limit-requests: 60\r\n\
             x-ratelimit-remaining-tokens: 9\r\nx-ratelimit-reset-requests: 1s\r\nretry-after: 2\r\n"
        );
        let mut l = oa.to_vec();
        to_client(&mut l, Dialect::Chat, Dialect::Responses);
        assert_eq!(l, oa, "same family: unchanged");
        let an = b"request-id: req_1\r\nanthropic-ratelimit-requests-limit: 50\r\n\
anthropic-ratelimit-tokens-remaining: 8\r\nanthropic-ratelimit-requests-reset: 2026-01-01T00:00:00Z\r\n\
anthropic-ratelimit-input-tokens-limit: 5\r\nRetry-After: 3\r\n";
        for client in [Dialect::Chat, Dialect::Responses, Dialect::Gemini] {
            let mut l = an.to_vec();
            to_client(&mut l, Dialect::Messages, client);
            assert_eq!(
                String::from_utf8(l).unwrap(),
                "x-upstream-request-id: req_1\r\nx-ratelimit-limit-requests: 50\r\n\
                 x-ratelimit-remaining-tokens: 8\r\nRetry-After: 3\r\n",
                "{client:?}"
            );
        }
        let mut l = an.to_vec();
        to_client(&mut l, Dialect::Messages, Dialect::Messages);
        assert_eq!(l, an);
    }

    #[test]
    fn response_header_rows() {
        for (name, relayed) in [
            (&b"Retry-After"[..], true),
            (b"x-request-id", true),
            (b"request-id", true),
            (b"X-RateLimit-Limit-Requests", true),
            (b"anthropic-ratelimit-tokens-reset", true),
            (b"openai-processing-ms", true),
            (b"set-cookie", false),
            (b"server", false),
            (b"x-goog-api-key", false),
            (b"cf-ray", false),
            (b"via", false),
        ] {
            let shown = String::from_utf8_lossy(name);
            assert_eq!(response_header(name), relayed, "{shown:?}");
        }
    }
}
