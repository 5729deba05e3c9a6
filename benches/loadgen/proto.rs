//! Wire-level pieces of the load generator: request bodies, HTTP/1.1 response framing
//! (Content-Length, chunked, close-delimited) and an incremental SSE event scanner.
//!
//! Nothing here allocates per request on the non-streaming path; the SSE scanner reuses its
//! line/data buffers for the life of one stream.

use std::fmt;

/// API dialect of the generated requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Chat,
    Responses,
    Messages,
}

impl Workload {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "chat" => Some(Self::Chat),
            "responses" => Some(Self::Responses),
            "messages" => Some(Self::Messages),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Responses => "responses",
            Self::Messages => "messages",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Responses => "/v1/responses",
            Self::Messages => "/v1/messages",
        }
    }
}

/// Payload size class: (input bytes, requested output tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Small,
    Medium,
    Large,
}

impl Size {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "small" => Some(Self::Small),
            "medium" => Some(Self::Medium),
            "large" => Some(Self::Large),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Small => "small",
            Self::Medium => "medium",
            Self::Large => "large",
        }
    }

    pub fn input_tokens(self) -> usize {
        match self {
            Self::Small => 200,
            Self::Medium => 2_000,
            Self::Large => 20_000,
        }
    }

    pub fn output_tokens(self) -> usize {
        match self {
            Self::Small => 100,
            Self::Medium => 500,
            Self::Large => 1_000,
        }
    }
}

/// Deterministic English-ish prompt of exactly `bytes` ASCII bytes (~4 bytes per token).
pub fn prompt(bytes: usize) -> String {
    const TEXT: &str = "The quick brown fox jumps over the lazy dog while the patient \
        engineer measures every request twice and writes the numbers down. ";
    let mut s = String::with_capacity(bytes + TEXT.len());
    while s.len() < bytes {
        s.push_str(TEXT);
    }
    s.truncate(bytes);
    s
}

/// Everything needed to build the request bytes for one target.
pub struct RequestSpec<'a> {
    pub workload: Workload,
    pub stream: bool,
    pub size: Size,
    pub model: &'a str,
    /// Overrides the size's output tokens.
    pub output_tokens: Option<usize>,
    pub api_key: &'a str,
    /// Extra request header lines (`Name: value`), sent to every target.
    pub headers: &'a [String],
}

/// JSON body of the request.
pub fn build_body(spec: &RequestSpec<'_>) -> Vec<u8> {
    let text = prompt(spec.size.input_tokens() * 4);
    let out = spec.output_tokens.unwrap_or(spec.size.output_tokens());
    let v = match spec.workload {
        Workload::Chat => serde_json::json!({
            "model": spec.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": out,
            "stream": spec.stream,
        }),
        Workload::Responses => serde_json::json!({
            "model": spec.model,
            "input": text,
            "max_output_tokens": out,
            "stream": spec.stream,
        }),
        Workload::Messages => serde_json::json!({
            "model": spec.model,
            "max_tokens": out,
            "messages": [{"role": "user", "content": text}],
            "stream": spec.stream,
        }),
    };
    // serde_json::to_vec of a Value cannot fail.
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Full HTTP/1.1 request (head + body), built once per target and reused for every request.
pub fn build_request(spec: &RequestSpec<'_>, host: &str, path_prefix: &str) -> Vec<u8> {
    let body = build_body(spec);
    let mut head = String::with_capacity(512);
    head.push_str("POST ");
    head.push_str(path_prefix);
    head.push_str(spec.workload.path());
    head.push_str(" HTTP/1.1\r\nHost: ");
    head.push_str(host);
    head.push_str("\r\nContent-Type: application/json\r\n");
    if spec.stream {
        head.push_str("Accept: text/event-stream\r\n");
    } else {
        head.push_str("Accept: application/json\r\n");
    }
    match spec.workload {
        Workload::Messages => {
            head.push_str("x-api-key: ");
            head.push_str(spec.api_key);
            head.push_str("\r\nanthropic-version: 2023-06-01\r\n");
        }
        _ => {
            head.push_str("Authorization: Bearer ");
            head.push_str(spec.api_key);
            head.push_str("\r\n");
        }
    }
    for h in spec.headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("Content-Length: ");
    head.push_str(&body.len().to_string());
    head.push_str("\r\n\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Why a response could not be understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtoError {
    BadHead,
    HeadTooLarge,
    BadContentLength,
    BadChunk,
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::BadHead => "malformed response head",
            Self::HeadTooLarge => "response head too large",
            Self::BadContentLength => "bad content-length",
            Self::BadChunk => "malformed chunked encoding",
        };
        f.write_str(s)
    }
}

/// How the response body is delimited.
#[derive(Debug)]
pub enum Framing {
    /// No body (204, 304, 1xx).
    Empty,
    Length(u64),
    Chunked(Chunked),
    /// Read until the peer closes (connection is not reusable afterwards).
    UntilClose,
}

/// Parsed response head.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub head_len: usize,
    pub framing: Framing,
    pub keep_alive: bool,
}

pub const MAX_HEAD: usize = 64 * 1024;

/// Parse a response head from `buf`. `Ok(None)` means "need more bytes".
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, ProtoError> {
    let mut headers = [httparse::EMPTY_HEADER; 48];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return if buf.len() > MAX_HEAD {
                Err(ProtoError::HeadTooLarge)
            } else {
                Ok(None)
            };
        }
        Err(_) => return Err(ProtoError::BadHead),
    };
    let status = resp.code.ok_or(ProtoError::BadHead)?;
    let version = resp.version.unwrap_or(1);
    let mut keep_alive = version >= 1;
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or(ProtoError::BadContentLength)?;
            if content_length.is_some_and(|old| old != v) {
                return Err(ProtoError::BadContentLength);
            }
            content_length = Some(v);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = contains_token(h.value, b"chunked");
        } else if name.eq_ignore_ascii_case(b"connection") {
            if contains_token(h.value, b"close") {
                keep_alive = false;
            } else if contains_token(h.value, b"keep-alive") {
                keep_alive = true;
            }
        }
    }
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::Empty
    } else if chunked {
        Framing::Chunked(Chunked::default())
    } else if let Some(len) = content_length {
        Framing::Length(len)
    } else {
        keep_alive = false;
        Framing::UntilClose
    };
    Ok(Some(Head {
        status,
        head_len: n,
        framing,
        keep_alive,
    }))
}

/// The values of the response headers `names` (ASCII case-insensitive; the first occurrence)
/// in a complete response head at the start of `buf`; `None` where a header is absent.
pub fn header_values(buf: &[u8], names: &[String]) -> Vec<Option<String>> {
    let mut headers = [httparse::EMPTY_HEADER; 48];
    let mut resp = httparse::Response::new(&mut headers);
    let mut out = vec![None; names.len()];
    if !matches!(resp.parse(buf), Ok(httparse::Status::Complete(_))) {
        return out;
    }
    for h in resp.headers.iter() {
        for (slot, name) in out.iter_mut().zip(names) {
            if slot.is_none() && h.name.eq_ignore_ascii_case(name) {
                *slot = Some(String::from_utf8_lossy(h.value).trim().to_string());
            }
        }
    }
    out
}

fn contains_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|part| part.trim_ascii().eq_ignore_ascii_case(token))
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum CState {
    #[default]
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerBegin,
    TrailerText,
    EndLf,
    Done,
}

/// Incremental chunked transfer-encoding decoder.
#[derive(Debug, Default)]
pub struct Chunked {
    state: CState,
    size: u64,
    digits: u8,
}

impl Chunked {
    pub fn is_done(&self) -> bool {
        self.state == CState::Done
    }

    /// Decode as much of `input` as possible, passing body data to `sink`.
    /// Returns the number of input bytes consumed (stops right after the final CRLF).
    pub fn feed(
        &mut self,
        input: &[u8],
        sink: &mut impl FnMut(&[u8]),
    ) -> Result<usize, ProtoError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                CState::Size => {
                    let d = match b {
                        b'0'..=b'9' => Some(b - b'0'),
                        b'a'..=b'f' => Some(b - b'a' + 10),
                        b'A'..=b'F' => Some(b - b'A' + 10),
                        _ => None,
                    };
                    if let Some(d) = d {
                        if self.digits >= 15 {
                            return Err(ProtoError::BadChunk);
                        }
                        self.size = self.size * 16 + u64::from(d);
                        self.digits += 1;
                    } else if self.digits == 0 {
                        return Err(ProtoError::BadChunk);
                    } else {
                        match b {
                            b';' | b' ' | b'\t' => self.state = CState::Ext,
                            b'\r' => self.state = CState::SizeLf,
                            b'\n' => self.after_size(),
                            _ => return Err(ProtoError::BadChunk),
                        }
                    }
                    i += 1;
                }
                CState::Ext => {
                    match b {
                        b'\r' => self.state = CState::SizeLf,
                        b'\n' => self.after_size(),
                        _ => {}
                    }
                    i += 1;
                }
                CState::SizeLf => {
                    if b != b'\n' {
                        return Err(ProtoError::BadChunk);
                    }
                    self.after_size();
                    i += 1;
                }
                CState::Data => {
                    let avail = (input.len() - i) as u64;
                    let take = avail.min(self.size) as usize;
                    sink(&input[i..i + take]);
                    i += take;
                    self.size -= take as u64;
                    if self.size == 0 {
                        self.state = CState::DataCr;
                    }
                }
                CState::DataCr => {
                    match b {
                        b'\r' => self.state = CState::DataLf,
                        b'\n' => self.next_chunk(),
                        _ => return Err(ProtoError::BadChunk),
                    }
                    i += 1;
                }
                CState::DataLf => {
                    if b != b'\n' {
                        return Err(ProtoError::BadChunk);
                    }
                    self.next_chunk();
                    i += 1;
                }
                CState::TrailerBegin => {
                    match b {
                        b'\r' => self.state = CState::EndLf,
                        b'\n' => {
                            self.state = CState::Done;
                            return Ok(i + 1);
                        }
                        _ => self.state = CState::TrailerText,
                    }
                    i += 1;
                }
                CState::TrailerText => {
                    if b == b'\n' {
                        self.state = CState::TrailerBegin;
                    }
                    i += 1;
                }
                CState::EndLf => {
                    if b != b'\n' {
                        return Err(ProtoError::BadChunk);
                    }
                    self.state = CState::Done;
                    return Ok(i + 1);
                }
                CState::Done => return Ok(i),
            }
        }
        Ok(i)
    }

    fn after_size(&mut self) {
        self.state = if self.size == 0 {
            CState::TrailerBegin
        } else {
            CState::Data
        };
    }

    fn next_chunk(&mut self) {
        self.state = CState::Size;
        self.size = 0;
        self.digits = 0;
    }
}

/// What one SSE event meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseEvent {
    /// A data event carrying a non-empty content token.
    Content,
    /// Any other data event (role, usage, ping, block start...).
    Other,
    /// The terminal event of the stream (`[DONE]`, `message_stop`, `response.completed`...).
    Terminal,
}

/// Incremental SSE scanner. Feed it body bytes; it calls back once per dispatched event.
#[derive(Default)]
pub struct SseScanner {
    line: Vec<u8>,
    event: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    seen_content: bool,
}

const TERMINAL_TYPES: [&str; 5] = [
    "message_stop",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "error",
];

impl SseScanner {
    pub fn reset(&mut self) {
        self.line.clear();
        self.event.clear();
        self.data.clear();
        self.has_data = false;
        self.seen_content = false;
    }

    pub fn feed(&mut self, mut input: &[u8], on_event: &mut impl FnMut(SseEvent)) {
        while !input.is_empty() {
            match memchr::memchr(b'\n', input) {
                Some(pos) => {
                    if self.line.is_empty() {
                        let line = strip_cr(&input[..pos]);
                        self.on_line(line, on_event);
                    } else {
                        self.line.extend_from_slice(&input[..pos]);
                        let line = std::mem::take(&mut self.line);
                        self.on_line(strip_cr(&line), on_event);
                        self.line = line;
                        self.line.clear();
                    }
                    input = &input[pos + 1..];
                }
                None => {
                    self.line.extend_from_slice(input);
                    return;
                }
            }
        }
    }

    fn on_line(&mut self, line: &[u8], on_event: &mut impl FnMut(SseEvent)) {
        if line.is_empty() {
            if self.has_data || !self.event.is_empty() {
                let ev = self.classify();
                self.event.clear();
                self.data.clear();
                self.has_data = false;
                on_event(ev);
            }
            return;
        }
        if line[0] == b':' {
            return; // comment / keep-alive
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(p) => {
                let v = &line[p + 1..];
                (&line[..p], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
            }
            _ => {}
        }
    }

    fn classify(&mut self) -> SseEvent {
        let data = self.data.trim_ascii();
        if data == b"[DONE]" {
            return SseEvent::Terminal;
        }
        if !self.event.is_empty() {
            if let Ok(name) = std::str::from_utf8(&self.event) {
                if TERMINAL_TYPES.contains(&name) {
                    return SseEvent::Terminal;
                }
            }
        }
        if !self.seen_content {
            // Until the first token, inspect every event properly.
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
                return SseEvent::Other;
            };
            if let Some(t) = v.get("type").and_then(|t| t.as_str()) {
                if TERMINAL_TYPES.contains(&t) {
                    return SseEvent::Terminal;
                }
            }
            if has_content(&v) {
                self.seen_content = true;
                return SseEvent::Content;
            }
            return SseEvent::Other;
        }
        // After the first token: cheap pre-filter, then confirm the terminal type.
        let maybe_terminal = memchr::memmem::find(data, b"message_stop").is_some()
            || memchr::memmem::find(data, b"\"response.").is_some()
            || memchr::memmem::find(data, b"\"error\"").is_some();
        if maybe_terminal {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
                if let Some(t) = v.get("type").and_then(|t| t.as_str()) {
                    if TERMINAL_TYPES.contains(&t) {
                        return SseEvent::Terminal;
                    }
                }
            }
        }
        SseEvent::Content
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn non_empty_str(v: Option<&serde_json::Value>) -> bool {
    v.and_then(|s| s.as_str()).is_some_and(|s| !s.is_empty())
}

/// Does this event carry a non-empty content token in any of the three dialects?
fn has_content(v: &serde_json::Value) -> bool {
    // OpenAI Chat: choices[0].delta.content
    if let Some(c) = v.get("choices").and_then(|c| c.get(0)) {
        if non_empty_str(c.get("delta").and_then(|d| d.get("content"))) {
            return true;
        }
    }
    match v.get("type").and_then(|t| t.as_str()) {
        // OpenAI Responses
        Some("response.output_text.delta") => non_empty_str(v.get("delta")),
        // Anthropic Messages
        Some("content_block_delta") => {
            let d = v.get("delta");
            non_empty_str(d.and_then(|d| d.get("text")))
                || non_empty_str(d.and_then(|d| d.get("partial_json")))
        }
        _ => false,
    }
}
