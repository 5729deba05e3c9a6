//! Relaying an upstream response to the client: the same-dialect passthrough (model splice,
//! bytes forwarded as they arrive), SSE re-framed per event and flushed per event, mid-stream
//! failures ended with a dialect-correct error event, and client disconnects releasing the
//! upstream connection (dropped, never pooled).
//!
//! Owns: the upstream → client byte path. Must not: read the client's request or choose routes.
//! Back-pressure is structural: the next upstream read starts only after the previous write
//! to the client finished, so at most one read buffer per stream is held.

use std::time::Duration;

use crate::admit::{Chunk, Permit};
use crate::error::{Error, ErrorShape, Kind};
use crate::extract::{splice_model, RoutingFields};
use crate::gateway::Shard;
use crate::http::conn::ClientConn;
use crate::http::response::{write_chunk, Framing, LAST_CHUNK};
use crate::metrics::bump;
use crate::provider::Op;
use crate::route::Route;
use crate::translate::Dialect;
use crate::upstream::{Exchange, RespFraming, UpstreamRequest};

/// How a request ended, for metrics and the connection loop.
pub struct Outcome {
    pub status: u16,
    pub keep_alive: bool,
}

impl Outcome {
    pub async fn error(
        conn: &mut ClientConn,
        e: &Error,
        shape: ErrorShape,
        keep_alive: bool,
        wt: Duration,
    ) -> Outcome {
        let keep = conn.respond_error(e, shape, keep_alive, wt).await;
        Outcome {
            status: e.status(),
            keep_alive: keep,
        }
    }
}

/// A stream's upstream read buffer: one pool chunk charged to the request's permit. Every
/// relayed piece fits in it (`Exchange::next_upto`), so a stream holds exactly one chunk of
/// read buffer however fast the upstream or slow the client; the chunk returns to the shard's
/// pool when the stream ends.
pub struct StreamBuf {
    chunk: Chunk,
    pub buf: Vec<u8>,
    pub limit: usize,
}

impl StreamBuf {
    pub fn new(shard: &Shard, permit: &Permit) -> Result<StreamBuf, Error> {
        let pool = shard.admission.pool();
        let mut chunk = pool
            .alloc(permit)
            .map_err(|r| Error::overloaded(r.as_str()))?;
        let buf = chunk.take_buf();
        Ok(StreamBuf {
            chunk,
            buf,
            limit: pool.chunk_size(),
        })
    }
}

impl Drop for StreamBuf {
    fn drop(&mut self) {
        self.chunk.put_buf(std::mem::take(&mut self.buf));
    }
}

/// Largest partial SSE event held while waiting for its end (then forwarded as is).
const MAX_PENDING_EVENT: usize = 32 * 1024;

/// Same dialect in and out: forward the body byte for byte (with the model name spliced when
/// the route renames it) and relay the answer as it arrives.
#[allow(clippy::too_many_arguments)]
pub async fn passthrough(
    conn: &mut ClientConn,
    shard: &Shard,
    route: &Route,
    body: &[u8],
    fields: &RoutingFields,
    op: Op,
    dialect: Dialect,
    keep_alive: bool,
    permit: &Permit,
) -> Outcome {
    let wt = shard.limits.write_timeout;
    let shape = crate::bridge::shape(dialect);
    let spliced;
    let body = match &route.upstream_model {
        Some(m) => {
            spliced = splice_model(body, &fields.model_span, m);
            &spliced[..]
        }
        None => body,
    };
    let upstream_model = route.upstream_model.as_deref().unwrap_or(&fields.model);
    let mut ex = match send_upstream(
        shard,
        route,
        op,
        dialect,
        upstream_model,
        fields.stream,
        body,
    )
    .await
    {
        Ok(ex) => ex,
        Err(e) => return Outcome::error(conn, &e, shape, keep_alive, wt).await,
    };
    let mut piece = match StreamBuf::new(shard, permit) {
        Ok(b) => b,
        Err(e) => return Outcome::error(conn, &e, shape, keep_alive, wt).await,
    };
    relay(conn, &mut ex, keep_alive, wt, shard, dialect, &mut piece).await
}

/// Send `body` to the route's provider for `op` in `dialect` and wait for the response head.
/// Counts upstream failures (no answer, or a 5xx head).
pub async fn send_upstream<'s>(
    shard: &'s Shard,
    route: &Route,
    op: Op,
    dialect: Dialect,
    upstream_model: &str,
    stream: bool,
    body: &[u8],
) -> Result<Exchange<'s>, Error> {
    let provider = &route.provider;
    let endpoint = provider.endpoint.as_ref().ok_or_else(|| {
        Error::new(
            Kind::Internal,
            format!("provider {} has no base_url", provider.name),
        )
    })?;
    let path = provider.kind.path(
        &endpoint.base_path,
        op,
        dialect,
        upstream_model,
        stream,
        provider.api_version.as_deref(),
    );
    let req = UpstreamRequest {
        endpoint,
        path: &path,
        headers: &provider.auth_headers,
        body,
    };
    let r = shard.upstream.send(&req).await;
    if r.as_ref().map_or(true, |ex| ex.head.status >= 500) {
        bump(&shard.metrics.upstream_errors);
    }
    r
}

/// Forward the response of `ex` to the client.
async fn relay(
    conn: &mut ClientConn,
    ex: &mut Exchange<'_>,
    keep_alive: bool,
    wt: Duration,
    shard: &Shard,
    dialect: Dialect,
    rb: &mut StreamBuf,
) -> Outcome {
    let shape = crate::bridge::shape(dialect);
    let status = ex.head.status;
    let sse = ex.head.is_event_stream();
    let framing = match (ex.head.framing, sse) {
        (RespFraming::Length(n), false) => Framing::Length(n as usize),
        _ => Framing::Chunked,
    };
    let mut out = conn.head(
        status,
        &ex.head.content_type,
        framing,
        keep_alive,
        &ex.head.forward,
    );
    let limit = rb.limit;
    let piece = &mut rb.buf;
    let mut pending: Vec<u8> = Vec::new();
    let mut head_sent = false;
    loop {
        piece.clear();
        // For SSE, send the head at once (clients see the stream open); otherwise wait for the
        // first body bytes so head and body usually leave in one write.
        if sse && !head_sent {
            match conn.write_raw(std::mem::take(&mut out), wt).await {
                Some(back) => out = back,
                None => return gone(shard, status),
            }
            head_sent = true;
        }
        let more = match ex.next_upto(piece, limit).await {
            Ok(m) => m,
            Err(e) => {
                bump(&shard.metrics.upstream_errors);
                if !head_sent {
                    // Nothing reached the client yet: a clean error response.
                    conn.out = out;
                    return Outcome::error(conn, &e, shape, keep_alive, wt).await;
                }
                if framing == Framing::Chunked {
                    let mut ev = std::mem::take(&mut pending);
                    if sse {
                        // The dialect-correct mid-stream error event (OpenAI: a data line with
                        // an error object; Anthropic: `event: error`).
                        crate::translate::stream_error_event(dialect, &e.message, &mut ev);
                    }
                    write_chunk(&mut out, &ev);
                    out.extend_from_slice(LAST_CHUNK);
                    let _ = conn.write_raw(out, wt).await;
                }
                // A Content-Length body cut short can only be signalled by closing.
                return Outcome {
                    status: 502,
                    keep_alive: false,
                };
            }
        };
        match framing {
            Framing::Length(_) => out.extend_from_slice(piece),
            Framing::Chunked if sse => {
                pending.extend_from_slice(piece);
                let cut = if more {
                    last_event_end(&pending)
                } else {
                    pending.len()
                };
                let cut = if cut == 0 && pending.len() > MAX_PENDING_EVENT {
                    pending.len()
                } else {
                    cut
                };
                if cut > 0 {
                    write_chunk(&mut out, &pending[..cut]);
                    pending.drain(..cut);
                }
            }
            Framing::Chunked => write_chunk(&mut out, piece),
        }
        if !more && framing == Framing::Chunked {
            out.extend_from_slice(LAST_CHUNK);
        }
        if !out.is_empty() {
            match conn.write_raw(std::mem::take(&mut out), wt).await {
                Some(back) => out = back,
                None => return gone(shard, status),
            }
            head_sent = true;
        }
        if !more {
            conn.out = out;
            return Outcome { status, keep_alive };
        }
    }
}

/// The client went away mid-response: the exchange is dropped by the caller, which closes the
/// upstream connection instead of pooling it.
pub fn gone(shard: &Shard, status: u16) -> Outcome {
    bump(&shard.metrics.client_disconnects);
    Outcome {
        status,
        keep_alive: false,
    }
}

/// End offset of the last complete SSE event in `buf` (0 if none).
fn last_event_end(buf: &[u8]) -> usize {
    let lf = memchr::memmem::rfind(buf, b"\n\n").map_or(0, |i| i + 2);
    let crlf = memchr::memmem::rfind(buf, b"\r\n\r\n").map_or(0, |i| i + 4);
    lf.max(crlf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_boundaries() {
        assert_eq!(last_event_end(b"data: a\n\ndata: b"), 9);
        assert_eq!(last_event_end(b"data: a\r\n\r\n"), 11);
        assert_eq!(last_event_end(b"data: a\n"), 0);
        assert_eq!(last_event_end(b"data: a\n\ndata: b\n\n"), 18);
    }
}
