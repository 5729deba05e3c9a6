//! Relaying a same-dialect upstream answer to the client: bytes forwarded as they arrive, SSE
//! forwarded in whole events and flushed per event, broken streams (upstream cut,
//! close-delimited without the terminal event, drain over) ended with a dialect-correct error
//! event and a proper chunked end, and client disconnects releasing the upstream connection
//! (dropped, never pooled).
//!
//! What is relayed is vetted first (`vet`), so a broken upstream never reaches an SDK as a JSON
//! decode error: error answers (status ≥ 400) are relayed only when already in the client
//! dialect's error shape, else replaced (`errors`); non-stream JSON answers are validated
//! before (or, past one chunk, while) they are relayed (`json`); every SSE event's `data` must
//! be JSON, an event that is not ends the stream with the dialect's error event. A Chat
//! stream whose usage chunk the gateway asked for on the client's behalf has that chunk taken
//! out (`usage_chunk`), after its usage was read.
//!
//! A request with response guardrails (`Env::guard`) has its whole SSE events rewritten in
//! flight before they are written (`guardrail::stream`: masked text, held-back tails charged to
//! the permit; a `block` match ends the stream with the dialect's error event instead of the
//! event that matched), and its JSON answer read whole and checked (`json::guarded`).
//!
//! Owns: the upstream → client byte path of passthrough answers (its read buffer, drain-raced
//! read and last write are the shared skeleton in `answer::stream`). Must not: read
//! the client's request body, choose routes or send upstream requests (that is `forward`).
//! Back-pressure is structural: the next upstream read starts only after the previous write
//! to the client finished, so at most one read buffer per stream is held (error bodies, read
//! whole up to 1 MiB, are charged to the permit).

mod errors;
pub(crate) use errors::error_answer;
mod json;
mod usage_chunk;

use crate::admit::Permit;
use crate::answer::outcome::{gone, Outcome};
use crate::answer::stream::{self, StreamBuf, MAX_PENDING_EVENT};
use crate::dialect::Dialect;
use crate::error::{Error, Kind};
use crate::forward::open::{Call, Opened};
use crate::forward::plan::Mode;
use crate::forward::report::report;
use crate::forward::Env;
use crate::governance::Grant;
use crate::http::conn::ClientConn;
use crate::http::response::{write_chunk, Framing, LAST_CHUNK};
use crate::upstream::{Exchange, RespFraming};

/// Same dialect in and out: relay the answer of `opened` (in `call`'s dialect) to the client
/// as it arrives (SSE in whole events), through one pool chunk of read buffer charged to the
/// request's permit. A keyed request's grant, when there is one, sees every body byte (its
/// usage scan) and is finished just before the answer's last bytes go out.
pub async fn passthrough(
    conn: &mut ClientConn,
    env: &Env<'_>,
    call: &mut Call<'_>,
    opened: &mut Opened<'_>,
) -> Outcome {
    if opened.ex.head.status >= 400 {
        return errors::error_answer(conn, env, call, opened).await;
    }
    let strip_usage = matches!(opened.mode, Mode::Passthrough { strip_usage: true });
    let (provider, ex) = (opened.provider, &mut opened.ex);
    let (dialect, keep_alive, permit) = (call.dialect, call.keep_alive, call.permit);
    let grant = call.grant.as_mut();
    let mut piece = match StreamBuf::new(env, permit) {
        Ok(b) => b,
        Err(e) => {
            let (shape, wt) = (
                crate::answer::outcome::shape(dialect),
                env.limits.write_timeout,
            );
            return Outcome::error(conn, &e, shape, keep_alive, wt).await;
        }
    };
    let up = Upstream {
        ex,
        provider,
        dialect,
        grant,
        strip_usage,
        keep_alive,
        permit,
    };
    if vets_json(&up.ex.head) {
        return json::relay_json(conn, env, up, &mut piece).await;
    }
    relay(conn, env, up, &mut piece).await
}

/// A non-stream success answer with a JSON body: validated before it is relayed.
fn vets_json(head: &crate::upstream::ResponseHead) -> bool {
    (200..300).contains(&head.status)
        && !matches!(head.status, 204 | 205)
        && !head.is_event_stream()
        && crate::answer::vet::is_json_type(&head.content_type)
}

/// The upstream side of a relay: the exchange, who answers, in which dialect, whose grant
/// reads the usage it reports; and the request's side: whether its connection stays, its
/// permit.
struct Upstream<'a, 'c, 'g> {
    ex: &'a mut Exchange<'c>,
    provider: &'a str,
    dialect: Dialect,
    grant: Option<&'a mut Grant<'g>>,
    /// Take the usage-only chunk out of a Chat stream (the client did not ask for it).
    strip_usage: bool,
    keep_alive: bool,
    permit: &'a Permit,
}

/// Forward the response of `up.ex` to the client. SSE is forwarded event by event, whole events
/// only; a stream that breaks (upstream cut, a close-delimited stream without its terminal
/// event, an oversized event, the drain's end) drops its partial event and ends with the
/// dialect's error event and a proper chunked end. A broken non-SSE body is cut by closing.
async fn relay(
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
        strip_usage,
        keep_alive,
        permit,
    } = up;
    let wt = env.limits.write_timeout;
    let shape = crate::answer::outcome::shape(dialect);
    let status = ex.head.status;
    let sse = ex.head.is_event_stream();
    let close_delimited = ex.head.framing == RespFraming::Close;
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
    let mut pending: Vec<u8> = Vec::new();
    let mut charged = 0u64;
    let mut terminal = false;
    let mut head_sent = false;
    // the answer's guardrails (`guardrail::stream`): events rewritten in flight
    let mut guard = match &env.guard {
        Some(s) if sse => crate::guardrail::stream::StreamGuard::new(s, dialect),
        _ => None,
    };
    let (mut rewritten, mut held_charged) = (Vec::new(), 0u64);
    let mut drain_over = std::pin::pin!(env.drain_expired.wait());
    loop {
        stream::idle(&mut rewritten);
        // For SSE, send the head at once (clients see the stream open); otherwise wait for the
        // first body bytes so head and body usually leave in one write.
        if sse && !head_sent {
            match conn.write_raw(std::mem::take(&mut out), wt).await {
                Some(back) => out = back,
                None => return gone(env.metrics, status),
            }
            head_sent = true;
        }
        let more = match stream::read(ex, rb, &mut drain_over).await {
            Ok(m) => m,
            Err(e) => {
                let e = report(env, &conn.request_id, provider, &e);
                if !head_sent {
                    // Nothing reached the client yet: a clean error response.
                    conn.out = out;
                    return Outcome::error(conn, &e, shape, keep_alive, wt).await;
                }
                return broken(
                    conn,
                    env,
                    out,
                    (sse, terminal, status),
                    (dialect, keep_alive),
                    &e,
                )
                .await;
            }
        };
        let piece = &rb.buf[..];
        if let Some(g) = grant.as_deref_mut() {
            g.usage().feed(piece);
        }
        match framing {
            Framing::Length(_) => out.extend_from_slice(piece),
            Framing::Chunked if sse => {
                pending.extend_from_slice(piece);
                if !more && !close_delimited {
                    complete_last_line(&mut pending);
                }
                let cut = last_event_end(&pending);
                let mut bad = None;
                if cut > 0 {
                    // Whole events only, each one's data vetted: an event that is not JSON is
                    // not forwarded, the stream ends before it.
                    let (good, why) = match crate::answer::vet::sse_events(&pending[..cut]) {
                        Ok(()) => (cut, None),
                        Err((at, why)) => (at, Some(why)),
                    };
                    let mut events = &pending[..good];
                    if good > 0 {
                        terminal = terminal || is_terminal_event(dialect, last_event(events));
                        if let Some(g) = guard.as_mut() {
                            rewritten.clear();
                            let r = g.rewrite(events, &mut rewritten);
                            let r = r.and_then(|()| {
                                if terminal || (!more && pending.len() == good) {
                                    g.finish(&mut rewritten)
                                } else {
                                    Ok(())
                                }
                            });
                            // a block, or held-back text the budget cannot take: the stream
                            // ends with the error event (nothing of a match was written)
                            let refused = match r {
                                Err(b) => {
                                    write_chunk(&mut out, &rewritten);
                                    Some(Error::new(Kind::GuardrailBlocked, b.message()))
                                }
                                Ok(()) => {
                                    let held = g.held() as u64;
                                    let grown = (held > held_charged)
                                        .then(|| permit.grow(held - held_charged));
                                    match grown {
                                        Some(Err(r)) => Some(Error::overloaded(r.as_str())),
                                        _ => {
                                            held_charged = held_charged.max(held);
                                            None
                                        }
                                    }
                                }
                            };
                            if let Some(e) = refused {
                                let end = (sse, false, status);
                                let client = (dialect, keep_alive);
                                return broken(conn, env, out, end, client, &e).await;
                            }
                            events = &rewritten;
                        }
                        if strip_usage {
                            usage_chunk::write_without(&mut out, events);
                        } else {
                            write_chunk(&mut out, events);
                        }
                    }
                    bad = why;
                    pending.drain(..cut);
                    if pending.is_empty() {
                        stream::idle(&mut pending);
                    }
                }
                let problem: Option<String> = if let Some(why) = bad {
                    Some(why)
                } else if terminal {
                    // Whatever follows the terminal event is no longer part of the stream.
                    None
                } else if !more {
                    // A close-delimited body ends the same way whether complete or cut: only
                    // its dialect's terminal event tells. Any body ending mid-event is cut.
                    if close_delimited {
                        (!terminal)
                            .then(|| "the upstream stream ended before its last event".into())
                    } else {
                        pending
                            .iter()
                            .any(|b| !b.is_ascii_whitespace())
                            .then(|| "the upstream stream ended inside an event".into())
                    }
                } else if pending.len() > MAX_PENDING_EVENT {
                    Some("upstream stream event too large".into())
                } else {
                    None
                };
                if let Some(msg) = problem {
                    let e = report(
                        env,
                        &conn.request_id,
                        provider,
                        &Error::new(Kind::UpstreamProtocol, msg),
                    );
                    let end = (sse, terminal, status);
                    return broken(conn, env, out, end, (dialect, keep_alive), &e).await;
                }
                if let Err(r) = permit.charge_capacity(&pending, &mut charged) {
                    let e = Error::overloaded(r.as_str());
                    let end = (sse, terminal, status);
                    return broken(conn, env, out, end, (dialect, keep_alive), &e).await;
                }
            }
            Framing::Chunked => write_chunk(&mut out, piece),
        }
        if !more && framing == Framing::Chunked {
            out.extend_from_slice(LAST_CHUNK);
        }
        if !more || terminal {
            // the answer is complete: its usage counts before the client sees the end
            if let Some(g) = grant.as_deref_mut() {
                g.finish();
            }
        }
        if !out.is_empty() {
            match conn.write_raw(std::mem::take(&mut out), wt).await {
                Some(back) => out = back,
                None => return gone(env.metrics, status),
            }
            head_sent = true;
            // written: what the stream holds while it waits is small (`stream::idle`)
            stream::idle(&mut out);
        }
        if !more {
            conn.out = out;
            return Outcome { status, keep_alive };
        }
    }
}

/// End a response that broke after its head was sent. SSE: the whole events already in `out`,
/// the dialect-correct error event (OpenAI: a data line with an error object; Anthropic:
/// `event: error`), and the chunked end (`stream::broken`) — the client sees a well-formed
/// failure; if the stream's terminal event already went out, the stream is complete for the
/// client and just ends, recorded with its status (the upstream connection is dropped). Other
/// bodies can only be cut by closing (a chunked end or the full length would claim
/// completeness).
async fn broken(
    conn: &mut ClientConn,
    env: &Env<'_>,
    out: Vec<u8>,
    (sse, terminal, status): (bool, bool, u16),
    (dialect, keep_alive): (Dialect, bool),
    e: &Error,
) -> Outcome {
    if sse {
        let mut ev = Vec::new();
        if !terminal {
            crate::dialect::stream_error_event(dialect, &e.message, &mut ev);
        }
        let status = if terminal {
            status
        } else {
            stream::broken_status(e)
        };
        return stream::broken(conn, env, (out, &ev), status, keep_alive).await;
    }
    Outcome {
        status: 502,
        keep_alive: false,
    }
}

/// At the framed end of a body, a last event whose lines are complete but lacks its blank line
/// is completed (several upstreams omit it). A last line cut mid-way is left as it is.
fn complete_last_line(pending: &mut Vec<u8>) {
    if !pending.iter().any(|b| !b.is_ascii_whitespace()) {
        return;
    }
    if pending.ends_with(b"\r\n") {
        pending.extend_from_slice(b"\r\n");
    } else if pending.ends_with(b"\n") {
        pending.push(b'\n');
    }
}

/// The last of the whole SSE `events` (they end with a blank line).
fn last_event(events: &[u8]) -> &[u8] {
    let kept = events
        .iter()
        .rposition(|b| !matches!(b, b'\n' | b'\r'))
        .map_or(0, |i| i + 1);
    let start = last_event_end(events.get(..kept).unwrap_or_default());
    events.get(start..).unwrap_or_default()
}

/// Whether one whole SSE event is the dialect's terminal event: Chat `data: [DONE]`, Messages
/// `message_stop`, Responses `response.completed` / `.incomplete` / `.failed`, Gemini a
/// `finishReason`. Only the event's first bytes are looked at (its `event:` line and the JSON
/// `type`, which comes first); a JSON string cannot hold a raw newline or an unescaped quote,
/// so these patterns never match inside content. Costs a few short scans per relayed piece.
fn is_terminal_event(dialect: Dialect, ev: &[u8]) -> bool {
    let head = ev.get(..ev.len().min(256)).unwrap_or(ev);
    let at_line_start = |pat: &[u8]| {
        memchr::memmem::find_iter(head, pat)
            .any(|i| i == 0 || matches!(head.get(i - 1), Some(b'\n' | b'\r')))
    };
    let has = |pat: &[u8]| memchr::memmem::find(head, pat).is_some();
    match dialect {
        Dialect::Chat => at_line_start(b"data: [DONE]") || at_line_start(b"data:[DONE]"),
        Dialect::Messages => {
            at_line_start(b"event: message_stop") || has(b"\"type\":\"message_stop\"")
        }
        Dialect::Responses => [
            (
                &b"event: response.completed"[..],
                &b"\"type\":\"response.completed\""[..],
            ),
            (
                b"event: response.incomplete",
                b"\"type\":\"response.incomplete\"",
            ),
            (b"event: response.failed", b"\"type\":\"response.failed\""),
        ]
        .iter()
        .any(|(line, typed)| at_line_start(line) || has(typed)),
        Dialect::Gemini => memchr::memmem::find(ev, b"\"finishReason\"").is_some(),
    }
}

/// End offset of the last complete SSE event in `buf` (0 if none): just past the last `\n\n`
/// or `\r\n\r\n`. One backward SIMD scan for `\n` that stops at the first blank line from the
/// end (a `memmem::rfind` per pattern scanned the whole buffer whenever a pattern was absent,
/// e.g. `\r\n\r\n` in every LF-only stream: ~14 instructions per pending byte per piece).
fn last_event_end(buf: &[u8]) -> usize {
    for i in memchr::memrchr_iter(b'\n', buf) {
        let before = buf.get(..i).unwrap_or_default();
        if before.ends_with(b"\n") || before.ends_with(b"\r\n\r") {
            return i + 1;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_events_per_dialect() {
        let t = |d, evs: &[u8]| is_terminal_event(d, last_event(evs));
        assert!(t(Dialect::Chat, b"data: {}\n\ndata: [DONE]\n\n"));
        assert!(!t(Dialect::Chat, b"data: [DONE]\n\ndata: {}\n\n"));
        assert!(!t(Dialect::Chat, b"data: {\"c\":\"x data: [DONE]\"}\n\n"));
        assert!(t(
            Dialect::Messages,
            b"event: ping\ndata: {}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        ));
        assert!(t(
            Dialect::Messages,
            b"data: {\"type\":\"message_stop\"}\n\n"
        ));
        assert!(!t(
            Dialect::Messages,
            b"event: content_block_delta\ndata: {\"t\":\"\\\"type\\\":\\\"message_stop\\\"\"}\n\n"
        ));
        assert!(t(
            Dialect::Responses,
            b"event: response.completed\ndata: {}\n\n"
        ));
        assert!(!t(
            Dialect::Responses,
            b"event: response.created\ndata: {}\n\n"
        ));
        assert_eq!(last_event(b"data: a\n\ndata: b\n\n"), b"data: b\n\n");
        assert_eq!(last_event(b"data: b\n\n"), b"data: b\n\n");
        assert_eq!(
            last_event(b"data: a\r\n\r\ndata: b\r\n\r\n"),
            b"data: b\r\n\r\n"
        );
        assert_eq!(
            last_event(b"data: a\n\ndata: b\n\n\n\n"),
            b"data: b\n\n\n\n"
        );
    }

    #[test]
    fn last_line_completion() {
        let mut p = b"data: a\n".to_vec();
        complete_last_line(&mut p);
        assert_eq!(last_event_end(&p), p.len());
        let mut p = b"data: a\r\n".to_vec();
        complete_last_line(&mut p);
        assert_eq!(last_event_end(&p), p.len());
        let mut p = b"data: {\"a\":".to_vec();
        complete_last_line(&mut p);
        assert_eq!(last_event_end(&p), 0, "a line cut mid-way is not completed");
    }

    #[test]
    fn event_boundaries() {
        assert_eq!(last_event_end(b"data: a\n\ndata: b"), 9);
        assert_eq!(last_event_end(b"data: a\r\n\r\n"), 11);
        assert_eq!(last_event_end(b"data: a\n"), 0);
        assert_eq!(last_event_end(b"data: a\n\ndata: b\n\n"), 18);
        // the same answer as the two-pattern search it replaced, on every mix of line ends
        let old = |buf: &[u8]| {
            let lf = memchr::memmem::rfind(buf, b"\n\n").map_or(0, |i| i + 2);
            let crlf = memchr::memmem::rfind(buf, b"\r\n\r\n").map_or(0, |i| i + 4);
            lf.max(crlf)
        };
        let alphabet = [b'\n', b'\r', b'a'];
        for len in 0..=7u32 {
            for code in 0..3usize.pow(len) {
                let (mut c, mut buf) = (code, Vec::new());
                for _ in 0..len {
                    buf.push(alphabet[c % 3]);
                    c /= 3;
                }
                assert_eq!(last_event_end(&buf), old(&buf), "{buf:?}");
            }
        }
    }
}
