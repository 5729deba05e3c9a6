//! The request path, top to bottom, in one place:
//! accept → parse head → admit → read body → route → translate → upstream → translate back →
//! respond. Each stage calls into its own module; this file only sequences them and turns
//! their errors into responses in the client's dialect.
//!
//! Owns: the per-connection loop and the order of stages. Must not: parse bytes, build
//! upstream requests or relay bodies itself (see `http`, `extract`, `route`, `relay`).

use std::rc::Rc;
use std::time::Instant;

use crate::error::{Error, ErrorShape, Kind};
use crate::gateway::Shard;
use crate::http::body::read_body;
use crate::http::conn::ClientConn;
use crate::http::edge::{self, Verdict};
use crate::http::{BodyFraming, Method, RequestHead};
use crate::metrics::{bump, dec};
use crate::provider::Op;
use crate::provider::ProviderKind;
use crate::translate::{self, Dialect};
use crate::{bridge, extract, mock, relay};

/// What a request head asks for, decided before any body byte is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A provider API call in the client's dialect.
    Api(Dialect, Op),
    Models,
    Healthz,
    Readyz,
    Metrics,
}

/// Metrics endpoint index (see `metrics::ENDPOINTS`).
fn endpoint_index(t: Option<Target>) -> usize {
    match t {
        Some(Target::Api(Dialect::Chat, Op::Generate)) => 0,
        Some(Target::Api(Dialect::Responses, _)) => 1,
        Some(Target::Api(Dialect::Messages, Op::Generate)) => 2,
        Some(Target::Api(_, Op::CountTokens)) => 3,
        Some(Target::Api(_, Op::Embeddings)) => 4,
        Some(Target::Api(Dialect::Gemini, _)) => 0,
        Some(Target::Models) => 5,
        Some(Target::Healthz | Target::Readyz) => 6,
        Some(Target::Metrics) => 7,
        None => 8,
    }
}

pub async fn serve_connection(mut conn: ClientConn, shard: Rc<Shard>) {
    bump(&shard.metrics.connections);
    bump(&shard.metrics.connections_total);
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
                shard.metrics.count(endpoint_index(None), e.status());
                conn.respond_error(&e, ErrorShape::OpenAi, false, shard.limits.write_timeout)
                    .await;
                break;
            }
        };
        bump(&shard.metrics.in_flight);
        // Boxed: the request's state (a few KiB) exists only while a request is in flight, and
        // an idle connection's task stays small.
        let keep = Box::pin(handle(&mut conn, head, &shard)).await;
        conn.cors.clear();
        dec(&shard.metrics.in_flight);
        if !keep {
            break;
        }
    }
    dec(&shard.metrics.connections);
}

/// Over `max_connections`: read one request head (briefly: probes send at once), answer
/// `/healthz` and `/readyz` as usual and anything else with 503 + Retry-After, then close.
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
    match next {
        Ok(Some(head)) => {
            let target = classify(head.method, head.path(&conn.buf));
            let edge = shard.edge.check(&head, &conn.buf);
            match (target, edge) {
                (Ok(t @ (Target::Healthz | Target::Readyz)), Ok(Verdict::Plain)) => {
                    let body: &[u8] = if t == Target::Healthz {
                        b"{\"status\":\"ok\"}"
                    } else {
                        b"{\"status\":\"ready\"}"
                    };
                    shard.metrics.count(endpoint_index(Some(t)), 200);
                    conn.respond(200, b"application/json", b"", body, false, wt)
                        .await;
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
            shard.metrics.count(endpoint_index(None), e.status());
            conn.respond_error(&e, ErrorShape::OpenAi, false, wt).await;
        }
    }
    shard.over_cap.set(shard.over_cap.get().saturating_sub(1));
}

/// Longest an over-the-cap connection is given to send its request head.
const OVER_CAP_WAIT: std::time::Duration = std::time::Duration::from_millis(1000);

/// Over `max_connections`: answer 503 + Retry-After without reading the request, then close.
pub async fn refuse_connection(mut conn: ClientConn, shard: Rc<Shard>) {
    bump(&shard.metrics.connections_refused);
    let e = Error::new(Kind::Overloaded, "too many open connections; retry later");
    conn.respond_error(&e, ErrorShape::OpenAi, false, shard.limits.write_timeout)
        .await;
}

/// One request. Returns whether the connection may carry another one.
async fn handle(conn: &mut ClientConn, head: RequestHead, shard: &Shard) -> bool {
    let wt = shard.limits.write_timeout;
    let keep_alive = head.keep_alive;
    let body_pending = head.body != BodyFraming::None;

    // route by path (head only)
    let path = head.path(&conn.buf);
    let target = classify(head.method, path);
    // Answer unclassified or refused requests in the dialect the path suggests.
    let path_shape = if path.starts_with(b"/v1/messages") {
        ErrorShape::Anthropic
    } else {
        ErrorShape::OpenAi
    };
    // browser-facing checks (Origin allow-list, loopback Host), on the head: byte compares
    let verdict = shard.edge.check(&head, &conn.buf);
    let mut preflight = None;
    if let Ok(v @ (Verdict::Cors | Verdict::Preflight)) = verdict {
        let origin = head.header(&conn.buf, &head.origin).unwrap_or_default();
        if v == Verdict::Preflight {
            let mut out = std::mem::take(&mut conn.out);
            out.clear();
            let req_headers = head.header(&conn.buf, &head.ac_request_headers);
            let keep = keep_alive && !body_pending;
            edge::preflight_response(&mut out, origin, req_headers, keep);
            preflight = Some(out);
        } else {
            edge::cors_headers(&mut conn.cors, origin);
        }
    }
    if !body_pending {
        conn.consume(head.len);
    }
    if let Some(out) = preflight {
        shard.metrics.count(endpoint_index(None), 204);
        return match conn.write_raw(out, wt).await {
            Some(back) => {
                conn.out = back;
                keep_alive && !body_pending
            }
            None => false,
        };
    }
    // The body was not read on the refusals below: close rather than desynchronise.
    if let Err(e) = verdict {
        shard.metrics.count(endpoint_index(None), e.status());
        return conn
            .respond_error(&e, path_shape, keep_alive && !body_pending, wt)
            .await;
    }
    let target = match target {
        Ok(t) => t,
        Err(e) => {
            shard.metrics.count(endpoint_index(None), e.status());
            return conn
                .respond_error(&e, path_shape, keep_alive && !body_pending, wt)
                .await;
        }
    };
    let ep = endpoint_index(Some(target));
    let Target::Api(dialect, op) = target else {
        let keep = keep_alive && !body_pending;
        let (status, body): (u16, Vec<u8>) = match target {
            Target::Healthz => (200, b"{\"status\":\"ok\"}".to_vec()),
            Target::Readyz => (200, b"{\"status\":\"ready\"}".to_vec()),
            Target::Models => (200, shard.routes.models_body().to_vec()),
            _ => (200, render_metrics(shard).into_bytes()),
        };
        let ct: &[u8] = if target == Target::Metrics {
            b"text/plain; version=0.0.4"
        } else {
            b"application/json"
        };
        shard.metrics.count(ep, status);
        return conn.respond(status, ct, b"", &body, keep, wt).await && keep;
    };
    let shape = bridge::shape(dialect);

    // admit: decided on the head, before any body byte is read or allocated. The permit
    // holds `declared body + response reserve` of the shard's budget until this request ends.
    let declared = match head.body {
        BodyFraming::Length(n) => n,
        _ => 0,
    };
    let permit = match shard.admission.admit(declared).await {
        Ok(p) => p,
        Err(r) => {
            let e = rejection(r, declared, shard.admission.max_body());
            shard.metrics.count(ep, e.status());
            // The body was not read: answer, then close (no desync).
            return conn
                .respond_error(&e, shape, keep_alive && !body_pending, wt)
                .await;
        }
    };
    if head.expect_continue && body_pending {
        let buf = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
        if conn.write_raw(buf, wt).await.is_none() {
            return false;
        }
    }

    // read body (bounded)
    let body_deadline = Instant::now() + shard.limits.body_timeout;
    let head_len = if body_pending { head.len } else { 0 };
    let body = match read_body(
        &mut conn.stream,
        &mut conn.buf,
        head_len,
        head.body,
        shard.admission.max_body(),
        body_deadline,
        Some(&permit),
    )
    .await
    {
        Ok(b) => b,
        Err(e) => {
            shard.metrics.count(ep, e.status());
            return conn.respond_error(&e, shape, false, wt).await;
        }
    };

    // route by model
    let fields = match extract::routing_fields(&body) {
        Ok(f) => f,
        Err(e) => {
            shard.metrics.count(ep, e.status());
            return conn.respond_error(&e, shape, keep_alive, wt).await;
        }
    };
    let Some(route) = shard.routes.resolve(&fields.model) else {
        let e = Error::new(
            Kind::UnknownModel,
            format!(
                "The model `{}` does not exist or is not routed by this gateway",
                fields.model
            ),
        );
        shard.metrics.count(ep, e.status());
        return conn.respond_error(&e, shape, keep_alive, wt).await;
    };

    // translate → upstream → translate back → respond (one dispatch point per provider kind)
    let provider = &route.provider;
    let outcome = match (provider.kind, op) {
        (ProviderKind::Mock, _) => {
            let model = route.upstream_model.as_deref().unwrap_or(&fields.model);
            mock_provider(
                conn,
                dialect,
                op,
                model,
                &body,
                provider.mock_profile,
                keep_alive,
            )
            .await
        }
        (kind, Op::CountTokens) if kind != ProviderKind::Anthropic => {
            // Only Anthropic counts exactly; elsewhere answer with the documented estimate.
            let out = format!("{{\"input_tokens\":{}}}", translate::estimate_tokens(&body));
            let ok = conn
                .respond(
                    200,
                    b"application/json",
                    b"",
                    out.as_bytes(),
                    keep_alive,
                    wt,
                )
                .await;
            relay::Outcome {
                status: 200,
                keep_alive: ok && keep_alive,
            }
        }
        (kind, Op::Embeddings) if !kind.speaks(Dialect::Chat) => {
            let e = Error::new(
                Kind::InvalidBody,
                format!("provider kind {} does not offer embeddings", kind.as_str()),
            );
            relay::Outcome::error(conn, &e, shape, keep_alive, wt).await
        }
        (kind, _) if kind.speaks(dialect) => {
            relay::passthrough(
                conn, shard, route, &body, &fields, op, dialect, keep_alive, &permit,
            )
            .await
        }
        _ => {
            bridge::translated(
                conn, shard, route, &body, &fields, dialect, keep_alive, &permit,
            )
            .await
        }
    };
    shard.metrics.count(ep, outcome.status);
    drop(permit);
    outcome.keep_alive
}

/// The in-process mock provider (embedded default config): every dialect, as `ringgate mock`.
async fn mock_provider(
    conn: &mut ClientConn,
    dialect: Dialect,
    op: Op,
    model: &str,
    body: &[u8],
    profile: mock::Profile,
    keep_alive: bool,
) -> relay::Outcome {
    let s = &mut conn.stream;
    let r = match op {
        Op::Generate => mock::respond(s, dialect, model, body, profile, keep_alive).await,
        Op::Embeddings => mock::embeddings::respond(s, body, profile, keep_alive).await,
        Op::CountTokens => {
            let out = mock::anthropic::count_tokens_body(body);
            mock::pace::json(s, 200, &out, mock::Profile::Instant, keep_alive).await
        }
    };
    relay::Outcome {
        status: 200,
        keep_alive: r.is_ok() && keep_alive,
    }
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

fn classify(method: Method, path: &[u8]) -> Result<Target, Error> {
    let target = match path {
        b"/v1/chat/completions" | b"/chat/completions" => Target::Api(Dialect::Chat, Op::Generate),
        b"/v1/responses" | b"/responses" => Target::Api(Dialect::Responses, Op::Generate),
        b"/v1/messages" => Target::Api(Dialect::Messages, Op::Generate),
        b"/v1/messages/count_tokens" => Target::Api(Dialect::Messages, Op::CountTokens),
        b"/v1/embeddings" | b"/embeddings" => Target::Api(Dialect::Chat, Op::Embeddings),
        b"/v1/models" | b"/models" => Target::Models,
        b"/healthz" => Target::Healthz,
        b"/readyz" => Target::Readyz,
        b"/metrics" => Target::Metrics,
        _ => {
            return Err(Error::new(
                Kind::NotFound,
                format!("no route for {}", String::from_utf8_lossy(path)),
            ))
        }
    };
    let want = if matches!(target, Target::Api(..)) {
        Method::Post
    } else {
        Method::Get
    };
    if method != want {
        return Err(Error::new(
            Kind::MethodNotAllowed,
            "method not allowed on this path",
        ));
    }
    Ok(target)
}

fn render_metrics(shard: &Shard) -> String {
    let mut out = String::with_capacity(4096);
    render_shard_metrics(shard, &mut out);
    let mut admission = vec![(shard.id, shard.admission.stats())];
    shard.hub.others(shard.id, &mut out, &mut admission);
    admission.sort_by_key(|(id, _)| *id);
    crate::admit::stats::render_prometheus(&admission, &mut out);
    out
}

pub fn render_shard_metrics(shard: &Shard, out: &mut String) {
    shard.metrics.render(shard.id, out);
    out.push_str(&format!(
        "ringgate_upstream_idle_connections{{shard=\"{}\"}} {}\nringgate_upstream_retries_total{{shard=\"{}\"}} {}\n",
        shard.id,
        shard.upstream.pool.idle_count(),
        shard.id,
        shard.upstream.retries.get()
    ));
}
