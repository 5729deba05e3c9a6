//! The one sink of answers: a whole answer (head and body in one write, `whole`), an answer its
//! writer already framed (`written`: a JSON answer's head with its body, a body's last piece,
//! a CORS preflight; `part`: a body's or a stream's earlier parts), and the error response of every failure before
//! any byte of an answer went out (`error`: the pipeline's `handle` answers each such failure
//! here, in the client's dialect — the answer stage returns them to it instead of writing
//! them). Its users that write as bytes arrive are the one non-stream piece path
//! (`relay::body`), the one stream loop (`answer::stream::run`) and the surface's relay of
//! files and audio (`surface::serve`); MCP's whole answers (`mcp::serve::Reply`) are written
//! here by the pipeline.
//!
//! Owns: turning an answer's bytes into a write on the client connection and its `Outcome`.
//! Must not: decide what to answer (the stages do), count (beyond a client gone) or log.

use std::time::Duration;

use crate::answer::outcome::{gone, Outcome};
use crate::error::{Error, ErrorShape};
use crate::forward::Env;
use crate::http::conn::ClientConn;
use crate::observe::metrics::ShardMetrics;

/// Where a request's answer goes: whether its connection may stay after it, the write
/// timeout, the shard's counters (a client gone mid-write).
#[derive(Clone, Copy)]
pub struct Sink<'a> {
    pub metrics: &'a ShardMetrics,
    pub keep_alive: bool,
    pub wt: Duration,
}

/// A whole answer: its status, content type, extra header lines (CRLF-terminated) and body.
pub struct Whole<'b> {
    pub status: u16,
    pub content_type: &'b [u8],
    pub extra: &'b [u8],
    pub body: &'b [u8],
}

impl<'a> Sink<'a> {
    /// The sink of a forwarded request's answer.
    pub fn of(env: &Env<'a>, keep_alive: bool) -> Sink<'a> {
        Sink {
            metrics: env.metrics,
            keep_alive,
            wt: env.limits.write_timeout,
        }
    }

    /// Write `w` (head and body in one write, `Content-Length` framed).
    pub async fn whole(&self, conn: &mut ClientConn, w: Whole<'_>) -> Outcome {
        let keep = self.keep_alive;
        let ok = conn
            .respond(w.status, w.content_type, w.extra, w.body, keep, self.wt)
            .await;
        Outcome {
            status: w.status,
            keep_alive: ok && keep,
        }
    }

    /// Write `out`, an answer's bytes as its writer framed them (built on `ClientConn::head`),
    /// recorded with `status`; the buffer goes back to the connection.
    pub async fn written(&self, conn: &mut ClientConn, out: Vec<u8>, status: u16) -> Outcome {
        match conn.write_raw(out, self.wt).await {
            Some(back) => {
                conn.out = back;
                Outcome {
                    status,
                    keep_alive: self.keep_alive,
                }
            }
            None => gone(self.metrics, status),
        }
    }

    /// Write `out`, a part of an answer whose end follows (a body's head and first pieces, a
    /// stream's head and events): its buffer comes back for the next part, or the client is
    /// gone (the answer's `Outcome`, recorded with `status`).
    pub async fn part(
        &self,
        conn: &mut ClientConn,
        out: Vec<u8>,
        status: u16,
    ) -> Result<Vec<u8>, Outcome> {
        conn.write_raw(out, self.wt)
            .await
            .ok_or_else(|| gone(self.metrics, status))
    }

    /// Answer a failure that happened before any byte of the answer went out: `e` in the error
    /// body `shape` of the client's dialect (its request id is on every response head, see
    /// `ClientConn::start_request`; an upstream failure's generic message names it too).
    pub async fn error(&self, conn: &mut ClientConn, e: &Error, shape: ErrorShape) -> Outcome {
        let keep = conn.respond_error(e, shape, self.keep_alive, self.wt).await;
        Outcome {
            status: e.status(),
            keep_alive: keep,
        }
    }
}
