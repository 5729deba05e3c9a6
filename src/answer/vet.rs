//! Vetting same-dialect upstream answers before they are relayed (the passthrough path forwards
//! bytes it does not parse, so these checks are all that stands between a broken upstream and a
//! JSON decode error in the client's SDK):
//! - [`json`]: a whole body is one JSON value (`json_check`: one flat pass, UTF-8 and the
//!   `nesting` bound included), for non-stream answers that fit in one relay chunk;
//! - [`Scan`]: an incremental structural check for larger bodies, fed piece by piece as they
//!   are relayed (one object or array, brackets matched and nested at most `nesting::MAX_DEPTH`
//!   deep, strings closed, nothing but whitespace after it) — it catches truncated, cut or
//!   non-JSON bodies, not bad tokens inside a well-bracketed one;
//! - [`sse_events`]: each whole SSE event's `data` is one JSON value (`[DONE]` excepted);
//! - [`error_body`]: whether an upstream error body is already in the client dialect's error
//!   shape (then it is relayed byte for byte) or must be replaced.
//!
//! Owns: those decisions. Must not: do IO, log, or build client answers (`relay` does).

use serde_json::Value;

use crate::answer::json_check::Invalid;
use crate::dialect::{sse, Dialect};
use crate::util::nesting::{self, MAX_DEPTH};

/// Whether `ct` (a Content-Type value) names JSON: `application/json`, `…/…+json`, any
/// parameters.
pub fn is_json_type(ct: &[u8]) -> bool {
    let media = ct.split(|&b| b == b';').next().unwrap_or_default();
    let media = crate::http::head::trim(media);
    let ends =
        |s: &[u8]| media.len() >= s.len() && media[media.len() - s.len()..].eq_ignore_ascii_case(s);
    ends(b"/json") || ends(b"+json")
}

/// `body` is exactly one JSON value (surrounding whitespace allowed), valid UTF-8, nested at
/// most `nesting::MAX_DEPTH` deep. The error says why (no body bytes in it: it is logged).
pub fn json(body: &[u8]) -> Result<(), String> {
    // Full validation (strings, numbers, literals, UTF-8, trailing bytes, the depth bound) in
    // one flat pass; nothing is built.
    match crate::answer::json_check::check(body) {
        Ok(()) => Ok(()),
        Err(Invalid::Eof) => Err("not valid JSON: it ends early".into()),
        Err(Invalid::At(at)) => Err(format!("not valid JSON (at byte {at})")),
        Err(Invalid::TooDeep) => Err(nesting::TooDeep.to_string()),
    }
}

/// Incremental structural check of one JSON object or array arriving in pieces: O(1) state,
/// strings skipped with `memchr`. Feed every piece, then [`Scan::finish`] at the end.
#[derive(Debug, Default, Clone)]
pub struct Scan {
    depth: usize,
    /// Bit `d` set: the container at depth `d + 1` is an object (for bracket matching).
    objects: u128,
    in_string: bool,
    escaped: bool,
    started: bool,
    done: bool,
}

impl Scan {
    pub fn new() -> Scan {
        Scan::default()
    }

    /// Check the next piece of the body.
    pub fn feed(&mut self, piece: &[u8]) -> Result<(), &'static str> {
        let len = piece.len();
        // Inside the value only quotes and brackets matter: jump to the next one (SIMD). The
        // next `"`/`[`/`]` and the next `{`/`}` are cached separately (a search restarts only
        // once its hit is passed, so the piece is searched for each set once: linear).
        let (mut next_qs, mut next_brace) = (None::<usize>, None::<usize>);
        let mut i = 0;
        while i < len {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    i += 1;
                    continue;
                }
                let rest = piece.get(i..).unwrap_or_default();
                match memchr::memchr2(b'"', b'\\', rest) {
                    None => return Ok(()),
                    Some(j) => {
                        if rest.get(j) == Some(&b'\\') {
                            self.escaped = true;
                        } else {
                            self.in_string = false;
                        }
                        i += j + 1;
                    }
                }
                continue;
            }
            if self.started && !self.done {
                let rest = piece.get(i..).unwrap_or_default();
                let q = match next_qs {
                    Some(p) if p >= i => p,
                    _ => memchr::memchr3(b'"', b'[', b']', rest).map_or(len, |j| i + j),
                };
                let b = match next_brace {
                    Some(p) if p >= i => p,
                    _ => memchr::memchr2(b'{', b'}', rest).map_or(len, |j| i + j),
                };
                (next_qs, next_brace) = (Some(q), Some(b));
                i = q.min(b);
                if i >= len {
                    break;
                }
            }
            let b = piece.get(i).copied().unwrap_or_default();
            i += 1;
            match b {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                _ if self.done => return Err("data after the JSON value"),
                b'{' | b'[' => {
                    if self.depth >= MAX_DEPTH {
                        return Err("JSON nested too deep");
                    }
                    let bit = 1u128 << self.depth;
                    if b == b'{' {
                        self.objects |= bit;
                    } else {
                        self.objects &= !bit;
                    }
                    self.depth += 1;
                    self.started = true;
                }
                b'}' | b']' => {
                    if self.depth == 0 {
                        return Err("unbalanced JSON brackets");
                    }
                    self.depth -= 1;
                    let object = self.objects & (1u128 << self.depth) != 0;
                    if object != (b == b'}') {
                        return Err("mismatched JSON brackets");
                    }
                    self.done = self.depth == 0;
                }
                _ if !self.started => return Err("not a JSON object or array"),
                b'"' => self.in_string = true,
                _ => {}
            }
        }
        Ok(())
    }

    /// The body ended: it must have held one whole object or array.
    pub fn finish(&self) -> Result<(), &'static str> {
        if self.done {
            Ok(())
        } else if self.started {
            Err("the JSON value ends early")
        } else {
            Err("empty body")
        }
    }
}

/// Check the `data` of every event in `events` (whole SSE events, each ending with a blank
/// line): where present and not `[DONE]`, it must be one JSON value (see [`json`]). On the
/// first bad event: its start offset in `events` and why.
pub fn sse_events(events: &[u8]) -> Result<(), (usize, String)> {
    let mut start = 0;
    let mut joined = Vec::new();
    while start < events.len() {
        let rest = events.get(start..).unwrap_or_default();
        // the event's end and its `data` lines (joined by `\n`, as SSE says, when there are
        // several) in one pass
        let (len, data) = sse::first_event(rest, &mut joined);
        check_data(data).map_err(|why| (start, why))?;
        start += len.max(1);
    }
    Ok(())
}

/// One event's data, if it has any.
fn check_data(data: Option<&[u8]>) -> Result<(), String> {
    let Some(data) = data else {
        return Ok(()); // comments, `event:`-only events, keep-alives
    };
    if crate::http::head::trim(data) == b"[DONE]" {
        return Ok(());
    }
    json(data).map_err(|why| format!("an upstream stream event's data is {why}"))
}

/// What to do with an upstream error body (status ≥ 400) on the passthrough path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorBody {
    /// A JSON error already in the client dialect's shape: relay it as is.
    Relay,
    /// JSON in another shape carrying a message: answer in the client's dialect with it.
    Message(String),
    /// HTML, text, empty, or JSON without a message: answer with a generic error (the body
    /// goes to the log, never to the client: proxies' pages name hosts).
    Generic,
}

/// Decide what an upstream error body becomes for a client of `client`'s dialect.
pub fn error_body(client: Dialect, body: &[u8]) -> ErrorBody {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return ErrorBody::Generic;
    };
    if crate::dialect::is_error_shape(client, &v) {
        return ErrorBody::Relay;
    }
    if !v.is_object() && !v.is_array() {
        return ErrorBody::Generic;
    }
    match crate::dialect::error_message(&v) {
        Some(m) if !m.trim().is_empty() => ErrorBody::Message(m.to_string()),
        _ => ErrorBody::Generic,
    }
}

pub use crate::forward::report::excerpt;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_types() {
        for ct in [
            &b"application/json"[..],
            b"application/json; charset=utf-8",
            b"Application/JSON",
            b"application/problem+json",
        ] {
            assert!(is_json_type(ct), "{}", String::from_utf8_lossy(ct));
        }
        for ct in [
            &b"text/html"[..],
            b"text/event-stream",
            b"application/jsonl",
            b"",
        ] {
            assert!(!is_json_type(ct), "{}", String::from_utf8_lossy(ct));
        }
    }

    #[test]
    fn whole_bodies() {
        for ok in [
            &br#"{"a":[1,2,{"b":"\"}"}]}"#[..],
            b" [] \n",
            b"1",
            b"\"x\"",
        ] {
            assert_eq!(json(ok), Ok(()), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &br#"{"id":"c1","choices":[{"mess"#[..],
            b"",
            b"<html>502</html>",
            br#"{"a":tru}"#,
            br#"{"a":1} {"b":2}"#,
            b"{\"a\":\"\xff\"}",
        ] {
            assert!(json(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(json(deep.as_bytes()).is_err());
        // No body bytes in the reason (it is logged).
        let why = json(br#"{"secret":tru}"#).unwrap_err();
        assert!(!why.contains("secret"), "{why}");
    }

    fn scan_pieces(body: &[u8], piece: usize) -> Result<(), &'static str> {
        let mut s = Scan::new();
        for p in body.chunks(piece.max(1)) {
            s.feed(p)?;
        }
        s.finish()
    }

    #[test]
    fn incremental_scan() {
        let good = br#" {"a":"x\"}]{[\\","b":[1,{"c":null}],"d":"\u00e9"} "#;
        for n in 1..good.len() {
            assert_eq!(scan_pieces(good, n), Ok(()), "pieces of {n}");
        }
        assert_eq!(scan_pieces(b"[[],{}]", 3), Ok(()));
        // Brackets and escaped quotes inside strings, every split, every truncation.
        let doc = br#"{"a":[{"b":"}{[\"]"},[],{}],"c":"\\","d":[1,-2.5e3,true,null]}"#;
        assert_eq!(json(doc), Ok(()));
        for n in 1..=doc.len() {
            assert_eq!(scan_pieces(doc, n), Ok(()), "pieces of {n}");
        }
        for k in 0..doc.len() {
            assert!(scan_pieces(&doc[..k], 4).is_err(), "a prefix of {k} bytes");
        }
        let bad: &[(&[u8], &str)] = &[
            (br#"{"a":[1,2"#, "the JSON value ends early"),
            (br#"{"a":"unterminated"#, "the JSON value ends early"),
            (br#"{"a":1} x"#, "data after the JSON value"),
            (br#"{"a":1}{}"#, "data after the JSON value"),
            (br#"{"a":[1}"#, "mismatched JSON brackets"),
            (b"]", "unbalanced JSON brackets"),
            (b"<html>", "not a JSON object or array"),
            (b"  ", "empty body"),
        ];
        for &(body, why) in bad {
            for n in [1, 2, 5, 100] {
                assert_eq!(
                    scan_pieces(body, n),
                    Err(why),
                    "{} in pieces of {n}",
                    String::from_utf8_lossy(body)
                );
            }
        }
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(scan_pieces(deep.as_bytes(), 7), Ok(()));
        let deeper = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(
            scan_pieces(deeper.as_bytes(), 7),
            Err("JSON nested too deep")
        );
    }

    /// On real documents (the golden files): the structural scan accepts every valid JSON
    /// object in any split, rejects every strict prefix, and agrees with the whole-body check;
    /// the golden SSE transcripts' events all pass.
    #[test]
    fn golden_files() {
        let mut files = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/golden"
        ))];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else {
                    files.push(p);
                }
            }
        }
        let (mut docs, mut streams) = (0, 0);
        for p in files {
            let body = std::fs::read(&p).unwrap();
            let name = p.display().to_string();
            match p.extension().and_then(|e| e.to_str()) {
                Some("json") => {
                    assert_eq!(json(&body), Ok(()), "{name}");
                    for n in [1, 7, 64, 4096] {
                        assert_eq!(scan_pieces(&body, n), Ok(()), "{name} in pieces of {n}");
                    }
                    let end = body.iter().rposition(|b| !b.is_ascii_whitespace()).unwrap();
                    for k in (0..end).step_by(3) {
                        assert!(scan_pieces(&body[..k], 5).is_err(), "{name}: prefix {k}");
                    }
                    docs += 1;
                }
                Some("sse") => {
                    assert_eq!(sse_events(&body), Ok(()), "{name}");
                    streams += 1;
                }
                _ => {}
            }
        }
        assert!(
            docs > 20 && streams > 10,
            "{docs} documents, {streams} streams"
        );
    }

    #[test]
    fn sse_event_data() {
        let ok =
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n: comment\n\ndata: {\"a\":\ndata: 1}\n\n\
                   event: x\r\ndata:[1]\r\n\r\ndata: [DONE]\n\n";
        assert_eq!(sse_events(ok), Ok(()));
        let first = b"data: {\"id\":\"c1\"}\n\n";
        let mut evs = first.to_vec();
        evs.extend_from_slice(b"data: {\"id\":\"c1\",\"cho\n\ndata: {}\n\n");
        let (at, why) = sse_events(&evs).unwrap_err();
        assert_eq!(at, first.len());
        assert!(why.contains("ends early"), "{why}");
        let (at, _) = sse_events(b"event: e\r\ndata: <b>\r\n\r\n").unwrap_err();
        assert_eq!(at, 0);
        assert!(sse_events(b"data\n\n").is_err(), "empty data is not JSON");
    }

    #[test]
    fn error_bodies() {
        let oa = br#"{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":null}}"#;
        let an = br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
        assert_eq!(error_body(Dialect::Chat, oa), ErrorBody::Relay);
        assert_eq!(error_body(Dialect::Responses, oa), ErrorBody::Relay);
        assert_eq!(error_body(Dialect::Messages, an), ErrorBody::Relay);
        // The other dialect's shape, or a bare message: reshaped with the message.
        let m = ErrorBody::Message("slow down".into());
        assert_eq!(error_body(Dialect::Messages, oa), m);
        assert_eq!(error_body(Dialect::Chat, br#"{"detail":"slow down"}"#), m);
        assert_eq!(
            error_body(
                Dialect::Chat,
                br#"{"object":"error","message":"slow down"}"#
            ),
            m
        );
        for generic in [
            &b"<html><body>502 Bad Gateway at 10.0.0.7</body></html>"[..],
            b"",
            b"upstream connect error",
            b"{}",
            b"\"oops\"",
            br#"{"error":{"message":"x"}"#,
            br#"{"error":{"message":""}}"#,
        ] {
            assert_eq!(
                error_body(Dialect::Chat, generic),
                ErrorBody::Generic,
                "{}",
                String::from_utf8_lossy(generic)
            );
        }
    }

    #[test]
    fn excerpts_are_short_and_printable() {
        let e = excerpt(b"<html>\r\n\x00x");
        assert_eq!(e, "<html>\\r\\n\\0x");
        assert!(excerpt(&[b'a'; 1000]).chars().count() <= 201);
    }
}
