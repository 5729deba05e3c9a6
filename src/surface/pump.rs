//! A client request body read piece by piece (`BodyReader`: Content-Length or chunked, within
//! `max_upload`) and pumped into an upstream upload through one window buffer (`pump`): the
//! next piece is read from the client only after the upstream took the last one, so a slow
//! upstream slows the client down (TCP back-pressure) instead of filling memory.
//!
//! Memory: the window (at most [`WINDOW`] bytes, charged to the request's permit) and the
//! connection's read buffer, which holds only what arrived with the head or an unfinished chunk
//! header — bytes of a pipelined next request never enter the window.
//!
//! Owns: reading body bytes off the client connection for the surface. Must not: parse the body
//! or write to the client.

use std::time::{Duration, Instant};

use crate::error::{Error, Kind};
use crate::http::chunked::ChunkedDecoder;
use crate::http::conn::ClientConn;
use crate::http::io::{read_more, read_upto};
use crate::http::BodyFraming;
use crate::upstream::upload::Upload;

/// Bytes of a streamed body in the gateway at once (per request).
pub const WINDOW: usize = 256 << 10;

/// Reads one request's body (the head already consumed from the connection buffer).
pub struct BodyReader {
    state: State,
    /// Body bytes handed out so far.
    pub got: u64,
    /// Longest wait for the client's next bytes.
    gap: Duration,
}

enum State {
    Length(u64),
    Chunked(Box<ChunkedDecoder>),
    Done,
}

impl BodyReader {
    /// A reader for `framing`, refusing more than `max` body bytes (413); each read waits at
    /// most `gap` for the client.
    pub fn new(framing: BodyFraming, max: u64, gap: Duration) -> BodyReader {
        let state = match framing {
            BodyFraming::None | BodyFraming::Length(0) => State::Done,
            BodyFraming::Length(n) => State::Length(n),
            BodyFraming::Chunked => State::Chunked(Box::new(ChunkedDecoder::new(max))),
        };
        BodyReader { state, got: 0, gap }
    }

    /// Whether the whole body has been read.
    pub fn done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Append body bytes to `out` without letting it pass `limit` bytes (at least 64 more than
    /// it holds). Returns whether more of the body follows.
    pub async fn read(
        &mut self,
        conn: &mut ClientConn,
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<bool, Error> {
        let room = limit.saturating_sub(out.len());
        let before = out.len();
        match &mut self.state {
            State::Done => return Ok(false),
            State::Length(left) => {
                let want = (*left).min(room as u64) as usize;
                if !conn.buf.is_empty() {
                    let take = want.min(conn.buf.len());
                    out.extend_from_slice(&conn.buf[..take]);
                    conn.buf.drain(..take);
                } else if want > 0 {
                    let deadline = Instant::now() + self.gap;
                    let n = read_upto(&mut conn.stream, out, before + want, deadline)
                        .await
                        .map_err(client_read)?;
                    if n == 0 {
                        return Err(closed());
                    }
                }
                let n = (out.len() - before) as u64;
                *left -= n;
                if *left == 0 {
                    self.state = State::Done;
                }
            }
            State::Chunked(dec) => loop {
                let feed = conn.buf.len().min(room);
                let used = dec.decode(&conn.buf[..feed], out)?;
                conn.buf.drain(..used);
                if dec.is_done() {
                    self.state = State::Done;
                    break;
                }
                if out.len() > before {
                    break;
                }
                if used == 0 || conn.buf.is_empty() {
                    let deadline = Instant::now() + self.gap;
                    let n = read_more(&mut conn.stream, &mut conn.buf, deadline)
                        .await
                        .map_err(client_read)?;
                    if n == 0 {
                        return Err(closed());
                    }
                }
            },
        }
        self.got = self.got.saturating_add((out.len() - before) as u64);
        Ok(!self.done())
    }
}

/// Why a pump stopped before the body's end.
pub enum Stopped {
    /// The client's side failed (gone, timed out, bad framing, over `max_upload`).
    Client(Error),
    /// The upstream stopped taking bytes (it may have answered: see `Upload::finish`).
    Upstream(Error),
}

/// Move the rest of the body from `reader` into `up` through `window` (its capacity is the
/// window, already charged to the request's permit).
pub async fn pump(
    conn: &mut ClientConn,
    reader: &mut BodyReader,
    up: &mut Upload<'_>,
    mut window: Vec<u8>,
) -> Result<(), Stopped> {
    let cap = window.capacity().max(4096);
    loop {
        window.clear();
        let more = reader
            .read(conn, &mut window, cap)
            .await
            .map_err(Stopped::Client)?;
        let (r, back) = up.write(window).await;
        window = back;
        r.map_err(Stopped::Upstream)?;
        if !more {
            return Ok(());
        }
    }
}

fn client_read(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::TimedOut {
        Error::new(Kind::ClientTimeout, "timed out reading the request body")
    } else {
        Error::new(Kind::BadRequest, format!("reading request body: {e}"))
    }
}

fn closed() -> Error {
    Error::new(
        Kind::BadRequest,
        "client closed before sending the whole body",
    )
}
