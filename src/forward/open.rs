//! Forward: (route, request) → an open upstream exchange (response head received, body or
//! stream not yet relayed) or an error. The one place that performs upstream attempts:
//! the attempt plan (`Attempts`: balancing, breakers, key rotation, retries, fallbacks) picks
//! each candidate, `plan::plan` says what to send it, and one attempt is sent here — over a
//! pooled connection, or an in-memory pipe for the in-process mock and the gateway's own
//! answers — while the client is watched (a client that leaves cancels the attempt).
//!
//! Failures before anything reached the client are retried as the plan says: connect errors,
//! resets before the head, first-byte timeouts and the `retry_on` statuses (429 cools the key
//! for its `Retry-After`, for the model or — when the answer says so, `scope` — the whole key;
//! a cooling key is waited on only within `max_retry_wait_ms`, else the 429 is the answer).
//! When the plan stops on a failed *answer* (a 5xx head), that answer
//! is relayed to the client as the upstream sent it (translated when needed); when it stops on
//! an error, the last error goes to the client.
//!
//! When `lb = "load"` finds every engine full (`Stop::Full`), drop admission mode sheds at
//! once (429 + Retry-After, nothing sent); block mode re-checks every 20 ms for up to
//! `queue_timeout_ms`, at most the shard's share of `max_queue` waiting so (`full_wait`).
//!
//! Owns: `open`, `Opened`, `NoHead`, and charging an attempt's spliced or translated
//! body copy to the request's permit while it is sent. Must not: write to the client or read
//! the request body (it is replayed from the permit-held buffer for every attempt).

use std::borrow::Cow;
use std::time::{Duration, Instant, SystemTime};

use super::attempts::{Attempts, Candidate, Step, Stop};
use super::keys::{parse_retry_after, KeyPick};
use crate::config::policy::Reason;
use crate::config::provider::Op;
use crate::dialect::references::{self, Expanded};
use crate::dialect::Dialect;
use crate::error::{Cause, Error, Kind};
pub use crate::forward::call::{Call, Tried};
use crate::forward::live::Routing;
use crate::forward::plan::{self, Mode, Target};
use crate::forward::report::{report, report_status, shutting_down};
use crate::forward::Env;
use crate::http::conn::ClientConn;
use crate::responses_state::Remember;
use crate::route::Route;
use crate::upstream::pipe::{pipe, PipeWriter};
use crate::upstream::slow::Slow;
use crate::upstream::{Exchange, UpstreamRequest};

/// How long an attempt runs before its client is watched for leaving. The watch is a readiness
/// poll on the client socket: armed at once it costs every request a poll and a cancel (two of
/// the six io_uring submissions of a fast small answer; a `poll` syscall with epoll) although
/// nearly every answer's head arrives first. A client that leaves is noticed at most this much
/// later. The wait for it is the exchange's first-byte timer entry (`upstream::slow`), not one
/// of its own.
const WATCH_CLIENT_AFTER: Duration = Duration::from_millis(10);

/// Bytes an in-memory answer pipe holds before its producer waits for the relay.
const PIPE_BYTES: usize = 64 * 1024;

/// An upstream answer whose head arrived, ready to be relayed.
pub struct Opened<'s> {
    pub ex: Exchange<'s>,
    /// How the answer reaches the client (passthrough or translated).
    pub mode: Mode,
    /// The answering deployment's provider name (log lines).
    pub provider: &'s str,
    /// A translated Responses answer to record in the Responses state store (see
    /// `responses_state`).
    pub remember: Option<Remember>,
    /// Keeps the attempt's in-flight count (p2c) until the answer has been relayed.
    _candidate: Option<Candidate<'s>>,
}

impl<'s> Opened<'s> {
    /// The model (requested or fallback) and deployment whose answer this is (`None` for an
    /// answer relayed after the attempts gave up).
    pub fn answered_by(&self) -> Option<(&'s Route, &'s crate::route::Deployment)> {
        self._candidate.as_ref().map(|c| (c.route, c.deployment))
    }
}

/// Why no upstream answer is available.
pub enum NoHead {
    /// Answer the client with this error (upstream details already logged and redacted).
    Failed(Error),
    /// The client closed its connection while the upstream was silent; the attempt was
    /// cancelled (its connection dropped).
    ClientGone,
}

impl From<Error> for NoHead {
    fn from(e: Error) -> Self {
        NoHead::Failed(e)
    }
}

/// Get an upstream answer for `call`, whose request body is `body`, from its route's
/// deployments (the routing plan's deadline counts from `call.start`). What the attempts did
/// is left in `call.tried`.
pub async fn open<'s>(
    conn: &ClientConn,
    env: &Env<'s>,
    call: &mut Call<'s>,
    body: &[u8],
) -> Result<Opened<'s>, NoHead> {
    let (routing, route, fields, permit) = (call.routing, call.route, call.fields, call.permit);
    let (client, start) = (call.dialect, call.start);
    let mut attempts = Attempts::for_call(call);
    if routing
        .forward
        .model(route.index)
        .is_some_and(|m| m.load.is_some())
    {
        let blocks = crate::engine::prefix::prompt_blocks(body);
        attempts.set_prompt(blocks, body.len() as u64 / 4);
    }
    let mut step = attempts.next(start);
    let mut last: Option<Error> = None;
    // block mode: when this request started waiting for a non-full engine
    let mut queued_since: Option<Instant> = None;
    // Responses state (store on, Responses client): references are expanded once, for the
    // first translated attempt; same-dialect attempts send the body untouched.
    let tenant = fields.tenant.filter(|_| client == Dialect::Responses);
    let mut refs: Option<bool> = None;
    let mut expanded: Option<Expanded> = None;
    loop {
        let cand = match step {
            Step::Try(c) => c,
            Step::Wait(until) => {
                // A key cools down and the deadline allows waiting for it.
                let wait = until.saturating_duration_since(Instant::now());
                monoio::select! {
                    _ = monoio::time::sleep(wait) => {},
                    _ = conn.wait_closed() => return Err(NoHead::ClientGone),
                    _ = env.drain_expired.wait() => return Err(NoHead::Failed(shutting_down())),
                }
                step = attempts.next(Instant::now());
                continue;
            }
            Step::Stop(Stop::Full) if last.is_none() => {
                // lb = "load", every engine full: block mode waits (bounded) for one to drain
                match full_wait(conn, env, routing, &mut queued_since).await {
                    Ok(true) => {
                        step = attempts.next(Instant::now());
                        continue;
                    }
                    Ok(false) => {
                        let e = stopped(Stop::Full, None, route, routing);
                        return Err(NoHead::Failed(e));
                    }
                    Err(gone) => return Err(gone),
                }
            }
            Step::Stop(stop) => return Err(NoHead::Failed(stopped(stop, last, route, routing))),
        };
        let provider = cand.deployment.provider.name.as_str();
        let translated = !cand.deployment.provider.kind.speaks(client);
        let state = tenant.filter(|_| translated);
        if let Some(t) = state {
            if expanded.is_none() && *refs.get_or_insert_with(|| references::has_references(body)) {
                let e = env.responses.expand(t, body).await?;
                // the expanded copy lives until the request ends: charged to its permit
                let mut charged = 0;
                permit
                    .charge_capacity(&e.body, &mut charged)
                    .map_err(|r| NoHead::Failed(Error::overloaded(r.as_str())))?;
                expanded = Some(e);
            }
        }
        let sent_body = match (&expanded, state) {
            (Some(e), Some(_)) => &e.body[..],
            _ => body,
        };
        let asked = plan::Asked {
            client,
            op: call.op,
            body: sent_body,
            fields,
        };
        let planned = plan::plan(&cand.deployment.provider, Some(cand.upstream_model), asked)?;
        // A spliced or translated body is a second copy of the request: charged to the permit
        // like the body while the attempt sends it, given back right after.
        let mut charged = 0u64;
        if let Cow::Owned(copy) = &planned.body {
            permit
                .charge_capacity(copy, &mut charged)
                .map_err(|r| NoHead::Failed(Error::overloaded(r.as_str())))?;
        }
        call.tried.provider = Some(provider);
        call.tried.served = Some((cand.route.index as u32, cand.deployment_index as u32));
        call.tried.attempts = attempts.attempts();
        let timeout = attempts.attempt_timeout(Instant::now());
        // traced: this attempt's CLIENT span and the `traceparent` naming it
        let mut trace_lines = Vec::new();
        if let (Some(o), Some(tel)) = (call.tried.otel.as_deref_mut(), &env.telemetry) {
            let a = crate::telemetry::Attempt::new(cand.deployment, planned.upstream_model);
            tel.attempt(o, a, &mut trace_lines);
        }
        let one = Attempt {
            cand: &cand,
            planned: &planned,
            trace_lines: &trace_lines,
            timeout,
        };
        let sent = attempt(conn, env, &*call, one).await;
        if let Some(o) = call.tried.otel.as_deref_mut() {
            match &sent {
                Ok(ex) => {
                    let s = ex.head.status;
                    o.attempt_ended(Some(s), None, Reason::from_status(s).map(Reason::as_str));
                }
                Err(NoHead::ClientGone) => o.attempt_ended(None, Some("client_gone"), None),
                Err(NoHead::Failed(e)) => {
                    o.attempt_ended(None, Some(e.code()), reason_of(e).map(Reason::as_str))
                }
            }
        }
        drop(planned.body);
        permit.shrink(charged);
        let now = Instant::now();
        match sent {
            Ok(mut ex) => {
                let status = ex.head.status;
                if status >= 500 {
                    report_status(env, &conn.request_id, provider, status);
                }
                let Some(reason) = Reason::from_status(status) else {
                    attempts.succeeded(&cand, now);
                    let remember = match (state, planned.mode) {
                        // its copy of the input lives until the answer is recorded: charged to
                        // the permit, or not remembered
                        (Some(t), Mode::Translate { .. }) if status < 300 => env
                            .responses
                            .remember(t, body, expanded.as_ref())
                            .filter(|r| permit.charge_capacity(r.input(), &mut 0).is_ok()),
                        _ => None,
                    };
                    return Ok(Opened {
                        ex,
                        mode: planned.mode,
                        provider,
                        remember,
                        _candidate: Some(cand),
                    });
                };
                let retry_after = retry_after(&ex.head.forward);
                // a 429 cools the key for this model, or for all when the whole key is limited
                let whole = reason == Reason::Status429
                    && super::scope::whole_key(&ex.head.forward, ex.buffered());
                step = attempts.failed_scoped(cand, reason, retry_after, whole, now);
                if let Step::Stop(_) = step {
                    // Nothing left to try: the client gets this answer as the upstream gave it.
                    return Ok(Opened {
                        ex,
                        mode: planned.mode,
                        provider,
                        remember: None,
                        _candidate: None,
                    });
                }
                // Retried elsewhere: a small error body is read so the connection can be
                // pooled; anything else just drops it.
                let mut sink = Vec::new();
                let _ = monoio::time::timeout(
                    Duration::from_millis(50),
                    ex.read_to_end(&mut sink, 16 * 1024),
                )
                .await;
            }
            Err(NoHead::ClientGone) => return Err(NoHead::ClientGone),
            Err(NoHead::Failed(e)) => {
                let reason = reason_of(&e);
                let e = report(env, &conn.request_id, provider, &e);
                step = match reason {
                    // Not an upstream failure (a config problem, the drain): no retry.
                    None => Step::Stop(Stop::NotRetryable(Reason::Other)),
                    Some(r) => attempts.failed(cand, r, None, now),
                };
                last = Some(e);
            }
        }
    }
}

/// The client-facing error when the plan stopped without an answer to relay: the last
/// attempt's error; with no attempt made, a 429 + Retry-After when keys are cooling down after
/// the provider's own 429s, else a 503 + Retry-After while breakers are open (fail fast).
fn stopped(stop: Stop, last: Option<Error>, route: &Route, routing: &Routing) -> Error {
    let now = Instant::now();
    let secs = |until: Instant| until.saturating_duration_since(now).as_secs_f64().ceil() as u32;
    match (stop, last) {
        (_, Some(e)) => e,
        (Stop::Full, None) => Error::new(
            Kind::RateLimited,
            format!(
                "every deployment of `{}` is at capacity (its engines' queues are full); retry later",
                route.name
            ),
        )
        .retry_after(1),
        (Stop::Deadline, None) => Error::new(
            Kind::UpstreamTimeout,
            format!("no deployment of `{}` answered in time", route.name),
        ),
        (_, None) => {
            let scopes = routing.forward.model(route.index).map(|m| &m.scopes[..]);
            let cooling = route
                .deployments
                .iter()
                .enumerate()
                .filter_map(|(i, d)| {
                    let scope = scopes.and_then(|s| s.get(i)).copied().unwrap_or(0);
                    match routing.forward.keys(d.provider.index)?.peek(now, scope) {
                        KeyPick::Cooling { until, .. } => Some(until),
                        KeyPick::Ready(_) => None,
                    }
                })
                .min();
            match cooling {
                Some(until) => Error::new(
                    Kind::RateLimited,
                    format!(
                        "every provider key for `{}` is rate limited by the provider; retry later",
                        route.name
                    ),
                )
                .retry_after(secs(until).max(1)),
                None => Error::new(
                    Kind::Overloaded,
                    format!(
                        "no deployment of `{}` is available (circuit breakers open); retry later",
                        route.name
                    ),
                )
                .retry_after(1),
            }
        }
    }
}

/// How often a request waiting for a non-full engine looks again (the engines' signals change
/// at their poll interval, the gateway's own in-flight counts at once).
const FULL_RECHECK: Duration = Duration::from_millis(20);

/// `lb = "load"` found every engine full. In drop mode: shed at once (`Ok(false)`). In block
/// mode: wait `FULL_RECHECK` and try again (`Ok(true)`) while the request has waited less than
/// `queue_timeout_ms` and fewer than this shard's share of `max_queue` wait so (the bound);
/// then shed. The client leaving or the drain ending stop the wait.
async fn full_wait(
    conn: &ClientConn,
    env: &Env<'_>,
    routing: &Routing,
    since: &mut Option<Instant>,
) -> Result<bool, NoHead> {
    if env.admission.mode() != crate::admit::Mode::Block {
        return Ok(false);
    }
    let (timeout, cap) = env.admission.queue_bounds();
    let now = Instant::now();
    let first = since.is_none();
    let started = *since.get_or_insert(now);
    let waiters = &routing.forward.full_waiters;
    if now.saturating_duration_since(started) >= timeout || (first && waiters.get() >= cap) {
        return Ok(false);
    }
    waiters.set(waiters.get() + 1);
    let r = monoio::select! {
        _ = monoio::time::sleep(FULL_RECHECK) => Ok(true),
        _ = conn.wait_closed() => Err(NoHead::ClientGone),
        _ = env.drain_expired.wait() => Err(NoHead::Failed(shutting_down())),
    };
    waiters.set(waiters.get().saturating_sub(1));
    r
}

/// The routing reason of an attempt that got no valid head.
fn reason_of(e: &Error) -> Option<Reason> {
    match e.cause? {
        Cause::Connect => Some(Reason::Connect),
        Cause::ConnectTimeout => Some(Reason::Timeout),
        Cause::Reset => Some(Reason::Reset),
        Cause::FirstByteTimeout => Some(Reason::FirstByteTimeout),
    }
}

/// `Retry-After` among an upstream head's forwarded header lines.
fn retry_after(forward: &[u8]) -> Option<Duration> {
    forward.split(|&b| b == b'\n').find_map(|l| {
        let (name, value) = l.split_at(l.iter().position(|&b| b == b':')?);
        name.eq_ignore_ascii_case(b"retry-after")
            .then(|| parse_retry_after(crate::http::head::trim(&value[1..]), SystemTime::now()))
            .flatten()
    })
}

/// One attempt: the candidate deployment, what to send it, the `traceparent` line naming the
/// attempt's span (empty: untraced) and its first-byte timeout.
struct Attempt<'a> {
    cand: &'a Candidate<'a>,
    planned: &'a plan::Plan<'a>,
    trace_lines: &'a [u8],
    timeout: Duration,
}

/// Send one planned attempt and wait for its response head, watching the client meanwhile: a
/// client that closes cancels the attempt at once (not at the first-byte timeout), and the end
/// of the drain cancels it with a 503.
async fn attempt<'s>(
    conn: &ClientConn,
    env: &Env<'s>,
    call: &Call<'_>,
    one: Attempt<'_>,
) -> Result<Exchange<'s>, NoHead> {
    let Attempt {
        cand,
        planned,
        trace_lines,
        timeout: first_byte_timeout,
    } = one;
    let (client, op) = (call.dialect, call.op);
    let provider = &cand.deployment.provider;
    let up = env.upstream;
    let path = match &planned.target {
        Target::Http { path } => path,
        Target::Mock => {
            let (w, r) = pipe(PIPE_BYTES);
            let model = planned.upstream_model.to_string();
            let body = planned.body.to_vec();
            let (profile, stream) = (provider.mock_profile, call.fields.stream);
            monoio::spawn(mock_answer(w, client, op, model, stream, body, profile));
            return Ok(up.open_pipe(r).await?);
        }
        Target::Local(json) => {
            let (mut w, r) = pipe(json.len() + 256);
            let json = json.clone();
            monoio::spawn(async move {
                crate::mock::pace::json(&mut w, 200, &json, crate::mock::Profile::Instant, false)
                    .await
            });
            return Ok(up.open_pipe(r).await?);
        }
    };
    let endpoint = provider.endpoint.as_ref().ok_or_else(|| {
        Error::new(
            Kind::Internal,
            format!("provider {} has no base_url", provider.name),
        )
    })?;
    // the provider's own lines, plus what the header policy forwards from the client, in a
    // buffer the shard reuses (given back below)
    let auth_lines = cand.auth_headers();
    let mut headers = up.spare_buf(auth_lines.len() + trace_lines.len() + 256);
    call.headers
        .push_upstream_lines(provider.kind, auth_lines, &mut headers);
    headers.extend_from_slice(trace_lines);
    if let Some(auth) = &provider.cloud {
        // Bedrock's SigV4 (over this exact target, host and body) or Vertex's OAuth token
        auth.authorize(&endpoint.host_header, path, &planned.body, &mut headers)
            .await?;
    }
    // The client is watched only once the answer is slow (`WATCH_CLIENT_AFTER` without a head,
    // or from the start where the exchange cannot tell: see `upstream::slow`); the exchange
    // says so from its first-byte deadline's timer entry, so a fast answer costs no timer entry
    // and no allocation for the watch.
    let slow = Slow::new(WATCH_CLIENT_AFTER);
    let req = UpstreamRequest {
        endpoint,
        path,
        headers: &headers,
        body: &planned.body,
        first_byte_timeout: Some(first_byte_timeout),
        slow: Some(&slow),
    };
    // Biased: the exchange is polled first, so an answer that is already there costs no watch.
    // The readiness wait is boxed (allocated only for a slow answer): this future sits inside
    // the request's future, which is moved into its box once per request.
    let watch = async {
        slow.wait().await;
        Box::pin(conn.wait_closed()).await
    };
    let sent = monoio::select! {
        biased;
        r = up.send(&req) => r.map_err(NoHead::from),
        _ = watch => Err(NoHead::ClientGone),
        _ = env.drain_expired.wait() => Err(NoHead::Failed(shutting_down())),
    };
    up.give_buf(headers);
    sent
}

/// The in-process mock provider's answer, written into a pipe as `ringgate mock` would write it
/// on a socket (every dialect, embeddings, token counts).
async fn mock_answer(
    mut w: PipeWriter,
    dialect: Dialect,
    op: Op,
    model: String,
    stream: bool,
    body: Vec<u8>,
    profile: crate::mock::Profile,
) {
    use crate::mock;
    let s = &mut w;
    let _ = match op {
        Op::Generate => {
            mock::respond_with(s, dialect, &model, Some(stream), &body, profile, false).await
        }
        Op::Embeddings => mock::embeddings::respond(s, &body, profile, false).await,
        Op::Completions => {
            let out = br#"{"error":{"message":"the in-process mock serves no /v1/completions","type":"invalid_request_error"}}"#;
            mock::pace::json(s, 404, out, mock::Profile::Instant, false).await
        }
        Op::CountTokens => {
            let out = match dialect {
                Dialect::Gemini => mock::gemini::count_tokens_body(&body),
                _ => mock::anthropic::count_tokens_body(&body),
            };
            mock::pace::json(s, 200, &out, mock::Profile::Instant, false).await
        }
    };
}
