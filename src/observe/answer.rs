//! What an upstream answer said about itself, for its trace: its id, its finish reasons and,
//! with content capture on, its text — read from the answer's bytes as they pass (non-stream
//! bodies and stream events alike, any dialect), inside the same `feed` call that reads its
//! usage (`governance::usage::UsageScan`), and only for requests that are traced.
//!
//! The bytes are not parsed: one `memchr` pass finds `":` and looks back for a known key name
//! right after an unescaped quote (a key, never text inside a string, whose quotes are
//! escaped), then reads the string value that follows. Keys per dialect:
//! - id: the first `"id"` (OpenAI Chat and Responses, Anthropic: the answer's own id comes
//!   before any tool call's), Gemini's `"responseId"`;
//! - finish reasons: `"finish_reason"`, `"stop_reason"`, `"finishReason"`, `"stopReason"`
//!   (Bedrock Converse), distinct values in order; Responses: its last terminal `"status"`;
//! - text: Chat `"content"`, Messages / Gemini / Converse `"text"`, Responses `"text"` (whole
//!   answers) or `"delta"` (streams, whose `done` events repeat the text).
//!
//! A key cut between two pieces is found in the next one (the last 64 bytes are carried); a
//! string value cut between pieces continues there. Everything is bounded: the id at 128
//! bytes, 8 finish reasons of 64 bytes, the text at the configured capture size (kept as the
//! JSON-escaped bytes the answer sent, cut on an escape and character boundary).
//!
//! Owns: `Facts`. Must not: change the bytes, allocate beyond its bounds, or run for requests
//! that are not traced (its owner holds `None` then).

use crate::dialect::Dialect;

const MAX_ID: usize = 128;
const MAX_REASONS: usize = 8;
const MAX_REASON: usize = 64;
const CARRY: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Id,
    Reason,
    Status,
    Text,
}

/// An answer's id, finish reasons and (optionally) text, as found so far.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    dialect: Option<Dialect>,
    stream: bool,
    /// Text bytes kept at most (`None`: content capture off).
    capture: Option<usize>,
    pub id: Option<Box<str>>,
    pub reasons: Vec<Box<str>>,
    status: Option<&'static str>,
    text: Vec<u8>,
    /// A string value that continues in the next piece: its slot and whether the previous
    /// piece ended on a backslash.
    open: Option<(Slot, bool)>,
    /// The value being read (id, reason, status), until its closing quote.
    value: Vec<u8>,
    carry: Vec<u8>,
    joined: Vec<u8>,
}

impl Facts {
    /// Facts of an answer (`capture`: keep up to this many bytes of its text).
    pub fn new(capture: Option<usize>) -> Facts {
        Facts {
            capture,
            ..Facts::default()
        }
    }

    /// The answer's head arrived: it speaks `dialect`, as a stream or not. What an earlier
    /// answer (a retried attempt) left is forgotten.
    pub fn restart(&mut self, dialect: Dialect, stream: bool) {
        *self = Facts {
            dialect: Some(dialect),
            stream,
            capture: self.capture,
            ..Facts::default()
        };
    }

    /// The answer's finish reasons (Responses: its terminal status).
    pub fn finish_reasons(&self) -> Vec<Box<str>> {
        match (self.reasons.is_empty(), self.status) {
            (true, Some(s)) => vec![s.into()],
            _ => self.reasons.clone(),
        }
    }

    /// The captured text as the contents of a JSON string (escapes kept, never cut inside
    /// one), `None` when content capture is off or the answer had no text.
    pub fn text(&self) -> Option<String> {
        self.capture?;
        if self.text.is_empty() {
            return None;
        }
        let mut t = &self.text[..];
        // a cut escape: drop it (`\`, `\u12`), and then a high surrogate left alone
        while let Some(b) = t.iter().rposition(|&b| b == b'\\') {
            let run = t[..=b].iter().rev().take_while(|&&c| c == b'\\').count();
            let tail = &t[b + 1..];
            let whole = if run % 2 == 0 {
                true
            } else if tail.first() == Some(&b'u') {
                tail.len() >= 5
            } else {
                !tail.is_empty()
            };
            // a high surrogate whose low half was cut off
            let high = run % 2 == 1
                && tail.len() == 5
                && tail[0] == b'u'
                && matches!(tail[1], b'd' | b'D')
                && matches!(tail[2], b'8'..=b'9' | b'a'..=b'b' | b'A'..=b'B');
            if whole && !high {
                break;
            }
            t = &t[..b];
        }
        let s = match std::str::from_utf8(t) {
            Ok(s) => s.to_string(),
            Err(e) => String::from_utf8_lossy(&t[..e.valid_up_to()]).into_owned(),
        };
        Some(s)
    }

    /// Look at the next piece of the answer's body.
    pub fn feed(&mut self, piece: &[u8]) {
        let Some(dialect) = self.dialect else { return };
        if piece.is_empty() {
            return;
        }
        let mut at = 0;
        if let Some((slot, escaped)) = self.open.take() {
            at = self.string(slot, piece, 0, escaped);
            if self.open.is_some() {
                return;
            }
        }
        let rest = &piece[at..];
        if self.carry.is_empty() {
            let end = self.scan(dialect, rest);
            self.keep(rest, end);
        } else {
            let mut joined = std::mem::take(&mut self.joined);
            joined.clear();
            joined.extend_from_slice(&self.carry);
            joined.extend_from_slice(rest);
            let end = self.scan(dialect, &joined);
            self.keep(&joined, end);
            self.joined = joined;
        }
    }

    /// Carry what follows `end` (at most `CARRY` bytes) unless a string is open.
    fn keep(&mut self, b: &[u8], end: usize) {
        self.carry.clear();
        if self.open.is_none() {
            let from = end.max(b.len().saturating_sub(CARRY));
            self.carry.extend_from_slice(&b[from..]);
        }
    }

    /// Find keys in `b`; the offset after the last value read (everything, when a string is
    /// left open).
    fn scan(&mut self, dialect: Dialect, b: &[u8]) -> usize {
        let mut end = 0;
        let mut from = 0;
        // `":` found as a `:` (memchr: no searcher built per call) right after a quote
        while let Some(c) = memchr::memchr(b':', &b[from..]).map(|c| c + from) {
            from = c + 1;
            if c == 0 || b[c - 1] != b'"' {
                continue;
            }
            let i = c - 1;
            let Some(slot) = self.key_before(dialect, &b[..i]) else {
                continue;
            };
            let mut j = i + 2;
            while b
                .get(j)
                .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
            {
                j += 1;
            }
            match b.get(j) {
                None => return end, // the value is in the next piece (the key is carried)
                Some(b'"') => {}
                Some(_) => continue, // null, a number, an object: not a string value
            }
            self.value.clear();
            let after = self.string(slot, b, j + 1, false);
            if self.open.is_some() {
                return b.len();
            }
            end = after;
            from = after.max(from);
        }
        end
    }

    /// The slot of the key ending just before `before` (its closing quote is at `before.len()`).
    fn key_before(&self, dialect: Dialect, before: &[u8]) -> Option<Slot> {
        let key = |k: &[u8]| {
            before.ends_with(k) && {
                let q = before.len() - k.len();
                q >= 1 && before[q - 1] == b'"' && (q < 2 || before[q - 2] != b'\\')
            }
        };
        if self.id.is_none() {
            let id_key: &[u8] = if dialect == Dialect::Gemini {
                b"responseId"
            } else {
                b"id"
            };
            if key(id_key) {
                return Some(Slot::Id);
            }
        }
        if [
            &b"finish_reason"[..],
            b"stop_reason",
            b"finishReason",
            b"stopReason",
        ]
        .iter()
        .any(|k| key(k))
        {
            return Some(Slot::Reason);
        }
        if dialect == Dialect::Responses && key(b"status") {
            return Some(Slot::Status);
        }
        self.capture?;
        let text_key: &[u8] = match (dialect, self.stream) {
            (Dialect::Chat, _) => b"content",
            (Dialect::Responses, true) => b"delta",
            _ => b"text",
        };
        key(text_key).then_some(Slot::Text)
    }

    /// Read a string value's bytes from `b[at..]` (after its opening quote) into its slot; the
    /// offset after its closing quote, or `b.len()` with `open` set when it continues.
    fn string(&mut self, slot: Slot, b: &[u8], at: usize, escaped: bool) -> usize {
        let mut escaped = escaped;
        let mut i = at;
        if escaped && at < b.len() {
            // the byte after a backslash that ended the previous piece
            escaped = false;
            i = at + 1;
        }
        let close = loop {
            let Some(k) = memchr::memchr2(b'"', b'\\', &b[i..]).map(|k| k + i) else {
                break None;
            };
            if b[k] == b'\\' {
                if k + 1 >= b.len() {
                    escaped = true;
                    break None;
                }
                i = k + 2;
                continue;
            }
            break Some(k);
        };
        let (part, next) = match close {
            Some(k) => (&b[at..k], k + 1),
            None => (&b[at..], b.len()),
        };
        match slot {
            Slot::Text => {
                let max = self.capture.unwrap_or(0);
                let room = max.saturating_sub(self.text.len());
                self.text.extend_from_slice(&part[..part.len().min(room)]);
            }
            _ => {
                let room = MAX_ID.saturating_sub(self.value.len());
                self.value.extend_from_slice(&part[..part.len().min(room)]);
            }
        }
        if close.is_none() {
            self.open = Some((slot, escaped));
            return b.len();
        }
        let v = String::from_utf8_lossy(&self.value).into_owned();
        match slot {
            Slot::Id if !v.is_empty() => self.id = Some(v.into()),
            Slot::Reason if self.reasons.len() < MAX_REASONS && !v.is_empty() => {
                let v: Box<str> = v[..floor(&v, MAX_REASON)].into();
                if !self.reasons.contains(&v) {
                    self.reasons.push(v);
                }
            }
            Slot::Status => {
                for s in ["completed", "incomplete", "failed", "cancelled"] {
                    if v == s {
                        self.status = Some(s);
                    }
                }
            }
            _ => {}
        }
        self.value.clear();
        next
    }
}

/// The largest char boundary of `s` at most `max`.
fn floor(s: &str, max: usize) -> usize {
    let mut n = max.min(s.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(dialect: Dialect, stream: bool, capture: Option<usize>, pieces: &[&[u8]]) -> Facts {
        let mut f = Facts::new(capture);
        f.restart(dialect, stream);
        for p in pieces {
            f.feed(p);
        }
        f
    }

    /// Every cut of `body` into two pieces, and byte by byte, finds the same facts.
    fn every_cut(
        dialect: Dialect,
        stream: bool,
        body: &[u8],
    ) -> (Option<Box<str>>, Vec<Box<str>>, Option<String>) {
        let whole = facts(dialect, stream, Some(4096), &[body]);
        let want = (whole.id.clone(), whole.finish_reasons(), whole.text());
        for cut in 0..body.len() {
            let f = facts(dialect, stream, Some(4096), &[&body[..cut], &body[cut..]]);
            assert_eq!(
                (f.id.clone(), f.finish_reasons(), f.text()),
                want,
                "cut at {cut}"
            );
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        let f = facts(dialect, stream, Some(4096), &bytes);
        assert_eq!(
            (f.id.clone(), f.finish_reasons(), f.text()),
            want,
            "byte by byte"
        );
        want
    }

    /// [`every_cut`], then the facts it found: the id, the one finish reason, the text.
    fn expect(dialect: Dialect, stream: bool, body: &[u8], (id, reason, text): (&str, &str, &str)) {
        let (i, r, t) = every_cut(dialect, stream, body);
        assert_eq!(
            (i.as_deref(), t.as_deref()),
            (Some(id), Some(text)),
            "{dialect:?}"
        );
        assert_eq!(r, vec![Box::<str>::from(reason)], "{dialect:?}");
    }

    #[test]
    fn chat_answer_and_stream() {
        let body = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"you\"\n","tool_calls":[{"id":"call_9"}]},"finish_reason":"stop"}]}"#;
        expect(
            Dialect::Chat,
            false,
            body,
            ("chatcmpl-1", "stop", r#"Hi \"you\"\n"#),
        );
        let stream = b"data: {\"id\":\"c2\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\ndata: {\"id\":\"c2\",\"choices\":[{\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\ndata: {\"id\":\"c2\",\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
        expect(Dialect::Chat, true, stream, ("c2", "length", "Hello"));
    }

    #[test]
    fn other_dialects() {
        let msg = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[],\"stop_reason\":null}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n";
        expect(Dialect::Messages, true, msg, ("msg_1", "end_turn", "ok"));
        let gem = br#"{"candidates":[{"content":{"parts":[{"text":"a"},{"text":"b"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{},"responseId":"r-1"}"#;
        expect(Dialect::Gemini, false, gem, ("r-1", "STOP", "ab"));
        let resp = br#"{"id":"resp_1","status":"completed","output":[{"id":"msg_2","status":"completed","content":[{"type":"output_text","text":"yes"}]}],"text":{"format":{"type":"text"}}}"#;
        expect(
            Dialect::Responses,
            false,
            resp,
            ("resp_1", "completed", "yes"),
        );
        let resp_stream = b"data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_2\",\"status\":\"in_progress\"}}\n\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"y\"}\n\ndata: {\"type\":\"response.output_text.done\",\"text\":\"y\"}\n\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_2\",\"status\":\"incomplete\",\"output\":[{\"content\":[{\"text\":\"y\"}]}]}}\n\n";
        expect(
            Dialect::Responses,
            true,
            resp_stream,
            ("resp_2", "incomplete", "y"),
        );
    }

    #[test]
    fn bounded_hostile_and_off() {
        // keys inside strings are not keys; text off without capture
        let body =
            br#"{"x":"say \"id\":\"no\" and \"finish_reason\":\"no\"","id":"yes","content":"c"}"#;
        let f = facts(Dialect::Chat, false, None, &[body]);
        assert_eq!(f.id.as_deref(), Some("yes"));
        assert!(f.finish_reasons().is_empty());
        assert_eq!(f.text(), None);
        // the text is cut at the capture size, never inside an escape
        let long = br#"{"content":"abc\u00e9d\ud83d\ude00f"}"#;
        for max in 0..24 {
            let t = facts(Dialect::Chat, false, Some(max), &[long])
                .text()
                .unwrap_or_default();
            assert!(t.len() <= max);
            assert!(
                serde_json::from_str::<String>(&format!("\"{t}\"")).is_ok(),
                "{max}: {t}"
            );
        }
        // an id that never ends stays bounded
        let mut huge = b"{\"id\":\"".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 10_000));
        let f = facts(Dialect::Chat, false, None, &[&huge, &huge[7..]]);
        assert!(f.id.is_none() && f.value.len() <= MAX_ID);
        // not started (no head yet): nothing read
        let mut f = Facts::new(Some(10));
        f.feed(br#"{"id":"x"}"#);
        assert!(f.id.is_none());
    }
}
