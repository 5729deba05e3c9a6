//! The request path, top to bottom, in one place (`serve`):
//! accept → parse head → edge checks → govern (key, rate) → admit → read body → route → govern
//! (model, tokens) → guardrails (request text: mask or 400) → cache → forward (plan → attempts
//! → upstream) → answer (`answer::write`: relay, or translate back). Each stage calls into its
//! own module; this file only sequences them and turns every failure before an answer's first
//! byte (its own stages' and the answer stage's) into a response in the client's dialect, in
//! one place (`handle`, through `answer::Sink::error`). A request is one `http::Request` (the
//! head's bytes stay in the read buffer until `handle` drops them, so a stage reads a header
//! when it needs it); once routed it travels down as one `forward::Call`. `serve` holds the
//! order and the awaits; each step between them is one function in `steps`.
//!
//! Connections: the first head must come within `first_request_timeout_ms`; an address that
//! keeps sending unknown keys waits before its key is acted on (`peer::slowdown`; nothing when
//! keys are off); over a cap, a first request with a valid key is still served
//! (`serve_over_cap`).
//!
//! Owns: the per-connection loop and the order of stages. Must not: parse bytes, build
//! upstream requests, retry, or relay bodies itself (see `http`, `extract`, `route`, `plan`,
//! `forward`, `answer`), or write to the client other than through `answer::Sink`.

pub mod classify;
mod local;
pub mod record;
pub mod scrape;
pub mod shard;
mod steps;

use std::rc::Rc;
use std::time::Instant;

use crate::answer::outcome::{gone, Outcome};
use crate::answer::Whole;
use crate::error::{Error, ErrorShape, Kind};
use crate::forward::live::Routing;
use crate::forward::open::{Call, Tried};
use crate::http::conn::ClientConn;
use crate::http::edge::Verdict;
use crate::http::expect;
use crate::http::{Request, RequestHead};
use crate::observe::metrics::{bump, dec};
use crate::observe::trace::{Endpoint, Trace};
use crate::pipeline::shard::Shard;
use crate::telemetry;
use crate::{answer, forward};
use classify::{classify, Api, Target};
use steps::{
    answered, api_head, begin, bound, endpoint_of, guardrails, identify, key_grant, looked_up,
    lookup, mcp, opened_at, rejection, routed, slowdown, slows, stored, surface_call, Begun, Fail,
    Req,
};

/// Count (and log) a request answered outside `handle`, which started at `start`: a head that
/// did not parse, a probe over the connection cap.
fn count(shard: &Shard, conn: &ClientConn, start: Instant, endpoint: Endpoint, status: u16) {
    let mut t = Trace::new(start);
    t.endpoint = endpoint;
    let id = conn.request_id;
    let routing = shard.live.peek();
    let end = record::Ended {
        status,
        request_id: id.as_str(),
        bytes_out: conn.bytes_out,
        trace_id: None,
    };
    record::request_ended(shard, &routing.routes, &t, &end);
}

/// A request head that did not parse (or did not come in time): answered with `e` (then the
/// connection closes), counted.
async fn bad_head(conn: &mut ClientConn, shard: &Shard, e: &Error) {
    let start = Instant::now();
    conn.start_request(shard.request_ids.next());
    shard.sink(false).error(conn, e, ErrorShape::OpenAi).await;
    count(shard, conn, start, Endpoint::Other, e.status());
}

pub async fn serve_connection(mut conn: ClientConn, shard: Rc<Shard>) {
    bump(&shard.metrics.connections);
    bump(&shard.metrics.connections_total);
    // a connection that sends no complete head does not stay for the keep-alive idle time
    conn.first_head_by = Some(Instant::now() + shard.limits.first_head_timeout);
    loop {
        // parse head (an idle connection also ends when the shard drains)
        let next = monoio::select! {
            _ = shard.draining.wait() => break,
            h = conn.read_head(&shard.limits) => h,
        };
        let head = match next {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                bad_head(&mut conn, &shard, &e).await;
                break;
            }
        };
        bump(&shard.metrics.in_flight);
        crate::runtime::spin::touch();
        let sent_id = head.header(&conn.buf, &head.x_request_id);
        conn.start_request(shard.request_ids.assign(sent_id));
        // Boxed: the request's state (a few KiB) exists only while a request is in flight, and
        // an idle connection's task stays small.
        // The head is lent, not moved in: it would be stored twice in the box (`handle`'s
        // argument and `serve`'s), and copied with it.
        let keep = Box::pin(handle(&mut conn, &head, &shard)).await;
        // the response buffer back to the shard's free list (see `ClientConn::end_request`)
        conn.end_request();
        dec(&shard.metrics.in_flight);
        crate::runtime::spin::touch();
        if !keep {
            break;
        }
    }
    dec(&shard.metrics.connections);
}

/// Over `max_connections` (or the address's cap, or the budget's connection share): read one
/// request head (briefly: probes send at once), answer `/healthz` and `/readyz` as usual; a
/// request with a valid key, while under `max_connections`, is served as on any connection
/// (charged past the connection share: the budget keeps that part for keyed requests);
/// anything else gets 503 + Retry-After, then close.
pub async fn serve_over_cap(mut conn: ClientConn, shard: Rc<Shard>) {
    shard.over_cap.set(shard.over_cap.get() + 1);
    let wait = shard.limits.header_timeout.min(OVER_CAP_WAIT);
    let limits = crate::http::conn::Limits {
        idle_timeout: wait,
        header_timeout: wait,
        ..shard.limits
    };
    let next = monoio::select! {
        _ = shard.draining.wait() => Err(Error::overloaded("draining")),
        h = conn.read_head(&limits) => h,
    };
    if let Ok(Some(head)) = &next {
        let keyed = matches!(
            shard.governance.identify(head, &conn.buf),
            crate::governance::Caller::Key(_)
        );
        let peer = conn.peer;
        // (a TLS connection also holds its record buffers, as in `tls::listener`)
        let tls_extra = match conn.stream.is_tls() {
            true => crate::admit::connection::TLS_CONNECTION_EXTRA,
            false => 0,
        };
        let charge = keyed.then(|| {
            let slot = shard.peers.enter_keyed(peer?)?;
            let c = shard.admission.keyed_connection().ok()?;
            let budget = shard.admission.budget();
            Some((slot, c, budget.charge_keyed_connection(tls_extra).ok()?))
        });
        if let Some(charge) = charge.flatten() {
            shard.over_cap.set(shard.over_cap.get().saturating_sub(1));
            Box::pin(serve_connection(conn, shard)).await;
            drop(charge);
            return;
        }
    }
    match next {
        Ok(Some(head)) => {
            let sent_id = head.header(&conn.buf, &head.x_request_id);
            conn.start_request(shard.request_ids.assign(sent_id));
            let target = classify(head.method, head.path(&conn.buf));
            let edge = shard.edge.check_on(&head, &conn.buf, conn.stream.is_tls());
            match (target, edge) {
                (Ok(t @ (Target::Healthz | Target::Readyz)), Ok(Verdict::Plain)) => {
                    let (status, body) = local::health(shard.as_ref(), t);
                    let start = Instant::now();
                    let w = Whole {
                        status,
                        content_type: b"application/json",
                        extra: b"",
                        body,
                    };
                    shard.sink(false).whole(&mut conn, w).await;
                    count(&shard, &conn, start, endpoint_of(Some(t)), status);
                }
                _ => refuse_connection(conn, shard.clone()).await,
            }
        }
        // nothing (complete) arrived in time: the usual refusal
        Ok(None)
        | Err(Error {
            kind: Kind::ClientTimeout,
            ..
        }) => {
            refuse_connection(conn, shard.clone()).await;
        }
        Err(e) => bad_head(&mut conn, &shard, &e).await,
    }
    shard.over_cap.set(shard.over_cap.get().saturating_sub(1));
}

/// Longest an over-the-cap connection is given to send its request head.
const OVER_CAP_WAIT: std::time::Duration = std::time::Duration::from_millis(1000);

/// Over `max_connections`: answer 503 + Retry-After without reading the request, then close.
pub async fn refuse_connection(mut conn: ClientConn, shard: Rc<Shard>) {
    bump(&shard.metrics.connections_refused);
    if conn.request_id.is_empty() {
        conn.start_request(shard.request_ids.next());
    }
    let e = Error::new(Kind::Overloaded, "too many open connections; retry later");
    shard
        .sink(false)
        .error(&mut conn, &e, ErrorShape::OpenAi)
        .await;
}

/// Bytes of one request's future (`handle`'s, boxed once per request by `serve_connection`:
/// every byte of it is moved into the box per request). `ringgate --request-future-bytes`
/// prints it; the unit test `request_future_size` bounds it.
#[doc(hidden)]
pub fn request_future_bytes() -> usize {
    fn size<'a, F, R>(_: &F) -> usize
    where
        F: Fn(&'a mut ClientConn, &'a RequestHead, &'a Shard) -> R,
    {
        std::mem::size_of::<R>()
    }
    size(&handle)
}

/// One request. Returns whether the connection may carry another one. Every failure before the
/// answer started ends here, in one place: counted, then answered in the client's dialect.
async fn handle(conn: &mut ClientConn, head: &RequestHead, shard: &Shard) -> bool {
    // the config this request runs on to its end (a reload swaps it for the next request)
    let routing = shard.routing();
    let mut req = Req {
        trace: Trace::new(conn.head_at),
        shape: ErrorShape::OpenAi,
        keep: false,
        otel: None,
        guard: None,
    };
    let mut request = Request::new(head);
    conn.hold_head(head.len);
    let outcome = match serve(conn, &mut request, shard, &routing, &mut req).await {
        Ok(o) => o,
        Err(Fail::Error(e)) => {
            if let Some(o) = req.otel.as_deref_mut() {
                o.error = Some(e.code());
            }
            shard.sink(req.keep).error(conn, &e, req.shape).await
        }
        Err(Fail::ClientGone) => gone(&shard.metrics, 499),
    };
    // the request is answered: its head's bytes go (what follows is the next request's)
    conn.drop_head();
    if let Some(g) = req.guard.take() {
        crate::guardrail::hits::ended(&g, &shard.guardrail_hits, &mut req.trace);
    }
    let id = conn.request_id;
    let end = record::Ended {
        status: outcome.status,
        request_id: id.as_str(),
        bytes_out: conn.bytes_out,
        trace_id: req.otel.as_ref().map(|o| o.ctx.trace_id),
    };
    record::request_ended(shard, &routing.routes, &req.trace, &end);
    if let (Some(o), Some(tel)) = (req.otel.take(), &shard.telemetry) {
        let key = req.trace.key.and_then(|k| shard.governance.key_name(k));
        let ended = telemetry::Ended {
            status: outcome.status,
            request_id: id.as_str(),
            key: key.as_deref(),
        };
        telemetry::request_ended(tel, &routing.routes, &req.trace, o, &ended);
    }
    outcome.keep_alive
}

/// The request path, top to bottom: parse (done) → edge checks → classify → govern (key, rate)
/// → admit → read body → route → govern (model, tokens) → guardrails → cache → forward (plan,
/// attempts, upstream) → answer (relay or translate back). The head stays readable to the end
/// (`http::Request`): each stage reads the header it needs when it needs it.
async fn serve(
    conn: &mut ClientConn,
    request: &mut Request<'_>,
    shard: &Shard,
    routing: &Routing,
    req: &mut Req,
) -> Result<Outcome, Fail> {
    let head = request.head;
    let target = match begin(conn, head, shard, req)? {
        Begun::Preflight(out) => return Ok(shard.sink(req.keep).written(conn, out, 204).await),
        Begun::Target(t) => t,
    };
    // govern on the head: who the caller is, a valid key (401), its in-flight and request-rate
    // shares (429); an address that keeps sending unknown keys waits first (nothing when keys
    // are off). The awaits stay in this function: each helper future moved in costs a copy.
    let caller = identify(conn, head, shard, req);
    if slows(shard, caller, target) {
        slowdown(conn, shard).await?;
    }
    let mut grant = key_grant(conn, head, shard, caller, target)?;
    if let Some(g) = grant.as_mut() {
        // with a shared limits store: its verdict (a branch otherwise)
        g.confirm(&mut conn.resp_headers).await?;
    }
    let api = match target {
        Target::Api(dialect, op) => Api::of(dialect, op, head, &conn.buf)?,
        Target::Mcp => return mcp(conn, head, shard, routing, grant.as_ref(), req).await,
        Target::Surface(call) => {
            let ctx = (shard, routing, grant.as_mut());
            return surface_call(conn, head, ctx, call, req).await;
        }
        _ => return Ok(local::local(conn, shard, routing, target, head).await?),
    };
    // admit, decided on the head before any body byte is read or allocated: the permit holds
    // `declared body + response reserve` of the shard's budget until the request ends
    let (headers, declared) = api_head(conn, head, shard, &api, req)?;
    let admitted = shard.admission.admit(declared).await;
    let permit = admitted.map_err(|r| rejection(r, declared, shard.admission.max_body()))?;
    if !expect::send_continue(conn, head, shard.limits.write_timeout).await {
        return Ok(gone(&shard.metrics, 499));
    }
    // read the body (bounded) after the head, which stays
    let body_start = Instant::now();
    request.body = conn
        .read_body(head, bound(shard, body_start, &permit))
        .await?;
    req.body_read(head, request.body.len(), body_start);

    // route by model (404); a Responses request's state namespace (store on only)
    let (mut fields, route) = routed(shard, routing, &api, request, &conn.buf, caller, req)?;
    // govern: the key's model allow-list (403) and token rate (429)
    if let Some(g) = grant.as_mut() {
        let len = request.body.len();
        g.check_model(&fields, route, api.op, len, &mut conn.resp_headers)?;
        g.confirm(&mut conn.resp_headers).await?;
        fields.metered = true;
    }
    // guardrails of the model and the key: the request's text checked (400) or masked before
    // anything goes upstream; the answer's, in `relay` / `bridge` (none configured: one branch)
    let guarded = (routing, grant.as_ref(), route);
    guardrails(guarded, &api, &mut request.body, &mut fields, req)?;
    // a traced request's answer is read for its span (usage, id, finish reasons, content)
    let (tel, gov) = (&shard.telemetry, &shard.governance);
    telemetry::read_answer(req.otel.as_deref(), tel, &mut grant, gov);

    let mut call = Call {
        dialect: api.dialect,
        op: api.op,
        fields: &fields,
        routing,
        route,
        headers: &headers,
        permit: &permit,
        grant,
        tried: Tried::default(),
        keep_alive: head.keep_alive,
        // set when forwarding starts, below
        start: conn.head_at,
    };
    let body = &request.body[..];
    // cache: a stored answer replayed here, or a miss whose answer is recorded
    let miss = match looked_up(req, lookup(conn, head, shard, &call, body, caller).await) {
        Ok(m) => m,
        Err(hit) => return Ok(hit),
    };

    // forward: plan each attempt (translate the request if needed), balance, retry, fall
    // back, until an upstream answer's head arrived
    call.tried.otel = req.otel.take();
    let env = shard.env(req.guard.clone());
    call.start = Instant::now();
    let opened = forward::open::open(conn, &env, &mut call, body).await;
    let open_end = opened_at(conn, &mut call, req);
    let mut opened = opened?;

    // answer: relay the answer, or translate it back, in the client's dialect
    let outcome = answer::write(conn, &env, &mut call, &mut opened).await;
    answered(&mut call, opened, open_end, req);
    stored(conn, shard, miss, &outcome);
    Ok(outcome?)
}

#[cfg(test)]
mod tests {
    /// Bytes of one request's future (`request_future_bytes`) as this tree builds it in debug:
    /// 6,784 (on `ddc9f26`, before the telemetry answer reading: 6,656 debug and release, and
    /// 7,168 in release before issue 21's `Request`/`Call`). Every byte
    /// of it is moved into its box once per request: a stage that inlines a large state into it
    /// (instead of boxing it, as the cache replay and the translated answer are) fails here.
    /// Release builds: `ringgate --request-future-bytes` (benches/README.md).
    const REQUEST_FUTURE_BOUND: usize = 6784;

    #[test]
    fn request_future_size() {
        let n = super::request_future_bytes();
        eprintln!("request future: {n} bytes (debug build)");
        assert!(
            n <= REQUEST_FUTURE_BOUND,
            "one request's future grew to {n} bytes (bound {REQUEST_FUTURE_BOUND})"
        );
    }
}
