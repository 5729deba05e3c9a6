//! The skeleton both stream loops stand on (`relay`, passthrough vetted event by event, and
//! `bridge`, translated event by event): the one read buffer a stream holds (`StreamBuf`,
//! charged a chunk, holding bytes only while it has some; `idle` for the loops' other buffers), the
//! bound on a partial event (`MAX_PENDING_EVENT`), one upstream read raced against the drain's
//! end (`read`), and how a stream that already sent bytes ends — its last events, an in-band
//! error event when it broke, the chunked end, in one write (`end`).
//!
//! Owns: the stream read buffer, the drain-raced upstream read (`read_upto`, also for the
//! non-stream answers of `relay`), the stream's last write and how a broken or refused stream
//! ends (`broken`: in-band error event, chunked end, its recorded status). Must not:
//! vet, translate or rewrite events (the loops' strategies do), decide whether a failure is
//! in-band (only after the head went out; before, the error is answered by `Outcome::error`).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::admit::{Permit, Reserved};
use crate::answer::outcome::Outcome;
use crate::error::{Error, Side};
use crate::forward::report::shutting_down;
use crate::forward::Env;
use crate::http::conn::ClientConn;
use crate::http::response::{write_chunk, LAST_CHUNK};
use crate::upstream::Exchange;

/// A stream's upstream read buffer: one pool chunk's worth of the request's permit, held for the
/// stream's life, and a buffer allocated only while bytes are in it. Every relayed piece fits
/// in the chunk's size (`Exchange::next_upto`), so a stream is charged one chunk of read
/// buffer however fast the upstream or slow the client; between reads — the whole time an
/// idle stream waits for its next event — it holds at most `KEEP` bytes of buffer
/// (a paced stream's event; a batched read's larger buffer is given back, see `idle`).
pub struct StreamBuf {
    _held: Reserved,
    pub buf: Vec<u8>,
    pub limit: usize,
}

impl StreamBuf {
    pub fn new(env: &Env<'_>, permit: &Permit) -> Result<StreamBuf, Error> {
        let pool = env.admission.pool();
        let held = pool
            .reserve(permit)
            .map_err(|r| Error::overloaded(r.as_str()))?;
        Ok(StreamBuf {
            _held: held,
            buf: Vec::new(),
            limit: pool.chunk_size(),
        })
    }
}

/// Most buffer bytes a stream keeps across a wait for its next upstream bytes: a few paced
/// events' worth, so the common stream reuses its buffers read after read, while a larger one
/// (a batched read, a long event) is freed before the wait (issue 23: memory per open stream).
pub const KEEP: usize = 2 << 10;

/// Empty `buf` before a wait: kept for reuse when at most `KEEP` bytes, else freed.
pub fn idle(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP {
        *buf = Vec::new();
    } else {
        buf.clear();
    }
}

/// Largest partial SSE event held while waiting for its end (charged to the request's permit as
/// it grows). Whole events only are forwarded, so a larger one is an upstream error; Responses'
/// `response.completed` repeats the whole answer and is the largest event seen in practice.
pub const MAX_PENDING_EVENT: usize = 4 << 20;

/// One upstream read into `rb` (emptied first, see `idle`; at most one chunk), or the drain's
/// end (`drain_over`, pinned once per stream) as a shutting-down error. `Ok(false)`: the body
/// ended.
pub(crate) async fn read<F: Future>(
    ex: &mut Exchange<'_>,
    rb: &mut StreamBuf,
    drain_over: &mut Pin<&mut F>,
) -> Result<bool, Error> {
    idle(&mut rb.buf);
    read_upto(ex, &mut rb.buf, rb.limit, drain_over).await
}

/// The one drain-raced upstream read every answer path uses: the next body bytes appended to
/// `buf` (never past `limit` bytes), or the drain's end as a shutting-down error (the read is
/// dropped with the exchange's connection). `Ok(false)`: the body ended.
pub(crate) async fn read_upto<F: Future>(
    ex: &mut Exchange<'_>,
    buf: &mut Vec<u8>,
    limit: usize,
    drain_over: &mut Pin<&mut F>,
) -> Result<bool, Error> {
    monoio::select! {
        r = ex.next_upto(buf, limit) => r,
        _ = drain_over.as_mut() => Err(shutting_down()),
    }
}

/// The last write of a stream whose head already went out: `out` (whole events already framed),
/// then `events` as one chunk (the last events, an in-band error event), then the chunked end.
/// The message is complete for the client either way; true when the write reached it.
pub(crate) async fn end(
    conn: &mut ClientConn,
    mut out: Vec<u8>,
    events: &[u8],
    wt: Duration,
) -> bool {
    write_chunk(&mut out, events);
    out.extend_from_slice(LAST_CHUNK);
    conn.write_raw(out, wt).await.is_some()
}

/// How a stream whose head already went out ends when it breaks (upstream cut or malformed,
/// the drain's end) or is refused (a guardrail `block`, the memory budget): `out` (whole events
/// already framed), then `events` (the last events and the client dialect's error event), the
/// chunked end, in one write — the same for passthrough and translated streams. Recorded with
/// `status` (502 for an upstream failure, the refusal's own status otherwise); the client's
/// connection stays when the write reached it and the process is not draining: the message is
/// complete, and closing would race the client's next request on it.
pub(crate) async fn broken(
    conn: &mut ClientConn,
    env: &Env<'_>,
    (out, events): (Vec<u8>, &[u8]),
    status: u16,
    keep_alive: bool,
) -> Outcome {
    let written = end(conn, out, events, env.limits.write_timeout).await;
    Outcome {
        status,
        keep_alive: keep_alive && written && !env.draining.is_fired(),
    }
}

/// The status a stream broken by `e` after its head is recorded with: an upstream failure is a
/// 502 (whatever its kind), a refusal keeps its own (400 `guardrail_blocked`, 503 budget).
pub(crate) fn broken_status(e: &Error) -> u16 {
    match e.side() {
        Side::Upstream => 502,
        _ => e.status(),
    }
}
