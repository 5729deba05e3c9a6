//! The skeleton both stream loops stand on (`relay`, passthrough vetted event by event, and
//! `bridge`, translated event by event): the one read buffer a stream holds (`StreamBuf`), the
//! bound on a partial event (`MAX_PENDING_EVENT`), one upstream read raced against the drain's
//! end (`read`), and how a stream that already sent bytes ends — its last events, an in-band
//! error event when it broke, the chunked end, in one write (`end`).
//!
//! Owns: the stream read buffer, the per-read drain race, the stream's last write. Must not:
//! vet, translate or rewrite events (the loops' strategies do), decide whether a failure is
//! in-band (only after the head went out; before, the error is answered by `Outcome::error`).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::admit::{Chunk, Permit};
use crate::error::Error;
use crate::forward::report::shutting_down;
use crate::forward::Env;
use crate::http::conn::ClientConn;
use crate::http::response::{write_chunk, LAST_CHUNK};
use crate::upstream::Exchange;

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
    pub fn new(env: &Env<'_>, permit: &Permit) -> Result<StreamBuf, Error> {
        let pool = env.admission.pool();
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

/// Largest partial SSE event held while waiting for its end (charged to the request's permit as
/// it grows). Whole events only are forwarded, so a larger one is an upstream error; Responses'
/// `response.completed` repeats the whole answer and is the largest event seen in practice.
pub const MAX_PENDING_EVENT: usize = 4 << 20;

/// One upstream read into `rb` (cleared first, at most one chunk), or the drain's end
/// (`drain_over`, pinned once per stream) as a shutting-down error. `Ok(false)`: the body ended.
pub(crate) async fn read<F: Future>(
    ex: &mut Exchange<'_>,
    rb: &mut StreamBuf,
    drain_over: &mut Pin<&mut F>,
) -> Result<bool, Error> {
    rb.buf.clear();
    let limit = rb.limit;
    monoio::select! {
        r = ex.next_upto(&mut rb.buf, limit) => r,
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
