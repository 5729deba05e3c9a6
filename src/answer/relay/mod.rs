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
//! Owns: passthrough vetting (`Vetted`, the per-event strategy of the one stream loop in
//! `answer::stream`, which owns the read buffer, the drain-raced read, the guardrails' rewrite
//! and the last write), and non-SSE bodies (`bytes`). Must not: read
//! the client's request body, choose routes or send upstream requests (that is `forward`).
//! Back-pressure is structural: the next upstream read starts only after the previous write
//! to the client finished, so at most one read buffer per stream is held (error bodies, read
//! whole up to 1 MiB, are charged to the permit).

mod body;
mod errors;
pub(crate) use errors::error_answer;
mod json;
mod usage_chunk;

use crate::admit::Permit;
use crate::answer::outcome::Outcome;
use crate::answer::stream::{self, StreamBuf, MAX_PENDING_EVENT};
use crate::answer::Sink;
use crate::dialect::{sse::last_event_end, Dialect};
use crate::error::{Error, Kind};
use crate::forward::open::{Call, Opened};
use crate::forward::report::report;
use crate::forward::Env;
use crate::governance::Grant;
use crate::http::conn::ClientConn;
use crate::http::response::Framing;
use crate::upstream::{Exchange, RespFraming};

/// Same dialect in and out: relay the success answer of `up` to the client as it arrives (SSE
/// in whole events), through one pool chunk of read buffer charged to the request's permit. A
/// keyed request's grant, when there is one, sees every body byte (its usage scan) and is
/// finished just before the answer's last bytes go out. `Err`: nothing went out yet.
pub async fn passthrough(
    conn: &mut ClientConn,
    env: &Env<'_>,
    up: Upstream<'_, '_, '_>,
) -> Result<Outcome, Error> {
    let mut piece = StreamBuf::new(env, up.permit)?;
    if vets_json(&up.ex.head) {
        return json::relay_json(conn, env, up, &mut piece).await;
    }
    if up.ex.head.is_event_stream() {
        return Ok(sse(conn, env, up, &mut piece).await);
    }
    body::bytes(conn, env, up, &mut piece).await
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
/// permit. Each relay path reads the fields it needs.
pub struct Upstream<'a, 'c, 'g> {
    ex: &'a mut Exchange<'c>,
    provider: &'a str,
    dialect: Dialect,
    grant: Option<&'a mut Grant<'g>>,
    /// Take the usage-only chunk out of a Chat stream (the client did not ask for it).
    strip_usage: bool,
    keep_alive: bool,
    permit: &'a Permit,
}

impl<'a, 'c, 'g> Upstream<'a, 'c, 'g> {
    /// The relay of `opened`, answering `call`.
    pub fn of(call: &'a mut Call<'g>, opened: &'a mut Opened<'c>, strip_usage: bool) -> Self {
        Upstream {
            ex: &mut opened.ex,
            provider: opened.provider,
            dialect: call.dialect,
            grant: call.grant.as_mut(),
            strip_usage,
            keep_alive: call.keep_alive,
            permit: call.permit,
        }
    }

    /// The sink of this answer's writes.
    fn sink<'e>(&self, env: &Env<'e>) -> Sink<'e> {
        Sink::of(env, self.keep_alive)
    }

    /// An upstream failure of this answer, reported (`forward::report`) for request `rid`.
    fn failed(&self, env: &Env<'_>, rid: &crate::http::request_id::RequestId, e: &Error) -> Error {
        report(env, rid, self.provider, e)
    }
}

/// An SSE answer through the one stream loop (`stream::run`), vetted event by event
/// (`Vetted`).
async fn sse(
    conn: &mut ClientConn,
    env: &Env<'_>,
    up: Upstream<'_, '_, '_>,
    rb: &mut StreamBuf,
) -> Outcome {
    let status = up.ex.head.status;
    let (ct, fwd) = (&up.ex.head.content_type, &up.ex.head.forward);
    let client = stream::Client {
        head: conn.head(status, ct, Framing::Chunked, up.keep_alive, fwd),
        status,
        dialect: up.dialect,
        keep_alive: up.keep_alive,
        permit: up.permit,
    };
    let mut vetted = Vetted {
        close_delimited: up.ex.head.framing == RespFraming::Close,
        dialect: up.dialect,
        grant: up.grant,
        strip_usage: up.strip_usage,
        permit: up.permit,
        pending: Vec::new(),
        charged: 0,
        cut: 0,
        good: 0,
        kept: Vec::new(),
        stripped: false,
        terminal: false,
    };
    stream::run(conn, env, (up.ex, up.provider), client, &mut vetted, rb).await
}

/// Passthrough vetting, the per-event strategy of a same-dialect SSE answer: whole events
/// only, each one's `data` vetted (`vet::sse_events`: an event that is not JSON is not
/// forwarded, the stream ends before it), the dialect's terminal event watched for, a Chat
/// usage chunk asked for on the client's behalf taken out (`usage_chunk`), every piece fed to
/// the grant's usage scan.
struct Vetted<'a, 'g> {
    dialect: Dialect,
    grant: Option<&'a mut Grant<'g>>,
    strip_usage: bool,
    close_delimited: bool,
    permit: &'a Permit,
    /// Upstream bytes not yet forwarded: the last feed's whole events, then a partial one
    /// (charged to the permit as it grows).
    pending: Vec<u8>,
    charged: u64,
    /// End of the whole events in `pending`, and of those vetted good (the batch).
    cut: usize,
    good: usize,
    /// The batch without its usage-only chunk, when `stripped`.
    kept: Vec<u8>,
    stripped: bool,
    terminal: bool,
}

impl stream::Events for Vetted<'_, '_> {
    fn feed(&mut self, piece: &[u8], more: bool) -> stream::Fed {
        if let Some(g) = self.grant.as_deref_mut() {
            g.usage().feed(piece);
        }
        let pending = &mut self.pending;
        pending.extend_from_slice(piece);
        if !more && !self.close_delimited {
            complete_last_line(pending);
        }
        let cut = last_event_end(pending);
        let mut failed = None;
        let mut good = 0;
        if cut > 0 {
            good = match crate::answer::vet::sse_events(&pending[..cut]) {
                Ok(()) => cut,
                Err((at, why)) => {
                    failed = Some(Error::new(Kind::UpstreamProtocol, why));
                    at
                }
            };
            if good > 0 {
                let events = &pending[..good];
                self.terminal =
                    self.terminal || self.dialect.wire().is_terminal_event(last_event(events));
                self.stripped = self.strip_usage && usage_chunk::without(events, &mut self.kept);
            }
        }
        (self.cut, self.good) = (cut, good);
        let rest = &pending[cut..];
        if failed.is_none() && !self.terminal {
            // Whatever follows the terminal event is no longer part of the stream; before it, a
            // framed body ending mid-event is cut (a close-delimited one: see `stream::run`).
            if !more && !self.close_delimited && rest.iter().any(|b| !b.is_ascii_whitespace()) {
                let msg = "the upstream stream ended inside an event";
                failed = Some(Error::new(Kind::UpstreamProtocol, msg));
            } else if more && rest.len() > MAX_PENDING_EVENT {
                let msg = "upstream stream event too large";
                failed = Some(Error::new(Kind::UpstreamProtocol, msg));
            }
        }
        if failed.is_none() {
            if let Err(r) = self.permit.charge_capacity(pending, &mut self.charged) {
                failed = Some(Error::overloaded(r.as_str()));
            }
        }
        stream::Fed {
            terminal: self.terminal,
            done: false,
            failed,
        }
    }

    fn batch(&self) -> &[u8] {
        if self.stripped {
            &self.kept
        } else {
            self.pending.get(..self.good).unwrap_or_default()
        }
    }

    fn sent(&mut self) {
        self.pending.drain(..self.cut);
        if self.pending.is_empty() {
            stream::idle(&mut self.pending);
        }
        (self.cut, self.good, self.stripped) = (0, 0, false);
        stream::idle(&mut self.kept);
    }

    async fn complete(&mut self, _env: &Env<'_>) {
        // the answer is complete: its usage counts before the client sees the end
        if let Some(g) = self.grant.as_deref_mut() {
            g.finish();
        }
    }

    fn error_event(&mut self, message: &str, out: &mut Vec<u8>) {
        crate::dialect::stream_error_event(self.dialect, message, out);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_events_per_dialect() {
        let cases: [(Dialect, &[u8], bool); 8] = [
            (Dialect::Chat, b"data: {}\n\ndata: [DONE]\n\n", true),
            (Dialect::Chat, b"data: [DONE]\n\ndata: {}\n\n", false),
            (Dialect::Chat, b"data: {\"c\":\"x data: [DONE]\"}\n\n", false),
            (
                Dialect::Messages,
                b"event: ping\ndata: {}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                true,
            ),
            (Dialect::Messages, b"data: {\"type\":\"message_stop\"}\n\n", true),
            (
                Dialect::Messages,
                b"event: content_block_delta\ndata: {\"t\":\"\\\"type\\\":\\\"message_stop\\\"\"}\n\n",
                false,
            ),
            (Dialect::Responses, b"event: response.completed\ndata: {}\n\n", true),
            (Dialect::Responses, b"event: response.created\ndata: {}\n\n", false),
        ];
        for (d, evs, terminal) in cases {
            let got = d.wire().is_terminal_event(last_event(evs));
            assert_eq!(got, terminal, "{d:?} {}", String::from_utf8_lossy(evs));
        }
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
}
