//! Server-Sent Events framing: an incremental decoder (per the WHATWG
//! `text/event-stream` rules) and an encoder.
//!
//! The decoder buffers only incomplete lines, so splitting the input at any
//! byte offset yields identical events. Lines end with `\n`, `\r\n` or `\r`
//! (a `\r` at the end of one feed followed by `\n` at the start of the next
//! counts once). Comments (`:`) and `retry:` are ignored; `id:` is tracked.
//!
//! Must not: perform IO, interpret event payloads, or allocate beyond the
//! pending-line buffer and the events it returns.

use std::collections::VecDeque;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

impl SseEvent {
    /// Build an event.
    pub fn new(event: Option<&str>, data: &str) -> Self {
        SseEvent {
            event: event.map(str::to_string),
            data: data.to_string(),
        }
    }
}

/// Incremental SSE decoder.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    skip_lf: bool,
    started: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    last_id: Option<String>,
    ready: VecDeque<SseEvent>,
}

impl SseDecoder {
    /// A decoder with no pending input.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed raw bytes; complete events become available via
    /// [`SseDecoder::next_event`].
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut input = bytes;
        if self.skip_lf && !input.is_empty() {
            self.skip_lf = false;
            if input.first() == Some(&b'\n') {
                input = input.get(1..).unwrap_or_default();
            }
        }
        while let Some(pos) = memchr::memchr2(b'\n', b'\r', input) {
            let (line, rest) = input.split_at(pos);
            let is_cr = rest.first() == Some(&b'\r');
            let mut rest = rest.get(1..).unwrap_or_default();
            if is_cr {
                if rest.first() == Some(&b'\n') {
                    rest = rest.get(1..).unwrap_or_default();
                } else if rest.is_empty() {
                    self.skip_lf = true;
                }
            }
            if self.buf.is_empty() {
                self.process_line(line);
            } else {
                let mut full = std::mem::take(&mut self.buf);
                full.extend_from_slice(line);
                self.process_line(&full);
            }
            input = rest;
        }
        self.buf.extend_from_slice(input);
    }

    /// The next complete event, if any.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        self.ready.pop_front()
    }

    /// End of input: a final unterminated line is processed and a pending
    /// event is dispatched (lenient: the spec would discard it, but several
    /// upstreams omit the final blank line).
    pub fn finish(&mut self) {
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            self.process_line(&line);
        }
        self.dispatch();
        self.skip_lf = false;
    }

    /// The last `id:` seen (the SSE "last event ID").
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Bytes held for an incomplete line.
    pub fn pending_bytes(&self) -> usize {
        self.buf.len() + self.data.len()
    }

    fn process_line(&mut self, mut line: &[u8]) {
        if !self.started {
            self.started = true;
            if let Some(rest) = line.strip_prefix(b"\xEF\xBB\xBF") {
                line = rest;
            }
        }
        if line.is_empty() {
            self.dispatch();
            return;
        }
        if line.first() == Some(&b':') {
            return;
        }
        let (name, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let (n, v) = line.split_at(i);
                let v = v.get(1..).unwrap_or_default();
                (n, v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                push_lossy(&mut self.data, value);
                self.has_data = true;
            }
            b"event" => self.event = Some(String::from_utf8_lossy(value).into_owned()),
            b"id" if !value.contains(&0) => {
                self.last_id = Some(String::from_utf8_lossy(value).into_owned());
            }
            _ => {}
        }
    }

    fn dispatch(&mut self) {
        let event = self.event.take();
        if !self.has_data {
            return;
        }
        self.has_data = false;
        self.ready.push_back(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
        });
    }
}

/// Append `bytes` to `s`, invalid UTF-8 replaced by U+FFFD. Valid input (every event of a
/// well-behaved upstream) takes `str::from_utf8`'s fast check instead of the lossy decoder's
/// chunk iterator (per streamed token on translated streams).
fn push_lossy(s: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(v) => s.push_str(v),
        Err(_) => s.push_str(&String::from_utf8_lossy(bytes)),
    }
}

/// Append one SSE event to `out`: an optional `event:` line, one `data:` line
/// per line of `data`, and the blank line.
pub fn encode_event(event: Option<&str>, data: &str, out: &mut Vec<u8>) {
    if let Some(e) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(e.as_bytes());
        out.push(b'\n');
    }
    for line in data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.strip_suffix('\r').unwrap_or(line).as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    const INPUT: &[u8] = b"\xEF\xBB\xBF: comment\r\nevent: message_start\r\ndata: {\"a\":1}\r\n\r\nid: 7\ndata: line1\ndata: line2\n\n:keepalive\n\nevent: x\rdata:nospace\r\rdata: \xC3\xA9t\xC3\xA9\n\ndata\n\nretry: 10\nevent: lone\n\ndata: [DONE]\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent::new(Some("message_start"), "{\"a\":1}"),
            SseEvent::new(None, "line1\nline2"),
            SseEvent::new(Some("x"), "nospace"),
            SseEvent::new(None, "été"),
            SseEvent::new(None, ""),
            SseEvent::new(None, "[DONE]"),
        ]
    }

    fn drain(d: &mut SseDecoder, out: &mut Vec<SseEvent>) {
        while let Some(e) = d.next_event() {
            out.push(e);
        }
    }

    #[test]
    fn whole() {
        let mut d = SseDecoder::new();
        d.feed(INPUT);
        let mut got = Vec::new();
        drain(&mut d, &mut got);
        assert_eq!(got, expected());
        assert_eq!(d.last_event_id(), Some("7"));
    }

    #[test]
    fn every_split_point() {
        for i in 0..=INPUT.len() {
            for j in i..=INPUT.len() {
                let mut d = SseDecoder::new();
                let mut got = Vec::new();
                d.feed(&INPUT[..i]);
                drain(&mut d, &mut got);
                d.feed(&INPUT[i..j]);
                drain(&mut d, &mut got);
                d.feed(&INPUT[j..]);
                drain(&mut d, &mut got);
                assert_eq!(got, expected(), "split at {i},{j}");
            }
        }
    }

    #[test]
    fn single_bytes() {
        let mut d = SseDecoder::new();
        let mut got = Vec::new();
        for b in INPUT {
            d.feed(std::slice::from_ref(b));
            drain(&mut d, &mut got);
        }
        assert_eq!(got, expected());
    }

    #[test]
    fn crlf_split_between_cr_and_lf() {
        let mut d = SseDecoder::new();
        d.feed(b"data: a\r");
        d.feed(b"\n\r");
        d.feed(b"\ndata: b\r\n\r\n");
        let mut got = Vec::new();
        drain(&mut d, &mut got);
        assert_eq!(
            got,
            vec![SseEvent::new(None, "a"), SseEvent::new(None, "b")]
        );
    }

    #[test]
    fn finish_flushes_unterminated() {
        let mut d = SseDecoder::new();
        d.feed(b"data: [DONE]");
        assert!(d.next_event().is_none());
        d.finish();
        assert_eq!(d.next_event(), Some(SseEvent::new(None, "[DONE]")));
    }

    #[test]
    fn invalid_utf8_in_data_becomes_replacement_characters() {
        let mut d = SseDecoder::new();
        d.feed(b"data: a\xFFb\xC3\n\ndata: ok \xC3\xA9\n\n");
        let mut got = Vec::new();
        drain(&mut d, &mut got);
        assert_eq!(
            got,
            vec![
                SseEvent::new(None, "a\u{FFFD}b\u{FFFD}"),
                SseEvent::new(None, "ok é")
            ]
        );
    }

    #[test]
    fn encode_roundtrip() {
        let mut out = Vec::new();
        encode_event(Some("e"), "a\nb", &mut out);
        encode_event(None, "{}", &mut out);
        assert_eq!(out, b"event: e\ndata: a\ndata: b\n\ndata: {}\n\n");
        let mut d = SseDecoder::new();
        d.feed(&out);
        assert_eq!(d.next_event(), Some(SseEvent::new(Some("e"), "a\nb")));
        assert_eq!(d.next_event(), Some(SseEvent::new(None, "{}")));
    }
}
