//! The steps `serve` (in `pipeline`) sequences, one function each: the head's first checks
//! (`begin`: classify, trace, error dialect, edge, listener), the caller (`identify`,
//! `slowdown`, `key_grant`), admission's inputs (`api_head`, `bound`, `rejection`), routing
//! (`routed`), guardrails (`guardrails`), the cache (`lookup`, `looked_up`, `stored`), the
//! attempts' and answer's notes (`opened_at`, `answered`), and the MCP and surface branches
//! (boxed inside). `Req` is the request's state for its single error sink (`handle`).
//!
//! Owns: what each step reads and notes. Must not: await anything but its own boxed branch
//! (`lookup`, `mcp`, `surface_call`) or the key-guess wait (`slowdown`) — `serve` keeps the
//! awaits inline (a helper future moved into the request future costs a copy) — or write to
//! the client (the sink does, in `pipeline`).

use std::time::Instant;

use super::classify::{classify, Api, Target};
use crate::answer::outcome::Outcome;
use crate::answer::Whole;
use crate::cache::serve as cache;
use crate::config::provider::Op;
use crate::dialect::extract::RoutingFields;
use crate::dialect::Dialect;
use crate::error::{Error, ErrorShape, Kind};
use crate::forward::live::Routing;
use crate::forward::open::{Call, NoHead, Opened};
use crate::governance::{Caller, Gate, Grant};
use crate::http::body::Bound;
use crate::http::conn::ClientConn;
use crate::http::edge::{self, Verdict};
use crate::http::{BodyFraming, Request, RequestHead};
use crate::observe::trace::{Endpoint, Trace};
use crate::pipeline::shard::Shard;
use crate::route::Route;
use crate::telemetry;
use crate::upstream::headers::ClientHeaders;
use crate::{dialect::gemini::call as gemini_call, surface::serve as surface};

/// The `endpoint` a request counts under (metrics, access log).
pub(super) fn endpoint_of(t: Option<Target>) -> Endpoint {
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

/// Where one request stands, for its single error sink: which endpoint it counts under, the
/// dialect its errors speak, and whether the connection survives an error now (not while an
/// unread body is pending: answering then closing is the only way not to desynchronise).
pub(super) struct Req {
    /// What the request did, for metrics and the access log.
    pub(super) trace: Trace,
    pub(super) shape: ErrorShape,
    pub(super) keep: bool,
    /// Its span state, when `[telemetry]` traces it (`telemetry`).
    pub(super) otel: Option<Box<telemetry::Request>>,
    /// The request's guardrails (`None`: none applies; set after routing).
    pub(super) guard: Option<std::rc::Rc<crate::guardrail::Session>>,
}

/// How a request failed before its answer started.
pub(super) enum Fail {
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

/// What the head asks for, once its edge checks passed: a CORS preflight's answer (written by
/// the sink), or a target this listener serves.
pub(super) enum Begun {
    Preflight(Vec<u8>),
    Target(Target),
}

/// The head's first checks: classified, traced (when `[telemetry]` samples it), the dialect
/// its errors speak chosen, the edge checks run (`edge`), and a target this listener serves
/// (`served_here`). Until the body is read, an error answer closes the connection.
pub(super) fn begin(
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
pub(super) fn routed<'r>(
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
pub(super) fn looked_up(
    req: &mut Req,
    found: cache::Lookup,
) -> Result<Option<cache::Miss>, Outcome> {
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
pub(super) fn opened_at(conn: &mut ClientConn, call: &mut Call, req: &mut Req) -> Instant {
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
pub(super) fn answered(call: &mut Call, opened: Opened, open_end: Instant, req: &mut Req) {
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
pub(super) async fn slowdown(conn: &ClientConn, shard: &Shard) -> Result<(), Error> {
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
pub(super) fn key_grant<'s>(
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
pub(super) fn identify(
    conn: &ClientConn,
    head: &RequestHead,
    shard: &Shard,
    req: &mut Req,
) -> Caller {
    let caller = shard.governance.identify(head, &conn.buf);
    req.trace.key = caller.key();
    caller
}

/// Whether this caller's address waits first (`slowdown`): keys on, a key to act on, a gated
/// target.
pub(super) fn slows(shard: &Shard, caller: Caller, target: Target) -> bool {
    shard.key_guesses.is_some() && caller != Caller::Open && target.gate() != Gate::Open
}

/// A model call's head, once classified: the dialect its errors speak, the client headers the
/// header policy may forward (`upstream::headers`), and the body size it declares (`declared`).
pub(super) fn api_head(
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
pub(super) fn bound<'p>(
    shard: &Shard,
    start: Instant,
    permit: &'p crate::admit::Permit,
) -> Bound<'p> {
    Bound {
        max: shard.admission.max_body(),
        deadline: start + shard.limits.body_timeout,
        permit: Some(permit),
    }
}

impl Req {
    /// The body was read (from `start`, `len` bytes): an error answer now keeps the connection;
    /// its time and the request's bytes in go to the trace.
    pub(super) fn body_read(&mut self, head: &RequestHead, len: usize, start: Instant) {
        self.keep = head.keep_alive;
        self.trace.client_body = start.elapsed();
        self.trace.bytes_in = (head.len + len) as u64;
    }
}

/// The guardrails of the model and the key (`guarded`: the routing, the grant, the route),
/// selected into `req.guard` and run on the request (`guard`); none configured: one branch.
pub(super) fn guardrails(
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
pub(super) async fn lookup(
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
pub(super) fn stored(
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
pub(super) async fn surface_call(
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
pub(super) async fn mcp(
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
pub(super) fn rejection(r: crate::admit::Reject, declared: u64, max_body: u64) -> Error {
    match r {
        crate::admit::Reject::BodyTooLarge => Error::new(
            Kind::BodyTooLarge,
            format!("request body of {declared} bytes is over the {max_body}-byte limit"),
        ),
        other => Error::overloaded(other.as_str()),
    }
}
