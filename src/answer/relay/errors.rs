//! Error answers (status ≥ 400), relayed or translated: the body is read whole (bounded,
//! charged to the request's permit) and either relayed byte for byte with the upstream's
//! headers, when it is already an error in the client dialect's shape (same dialect, or OpenAI
//! Chat ⇄ Responses), or replaced by one in the client's dialect (see `vet::error_body`): JSON
//! of another shape keeps its message and the upstream's forwarded headers (renamed for the
//! client on translated answers, `upstream::headers`); an
//! HTML page, text, an empty body, message-less JSON or a body that could not be read becomes
//! a generic error carrying a request id (the body goes to the log, rate-limited, never to the
//! client: proxies' pages name hosts), with the upstream's `Retry-After` kept. Translated
//! answers get the client dialect's status for the condition
//! (`translate::error::client_status`: Anthropic 529 ⇄ OpenAI/Gemini 503) and a
//! `Retry-After` from a Gemini body's `RetryInfo` when the upstream sent no header.

use super::*;
use crate::answer::vet::{self, ErrorBody};
use crate::answer::Whole;
use crate::error::Side;
use crate::forward::plan::Mode;
use crate::forward::report::report_error_body;

/// Largest upstream error body read; a larger one is replaced like an unusable one.
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// The error answer of `opened` (relayed, or translated from the dialect its upstream speaks)
/// to `call`'s client.
pub(crate) async fn error_answer(
    conn: &mut ClientConn,
    env: &Env<'_>,
    call: &Call<'_>,
    opened: &mut Opened<'_>,
) -> Result<Outcome, Error> {
    let (dialect, permit, sink) = (call.dialect, call.permit, Sink::of(env, call.keep_alive));
    let up = match opened.mode {
        Mode::Translate { up, .. } => up,
        Mode::Passthrough { .. } => dialect,
    };
    let (provider, ex) = (opened.provider, &mut opened.ex);
    let status = crate::dialect::error::client_status(up, dialect, ex.head.status);
    let same = up == dialect;
    let same_shape = same
        || matches!(
            (up, dialect),
            (Dialect::Chat, Dialect::Responses) | (Dialect::Responses, Dialect::Chat)
        );
    let mut raw = Vec::new();
    let read = read_body(env, ex, &mut raw, permit).await;
    // Headers of a rebuilt answer: the forwarded ones (on a translated answer `respond` has
    // renamed them for the client, see `upstream::headers`), and a Retry-After from a Gemini
    // body's RetryInfo when there was none.
    let rebuilt_headers = |raw: &[u8], forward: &[u8]| -> Vec<u8> {
        let mut h = forward.to_vec();
        if !same
            && up == Dialect::Gemini
            && crate::upstream::headers::retry_after(forward).is_empty()
        {
            if let Some(n) = crate::dialect::error::retry_delay_secs(raw) {
                h.extend_from_slice(format!("retry-after: {n}\r\n").as_bytes());
            }
        }
        h
    };
    // The request id of a generic answer (its reason is in the log under it).
    let generic_id = match read {
        Ok(()) => match vet::error_body(dialect, &raw) {
            // In the client's own shape (same dialect, or OpenAI Chat ⇄ Responses).
            ErrorBody::Relay if same_shape && status == ex.head.status => {
                let extra = rebuilt_headers(&raw, &ex.head.forward);
                let w = Whole {
                    status,
                    content_type: &ex.head.content_type,
                    extra: &extra,
                    body: &raw,
                };
                return Ok(sink.whole(conn, w).await);
            }
            ErrorBody::Relay | ErrorBody::Message(_) => {
                let m = match vet::error_body(dialect, &raw) {
                    ErrorBody::Message(m) => m,
                    _ => crate::dialect::error::extract_message(status, &raw),
                };
                let body = crate::dialect::error_body(dialect, status, &m);
                let extra = rebuilt_headers(&raw, &ex.head.forward);
                return Ok(sink.whole(conn, json(status, &extra, &body)).await);
            }
            ErrorBody::Generic => {
                let why = "an error body not in the client's dialect";
                report_error_body(env, &conn.request_id, provider, status, why, &raw)
            }
        },
        // The status arrived but its body did not (cut, stalled, too large): still an answer
        // with that status.
        Err(e) if e.side() == Side::Upstream => {
            let e = report(env, &conn.request_id, provider, &e);
            e.request_id.as_deref().unwrap_or_default().to_string()
        }
        // The drain's end, or no memory for the body.
        Err(e) => return Err(e),
    };
    let mut extra = crate::upstream::headers::retry_after(&ex.head.forward);
    if extra.is_empty() && up == Dialect::Gemini {
        if let Some(n) = crate::dialect::error::retry_delay_secs(&raw) {
            extra.extend_from_slice(format!("retry-after: {n}\r\n").as_bytes());
        }
    }
    drop(raw);
    let msg = format!(
        "the upstream provider answered HTTP {status} without a usable error message \
         (request id {generic_id})"
    );
    let body = crate::dialect::error_body(dialect, status, &msg);
    Ok(sink.whole(conn, json(status, &extra, &body)).await)
}

/// A rebuilt error answer: JSON `body` with header lines `extra`.
fn json<'b>(status: u16, extra: &'b [u8], body: &'b [u8]) -> Whole<'b> {
    Whole {
        status,
        content_type: b"application/json",
        extra,
        body,
    }
}

/// Read the error body whole into `raw`: at most `MAX_ERROR_BODY`, its buffer charged to the
/// permit as it grows; the drain's end stops it.
async fn read_body(
    env: &Env<'_>,
    ex: &mut Exchange<'_>,
    raw: &mut Vec<u8>,
    permit: &Permit,
) -> Result<(), Error> {
    let mut charged = 0u64;
    let mut drain_over = std::pin::pin!(env.drain_expired.wait());
    loop {
        let more = stream::read_upto(ex, raw, usize::MAX, &mut drain_over).await?;
        if !more {
            return Ok(());
        }
        if raw.len() > MAX_ERROR_BODY {
            return Err(Error::new(
                Kind::UpstreamProtocol,
                "upstream error body too large",
            ));
        }
        permit
            .charge_capacity(raw, &mut charged)
            .map_err(|r| Error::overloaded(r.as_str()))?;
    }
}
