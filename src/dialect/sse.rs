//! Server-Sent Events framing, the one codec every stage uses: an incremental decoder (per
//! the WHATWG `text/event-stream` rules), an encoder, and the raw-event framing of relayed
//! bytes (where an event ends, its `event:` name and joined `data:` lines, read in place).
//!
//! Raw framing (`event_len`, `last_event_end`, `events`, `data`, `name`, and `first_event`:
//! an event's length and data in one pass) works on events
//! kept byte for byte: an event ends with a blank line, a `\n` followed by `\n` or `\r\n`
//! (so `\n\n` and `\r\n\r\n`). CR-only line ends are for the decoder alone.
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

/// Append one SSE event holding `v` as compact JSON (one `data:` line: JSON text has no raw
/// newline), written straight into `out`.
pub fn encode_json(event: Option<&str>, v: &serde_json::Value, out: &mut Vec<u8>) {
    if let Some(e) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(e.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    if serde_json::to_writer(&mut *out, v).is_err() {
        out.extend_from_slice(b"{}");
    }
    out.extend_from_slice(b"\n\n");
}

/// Length of the first whole event of `buf`, its blank line included; `None` while no blank
/// line has arrived.
pub fn event_len(buf: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', buf).find_map(|i| match buf.get(i + 1..) {
        Some([b'\n', ..]) => Some(i + 2),
        Some([b'\r', b'\n', ..]) => Some(i + 3),
        _ => None,
    })
}

/// End offset of the last whole event in `buf` (0 if none): just past its blank line. One
/// backward scan for `\n` that stops at the first blank line from the end.
pub fn last_event_end(buf: &[u8]) -> usize {
    for i in memchr::memrchr_iter(b'\n', buf) {
        let before = buf.get(..i).unwrap_or_default();
        if before.ends_with(b"\n") || before.ends_with(b"\n\r") {
            return i + 1;
        }
    }
    0
}

/// The events of `buf`, each with its blank line (a last piece without one comes last, as
/// it is).
pub fn events(mut buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        if buf.is_empty() {
            return None;
        }
        let (ev, rest) = buf.split_at(event_len(buf).unwrap_or(buf.len()));
        buf = rest;
        Some(ev)
    })
}

/// The lines of one raw event, `\r` line ends stripped (as `split` on `\n` would give them,
/// found by `memchr`: a data line is most of an event's bytes, and a per-byte split cost ~1,200
/// instructions per relayed event).
fn lines(ev: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(ev);
    std::iter::from_fn(move || {
        let r = rest?;
        let line = match memchr::memchr(b'\n', r) {
            Some(i) => {
                let (line, tail) = r.split_at(i);
                rest = tail.get(1..);
                line
            }
            None => {
                rest = None;
                r
            }
        };
        Some(line.strip_suffix(b"\r").unwrap_or(line))
    })
}

/// The value of field `name` on one line (`name: value`, one leading space dropped; a bare
/// `name` line has an empty value).
fn field<'a>(line: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let rest = line.strip_prefix(name)?;
    match rest {
        [] => Some(rest),
        [b':', v @ ..] => Some(v.strip_prefix(b" ").unwrap_or(v)),
        _ => None,
    }
}

/// One raw event's `event:` name (the last one, as the decoder keeps it).
pub fn name(ev: &[u8]) -> Option<&[u8]> {
    lines(ev).filter_map(|l| field(l, b"event")).last()
}

/// One raw event's data: its `data:` lines joined by `\n` (in `joined` when there are several,
/// else borrowed from `ev`); `None` for an event without a data line (a comment, a
/// keep-alive, an `event:`-only event).
pub fn data<'a>(ev: &'a [u8], joined: &'a mut Vec<u8>) -> Option<&'a [u8]> {
    let mut values = lines(ev).filter_map(|l| field(l, b"data"));
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(first);
    };
    joined.clear();
    joined.extend_from_slice(first);
    for v in std::iter::once(second).chain(values) {
        joined.push(b'\n');
        joined.extend_from_slice(v);
    }
    Some(joined)
}

/// The first event of `buf` in one pass over its lines: its length, as [`event_len`] gives
/// it (all of `buf` when no blank line has arrived), and its data, as [`data`] gives it for
/// those bytes. The vetting of relayed events reads both; one `memchr` per line (a Chat event
/// is one line and its blank line) instead of one walk for the end and another for the data.
pub fn first_event<'a>(buf: &'a [u8], joined: &'a mut Vec<u8>) -> (usize, Option<&'a [u8]>) {
    let mut first: Option<&'a [u8]> = None;
    let mut several = false;
    let mut at = 0;
    let len = loop {
        let rest = buf.get(at..).unwrap_or_default();
        let (line, next) = match memchr::memchr(b'\n', rest) {
            Some(j) => (rest.get(..j).unwrap_or_default(), Some(at + j + 1)),
            None => (rest, None),
        };
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = field(line, b"data") {
            match first {
                None => first = Some(v),
                Some(f) => {
                    if !several {
                        joined.clear();
                        joined.extend_from_slice(f);
                        several = true;
                    }
                    joined.push(b'\n');
                    joined.extend_from_slice(v);
                }
            }
        }
        let Some(next) = next else { break buf.len() };
        // the line just ended is followed by a blank one: the event ends after it
        match buf.get(next..) {
            Some([b'\n', ..]) => break next + 1,
            Some([b'\r', b'\n', ..]) => break next + 2,
            _ => at = next,
        }
    };
    if several {
        return (len, Some(joined));
    }
    (len, first)
}

/// One raw event as the decoder dispatches it: `None` without a data line, or when its name or
/// data is not UTF-8 (such an event is relayed as it is, never rewritten).
pub fn parse(ev: &[u8]) -> Option<SseEvent> {
    let mut joined = Vec::new();
    let data = std::str::from_utf8(data(ev, &mut joined)?)
        .ok()?
        .to_string();
    let event = match name(ev) {
        Some(n) => Some(std::str::from_utf8(n).ok()?.to_string()),
        None => None,
    };
    Some(SseEvent { event, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_those_of_a_split_on_newline() {
        for ev in [
            &b""[..],
            b"\n",
            b"data: a",
            b"data: a\n\n",
            b"event: x\r\ndata: 1\r\ndata: 2\r\n\r\n",
            b"\n\ndata:\n: c\r\n",
            b"data: {\"a\":\"\\n\"}\n\r\n",
        ] {
            let want: Vec<&[u8]> = ev
                .split(|&b| b == b'\n')
                .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                .collect();
            assert_eq!(lines(ev).collect::<Vec<_>>(), want, "{ev:?}");
        }
    }

    #[test]
    fn raw_framing() {
        let buf = b"event: a\ndata: 1\ndata: 2\n\n: keep\r\n\r\ndata:3\n\r\ndata: cut";
        let evs: Vec<&[u8]> = events(buf).collect();
        assert_eq!(
            evs,
            [
                &b"event: a\ndata: 1\ndata: 2\n\n"[..],
                b": keep\r\n\r\n",
                b"data:3\n\r\n",
                b"data: cut"
            ]
        );
        assert_eq!(event_len(b"data: cut\n"), None);
        assert_eq!(last_event_end(buf), buf.len() - b"data: cut".len());
        assert_eq!(last_event_end(b"data: a\n"), 0);
        let mut j = Vec::new();
        assert_eq!(name(evs[0]), Some(&b"a"[..]));
        assert_eq!(data(evs[0], &mut j), Some(&b"1\n2"[..]));
        assert_eq!(data(evs[1], &mut j), None);
        assert_eq!(data(evs[2], &mut j), Some(&b"3"[..]));
        assert_eq!(data(b"data\n\n", &mut j), Some(&b""[..]));
        assert_eq!(data(b"datax: 1\n\n", &mut j), None);
        assert_eq!(name(evs[2]), None);
        // The raw framing and the decoder agree on every event of a mixed-line-end stream.
        let mut d = SseDecoder::new();
        d.feed(buf);
        d.finish();
        for ev in events(buf) {
            let Some(v) = data(ev, &mut j) else { continue };
            let want = d.next_event().unwrap();
            assert_eq!(v, want.data.as_bytes());
            assert_eq!(
                name(ev).map(|n| n.to_vec()),
                want.clone().event.map(String::into_bytes)
            );
            assert_eq!(parse(ev), Some(want));
        }
        assert_eq!(parse(b": keep\n\n"), None);
        assert_eq!(parse(b"data: \xff\n\n"), None);
    }

    /// `first_event` is `event_len` and `data` in one pass: the same answer on every buffer
    /// over an alphabet of line ends and field pieces (all sequences up to a length).
    #[test]
    fn first_event_is_event_len_and_data() {
        let pieces: &[&[u8]] = &[b"\n", b"\r", b"data", b":", b" ", b"x", b"event: e"];
        let (mut j1, mut j2) = (Vec::new(), Vec::new());
        for len in 0..=6u32 {
            for code in 0..pieces.len().pow(len) {
                let (mut c, mut buf) = (code, Vec::new());
                for _ in 0..len {
                    buf.extend_from_slice(pieces[c % pieces.len()]);
                    c /= pieces.len();
                }
                let n = event_len(&buf).unwrap_or(buf.len());
                let want = data(&buf[..n], &mut j1).map(<[u8]>::to_vec);
                let (got_n, got) = first_event(&buf, &mut j2);
                assert_eq!((got_n, got.map(<[u8]>::to_vec)), (n, want), "{buf:?}");
            }
        }
    }

    #[test]
    fn last_event_end_finds_the_last_blank_line() {
        assert_eq!(last_event_end(b"data: a\n\ndata: b"), 9);
        assert_eq!(last_event_end(b"data: a\r\n\r\n"), 11);
        assert_eq!(last_event_end(b"data: a\n"), 0);
        assert_eq!(last_event_end(b"data: a\n\ndata: b\n\n"), 18);
        // the same answer as a search for each blank-line pattern, on every mix of line ends
        let patterns = |buf: &[u8]| {
            let lf = memchr::memmem::rfind(buf, b"\n\n").map_or(0, |i| i + 2);
            let mixed = memchr::memmem::rfind(buf, b"\n\r\n").map_or(0, |i| i + 3);
            lf.max(mixed)
        };
        let alphabet = [b'\n', b'\r', b'a'];
        for len in 0..=7u32 {
            for code in 0..3usize.pow(len) {
                let (mut c, mut buf) = (code, Vec::new());
                for _ in 0..len {
                    buf.push(alphabet[c % 3]);
                    c /= 3;
                }
                assert_eq!(last_event_end(&buf), patterns(&buf), "{buf:?}");
            }
        }
    }

    #[test]
    fn encode_json_is_encode_event_of_the_compact_text() {
        let v = serde_json::json!({"a": "x\ny", "b": [1, 2]});
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode_json(Some("e"), &v, &mut a);
        encode_event(Some("e"), &v.to_string(), &mut b);
        assert_eq!(a, b);
    }

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
