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

/// Room for a response head's own lines (status, type, framing, request id, CORS).
const HEAD_ROOM: usize = 512;

pub(super) async fn relay_json(
    conn: &mut ClientConn,
    env: &Env<'_>,
    up: Upstream<'_, '_, '_>,
    rb: &mut StreamBuf,
) -> Outcome {
    let Upstream {
        ex,
        provider,
        dialect,
        mut grant,
        keep_alive,
        permit,
        ..
    } = up;
    let wt = env.limits.write_timeout;
    let shape = crate::answer::outcome::shape(dialect);
    let status = ex.head.status;
    let limit = rb.limit;
    let piece = &mut rb.buf;
    piece.clear();
    // the body is on its way (its head arrived): room for it, at most the chunk
    piece.reserve(match ex.head.framing {
        RespFraming::Length(n) => (n as usize).min(limit),
        _ => limit,
    });
    let mut drain_over = std::pin::pin!(env.drain_expired.wait());
    // Fill the chunk: most answers end inside it.
    let mut more = true;
    while more && !ex.is_done() && piece.len() < limit {
        match stream::read_upto(ex, piece, limit, &mut drain_over).await {
            Ok(m) => more = m,
            Err(e) => {
                let e = report(env, &conn.request_id, provider, &e);
                return Outcome::error(conn, &e, shape, keep_alive, wt).await;
            }
        }
    }
    if let Some(sess) = env.guard.clone().filter(|s| !s.response.is_empty()) {
        let up = Upstream {
            ex,
            provider,
            dialect,
            grant,
            strip_usage: false,
            keep_alive,
            permit,
        };
        return guarded(conn, env, up, (piece, more, &sess)).await;
    }
    let rid = conn.request_id;
    let invalid = |why: &str| {
        let e = Error::new(Kind::UpstreamProtocol, format!("upstream answer: {why}"));
        report(env, &rid, provider, &e)
    };
    if !more || ex.is_done() {
        if let Err(why) = vet::json(piece) {
            let e = invalid(&why);
            return Outcome::error(conn, &e, shape, keep_alive, wt).await;
        }
        if let Some(g) = grant.as_deref_mut() {
            g.usage().feed(piece);
            g.finish();
        }
        let (ct, fwd) = (&ex.head.content_type, &ex.head.forward);
        // head and body leave in one write: one allocation for both
        conn.out.reserve(HEAD_ROOM + fwd.len() + piece.len());
        let mut out = conn.head(status, ct, Framing::Length(piece.len()), keep_alive, fwd);
        out.extend_from_slice(piece);
        return match conn.write_raw(out, wt).await {
            Some(back) => {
                conn.out = back;
                Outcome { status, keep_alive }
            }
            None => gone(env.metrics, status),
        };
    }
    let mut scan = vet::Scan::new();
    if let Err(why) = scan.feed(piece) {
        // Nothing reached the client yet.
        let e = invalid(why);
        return Outcome::error(conn, &e, shape, keep_alive, wt).await;
    }
    let framing = match ex.head.framing {
        RespFraming::Length(n) => Framing::Length(n as usize),
        _ => Framing::Chunked,
    };
    let (ct, fwd) = (&ex.head.content_type, &ex.head.forward);
    let mut out = conn.head(status, ct, framing, keep_alive, fwd);
    loop {
        if let Some(g) = grant.as_deref_mut() {
            g.usage().feed(piece);
            if !more {
                g.finish();
            }
        }
        match framing {
            Framing::Length(_) => out.extend_from_slice(piece),
            Framing::Chunked => write_chunk(&mut out, piece),
        }
        if !more && framing == Framing::Chunked {
            out.extend_from_slice(LAST_CHUNK);
        }
        if !out.is_empty() {
            match conn.write_raw(std::mem::take(&mut out), wt).await {
                Some(back) => out = back,
                None => return gone(env.metrics, status),
            }
        }
        if !more {
            conn.out = out;
            return Outcome { status, keep_alive };
        }
        piece.clear();
        let checked = match stream::read_upto(ex, piece, limit, &mut drain_over).await {
            Ok(m) => {
                more = m;
                // The last piece (or the chunked end) goes out only once the whole body passed.
                let last = !more || ex.is_done();
                scan.feed(piece)
                    .and_then(|()| if last { scan.finish() } else { Ok(()) })
                    .map_err(&invalid)
            }
            Err(e) => Err(report(env, &conn.request_id, provider, &e)),
        };
        if checked.is_err() {
            // The head went out: the body can only be cut short (the client sees it unfinished).
            return Outcome {
                status: 502,
                keep_alive: false,
            };
        }
    }
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
) -> Outcome {
    let Upstream {
        ex,
        provider,
        dialect,
        grant,
        keep_alive,
        permit,
        ..
    } = up;

    let wt = env.limits.write_timeout;
    let shape = crate::answer::outcome::shape(dialect);
    let status = ex.head.status;
    let mut body = std::mem::take(piece);
    let mut charged = 0u64;
    while more && !ex.is_done() {
        match ex.next(&mut body).await {
            Ok(m) => more = m,
            Err(e) => {
                let e = report(env, &conn.request_id, provider, &e);
                *piece = body;
                return Outcome::error(conn, &e, shape, keep_alive, wt).await;
            }
        }
        let over = body.len() > MAX_GUARDED_BODY;
        if over || permit.charge_capacity(&body, &mut charged).is_err() {
            *piece = body;
            let e = if over {
                Error::new(Kind::UpstreamProtocol, "upstream answer too large")
            } else {
                Error::overloaded("memory budget")
            };
            return Outcome::error(conn, &e, shape, keep_alive, wt).await;
        }
    }
    if let Err(why) = vet::json(&body) {
        *piece = body;
        let e = Error::new(Kind::UpstreamProtocol, format!("upstream answer: {why}"));
        let e = report(env, &conn.request_id, provider, &e);
        return Outcome::error(conn, &e, shape, keep_alive, wt).await;
    }
    if let Some(g) = grant {
        g.usage().feed(&body);
        g.finish();
    }
    let answer = crate::guardrail::answer::guard_answer(sess, dialect, &body);
    let out = match answer {
        Ok(Some(masked)) => masked,
        Ok(None) => body.clone(),
        Err(e) => {
            *piece = body;
            return Outcome::error(conn, &e, shape, keep_alive, wt).await;
        }
    };
    *piece = body;
    let ok = conn
        .respond(
            status,
            &ex.head.content_type,
            &ex.head.forward,
            &out,
            keep_alive,
            wt,
        )
        .await;
    Outcome {
        status,
        keep_alive: ok && keep_alive,
    }
}
