//! Streamable HTTP to one MCP server: one `POST` (or `DELETE`) on a fresh connection, the
//! answer read whole — `application/json`, or `text/event-stream` whose events are the
//! messages — within the limits the caller gives.
//!
//! Owns: the request head (the gateway's own header lines only: the server's configured
//! bearer and static headers, `Mcp-Session-Id`, `Mcp-Protocol-Version`; never a client's),
//! response framing (length, chunked, close), the SSE event split, and charging the answer to
//! the request's permit as it grows. Must not: apply timeouts of its own (the caller bounds the
//! whole call with the server's `timeout_ms`), or interpret MCP methods.

use std::time::{Duration, Instant};

use monoio::io::AsyncWriteRentExt;
use serde_json::Value;

use super::servers::Server;
use crate::admit::permit::Permit;
use crate::http::chunked::ChunkedDecoder;
use crate::http::io::read_more_at;
use crate::upstream::conn::Conn;

/// Largest response head accepted from a server.
const MAX_HEAD: usize = 32 * 1024;

/// What a server answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Its `Mcp-Session-Id`, when it sent one.
    pub session: Option<String>,
    /// The body is an event stream.
    pub sse: bool,
    pub body: Vec<u8>,
}

/// Why a server gave no usable answer (the client sees only the short text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    Connect,
    /// The server's `timeout_ms` passed.
    Timeout,
    /// Bytes that are not HTTP, JSON-RPC, or what was asked.
    Garbage(&'static str),
    TooLarge,
    /// The request's share of the memory budget is spent.
    Budget,
    /// The server answered with this HTTP status.
    Status(u16),
}

impl Fail {
    pub fn text(&self) -> String {
        match self {
            Fail::Connect => "connection failed".into(),
            Fail::Timeout => "timed out".into(),
            Fail::Garbage(w) => format!("invalid answer ({w})"),
            Fail::TooLarge => "answer too large".into(),
            Fail::Budget => "over the memory budget".into(),
            Fail::Status(s) => format!("HTTP {s}"),
        }
    }
}

/// One request to `server`.
pub struct Call<'a> {
    pub method: &'static str,
    pub session: Option<&'a str>,
    pub protocol: Option<&'a str>,
    pub body: &'a [u8],
    /// More header lines of the gateway's own (a traced call's `traceparent`).
    pub lines: &'a [u8],
}

/// Send `call` to `server` and read the whole answer (at most `limit` body bytes), charging
/// the body to `permit`. No timeout here: the caller bounds the call.
pub async fn send(
    up: &crate::upstream::Client,
    server: &Server,
    call: &Call<'_>,
    limit: usize,
    permit: Option<&Permit>,
) -> Result<Answer, Fail> {
    let ep = &server.endpoint;
    let mut conn = match &ep.unix {
        // a co-located server on a Unix socket (`url = "unix:/run/tools.sock:/mcp"`)
        Some(path) => Conn::Plain(crate::upstream::unix::connect(path).map_err(|_| Fail::Connect)?),
        None => {
            // the caller's timeout bounds everything; these only stop a connect from outliving it
            let wait = server.timeout.max(Duration::from_millis(1));
            let addr = up
                .pool
                .resolve(&ep.host, ep.port, wait)
                .await
                .map_err(|_| Fail::Connect)?;
            let tls = match (ep.tls, up.tls()) {
                (false, _) => None,
                (true, Some(t)) => Some((t, ep.host.as_str())),
                (true, None) => return Err(Fail::Connect),
            };
            Conn::connect(addr, tls, wait)
                .await
                .map_err(|_| Fail::Connect)?
        }
    };
    let mut req = Vec::with_capacity(512 + call.body.len());
    req.extend_from_slice(call.method.as_bytes());
    req.push(b' ');
    req.extend_from_slice(server.target.as_bytes());
    req.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    req.extend_from_slice(ep.host_header.as_bytes());
    req.extend_from_slice(
        b"\r\naccept: application/json, text/event-stream\r\nconnection: close\r\n",
    );
    if !call.body.is_empty() {
        req.extend_from_slice(b"content-type: application/json\r\n");
    }
    req.extend_from_slice(b"content-length: ");
    crate::util::decimal::push_u64(&mut req, call.body.len() as u64);
    req.extend_from_slice(b"\r\n");
    if let Some(s) = call.session {
        req.extend_from_slice(b"mcp-session-id: ");
        req.extend_from_slice(s.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    if let Some(p) = call.protocol {
        req.extend_from_slice(b"mcp-protocol-version: ");
        req.extend_from_slice(p.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(&server.lines);
    req.extend_from_slice(call.lines);
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(call.body);
    let (res, _) = conn.write_all(req).await;
    res.map_err(|_| Fail::Connect)?;

    // a deadline far enough away that only the caller's timeout ends a read
    let far = Instant::now() + Duration::from_secs(24 * 3600);
    let mut buf = Vec::with_capacity(8192);
    let (status, session, sse, framing, head_len) = loop {
        if let Some(h) = parse_head(&buf)? {
            break h;
        }
        if buf.len() > MAX_HEAD {
            return Err(Fail::Garbage("response head too large"));
        }
        let n = read_more_at(&mut conn, &mut buf, far, Instant::now())
            .await
            .map_err(|_| Fail::Connect)?;
        if n == 0 {
            return Err(Fail::Garbage("closed before a response head"));
        }
    };
    let mut charged = 0u64;
    let mut body = Vec::new();
    let mut rest = buf.split_off(head_len);
    drop(buf);
    let no_body = status == 204 || status == 304 || (100..200).contains(&status);
    match framing {
        _ if no_body => {}
        Framing::Length(n) => {
            if n > limit as u64 {
                return Err(Fail::TooLarge);
            }
            body = rest;
            while (body.len() as u64) < n {
                charge(permit, &body, &mut charged)?;
                let got = read_more_at(&mut conn, &mut body, far, Instant::now())
                    .await
                    .map_err(|_| Fail::Connect)?;
                if got == 0 {
                    return Err(Fail::Garbage("closed inside the body"));
                }
            }
            body.truncate(n as usize);
        }
        Framing::Chunked => {
            let mut dec = ChunkedDecoder::new(limit as u64);
            loop {
                dec.decode(&rest, &mut body)
                    .map_err(|_| Fail::Garbage("chunked framing"))?;
                if body.len() > limit {
                    return Err(Fail::TooLarge);
                }
                charge(permit, &body, &mut charged)?;
                if dec.is_done() {
                    break;
                }
                rest.clear();
                let got = read_more_at(&mut conn, &mut rest, far, Instant::now())
                    .await
                    .map_err(|_| Fail::Connect)?;
                if got == 0 {
                    return Err(Fail::Garbage("closed inside the body"));
                }
            }
        }
        Framing::Close => {
            body = rest;
            loop {
                if body.len() > limit {
                    return Err(Fail::TooLarge);
                }
                charge(permit, &body, &mut charged)?;
                let got = read_more_at(&mut conn, &mut body, far, Instant::now())
                    .await
                    .map_err(|_| Fail::Connect)?;
                if got == 0 {
                    break;
                }
            }
        }
    }
    Ok(Answer {
        status,
        session,
        sse,
        body,
    })
}

fn charge(permit: Option<&Permit>, buf: &Vec<u8>, charged: &mut u64) -> Result<(), Fail> {
    match permit {
        Some(p) => p.charge_capacity(buf, charged).map_err(|_| Fail::Budget),
        None => Ok(()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    Close,
}

type Head = (u16, Option<String>, bool, Framing, usize);

/// The response head at the start of `buf`, once complete.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, Fail> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    let len = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Fail::Garbage("not an HTTP response")),
    };
    let status = r.code.ok_or(Fail::Garbage("no status"))?;
    let (mut session, mut sse, mut framing) = (None, false, Framing::Close);
    for h in r.headers.iter() {
        let v = h.value;
        if h.name.eq_ignore_ascii_case("mcp-session-id") {
            let ok = !v.is_empty()
                && v.len() <= super::session::MAX_UPSTREAM_ID
                && v.iter().all(|c| c.is_ascii_graphic());
            if ok {
                session = std::str::from_utf8(v).ok().map(str::to_string);
            }
        } else if h.name.eq_ignore_ascii_case("content-type") {
            sse = v
                .windows(17)
                .any(|w| w.eq_ignore_ascii_case(b"text/event-stream"));
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if v.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked")) {
                framing = Framing::Chunked;
            }
        } else if h.name.eq_ignore_ascii_case("content-length") && framing != Framing::Chunked {
            let n = crate::http::head::parse_content_length(v)
                .map_err(|_| Fail::Garbage("content-length"))?;
            framing = Framing::Length(n);
        }
    }
    Ok(Some((status, session, sse, framing, len)))
}

/// The JSON messages of an answer body: each SSE event's `data` (events of type `message` or
/// none), or the JSON body itself (one message or an array of them). Each is depth-checked.
pub fn messages(a: &Answer) -> Result<Vec<Value>, Fail> {
    let parse = |b: &[u8]| -> Result<Value, Fail> {
        crate::util::nesting::check(b).map_err(|_| Fail::Garbage("JSON nested too deeply"))?;
        serde_json::from_slice(b).map_err(|_| Fail::Garbage("not JSON"))
    };
    if !a.sse {
        return match parse(&a.body)? {
            Value::Array(items) => Ok(items),
            v => Ok(vec![v]),
        };
    }
    let mut out = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    let mut kind_ok = true;
    let mut has_data = false;
    let text = &a.body;
    let mut lines = text.split(|&c| c == b'\n').peekable();
    while let Some(raw) = lines.next() {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        let end = lines.peek().is_none();
        if line.is_empty() || end {
            if !line.is_empty() {
                take_field(line, &mut data, &mut kind_ok, &mut has_data);
            }
            if has_data && kind_ok {
                out.push(parse(&data)?);
            }
            data.clear();
            kind_ok = true;
            has_data = false;
            continue;
        }
        take_field(line, &mut data, &mut kind_ok, &mut has_data);
    }
    Ok(out)
}

fn take_field(line: &[u8], data: &mut Vec<u8>, kind_ok: &mut bool, has_data: &mut bool) {
    if line.first() == Some(&b':') {
        return;
    }
    let (name, value) = match memchr::memchr(b':', line) {
        Some(i) => {
            let v = &line[i + 1..];
            (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
        }
        None => (line, &b""[..]),
    };
    match name {
        b"data" => {
            if *has_data {
                data.push(b'\n');
            }
            data.extend_from_slice(value);
            *has_data = true;
        }
        b"event" => *kind_ok = value == b"message",
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(sse: bool, body: &str) -> Answer {
        Answer {
            status: 200,
            session: None,
            sse,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn sse_events_are_messages() {
        let a = answer(
            true,
            "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\r\n\r\n: comment\n\nevent: ping\ndata: {}\n\nid: 7\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":1,\"result\":{}}\n\n",
        );
        let m = messages(&a).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0]["method"], "notifications/progress");
        assert_eq!(m[1]["id"], 1);
        // an event without its blank line at the end of the body still counts
        let m = messages(&answer(true, "data: {\"a\":1}")).unwrap();
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn json_bodies_and_garbage() {
        assert_eq!(messages(&answer(false, "{\"id\":1}")).unwrap().len(), 1);
        assert_eq!(messages(&answer(false, "[{},{}]")).unwrap().len(), 2);
        assert!(messages(&answer(false, "<html>")).is_err());
        assert!(messages(&answer(true, &format!("data: {}\n\n", "[".repeat(5000)))).is_err());
    }

    #[test]
    fn heads_are_parsed_with_bounds() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nmcp-session-id: abc\r\ntransfer-encoding: chunked\r\n\r\nxx")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.0, h.1.as_deref(), h.2, h.3),
            (200, Some("abc"), true, Framing::Chunked)
        );
        let long = format!(
            "HTTP/1.1 200 OK\r\nmcp-session-id: {}\r\ncontent-length: 0\r\n\r\n",
            "a".repeat(300)
        );
        let h = parse_head(long.as_bytes()).unwrap().unwrap();
        assert_eq!((h.1, h.3), (None, Framing::Length(0)));
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\n").unwrap(), None);
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }
}
