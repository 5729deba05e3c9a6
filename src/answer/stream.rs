//! The one stream loop (`run`) for passthrough and translated SSE answers, with the per-event
//! strategy as its parameter (`Events`: passthrough vetting is `relay::Vetted`, translation
//! `bridge::Translated`), and what it stands on: the read buffer a stream holds (`StreamBuf`,
//! charged a chunk, holding bytes only while it has some; `idle` for the loop's other
//! buffers), the bound on a partial event (`MAX_PENDING_EVENT`), one upstream read raced
//! against the drain's end (`read`, `read_upto`), the response guardrails on the client's
//! events, and how a stream that already sent bytes ends — its last events, an in-band error
//! event when it broke or was refused, the chunked end, in one write (`end`, `broken`).
//!
//! Owns: the stream loop, the stream read buffer, the drain-raced upstream read (also for the
//! non-stream answers of `relay`), the stream's last write and how a broken or refused stream
//! ends (in-band error event, chunked end, its recorded status). Must not: vet or translate
//! events (the strategies do), or answer a failure before the head went out (that is
//! `Sink::error`, reached by returning it: only after the head is an error in-band).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::admit::{Permit, Reserved};
use crate::answer::outcome::Outcome;
use crate::answer::Sink;
use crate::dialect::Dialect;
use crate::error::{Error, Kind, Side};
use crate::forward::report::{report, shutting_down};
use crate::forward::Env;
use crate::http::conn::ClientConn;
use crate::http::response::{write_chunk, LAST_CHUNK};
use crate::upstream::{Exchange, RespFraming};

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

/// Where the trailing bytes of an answer that completed before its body ended stop being read
/// (the connection is dropped instead of pooled past this).
const MAX_TRAILING: usize = 64 * 1024;

/// What one upstream piece did to a stream (`Events::feed`).
pub(crate) struct Fed {
    /// The answer's last event is out (or goes out with this batch): the answer completes
    /// (`Events::complete`) and the guardrails flush what they hold.
    pub terminal: bool,
    /// The client's stream ends with this batch (the body ended, or the translator finished).
    pub done: bool,
    /// The stream breaks after this batch (a malformed, cut or oversized upstream event, a
    /// budget refusal): its error event follows the batch.
    pub failed: Option<Error>,
}

/// The per-event strategy of the one stream loop (`run`): passthrough vetting
/// (`relay::Vetted`) or translation (`bridge::Translated`). Each upstream piece is fed in; the
/// whole client-dialect events it completed are the batch the loop guards, frames and writes.
pub(crate) trait Events {
    /// Take one upstream piece (`more`: the body goes on).
    fn feed(&mut self, piece: &[u8], more: bool) -> Fed;
    /// The whole client events of the last feed (and of `complete`), not framed.
    fn batch(&self) -> &[u8];
    /// The batch went out (or will not): drop it.
    fn sent(&mut self);
    /// The answer completed: its closing events are added to the batch, its usage counted and
    /// a Responses answer recorded — before the client sees the end.
    async fn complete(&mut self, env: &Env<'_>);
    /// The client dialect's error event for `message`, appended to `out`.
    fn error_event(&mut self, message: &str, out: &mut Vec<u8>);
}

/// The client's side of a stream: its response head (built by `ClientConn::head`, chunked,
/// not yet sent) and status, its dialect, whether its connection stays, its permit.
pub(crate) struct Client<'p> {
    pub head: Vec<u8>,
    pub status: u16,
    pub dialect: Dialect,
    pub keep_alive: bool,
    pub permit: &'p Permit,
}

/// The one stream loop, for passthrough and translated SSE alike: the head goes out at once,
/// then each upstream read (`read`, drain-raced, one chunk) is fed to `ev`; the whole client
/// events it yields pass the response guardrails (`guardrail::stream`: rewritten in flight,
/// held-back text charged to the permit) and go out framed, one write per read — the next
/// read starts only after that write finished, so memory per stream stays one chunk.
/// A stream that breaks or is refused ends with the client dialect's error event
/// (`broken`); one that completes before its upstream body ended has the rest read (bounded)
/// so the upstream connection can be pooled.
pub(crate) async fn run<E: Events>(
    conn: &mut ClientConn,
    env: &Env<'_>,
    (ex, provider): (&mut Exchange<'_>, &str),
    client: Client<'_>,
    ev: &mut E,
    rb: &mut StreamBuf,
) -> Outcome {
    let Client {
        head,
        status,
        dialect,
        keep_alive,
        permit,
    } = client;
    let close_delimited = ex.head.framing == RespFraming::Close;
    let sink = Sink::of(env, keep_alive);
    let mut out = match sink.part(conn, head, status).await {
        Ok(back) => back,
        Err(o) => return o,
    };
    let mut guard = env
        .guard
        .as_ref()
        .and_then(|s| crate::guardrail::stream::StreamGuard::new(s, dialect));
    let (mut rewritten, mut held_charged) = (Vec::new(), 0u64);
    let mut terminal = false;
    let mut drain_over = std::pin::pin!(env.drain_expired.wait());
    loop {
        idle(&mut rewritten);
        let more = match read(ex, rb, &mut drain_over).await {
            Ok(m) => m,
            Err(e) => {
                let e = report(env, &conn.request_id, provider, &e);
                return end_broken(conn, env, (out, terminal, status), ev, &e, keep_alive).await;
            }
        };
        let mut fed = ev.feed(&rb.buf, more);
        if !more && close_delimited && !(terminal || fed.terminal) && fed.failed.is_none() {
            // A close-delimited body ends the same way whether complete or cut: only its
            // dialect's terminal event tells.
            let msg = "the upstream stream ended before its last event";
            fed.failed = Some(Error::new(Kind::UpstreamProtocol, msg));
        }
        let done = !more || fed.done;
        if fed.failed.is_none() && (fed.terminal || done) && !terminal {
            ev.complete(env).await;
        }
        terminal = terminal || fed.terminal;
        let mut batch = ev.batch();
        if let Some(g) = guard.as_mut() {
            let r = g.rewrite(batch, &mut rewritten).and_then(|()| {
                if fed.failed.is_none() && (terminal || done) {
                    g.finish(&mut rewritten)
                } else {
                    Ok(())
                }
            });
            // a block, or held-back text the budget cannot take: the stream ends with the
            // error event (nothing of a match was written)
            let refused = match r {
                Err(b) => Some(Error::new(Kind::GuardrailBlocked, b.message())),
                Ok(()) => {
                    let held = g.held() as u64;
                    match (held > held_charged).then(|| permit.grow(held - held_charged)) {
                        Some(Err(r)) => Some(Error::overloaded(r.as_str())),
                        _ => {
                            held_charged = held_charged.max(held);
                            None
                        }
                    }
                }
            };
            if let Some(e) = refused {
                // the gateway's own event, whatever state the translator is in (it may have
                // closed its stream already: the match completed with its last events)
                write_chunk(&mut out, &rewritten);
                let mut events = Vec::new();
                crate::dialect::stream_error_event(dialect, &e.message, &mut events);
                let status = broken_status(&e);
                return broken(conn, env, (out, &events), status, keep_alive).await;
            }
            batch = &rewritten;
        }
        write_chunk(&mut out, batch);
        ev.sent();
        if let Some(e) = fed.failed {
            let e = match e.side() {
                Side::Upstream => report(env, &conn.request_id, provider, &e),
                _ => e,
            };
            return end_broken(conn, env, (out, terminal, status), ev, &e, keep_alive).await;
        }
        if done {
            out.extend_from_slice(LAST_CHUNK);
        }
        match sink.part(conn, out, status).await {
            Ok(back) => out = back,
            Err(o) => return o,
        }
        // written: what the stream holds while it waits is small (`idle`)
        idle(&mut out);
        if done {
            conn.out = out;
            if more && !ex.is_done() {
                // The client's stream is complete; the rest of the upstream body (trailing
                // bytes after the terminal event) is read, bounded, to pool the connection.
                let mut rest = 0usize;
                while rest <= MAX_TRAILING {
                    match read(ex, rb, &mut drain_over).await {
                        Ok(true) => rest += rb.buf.len(),
                        _ => break,
                    }
                }
            }
            return Outcome { status, keep_alive };
        }
    }
}

/// End a broken stream after its head: the error event, unless the answer's terminal event
/// already went out (then it is complete for the client and just ends, with its status).
async fn end_broken<E: Events>(
    conn: &mut ClientConn,
    env: &Env<'_>,
    (out, terminal, status): (Vec<u8>, bool, u16),
    ev: &mut E,
    e: &Error,
    keep_alive: bool,
) -> Outcome {
    let mut events = Vec::new();
    if !terminal {
        ev.error_event(&e.message, &mut events);
    }
    let status = if terminal { status } else { broken_status(e) };
    broken(conn, env, (out, &events), status, keep_alive).await
}
