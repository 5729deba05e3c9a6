//! The one non-stream path for bodies relayed piece by piece: any non-SSE success body
//! (`bytes`: forwarded as it arrives) and a JSON answer larger than the relay chunk (`pieces`
//! with its incremental check, `vet::Scan`, from `json`). Its head goes out with the first
//! bytes (usually one write), each later read is written before the next starts, so memory
//! stays one chunk. A body that breaks once its head went out is cut by closing (a chunked end
//! or the full length would claim completeness); before that it is an `Err` (a clean error
//! answer from the sink).

use super::*;
use crate::answer::vet;
use crate::http::response::{write_chunk, LAST_CHUNK};

/// Forward a non-SSE body of `up.ex` to the client as it arrives.
pub(super) async fn bytes(
    conn: &mut ClientConn,
    env: &Env<'_>,
    up: Upstream<'_, '_, '_>,
    rb: &mut StreamBuf,
) -> Result<Outcome, Error> {
    let mut drain_over = std::pin::pin!(env.drain_expired.wait());
    let more = match stream::read(up.ex, rb, &mut drain_over).await {
        Ok(m) => m,
        // Nothing reached the client yet: a clean error response.
        Err(e) => return Err(up.failed(env, &conn.request_id, &e)),
    };
    let read = Read {
        rb,
        more,
        scan: None,
    };
    Ok(pieces(conn, env, up, read).await)
}

/// A body read so far: its first piece in `rb`, whether it goes on (`more`), and the
/// incremental check of a JSON body (`scan`; `None` for a body forwarded unchecked).
pub(super) struct Read<'r> {
    pub rb: &'r mut StreamBuf,
    pub more: bool,
    pub scan: Option<vet::Scan>,
}

/// Relay the body of `up.ex` from its first piece on (`read`), the head first. A JSON body's
/// `scan` is fed every later piece before it is written — the last piece (or the chunked end)
/// goes out only once the whole body passed, a body found bad is cut short (the client sees it
/// unfinished).
pub(super) async fn pieces(
    conn: &mut ClientConn,
    env: &Env<'_>,
    mut up: Upstream<'_, '_, '_>,
    read: Read<'_>,
) -> Outcome {
    let Read {
        rb,
        mut more,
        mut scan,
    } = read;
    let sink = up.sink(env);
    let status = up.ex.head.status;
    let framing = match up.ex.head.framing {
        RespFraming::Length(n) => Framing::Length(n as usize),
        _ => Framing::Chunked,
    };
    let (ct, fwd) = (&up.ex.head.content_type, &up.ex.head.forward);
    let mut out = conn.head(status, ct, framing, up.keep_alive, fwd);
    let mut drain_over = std::pin::pin!(env.drain_expired.wait());
    loop {
        let piece = &rb.buf[..];
        if let Some(g) = up.grant.as_deref_mut() {
            g.usage().feed(piece);
            if !more {
                g.finish();
            }
        }
        match framing {
            Framing::Length(_) => out.extend_from_slice(piece),
            Framing::Chunked => {
                write_chunk(&mut out, piece);
                if !more {
                    out.extend_from_slice(LAST_CHUNK);
                }
            }
        }
        if !more && !out.is_empty() {
            return sink.written(conn, out, status).await;
        }
        if !more {
            conn.out = out;
            return Outcome {
                status,
                keep_alive: up.keep_alive,
            };
        }
        if !out.is_empty() {
            match sink.part(conn, std::mem::take(&mut out), status).await {
                Ok(back) => out = back,
                Err(o) => return o,
            }
            stream::idle(&mut out);
        }
        let checked = match stream::read(up.ex, rb, &mut drain_over).await {
            Ok(m) => {
                more = m;
                let last = !more || up.ex.is_done();
                match scan.as_mut() {
                    Some(s) => s
                        .feed(&rb.buf)
                        .and_then(|()| if last { s.finish() } else { Ok(()) })
                        .map_err(|why| invalid(env, conn, &up, why)),
                    None => Ok(()),
                }
            }
            Err(e) => Err(up.failed(env, &conn.request_id, &e)),
        };
        if checked.is_err() {
            // The head went out: the body can only be cut short.
            conn.out = out;
            return Outcome {
                status: 502,
                keep_alive: false,
            };
        }
    }
}

/// An upstream JSON answer found invalid (`why`), reported.
pub(super) fn invalid(env: &Env<'_>, conn: &ClientConn, up: &Upstream, why: &str) -> Error {
    let e = Error::new(Kind::UpstreamProtocol, format!("upstream answer: {why}"));
    up.failed(env, &conn.request_id, &e)
}
