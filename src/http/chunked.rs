//! Sans-IO decoder for `Transfer-Encoding: chunked` bodies (requests and upstream responses).
//!
//! Owns: the chunk-size / data / CRLF / trailer state machine and its limits. Every line ends
//! in CRLF: a bare LF anywhere in framing (size line, extension, after data, trailers, final
//! line) is an error, as in request heads (RFC 9112 §2.2, §7.1; see `head`).
//! Must not: allocate beyond appending decoded data to the caller's buffer, or do IO.

use crate::error::{Error, Kind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size.
    Size,
    /// After the size: skipping a chunk extension until CR.
    Ext,
    /// Expecting LF after the size line's CR.
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer field line.
    Trailer,
    TrailerLf,
    EndLf,
    Done,
}

/// Decodes chunked framing incrementally; feed it whatever bytes arrived.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    digits: u8,
    remaining: u64,
    ext_len: usize,
    trailer_len: usize,
    decoded: u64,
    max_body: u64,
}

/// Longest chunk extension / trailer section we tolerate.
const MAX_EXT: usize = 1024;
const MAX_TRAILERS: usize = 8 * 1024;

impl ChunkedDecoder {
    pub fn new(max_body: u64) -> Self {
        ChunkedDecoder {
            state: State::Size,
            size: 0,
            digits: 0,
            remaining: 0,
            ext_len: 0,
            trailer_len: 0,
            decoded: 0,
            max_body,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Total decoded payload bytes so far.
    pub fn decoded(&self) -> u64 {
        self.decoded
    }

    /// Decode from `input`, appending payload to `out`. Returns bytes of `input` consumed; stops
    /// at the end of the body (bytes after it belong to the next message).
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Error> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                State::Size => match hex(b) {
                    Some(d) => {
                        self.digits += 1;
                        if self.digits > 15 {
                            return Err(bad("chunk size too long"));
                        }
                        self.size = (self.size << 4) | u64::from(d);
                        i += 1;
                    }
                    None if b == b'\n' => return Err(bad("bare LF in chunk size line")),
                    None if self.digits == 0 => return Err(bad("invalid chunk size")),
                    None if b == b'\r' => {
                        self.state = State::SizeLf;
                        i += 1;
                    }
                    None if b == b';' || b == b' ' || b == b'\t' => {
                        self.state = State::Ext;
                        i += 1;
                    }
                    None => return Err(bad("invalid chunk size")),
                },
                State::Ext => {
                    if b == b'\r' {
                        self.state = State::SizeLf;
                    } else if b == b'\n' {
                        return Err(bad("bare LF in chunk size line"));
                    } else {
                        self.ext_len += 1;
                        if self.ext_len > MAX_EXT {
                            return Err(bad("chunk extension too long"));
                        }
                    }
                    i += 1;
                }
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(bad("expected LF after chunk size"));
                    }
                    i += 1;
                    self.ext_len = 0;
                    if self.size == 0 {
                        self.state = State::TrailerStart;
                    } else {
                        self.decoded = self.decoded.saturating_add(self.size);
                        if self.decoded > self.max_body {
                            return Err(Error::new(
                                Kind::BodyTooLarge,
                                "chunked body over the limit",
                            ));
                        }
                        self.remaining = self.size;
                        self.state = State::Data;
                    }
                    self.size = 0;
                    self.digits = 0;
                }
                State::Data => {
                    let avail = (input.len() - i) as u64;
                    let take = avail.min(self.remaining) as usize;
                    out.extend_from_slice(&input[i..i + take]);
                    i += take;
                    self.remaining -= take as u64;
                    if self.remaining == 0 {
                        self.state = State::DataCr;
                    }
                }
                State::DataCr => {
                    if b != b'\r' {
                        return Err(bad("chunk data not followed by CRLF"));
                    }
                    self.state = State::DataLf;
                    i += 1;
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err(bad("chunk data not followed by CRLF"));
                    }
                    self.state = State::Size;
                    i += 1;
                }
                State::TrailerStart => {
                    if b == b'\r' {
                        self.state = State::EndLf;
                    } else if b == b'\n' {
                        return Err(bad("bare LF in chunked trailer section"));
                    } else {
                        self.state = State::Trailer;
                        self.bump_trailer()?;
                    }
                    i += 1;
                }
                State::Trailer => {
                    if b == b'\r' {
                        self.state = State::TrailerLf;
                    } else if b == b'\n' {
                        return Err(bad("bare LF in chunked trailer section"));
                    } else {
                        self.bump_trailer()?;
                    }
                    i += 1;
                }
                State::TrailerLf => {
                    if b != b'\n' {
                        return Err(bad("malformed trailer"));
                    }
                    self.state = State::TrailerStart;
                    i += 1;
                }
                State::EndLf => {
                    if b != b'\n' {
                        return Err(bad("malformed end of chunked body"));
                    }
                    self.state = State::Done;
                    i += 1;
                    return Ok(i);
                }
                State::Done => return Ok(i),
            }
        }
        Ok(i)
    }

    fn bump_trailer(&mut self) -> Result<(), Error> {
        self.trailer_len += 1;
        if self.trailer_len > MAX_TRAILERS {
            return Err(bad("trailers too long"));
        }
        Ok(())
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn bad(msg: &str) -> Error {
    Error::new(Kind::BadRequest, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], split: usize) -> Result<(Vec<u8>, usize, bool), Error> {
        let mut d = ChunkedDecoder::new(1 << 20);
        let mut out = Vec::new();
        let mut used = 0;
        for part in [&input[..split], &input[split..]] {
            if d.is_done() {
                break;
            }
            used += d.decode(part, &mut out)?;
        }
        Ok((out, used, d.is_done()))
    }

    #[test]
    fn decodes_at_every_split() {
        let body = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for split in 0..=body.len() {
            let (out, used, done) = decode_all(body, split).unwrap();
            assert_eq!(out, b"hello, world", "split {split}");
            assert!(done);
            assert_eq!(&body[used..], b"NEXT", "split {split}");
        }
    }

    #[test]
    fn rejects_table() {
        let cases: &[&[u8]] = &[
            b"x\r\n",
            b"\r\n",
            b"5\r\nhelloXX",
            b"5\nhello\r\n",
            b"fffffffffffffffff\r\n",
            b"-1\r\n",
            b"5 \n",
        ];
        for c in cases {
            let mut d = ChunkedDecoder::new(1 << 20);
            assert!(
                d.decode(c, &mut Vec::new()).is_err(),
                "{:?}",
                String::from_utf8_lossy(c)
            );
        }
    }

    #[test]
    fn bare_lf_rejected_everywhere() {
        // Each is a valid body with one CRLF turned into a bare LF.
        let cases: &[&[u8]] = &[
            b"5\nhello\r\n0\r\n\r\n",
            b"5;e=1\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhello\r\n0\n\r\n",
            b"5\r\nhello\r\n0\r\n\n",
            b"5\r\nhello\r\n0\r\nX-T: 1\n\r\n",
            b"5\r\nhello\r\n0\r\nX-T: 1\nY: 2\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-T: 1\r\n\n",
        ];
        for c in cases {
            for split in 0..=c.len() {
                let r = decode_all(c, split);
                assert!(
                    matches!(&r, Err(e) if e.status() == 400),
                    "{:?} split {split}: {r:?}",
                    String::from_utf8_lossy(c)
                );
            }
        }
        let ok = b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n";
        assert!(decode_all(ok, 3).unwrap().2);
    }

    #[test]
    fn body_limit() {
        let mut d = ChunkedDecoder::new(4);
        let e = d
            .decode(b"5\r\nhello\r\n0\r\n\r\n", &mut Vec::new())
            .unwrap_err();
        assert_eq!(e.status(), 413);
    }
}
