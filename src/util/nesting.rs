//! The JSON nesting bound: no JSON text from a client or an upstream is handed to a recursive
//! parser before its nesting depth is known to be at most [`MAX_DEPTH`].
//!
//! sonic-rs's lazy lookups (`extract`, the mock's request parsing) recurse once per nested `[` or
//! `{` while skipping a value and have no depth limit, so ~12,000 nested brackets in a 24 KB body
//! overflowed a shard's stack and aborted the process. [`check`] is a flat byte scan (strings
//! skipped with `memchr`, escapes honoured; a SIMD bracket count skips it for most bodies) run
//! before those parsers; serde_json (`translate`,
//! the mock's embeddings) stops at its own default of 127 levels on its own, so whichever bound
//! is met first answers (400 for client bytes, 502 for upstream bytes). serde_json skips
//! unknown members of a typed value without that limit, so the stream translator runs
//! [`check`] on every upstream event itself (an error event on every route). Shard threads get
//! `shard::STACK_BYTES` of stack so that this bound, not the stack size, is what stops deep input.
//!
//! Owns: `MAX_DEPTH` and the check. Must not: validate JSON otherwise (the parsers do that; the
//! scan only over-counts on invalid input, never under-counts on a valid prefix).

use std::fmt;

/// Most nested arrays/objects accepted (the top-level container counts as 1), as serde_json's
/// default recursion limit.
pub const MAX_DEPTH: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep;

impl fmt::Display for TooDeep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JSON nested deeper than {MAX_DEPTH} levels")
    }
}

/// Fail if arrays/objects in `json` nest deeper than [`MAX_DEPTH`] anywhere (brackets inside
/// strings do not count; every byte is covered, also after the top-level value).
pub fn check(json: &[u8]) -> Result<(), TooDeep> {
    // The depth never exceeds the number of opening brackets. Most request bodies have fewer
    // than MAX_DEPTH of them, and counting (SIMD memchr, stops at MAX_DEPTH + 1) costs about a
    // quarter of the scan.
    let opens = memchr::memchr2_iter(b'[', b'{', json)
        .take(MAX_DEPTH + 1)
        .count();
    if opens <= MAX_DEPTH {
        return Ok(());
    }
    scan(json)
}

/// The depth scan proper: one pass, strings skipped with `memchr` (escapes honoured).
fn scan(json: &[u8]) -> Result<(), TooDeep> {
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = json.get(i) {
        i += 1;
        match b {
            b'"' => {
                // Skip the string: find its closing quote, stepping over `\x` escapes.
                loop {
                    let rest = json.get(i..).unwrap_or_default();
                    match memchr::memchr2(b'"', b'\\', rest) {
                        Some(j) if rest[j] == b'\\' => i += j + 2,
                        Some(j) => {
                            i += j + 1;
                            break;
                        }
                        // Unterminated string: invalid JSON, which the parser reports; nothing
                        // after it can be structure.
                        None => return Ok(()),
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(TooDeep);
                }
            }
            // A close at depth 0 is invalid JSON; the parser reports it.
            b']' | b'}' if depth > 0 => depth -= 1,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nest(open: &str, close: &str, n: usize) -> String {
        format!("{}{}", open.repeat(n), close.repeat(n))
    }

    #[test]
    fn depth_table() {
        for ok in [
            &b""[..],
            b"  1 ",
            br#" {"a":[1,{"b":"]}"}]} "#,
            br#"{"a":"\"[[[[\\"} x"#,
            br#"{"a":"unterminated"#,
            b"]]]{}",
            br#"{"a":"\"#,
        ] {
            assert_eq!(check(ok), Ok(()), "{}", String::from_utf8_lossy(ok));
            assert_eq!(scan(ok), Ok(()), "{}", String::from_utf8_lossy(ok));
        }
        let ok = nest("[", "]", MAX_DEPTH);
        assert_eq!(check(ok.as_bytes()), Ok(()));
        // Many brackets (past the counting fast path), little depth.
        let wide = format!("[{}1]", "[],{},".repeat(500));
        assert_eq!(check(wide.as_bytes()), Ok(()));
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let deep = nest(open, close, MAX_DEPTH + 1);
            assert_eq!(check(deep.as_bytes()), Err(TooDeep), "{open}");
            let deep = nest(open, close, 12_000);
            assert_eq!(check(deep.as_bytes()), Err(TooDeep), "{open}");
        }
        // Deep after the top-level value (trailing garbage) is still refused.
        let tail = format!("{{}} {}", nest("[", "]", 200));
        assert_eq!(check(tail.as_bytes()), Err(TooDeep));
        // Brackets in strings do not count, escaped quotes do not end a string.
        let quoted = format!("{{\"a\":\"\\\"{}\"}}", "[".repeat(1000));
        assert_eq!(check(quoted.as_bytes()), Ok(()));
        let unquoted = format!("{{\"a\":\"\\\\\"{}}}", "[".repeat(1000));
        assert_eq!(check(unquoted.as_bytes()), Err(TooDeep));
    }
}
