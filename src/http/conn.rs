//! A client connection as the server sees it: the socket, its read buffer (heads are parsed in
//! place), and the idle / header-read timeouts between requests — and, before its first
//! request, the shorter first-head deadline (`first_head_by`: a connection that never sends a
//! complete head does not stay for the keep-alive idle time).
//!
//! Owns: reading one request head, writing whole responses and error responses, and what an
//! idle connection holds: after `release_after` without a byte it gives its buffers back (the
//! read buffer to the shard's small free list) and waits for readability with no buffer at
//! all; bytes arriving take a buffer again.
//! Must not: route or interpret bodies.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::io::{CancelableAsyncReadRent, Canceller};
use monoio::net::TcpStream;

use super::stream::ClientStream;

use super::head::{self, RequestHead};
use super::io::{read_more, read_more_at, read_more_spare, write_all_timeout};
use super::request_id::RequestId;
use super::response::{write_head_parts, Framing};
use crate::error::{Error, ErrorShape, Kind};

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_head: usize,
    pub max_headers: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    /// A new connection's first complete head must be in this long after it started serving
    /// (`ClientConn::first_head_by`); shorter than `idle_timeout`, which applies between
    /// requests of a connection that already sent one.
    pub first_head_timeout: Duration,
    /// Longest a single write to a client may block (a client that stops reading).
    pub write_timeout: Duration,
}

/// Size of a pooled read buffer: most heads fit; larger ones grow it. It stays with the
/// connection while its request runs (the head is parsed in place and borrowed until the request
/// ends), so an open stream holds it: 2 KiB (two to a memory page) rather than a page each.
pub const READ_BUF: usize = 2048;
/// Size of a pooled response buffer: a small answer's head and body fit without growing.
pub const OUT_BUF: usize = 4096;
/// Free buffers of each kind a shard keeps for reuse (the rest go back to the allocator).
const MAX_FREE_BUFS: usize = 64;
/// `os error 125`: the read was cancelled before any byte arrived.
const ECANCELED: i32 = 125;

/// A shard's client read and response buffers: two bounded free lists, one per size (a read
/// buffer comes from its list when bytes arrive and goes back when the connection idles; a
/// response buffer comes from its list when a request starts and goes back when it ends), and
/// how long a connection may idle before it gives its read buffer back. Cloning is an `Rc`
/// clone.
#[derive(Clone)]
pub struct ReadBufs {
    inner: Rc<ReadBufsInner>,
}

struct ReadBufsInner {
    /// Read buffers (`READ_BUF`).
    free: RefCell<Vec<Vec<u8>>>,
    /// Response buffers (`OUT_BUF`).
    free_out: RefCell<Vec<Vec<u8>>>,
    release_after: Duration,
}

impl Default for ReadBufs {
    fn default() -> Self {
        ReadBufs::new(Duration::from_secs(1))
    }
}

impl ReadBufs {
    pub fn new(release_after: Duration) -> Self {
        ReadBufs {
            inner: Rc::new(ReadBufsInner {
                free: RefCell::new(Vec::new()),
                free_out: RefCell::new(Vec::new()),
                release_after,
            }),
        }
    }

    /// An empty read buffer of at least `READ_BUF` bytes.
    fn take(&self) -> Vec<u8> {
        take_from(&self.inner.free, READ_BUF)
    }

    /// Keep read buffer `buf` for reuse if it is a standard one and the list has room; else
    /// free it.
    fn give(&self, buf: Vec<u8>) {
        give_to(&self.inner.free, READ_BUF, buf);
    }

    /// An empty response buffer of at least `OUT_BUF` bytes.
    fn take_out(&self) -> Vec<u8> {
        take_from(&self.inner.free_out, OUT_BUF)
    }

    /// Keep response buffer `buf` for reuse if it is a standard one and the list has room; else
    /// free it.
    fn give_out(&self, buf: Vec<u8>) {
        give_to(&self.inner.free_out, OUT_BUF, buf);
    }

    /// Free buffers (read and response) held for reuse.
    pub fn free_count(&self) -> usize {
        let count = |l: &RefCell<Vec<Vec<u8>>>| l.try_borrow().map_or(0, |f| f.len());
        count(&self.inner.free) + count(&self.inner.free_out)
    }
}

/// An empty buffer of at least `size` bytes from `list`, or a new one.
fn take_from(list: &RefCell<Vec<Vec<u8>>>, size: usize) -> Vec<u8> {
    let reused = list.try_borrow_mut().ok().and_then(|mut f| f.pop());
    reused.unwrap_or_else(|| Vec::with_capacity(size))
}

/// Keep `buf` in `list` if its capacity is `size` to twice that and the list has room; else
/// free it.
fn give_to(list: &RefCell<Vec<Vec<u8>>>, size: usize, mut buf: Vec<u8>) {
    if (size..=2 * size).contains(&buf.capacity()) {
        if let Ok(mut f) = list.try_borrow_mut() {
            if f.len() < MAX_FREE_BUFS {
                buf.clear();
                f.push(buf);
            }
        }
    }
}

pub struct ClientConn {
    /// Plain TCP, or TLS after the TLS listener's handshake (`http::stream`).
    pub stream: ClientStream,
    pub buf: Vec<u8>,
    /// Reusable output buffer.
    pub out: Vec<u8>,
    /// Header lines (CRLF-terminated) every response head of the current request carries: the
    /// CORS headers of an allowed cross-origin request, `x-ringgate-provider` /
    /// `x-ringgate-attempts` of a proxied one. Cleared between requests.
    pub resp_headers: Vec<u8>,
    /// The current request's id (sent as `x-request-id` on its responses, see `request_id`).
    pub request_id: RequestId,
    /// Bytes written to the client since the current request started.
    pub bytes_out: u64,
    /// A copy of the current answer as written (set by the response cache on a miss).
    pub capture: Option<Tee>,
    /// When the current request's head had been parsed (`read_head`; the request's start in
    /// metrics and the access log).
    pub head_at: Instant,
    /// Until its first head is complete: when it must be (`Limits::first_head_timeout` from
    /// when serving began; `None` after it, or when not set).
    pub first_head_by: Option<Instant>,
    /// The client's address as the per-address tables key it (`None`: not known, e.g. mocks).
    pub peer: Option<crate::admit::peer::Peer>,
    /// Bytes of the current request's head still at the start of `buf` (`hold_head`): they stay
    /// until the request ends (`http::Request`), or until a stage that streams the body from
    /// the buffer drops them first (`drop_head`).
    head_len: usize,
    bufs: ReadBufs,
    /// Cancels the buffered wait for a next request when the connection goes idle.
    canceller: Canceller,
}

impl ClientConn {
    /// A connection with a private buffer list (e.g. the mock's).
    pub fn new(stream: TcpStream) -> ClientConn {
        ClientConn::pooled(stream, &ReadBufs::default())
    }

    /// A connection taking its read buffer from the shard's `bufs` when bytes arrive.
    pub fn pooled(stream: impl Into<ClientStream>, bufs: &ReadBufs) -> ClientConn {
        let stream = stream.into();
        if let ClientStream::Plain(s) = &stream {
            let _ = s.set_nodelay(true);
        }
        ClientConn {
            stream,
            buf: Vec::new(),
            out: Vec::new(),
            resp_headers: Vec::new(),
            request_id: RequestId::default(),
            bytes_out: 0,
            capture: None,
            head_at: Instant::now(),
            first_head_by: None,
            peer: None,
            head_len: 0,
            bufs: bufs.clone(),
            canceller: Canceller::new(),
        }
    }

    /// Wait for the next request head. `Ok(None)`: the client closed (or idled out) cleanly
    /// between requests. Before the first head, `first_head_by` bounds both waits.
    pub async fn read_head(&mut self, limits: &Limits) -> Result<Option<RequestHead>, Error> {
        let first_by = self.first_head_by;
        if self.buf.is_empty() {
            let now = Instant::now();
            let idle_until = now + limits.idle_timeout;
            let until = first_by.map_or(idle_until, |by| by.min(idle_until));
            match self.first_bytes(now, until).await {
                Ok(n) if n > 0 => {}
                // EOF, idle timeout or a reset between requests: a clean end.
                _ => return Ok(None),
            }
        }
        // The header deadline starts when the first bytes are in (a head that arrives whole,
        // the usual case, reads the clock once: when it has been parsed).
        let mut deadline = None;
        loop {
            if let Some(h) = head::parse(&self.buf, limits.max_head, limits.max_headers)? {
                self.head_at = Instant::now();
                self.first_head_by = None;
                return Ok(Some(h));
            }
            let now = Instant::now();
            let deadline = *deadline.get_or_insert_with(|| {
                let d = now + limits.header_timeout;
                first_by.map_or(d, |by| by.min(d))
            });
            match read_more_at(&mut self.stream, &mut self.buf, deadline, now).await {
                Ok(0) => return Err(Error::new(Kind::BadRequest, "connection closed mid-head")),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Err(Error::new(
                        Kind::ClientTimeout,
                        "timed out reading the request head",
                    ));
                }
                Err(_) => return Ok(None),
            }
        }
    }

    /// Read the first bytes of a next request into an empty `buf` by `deadline`.
    ///
    /// Hot keep-alive clients send at once: read with a buffer, as any read. After
    /// `release_after` without a byte the read is cancelled (a cancelled read hands back its
    /// buffer and any bytes that raced the cancel), the buffers go back, and the connection
    /// waits for readability holding none; bytes then take a buffer from the free list.
    ///
    /// A TLS connection reads with its buffer until the deadline: its TLS layer may already
    /// hold the next request's bytes, and a cancelled TLS read would break the stream.
    async fn first_bytes(&mut self, now: Instant, deadline: Instant) -> std::io::Result<usize> {
        if self.buf.capacity() < READ_BUF {
            self.buf = self.bufs.take();
        }
        let stream = match &mut self.stream {
            ClientStream::Plain(s) => s,
            tls @ ClientStream::Tls(_) => return read_more(tls, &mut self.buf, deadline).await,
        };
        let linger = self
            .bufs
            .inner
            .release_after
            .min(deadline.saturating_duration_since(now));
        let owned = std::mem::take(&mut self.buf);
        let (res, owned) = {
            let read = stream.cancelable_read(owned, self.canceller.handle());
            let mut read = std::pin::pin!(read);
            monoio::select! {
                r = &mut read => r,
                _ = monoio::time::sleep_until((now + linger).into()) => {
                    self.canceller = std::mem::take(&mut self.canceller).cancel();
                    read.await
                }
            }
        };
        self.buf = owned;
        match res {
            Err(e) if e.raw_os_error() == Some(ECANCELED) => {}
            other => return other,
        }
        // idle: hold no buffer while waiting (the read buffer back to the shard's list, the
        // output buffers freed)
        self.bufs.give(std::mem::take(&mut self.buf));
        self.out = Vec::new();
        self.resp_headers = Vec::new();
        let left = deadline.saturating_duration_since(Instant::now());
        match monoio::time::timeout(left, stream.readable(false)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        }
        self.buf = self.bufs.take();
        // into the buffer as it is (a read of `MIN_READ` would grow it past `READ_BUF`)
        read_more_spare(stream, &mut self.buf, deadline).await
    }

    /// A request starts: it is known as `id`, and every response head of it says so.
    pub fn start_request(&mut self, id: RequestId) {
        self.request_id = id;
        self.bytes_out = 0;
        if self.out.capacity() == 0 {
            // from the shard's free list: a small answer's head and body fit without growing
            self.out = self.bufs.take_out();
        }
        id.header_line(&mut self.resp_headers);
    }

    /// A request has ended: its header lines and capture go, and the response buffer (request
    /// memory, inside the permit's `response_reserve`) goes back to the shard's free list now,
    /// not after the connection has idled for `release_after`.
    pub fn end_request(&mut self) {
        self.resp_headers.clear();
        self.capture = None;
        self.bufs.give_out(std::mem::take(&mut self.out));
    }

    /// Drop the first `n` bytes of the read buffer (a head that carried no body).
    pub fn consume(&mut self, n: usize) {
        self.buf.drain(..n.min(self.buf.len()));
    }

    /// The current request's head takes the first `len` bytes of the read buffer: they stay
    /// there until `drop_head`.
    pub fn hold_head(&mut self, len: usize) {
        self.head_len = len;
    }

    /// Drop the current request's head bytes from the read buffer (once: a second call does
    /// nothing). What follows them is the body, or the next request.
    pub fn drop_head(&mut self) {
        let n = std::mem::take(&mut self.head_len);
        self.consume(n);
    }

    /// The reusable output buffer holding a response head (with this request's CORS lines), for
    /// callers that write the body themselves with [`ClientConn::write_raw`].
    pub fn head(
        &mut self,
        status: u16,
        content_type: &[u8],
        framing: Framing,
        keep_alive: bool,
        extra: &[u8],
    ) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        write_head_parts(
            &mut out,
            status,
            content_type,
            framing,
            keep_alive,
            &[extra, &self.resp_headers],
        );
        out
    }

    /// Write a complete response. Returns false if the client is gone.
    pub async fn respond(
        &mut self,
        status: u16,
        content_type: &[u8],
        extra_headers: &[u8],
        body: &[u8],
        keep_alive: bool,
        write_timeout: Duration,
    ) -> bool {
        let mut out = self.head(
            status,
            content_type,
            Framing::Length(body.len()),
            keep_alive,
            extra_headers,
        );
        out.extend_from_slice(body);
        self.bytes_out += out.len() as u64;
        if let Some(t) = self.capture.as_mut() {
            t.take(&out);
        }
        match write_all_timeout(&mut self.stream, out, write_timeout).await {
            Ok(back) => {
                self.out = back;
                true
            }
            Err(_) => false,
        }
    }

    /// The next head on a local endpoint's connection (admin, standalone mock): `None` when
    /// `stop` fires first or the peer closed, or after a bad head's error (OpenAI shape) went out.
    pub async fn next_head(
        &mut self,
        limits: &Limits,
        stop: impl std::future::Future<Output = ()>,
    ) -> Option<RequestHead> {
        let next = monoio::select! {
            _ = stop => return None,
            h = self.read_head(limits) => h,
        };
        match next {
            Ok(head) => head,
            Err(e) => {
                self.respond_error(&e, ErrorShape::OpenAi, false, limits.write_timeout)
                    .await;
                None
            }
        }
    }

    /// Answer with an error in the client's dialect. Returns whether the connection may stay open.
    pub async fn respond_error(
        &mut self,
        e: &Error,
        shape: ErrorShape,
        keep_alive: bool,
        write_timeout: Duration,
    ) -> bool {
        let keep = keep_alive && !e.closes_connection();
        let body = e.body(shape);
        let extra = e
            .retry_after_secs()
            .map(|s| format!("retry-after: {s}\r\n"))
            .unwrap_or_default();
        self.respond(
            e.status(),
            b"application/json",
            extra.as_bytes(),
            &body,
            keep,
            write_timeout,
        )
        .await
            && keep
    }

    /// Resolves when the client has closed or reset the connection; stays pending while it is
    /// silent or has sent more bytes. Bytes are only peeked at, never read, so dropping this
    /// future (the answer arrived first) loses no pipelined request. For watching a client
    /// while its answer is pending upstream.
    pub async fn wait_closed(&self) {
        self.stream.wait_closed().await
    }

    /// Write raw bytes (already framed). Returns the buffer for reuse, or None if the client is gone.
    pub async fn write_raw(&mut self, data: Vec<u8>, timeout: Duration) -> Option<Vec<u8>> {
        self.bytes_out += data.len() as u64;
        if let Some(t) = self.capture.as_mut() {
            t.take(&data);
        }
        write_all_timeout(&mut self.stream, data, timeout)
            .await
            .ok()
    }
}

/// The bytes of one answer as they were written to the client (head and framed body), up to
/// `cap`; past it the copy is dropped and `over` says so. What the response cache records a
/// miss from (`cache::answer::record`).
#[derive(Debug, Default)]
pub struct Tee {
    pub buf: Vec<u8>,
    pub cap: usize,
    pub over: bool,
}

impl Tee {
    pub fn new(cap: usize) -> Tee {
        Tee {
            buf: Vec::new(),
            cap,
            over: false,
        }
    }

    fn take(&mut self, data: &[u8]) {
        if self.over {
            return;
        }
        if self.buf.len() + data.len() > self.cap {
            self.over = true;
            self.buf = Vec::new();
        } else {
            self.buf.extend_from_slice(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read and response buffers come from their own lists at their own sizes: a response
    /// buffer given back is not handed out as a (larger than needed) read buffer.
    #[test]
    fn read_and_response_buffers_keep_their_own_sizes() {
        let bufs = ReadBufs::default();
        let out = bufs.take_out();
        assert!(out.capacity() >= OUT_BUF, "{}", out.capacity());
        bufs.give_out(out);
        let read = bufs.take();
        assert!(
            (READ_BUF..OUT_BUF).contains(&read.capacity()),
            "a read buffer of {} bytes",
            read.capacity()
        );
        bufs.give(read);
        assert_eq!(bufs.free_count(), 2);
        assert!(bufs.take_out().capacity() >= OUT_BUF);
        assert!((READ_BUF..OUT_BUF).contains(&bufs.take().capacity()));
        assert_eq!(bufs.free_count(), 0);
    }
}
