//! RESP2, the Redis wire protocol, as far as the limits store needs it: commands out (arrays of
//! bulk strings), replies in (simple strings, errors, integers, bulk strings, arrays).
//!
//! Reply parsing is incremental (`parse` says "need more bytes" until a whole reply is there)
//! and bounded, since the bytes come from the network: a line (simple string, error, integer,
//! length) is at most `MAX_LINE` bytes, a bulk string `MAX_BULK`, an array `MAX_ITEMS`
//! elements and `MAX_DEPTH` levels deep; nothing is preallocated from a declared length beyond
//! a small cap. Anything else is a protocol error and the connection is dropped.
//!
//! Owns: `Reply`, `Arg`, `command`, `parse`. Must not: do IO or know what the commands mean.

use crate::util::decimal::{push_u64, Digits};

/// Longest line (without CRLF) accepted.
pub const MAX_LINE: usize = 4096;
/// Largest bulk string accepted.
pub const MAX_BULK: usize = 64 * 1024;
/// Most elements in one array.
pub const MAX_ITEMS: usize = 1024;
/// Deepest array nesting.
pub const MAX_DEPTH: usize = 4;

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(Vec<u8>),
    /// `-ERR ...`
    Error(Vec<u8>),
    /// `:42`
    Int(i64),
    /// `$3 foo` (`None`: the null bulk string, `$-1`)
    Bulk(Option<Vec<u8>>),
    /// `*2 ...` (`None`: the null array, `*-1`)
    Array(Option<Vec<Reply>>),
}

impl Reply {
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The integers of an array reply (`None` if it is not an array of integers).
    pub fn ints(&self) -> Option<Vec<i64>> {
        match self {
            Reply::Array(Some(items)) => items.iter().map(Reply::int).collect(),
            _ => None,
        }
    }

    /// An error reply's text.
    pub fn error(&self) -> Option<&[u8]> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }
}

/// A reply the parser refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolError(pub &'static str);

/// One command argument.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    B(&'a [u8]),
    S(&'a str),
    U(u64),
    I(i64),
}

/// Append `args` as one RESP command (an array of bulk strings).
pub fn command(out: &mut Vec<u8>, args: &[Arg<'_>]) {
    command_of(out, &[args]);
}

/// Append one RESP command whose arguments are `parts`, one after the other.
pub fn command_of(out: &mut Vec<u8>, parts: &[&[Arg<'_>]]) {
    out.push(b'*');
    push_int(out, parts.iter().map(|p| p.len()).sum::<usize>() as i64);
    out.extend_from_slice(b"\r\n");
    for a in parts.iter().copied().flatten() {
        let digits;
        let bytes: &[u8] = match *a {
            Arg::B(b) => b,
            Arg::S(s) => s.as_bytes(),
            Arg::U(u) => {
                digits = Digits::new(u);
                digits.as_bytes()
            }
            Arg::I(v) => {
                if v < 0 {
                    out.push(b'$');
                    let d = Digits::new(v.unsigned_abs());
                    push_int(out, (d.as_bytes().len() + 1) as i64);
                    out.extend_from_slice(b"\r\n-");
                    out.extend_from_slice(d.as_bytes());
                    out.extend_from_slice(b"\r\n");
                    continue;
                }
                digits = Digits::new(v as u64);
                digits.as_bytes()
            }
        };
        out.push(b'$');
        push_int(out, bytes.len() as i64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_int(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

/// Parse one reply from the start of `buf`: `Ok(None)` when it is not complete yet,
/// `Ok(Some((reply, bytes used)))`, or a protocol error.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtocolError> {
    let mut at = 0;
    match value(buf, &mut at, 0)? {
        Some(r) => Ok(Some((r, at))),
        None => Ok(None),
    }
}

/// The line starting at `*at` (without CRLF); advances past the CRLF.
fn line<'b>(buf: &'b [u8], at: &mut usize) -> Result<Option<&'b [u8]>, ProtocolError> {
    let rest = &buf[*at..];
    let window = &rest[..rest.len().min(MAX_LINE + 2)];
    match memchr::memchr(b'\r', window) {
        Some(i) => match window.get(i + 1) {
            Some(b'\n') => {
                *at += i + 2;
                Ok(Some(&rest[..i]))
            }
            Some(_) => Err(ProtocolError("CR without LF")),
            None => Ok(None),
        },
        None if window.len() >= MAX_LINE + 2 => Err(ProtocolError("line too long")),
        None => Ok(None),
    }
}

fn number(b: &[u8]) -> Result<i64, ProtocolError> {
    let (neg, digits) = match b.split_first() {
        Some((b'-', d)) => (true, d),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(ProtocolError("bad integer"));
    }
    let v = digits
        .iter()
        .try_fold(0i64, |acc, &d| {
            acc.checked_mul(10)?.checked_add(i64::from(d - b'0'))
        })
        .ok_or(ProtocolError("integer out of range"))?;
    Ok(if neg { -v } else { v })
}

/// A declared length: -1 (null) or 0..=max.
fn length(b: &[u8], max: usize) -> Result<Option<usize>, ProtocolError> {
    match number(b)? {
        -1 => Ok(None),
        n if n >= 0 && n as u64 <= max as u64 => Ok(Some(n as usize)),
        _ => Err(ProtocolError("length out of bounds")),
    }
}

fn value(buf: &[u8], at: &mut usize, depth: usize) -> Result<Option<Reply>, ProtocolError> {
    let Some(&kind) = buf.get(*at) else {
        return Ok(None);
    };
    let start = *at;
    *at += 1;
    let Some(l) = line(buf, at)? else {
        *at = start;
        return Ok(None);
    };
    let reply = match kind {
        b'+' => Reply::Simple(l.to_vec()),
        b'-' => Reply::Error(l.to_vec()),
        b':' => Reply::Int(number(l)?),
        b'$' => match length(l, MAX_BULK)? {
            None => Reply::Bulk(None),
            Some(n) => {
                let body = *at;
                if buf.len() < body + n + 2 {
                    *at = start;
                    return Ok(None);
                }
                if &buf[body + n..body + n + 2] != b"\r\n" {
                    return Err(ProtocolError("bulk string without CRLF"));
                }
                *at = body + n + 2;
                Reply::Bulk(Some(buf[body..body + n].to_vec()))
            }
        },
        b'*' => match length(l, MAX_ITEMS)? {
            None => Reply::Array(None),
            Some(n) => {
                if n > 0 && depth + 1 >= MAX_DEPTH {
                    return Err(ProtocolError("arrays nested too deep"));
                }
                let mut items = Vec::with_capacity(n.min(8));
                for _ in 0..n {
                    match value(buf, at, depth + 1)? {
                        Some(r) => items.push(r),
                        None => {
                            *at = start;
                            return Ok(None);
                        }
                    }
                }
                Reply::Array(Some(items))
            }
        },
        _ => return Err(ProtocolError("unknown reply type")),
    };
    Ok(Some(reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        command(
            &mut out,
            &[
                Arg::S("EVALSHA"),
                Arg::B(b"ab"),
                Arg::U(0),
                Arg::U(1234),
                Arg::I(-56),
                Arg::I(7),
            ],
        );
        assert_eq!(
            out,
            b"*6\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n0\r\n$4\r\n1234\r\n$3\r\n-56\r\n$1\r\n7\r\n"
        );
    }

    #[test]
    fn every_reply_type_split_at_every_byte() {
        let wire: &[u8] = b"*5\r\n:1\r\n:-20\r\n$3\r\nabc\r\n$-1\r\n*2\r\n+OK\r\n-ERR no\r\n";
        let want = Reply::Array(Some(vec![
            Reply::Int(1),
            Reply::Int(-20),
            Reply::Bulk(Some(b"abc".to_vec())),
            Reply::Bulk(None),
            Reply::Array(Some(vec![
                Reply::Simple(b"OK".to_vec()),
                Reply::Error(b"ERR no".to_vec()),
            ])),
        ]));
        for cut in 0..wire.len() {
            assert_eq!(parse(&wire[..cut]), Ok(None), "cut at {cut}");
        }
        let mut two = wire.to_vec();
        two.extend_from_slice(b":9\r\n");
        let (r, n) = parse(&two).unwrap().unwrap();
        assert_eq!((r, n), (want, wire.len()));
        assert_eq!(parse(&two[n..]), Ok(Some((Reply::Int(9), 4))));
        assert_eq!(
            Reply::Array(Some(vec![Reply::Int(0), Reply::Int(3)])).ints(),
            Some(vec![0, 3])
        );
    }

    #[test]
    fn hostile_replies_are_refused_without_allocating_their_claims() {
        for bad in [
            &b"$99999999\r\n"[..],
            b"*99999999\r\n",
            b"$3\r\nabcde",
            b":12a\r\n",
            b":\r\n",
            b":99999999999999999999\r\n",
            b":9999999999999999999\r\n",
            b"$-2\r\n",
            b"?x\r\n",
            b"+a\rb\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let long = vec![b'+'; MAX_LINE + 8];
        assert_eq!(parse(&long), Err(ProtocolError("line too long")));
        // a declared array is not preallocated: 1024 items claimed, none sent
        assert_eq!(parse(b"*1024\r\n"), Ok(None));
        assert_eq!(
            parse(b":-9223372036854775807\r\n").unwrap().unwrap().0,
            Reply::Int(-i64::MAX)
        );
    }
}
