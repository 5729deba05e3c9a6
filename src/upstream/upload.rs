//! Upstream requests of any method whose body is either held whole (`send_held`) or written
//! piece by piece as it arrives from the client (`open_upload` → `Upload::write` →
//! `Upload::finish`): the OpenAI surface beyond chat (`surface`), where a multi-hundred-MiB
//! upload must never be one buffer.
//!
//! Retries: a held body (or none) is sent like `Exchange`'s requests — a reused connection that
//! fails before any response byte is retried once on a fresh one. A streamed body always goes on
//! a fresh connection: once its first piece left, nothing can be resent (those bytes are gone
//! from the gateway), and a connect is nothing next to an upload.
//!
//! Owns: the request head of these calls (method, target, host, content type, framing) and the
//! streamed write (each write bounded by the first-byte timeout capped by the total deadline, as
//! `exchange`'s). Must not: touch the client connection (the caller pumps its bytes in) or read
//! bodies.

use std::time::{Duration, Instant};

use super::conn::Conn;
use super::exchange::{read_head, write_failed, Client, Exchange};
use crate::config::endpoint::Endpoint;
use crate::error::{Error, Kind};
use crate::http::io::{flush_by, write_all_by, Stall};
use crate::http::response::push_hex;
use crate::http::target::{check_head, header_value};

/// How an outgoing body is framed on the upstream request line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLen {
    /// No body (`GET`, `DELETE`).
    None,
    /// `content-length: n`.
    Length(u64),
    /// `transfer-encoding: chunked` (the client sent chunked; pieces are re-framed).
    Chunked,
}

/// One upstream request of the surface.
pub struct Outgoing<'a> {
    pub endpoint: &'a Endpoint,
    /// `GET`, `POST` or `DELETE`.
    pub method: &'static str,
    /// Full request target below the host (already escaped; `check_head` checks it again).
    pub path: &'a str,
    /// The client's `Content-Type` (multipart boundary included), checked as a header value.
    pub content_type: Option<&'a [u8]>,
    pub body: BodyLen,
    /// Extra raw header lines (auth, forwarded client headers), each ending in CRLF.
    pub headers: &'a [u8],
    /// This call's first-byte timeout (`None`: `upstream.first_byte_timeout_ms`).
    pub first_byte_timeout: Option<Duration>,
}

impl Outgoing<'_> {
    /// The request head (ending in the blank line).
    fn head(&self) -> Result<Vec<u8>, Error> {
        let ep = self.endpoint;
        check_head(self.path, &ep.host_header, self.headers)?;
        let mut h = Vec::with_capacity(256 + self.headers.len());
        h.extend_from_slice(self.method.as_bytes());
        h.push(b' ');
        h.extend_from_slice(self.path.as_bytes());
        h.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        h.extend_from_slice(ep.host_header.as_bytes());
        h.extend_from_slice(b"\r\n");
        if let Some(ct) = self.content_type {
            let ok = std::str::from_utf8(ct).is_ok_and(|v| header_value(v).is_ok());
            if !ok {
                return Err(Error::new(
                    Kind::InvalidBody,
                    "the Content-Type header cannot be forwarded (control or non-ASCII bytes)",
                ));
            }
            h.extend_from_slice(b"content-type: ");
            h.extend_from_slice(ct);
            h.extend_from_slice(b"\r\n");
        }
        match self.body {
            BodyLen::None => {}
            BodyLen::Length(n) => {
                h.extend_from_slice(b"content-length: ");
                crate::util::decimal::push_u64(&mut h, n);
                h.extend_from_slice(b"\r\n");
            }
            BodyLen::Chunked => h.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        }
        h.extend_from_slice(self.headers);
        h.extend_from_slice(b"\r\n");
        Ok(h)
    }
}

/// A streamed request whose head (and first bytes) went out; more body pieces follow.
pub struct Upload<'c> {
    client: &'c Client,
    conn: Conn,
    key: crate::config::endpoint::PoolKey,
    chunked: bool,
    /// Each write's limit: the first-byte timeout, capped by the total deadline (also the
    /// response head's, from `finish`).
    limit: Stall,
    /// Body bytes written so far.
    pub sent: u64,
}

impl Client {
    /// Send `req` with its whole `body` (empty for none) and wait for the response head.
    pub async fn send_held(&self, req: &Outgoing<'_>, body: &[u8]) -> Result<Exchange<'_>, Error> {
        let mut bytes = req.head()?;
        let (total, fbt) = self.timeouts();
        let fbt = req.first_byte_timeout.unwrap_or(fbt);
        let now = Instant::now();
        let deadline = now + total;
        let key = &req.endpoint.pool_key;
        bytes.extend_from_slice(body);
        let mut fresh_only = false;
        loop {
            let (mut conn, reused) = match (!fresh_only).then(|| self.pool.take(key, now)).flatten()
            {
                Some(c) => (c, true),
                None => (Box::pin(self.connect(req.endpoint)).await?, false),
            };
            let limit = Stall {
                stall: fbt,
                cap: deadline,
            };
            let start = if reused { now } else { Instant::now() };
            // (empty after a timed-out write, whose error is not retried: `write_failed`)
            let (r, back) = write_all_by(&mut conn, bytes, limit, start).await;
            bytes = back;
            let res = match r.and(flush_by(&mut conn, limit).await) {
                Err(e) => Err(write_failed(&e)),
                Ok(()) => {
                    let now = Instant::now();
                    read_head(&mut conn, (now + fbt).min(deadline), now, None).await
                }
            };
            match res {
                Ok(parts) => {
                    return Ok(self.exchange_from(conn, Some(key.clone()), parts, deadline))
                }
                Err(e) if reused && e.retryable => {
                    self.retries.set(self.retries.get() + 1);
                    fresh_only = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Open a fresh connection and write `req`'s head and the body's first bytes, `first`
    /// (the rest follows through [`Upload::write`]).
    pub async fn open_upload(&self, req: &Outgoing<'_>, first: &[u8]) -> Result<Upload<'_>, Error> {
        let head = req.head()?;
        let (total, fbt) = self.timeouts();
        let conn = Box::pin(self.connect(req.endpoint)).await?;
        let now = Instant::now();
        let mut up = Upload {
            client: self,
            conn,
            key: req.endpoint.pool_key.clone(),
            chunked: req.body == BodyLen::Chunked,
            limit: Stall {
                stall: req.first_byte_timeout.unwrap_or(fbt),
                cap: now + total,
            },
            sent: 0,
        };
        let (r, _) = write_all_by(&mut up.conn, head, up.limit, now).await;
        r.map_err(|e| write_failed(&e))?;
        if !first.is_empty() {
            let (r, _) = up.write(first.to_vec()).await;
            r?;
        }
        Ok(up)
    }
}

impl<'c> Upload<'c> {
    /// Write one body piece (framed as one chunk when the request is chunked); the buffer comes
    /// back for reuse.
    pub async fn write(&mut self, mut piece: Vec<u8>) -> (Result<(), Error>, Vec<u8>) {
        if piece.is_empty() {
            return (Ok(()), piece);
        }
        let n = piece.len() as u64;
        if self.chunked {
            let mut size = Vec::with_capacity(20);
            push_hex(&mut size, piece.len());
            size.extend_from_slice(b"\r\n");
            let (r, _) = write_all_by(&mut self.conn, size, self.limit, Instant::now()).await;
            if let Err(e) = r {
                return (Err(write_failed(&e)), piece);
            }
        }
        let (r, back) = write_all_by(&mut self.conn, piece, self.limit, Instant::now()).await;
        piece = back;
        if let Err(e) = r {
            return (Err(write_failed(&e)), piece);
        }
        if self.chunked {
            let crlf = b"\r\n".to_vec();
            let (r, _) = write_all_by(&mut self.conn, crlf, self.limit, Instant::now()).await;
            if let Err(e) = r {
                return (Err(write_failed(&e)), piece);
            }
        }
        self.sent = self.sent.saturating_add(n);
        (Ok(()), piece)
    }

    /// End the body (the last chunk when chunked) and wait for the response head. Also what to
    /// call after a failed write: an upstream that refused the upload early (413, 401) has
    /// usually answered before closing, and that answer is worth relaying.
    pub async fn finish(mut self, body_done: bool) -> Result<Exchange<'c>, Error> {
        if body_done && self.chunked {
            let last = b"0\r\n\r\n".to_vec();
            let (r, _) = write_all_by(&mut self.conn, last, self.limit, Instant::now()).await;
            r.map_err(|e| write_failed(&e))?;
        }
        if body_done {
            flush_by(&mut self.conn, self.limit)
                .await
                .map_err(|e| write_failed(&e))?;
        }
        let now = Instant::now();
        let Stall { stall, cap } = self.limit;
        let parts = read_head(&mut self.conn, (now + stall).min(cap), now, None).await?;
        let mut ex = self
            .client
            .exchange_from(self.conn, Some(self.key), parts, cap);
        if !body_done {
            // the request was cut short: the connection cannot carry another one
            ex.forbid_reuse();
        }
        Ok(ex)
    }
}
