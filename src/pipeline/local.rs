//! The gateway's own endpoints, answered without an upstream: `/healthz`, `/readyz`, the model
//! list and lookups (in the asking SDK's shape), `/metrics`.
//!
//! Owns: those answers. Must not: route, govern or forward (the caller has done what applies).

use super::classify::{model_id_in, Target};
use super::shard::Shard;
use crate::answer::outcome::Outcome;
use crate::answer::Whole;
use crate::error::Error;
use crate::forward::live::Routing;
use crate::http::conn::ClientConn;
use crate::http::{BodyFraming, RequestHead};
use crate::route::models::Ask;

/// The gateway's own endpoints: health, readiness, the model list and lookups (in the asking
/// SDK's shape, `ask`), metrics.
pub(super) async fn local(
    conn: &mut ClientConn,
    shard: &Shard,
    routing: &Routing,
    target: Target,
    head: &RequestHead,
) -> Result<Outcome, Error> {
    let keep = head.keep_alive && head.body == BodyFraming::None;
    let path = head.path(&conn.buf);
    let ask = match target {
        Target::Models => Some(Ask::of(head, &conn.buf, None)),
        Target::Model => Some(Ask::of(head, &conn.buf, model_id_in(path))),
        _ => None,
    };
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
    let w = Whole {
        status,
        content_type: ct,
        extra: b"",
        body: &body,
    };
    Ok(shard.sink(keep).whole(conn, w).await)
}

/// `/healthz` and `/readyz`: readiness turns 503 the moment a drain starts (SIGTERM or
/// `POST /admin/drain`), so balancers stop sending before the listener closes.
pub(super) fn health(shard: &Shard, target: Target) -> (u16, &'static [u8]) {
    match target {
        Target::Readyz if shard.stopping.is_fired() || shard.draining.is_fired() => {
            (503, b"{\"status\":\"draining\"}")
        }
        Target::Readyz => (200, b"{\"status\":\"ready\"}"),
        _ => (200, b"{\"status\":\"ok\"}"),
    }
}
