//! One request/response exchange with an upstream over a pooled connection.
//!
//! Owns: writing the request (each write bounded by the attempt's first-byte timeout, capped by
//! the total deadline: an upstream that stops reading cannot hold the request), reading and framing the response (head, then body pieces),
//! the retry-once rule (a *reused* connection that fails before any response byte is retried
//! on a fresh one), and returning the connection to the pool only when the body ended cleanly.
//! Must not: touch the client connection or interpret response bodies.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use monoio_rustls::TlsConnector;

use super::conn::Conn;
use super::pipe::PipeReader;
use super::pool::{Pool, PoolKey};
use super::resolve::ResolveError;
use super::slow::Slow;
use crate::config::endpoint::Endpoint;
use crate::config::UpstreamConfig;
use crate::error::{Cause, Error, Kind};
use crate::http::chunked::ChunkedDecoder;
use crate::http::head::{parse_content_length, trim};
use crate::http::io::{flush_by, read_more_at, write_all_by, Stall};

/// Largest upstream response head accepted.
const MAX_RESPONSE_HEAD: usize = 128 * 1024;
/// The first read's buffer on a fresh connection (a reused plain one reads into its armed
/// read's buffer, `conn::ARMED_BUF`..`ARMED_BUF_MAX`).
const HEAD_BUF: usize = 4 * 1024;
/// Upstream-failure log lines per second per shard (the rest are counted).
const FAILURE_LOG_LINES: u32 = 20;
/// Requests with bodies up to this size are written in one buffer with their head; larger
/// bodies are written through one buffer of this size, piece by piece (never a second whole
/// copy of the body: that would be memory outside the budget, see `admit`).
const COALESCE_BODY: usize = 32 * 1024;
/// Request-head buffers a shard keeps between sends, and the largest one it keeps (a head with
/// a coalesced body of up to a few KiB: larger ones go back to the allocator).
const SPARE_HEADS: usize = 32;
const SPARE_HEAD_MAX: usize = 8 * 1024;

/// Per-shard upstream client: pool, TLS connector, timeouts.
pub struct Client {
    pub pool: Pool,
    /// Requests retried on a fresh connection after a reused one failed before any byte.
    pub retries: std::cell::Cell<u64>,
    /// Limits upstream-failure log lines (per shard).
    pub failure_log: crate::observe::log::RateLimited,
    tls: Option<TlsConnector>,
    /// Request-head buffers of finished sends, for the next ones (at most `SPARE_HEADS`, each
    /// at most `SPARE_HEAD_MAX` bytes): a request's head and coalesced body are written
    /// without an allocation.
    spare_heads: std::cell::RefCell<Vec<Vec<u8>>>,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
    gap_timeout: Duration,
    total_timeout: Duration,
}

pub struct UpstreamRequest<'a> {
    pub endpoint: &'a Endpoint,
    /// Full request target, e.g. `/v1/chat/completions`.
    pub path: &'a str,
    /// Extra raw header lines (auth, version headers), each ending in CRLF.
    pub headers: &'a [u8],
    pub body: &'a [u8],
    /// This attempt's first-byte timeout (the routing plan's, capped by its deadline);
    /// `None`: `upstream.first_byte_timeout_ms`.
    pub first_byte_timeout: Option<Duration>,
    /// Set when the answer's head is late (see `upstream::slow`); `None`: nobody asks.
    pub slow: Option<&'a Slow>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespFraming {
    Length(u64),
    Chunked,
    Close,
}

#[derive(Debug)]
pub struct ResponseHead {
    pub status: u16,
    pub framing: RespFraming,
    pub keep_alive: bool,
    /// The answer's Content-Type, byte for byte; the common values borrowed, not copied
    /// (`content_type`).
    pub content_type: Cow<'static, [u8]>,
    /// Raw header lines worth passing to the client (the upstream's request id as
    /// `x-upstream-request-id`, rate-limit info, retry-after).
    pub forward: Vec<u8>,
}

impl ResponseHead {
    pub fn is_event_stream(&self) -> bool {
        self.content_type
            .windows(17)
            .any(|w| w.eq_ignore_ascii_case(b"text/event-stream"))
    }
}

pub(super) enum BodyState {
    Length(u64),
    Chunked(ChunkedDecoder),
    Close,
    Done,
}

/// An in-flight exchange: the head has arrived; the body is read piece by piece.
pub struct Exchange<'c> {
    client: &'c Client,
    conn: Option<Conn>,
    /// `None`: never pooled (a pipe).
    key: Option<PoolKey>,
    pool_ok: bool,
    /// Bytes read and not yet consumed: `buf[at..]` (the head's bytes stay in front of the
    /// first body bytes until the next read, instead of moving the body to the front).
    buf: Vec<u8>,
    at: usize,
    state: BodyState,
    pub head: ResponseHead,
    gap_timeout: Duration,
    deadline: Instant,
    /// Time spent waiting in body reads (metrics: upstream time, gateway overhead).
    pub waited: Duration,
    /// When the read that completed the body's first piece finished (see `first_piece_at`).
    first_piece: Option<Instant>,
    /// When the last body read finished; `None` before the first.
    last_read: Option<Instant>,
    pieces: bool,
}

impl Client {
    pub fn new(cfg: &UpstreamConfig, tls: Option<TlsConnector>) -> Client {
        Client {
            retries: std::cell::Cell::new(0),
            failure_log: crate::observe::log::RateLimited::new(FAILURE_LOG_LINES),
            spare_heads: std::cell::RefCell::new(Vec::new()),
            pool: Pool::new(
                cfg.max_idle_per_host,
                Duration::from_millis(cfg.idle_ttl_ms),
            ),
            tls,
            connect_timeout: Duration::from_millis(cfg.connect_timeout_ms),
            first_byte_timeout: Duration::from_millis(cfg.first_byte_timeout_ms),
            gap_timeout: Duration::from_millis(cfg.stream_gap_timeout_ms),
            total_timeout: Duration::from_millis(cfg.total_timeout_ms),
        }
    }

    /// The TLS connector for `https://` upstreams (`None`: none configured).
    pub fn tls(&self) -> Option<&TlsConnector> {
        self.tls.as_ref()
    }

    /// Send `req` and wait for the response head.
    pub async fn send(&self, req: &UpstreamRequest<'_>) -> Result<Exchange<'_>, Error> {
        let ep = req.endpoint;
        crate::http::target::check_head(req.path, &ep.host_header, req.headers)?;
        let key = &ep.pool_key;
        let coalesce = req.body.len() <= COALESCE_BODY;
        let need = 256 + req.headers.len() + if coalesce { req.body.len() } else { 0 };
        let mut head = self.spare_buf(need);
        // written piece by piece (no `core::fmt`: this runs once per request)
        head.extend_from_slice(b"POST ");
        head.extend_from_slice(req.path.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        head.extend_from_slice(ep.host_header.as_bytes());
        head.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
        crate::util::decimal::push_u64(&mut head, req.body.len() as u64);
        head.extend_from_slice(b"\r\n");
        head.extend_from_slice(req.headers);
        head.extend_from_slice(b"\r\n");
        if coalesce {
            head.extend_from_slice(req.body);
        }
        let now = Instant::now();
        let deadline = now + self.total_timeout;
        let fbt = req.first_byte_timeout.unwrap_or(self.first_byte_timeout);
        let watch = req.slow.map(|s| (s, now + s.after()));

        let mut fresh_only = false;
        loop {
            let (mut conn, reused) = match (!fresh_only).then(|| self.pool.take(key, now)).flatten()
            {
                Some(c) => (c, true),
                // Boxed: a connect (resolve, TCP, TLS handshake) is a large future, needed only
                // when the pool has no connection; inline it would grow every request's future.
                None => {
                    // a fresh connection's answer counts as slow from the start
                    fire(watch);
                    (Box::pin(self.connect(ep)).await?, false)
                }
            };
            // the write's wait counts from here: `now` for a pooled connection (just taken),
            // the clock after a connect
            let start = if reused { now } else { Instant::now() };
            let res = self
                .exchange_on(
                    &mut conn,
                    &mut head,
                    req.body,
                    coalesce,
                    (deadline, fbt, start),
                    watch,
                )
                .await;
            match res {
                Ok((resp_head, buf, at, state)) => {
                    self.give_buf(head);
                    let parts = (resp_head, buf, at, state);
                    return Ok(self.exchange_from(conn, Some(key.clone()), parts, deadline));
                }
                Err(e) if reused && e.retryable => {
                    self.retries.set(self.retries.get() + 1);
                    fresh_only = true;
                    continue;
                }
                Err(e) => {
                    self.give_buf(head);
                    return Err(e);
                }
            }
        }
    }

    /// An empty buffer of at least `need` bytes for a request's head or header lines: a spare
    /// one when there is one. Give it back with [`Client::give_buf`].
    pub fn spare_buf(&self, need: usize) -> Vec<u8> {
        let spare = self
            .spare_heads
            .try_borrow_mut()
            .ok()
            .and_then(|mut l| l.pop());
        let mut head = spare.unwrap_or_default();
        head.clear();
        head.reserve(need);
        head
    }

    /// Keep a sent request's head buffer for the next send (bounded: see `spare_heads`).
    pub fn give_buf(&self, head: Vec<u8>) {
        if head.capacity() <= SPARE_HEAD_MAX {
            if let Ok(mut l) = self.spare_heads.try_borrow_mut() {
                if l.len() < SPARE_HEADS {
                    l.push(head);
                }
            }
        }
    }

    pub(super) async fn connect(&self, ep: &Endpoint) -> Result<Conn, Error> {
        if let Some(path) = &ep.unix {
            return super::unix::connect(path).map(Conn::Plain).map_err(|e| {
                Error::new(Kind::UpstreamConnect, format!("connect unix:{path}: {e}"))
                    .caused(Cause::Connect)
            });
        }
        let addr = self
            .pool
            .resolve(&ep.host, ep.port, self.connect_timeout)
            .await
            .map_err(|e| {
                let (kind, cause) = match e {
                    ResolveError::TimedOut(_) => (Kind::UpstreamTimeout, Cause::ConnectTimeout),
                    ResolveError::Failed(_) => (Kind::UpstreamConnect, Cause::Connect),
                };
                Error::new(kind, format!("resolve {}: {e}", ep.host)).caused(cause)
            })?;
        let tls = match (ep.tls, &self.tls) {
            (false, _) => None,
            (true, Some(t)) => Some((t, ep.host.as_str())),
            (true, None) => {
                return Err(Error::new(
                    Kind::Internal,
                    "TLS upstream but no TLS connector",
                ));
            }
        };
        Conn::connect(addr, tls, self.connect_timeout)
            .await
            .map_err(|e| {
                let (kind, cause) = if e.kind() == std::io::ErrorKind::TimedOut {
                    (Kind::UpstreamTimeout, Cause::ConnectTimeout)
                } else {
                    (Kind::UpstreamConnect, Cause::Connect)
                };
                Error::new(kind, format!("connect {}:{}: {e}", ep.host, ep.port)).caused(cause)
            })
    }

    /// Write the request and read the response head. Errors before any response byte are
    /// marked retryable (the caller retries only if the connection was a reused one), except a
    /// write the upstream did not take within the first-byte timeout (`start`: when the write
    /// began): see [`write_failed`].
    async fn exchange_on(
        &self,
        conn: &mut Conn,
        head: &mut Vec<u8>,
        body: &[u8],
        coalesced: bool,
        (deadline, first_byte_timeout, start): (Instant, Duration, Instant),
        watch: Option<(&Slow, Instant)>,
    ) -> Result<(ResponseHead, Vec<u8>, usize, BodyState), Error> {
        if !coalesced {
            // a body written in pieces may wait on the upstream's window: slow from the start
            fire(watch);
        }
        let limit = Stall {
            stall: first_byte_timeout,
            cap: deadline,
        };
        // The request bytes stay intact in `head` (monoio hands the buffer back unchanged), so
        // a retry on a fresh connection resends exactly the same request.
        let wrote = {
            let (r, back) = write_all_by(conn, std::mem::take(head), limit, start).await;
            *head = back;
            match r {
                Ok(()) if !coalesced => write_pieces(conn, body, limit).await,
                other => other,
            }
        };
        if let Err(e) = wrote.and(flush_by(conn, limit).await) {
            return Err(write_failed(&e));
        }
        let now = Instant::now();
        let first_deadline = (now + first_byte_timeout).min(deadline);
        read_head(conn, first_deadline, now, watch).await
    }

    /// The total timeout and the configured first-byte timeout (`upstream::upload`).
    pub(super) fn timeouts(&self) -> (Duration, Duration) {
        (self.total_timeout, self.first_byte_timeout)
    }

    /// An exchange whose head `read_head` returned on `conn` (`upstream::upload`); pooled
    /// under `key` when its body ends cleanly.
    /// The exchange of a response head read on `conn` (pooled under `key` when it has one and
    /// the head allows keep-alive).
    pub(super) fn exchange_from(
        &self,
        conn: Conn,
        key: Option<PoolKey>,
        (head, buf, at, state): (ResponseHead, Vec<u8>, usize, BodyState),
        deadline: Instant,
    ) -> Exchange<'_> {
        Exchange {
            client: self,
            conn: Some(conn),
            pool_ok: key.is_some() && head.keep_alive,
            key,
            buf,
            at,
            state,
            head,
            gap_timeout: self.gap_timeout,
            deadline,
            waited: Duration::ZERO,
            first_piece: None,
            last_read: None,
            pieces: false,
        }
    }

    /// An exchange over an in-memory pipe (the in-process mock, answers the gateway makes
    /// itself): the producer writes a complete HTTP response into the pipe's other end. Same
    /// head parsing and body framing as a socket; never pooled.
    pub async fn open_pipe(&self, reader: PipeReader) -> Result<Exchange<'_>, Error> {
        let mut conn = Conn::Pipe(reader);
        let now = Instant::now();
        let deadline = now + self.total_timeout;
        let first_deadline = (now + self.first_byte_timeout).min(deadline);
        let parts = read_head(&mut conn, first_deadline, now, None).await?;
        Ok(self.exchange_from(conn, None, parts, deadline))
    }
}

/// Read a response head (interim 1xx skipped) from `conn` (`now`: the caller's clock read,
/// just taken; `watch`: fired at its instant if no head has come by then, at once where the
/// first read is not a pooled connection's armed one): the head, the buffer, where the
/// body's bytes in it start, the body's framing. Failures before a valid head are
/// tagged with their [`Cause`] (the routing layer decides on retries from it); those before any
/// byte are also marked retryable (a reused connection is retried once on a fresh one).
pub(super) async fn read_head(
    conn: &mut Conn,
    first_deadline: Instant,
    mut now: Instant,
    watch: Option<(&Slow, Instant)>,
) -> Result<(ResponseHead, Vec<u8>, usize, BodyState), Error> {
    {
        let mut buf = Vec::new();
        // a pooled plain connection's first bytes come from its armed read (see `pool`)
        let mut first = conn.armed_read(&mut buf, first_deadline, watch).await;
        if first.is_none() {
            fire(watch);
            buf.reserve(HEAD_BUF);
        }
        loop {
            let read = match first.take() {
                Some(r) => r,
                None => read_more_at(conn, &mut buf, first_deadline, now).await,
            };
            let n = read.map_err(|e| {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    Error::new(Kind::UpstreamTimeout, "upstream did not answer in time")
                        .caused(Cause::FirstByteTimeout)
                } else if buf.is_empty() {
                    Error::new(Kind::UpstreamProtocol, format!("upstream read: {e}"))
                        .retryable()
                        .caused(Cause::Reset)
                } else {
                    Error::new(Kind::UpstreamProtocol, format!("upstream read: {e}"))
                        .caused(Cause::Reset)
                }
            })?;
            if n == 0 {
                let e = Error::new(Kind::UpstreamProtocol, "upstream closed before responding")
                    .caused(Cause::Reset);
                return Err(if buf.is_empty() { e.retryable() } else { e });
            }
            if let Some((h, len)) = parse_response_head(&buf).map_err(|e| e.caused(Cause::Reset))? {
                let state = match h.framing {
                    RespFraming::Length(0) => BodyState::Done,
                    RespFraming::Length(n) => BodyState::Length(n),
                    RespFraming::Chunked => BodyState::Chunked(ChunkedDecoder::new(u64::MAX)),
                    RespFraming::Close => BodyState::Close,
                };
                return Ok((h, buf, len, state));
            }
            if buf.len() > MAX_RESPONSE_HEAD {
                return Err(
                    Error::new(Kind::UpstreamProtocol, "upstream response head too large")
                        .caused(Cause::Reset),
                );
            }
            now = Instant::now();
        }
    }
}

fn fire(watch: Option<(&Slow, Instant)>) {
    if let Some((s, _)) = watch {
        s.fire();
    }
}

/// Write `body` through one reused buffer of at most `COALESCE_BODY` bytes, each write within
/// `limit`.
async fn write_pieces(conn: &mut Conn, body: &[u8], limit: Stall) -> std::io::Result<()> {
    let mut piece = Vec::with_capacity(COALESCE_BODY.min(body.len()));
    for part in body.chunks(COALESCE_BODY) {
        piece.clear();
        piece.extend_from_slice(part);
        let (r, back) = write_all_by(conn, piece, limit, Instant::now()).await;
        r?;
        piece = back;
    }
    Ok(())
}

/// The error of a failed request write. A write the upstream did not take within the
/// first-byte timeout is `UpstreamTimeout` (504) caused by `FirstByteTimeout` — no answer in
/// time, as a late head: the routing layer retries it on the next candidate only where
/// `retry_on` has `first-byte-timeout` (the upstream may hold part of the request, as it holds
/// all of it when its head is late). It is not retryable here on a fresh connection to the same
/// upstream: a stale pooled connection fails at once (reset), not by stalling, and a second try
/// would wait a second first-byte timeout. Any other failure is a reset before any response
/// byte: retryable.
pub(super) fn write_failed(e: &std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::TimedOut {
        Error::new(
            Kind::UpstreamTimeout,
            "upstream did not take the request in time",
        )
        .caused(Cause::FirstByteTimeout)
    } else {
        Error::new(Kind::UpstreamConnect, format!("write to upstream: {e}"))
            .retryable()
            .caused(Cause::Reset)
    }
}

impl Exchange<'_> {
    /// Append the next piece of the decoded body to `out`. Returns `Ok(false)` at the end of
    /// the body. Bytes already buffered with the head are returned without IO.
    pub async fn next(&mut self, out: &mut Vec<u8>) -> Result<bool, Error> {
        self.next_upto(out, usize::MAX).await
    }

    /// As [`Exchange::next`], but `out` never grows past `limit` bytes (fixed-size pool chunks;
    /// pass an `out` shorter than `limit`). Undecoded bytes stay buffered for the next call.
    pub async fn next_upto(&mut self, out: &mut Vec<u8>, limit: usize) -> Result<bool, Error> {
        loop {
            while self.at < self.buf.len() {
                let (progressed, consumed) = self.consume_buffered(out, limit)?;
                if progressed {
                    if !self.pieces {
                        self.pieces = true;
                        self.first_piece = self.last_read;
                    }
                    // The body may have ended with this piece: pool the connection now, so a
                    // caller that stops reading after the last piece does not lose it.
                    if matches!(self.state, BodyState::Done) {
                        self.release();
                    }
                    return Ok(true);
                }
                if !consumed {
                    break;
                }
            }
            if matches!(self.state, BodyState::Done) {
                self.release();
                return Ok(false);
            }
            let Some(conn) = self.conn.as_mut() else {
                return Ok(false);
            };
            // what is left unconsumed (a partial chunk header) moves to the front before reading
            self.buf.drain(..self.at);
            self.at = 0;
            let waiting = Instant::now();
            let gap = (waiting + self.gap_timeout).min(self.deadline);
            let read = read_more_at(conn, &mut self.buf, gap, waiting).await;
            let done = Instant::now();
            self.waited += done.saturating_duration_since(waiting);
            self.last_read = Some(done);
            let n = read.map_err(|e| {
                self.pool_ok = false;
                if e.kind() == std::io::ErrorKind::TimedOut {
                    Error::new(Kind::UpstreamTimeout, "upstream stalled mid-body")
                } else {
                    Error::new(Kind::UpstreamProtocol, format!("upstream read: {e}"))
                }
            })?;
            if n == 0 {
                self.pool_ok = false;
                if matches!(self.state, BodyState::Close) {
                    self.state = BodyState::Done;
                    self.conn = None;
                    return Ok(false);
                }
                self.conn = None;
                return Err(Error::new(
                    Kind::UpstreamProtocol,
                    "upstream closed mid-body",
                ));
            }
        }
    }

    /// Move buffered bytes through the framing state into `out` (up to `limit` bytes of it).
    /// Returns (out grew or the body just ended, some buffered byte was consumed).
    fn consume_buffered(&mut self, out: &mut Vec<u8>, limit: usize) -> Result<(bool, bool), Error> {
        let before = out.len();
        let held = self.buf.len() - self.at;
        let data = &self.buf[self.at..];
        // Decoded bytes never outnumber the input bytes they come from, so feeding at most
        // `room` input bytes keeps `out` within `limit`.
        let room = limit.saturating_sub(before).min(held);
        match &mut self.state {
            BodyState::Length(left) => {
                let take = (*left).min(room as u64) as usize;
                out.extend_from_slice(&data[..take]);
                self.at += take;
                *left -= take as u64;
                if *left == 0 {
                    self.state = BodyState::Done;
                }
            }
            BodyState::Chunked(dec) => {
                let used = dec.decode(&data[..room], out).map_err(|e| {
                    Error::new(
                        Kind::UpstreamProtocol,
                        format!("upstream chunked body: {}", e.message),
                    )
                })?;
                self.at += used;
                if dec.is_done() {
                    self.state = BodyState::Done;
                }
            }
            BodyState::Close => {
                out.extend_from_slice(&data[..room]);
                self.at += room;
            }
            BodyState::Done => {
                // Bytes after a complete response: the peer is not speaking HTTP/1.1 properly.
                self.pool_ok = false;
                self.at = self.buf.len();
            }
        }
        let left = self.buf.len() - self.at;
        if left == 0 {
            self.buf.clear();
            self.at = 0;
        }
        let grew = out.len() > before || matches!(self.state, BodyState::Done);
        Ok((grew, left < held))
    }

    /// Read the rest of the body into `out` (non-streaming use).
    pub async fn read_to_end(&mut self, out: &mut Vec<u8>, limit: usize) -> Result<(), Error> {
        while self.next(out).await? {
            if out.len() > limit {
                self.pool_ok = false;
                return Err(Error::new(
                    Kind::UpstreamProtocol,
                    "upstream response too large",
                ));
            }
        }
        Ok(())
    }

    /// Return the connection to the pool if the body ended cleanly and it may be reused.
    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            let clean = self.pool_ok && self.at == self.buf.len();
            if let Some(key) = self.key.as_ref().filter(|_| clean) {
                // the read buffer (empty: everything was consumed) goes with it, for its
                // armed read (see `pool`)
                self.client
                    .pool
                    .put(key, conn, std::mem::take(&mut self.buf));
            }
        }
    }

    /// When the body's first piece arrived (metrics: time to first token), `head_at` being
    /// when the head did: `None` while no piece was handed out; `head_at` when the first piece
    /// came with the head (no clock read on the relay path for it).
    pub fn first_piece_at(&self, head_at: Instant) -> Option<Instant> {
        match (self.pieces, self.first_piece) {
            (false, _) => None,
            (true, Some(t)) => Some(t),
            (true, None) => Some(head_at),
        }
    }

    /// The body bytes read together with the head (or since) and not yet consumed, still
    /// framed (chunk sizes included): a look at a small error answer without reading it
    /// (`forward::scope`).
    pub fn buffered(&self) -> &[u8] {
        self.buf.get(self.at..).unwrap_or_default()
    }

    /// Never pool this connection (its request was cut short).
    pub fn forbid_reuse(&mut self) {
        self.pool_ok = false;
    }

    /// Whether the body has been fully read.
    pub fn is_done(&self) -> bool {
        matches!(self.state, BodyState::Done)
    }
}

/// Content-Type values an upstream sends nearly always, kept without a copy (compared exactly:
/// what the client gets is what the upstream sent).
const COMMON_TYPES: [&[u8]; 6] = [
    b"application/json",
    b"application/json; charset=utf-8",
    b"text/event-stream",
    b"text/event-stream; charset=utf-8",
    b"text/event-stream;charset=utf-8",
    b"application/json;charset=utf-8",
];

/// An upstream Content-Type value: borrowed when it is one of `COMMON_TYPES`, copied if not.
fn content_type(v: &[u8]) -> Cow<'static, [u8]> {
    match COMMON_TYPES.iter().find(|t| **t == v) {
        Some(t) => Cow::Borrowed(t),
        None => Cow::Owned(v.to_vec()),
    }
}

/// Most interim (1xx) responses skipped before the final head; more is an upstream error.
const MAX_INTERIM: usize = 16;

/// One parsed response head: an interim 1xx (its length) or the final head.
enum Parsed {
    Partial,
    Interim(usize),
    Final(ResponseHead, usize),
}

/// Parse the final response head at the start of `buf`, skipping interim responses (100
/// Continue, 103 Early Hints) in a loop — bounded by `MAX_INTERIM`, never by recursion (an
/// upstream sending thousands of 1xx heads once overflowed a shard's stack; fuzz-found).
pub(crate) fn parse_response_head(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, Error> {
    let mut skipped = 0;
    for _ in 0..=MAX_INTERIM {
        match parse_one(buf.get(skipped..).unwrap_or_default())? {
            Parsed::Partial => return Ok(None),
            Parsed::Interim(n) => skipped += n,
            Parsed::Final(h, n) => return Ok(Some((h, skipped + n))),
        }
    }
    Err(Error::new(
        Kind::UpstreamProtocol,
        "too many interim (1xx) upstream responses",
    ))
}

fn parse_one(buf: &[u8]) -> Result<Parsed, Error> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(e) => {
            return Err(Error::new(
                Kind::UpstreamProtocol,
                format!("bad upstream response head: {e}"),
            ))
        }
    };
    let status = resp.code.unwrap_or(0);
    if (100..200).contains(&status) {
        return Ok(Parsed::Interim(len));
    }
    let mut framing = RespFraming::Close;
    let mut keep_alive = resp.version == Some(1);
    let mut content_type: Cow<'static, [u8]> = Cow::Borrowed(b"");
    let mut forward = Vec::new();
    let mut cl_seen = false;
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_content_length(h.value)
                .map_err(|_| Error::new(Kind::UpstreamProtocol, "bad upstream Content-Length"))?;
            if cl_seen {
                return Err(Error::new(
                    Kind::UpstreamProtocol,
                    "duplicate upstream Content-Length",
                ));
            }
            cl_seen = true;
            if framing != RespFraming::Chunked {
                framing = RespFraming::Length(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if trim(h.value).eq_ignore_ascii_case(b"chunked") {
                framing = RespFraming::Chunked;
            } else {
                return Err(Error::new(
                    Kind::UpstreamProtocol,
                    "unsupported upstream Transfer-Encoding",
                ));
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for tok in h.value.split(|&b| b == b',') {
                let tok = trim(tok);
                if tok.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if tok.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"content-type") {
            content_type = self::content_type(h.value);
        } else if super::headers::response_header(name) {
            // The upstream's own request id goes to the client under another name: the
            // client's `x-request-id` is the gateway's (see `http::request_id`).
            let name: &[u8] = if name.eq_ignore_ascii_case(b"x-request-id") {
                b"x-upstream-request-id"
            } else {
                name
            };
            if forward.capacity() == 0 {
                // once: the forwarded lines are at most the head's bytes (plus the longer name)
                forward.reserve(len + 16);
            }
            forward.extend_from_slice(name);
            forward.extend_from_slice(b": ");
            forward.extend_from_slice(h.value);
            forward.extend_from_slice(b"\r\n");
        }
    }
    if status == 204 || status == 304 {
        framing = RespFraming::Length(0);
    }
    if framing == RespFraming::Close {
        keep_alive = false;
    }
    if content_type.is_empty() {
        content_type = Cow::Borrowed(b"application/json");
    }
    Ok(Parsed::Final(
        ResponseHead {
            status,
            framing,
            keep_alive,
            content_type,
            forward,
        },
        len,
    ))
}

#[cfg(test)]
#[path = "exchange_tests.rs"]
mod tests;
