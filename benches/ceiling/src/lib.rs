//! The parsing both relays share (the ceiling prototype of issue 23): find the end of an
//! HTTP/1.1 head and the message's length from `Content-Length`. Nothing else is looked at;
//! the bytes are forwarded as they came (neither relay rewrites a header).
//!
//! Owns: message framing for the prototype. Must not: grow into a parser (chunked bodies are
//! refused: the prototype's upstreams answer with a length).

/// Options both binaries take: `--listen ADDR --upstream ADDR [--pool N] [--defer]`.
pub struct Args {
    pub listen: String,
    pub upstream: String,
    /// upstream connections made at start (the raw relay) or the most kept idle (monoio)
    pub pool: usize,
    /// IORING_SETUP_DEFER_TASKRUN on top of COOP_TASKRUN | SINGLE_ISSUER (the raw relay)
    pub defer: bool,
}

pub fn args() -> Args {
    let mut a = Args {
        listen: "127.0.0.1:18080".into(),
        upstream: "127.0.0.1:18081".into(),
        pool: 2100,
        defer: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--listen" => a.listen = it.next().unwrap_or_default(),
            "--upstream" => a.upstream = it.next().unwrap_or_default(),
            "--pool" => a.pool = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.pool),
            "--defer" => a.defer = true,
            _ => {
                eprintln!("usage: --listen ADDR --upstream ADDR [--pool N] [--defer]");
                std::process::exit(2);
            }
        }
    }
    a
}

/// What the bytes at the start of `buf` are.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// the head is not complete yet
    Partial,
    /// one whole message (head + body) is `n` bytes long; `n` may exceed `buf.len()`
    Message(usize),
    /// no length, chunked, or a head over 64 KiB: the relay closes
    Bad,
}

const MAX_HEAD: usize = 64 * 1024;

/// Frame the message at the start of `buf` (request or response; a response to HEAD or a
/// 1xx/204/304 is not expected from the prototype's upstreams).
pub fn frame(buf: &[u8]) -> Frame {
    let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") else {
        return if buf.len() > MAX_HEAD {
            Frame::Bad
        } else {
            Frame::Partial
        };
    };
    let head = &buf[..end + 2];
    let mut body = 0usize;
    // skip the start line; header lines end in CRLF
    let mut lines = head.split(|&b| b == b'\n').skip(1);
    for line in &mut lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = memchr::memchr(b':', line) else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.eq_ignore_ascii_case(b"content-length") {
            let v = value.trim_ascii();
            if v.is_empty() || v.len() > 12 || !v.iter().all(u8::is_ascii_digit) {
                return Frame::Bad;
            }
            body = v.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0'));
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return Frame::Bad;
        }
    }
    Frame::Message(end + 4 + body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        assert_eq!(frame(b"GET / HTTP/1.1\r\nHost: a\r\n"), Frame::Partial);
        assert_eq!(
            frame(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Frame::Message(27)
        );
        let r = b"POST / HTTP/1.1\r\ncontent-LENGTH: 5\r\n\r\nhello";
        assert_eq!(frame(r), Frame::Message(r.len()));
        assert_eq!(frame(&r[..40]), Frame::Message(r.len()));
        assert_eq!(
            frame(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Frame::Bad
        );
        assert_eq!(
            frame(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
            Frame::Bad
        );
    }
}
