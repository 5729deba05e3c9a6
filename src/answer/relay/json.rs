//! Same-dialect non-stream JSON answers (2xx, a JSON content type): vetted before they reach
//! the client. The relay chunk is filled first; a body that ends inside it (nearly all of them)
//! is validated whole (`vet::json`: sonic-rs, UTF-8, depth bound) before its head goes out, with
//! no extra copy — invalid is a clean 502 in the client's dialect. A larger body is relayed
//! piece by piece through the same chunk (memory stays one chunk) under the incremental
//! structural check (`vet::Scan`), its final piece (or chunked end) held back until the check
//! passes: a body found bad is cut short, which the client detects (Content-Length or chunked
//! framing unfinished). Under response guardrails the answer is read whole (charged to the
//! permit, at most 64 MiB), vetted, then masked or refused (`guarded`).

use super::*;
use crate::answer::vet;
use crate::answer::Whole;

/// Room for a response head's own lines (status, type, framing, request id, CORS).
const HEAD_ROOM: usize = 512;

pub(super) async fn relay_json(
    conn: &mut ClientConn,
    env: &Env<'_>,
    mut up: Upstream<'_, '_, '_>,
    rb: &mut StreamBuf,
) -> Result<Outcome, Error> {
    let status = up.ex.head.status;
    let limit = rb.limit;
    let piece = &mut rb.buf;
    piece.clear();
    // the body is on its way (its head arrived): room for it, at most the chunk
    piece.reserve(match up.ex.head.framing {
        RespFraming::Length(n) => (n as usize).min(limit),
        _ => limit,
    });
    let mut drain_over = std::pin::pin!(env.drain_expired.wait());
    // Fill the chunk: most answers end inside it.
    let mut more = true;
    while more && !up.ex.is_done() && piece.len() < limit {
        match stream::read_upto(up.ex, piece, limit, &mut drain_over).await {
            Ok(m) => more = m,
            Err(e) => return Err(up.failed(env, &conn.request_id, &e)),
        }
    }
    if let Some(sess) = env.guard.clone().filter(|s| !s.response.is_empty()) {
        return guarded(conn, env, up, (piece, more, &sess)).await;
    }
    if !more || up.ex.is_done() {
        vet::json(piece).map_err(|why| body::invalid(env, conn, &up, &why))?;
        if let Some(g) = up.grant.as_deref_mut() {
            g.usage().feed(piece);
            g.finish();
        }
        let (ct, fwd) = (&up.ex.head.content_type, &up.ex.head.forward);
        // head and body leave in one write: one allocation for both
        conn.out.reserve(HEAD_ROOM + fwd.len() + piece.len());
        let mut out = conn.head(status, ct, Framing::Length(piece.len()), up.keep_alive, fwd);
        out.extend_from_slice(piece);
        return Ok(up.sink(env).written(conn, out, status).await);
    }
    let mut scan = vet::Scan::new();
    // Nothing reached the client yet.
    scan.feed(piece)
        .map_err(|why| body::invalid(env, conn, &up, why))?;
    let read = body::Read {
        rb,
        more,
        scan: Some(scan),
    };
    Ok(body::pieces(conn, env, up, read).await)
}

/// Largest non-stream answer read whole for the response guardrails.
const MAX_GUARDED_BODY: usize = 64 * 1024 * 1024;

/// A JSON answer under response guardrails: read whole (charged to the permit), vetted, then
/// checked — `block` answers 400 `guardrail_blocked`, `mask` relays the masked answer.
async fn guarded(
    conn: &mut ClientConn,
    env: &Env<'_>,
    up: Upstream<'_, '_, '_>,
    (piece, mut more, sess): (&mut Vec<u8>, bool, &crate::guardrail::Session),
) -> Result<Outcome, Error> {
    let ex = up.ex;
    let mut body = std::mem::take(piece);
    let mut charged = 0u64;
    while more && !ex.is_done() {
        more = ex
            .next(&mut body)
            .await
            .map_err(|e| report(env, &conn.request_id, up.provider, &e))?;
        if body.len() > MAX_GUARDED_BODY {
            return Err(Error::new(
                Kind::UpstreamProtocol,
                "upstream answer too large",
            ));
        }
        if up.permit.charge_capacity(&body, &mut charged).is_err() {
            return Err(Error::overloaded("memory budget"));
        }
    }
    if let Err(why) = vet::json(&body) {
        let e = Error::new(Kind::UpstreamProtocol, format!("upstream answer: {why}"));
        return Err(report(env, &conn.request_id, up.provider, &e));
    }
    if let Some(g) = up.grant {
        g.usage().feed(&body);
        g.finish();
    }
    let masked = crate::guardrail::answer::guard_answer(sess, up.dialect, &body)?;
    let w = Whole {
        status: ex.head.status,
        content_type: &ex.head.content_type,
        extra: &ex.head.forward,
        body: masked.as_deref().unwrap_or(&body),
    };
    let sink = Sink::of(env, up.keep_alive);
    Ok(sink.whole(conn, w).await)
}
