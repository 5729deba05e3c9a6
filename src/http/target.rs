//! What may reach an upstream request line or header: every client-supplied or configured string
//! that ends up there goes through this module, and [`check_head`] looks at the finished request
//! target and header lines once more right before they are written.
//!
//! The rules:
//! - **Model identifier** (a client's `model`, a configured `upstream_model` or exact model
//!   name): 1 to [`MAX_MODEL_LEN`] bytes from `A-Z a-z 0-9 . _ : / @ + -`, in `/`-separated
//!   segments of which none is empty, `.` or `..` (so no leading, trailing or double `/`).
//!   Spaces, controls, `?`, `#`, `%`, quotes, backslashes and non-ASCII are refused: a client
//!   gets a 400 in its dialect before routing ([`crate::dialect::extract`]), a config a line-numbered
//!   error. A `prefix*` pattern's prefix must be the start of some valid identifier. A model
//!   named in a client's request path (Gemini's `/v1beta/models/{model}:generateContent`, a
//!   model lookup) is percent-decoded once and then held to the same rule ([`model_from_path`]).
//! - **Path segment / query value**: [`push_segment`] and [`push_query_value`] percent-encode
//!   every byte outside RFC 3986 `unreserved` (`/` → `%2F`, `:` → `%3A`, …) and a segment made
//!   only of dots entirely, so even a name that skipped validation stays one segment of one
//!   request line.
//! - **Header value** (API keys, the Host header): visible ASCII with inner spaces or tabs; CR,
//!   LF, NUL, other controls, DEL and non-ASCII never pass ([`header_value`]).
//! - **Host** (from `base_url`): a DNS name / IPv4 (`A-Z a-z 0-9 - . _`) or an IPv6 literal.
//!   **Path prefix** (`base_url`'s path): `/`-separated RFC 3986 `pchar` segments, valid `%XX`
//!   escapes, no `.` or `..` segment.
//! - The final gate, [`check_head`]: the request target is `/` followed by visible ASCII without
//!   `#`; the host and every extra header line are `token: value` CRLF lines by the rule above. A
//!   violation there is a gateway bug and answers 500 — the bytes are never written.
//!
//! Owns: these rules and encoders. Must not: build request bodies, open connections or decide
//! routes.

use crate::error::{Error, Kind};

/// Longest model identifier accepted.
pub const MAX_MODEL_LEN: usize = 256;

/// The model identifier rule, as the client/config error message states it.
pub const MODEL_RULE: &str = "a model name is 1 to 256 characters from A-Z a-z 0-9 . _ : / @ + -, \
     in '/'-separated parts none of which is empty, '.' or '..'";

fn model_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'@' | b'+' | b'-')
}

/// Whether `name` is a valid model identifier (see the module doc); `Err` says why not.
pub fn model_id(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > MAX_MODEL_LEN {
        return Err("is longer than 256 bytes");
    }
    if !name.bytes().all(model_byte) {
        return Err("contains a character outside A-Z a-z 0-9 . _ : / @ + -");
    }
    if name
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err("has an empty, '.' or '..' part (or a leading, trailing or double '/')");
    }
    Ok(())
}

/// The model named by the path bytes `seg` (the part between `/models/` and the method of a
/// Gemini-dialect path, or the id of a model lookup): `%XX` escapes decoded once, then the
/// model identifier rule. `Err` says why not (for a 400 / 404 in the client's dialect).
pub fn model_from_path(seg: &[u8]) -> Result<String, &'static str> {
    if seg.len() > 3 * MAX_MODEL_LEN {
        return Err("is longer than 256 bytes");
    }
    let mut out = Vec::with_capacity(seg.len());
    let mut i = 0;
    while let Some(&b) = seg.get(i) {
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let hex = |k: usize| seg.get(k).and_then(|&c| (c as char).to_digit(16));
        match (hex(i + 1), hex(i + 2)) {
            (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
            _ => return Err("has a malformed %-escape"),
        }
        i += 3;
    }
    let name = String::from_utf8(out).map_err(|_| "is not UTF-8")?;
    model_id(&name)?;
    Ok(name)
}

/// Whether `prefix` (of a `prefix*` route) starts some valid model identifier.
pub fn model_prefix(prefix: &str) -> Result<(), &'static str> {
    if prefix.len() >= MAX_MODEL_LEN {
        return Err("is 256 bytes or longer, so no valid model name extends it");
    }
    model_id(&format!("{prefix}x"))
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_encoded(out: &mut String, s: &str, all: bool) {
    for &b in s.as_bytes() {
        if !all && (b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xf) as usize] as char);
        }
    }
}

/// Append `s` as one percent-encoded path segment (RFC 3986 `unreserved` kept as is; a segment
/// of only dots, or an empty one, cannot become a traversal: dots are encoded too).
pub fn push_segment(out: &mut String, s: &str) {
    let only_dots = s.bytes().all(|b| b == b'.');
    push_encoded(out, s, only_dots);
}

/// Append `s` as a percent-encoded query parameter value.
pub fn push_query_value(out: &mut String, s: &str) {
    push_encoded(out, s, false);
}

/// Whether `v` may be a header value: visible ASCII with inner spaces or tabs, non-empty, no
/// leading or trailing whitespace.
pub fn header_value(v: &str) -> Result<(), &'static str> {
    let b = v.as_bytes();
    if b.is_empty() {
        return Err("is empty");
    }
    if !b
        .iter()
        .all(|&c| c == b' ' || c == b'\t' || c.is_ascii_graphic())
    {
        return Err("contains a control character (CR, LF, NUL, …), DEL or non-ASCII");
    }
    if matches!(b.first(), Some(b' ' | b'\t')) || matches!(b.last(), Some(b' ' | b'\t')) {
        return Err("starts or ends with whitespace");
    }
    Ok(())
}

/// Whether `host` (without IPv6 brackets) may name an upstream host.
pub fn host(host: &str) -> Result<(), &'static str> {
    let ok = if host.contains(':') {
        host.bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
    } else {
        host.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    };
    match (host.is_empty(), ok) {
        (true, _) => Err("is empty"),
        (false, false) => Err("is not a DNS name, IPv4 address or IPv6 literal"),
        (false, true) => Ok(()),
    }
}

fn pchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

/// Whether `p` (a base_url's path, `""` or starting with `/`, no trailing `/`) may prefix
/// request targets.
pub fn path_prefix(p: &str) -> Result<(), &'static str> {
    if p.is_empty() {
        return Ok(());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err("must start with '/'");
    };
    for seg in rest.split('/') {
        if seg == "." || seg == ".." {
            return Err("has a '.' or '..' segment");
        }
        let b = seg.as_bytes();
        let mut i = 0;
        while let Some(&c) = b.get(i) {
            if c == b'%' {
                let hex = b.get(i + 1..i + 3).unwrap_or_default();
                if hex.len() != 2 || !hex.iter().all(u8::is_ascii_hexdigit) {
                    return Err("has a '%' that does not start a %XX escape");
                }
                i += 3;
            } else if pchar(c) {
                i += 1;
            } else {
                return Err("has a character not allowed in a URL path (space, control, ?, #, …)");
            }
        }
    }
    Ok(())
}

fn token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The final gate before an upstream request head is written: `path` is one origin-form
/// request target, `host_header` a header value, and `headers` a run of `name: value\r\n` lines
/// (see the module doc). Cheap: one pass over a few hundred bytes.
pub fn check_head(path: &str, host_header: &str, headers: &[u8]) -> Result<(), Error> {
    let bad = |what: &str| {
        Err(Error::new(
            Kind::Internal,
            format!("refusing to send an upstream request: unsafe bytes in its {what}"),
        ))
    };
    let p = path.as_bytes();
    if p.first() != Some(&b'/') || !p.iter().all(|&b| b.is_ascii_graphic() && b != b'#') {
        return bad("request target");
    }
    if header_value(host_header).is_err() {
        return bad("host header");
    }
    let mut rest = headers;
    while !rest.is_empty() {
        let Some(end) = memchr::memmem::find(rest, b"\r\n") else {
            return bad("header lines");
        };
        let line = &rest[..end];
        rest = &rest[end + 2..];
        let Some(colon) = memchr::memchr(b':', line) else {
            return bad("header lines");
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let value_ok = std::str::from_utf8(value).is_ok_and(|v| header_value(v).is_ok());
        if name.is_empty() || !name.iter().all(|&b| token_byte(b)) || !value_ok {
            return bad("header lines");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_identifier_table() {
        let long = "a".repeat(MAX_MODEL_LEN);
        for ok in [
            "gpt-4o-mini",
            "ft:gpt-4o-mini:org:custom:abc123",
            "claude-3-5-sonnet@20240620",
            "meta-llama/Llama-3.1-8B-Instruct",
            "anthropic.claude-3-sonnet-20240229-v1:0",
            "llama3:8b",
            "a+b",
            "..x",
            "x/.y",
            long.as_str(),
        ] {
            assert_eq!(model_id(ok), Ok(()), "{ok}");
        }
        let too_long = "a".repeat(MAX_MODEL_LEN + 1);
        for bad in [
            "",
            too_long.as_str(),
            "prod-x/chat/completions?api-version=1 HTTP/1.1\r\nHost: u\r\n\r\nPOST /other HTTP/1.1\r\nX: ",
            "../other",
            "a/../../b",
            "a/./b",
            "..",
            ".",
            "/abs",
            "trailing/",
            "a//b",
            "has space",
            "tab\t",
            "nul\0",
            "lf\n",
            "q?x",
            "h#x",
            "pct%2F",
            "quote\"",
            "back\\slash",
            "é",
            "del\x7f",
        ] {
            assert!(model_id(bad).is_err(), "{bad:?}");
        }
        assert_eq!(model_prefix("gpt-"), Ok(()));
        assert_eq!(model_prefix("org/"), Ok(()));
        assert!(model_prefix("/x").is_err());
        assert!(model_prefix("a//").is_err());
        assert!(model_prefix("a b").is_err());
        assert!(model_prefix(&long).is_err());
    }

    #[test]
    fn models_from_paths_are_decoded_once_then_checked() {
        let m = |s: &str| model_from_path(s.as_bytes());
        assert_eq!(m("gemini-2.0-flash").as_deref(), Ok("gemini-2.0-flash"));
        assert_eq!(m("meta-llama/Llama-3").as_deref(), Ok("meta-llama/Llama-3"));
        assert_eq!(m("org%2Fm%3A1").as_deref(), Ok("org/m:1"));
        assert_eq!(m("llama3:8b").as_deref(), Ok("llama3:8b"));
        for bad in [
            "", "a%2", "a%zz", "a%20b", "a%0D%0AX", "..", "a/../b", "%2E%2E", "a%252F", "%C3%A9",
            "%FF",
        ] {
            assert!(m(bad).is_err(), "{bad:?}");
        }
        assert!(model_from_path("a".repeat(MAX_MODEL_LEN * 4).as_bytes()).is_err());
    }

    #[test]
    fn segments_and_queries_are_percent_encoded() {
        let enc = |s: &str| {
            let mut out = String::new();
            push_segment(&mut out, s);
            out
        };
        assert_eq!(enc("gpt-4o.mini_x~"), "gpt-4o.mini_x~");
        assert_eq!(enc("a:b@c+d/e"), "a%3Ab%40c%2Bd%2Fe");
        assert_eq!(enc(".."), "%2E%2E");
        assert_eq!(enc("."), "%2E");
        assert_eq!(enc("..x"), "..x");
        assert_eq!(
            enc("x HTTP/1.1\r\nHost: u\r\n\r\n"),
            "x%20HTTP%2F1.1%0D%0AHost%3A%20u%0D%0A%0D%0A"
        );
        assert_eq!(enc("é?#%\0"), "%C3%A9%3F%23%25%00");
        let mut q = String::new();
        push_query_value(&mut q, "2024-10-21&x=1");
        assert_eq!(q, "2024-10-21%26x%3D1");
    }

    #[test]
    fn header_host_and_path_rules() {
        assert_eq!(header_value("Bearer sk-abc_123"), Ok(()));
        for bad in ["", "a\r\nx: y", "a\nb", "a\0", "a\x7f", "é", " a", "a "] {
            assert!(header_value(bad).is_err(), "{bad:?}");
        }
        for ok in ["api.openai.com", "127.0.0.1", "::1", "fe80::1", "my_host-1"] {
            assert_eq!(host(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a b", "a\r\nb", "h/x", "h?x", "h@x"] {
            assert!(host(bad).is_err(), "{bad:?}");
        }
        for ok in ["", "/v1", "/openai/v1", "/a%20b/c:d@e", "/"] {
            assert_eq!(path_prefix(ok), Ok(()), "{ok}");
        }
        for bad in [
            "v1", "/a b", "/a\r\nb", "/a?x", "/a#x", "/%zz", "/%2", "/../x", "/a/./b",
        ] {
            assert!(path_prefix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn final_gate() {
        let hs = b"authorization: Bearer k\r\nanthropic-version: 2023-06-01\r\n";
        assert!(check_head("/v1/chat/completions?x=1", "h:80", hs).is_ok());
        assert!(check_head("/v1", "h", b"").is_ok());
        for (path, host, hs) in [
            ("/a b", "h", &b""[..]),
            ("/a\r\nX: y", "h", b""),
            ("a", "h", b""),
            ("/a#f", "h", b""),
            ("/a", "h\r\nX: y", b""),
            ("/a", "h", b"x-api-key: k\r\nX: y\r\n\r\nGET / HTTP/1.1\r\n"),
            ("/a", "h", b"x-api-key: k\nx: y\r\n"),
            ("/a", "h", b"x-api-key: k"),
            ("/a", "h", b"bad name: v\r\n"),
        ] {
            let e = check_head(path, host, hs).unwrap_err();
            assert_eq!(e.status(), 500, "{path:?} {host:?}");
        }
    }
}
