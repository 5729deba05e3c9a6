//! A client connection as the server sees it: the socket, its read buffer (heads are parsed in
//! place), and the idle / header-read timeouts between requests.
//!
//! Owns: reading one request head, writing whole responses and error responses.
//! Must not: route or interpret bodies.

use std::time::{Duration, Instant};

use monoio::net::TcpStream;

use super::head::{self, RequestHead};
use super::io::{read_more, write_all_timeout};
use super::response::{write_head_parts, Framing};
use crate::error::{Error, ErrorShape, Kind};

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_head: usize,
    pub max_headers: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    /// Longest a single write to a client may block (a client that stops reading).
    pub write_timeout: Duration,
}

pub struct ClientConn {
    pub stream: TcpStream,
    pub buf: Vec<u8>,
    /// Reusable output buffer.
    pub out: Vec<u8>,
    /// Header lines (CRLF-terminated) every response head of the current request carries:
    /// the CORS headers of an allowed cross-origin request. Empty otherwise.
    pub cors: Vec<u8>,
}

impl ClientConn {
    pub fn new(stream: TcpStream) -> ClientConn {
        let _ = stream.set_nodelay(true);
        // Small to start: most heads fit; buffers grow on demand and an idle connection costs
        // ~4 KiB of user memory.
        ClientConn {
            stream,
            buf: Vec::with_capacity(4096),
            out: Vec::new(),
            cors: Vec::new(),
        }
    }

    /// Wait for the next request head. `Ok(None)`: the client closed (or idled out) cleanly
    /// between requests.
    pub async fn read_head(&mut self, limits: &Limits) -> Result<Option<RequestHead>, Error> {
        let mut deadline = if self.buf.is_empty() {
            Instant::now() + limits.idle_timeout
        } else {
            Instant::now() + limits.header_timeout
        };
        loop {
            if !self.buf.is_empty() {
                if let Some(h) = head::parse(&self.buf, limits.max_head, limits.max_headers)? {
                    return Ok(Some(h));
                }
            }
            let was_empty = self.buf.is_empty();
            match read_more(&mut self.stream, &mut self.buf, deadline).await {
                Ok(0) => {
                    return if was_empty {
                        Ok(None)
                    } else {
                        Err(Error::new(Kind::BadRequest, "connection closed mid-head"))
                    }
                }
                Ok(_) => {
                    if was_empty {
                        deadline = Instant::now() + limits.header_timeout;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return if was_empty {
                        Ok(None)
                    } else {
                        Err(Error::new(
                            Kind::ClientTimeout,
                            "timed out reading the request head",
                        ))
                    };
                }
                Err(_) => return Ok(None),
            }
        }
    }

    /// Drop the first `n` bytes of the read buffer (a head that carried no body).
    pub fn consume(&mut self, n: usize) {
        self.buf.drain(..n.min(self.buf.len()));
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
            &[extra, &self.cors],
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
        match write_all_timeout(&mut self.stream, out, write_timeout).await {
            Ok(back) => {
                self.out = back;
                true
            }
            Err(_) => false,
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
        let extra: &[u8] = if e.kind == Kind::Overloaded {
            b"retry-after: 1\r\n"
        } else {
            b""
        };
        self.respond(
            e.status(),
            b"application/json",
            extra,
            &body,
            keep,
            write_timeout,
        )
        .await
            && keep
    }

    /// Write raw bytes (already framed). Returns the buffer for reuse, or None if the client is gone.
    pub async fn write_raw(&mut self, data: Vec<u8>, timeout: Duration) -> Option<Vec<u8>> {
        write_all_timeout(&mut self.stream, data, timeout)
            .await
            .ok()
    }
}
