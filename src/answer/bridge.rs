//! The translated way back: the provider answered in its own dialect (the request went through
//! the hub, see `plan`), and the answer — JSON or SSE, event by event — comes back into the
//! client's dialect, errors included. Response guardrails see the client-dialect answer: a whole
//! answer is masked or refused (400) after translation, a stream's translated events are
//! rewritten in flight (`guardrail::stream`) and a `block` match ends it with the client
//! dialect's error event.
//!
//! Owns: sequencing `translate` calls around one open upstream exchange (a stream's: the
//! `Translated` strategy of the one stream loop in `answer::stream`). Must not: parse or
//! emit dialect JSON itself (that is `translate`, pure and golden-tested), send upstream
//! requests (`forward`) or pool connections.

use crate::answer::outcome::Outcome;
use crate::answer::stream::{self as skeleton, StreamBuf, MAX_PENDING_EVENT};
use crate::answer::{Sink, Whole};
use crate::dialect::{self, Dialect, SseDecoder, StreamTranslator};
use crate::error::{Error, Kind};
use crate::forward::open::{Call, Opened};
use crate::forward::plan::Mode;
use crate::forward::report::report;
use crate::forward::Env;
use crate::governance::usage::UsageScan;
use crate::governance::Grant;
use crate::http::conn::ClientConn;
use crate::http::response::Framing;
use crate::responses_state::Remember;
use crate::upstream::bedrock::events::ConverseEvents;
use crate::upstream::RespFraming;

/// Largest upstream body read whole for translation (non-stream answers, error bodies).
const MAX_TRANSLATED_BODY: usize = 64 * 1024 * 1024;

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
) -> Result<Outcome, Error> {
    // (`answer::write` sends only translated answers here; a passthrough one would go through
    // the hub from and to the client's own dialect)
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
    let rid = conn.request_id;
    let failed = |e: &Error| report(env, &rid, pname, e);

    // translate back: whole answers, or streams (errors are `relay::error_answer`'s)
    if !stream_requested {
        // The whole answer is needed for translation: read it, charging its buffer to the
        // permit as it grows (bounded by MAX_TRANSLATED_BODY); the permit returns the bytes
        // when the request ends, on every path.
        let mut raw = Vec::new();
        let mut charged = 0u64;
        while ex.next(&mut raw).await.map_err(|e| failed(&e))? {
            if raw.len() > MAX_TRANSLATED_BODY {
                let e = Error::new(Kind::UpstreamProtocol, "upstream response too large");
                return Err(failed(&e));
            }
            if let Err(r) = permit.charge_capacity(&raw, &mut charged) {
                return Err(Error::overloaded(r.as_str()));
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
        let out = out.map_err(|e| {
            let msg = format!("could not translate the upstream answer: {}", e.message);
            failed(&Error::new(Kind::UpstreamProtocol, msg))
        })?;
        // the answer's guardrails, on the client-dialect answer (`guardrail::answer`)
        let masked = match &env.guard {
            Some(sess) => crate::guardrail::answer::guard_answer(sess, client, &out)?,
            None => None,
        };
        let w = Whole {
            status: 200,
            content_type: b"application/json",
            extra: &ex.head.forward,
            body: masked.as_deref().unwrap_or(&out),
        };
        return Ok(Sink::of(env, keep_alive).whole(conn, w).await);
    }
    let mut rb = StreamBuf::new(env, permit)?;
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
    let mut t = Translated {
        up,
        frames,
        tr: &mut tr,
        grant: grant.as_deref_mut(),
        remember,
        events: Vec::new(),
        finish_seen: false,
        close_delimited: ex.head.framing == RespFraming::Close,
    };
    let mut extra = b"cache-control: no-cache\r\n".to_vec();
    extra.extend_from_slice(&ex.head.forward);
    let client = skeleton::Client {
        head: conn.head(
            200,
            b"text/event-stream",
            Framing::Chunked,
            keep_alive,
            &extra,
        ),
        status: 200,
        dialect: client,
        keep_alive,
        permit,
    };
    drop(extra);
    let outcome = skeleton::run(conn, env, (ex, pname), client, &mut t, &mut rb).await;
    // What the upstream reported, however the stream ended (recorded when the grant drops,
    // unless the stream completed and finished it).
    if let Some(g) = grant {
        give(g.usage(), tr.usage());
    }
    Ok(outcome)
}

/// Translation, the per-event strategy of a translated stream: the upstream's frames decoded
/// into events, each translated into the client's dialect (only whole upstream events; a
/// malformed or oversized one breaks the stream), the grant that gets the translator's usage,
/// the Responses answer to record when the stream completes.
struct Translated<'a, 'g> {
    up: Dialect,
    frames: Frames,
    tr: &'a mut StreamTranslator,
    grant: Option<&'a mut Grant<'g>>,
    remember: Option<Remember>,
    /// The client events of the last feed.
    events: Vec<u8>,
    /// Gemini has no terminal event: a candidate's finishReason ends its stream.
    finish_seen: bool,
    /// The upstream body ends by closing (its last event is then not completed).
    close_delimited: bool,
}

impl skeleton::Events for Translated<'_, '_> {
    fn feed(&mut self, piece: &[u8], more: bool) -> skeleton::Fed {
        let decoder = &mut self.frames;
        decoder.feed(piece);
        if let Some(g) = self.grant.as_deref_mut() {
            g.usage().observe_piece(piece);
        }
        if !more && !self.close_delimited {
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
            if self.up == Dialect::Gemini && ev.data.contains("\"finishReason\"") {
                self.finish_seen = true;
            }
            if let Err(e) = self.tr.push(&ev, &mut self.events) {
                failed = Some(format!("malformed upstream stream: {}", e.message));
                break;
            }
        }
        if failed.is_none() && decoder.pending_bytes() > MAX_PENDING_EVENT {
            failed = Some("upstream stream event too large".to_string());
        }
        let done = self.tr.is_done();
        skeleton::Fed {
            terminal: done || (!more && self.finish_seen),
            done,
            failed: failed.map(|m| Error::new(Kind::UpstreamProtocol, m)),
        }
    }

    fn batch(&self) -> &[u8] {
        &self.events
    }

    fn sent(&mut self) {
        skeleton::idle(&mut self.events);
    }

    async fn complete(&mut self, env: &Env<'_>) {
        self.tr.finish(&mut self.events);
        // complete: its usage counts before the client sees the end
        if let Some(g) = self.grant.as_deref_mut() {
            give(g.usage(), self.tr.usage());
            g.finish();
        }
        // recorded before the client sees the end (its next request may follow at once)
        if let Some(r) = self.remember.take() {
            if let Some(done) = self.tr.finished_response() {
                env.responses.record(r, &done);
                env.responses.written().await;
            }
        }
    }

    fn error_event(&mut self, message: &str, out: &mut Vec<u8>) {
        // The error event ends the stream: no terminal events claiming a normal end follow it
        // (Anthropic's own streams end at `event: error` too).
        self.tr.error(message, out);
    }
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
