//! The request path, top to bottom, in one place (`serve`):
//! accept → parse head → edge checks → govern (key, rate) → admit → read body → route → govern
//! (model, tokens) → guardrails (request text: mask or 400) → forward (plan → attempts → upstream) → respond (relay, or translate back). Each stage calls into its own module; this
//! file only sequences them and turns their errors into responses in the client's dialect, in
//! one sink (`handle`).
//!
//! Connections: the first head must come within `first_request_timeout_ms`; an address that
//! keeps sending unknown keys waits before its key is acted on (`peer::slowdown`; nothing when
//! keys are off); over a cap, a first request with a valid key is still served
//! (`serve_over_cap`).
//!
//! Owns: the per-connection loop and the order of stages. Must not: parse bytes, build
//! upstream requests, retry, or relay bodies itself (see `http`, `extract`, `route`, `plan`,
//! `forward`, `respond`).

pub mod classify;
pub mod record;
pub mod scrape;
pub mod shard;

use std::rc::Rc;
use std::time::Instant;

use crate::answer::outcome::{gone, Outcome};
use crate::config::provider::Op;
use crate::dialect::Dialect;
use crate::error::{Error, ErrorShape, Kind};
use crate::forward::live::Routing;
use crate::forward::open::{NoHead, Tried};
use crate::governance::{Caller, Gate};
use crate::http::body::read_body;
use crate::http::conn::ClientConn;
use crate::http::edge::{self, Verdict};
use crate::http::{BodyFraming, RequestHead};
use crate::observe::metrics::{bump, dec};
use crate::observe::trace::{Endpoint, Trace};
use crate::pipeline::shard::Shard;
use crate::route::models::Ask;
use crate::upstream::headers::ClientHeaders;
use crate::{answer::respond, dialect::extract, dialect::gemini_call, forward};
use classify::{classify, model_id_in, Target};

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

/// Count a request answered outside `handle` (a head that did not parse, a probe over the cap).
/// Count (and log) a request answered outside `handle`, which started at `start`: a head that
/// did not parse, a probe over the connection cap.
fn count(shard: &Shard, conn: &ClientConn, start: Instant, endpoint: Endpoint, status: u16) {
    let mut t = Trace::new(start);
    t.endpoint = endpoint;
    let id = conn.request_id;
    let routing = shard.live.peek();
    crate::pipeline::record::request_ended(
        shard,
        &routing.routes,
        &t,
        status,
        id.as_str(),
        conn.bytes_out,
        None,
    );
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
                let start = Instant::now();
                conn.start_request(shard.request_ids.next());
                conn.respond_error(&e, ErrorShape::OpenAi, false, shard.limits.write_timeout)
                    .await;
                count(&shard, &conn, start, Endpoint::Other, e.status());
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
        conn.resp_headers.clear();
        conn.capture = None;
        // The response buffer is request memory (inside the permit's `response_reserve`): it
        // goes when the request ends, not when the connection has idled for `idle_release_ms`.
        conn.out = Vec::new();
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
    let wt = shard.limits.write_timeout;
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
                    let (status, body) = health(shard.as_ref(), t);
                    let start = Instant::now();
                    conn.respond(status, b"application/json", b"", body, false, wt)
                        .await;
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
        Err(e) => {
            let start = Instant::now();
            conn.start_request(shard.request_ids.next());
            conn.respond_error(&e, ErrorShape::OpenAi, false, wt).await;
            count(&shard, &conn, start, Endpoint::Other, e.status());
        }
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
    conn.respond_error(&e, ErrorShape::OpenAi, false, shard.limits.write_timeout)
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
    otel: Option<Box<crate::telemetry::Request>>,
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
    let outcome = match serve(conn, head, shard, &routing, &mut req).await {
        Ok(o) => o,
        Err(Fail::Error(e)) => {
            if let Some(o) = req.otel.as_deref_mut() {
                o.error = Some(e.code());
            }
            let wt = shard.limits.write_timeout;
            Outcome::error(conn, &e, req.shape, req.keep, wt).await
        }
        Err(Fail::ClientGone) => gone(&shard.metrics, 499),
    };
    if let Some(g) = req.guard.take() {
        crate::guardrail::hits::ended(&g, &shard.guardrail_hits, &mut req.trace);
    }
    let id = conn.request_id;
    crate::pipeline::record::request_ended(
        shard,
        &routing.routes,
        &req.trace,
        outcome.status,
        id.as_str(),
        conn.bytes_out,
        req.otel.as_ref().map(|o| o.ctx.trace_id),
    );
    if let (Some(o), Some(tel)) = (req.otel.take(), &shard.telemetry) {
        let key = req.trace.key.and_then(|k| shard.governance.key_name(k));
        let ended = crate::telemetry::Ended {
            status: outcome.status,
            request_id: id.as_str(),
            key: key.as_deref(),
        };
        crate::telemetry::request_ended(tel, &routing.routes, &req.trace, o, &ended);
    }
    outcome.keep_alive
}

/// The request path, top to bottom: parse (done) → edge checks → classify → admit → read body →
/// route → forward (plan, attempts, upstream) → respond (relay or translate back).
async fn serve(
    conn: &mut ClientConn,
    head: &RequestHead,
    shard: &Shard,
    routing: &Routing,
    req: &mut Req,
) -> Result<Outcome, Fail> {
    let wt = shard.limits.write_timeout;
    let keep_alive = head.keep_alive;
    let body_pending = head.body != BodyFraming::None;
    // Until the body is read, an error answer closes the connection.
    req.keep = keep_alive && !body_pending;

    // route by path (head only)
    let path = head.path(&conn.buf);
    let target = classify(head.method, path);
    // trace context and sampling (nothing when `[telemetry]` is off)
    if let (Some(tel), Ok(t @ (Target::Api(..) | Target::Mcp))) = (&shard.telemetry, &target) {
        let buf = &conn.buf;
        req.otel = tel.begin(
            head.header(buf, &head.traceparent),
            head.header(buf, &head.tracestate),
            head.method.as_str(),
            path,
            match t {
                Target::Api(d, op) => crate::telemetry::operation(*d, *op),
                _ => "execute_tool",
            },
        );
    }
    // Answer unclassified or refused requests in the dialect the path suggests.
    if path.starts_with(b"/v1/messages") {
        req.shape = ErrorShape::Anthropic;
    } else if gemini_call::is_gemini_path(path) {
        req.shape = ErrorShape::Gemini;
    }
    // What else the head says, read while it is in the buffer: a Gemini call's model and
    // stream choice (its body names neither), a model endpoint's answer shape and id.
    let gemini = matches!(target, Ok(Target::Api(Dialect::Gemini, _)))
        .then(|| gemini_call::call(path, head.query(&conn.buf)));
    // the client headers the header policy may forward (`upstream::headers`)
    let client_headers = match target {
        Ok(Target::Api(..)) => ClientHeaders::capture(head, &conn.buf, conn.request_id),
        _ => Ok(ClientHeaders::default()),
    };
    let ask = match target {
        Ok(Target::Models) => Some(Ask::of(head, &conn.buf, None)),
        Ok(Target::Model) => Some(Ask::of(head, &conn.buf, model_id_in(path))),
        _ => None,
    };
    if let Some(a) = &ask {
        req.shape = a.shape.errors();
    }
    // an MCP request's session id and Accept (nothing for other requests)
    let mcp_head =
        matches!(target, Ok(Target::Mcp)).then(|| crate::mcp::serve::McpHead::of(head, &conn.buf));
    // a surface call's id, query and headers (files, audio, …; nothing for other requests)
    let surface_head = matches!(target, Ok(Target::Surface(_)))
        .then(|| crate::surface::serve::SurfaceHead::of(head, &conn.buf, conn.request_id));
    // browser-facing checks (Origin allow-list, loopback Host), on the head: byte compares
    let verdict = shard.edge.check_on(head, &conn.buf, conn.stream.is_tls());
    // the caller's virtual key, looked up while the head is in the buffer (acted on below)
    let caller = shard.governance.identify(head, &conn.buf);
    req.trace.key = caller.key();
    // an unknown key: its fingerprint, for the per-address guess count (`peer::slowdown`)
    let guess = match (caller, &shard.key_guesses) {
        (Caller::Unknown, Some(slow)) => Some(crate::governance::credential::with_presented(
            head,
            &conn.buf,
            |p| match p {
                crate::governance::credential::Presented::Key(k) => slow.fingerprint(k),
                _ => 0,
            },
        )),
        _ => None,
    };
    // the response cache's directives and tenant, read off the head (nothing when it is off)
    let cache_ask = match (&shard.cache, &target) {
        (Some(c), Ok(Target::Api(..))) => Some(crate::cache::serve::ask_of(
            c,
            head,
            conn,
            &shard.governance,
            caller,
        )),
        _ => None,
    };
    // a Responses request's state namespace, while its key is in the buffer (store on only)
    let tenant = match target {
        Ok(Target::Api(Dialect::Responses, Op::Generate)) if shard.responses.on() => {
            Some(crate::responses_state::tenant_of(
                &shard.responses,
                &shard.governance,
                caller,
                head,
                &conn.buf,
            ))
        }
        _ => None,
    };
    let mut preflight = None;
    if let Ok(v @ (Verdict::Cors | Verdict::Preflight)) = verdict {
        let origin = head.header(&conn.buf, &head.origin).unwrap_or_default();
        if v == Verdict::Preflight {
            let mut out = std::mem::take(&mut conn.out);
            out.clear();
            let req_headers = head.header(&conn.buf, &head.ac_request_headers);
            edge::preflight_response(&mut out, origin, req_headers, req.keep);
            preflight = Some(out);
        } else {
            edge::cors_headers(&mut conn.resp_headers, origin);
        }
    }
    if !body_pending {
        conn.consume(head.len);
    }
    if let Some(out) = preflight {
        return Ok(match conn.write_raw(out, wt).await {
            Some(back) => {
                conn.out = back;
                Outcome {
                    status: 204,
                    keep_alive: req.keep,
                }
            }
            None => gone(&shard.metrics, 204),
        });
    }
    verdict?;
    let target = target?;
    req.trace.endpoint = endpoint_of(Some(target));
    if target == Target::Metrics && !shard.metrics_here {
        // metrics name keys, models and providers: not for a public listener
        return Err(Error::new(
            Kind::NotFound,
            "no route for /metrics on this listener (it is served on the admin listener, or set [server] metrics_on_main = true)",
        )
        .into());
    }
    // govern: a valid key (401), its in-flight and request-rate shares (429), on the head;
    // an address that keeps sending unknown keys waits first (nothing when keys are off)
    if let (Some(slow), Some(peer)) = (&shard.key_guesses, conn.peer) {
        if caller != Caller::Open && target.gate() != Gate::Open {
            slow.wait(peer, conn.head_at).await.map_err(|d| {
                Error::new(
                    Kind::RateLimited,
                    "too many requests with an unknown API key from this address; retry later",
                )
                .retry_after(d.as_secs().clamp(1, 3600) as u32)
            })?;
        }
    }
    let grant = shard
        .governance
        .admit(caller, target.gate(), &mut conn.resp_headers);
    if let (Err(_), Some(secret), Some(slow), Some(peer)) =
        (&grant, guess, &shard.key_guesses, conn.peer)
    {
        slow.failed(peer, Instant::now(), secret);
    }
    let mut grant = grant?;
    if let Some(g) = grant.as_mut() {
        // with a shared limits store: its verdict (a branch otherwise)
        g.confirm(&mut conn.resp_headers).await?;
    }
    if let Some(mh) = mcp_head {
        let g = grant.as_ref();
        let env = crate::mcp::serve::Env {
            hub: &shard.mcp,
            servers: &routing.mcp,
            limits: &shard.limits,
            admission: &shard.admission,
            upstream: &shard.upstream,
            metrics: &shard.metrics,
            trace: crate::telemetry::tool_call(req.otel.as_deref_mut(), &shard.telemetry),
        };
        let out = crate::mcp::serve::serve(conn, head, &env, g, mh, &mut req.trace, &mut req.keep);
        return Ok(Box::pin(out).await?);
    }
    if let (Target::Surface(call), Some(sh)) = (target, surface_head) {
        let (env, g, t) = (shard.env(None), grant.as_mut(), &mut req.trace);
        let out = crate::surface::serve::serve(
            conn,
            head,
            &env,
            routing,
            g,
            (call, sh),
            t,
            &mut req.keep,
        );
        return Ok(Box::pin(out).await?);
    }
    let Target::Api(dialect, op) = target else {
        return Ok(local(conn, shard, routing, target, ask, req.keep).await?);
    };
    req.shape = crate::answer::outcome::shape(dialect);
    let gemini = gemini.transpose()?;
    let client_headers = client_headers?;

    // admit: decided on the head, before any body byte is read or allocated. The permit
    // holds `declared body + response reserve` of the shard's budget until this request ends.
    let declared = match head.body {
        BodyFraming::Length(n) => n,
        _ => 0,
    };
    if let Some(c) = &shard.cache {
        // entries removed elsewhere give their bytes back; a short budget sheds this shard's
        let need = declared.saturating_add(shard.admission.response_reserve());
        c.settle(shard.id, shard.admission.budget(), need);
    }
    let permit = shard
        .admission
        .admit(declared)
        .await
        .map_err(|r| rejection(r, declared, shard.admission.max_body()))?;
    if head.expect_continue && body_pending {
        let buf = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
        if conn.write_raw(buf, wt).await.is_none() {
            return Ok(gone(&shard.metrics, 499));
        }
    }

    // read body (bounded)
    let body_start = Instant::now();
    let body_deadline = body_start + shard.limits.body_timeout;
    let head_len = if body_pending { head.len } else { 0 };
    let mut body = read_body(
        &mut conn.stream,
        &mut conn.buf,
        head_len,
        head.body,
        shard.admission.max_body(),
        body_deadline,
        Some(&permit),
    )
    .await?;
    req.keep = keep_alive;
    req.trace.client_body = body_start.elapsed();
    req.trace.bytes_in = (head.len + body.len()) as u64;

    // route by model
    let mut fields = match &gemini {
        Some(call) => extract::gemini_fields(&body, call)?,
        None => extract::routing_fields(&body)?,
    };
    let route = routing
        .routes
        .resolve(&fields.model)
        .ok_or_else(|| unknown_model(&fields.model))?;
    req.trace.route = Some(route.index as u32);
    req.trace.stream = fields.stream;
    fields.tenant = tenant;
    if shard.access_log.on() || shard.request_log.on() {
        req.trace.model = Some(fields.model.as_str().into());
    }
    if let (Some(o), Some(tel)) = (req.otel.as_deref_mut(), &shard.telemetry) {
        o.routed(&fields.model, dialect, &body, tel.capture());
    }
    // govern: the key's model allow-list (403) and token rate (429)
    if let Some(g) = grant.as_mut() {
        g.check_model(&fields, route, op, body.len(), &mut conn.resp_headers)?;
        g.confirm(&mut conn.resp_headers).await?;
        fields.metered = true;
    }
    // guardrails of the model and the key: the request's text checked (400) or masked before
    // anything goes upstream; the answer's, in `relay` / `bridge` (none configured: one branch)
    if routing.routes.guards.active() {
        let key = grant.as_ref().and_then(|g| g.key_name());
        req.guard = routing.routes.guards.select(&route.name, key.as_deref());
        if req.guard.is_some() && op == Op::Completions {
            // a text prompt is not a message list the guardrails read: refuse, never pass
            return Err(Error::new(
                Kind::InvalidBody,
                "this model has guardrails, which do not read /v1/completions prompts: use /v1/chat/completions",
            )
            .into());
        }
        if let Some(sess) = req.guard.clone() {
            if let Some(masked) = crate::guardrail::request::guard_request(&sess, dialect, &body)? {
                body = masked;
                let (metered, tenant) = (fields.metered, fields.tenant);
                fields = match &gemini {
                    Some(call) => extract::gemini_fields(&body, call)?,
                    None => extract::routing_fields(&body)?,
                };
                (fields.metered, fields.tenant) = (metered, tenant);
            }
        }
    }

    // a traced request's answer is read for its span (usage, id, finish reasons, content)
    crate::telemetry::read_answer(
        req.otel.as_deref(),
        &shard.telemetry,
        &mut grant,
        &shard.governance,
    );

    // cache: a stored answer replayed here, or a miss whose answer is recorded
    let mut miss = None;
    if let (Some(c), Some(ask)) = (shard.cache.as_deref(), cache_ask.as_ref()) {
        let call = (dialect, op);
        use crate::cache::serve::{lookup, Lookup};
        // Boxed: a replay's state is large, and inline it would make every request's future
        // (moved into its box once per request, byte for byte) that much larger with the
        // cache off too.
        match Box::pin(lookup(
            c,
            conn,
            &shard.cache_env(),
            route,
            call,
            &body,
            &fields,
            ask,
            &permit,
            keep_alive,
        ))
        .await
        {
            Lookup::Hit(o) => {
                if let Some(t) = req.otel.as_deref_mut() {
                    t.cache = Some("hit");
                }
                return Ok(o);
            }
            Lookup::Miss(m) => {
                if let Some(t) = req.otel.as_deref_mut() {
                    t.cache = Some("miss");
                }
                miss = Some(m)
            }
            Lookup::Pass => {}
        }
    }

    // forward: plan each attempt (translate the request if needed), balance, retry, fall
    // back, until an upstream answer's head arrived
    let mut tried = Tried {
        otel: req.otel.take(),
        ..Tried::default()
    };
    let open_start = Instant::now();
    let env = shard.env(req.guard.clone());
    let opened = forward::open::open(
        conn,
        &env,
        routing,
        route,
        op,
        dialect,
        &body,
        &fields,
        &client_headers,
        &mut tried,
        &permit,
        open_start,
    )
    .await;
    let open_end = Instant::now();
    req.trace.upstream = open_end.saturating_duration_since(open_start);
    req.trace.served = tried.served;
    req.trace.attempts = tried.attempts;
    req.otel = tried.otel.take();
    tried.write_headers(&mut conn.resp_headers);
    let mut opened = opened?;

    // respond: relay the answer, or translate it back, in the client's dialect
    let outcome = respond::respond(
        conn,
        &env,
        &mut opened,
        dialect,
        &fields,
        keep_alive,
        &permit,
        grant.as_mut(),
    )
    .await;
    req.trace.upstream += opened.ex.waited;
    req.trace.first_piece = opened.ex.first_piece_at(open_end);
    // the usage a keyed request's answer reported (unkeyed requests are not scanned)
    req.trace.tokens = grant
        .as_mut()
        .filter(|g| g.keyed())
        .and_then(|g| g.usage().io());
    if let (Some(o), Some(g)) = (req.otel.as_deref_mut(), grant.as_mut()) {
        o.answered(g.usage());
    }
    drop(opened);
    if let (Some(c), Some(m)) = (shard.cache.as_deref(), miss) {
        crate::cache::serve::store(c, conn, &shard.cache_env(), m, outcome.status);
    }
    drop(permit);
    Ok(outcome)
}

/// The gateway's own endpoints: health, readiness, the model list and lookups (in the asking
/// SDK's shape, `ask`), metrics.
async fn local(
    conn: &mut ClientConn,
    shard: &Shard,
    routing: &Routing,
    target: Target,
    ask: Option<Ask>,
    keep: bool,
) -> Result<Outcome, Error> {
    let wt = shard.limits.write_timeout;
    let (status, body): (u16, Vec<u8>) = match (target, ask) {
        (Target::Healthz | Target::Readyz, _) => {
            let (status, body) = health(shard, target);
            (status, body.to_vec())
        }
        (Target::Models, Some(a)) => (200, routing.routes.catalog().list(a.shape).to_vec()),
        (
            Target::Model,
            Some(Ask {
                shape,
                id: Some(id),
            }),
        ) => {
            let id = id.as_deref().map_err(|why| *why);
            let route = id.ok().and_then(|m| routing.routes.resolve(m));
            (200, crate::route::models::one(shape, id, route)?)
        }
        _ => (200, crate::pipeline::scrape::render(shard).into_bytes()),
    };
    let ct: &[u8] = if target == Target::Metrics {
        b"text/plain; version=0.0.4"
    } else {
        b"application/json"
    };
    let ok = conn.respond(status, ct, b"", &body, keep, wt).await;
    Ok(Outcome {
        status,
        keep_alive: ok && keep,
    })
}

/// `/healthz` and `/readyz`: readiness turns 503 the moment a drain starts (SIGTERM or
/// `POST /admin/drain`), so balancers stop sending before the listener closes.
fn health(shard: &Shard, target: Target) -> (u16, &'static [u8]) {
    match target {
        Target::Readyz if shard.stopping.is_fired() || shard.draining.is_fired() => {
            (503, b"{\"status\":\"draining\"}")
        }
        Target::Readyz => (200, b"{\"status\":\"ready\"}"),
        _ => (200, b"{\"status\":\"ok\"}"),
    }
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
