//! The request path, top to bottom, in one place (`serve`):
//! accept → parse head → edge checks → govern (key, rate) → admit → read body → route → govern
//! (model, tokens) → guardrails (request text: mask or 400) → cache → forward (plan → attempts
//! → upstream) → answer (`answer::write`: relay, or translate back). Each stage calls into its
//! own module; this file only sequences them and turns every failure before an answer's first
//! byte (its own stages' and the answer stage's) into a response in the client's dialect, in
//! one place (`handle`, through `answer::Sink::error`). A request is one `http::Request` (the
//! head's bytes stay in the read buffer until `handle` drops them, so a stage reads a header
//! when it needs it); once routed it travels down as one `forward::Call`.
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

use std::rc::Rc;
use std::time::Instant;

use crate::answer::outcome::{gone, Outcome};
use crate::answer::Whole;
use crate::cache::serve as cache;
use crate::config::provider::Op;
use crate::dialect::extract::RoutingFields;
use crate::dialect::Dialect;
use crate::error::{Error, ErrorShape, Kind};
use crate::forward::live::Routing;
use crate::forward::open::{Call, NoHead, Opened, Tried};
use crate::governance::{Caller, Gate, Grant};
use crate::http::body::Bound;
use crate::http::conn::ClientConn;
use crate::http::edge::{self, Verdict};
use crate::http::expect;
use crate::http::{BodyFraming, Request, RequestHead};
use crate::observe::metrics::{bump, dec};
use crate::observe::trace::{Endpoint, Trace};
use crate::pipeline::shard::Shard;
use crate::route::Route;
use crate::telemetry;
use crate::upstream::headers::ClientHeaders;
use crate::{answer, dialect::gemini::call as gemini_call, forward, surface::serve as surface};
use classify::{classify, Api, Target};

/// The `endpoint` a request counts under (metrics, access log).
fn endpoint_of(t: Option<Target>) -> Endpoint {
    match t {
        Some(Target::Api(Dialect::Chat, Op::Generate)) => Endpoint::ChatCompletions,
        Some(Target::Api(Dialect::Responses, _)) => Endpoint::Responses,
        Some(Target::Api(Dialect::Messages, Op::Generate)) => Endpoint::Messages,
        Some(Target::Api(_, Op::CountTokens)) => Endpoint::CountTokens,
        Some(Target::Api(_, Op::Embeddings)) => Endpoint::Embeddings,
        Some(Target::Api(_, Op::Completions)) => Endpoint::Completions,
        Some(Target::Api(Dialect::Gemini, _)) => Endpoint::Gemini,
        Some(Target::Models | Target::Model) => Endpoint::Models,
        Some(Target::Healthz | Target::Readyz) => Endpoint::Health,
        Some(Target::Metrics) => Endpoint::Metrics,
        Some(Target::Mcp) => Endpoint::Mcp,
        Some(Target::Surface(c)) => c.endpoint(),
        None => Endpoint::Other,
    }
}

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

/// Where one request stands, for its single error sink: which endpoint it counts under, the
/// dialect its errors speak, and whether the connection survives an error now (not while an
/// unread body is pending: answering then closing is the only way not to desynchronise).
struct Req {
    /// What the request did, for metrics and the access log.
    trace: Trace,
    shape: ErrorShape,
    keep: bool,
    /// Its span state, when `[telemetry]` traces it (`telemetry`).
    otel: Option<Box<telemetry::Request>>,
    /// The request's guardrails (`None`: none applies; set after routing).
    guard: Option<std::rc::Rc<crate::guardrail::Session>>,
}

/// How a request failed before its answer started.
enum Fail {
    /// Answer with this error in the client's dialect.
    Error(Error),
    /// The client left while the upstream was silent: nothing to answer.
    ClientGone,
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Error(e)
    }
}

impl From<NoHead> for Fail {
    fn from(n: NoHead) -> Self {
        match n {
            NoHead::Failed(e) => Fail::Error(e),
            NoHead::ClientGone => Fail::ClientGone,
        }
    }
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

/// What the head asks for, once its edge checks passed: a CORS preflight's answer (written by
/// the sink), or a target this listener serves.
enum Begun {
    Preflight(Vec<u8>),
    Target(Target),
}

/// The head's first checks: classified, traced (when `[telemetry]` samples it), the dialect
/// its errors speak chosen, the edge checks run (`edge`), and a target this listener serves
/// (`served_here`). Until the body is read, an error answer closes the connection.
fn begin(
    conn: &mut ClientConn,
    head: &RequestHead,
    shard: &Shard,
    req: &mut Req,
) -> Result<Begun, Error> {
    req.keep = head.keep_alive && head.body == BodyFraming::None;
    let target = classify(head.method, head.path(&conn.buf));
    trace_and_shape(conn, head, shard, &target, req);
    if let Some(out) = edge(conn, head, shard, req.keep)? {
        return Ok(Begun::Preflight(out));
    }
    Ok(Begun::Target(served_here(target?, shard, req)?))
}

/// A classified target this listener serves: the endpoint it counts under noted, `/metrics`
/// refused on a public listener (it names keys, models and providers).
fn served_here(target: Target, shard: &Shard, req: &mut Req) -> Result<Target, Error> {
    req.trace.endpoint = endpoint_of(Some(target));
    if target == Target::Metrics && !shard.metrics_here {
        return Err(Error::new(
            Kind::NotFound,
            "no route for /metrics on this listener (it is served on the admin listener, or set [server] metrics_on_main = true)",
        ));
    }
    Ok(target)
}

/// The request's routing fields (a Responses request's state namespace among them, when the
/// store is on) and its model's route (unknown model: 404), noted in its trace (and its span,
/// when traced).
fn routed<'r>(
    shard: &Shard,
    routing: &'r Routing,
    api: &Api,
    request: &Request,
    buf: &[u8],
    caller: Caller,
    req: &mut Req,
) -> Result<(RoutingFields, &'r Route), Error> {
    let mut fields = api.fields(&request.body)?;
    if api.dialect == Dialect::Responses && api.op == Op::Generate && shard.responses.on() {
        let (store, gov) = (&shard.responses, &shard.governance);
        let tenant = crate::responses_state::tenant_of(store, gov, caller, request.head, buf);
        fields.tenant = Some(tenant);
    }
    let route = routing
        .routes
        .resolve(&fields.model)
        .ok_or_else(|| unknown_model(&fields.model))?;
    req.trace.route = Some(route.index as u32);
    req.trace.stream = fields.stream;
    if shard.access_log.on() || shard.request_log.on() {
        req.trace.model = Some(fields.model.as_str().into());
    }
    if let (Some(o), Some(tel)) = (req.otel.as_deref_mut(), &shard.telemetry) {
        o.routed(&fields.model, api.dialect, &request.body, tel.capture());
    }
    Ok((fields, route))
}

/// The cache's answer, noted in the span: a hit's outcome (`Err`: the request is answered), a
/// miss to record once answered, or a request the cache passes.
fn looked_up(req: &mut Req, found: cache::Lookup) -> Result<Option<cache::Miss>, Outcome> {
    let (miss, seen) = match found {
        cache::Lookup::Hit(o) => {
            if let Some(t) = req.otel.as_deref_mut() {
                t.cache = Some("hit");
            }
            return Err(o);
        }
        cache::Lookup::Miss(m) => (Some(m), Some("miss")),
        cache::Lookup::Pass => (None, None),
    };
    if let (Some(t), Some(seen)) = (req.otel.as_deref_mut(), seen) {
        t.cache = Some(seen);
    }
    Ok(miss)
}

/// The attempts are over (`call.tried`): what they did goes to the trace and the client's
/// `x-ringgate-provider` / `-attempts` lines, the span back to the request. Returns when.
fn opened_at(conn: &mut ClientConn, call: &mut Call, req: &mut Req) -> Instant {
    let open_end = Instant::now();
    req.trace.upstream = open_end.saturating_duration_since(call.start);
    req.trace.served = call.tried.served;
    req.trace.attempts = call.tried.attempts;
    req.otel = call.tried.otel.take();
    call.tried.write_headers(&mut conn.resp_headers);
    open_end
}

/// The answer went out (or failed): the upstream's time and first piece, and the usage a keyed
/// request's answer reported (unkeyed requests are not scanned), to the trace and the span.
/// The upstream exchange ends here (`opened` dropped).
fn answered(call: &mut Call, opened: Opened, open_end: Instant, req: &mut Req) {
    req.trace.upstream += opened.ex.waited;
    req.trace.first_piece = opened.ex.first_piece_at(open_end);
    let grant = call.grant.as_mut();
    req.trace.tokens = grant.filter(|g| g.keyed()).and_then(|g| g.usage().io());
    if let (Some(o), Some(g)) = (req.otel.as_deref_mut(), call.grant.as_mut()) {
        o.answered(g.usage());
    }
}

/// Trace context and sampling (nothing when `[telemetry]` is off), and the dialect errors
/// speak before the request is classified (the one its path suggests).
fn trace_and_shape(
    conn: &ClientConn,
    head: &RequestHead,
    shard: &Shard,
    target: &Result<Target, Error>,
    req: &mut Req,
) {
    let (buf, path) = (&conn.buf, head.path(&conn.buf));
    if let (Some(tel), Ok(t @ (Target::Api(..) | Target::Mcp))) = (&shard.telemetry, target) {
        req.otel = tel.begin(
            head.header(buf, &head.traceparent),
            head.header(buf, &head.tracestate),
            head.method.as_str(),
            path,
            match t {
                Target::Api(d, op) => telemetry::operation(*d, *op),
                _ => "execute_tool",
            },
        );
    }
    if path.starts_with(b"/v1/messages") {
        req.shape = ErrorShape::Anthropic;
    } else if gemini_call::is_gemini_path(path) {
        req.shape = ErrorShape::Gemini;
    }
    if let Ok(Target::Models | Target::Model) = target {
        // the model endpoints answer (and fail) in the asking SDK's shape
        req.shape = crate::route::models::Shape::of(path, head, buf).errors();
    }
}

/// Browser-facing checks (Origin allow-list, loopback Host), on the head: a CORS preflight's
/// answer is returned (`Some`, written by the sink), an allowed cross-origin request gets
/// its CORS lines, a refused one fails.
fn edge(
    conn: &mut ClientConn,
    head: &RequestHead,
    shard: &Shard,
    keep: bool,
) -> Result<Option<Vec<u8>>, Error> {
    let verdict = shard.edge.check_on(head, &conn.buf, conn.stream.is_tls())?;
    if verdict != Verdict::Cors && verdict != Verdict::Preflight {
        return Ok(None);
    }
    let origin = head.header(&conn.buf, &head.origin).unwrap_or_default();
    if verdict == Verdict::Cors {
        edge::cors_headers(&mut conn.resp_headers, origin);
        return Ok(None);
    }
    let mut out = std::mem::take(&mut conn.out);
    out.clear();
    let req_headers = head.header(&conn.buf, &head.ac_request_headers);
    edge::preflight_response(&mut out, origin, req_headers, keep);
    Ok(Some(out))
}

/// An address that keeps sending unknown keys waits before its key is acted on
/// (`peer::slowdown`; 429 when it is over).
async fn slowdown(conn: &ClientConn, shard: &Shard) -> Result<(), Error> {
    let (Some(slow), Some(peer)) = (&shard.key_guesses, conn.peer) else {
        return Ok(());
    };
    slow.wait(peer, conn.head_at).await.map_err(|d| {
        Error::new(
            Kind::RateLimited,
            "too many requests with an unknown API key from this address; retry later",
        )
        .retry_after(d.as_secs().clamp(1, 3600) as u32)
    })
}

/// The caller's key admitted on the head (401, 429; `None`: keys off or open); an unknown
/// key's failure is counted for its address (`peer::slowdown`).
fn key_grant<'s>(
    conn: &mut ClientConn,
    head: &RequestHead,
    shard: &'s Shard,
    caller: Caller,
    target: Target,
) -> Result<Option<Grant<'s>>, Error> {
    let grant = shard
        .governance
        .admit(caller, target.gate(), &mut conn.resp_headers);
    let slow = shard.key_guesses.as_ref().zip(conn.peer);
    if let (Err(_), Caller::Unknown, Some((slow, peer))) = (&grant, caller, slow) {
        // an unknown key: its fingerprint, for the per-address guess count
        use crate::governance::credential::{with_presented, Presented};
        let secret = with_presented(head, &conn.buf, |p| match p {
            Presented::Key(k) => slow.fingerprint(k),
            _ => 0,
        });
        slow.failed(peer, Instant::now(), secret);
    }
    grant
}

/// The body size a request declares on its head (0 for chunked or none), with the cache's
/// entries removed elsewhere settled first (a short budget sheds this shard's).
fn declared(head: &RequestHead, shard: &Shard) -> u64 {
    let declared = match head.body {
        BodyFraming::Length(n) => n,
        _ => 0,
    };
    if let Some(c) = &shard.cache {
        let need = declared.saturating_add(shard.admission.response_reserve());
        c.settle(shard.id, shard.admission.budget(), need);
    }
    declared
}

/// The request's guardrails (`sess`, selected by the caller): a text prompt is refused (they
/// read message lists only); the request text is checked (400) or masked, and a masked body's
/// routing fields read again.
fn guard(
    sess: &crate::guardrail::Session,
    api: &Api,
    body: &mut Vec<u8>,
    fields: &mut RoutingFields,
) -> Result<(), Error> {
    if api.op == Op::Completions {
        // a text prompt is not a message list the guardrails read: refuse, never pass
        return Err(Error::new(
            Kind::InvalidBody,
            "this model has guardrails, which do not read /v1/completions prompts: use /v1/chat/completions",
        ));
    }
    if let Some(masked) = crate::guardrail::request::guard_request(sess, api.dialect, body)? {
        *body = masked;
        let (metered, tenant) = (fields.metered, fields.tenant);
        *fields = api.fields(body)?;
        (fields.metered, fields.tenant) = (metered, tenant);
    }
    Ok(())
}

/// Who the caller is (by its key, on the head), noted in the trace.
fn identify(conn: &ClientConn, head: &RequestHead, shard: &Shard, req: &mut Req) -> Caller {
    let caller = shard.governance.identify(head, &conn.buf);
    req.trace.key = caller.key();
    caller
}

/// Whether this caller's address waits first (`slowdown`): keys on, a key to act on, a gated
/// target.
fn slows(shard: &Shard, caller: Caller, target: Target) -> bool {
    shard.key_guesses.is_some() && caller != Caller::Open && target.gate() != Gate::Open
}

/// A model call's head, once classified: the dialect its errors speak, the client headers the
/// header policy may forward (`upstream::headers`), and the body size it declares (`declared`).
fn api_head(
    conn: &ClientConn,
    head: &RequestHead,
    shard: &Shard,
    api: &Api,
    req: &mut Req,
) -> Result<(ClientHeaders, u64), Error> {
    req.shape = crate::answer::outcome::shape(api.dialect);
    let headers = ClientHeaders::capture(head, &conn.buf, conn.request_id)?;
    Ok((headers, declared(head, shard)))
}

/// The body's bounds, from `start`: the admitted size, the body timeout, the permit charged.
fn bound<'p>(shard: &Shard, start: Instant, permit: &'p crate::admit::Permit) -> Bound<'p> {
    Bound {
        max: shard.admission.max_body(),
        deadline: start + shard.limits.body_timeout,
        permit: Some(permit),
    }
}

impl Req {
    /// The body was read (from `start`, `len` bytes): an error answer now keeps the connection;
    /// its time and the request's bytes in go to the trace.
    fn body_read(&mut self, head: &RequestHead, len: usize, start: Instant) {
        self.keep = head.keep_alive;
        self.trace.client_body = start.elapsed();
        self.trace.bytes_in = (head.len + len) as u64;
    }
}

/// The guardrails of the model and the key (`guarded`: the routing, the grant, the route),
/// selected into `req.guard` and run on the request (`guard`); none configured: one branch.
fn guardrails(
    guarded: (&Routing, Option<&Grant>, &Route),
    api: &Api,
    body: &mut Vec<u8>,
    fields: &mut RoutingFields,
    req: &mut Req,
) -> Result<(), Error> {
    let (routing, grant, route) = guarded;
    if !routing.routes.guards.active() {
        return Ok(());
    }
    let key = grant.and_then(|g| g.key_name());
    req.guard = routing.routes.guards.select(&route.name, key.as_deref());
    match req.guard.as_deref() {
        Some(sess) => guard(sess, api, body, fields),
        None => Ok(()),
    }
}

/// The cache's answer (`Pass` when there is no cache). Boxed: a replay's state is large, and
/// inline it would make every request's future (moved into its box once per request, byte for
/// byte) that much larger with the cache off too.
async fn lookup(
    conn: &mut ClientConn,
    head: &RequestHead,
    shard: &Shard,
    call: &Call<'_>,
    body: &[u8],
    caller: Caller,
) -> cache::Lookup {
    let Some(c) = shard.cache.as_deref() else {
        return cache::Lookup::Pass;
    };
    let ask = cache::ask_of(c, head, conn, &shard.governance, caller);
    Box::pin(cache::lookup(conn, &shard.cache_env(), call, body, &ask)).await
}

/// A cache miss's answer recorded, by its status (`outcome`'s, or its error's).
fn stored(
    conn: &mut ClientConn,
    shard: &Shard,
    miss: Option<cache::Miss>,
    outcome: &Result<Outcome, Error>,
) {
    if let Some(m) = miss {
        let status = outcome.as_ref().map_or_else(Error::status, |o| o.status);
        cache::store(conn, &shard.cache_env(), m, status);
    }
}

/// A surface call (files, audio, …), after the same edge checks and key admission as model
/// requests (boxed: a surface call's state stays out of every request's future).
async fn surface_call(
    conn: &mut ClientConn,
    head: &RequestHead,
    ctx: (&Shard, &Routing, Option<&mut Grant<'_>>),
    call: crate::surface::Call,
    req: &mut Req,
) -> Result<Outcome, Fail> {
    let (shard, routing, grant) = ctx;
    let env = shard.env(None);
    let ctx = surface::Ctx {
        env: &env,
        routing,
        grant,
    };
    let out = surface::serve(conn, head, ctx, call, &mut req.trace, &mut req.keep);
    Ok(Box::pin(out).await?)
}

/// An MCP request (`/mcp`), after the same edge checks and key admission as model requests.
async fn mcp(
    conn: &mut ClientConn,
    head: &RequestHead,
    shard: &Shard,
    routing: &Routing,
    grant: Option<&Grant<'_>>,
    req: &mut Req,
) -> Result<Outcome, Fail> {
    let env = crate::mcp::serve::Env {
        hub: &shard.mcp,
        servers: &routing.mcp,
        limits: &shard.limits,
        admission: &shard.admission,
        upstream: &shard.upstream,
        trace: telemetry::tool_call(req.otel.as_deref_mut(), &shard.telemetry),
    };
    // MCP decides its answer; the sink writes it (one writer of client bytes)
    let out = async {
        let served =
            crate::mcp::serve::serve(conn, head, &env, grant, &mut req.trace, &mut req.keep);
        let Some(r) = served.await? else {
            return Err(Fail::ClientGone);
        };
        let w = Whole {
            status: r.status,
            content_type: r.content_type,
            extra: &r.extra,
            body: &r.body,
        };
        Ok(shard.sink(req.keep).whole(conn, w).await)
    };
    Box::pin(out).await
}

fn unknown_model(model: &str) -> Error {
    Error::new(
        Kind::UnknownModel,
        format!("The model `{model}` does not exist or is not routed by this gateway"),
    )
}

/// The client-facing error for an admission refusal: 413 over `max_body`, else 503 +
/// Retry-After.
fn rejection(r: crate::admit::Reject, declared: u64, max_body: u64) -> Error {
    match r {
        crate::admit::Reject::BodyTooLarge => Error::new(
            Kind::BodyTooLarge,
            format!("request body of {declared} bytes is over the {max_body}-byte limit"),
        ),
        other => Error::overloaded(other.as_str()),
    }
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
