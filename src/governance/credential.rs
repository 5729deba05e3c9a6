//! The API key a request presents, found the way each SDK sends it: `Authorization: Bearer`
//! (OpenAI), `x-api-key` (Anthropic), `api-key` (Azure), `x-goog-api-key` (Gemini) — or, on
//! Gemini-dialect paths only (`/v1beta/…`, `/v1/models…`), a `key=` query parameter, as
//! Google's REST examples send it.
//!
//! Owns: which header (or parameter) counts and how its value is read. Must not: hash, log or
//! compare the secret (that is `keyring`), or keep it: it hands out a slice of the read buffer,
//! or of a bounded stack buffer holding a percent-decoded query key for the duration of one
//! call. The query string (key included) is never forwarded upstream: upstream targets are
//! built by `provider`, not copied from the client.

use crate::http::head::trim;
use crate::http::RequestHead;

/// What the head offers as a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented<'b> {
    /// No key header (or an `Authorization` with another scheme and no other key header).
    Nothing,
    /// The secret, trimmed.
    Key(&'b [u8]),
    /// A key header repeated: two keys in one request is ambiguous and refused.
    Ambiguous,
}

/// Longest decoded `key=` query value looked at as a key; longer ones (and ones with a
/// malformed `%` escape) are looked up as sent, and so match nothing.
const MAX_QUERY_KEY: usize = 256;

/// Call `f` with the key `head` presents (see [`presented`]); a `key=` query parameter on a
/// Gemini-dialect path counts after every header, percent-decoded into a stack buffer that
/// lives only for this call. A repeated `key=` is ambiguous.
pub fn with_presented<R>(head: &RequestHead, buf: &[u8], f: impl FnOnce(Presented<'_>) -> R) -> R {
    match presented(head, buf) {
        Presented::Nothing => {}
        other => return f(other),
    }
    let path = head.path(buf);
    if !(path.starts_with(b"/v1beta/") || path.starts_with(b"/v1/models")) {
        return f(Presented::Nothing);
    }
    let mut found = None;
    for kv in head.query(buf).unwrap_or_default().split(|&b| b == b'&') {
        if let Some(v) = kv.strip_prefix(b"key=") {
            if found.replace(v).is_some() {
                return f(Presented::Ambiguous);
            }
        }
    }
    let Some(raw) = found.filter(|v| !v.is_empty()) else {
        return f(Presented::Nothing);
    };
    let mut decoded = [0u8; MAX_QUERY_KEY];
    match percent_decode(raw, &mut decoded) {
        Some(n) => f(Presented::Key(&decoded[..n])),
        None => f(Presented::Key(raw)),
    }
}

/// `%XX` escapes of `raw` decoded into `out`; `None` when one is malformed or it does not fit.
fn percent_decode(raw: &[u8], out: &mut [u8]) -> Option<usize> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let (mut i, mut n) = (0, 0);
    while let Some(&b) = raw.get(i) {
        let byte = if b == b'%' {
            let v = hex(*raw.get(i + 1)?)? << 4 | hex(*raw.get(i + 2)?)?;
            i += 3;
            v
        } else {
            i += 1;
            b
        };
        *out.get_mut(n)? = byte;
        n += 1;
    }
    Some(n)
}

/// The key of `head`'s headers (its ranges point into `buf`). Precedence when several different
/// headers are sent: `Authorization: Bearer`, then `x-api-key`, `api-key`, `x-goog-api-key`; the
/// first present one is the key (the others are ignored, never tried in turn).
pub fn presented<'b>(head: &RequestHead, buf: &'b [u8]) -> Presented<'b> {
    if head.dup_credential {
        return Presented::Ambiguous;
    }
    if let Some(key) = head.header(buf, &head.authorization).and_then(bearer) {
        return Presented::Key(key);
    }
    for r in [&head.x_api_key, &head.api_key, &head.x_goog_api_key] {
        if let Some(v) = head.header(buf, r).map(trim).filter(|v| !v.is_empty()) {
            return Presented::Key(v);
        }
    }
    Presented::Nothing
}

/// The token of an `Authorization: Bearer <token>` value (scheme case-insensitive).
fn bearer(v: &[u8]) -> Option<&[u8]> {
    let v = trim(v);
    let (scheme, rest) = v.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(trim(rest)).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head::parse;

    fn key_of(raw: &str) -> Option<String> {
        let raw = raw.as_bytes();
        let h = parse(raw, 4096, 64).unwrap().unwrap();
        match presented(&h, raw) {
            Presented::Key(k) => Some(String::from_utf8_lossy(k).into_owned()),
            Presented::Nothing => None,
            Presented::Ambiguous => Some("<ambiguous>".into()),
        }
    }

    fn query_key_of(target: &str, headers: &str) -> Option<String> {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: a\r\n{headers}\r\n");
        let h = parse(raw.as_bytes(), 4096, 64).unwrap().unwrap();
        with_presented(&h, raw.as_bytes(), |p| match p {
            Presented::Key(k) => Some(String::from_utf8_lossy(k).into_owned()),
            Presented::Nothing => None,
            Presented::Ambiguous => Some("<ambiguous>".into()),
        })
    }

    #[test]
    fn query_key_on_gemini_paths_only() {
        let q = |t: &str| query_key_of(t, "");
        let gen = "/v1beta/models/g:generateContent";
        assert_eq!(q(&format!("{gen}?key=rg-5")).as_deref(), Some("rg-5"));
        assert_eq!(
            q("/v1/models/g:streamGenerateContent?alt=sse&key=a%2Bb%2Fc%3D").as_deref(),
            Some("a+b/c=")
        );
        assert_eq!(q("/v1/models?key=k").as_deref(), Some("k"));
        assert_eq!(
            q(&format!("{gen}?key=a&key=b")).as_deref(),
            Some("<ambiguous>")
        );
        assert_eq!(q(&format!("{gen}?key=")), None);
        assert_eq!(q(&format!("{gen}?keys=x&monkey=y")), None);
        assert_eq!(
            q("/v1/chat/completions?key=rg-5"),
            None,
            "not a Gemini path"
        );
        assert_eq!(q("/v1/messages?key=rg-5"), None);
        // headers come first
        assert_eq!(
            query_key_of(&format!("{gen}?key=q"), "x-goog-api-key: h\r\n").as_deref(),
            Some("h")
        );
        // malformed or oversized: looked up as sent (so it matches nothing)
        assert_eq!(q(&format!("{gen}?key=a%zz")).as_deref(), Some("a%zz"));
        let long = "k".repeat(MAX_QUERY_KEY + 1);
        assert_eq!(
            q(&format!("{gen}?key={long}")).as_deref(),
            Some(long.as_str())
        );
        let fits = "k".repeat(MAX_QUERY_KEY);
        assert_eq!(
            q(&format!("{gen}?key={fits}")).as_deref(),
            Some(fits.as_str())
        );
    }

    #[test]
    fn each_sdk_header() {
        let k = |h: &str| key_of(&format!("GET / HTTP/1.1\r\nHost: a\r\n{h}\r\n\r\n"));
        assert_eq!(k("Authorization: Bearer rg-1").as_deref(), Some("rg-1"));
        assert_eq!(k("authorization: bearer   rg-1  ").as_deref(), Some("rg-1"));
        assert_eq!(k("x-api-key: rg-2").as_deref(), Some("rg-2"));
        assert_eq!(k("api-key: rg-3").as_deref(), Some("rg-3"));
        assert_eq!(k("x-goog-api-key: rg-4").as_deref(), Some("rg-4"));
        assert_eq!(k("Authorization: Basic dXNlcg=="), None);
        assert_eq!(k("Authorization: Bearer "), None);
        assert_eq!(k("x-api-key: "), None);
        assert_eq!(k("X-Other: rg-1"), None);
        // precedence, and a repeated header
        assert_eq!(
            k("x-api-key: rg-2\r\nAuthorization: Bearer rg-1").as_deref(),
            Some("rg-1")
        );
        assert_eq!(
            k("Authorization: Basic x\r\nx-api-key: rg-2").as_deref(),
            Some("rg-2")
        );
        assert_eq!(
            k("x-api-key: a\r\nx-api-key: b").as_deref(),
            Some("<ambiguous>")
        );
    }
}
