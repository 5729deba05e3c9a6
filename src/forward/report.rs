//! Upstream failure reports: every upstream-side failure is counted, logged (rate-limited, with
//! the request's id — the `x-request-id` its client gets, see `http::request_id` — the
//! provider's name, the error code and the full reason — never keys or bodies) and handed back generic for the client (hosts, addresses and
//! resolver output stay in the log). The one exception to "never bodies": an upstream error
//! body the client cannot be given (an HTML page, text, JSON without a message) is logged as a
//! short escaped excerpt (`report_error_body`) — it is a proxy's or provider's page, not
//! conversation content, and it is what an operator needs to see.
//!
//! Owns: `report`, `report_status`, `report_error_body`, `shutting_down`, the once-a-second
//! dropped-lines note.
//! Must not: write to the client.

use std::time::Instant;

use crate::error::{Error, Kind, Side};
use crate::forward::Env;
use crate::http::request_id::RequestId;
use crate::observe::metrics::bump;

/// The error that ends requests still running when the drain time is up.
pub fn shutting_down() -> Error {
    Error::new(
        Kind::Overloaded,
        "the gateway is shutting down; retry the request",
    )
}

/// An error on its way to the client of request `id`. Upstream-side failures are counted,
/// logged (rate-limited: the request id, the provider's name, the error code and the full
/// reason — never keys or bodies), and come back generic with the id (see
/// [`Error::for_client`]): hosts, addresses and resolver output stay in the log.
pub fn report(env: &Env<'_>, id: &RequestId, provider: &str, e: &Error) -> Error {
    if e.side() != Side::Upstream {
        return e.clone();
    }
    bump(&env.metrics.upstream_errors);
    let id = id.as_str();
    if let Some(dropped) = env.upstream.failure_log.admit(Instant::now()) {
        crate::observe::log::info(format_args!(
            "upstream failure {id}: provider {provider}: {}: {}{}",
            e.code(),
            e.message,
            not_logged(dropped)
        ));
    }
    e.for_client(id)
}

/// An upstream error answer (HTTP `status`) whose body cannot go to the client (`why`) of
/// request `id`: logged rate-limited with the id and a short escaped excerpt of `body`;
/// returns the id for the client's generic error. Not counted again: `forward` counted the
/// 5xx head.
pub fn report_error_body(
    env: &Env<'_>,
    id: &RequestId,
    provider: &str,
    status: u16,
    why: &str,
    body: &[u8],
) -> String {
    let id = id.as_str();
    if let Some(dropped) = env.upstream.failure_log.admit(Instant::now()) {
        crate::observe::log::info(format_args!(
            "upstream failure {id}: provider {provider}: answered HTTP {status} with {why} ({} bytes: \"{}\"){}",
            body.len(),
            excerpt(body),
            not_logged(dropped)
        ));
    }
    id.to_string()
}

/// Once a second: say how many upstream-failure lines the rate limit dropped, if any.
pub fn log_tick(env: &Env<'_>) {
    if let Some(n) = env.upstream.failure_log.flush(Instant::now()) {
        crate::observe::log::info(format_args!(
            "shard {}: {n} upstream failures not logged (rate limit)",
            env.id
        ));
    }
}

fn not_logged(dropped: u64) -> String {
    if dropped == 0 {
        String::new()
    } else {
        format!(" ({dropped} earlier upstream failures not logged)")
    }
}

/// An upstream that answered with a 5xx head: counted and logged like a failure (the answer
/// itself still goes to the client, or to the next attempt).
pub fn report_status(env: &Env<'_>, id: &RequestId, provider: &str, status: u16) {
    bump(&env.metrics.upstream_errors);
    if let Some(dropped) = env.upstream.failure_log.admit(Instant::now()) {
        crate::observe::log::info(format_args!(
            "upstream failure {}: provider {provider}: answered HTTP {status}{}",
            id.as_str(),
            not_logged(dropped)
        ));
    }
}

/// A short, printable excerpt of an upstream body for a log line (control bytes escaped).
pub fn excerpt(body: &[u8]) -> String {
    const MAX: usize = 200;
    let cut = body.get(..body.len().min(MAX)).unwrap_or_default();
    let mut s: String = String::from_utf8_lossy(cut)
        .chars()
        .flat_map(char::escape_debug)
        .collect();
    if body.len() > MAX {
        s.push('…');
    }
    s
}
