//! The API key a request presents, found the way each SDK sends it: `Authorization: Bearer`
//! (OpenAI), `x-api-key` (Anthropic), `api-key` (Azure), `x-goog-api-key` (Gemini).
//!
//! Owns: which header counts and how its value is read. Must not: copy, hash, log or compare
//! the secret (that is `keyring`); it only hands out a slice of the read buffer.

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

/// The key of `head` (its ranges point into `buf`). Precedence when several different headers
/// are sent: `Authorization: Bearer`, then `x-api-key`, `api-key`, `x-goog-api-key`; the first
/// present one is the key (the others are ignored, never tried in turn).
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
