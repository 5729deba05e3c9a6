//! The translated way back: the provider answered in its own dialect (the request went through
//! the hub, see `plan`), and the answer — JSON or SSE, event by event — comes back into the
//! client's dialect, errors included. Response guardrails see the client-dialect answer: a whole
//! answer is masked or refused (400) after translation, a stream's translated events are
//! rewritten in flight (`guardrail::stream`) and a `block` match ends it with the client
//! dialect's error event.
//!
//! Owns: sequencing `translate` calls around one open upstream exchange. Must not: parse or
//! emit dialect JSON itself (that is `translate`, pure and golden-tested), send upstream
//! requests (`forward`) or pool connections.

use crate::admit::Permit;
use crate::answer::outcome::{gone, Outcome};
use crate::answer::relay;
use crate::answer::stream::{self as skeleton, StreamBuf, MAX_PENDING_EVENT};
use crate::dialect::{self, Dialect, SseDecoder, StreamTranslator};
use crate::error::{Error, Kind};
use crate::forward::open::{Call, Opened};
use crate::forward::plan::Mode;
use crate::forward::report::report;
use crate::forward::Env;
use crate::governance::usage::UsageScan;
use crate::governance::Grant;
use crate::http::conn::ClientConn;
use crate::http::response::{write_chunk, Framing, LAST_CHUNK};
use crate::responses_state::Remember;
use crate::upstream::bedrock::events::ConverseEvents;
use crate::upstream::RespFraming;

/// Largest upstream body read whole for translation (non-stream answers, error bodies).
const MAX_TRANSLATED_BODY: usize = 64 * 1024 * 1024;
/// Most upstream bytes read after a translated stream ended, to keep the connection poolable.
const MAX_TRAILING: usize = 64 * 1024;

/// Another dialect: translate the answer of `opened` (in the dialect its upstream speaks) back
/// into `call`'s — error bodies, whole answers, or SSE event by event. A keyed request's
/// grant, when there is one, gets the usage the translator read from the answer and is
/// finished just before the answer's last bytes go out. A Responses answer to remember
/// (`Opened::remember`) is recorded in the Responses state store then too (a client's next
/// request may follow the instant it has the answer).
pub async fn translated(
    conn: &mut ClientConn,
    env: &Env<'_>,
    call: &mut Call<'_>,
    opened: &mut Opened<'_>,
) -> Outcome {
    if opened.ex.head.status >= 400 {
        return relay::error_answer(conn, env, call, opened).await;
    }
    // (`respond` sends only translated answers here; a passthrough one would go through the
    // hub from and to the client's own dialect)
    let (up, include_usage, converse) = match opened.mode {
        Mode::Translate {
            up,
            include_usage,
            converse,
        } => (up, include_usage, converse),
        Mode::Passthrough { .. } => (call.dialect, false, false),
    };
    let (pname, remember, ex) = (opened.provider, opened.remember.take(), &mut opened.ex);
    let (client, keep_alive, permit) = (call.dialect, call.keep_alive, call.permit);
    let (client_model, stream_requested) = (call.fields.model.as_str(), call.fields.stream);
    let mut grant = call.grant.as_mut();
    let wt = env.limits.write_timeout;
    let shape = crate::answer::outcome::shape(client);

    // translate back: whole answers, or streams (errors above)
    if !stream_requested {
        // The whole answer is needed for translation: read it, charging its buffer to the
        // permit as it grows (bounded by MAX_TRANSLATED_BODY); the permit returns the bytes
        // when the request ends, on every path.
        let mut raw = Vec::new();
        let mut charged = 0u64;
        loop {
            match ex.next(&mut raw).await {
                Ok(true) if raw.len() > MAX_TRANSLATED_BODY => {
                    let e = Error::new(Kind::UpstreamProtocol, "upstream response too large");
                    let e = report(env, &conn.request_id, pname, &e);
                    return Outcome::error(conn, &e, shape, keep_alive, wt).await;
                }
                Ok(true) => {
                    if let Err(r) = permit.charge_capacity(&raw, &mut charged) {
                        let e = Error::overloaded(r.as_str());
                        return Outcome::error(conn, &e, shape, keep_alive, wt).await;
                    }
                }
                Ok(false) => break,
                Err(e) => {
                    let e = report(env, &conn.request_id, pname, &e);
                    return Outcome::error(conn, &e, shape, keep_alive, wt).await;
                }
            }
        }
        let chat = if converse {
            // Bedrock Converse: its answer names no id or time; the request's id and now
            let id = format!("chatcmpl-{}", conn.request_id.as_str());
            dialect::converse::response_to_chat(&raw, &id, unix_now())
        } else {
            dialect::response_to_chat(up, &raw)
        };
        let out = chat.and_then(|chat| {
            if let Some(g) = grant.as_deref_mut() {
                g.usage().observe_piece(&raw);
                give(g.usage(), dialect::chat_usage(&chat));
                g.finish();
            }
            match remember {
                // recorded before the answer goes out (the client's next request may follow
                // at once), from the value the answer is written from
                Some(r) if client == Dialect::Responses => {
                    let (v, out) = dialect::chat_to_responses_answer(&chat, client_model)?;
                    env.responses.record(r, &v);
                    Ok(out)
                }
                _ => dialect::chat_to_response(client, &chat, client_model),
            }
        });
        drop(raw);
        env.responses.written().await;
        // the answer's guardrails, on the client-dialect answer (`guardrail::answer`)
        let out = match (out, &env.guard) {
            (Ok(out), Some(sess)) => {
                match crate::guardrail::answer::guard_answer(sess, client, &out) {
                    Ok(masked) => Ok(masked.unwrap_or(out)),
                    Err(e) => return Outcome::error(conn, &e, shape, keep_alive, wt).await,
                }
            }
            (out, _) => out,
        };
        return match out {
            Ok(out) => {
                let ok = conn
                    .respond(
                        200,
                        b"application/json",
                        &ex.head.forward,
                        &out,
                        keep_alive,
                        wt,
                    )
                    .await;
                Outcome {
                    status: 200,
                    keep_alive: ok && keep_alive,
                }
            }
            Err(e) => {
                let e = Error::new(
                    Kind::UpstreamProtocol,
                    format!("could not translate the upstream answer: {}", e.message),
                );
                let e = report(env, &conn.request_id, pname, &e);
                Outcome::error(conn, &e, shape, keep_alive, wt).await
            }
        };
    }
    let mut rb = match StreamBuf::new(env, permit) {
        Ok(b) => b,
        Err(e) => return Outcome::error(conn, &e, shape, keep_alive, wt).await,
    };
    let mut tr = StreamTranslator::new(up, client, client_model).with_chat_usage(include_usage);
    let frames = if converse {
        let id = format!("chatcmpl-{}", conn.request_id.as_str());
        let usage_chunk = include_usage && client == Dialect::Chat;
        Frames::Converse(Box::new(ConverseEvents::new(
            &id,
            unix_now(),
            client_model,
            usage_chunk,
        )))
    } else {
        Frames::Sse(SseDecoder::new())
    };
    let t = Translating {
        ex,
        provider: pname,
        up,
        client,
        frames,
        tr: &mut tr,
        grant: grant.as_deref_mut(),
        remember,
        keep_alive,
        permit,
    };
    let outcome = stream(conn, env, t, &mut rb).await;
    // What the upstream reported, however the stream ended (recorded when the grant drops,
    // unless the stream completed and finished it).
    if let Some(g) = grant {
        give(g.usage(), tr.usage());
    }
    outcome
}

/// A translated stream's parts: the exchange, who answers in which dialect, its frames, the
/// translator to the client's dialect, the grant that gets its usage, the Responses answer to
/// record, and the request's side (whether its connection stays, its permit).
struct Translating<'a, 'c, 'g> {
    ex: &'a mut crate::upstream::Exchange<'c>,
    provider: &'a str,
    up: Dialect,
    client: Dialect,
    frames: Frames,
    tr: &'a mut StreamTranslator,
    grant: Option<&'a mut Grant<'g>>,
    remember: Option<Remember>,
    keep_alive: bool,
    permit: &'a Permit,
}

/// Where a translated stream's upstream events come from: SSE, or Bedrock's event-stream
/// frames converted to hub Chat events (`upstream::bedrock::events`).
enum Frames {
    Sse(SseDecoder),
    Converse(Box<ConverseEvents>),
}

impl Frames {
    fn feed(&mut self, bytes: &[u8]) {
        match self {
            Frames::Sse(d) => d.feed(bytes),
            Frames::Converse(d) => d.feed(bytes),
        }
    }

    fn finish(&mut self) {
        match self {
            Frames::Sse(d) => d.finish(),
            Frames::Converse(d) => d.finish(),
        }
    }

    fn next_event(&mut self) -> Result<Option<dialect::SseEvent>, String> {
        match self {
            Frames::Sse(d) => Ok(d.next_event()),
            Frames::Converse(d) => d.next_event(),
        }
    }

    fn pending_bytes(&self) -> usize {
        match self {
            Frames::Sse(d) => d.pending_bytes(),
            Frames::Converse(d) => d.pending_bytes(),
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Hand a translator's usage to the request's usage record (nothing when none was reported).
fn give(to: &mut UsageScan, u: dialect::Usage) {
    if !u.is_empty() {
        to.set(
            u.prompt_tokens.unwrap_or(0),
            u.completion_tokens.unwrap_or(0),
        );
    }
}

/// Relay an upstream SSE stream, translated event by event and flushed per upstream read.
/// Only whole upstream events are translated. A stream that breaks — upstream cut, a
/// close-delimited body ending without its dialect's terminal event (its partial last event is
/// discarded, as the SSE rules say), a malformed or oversized event, the drain's end — ends
/// with the client dialect's error event (last: no terminal events claim a normal end after it)
/// and a proper chunked end.
async fn stream(
    conn: &mut ClientConn,
    env: &Env<'_>,
    t: Translating<'_, '_, '_>,
    rb: &mut StreamBuf,
) -> Outcome {
    let Translating {
        ex,
        provider,
        up,
        client,
        frames: mut decoder,
        tr,
        mut grant,
        mut remember,
        keep_alive,
        permit,
    } = t;
    let wt = env.limits.write_timeout;
    let mut extra = b"cache-control: no-cache\r\n".to_vec();
    extra.extend_from_slice(&ex.head.forward);
    let mut out = conn.head(
        200,
        b"text/event-stream",
        Framing::Chunked,
        keep_alive,
        &extra,
    );
    match conn.write_raw(out, wt).await {
        Some(back) => out = back,
        None => return gone(env.metrics, 200),
    }
    let mut events = Vec::new();
    let close_delimited = ex.head.framing == RespFraming::Close;
    // Gemini has no terminal event: a candidate's finishReason ends its stream.
    let mut finish_seen = false;
    // the answer's guardrails, on the client-dialect events (`guardrail::stream`)
    let mut guard = env
        .guard
        .as_ref()
        .and_then(|s| crate::guardrail::stream::StreamGuard::new(s, client));
    let (mut rewritten, mut held_charged) = (Vec::new(), 0u64);
    let mut drain_over = std::pin::pin!(env.drain_expired.wait());
    loop {
        // what the stream holds while it waits is small (`stream::idle`)
        skeleton::idle(&mut events);
        skeleton::idle(&mut rewritten);
        let more = match skeleton::read(ex, rb, &mut drain_over).await {
            Ok(m) => m,
            Err(e) => {
                let e = report(env, &conn.request_id, provider, &e);
                // The error event ends the stream: no terminal events claiming a normal end
                // follow it (Anthropic's own streams end at `event: error` too).
                tr.error(&e.message, &mut events);
                let status = skeleton::broken_status(&e);
                return skeleton::broken(conn, env, (out, &events), status, keep_alive).await;
            }
        };
        let piece = &rb.buf[..];
        decoder.feed(piece);
        if let Some(g) = grant.as_deref_mut() {
            g.usage().observe_piece(piece);
        }
        if !more && !close_delimited {
            // A framed end: a last event missing its blank line is still dispatched (lenient;
            // several upstreams omit it) — and fails below if it was cut mid-JSON.
            decoder.finish();
        }
        let mut failed = None;
        loop {
            let ev = match decoder.next_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    failed = Some(format!("malformed upstream stream: {e}"));
                    break;
                }
            };
            if up == Dialect::Gemini && ev.data.contains("\"finishReason\"") {
                finish_seen = true;
            }
            if let Err(e) = tr.push(&ev, &mut events) {
                failed = Some(format!("malformed upstream stream: {}", e.message));
                break;
            }
        }
        if failed.is_none() && !more && close_delimited && !(tr.is_done() || finish_seen) {
            failed = Some("the upstream stream ended before its last event".to_string());
        }
        if failed.is_none() && decoder.pending_bytes() > MAX_PENDING_EVENT {
            failed = Some("upstream stream event too large".to_string());
        }
        if let Some(msg) = failed.take() {
            let e = report(
                env,
                &conn.request_id,
                provider,
                &Error::new(Kind::UpstreamProtocol, msg),
            );
            tr.error(&e.message, &mut events);
            failed = Some(e.message);
        }
        let end = !more || failed.is_some() || tr.is_done();
        if end && failed.is_none() {
            tr.finish(&mut events);
            // complete: its usage counts before the client sees the end
            if let Some(g) = grant.as_deref_mut() {
                give(g.usage(), tr.usage());
                g.finish();
            }
            // recorded before the client sees the end (its next request may follow at once)
            if let Some(r) = remember.take() {
                if let Some(done) = tr.finished_response() {
                    env.responses.record(r, &done);
                    env.responses.written().await;
                }
            }
        }
        if let Some(g) = guard.as_mut() {
            rewritten.clear();
            let r = g.rewrite(&events, &mut rewritten);
            let r = r.and_then(|()| {
                if end {
                    g.finish(&mut rewritten)
                } else {
                    Ok(())
                }
            });
            // held-back text is charged to the request's permit (high-water mark)
            let held = g.held() as u64;
            let over = held > held_charged && permit.grow(held - held_charged).is_err();
            held_charged = held_charged.max(held);
            let stop = match r {
                Err(b) => Some(Error::new(Kind::GuardrailBlocked, b.message())),
                Ok(()) if over => Some(Error::overloaded("memory budget")),
                Ok(()) => None,
            };
            if let Some(e) = stop {
                // no byte of a blocked match went out: the error event ends the stream, as
                // every stream that breaks after its head ends (`stream::broken`)
                crate::dialect::stream_error_event(client, &e.message, &mut rewritten);
                let status = skeleton::broken_status(&e);
                return skeleton::broken(conn, env, (out, &rewritten), status, keep_alive).await;
            }
            std::mem::swap(&mut events, &mut rewritten);
        }
        write_chunk(&mut out, &events);
        if end {
            out.extend_from_slice(LAST_CHUNK);
        }
        if !out.is_empty() {
            match conn.write_raw(std::mem::take(&mut out), wt).await {
                Some(back) => out = back,
                None => return gone(env.metrics, 200),
            }
            skeleton::idle(&mut out);
        }
        if end {
            conn.out = out;
            // The client's stream is complete either way. If the translator finished before the
            // upstream body did (trailing bytes after the terminal event), read the rest,
            // bounded, so the upstream connection can go back to the pool.
            if more && failed.is_none() && !ex.is_done() {
                let mut rest = Vec::new();
                let _ = ex.read_to_end(&mut rest, MAX_TRAILING).await;
            }
            return Outcome {
                // a stream that broke ended with its error event: recorded as the failure
                status: if failed.is_some() { 502 } else { 200 },
                keep_alive: keep_alive && !(failed.is_some() && env.draining.is_fired()),
            };
        }
    }
}
