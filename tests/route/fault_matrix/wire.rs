//! The fault matrix's client side, on raw sockets: requests in each client dialect, a response
//! reader that tolerates every way an answer can break (and says which), and a checker that
//! validates a dialect's SSE stream event by event as it arrives (whole events, well-formed
//! data, the terminal event last).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Output tokens asked for (the healthy answer is `text::tokens(0, N)`).
pub const N: u32 = 5;
/// Longest the test client waits for any one response.
pub const CLIENT_WAIT: Duration = Duration::from_secs(10);
/// Body bytes kept for inspection (the rest is counted and SSE-checked on the fly).
pub const BODY_CAP: usize = 8 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    Chat,
    Responses,
    Messages,
}

impl Client {
    pub fn name(self) -> &'static str {
        match self {
            Client::Chat => "chat",
            Client::Responses => "responses",
            Client::Messages => "messages",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Client::Chat => "/v1/chat/completions",
            Client::Responses => "/v1/responses",
            Client::Messages => "/v1/messages",
        }
    }

    pub fn body(self, model: &str, stream: bool) -> String {
        match self {
            Client::Chat => format!(
                r#"{{"model":"{model}","stream":{stream},"max_tokens":{N},"messages":[{{"role":"user","content":"hi"}}]}}"#
            ),
            Client::Responses => format!(
                r#"{{"model":"{model}","stream":{stream},"max_output_tokens":{N},"input":"hi"}}"#
            ),
            Client::Messages => format!(
                r#"{{"model":"{model}","stream":{stream},"max_tokens":{N},"messages":[{{"role":"user","content":"hi"}}]}}"#
            ),
        }
    }
}

// ------------------------------------------------------------------ reading responses

#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// The framing says the body is complete.
    Complete,
    Eof,
    Reset,
    Timeout,
    /// The gateway's own framing is broken.
    Protocol(String),
}

#[derive(Debug)]
pub struct Got {
    pub status: Option<u16>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub body_len: u64,
    pub stop: Stop,
    pub sse: Option<SseCheck>,
    pub elapsed: Duration,
}

impl Got {
    pub fn header(&self, name: &str) -> Option<&str> {
        let h = self.headers.iter().find(|(n, _)| n == name);
        h.map(|(_, v)| v.as_str())
    }

    pub fn complete(&self) -> bool {
        self.stop == Stop::Complete
    }

    pub fn keeps_open(&self) -> bool {
        self.complete() && self.header("connection") != Some("close")
    }

    pub fn text(&self) -> String {
        let b = &self.body[..self.body.len().min(300)];
        String::from_utf8_lossy(b).into_owned()
    }

    fn sink(&mut self, data: &[u8]) {
        self.body_len += data.len() as u64;
        let room = BODY_CAP.saturating_sub(self.body.len());
        self.body.extend_from_slice(&data[..room.min(data.len())]);
        if let Some(s) = &mut self.sse {
            s.feed(data);
        }
    }
}

/// Read more bytes into `buf` before `deadline`.
pub fn fill(s: &mut TcpStream, buf: &mut Vec<u8>, deadline: Instant) -> Result<(), Stop> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Stop::Timeout);
    }
    s.set_read_timeout(Some(left)).unwrap();
    let mut tmp = [0u8; 65536];
    match s.read(&mut tmp) {
        Ok(0) => Err(Stop::Eof),
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            Ok(())
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(Stop::Timeout)
        }
        Err(_) => Err(Stop::Reset),
    }
}

/// Read one response, tolerating every way it can go wrong. `buf` keeps bytes beyond it.
pub fn read_got(s: &mut TcpStream, buf: &mut Vec<u8>, client: Client, t0: Instant) -> Got {
    let deadline = t0 + CLIENT_WAIT;
    let mut got = Got {
        status: None,
        headers: Vec::new(),
        body: Vec::new(),
        body_len: 0,
        stop: Stop::Complete,
        sse: None,
        elapsed: Duration::ZERO,
    };
    got.stop = match read_into(s, buf, client, deadline, &mut got) {
        Ok(()) => Stop::Complete,
        Err(stop) => stop,
    };
    if let Some(sse) = &mut got.sse {
        sse.finish();
    }
    got.elapsed = t0.elapsed();
    got
}

pub fn read_into(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    client: Client,
    deadline: Instant,
    got: &mut Got,
) -> Result<(), Stop> {
    let head_len = loop {
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut hs);
        match r.parse(buf) {
            Ok(httparse::Status::Complete(n)) => {
                got.status = r.code;
                got.headers = r
                    .headers
                    .iter()
                    .map(|h| {
                        let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
                        (h.name.to_ascii_lowercase(), v)
                    })
                    .collect();
                break n;
            }
            Ok(httparse::Status::Partial) => fill(s, buf, deadline)?,
            Err(e) => return Err(Stop::Protocol(format!("bad response head: {e}"))),
        }
    };
    buf.drain(..head_len);
    if got
        .header("content-type")
        .is_some_and(|c| c.contains("text/event-stream"))
    {
        got.sse = Some(SseCheck::new(client));
    }
    if let Some(cl) = got.header("content-length") {
        let mut left: u64 = cl
            .parse()
            .map_err(|_| Stop::Protocol("bad content-length".into()))?;
        while left > 0 {
            if buf.is_empty() {
                fill(s, buf, deadline)?;
            }
            let n = (buf.len() as u64).min(left) as usize;
            got.sink(&buf[..n]);
            buf.drain(..n);
            left -= n as u64;
        }
        return Ok(());
    }
    if got.header("transfer-encoding") != Some("chunked") {
        // Close-delimited.
        loop {
            got.sink(buf);
            buf.clear();
            match fill(s, buf, deadline) {
                Ok(()) => {}
                Err(Stop::Eof) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
    loop {
        let line = loop {
            if let Some(i) = memchr::memmem::find(buf, b"\r\n") {
                break i;
            }
            fill(s, buf, deadline)?;
        };
        let size_text = String::from_utf8_lossy(&buf[..line]).into_owned();
        let size_hex = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| Stop::Protocol(format!("bad chunk size line {size_text:?}")))?;
        buf.drain(..line + 2);
        let mut left = size;
        while left > 0 {
            if buf.is_empty() {
                fill(s, buf, deadline)?;
            }
            let n = buf.len().min(left);
            got.sink(&buf[..n]);
            buf.drain(..n);
            left -= n;
        }
        while buf.len() < 2 {
            fill(s, buf, deadline)?;
        }
        if &buf[..2] != b"\r\n" {
            return Err(Stop::Protocol("chunk data not followed by CRLF".into()));
        }
        buf.drain(..2);
        if size == 0 {
            return Ok(());
        }
    }
}

// ------------------------------------------------------------------ checking SSE

#[derive(Debug, Clone, PartialEq)]
pub enum Terminal {
    Done,
    Error(String),
}

/// Checks a client's SSE stream as it arrives: whole events, each well-formed in the dialect,
/// nothing after the terminal event.
#[derive(Debug)]
pub struct SseCheck {
    pub client: Client,
    pub pending: Vec<u8>,
    pub content: String,
    pub terminal: Option<Terminal>,
    pub bad: Vec<String>,
}

pub fn snippet(s: &str) -> String {
    let mut end = s.len().min(160);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl SseCheck {
    pub fn new(client: Client) -> SseCheck {
        SseCheck {
            client,
            pending: Vec::new(),
            content: String::new(),
            terminal: None,
            bad: Vec::new(),
        }
    }

    pub fn feed(&mut self, data: &[u8]) {
        self.pending.extend_from_slice(data);
        let mut start = 0;
        while let Some(i) = memchr::memmem::find(&self.pending[start..], b"\n\n") {
            let ev = self.pending[start..start + i].to_vec();
            self.event(&ev);
            start += i + 2;
        }
        self.pending.drain(..start);
        if self.pending.len() > 4 << 20 {
            self.fail("an event over 4 MiB".into());
            self.pending.clear();
        }
    }

    pub fn finish(&mut self) {
        if !self.pending.iter().all(u8::is_ascii_whitespace) {
            let rest = String::from_utf8_lossy(&self.pending).into_owned();
            self.fail(format!("partial event at the end: {}", snippet(&rest)));
        }
    }

    fn fail(&mut self, msg: String) {
        if self.bad.len() < 3 {
            self.bad.push(msg);
        }
    }

    fn event(&mut self, raw: &[u8]) {
        let Ok(text) = std::str::from_utf8(raw) else {
            return self.fail("event is not UTF-8".into());
        };
        let mut name = None;
        let mut data: Option<String> = None;
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "event" => name = Some(value.to_string()),
                "data" => match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                },
                "id" | "retry" => {}
                _ => return self.fail(format!("not an SSE line: {}", snippet(line))),
            }
        }
        if name.is_none() && data.is_none() {
            return; // a comment / keep-alive
        }
        let Some(data) = data else {
            return self.fail(format!("event without data: {}", snippet(text)));
        };
        if let Some(t) = &self.terminal {
            let done_after_error =
                self.client == Client::Chat && data == "[DONE]" && matches!(t, Terminal::Error(_));
            if !done_after_error {
                self.fail(format!("event after the terminal event: {}", snippet(text)));
            }
            return;
        }
        if self.client == Client::Chat && data == "[DONE]" {
            self.terminal = Some(Terminal::Done);
            return;
        }
        let v: Value = match serde_json::from_str(&data) {
            Ok(v) => v,
            Err(_) => return self.fail(format!("data is not JSON: {}", snippet(&data))),
        };
        let ty = v["type"].as_str();
        match self.client {
            Client::Chat => {
                if name.is_some() {
                    return self.fail(format!("Chat event with an event name: {}", snippet(text)));
                }
                if !v["error"].is_null() {
                    return self.error(v["error"]["message"].as_str(), v["error"]["type"].as_str());
                }
                if v["object"] != "chat.completion.chunk" {
                    return self.fail(format!("not a chat.completion.chunk: {}", snippet(&data)));
                }
                if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
                    self.content.push_str(c);
                }
            }
            Client::Responses | Client::Messages => {
                if name.as_deref() != ty || ty.is_none() {
                    return self.fail(format!("event name != data.type: {}", snippet(text)));
                }
                match (self.client, ty.unwrap_or_default()) {
                    (Client::Responses, "error") => {
                        self.error(v["message"].as_str(), v["code"].as_str().or(Some("")))
                    }
                    (Client::Responses, "response.failed") => {
                        let e = &v["response"]["error"];
                        self.error(e["message"].as_str(), e["code"].as_str().or(Some("")))
                    }
                    (Client::Responses, "response.completed" | "response.incomplete") => {
                        self.terminal = Some(Terminal::Done)
                    }
                    (Client::Responses, "response.output_text.delta") => self
                        .content
                        .push_str(v["delta"].as_str().unwrap_or_default()),
                    (Client::Messages, "error") => {
                        self.error(v["error"]["message"].as_str(), v["error"]["type"].as_str())
                    }
                    (Client::Messages, "message_stop") => self.terminal = Some(Terminal::Done),
                    (Client::Messages, "content_block_delta") => {
                        if let Some(t) = v["delta"]["text"].as_str() {
                            self.content.push_str(t);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn error(&mut self, message: Option<&str>, ty: Option<&str>) {
        match (message, ty) {
            (Some(m), Some(_)) => self.terminal = Some(Terminal::Error(m.to_string())),
            _ => self.fail("error event without message/type strings".into()),
        }
    }
}

/// A non-stream body's answer content, or why it is not a well-formed answer.
pub fn answer_content(client: Client, v: &Value) -> Result<String, String> {
    let c = match client {
        Client::Chat if v["object"] == "chat.completion" => {
            v["choices"][0]["message"]["content"].as_str()
        }
        Client::Responses if v["object"] == "response" => {
            v["output"][0]["content"][0]["text"].as_str()
        }
        Client::Messages if v["type"] == "message" => v["content"][0]["text"].as_str(),
        _ => None,
    };
    c.map(str::to_string)
        .ok_or_else(|| format!("200 body is not a {} answer", client.name()))
}

pub fn error_shape_ok(client: Client, v: &Value) -> bool {
    let e = &v["error"];
    let strings = e["message"].is_string() && e["type"].is_string();
    match client {
        Client::Messages => v["type"] == "error" && strings,
        _ => strings,
    }
}

pub fn send(s: &mut TcpStream, client: Client, model: &str, stream: bool) -> std::io::Result<()> {
    let body = client.body(model, stream);
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nanthropic-version: 2023-06-01\r\nContent-Length: {}\r\n\r\n{body}",
        client.path(),
        body.len()
    );
    s.write_all(req.as_bytes())
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Whether the gateway closed a kept-open connection after its last response (allowed: a
/// server may close an idle connection, e.g. after a stream it had to end with an error event
/// once the head was out); clients' pools notice that before reuse, and so does this. Waits a
/// little for the close: on a loaded machine it can trail the response by tens of ms.
pub fn closed_by_peer(s: &TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut b = [0u8; 1];
    match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}
