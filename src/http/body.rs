//! Reading a request body that follows a parsed head, by Content-Length or chunked framing,
//! within a size limit and a deadline.
//!
//! Owns: moving body bytes out of the connection buffer (leaving the head before them and any
//! pipelined next request after them) and reading the rest from the socket. Must not: parse
//! the body.

use std::time::Instant;

use super::chunked::ChunkedDecoder;
use super::conn::ClientConn;
use super::head::{BodyFraming, RequestHead};
use super::io::{read_more, read_upto};
use crate::admit::Permit;
use crate::error::{Error, Kind};

/// How far one request's body may go: its size limit, its deadline, and the permit a chunked
/// body's growth is charged to (`None`: not charged). Built once by the caller that admitted
/// the request.
#[derive(Debug, Clone, Copy)]
pub struct Bound<'p> {
    pub max: u64,
    pub deadline: Instant,
    pub permit: Option<&'p Permit>,
}

impl ClientConn {
    /// Read the body of this connection's current request (`head`, at the start of the
    /// buffer) within `bound`, by Content-Length or chunked framing. On success the buffer
    /// holds the head, then what follows the body (a pipelined next request, if any): the head
    /// stays readable until the request ends, when the caller drops its bytes
    /// (`ClientConn::consume`; see `http::Request`).
    pub async fn read_body(
        &mut self,
        head: &RequestHead,
        bound: Bound<'_>,
    ) -> Result<Vec<u8>, Error> {
        let head_len = head.len.min(self.buf.len());
        match head.body {
            BodyFraming::None => Ok(Vec::new()),
            BodyFraming::Length(n) if n > bound.max => Err(too_large(bound.max)),
            BodyFraming::Length(n) => self.by_length(head_len, n as usize, bound.deadline).await,
            BodyFraming::Chunked => self.chunked(head_len, bound).await,
        }
    }

    /// A Content-Length body of `n` bytes (within the limit): taken from the buffer when it is
    /// all there, else read into its own allocation of `n`.
    async fn by_length(
        &mut self,
        head_len: usize,
        n: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, Error> {
        let buf = &mut self.buf;
        if buf.len().saturating_sub(head_len) >= n {
            let body = buf[head_len..head_len + n].to_vec();
            buf.drain(head_len..head_len + n);
            return Ok(body);
        }
        let mut body = Vec::with_capacity(n);
        body.extend_from_slice(&buf[head_len..]);
        buf.truncate(head_len);
        while body.len() < n {
            let got = read_upto(&mut self.stream, &mut body, n, deadline)
                .await
                .map_err(client_read)?;
            if got == 0 {
                return Err(Error::new(
                    Kind::BadRequest,
                    "client closed before sending the whole body",
                ));
            }
        }
        Ok(body)
    }

    /// A chunked body: its size is unknown at admission, so its growth is charged to the
    /// permit as it arrives (capacity, not length: that is what the allocator holds).
    async fn chunked(&mut self, head_len: usize, bound: Bound<'_>) -> Result<Vec<u8>, Error> {
        let mut dec = ChunkedDecoder::new(bound.max);
        let mut body = Vec::new();
        let mut charged = 0u64;
        loop {
            let used = dec.decode(&self.buf[head_len..], &mut body)?;
            self.buf.drain(head_len..head_len + used);
            charge(bound.permit, &body, &mut charged)?;
            if dec.is_done() {
                return Ok(body);
            }
            let got = read_more(&mut self.stream, &mut self.buf, bound.deadline)
                .await
                .map_err(client_read)?;
            if got == 0 {
                return Err(Error::new(
                    Kind::BadRequest,
                    "client closed before the end of the chunked body",
                ));
            }
        }
    }
}

fn charge(permit: Option<&Permit>, body: &Vec<u8>, charged: &mut u64) -> Result<(), Error> {
    match permit {
        Some(p) => p
            .charge_capacity(body, charged)
            .map_err(|r| Error::overloaded(r.as_str())),
        None => Ok(()),
    }
}

fn too_large(max: u64) -> Error {
    Error::new(
        Kind::BodyTooLarge,
        format!("request body is larger than the {max}-byte limit"),
    )
}

fn client_read(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::TimedOut {
        Error::new(Kind::ClientTimeout, "timed out reading the request body")
    } else {
        Error::new(Kind::BadRequest, format!("reading request body: {e}"))
    }
}
