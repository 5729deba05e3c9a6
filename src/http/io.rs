//! Moving bytes between owned `Vec<u8>` buffers and monoio streams (which take buffers by
//! value), with deadlines.
//!
//! Owns: `read_more` (and `read_more_spare`), `write_all`, the stall-bounded writes towards
//! upstreams (`write_all_by`, `flush_by`: see [`Stall`]), deadline helpers. Must not: interpret
//! the bytes.

use std::io;
use std::time::{Duration, Instant};

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

/// Smallest spare capacity offered to a read.
const MIN_READ: usize = 4096;

/// Read whatever is available, appending to `buf`. `Ok(0)` means EOF. On timeout the
/// error kind is `TimedOut` (the buffer's unread contents survive only on success or IO error).
pub async fn read_more<S: AsyncReadRent>(
    s: &mut S,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> io::Result<usize> {
    read_more_at(s, buf, deadline, Instant::now()).await
}

/// [`read_more`] for a caller that has just read the clock (`now`): one clock read per read
/// instead of two (the timer takes the deadline as is).
pub async fn read_more_at<S: AsyncReadRent>(
    s: &mut S,
    buf: &mut Vec<u8>,
    deadline: Instant,
    now: Instant,
) -> io::Result<usize> {
    if buf.capacity() - buf.len() < MIN_READ {
        buf.reserve(MIN_READ);
    }
    let owned = std::mem::take(buf);
    let len = owned.len();
    if deadline <= now {
        *buf = owned;
        return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
    }
    match monoio::time::timeout_at(deadline.into(), s.read(owned.slice_mut(len..))).await {
        Ok((res, slice)) => {
            *buf = slice.into_inner();
            res
        }
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "read timed out")),
    }
}

/// [`read_more`] into the buffer's spare capacity as it is (grown only when full): for a
/// caller that sized the buffer itself (`http::conn`'s small read buffer).
pub async fn read_more_spare<S: AsyncReadRent>(
    s: &mut S,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> io::Result<usize> {
    if buf.capacity() == buf.len() {
        buf.reserve(MIN_READ);
    }
    let owned = std::mem::take(buf);
    let len = owned.len();
    match monoio::time::timeout_at(deadline.into(), s.read(owned.slice_mut(len..))).await {
        Ok((res, slice)) => {
            *buf = slice.into_inner();
            res
        }
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "read timed out")),
    }
}

/// Write all of `data`, giving the buffer back (cleared) for reuse.
pub async fn write_all<S: AsyncWriteRent>(
    s: &mut S,
    mut data: Vec<u8>,
) -> (io::Result<()>, Vec<u8>) {
    if data.is_empty() {
        return (Ok(()), data);
    }
    let (res, mut back) = s.write_all(data).await;
    back.clear();
    data = back;
    (res.map(|_| ()), data)
}

/// Write all of `data` with a deadline (used towards clients that may stop reading).
pub async fn write_all_timeout<S: AsyncWriteRent>(
    s: &mut S,
    data: Vec<u8>,
    timeout: Duration,
) -> io::Result<Vec<u8>> {
    match monoio::time::timeout(timeout, write_all(s, data)).await {
        Ok((Ok(()), back)) => Ok(back),
        Ok((Err(e), _)) => Err(e),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "write timed out")),
    }
}

/// How long one write may wait for its peer to take bytes (`stall`), and the instant no write
/// may wait past (`cap`): a write that takes some bytes restarts the wait. Towards upstreams:
/// the attempt's first-byte timeout capped by the request's total deadline, so an upstream that
/// accepts and never reads cannot hold the request (and its permit).
#[derive(Debug, Clone, Copy)]
pub struct Stall {
    pub stall: Duration,
    pub cap: Instant,
}

impl Stall {
    /// The deadline of a write starting at `now`.
    fn from(&self, now: Instant) -> Instant {
        (now + self.stall).min(self.cap)
    }
}

fn write_timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "write timed out")
}

/// Write all of `data`, no write waiting longer than `limit` allows (the first one's wait
/// counted from `now`, the caller's clock read; each later one from a fresh one). The buffer
/// comes back as it was (a resend writes the same bytes), except after a timeout: the cancelled
/// write took it and an empty one comes back, the error kind `TimedOut`.
pub async fn write_all_by<S: AsyncWriteRent>(
    s: &mut S,
    mut data: Vec<u8>,
    limit: Stall,
    mut now: Instant,
) -> (io::Result<()>, Vec<u8>) {
    let len = data.len();
    let mut written = 0;
    while written < len {
        let write = s.write(data.slice(written..));
        let (res, back) = match monoio::time::timeout_at(limit.from(now).into(), write).await {
            Ok(done) => done,
            Err(_) => return (Err(write_timed_out()), Vec::new()),
        };
        data = back.into_inner();
        match res {
            Ok(0) => {
                let e = io::Error::new(io::ErrorKind::WriteZero, "failed to write whole buffer");
                return (Err(e), data);
            }
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (Err(e), data),
        }
        if written < len {
            now = Instant::now();
        }
    }
    (Ok(()), data)
}

/// Flush `s` (a TLS stream's pending records), waiting no longer than `limit` allows from now.
pub async fn flush_by<S: AsyncWriteRent>(s: &mut S, limit: Stall) -> io::Result<()> {
    match monoio::time::timeout_at(limit.from(Instant::now()).into(), s.flush()).await {
        Ok(r) => r,
        Err(_) => Err(write_timed_out()),
    }
}

pub fn deadline(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// Read into `buf` without letting it grow past `limit` bytes (exact-size bodies: bytes of a
/// pipelined next request must not land in this buffer). `Ok(0)` means EOF.
pub async fn read_upto<S: AsyncReadRent>(
    s: &mut S,
    buf: &mut Vec<u8>,
    limit: usize,
    deadline: Instant,
) -> io::Result<usize> {
    if buf.len() >= limit {
        return Ok(0);
    }
    if buf.capacity() < limit {
        buf.reserve_exact(limit - buf.len());
    }
    let owned = std::mem::take(buf);
    let len = owned.len();
    // the timer takes the deadline as is (one past fires at once), no clock read here
    match monoio::time::timeout_at(deadline.into(), s.read(owned.slice_mut(len..limit))).await {
        Ok((res, slice)) => {
            *buf = slice.into_inner();
            res
        }
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "read timed out")),
    }
}
