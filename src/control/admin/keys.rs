//! The key endpoints of the admin API: `POST /admin/keys` (create; the secret is in this answer
//! only), `GET /admin/keys` (list, no secrets or digests; paginated), `GET|PATCH|DELETE
//! /admin/keys/{name}` (read, update, revoke), `GET /admin/keys/{name}/usage` (see `usage`).
//! Names with `/` are sent percent-encoded (`%2F`).
//! A create or update answer carries `warnings` when the key has a budget but no
//! `max_in_flight` (the budget can then be overshot by many uncapped requests at once).
//!
//! Listing pages: `GET /admin/keys?limit=N&after=NAME` answers at most `limit` live keys
//! (default `DEFAULT_LIMIT`, 1 to `MAX_LIMIT`) in creation (slot) order, starting after the key
//! named `after`, with `has_more` and `next_after` (the name to pass as `after` for the next
//! page; `null` on the last). A walk sees every key that stays live through it exactly once,
//! keys made during the walk included (they come last). A bad `limit`, an unknown `after`, an
//! unknown or repeated parameter: 400.
//!
//! Owns: parsing bodies, paths and queries into registry calls and their JSON answers. Must
//! not: decide key rules (that is `governance::registry`).

use serde_json::{json, Map, Value};

use super::{now, Ctx, Reply};
use crate::error::{Error, Kind};
use crate::http::Method;

/// Keys per listing page unless `limit` says otherwise.
pub const DEFAULT_LIMIT: usize = 100;
/// The largest `limit` (a page of this many keys is about 250 KB of JSON).
pub const MAX_LIMIT: usize = 1000;

pub(super) fn route(
    ctx: &Ctx,
    method: Method,
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> Result<Reply, Error> {
    let rest = match path.strip_prefix("/admin/keys") {
        Some(r) => r,
        None => return Err(not_found(path)),
    };
    let mut reg = ctx
        .registry
        .lock()
        .map_err(|_| Error::new(Kind::Internal, "key registry unavailable"))?;
    match rest {
        "" | "/" => match method {
            Method::Get => {
                let (limit, after) = page_query(query)?;
                let (keys, more) = reg.page(after.as_deref(), limit)?;
                let next = match more {
                    true => keys.last().and_then(|k| k.get("name")).cloned(),
                    false => None,
                };
                Ok(Reply::json(
                    200,
                    &json!({ "keys": keys, "has_more": more, "next_after": next }),
                ))
            }
            Method::Post => {
                let (mut view, secret) = reg.create(&object(body)?, now())?;
                if let Value::Object(m) = &mut view {
                    m.insert("key".into(), Value::from(secret));
                }
                warn(&mut view);
                Ok(Reply::json(201, &view))
            }
            _ => Err(method_not_allowed()),
        },
        _ => {
            let mut parts = rest[1..].split('/');
            let name = decode(parts.next().unwrap_or_default())
                .map_err(|e| Error::new(Kind::NotFound, format!("{e} in the path")))?;
            match (parts.next(), parts.next(), method) {
                (None, _, Method::Get) => Ok(Reply::json(200, &reg.get(&name)?)),
                (None, _, Method::Patch) => {
                    let mut view = reg.patch(&name, &object(body)?, now())?;
                    warn(&mut view);
                    Ok(Reply::json(200, &view))
                }
                (None, _, Method::Delete) => Ok(Reply::json(200, &reg.revoke(&name, now())?)),
                (None, _, _) => Err(method_not_allowed()),
                (Some("usage"), None, Method::Get) => {
                    let live = reg.get(&name).is_ok();
                    drop(reg);
                    super::usage::of_key(ctx, &name, live, query)
                }
                (Some("usage"), None, _) => Err(method_not_allowed()),
                _ => Err(not_found(path)),
            }
        }
    }
}

/// A created or changed key's `warnings` (as `ringgate check` gives them for `[[key]]`): a
/// budget without `max_in_flight`.
fn warn(view: &mut Value) {
    let Value::Object(m) = view else {
        return;
    };
    let set = |f: &str| m.get(f).is_some_and(|v| !v.is_null());
    if set("budget_usd") && !set("max_in_flight") {
        let w = crate::config::keys::UNCAPPED_BUDGET;
        m.insert("warnings".into(), Value::from(vec![w]));
    }
}

/// The request body as a JSON object.
fn object(body: &[u8]) -> Result<Map<String, Value>, Error> {
    super::json_object(body)
}

/// `limit` and `after` of a listing query (defaults: `DEFAULT_LIMIT`, from the start).
fn page_query(query: Option<&str>) -> Result<(usize, Option<String>), Error> {
    let bad = |m: String| Error::new(Kind::BadRequest, m);
    let (mut limit, mut after) = (None, None);
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v).map_err(|e| bad(format!("{k}: {e}")))?;
        match k {
            "limit" if limit.is_none() => {
                let n = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "limit must be a whole number from 1 to {MAX_LIMIT}"
                        ))
                    })?;
                limit = Some(n);
            }
            "after" if after.is_none() => after = Some(v),
            "limit" | "after" => return Err(bad(format!("{k} is given twice"))),
            _ => {
                return Err(bad(
                    "unknown query parameter (a key listing takes limit and after)".into(),
                ))
            }
        }
    }
    Ok((limit.unwrap_or(DEFAULT_LIMIT), after))
}

/// A percent-decoded path segment or query value.
fn decode(seg: &str) -> Result<String, &'static str> {
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("bad percent-encoding")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8")
}

fn not_found(path: &str) -> Error {
    Error::new(Kind::NotFound, format!("no route for {path}"))
}

fn method_not_allowed() -> Error {
    Error::new(Kind::MethodNotAllowed, "method not allowed on this path")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_percent_decoded() {
        assert_eq!(decode("team%2Fa").unwrap(), "team/a");
        assert_eq!(decode("a").unwrap(), "a");
        assert!(decode("a%2").is_err() && decode("%zz").is_err());
    }

    #[test]
    fn page_queries() {
        assert_eq!(page_query(None).unwrap(), (DEFAULT_LIMIT, None));
        assert_eq!(page_query(Some("")).unwrap(), (DEFAULT_LIMIT, None));
        assert_eq!(
            page_query(Some("limit=7&after=team%2Fa")).unwrap(),
            (7, Some("team/a".into()))
        );
        assert_eq!(page_query(Some("limit=1000")).unwrap().0, 1000);
        for bad in [
            "limit=0",
            "limit=1001",
            "limit=-1",
            "limit=",
            "limit=1e3",
            "limit=99999999999999999999999",
            "limit=5&limit=6",
            "after=a&after=b",
            "after=%zz",
            "cursor=a",
            "limit",
        ] {
            let e = page_query(Some(bad)).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
        }
    }
}
