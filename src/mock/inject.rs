//! Fault injection: writing one `Fault` onto the mock's client socket in place of the normal
//! answer — error statuses, resets, garbage, stalls, cut, failing and malformed streams, broken framing,
//! huge heads and bodies, stale bytes after a complete response. Every fault works on any
//! answer (`Rendered` bytes of any dialect, stream or not).
//!
//! Owns: the bytes and timing of faulty answers. Must not: decide which fault applies (`fault`
//! does) or know any dialect's JSON (`error` writes the error bodies and mid-stream failures).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use super::answer::{Answer, Rendered};
use super::error;
use super::fault::Fault;
use crate::http::response::{reason, write_chunk, write_head, Framing, LAST_CHUNK};

/// Size of the `huge-body` answer.
pub const HUGE_BODY: u64 = 1 << 30;
/// Size of the `huge-header` header value.
pub const HUGE_HEADER: usize = 100 * 1024;
/// Bytes a `short-length` head promises beyond the body it sends.
pub const SHORT_BY: usize = 64;
/// The unrequested second response `extra-bytes` sends.
pub const STALE_BODY: &[u8] = br#"{"mock_stale":"an unrequested response after a complete one"}"#;

/// What the connection does after an injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// The answer is complete; the connection may carry another request.
    Keep,
    /// Close the connection (for `reset`, with SO_LINGER 0 already set: RST).
    Close,
    /// The fault only delayed things: write the normal answer now.
    Normal,
}

/// How a faulty head frames its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    Length(usize),
    Chunked,
    /// No Content-Length, no chunking: the body ends when the connection closes.
    Close,
}

/// Inject `fault` in place of `answer` on `s`.
pub async fn inject(s: &mut TcpStream, fault: &Fault, answer: &Answer, keep_alive: bool) -> After {
    let keep = After::keep(keep_alive);
    match fault {
        Fault::Status { code, retry_after } => {
            let (ct, body): (&[u8], Vec<u8>) = if matches!(code, 500 | 502) {
                (b"text/html", html(*code))
            } else {
                let msg = format!("mock fault: {}", reason(*code));
                (
                    b"application/json",
                    error::body(answer.errors(), *code, &msg),
                )
            };
            let mut extra = Vec::new();
            if let Some(n) = retry_after {
                let _ = write!(extra, "retry-after: {n}\r\n");
            }
            let mut out = Vec::with_capacity(body.len() + 200);
            head(
                &mut out,
                *code,
                ct,
                Frame::Length(body.len()),
                keep_alive,
                &extra,
            );
            out.extend_from_slice(&body);
            send(s, out, keep).await
        }
        Fault::Reset => {
            let linger = nix::sys::socket::sockopt::Linger;
            let zero = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            let _ = nix::sys::socket::setsockopt(s.as_raw_fd(), linger, &zero);
            After::Close
        }
        Fault::Close => After::Close,
        Fault::Garbage => {
            let out = b"SSH-2.0-OpenSSH_9.6 \x00\xff\xfe this is not HTTP\r\n\x16\x03\x01\r\n\r\n";
            send(s, out.to_vec(), After::Close).await
        }
        Fault::Stall => {
            wait_for_peer(s).await;
            After::Close
        }
        Fault::StallMidHead => {
            let out = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-".to_vec();
            if send(s, out, After::Keep).await == After::Keep {
                wait_for_peer(s).await;
            }
            After::Close
        }
        Fault::StallMidBody => {
            let r = answer.render();
            let mut out = opened(&r, r.frame(), true);
            if r.sse {
                write_chunk(&mut out, events(&r.body).first().copied().unwrap_or(b""));
            } else {
                out.extend_from_slice(&r.body[..r.body.len() / 2]);
            }
            if send(s, out, After::Keep).await == After::Keep {
                wait_for_peer(s).await;
            }
            After::Close
        }
        Fault::CutAfter(n) => cut(s, &answer.render(), *n as usize, false).await,
        Fault::CutCloseAfter(n) => cut(s, &answer.render(), *n as usize, true).await,
        Fault::ErrorAfter(n) => {
            let r = answer.render();
            let Some(dialect) = answer.dialect().filter(|_| r.sse) else {
                return After::Normal;
            };
            let evs = events(&r.body);
            let n = (*n as usize).min(evs.len().saturating_sub(1));
            let mut body = evs[..n].concat();
            error::stream_event(dialect, n, &mut body);
            let mut out = opened(&r, Frame::Chunked, keep_alive);
            last_chunk(&mut out, &body);
            send(s, out, keep).await
        }
        Fault::Malformed => {
            let r = answer.render();
            if r.sse {
                let mut out = opened(&r, Frame::Chunked, keep_alive);
                let evs = events(&r.body);
                let bad = evs.len() / 2;
                for (i, ev) in evs.iter().enumerate() {
                    if i == bad {
                        write_chunk(&mut out, &break_event(ev));
                    } else {
                        write_chunk(&mut out, ev);
                    }
                }
                out.extend_from_slice(LAST_CHUNK);
                send(s, out, keep).await
            } else {
                let half = &r.body[..r.body.len() / 2];
                let mut out = opened(&r, Frame::Length(half.len()), keep_alive);
                out.extend_from_slice(half);
                send(s, out, keep).await
            }
        }
        Fault::SlowFirstByte(ms) => {
            monoio::time::sleep(Duration::from_millis(*ms)).await;
            After::Normal
        }
        Fault::ShortLength => {
            let r = answer.render();
            let mut out = opened(&r, Frame::Length(r.body.len() + SHORT_BY), true);
            out.extend_from_slice(&r.body);
            send(s, out, After::Close).await
        }
        Fault::BadChunk => {
            let r = answer.render();
            let (first, rest) = r.body.split_at(r.body.len() / 2);
            let mut out = opened(&r, Frame::Chunked, true);
            write_chunk(&mut out, first);
            out.extend_from_slice(b"zz\r\n");
            out.extend_from_slice(rest);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(LAST_CHUNK);
            send(s, out, After::Close).await
        }
        Fault::HugeHeader => {
            let mut extra = Vec::with_capacity(HUGE_HEADER + 32);
            extra.extend_from_slice(b"x-mock-padding: ");
            extra.resize(extra.len() + HUGE_HEADER, b'a');
            extra.extend_from_slice(b"\r\n");
            send(s, complete(&answer.render(), keep_alive, &extra), keep).await
        }
        Fault::HugeBody => huge_body(s, &answer.render(), keep_alive).await,
        Fault::ExtraBytes(ms) => {
            let r = answer.render();
            if send(s, complete(&r, true, b""), After::Keep).await == After::Close {
                return After::Close;
            }
            monoio::time::sleep(Duration::from_millis(*ms)).await;
            let mut out = Vec::with_capacity(200);
            let frame = Frame::Length(STALE_BODY.len());
            head(&mut out, 200, b"application/json", frame, true, b"");
            out.extend_from_slice(STALE_BODY);
            send(s, out, keep).await
        }
    }
}

/// A small HTML error page, as load balancers and proxies send.
fn html(code: u16) -> Vec<u8> {
    let r = reason(code);
    format!(
        "<html>\r\n<head><title>{code} {r}</title></head>\r\n<body>\r\n<center><h1>{code} {r}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
    )
    .into_bytes()
}

fn head(out: &mut Vec<u8>, status: u16, ct: &[u8], frame: Frame, keep_alive: bool, extra: &[u8]) {
    let mut lines = Vec::with_capacity(extra.len() + 24);
    lines.extend_from_slice(b"x-request-id: mock\r\n");
    lines.extend_from_slice(extra);
    match frame {
        Frame::Length(n) => write_head(out, status, ct, Framing::Length(n), keep_alive, &lines),
        Frame::Chunked => write_head(out, status, ct, Framing::Chunked, keep_alive, &lines),
        Frame::Close => {
            let _ = write!(
                out,
                "HTTP/1.1 {status} {}\r\ncontent-type: ",
                reason(status)
            );
            out.extend_from_slice(ct);
            out.extend_from_slice(b"\r\nconnection: close\r\n");
            out.extend_from_slice(&lines);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// A buffer for `r`'s faulty answer, its head framed by `frame` already in it.
fn opened(r: &Rendered, frame: Frame, keep_alive: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(r.body.len() + 200);
    head(&mut out, r.status, r.content_type, frame, keep_alive, b"");
    out
}

/// Append `body` as the last chunk of a chunked body, and the terminator.
fn last_chunk(out: &mut Vec<u8>, body: &[u8]) {
    write_chunk(out, body);
    out.extend_from_slice(LAST_CHUNK);
}

impl Rendered {
    /// The framing a well-formed answer uses: SSE chunked, JSON with a Content-Length.
    fn frame(&self) -> Frame {
        if self.sse {
            Frame::Chunked
        } else {
            Frame::Length(self.body.len())
        }
    }
}

impl After {
    /// What follows a complete answer: `Keep` on a keep-alive connection, else `Close`.
    fn keep(keep_alive: bool) -> After {
        if keep_alive {
            After::Keep
        } else {
            After::Close
        }
    }
}

/// The well-formed response for `r` (SSE chunked, JSON with a Content-Length).
fn complete(r: &Rendered, keep_alive: bool, extra: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(r.body.len() + extra.len() + 200);
    head(
        &mut out,
        r.status,
        r.content_type,
        r.frame(),
        keep_alive,
        extra,
    );
    if r.sse {
        last_chunk(&mut out, &r.body);
    } else {
        out.extend_from_slice(&r.body);
    }
    out
}

/// `cut-after` / `cut-close-after`: `n` whole events and half of the next (SSE), or half the
/// body (JSON), then close.
async fn cut(s: &mut TcpStream, r: &Rendered, n: usize, close_delimited: bool) -> After {
    let frame = if close_delimited {
        Frame::Close
    } else {
        r.frame()
    };
    let mut out = opened(r, frame, true);
    let mut pieces: Vec<&[u8]> = Vec::new();
    if r.sse {
        let evs = events(&r.body);
        let n = n.min(evs.len().saturating_sub(1));
        pieces.extend_from_slice(&evs[..n]);
        if let Some(ev) = evs.get(n) {
            pieces.push(&ev[..ev.len() / 2]);
        }
    } else {
        pieces.push(&r.body[..r.body.len() / 2]);
    }
    for p in pieces {
        if frame == Frame::Chunked {
            write_chunk(&mut out, p);
        } else {
            out.extend_from_slice(p);
        }
    }
    send(s, out, After::Close).await
}

/// `huge-body`: a 1 GiB answer written in 64 KiB pieces from one reused buffer. JSON gets a
/// `"mock_padding"` string member first; SSE gets comment events (`: aaa…`) before the normal
/// events.
async fn huge_body(s: &mut TcpStream, r: &Rendered, keep_alive: bool) -> After {
    const BLOCK: usize = 64 * 1024;
    const COMMENT: usize = 8 * 1024;
    let keep = After::keep(keep_alive);
    let mut out = Vec::with_capacity(BLOCK + 256);
    let mut block = Vec::with_capacity(BLOCK + 16);
    if r.sse {
        head(
            &mut out,
            r.status,
            r.content_type,
            Frame::Chunked,
            keep_alive,
            b"",
        );
        let mut comments = Vec::with_capacity(BLOCK);
        while comments.len() < BLOCK {
            comments.extend_from_slice(b": ");
            comments.resize(comments.len() + COMMENT - 4, b'a');
            comments.extend_from_slice(b"\n\n");
        }
        write_chunk(&mut block, &comments);
        if send(s, out, After::Keep).await == After::Close {
            return After::Close;
        }
        for _ in 0..(HUGE_BODY as usize).saturating_sub(r.body.len()) / BLOCK {
            let (res, back) = s.write_all(block).await;
            block = back;
            if res.is_err() {
                return After::Close;
            }
        }
        let mut out = Vec::with_capacity(r.body.len() + 16);
        last_chunk(&mut out, &r.body);
        return send(s, out, keep).await;
    }
    const PAD: &[u8] = b"\"mock_padding\":\"";
    let open = memchr::memchr(b'{', &r.body).map_or(0, |i| i + 1);
    let fixed = r.body.len() + PAD.len() + 2;
    let mut filler = (HUGE_BODY as usize).saturating_sub(fixed);
    let frame = Frame::Length(fixed + filler);
    head(&mut out, r.status, r.content_type, frame, keep_alive, b"");
    out.extend_from_slice(&r.body[..open]);
    out.extend_from_slice(PAD);
    if send(s, out, After::Keep).await == After::Close {
        return After::Close;
    }
    block.resize(BLOCK, b'a');
    while filler > 0 {
        let n = filler.min(BLOCK);
        block.truncate(n);
        let (res, back) = s.write_all(block).await;
        block = back;
        if res.is_err() {
            return After::Close;
        }
        filler -= n;
    }
    let mut out = Vec::with_capacity(r.body.len() + 4);
    out.extend_from_slice(b"\",");
    out.extend_from_slice(&r.body[open..]);
    send(s, out, keep).await
}

/// Split an SSE body into events, each with its terminating blank line.
fn events(body: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let end = memchr::memmem::find(rest, b"\n\n").map_or(rest.len(), |i| i + 2);
        let (ev, tail) = rest.split_at(end);
        out.push(ev);
        rest = tail;
    }
    out
}

/// The event with its `data:` JSON cut in half (still ended by a blank line).
fn break_event(ev: &[u8]) -> Vec<u8> {
    let body = ev.strip_suffix(b"\n\n").unwrap_or(ev);
    let data = memchr::memmem::rfind(body, b"data: ").map_or(0, |i| i + 6);
    let keep = data + (body.len() - data).div_ceil(2);
    let mut out = body[..keep].to_vec();
    out.extend_from_slice(b"\n\n");
    out
}

/// Write `out`; `then` unless the write failed (then the connection closes).
async fn send(s: &mut TcpStream, out: Vec<u8>, then: After) -> After {
    match s.write_all(out).await.0 {
        Ok(_) => then,
        Err(_) => After::Close,
    }
}

/// Read and discard until the peer closes (or the connection fails).
async fn wait_for_peer(s: &mut TcpStream) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let (r, back) = s.read(buf).await;
        buf = back;
        match r {
            Ok(0) | Err(_) => return,
            Ok(_) => buf.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_and_break() {
        let body = b"data: {\"a\":1}\n\nevent: x\ndata: {\"type\":\"x\"}\n\ndata: [DONE]\n\n";
        let evs = events(body);
        assert_eq!(evs.len(), 3);
        assert_eq!(evs[1], b"event: x\ndata: {\"type\":\"x\"}\n\n");
        let broken = break_event(evs[1]);
        assert_eq!(broken, b"event: x\ndata: {\"type\n\n");
        assert!(serde_json::from_slice::<serde_json::Value>(b"{\"type").is_err());
        assert_eq!(
            events(b"data: a\n\ndata: b"),
            vec![&b"data: a\n\n"[..], b"data: b"]
        );
    }

    #[test]
    fn html_pages_name_the_status() {
        let p = String::from_utf8(html(502)).unwrap();
        assert!(p.contains("<h1>502 Bad Gateway</h1>"));
    }
}
