//! The response cache's admin endpoints: `GET /admin/cache` (entries, bytes, counters) and
//! `POST /admin/cache/purge` with a JSON body `{"model": "...", "tenant": "..."}` (either, both,
//! or neither = everything; `tenant` is a virtual key's name, `key:<name>`,
//! `client:<hash>` or `shared`).
//!
//! Owns: the JSON shape of these answers. Must not: touch a shard (entries' budget bytes go
//! back to their shards through the cache itself).

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use super::{json, only, Ctx, Reply};
use crate::error::{Error, Kind};
use crate::http::Method;

pub(super) fn route(ctx: &Ctx, method: Method, path: &str, body: &[u8]) -> Result<Reply, Error> {
    let Some(cache) = &ctx.cache else {
        return Err(Error::new(
            Kind::NotFound,
            "the response cache is off ([cache] enabled = true and a model with cache = \"exact\" or \"semantic\")",
        ));
    };
    match path {
        "/admin/cache" => only(method, Method::Get, || {
            let s = &cache.stats;
            let g = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            Reply::json(
                200,
                &json!({
                    "entries": g(&s.entries),
                    "bytes": g(&s.bytes),
                    "max_bytes": cache.settings.max_bytes,
                    "hits": g(&s.hits),
                    "semantic_hits": g(&s.semantic_hits),
                    "misses": g(&s.misses),
                    "evictions": g(&s.evictions),
                }),
            )
        }),
        "/admin/cache/purge" => {
            if method != Method::Post {
                return Err(Error::new(Kind::MethodNotAllowed, "use POST"));
            }
            let v: Value = if body.iter().all(u8::is_ascii_whitespace) {
                json!({})
            } else {
                json::value(body)?
            };
            let field = |k: &str| -> Result<Option<&str>, Error> {
                match v.get(k) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.as_str())),
                    Some(_) => Err(Error::new(
                        Kind::InvalidBody,
                        format!("`{k}` must be a string"),
                    )),
                }
            };
            let (model, tenant) = (field("model")?, field("tenant")?);
            let purged = cache.purge(model, tenant);
            Ok(Reply::json(200, &json!({ "purged": purged })))
        }
        _ => Err(Error::new(Kind::NotFound, format!("no route for {path}"))),
    }
}
