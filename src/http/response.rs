//! Writing HTTP/1.1 response heads and chunk frames into owned buffers.
//!
//! Owns: status lines, framing headers (Content-Length / chunked), the terminating chunk.
//! Must not: do IO or decide statuses (callers pass them in).

use crate::util::decimal::push_u64;

/// How the body that follows the head is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(usize),
    Chunked,
}

pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

/// Append a response head. `extra` is raw header lines, each ending in CRLF.
pub fn write_head(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &[u8],
    framing: Framing,
    keep_alive: bool,
    extra: &[u8],
) {
    write_head_parts(out, status, content_type, framing, keep_alive, &[extra]);
}

/// As [`write_head`], with the extra header lines in several pieces.
pub fn write_head_parts(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &[u8],
    framing: Framing,
    keep_alive: bool,
    extra: &[&[u8]],
) {
    // One reservation for the whole head (the buffer is often fresh: no growth steps), numbers
    // written by hand (no formatting machinery on the hot path).
    let extra_len: usize = extra.iter().map(|e| e.len()).sum();
    out.reserve(96 + content_type.len() + extra_len);
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(content_type);
    out.extend_from_slice(b"\r\n");
    match framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_u64(out, n as u64);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    for e in extra {
        out.extend_from_slice(e);
    }
    out.extend_from_slice(b"\r\n");
}

/// Append one chunk frame (no-op for empty data: an empty chunk would end the body).
pub fn write_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    out.reserve(data.len() + 20);
    push_hex(out, data.len());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Append `n` in lower-case hex without leading zeros (a chunk-size line's digits).
pub fn push_hex(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 || at == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_and_chunks() {
        let mut out = Vec::new();
        write_head(
            &mut out,
            503,
            b"application/json",
            Framing::Length(2),
            false,
            b"retry-after: 1\r\n",
        );
        assert_eq!(
            out,
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\nretry-after: 1\r\n\r\n"
        );
        let mut c = Vec::new();
        write_chunk(&mut c, b"hello world, 17 b");
        write_chunk(&mut c, b"");
        assert_eq!(c, b"11\r\nhello world, 17 b\r\n");
        // Hand-written numbers against the formatter's.
        for n in [
            0usize,
            1,
            9,
            10,
            15,
            16,
            255,
            256,
            4096,
            65535,
            1 << 20,
            123_456_789,
        ] {
            let mut h = Vec::new();
            write_head(&mut h, 299, b"a/b", Framing::Length(n), true, b"");
            let want = format!("HTTP/1.1 299 \r\ncontent-type: a/b\r\ncontent-length: {n}\r\n\r\n");
            assert_eq!(h, want.as_bytes());
            if n > 0 && n < 1 << 21 {
                let mut c = Vec::new();
                write_chunk(&mut c, &vec![b'x'; n]);
                assert!(c.starts_with(format!("{n:x}\r\n").as_bytes()), "{n}");
                assert_eq!(c.len(), format!("{n:x}").len() + 2 + n + 2);
            }
        }
    }

    #[test]
    fn hex_sizes() {
        for (n, want) in [
            (0usize, "0"),
            (10, "a"),
            (4096, "1000"),
            (0x3_ffff, "3ffff"),
            (usize::MAX, "ffffffffffffffff"),
        ] {
            let mut v = Vec::new();
            push_hex(&mut v, n);
            assert_eq!(v, want.as_bytes());
        }
    }
}
