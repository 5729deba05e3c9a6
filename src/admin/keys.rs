//! The key endpoints of the admin API: `POST /admin/keys` (create; the secret is in this answer
//! only), `GET /admin/keys` (list, no secrets or digests), `GET|PATCH|DELETE
//! /admin/keys/{name}` (read, update, revoke), `GET /admin/keys/{name}/usage` (see `usage`). Names with `/` are sent percent-encoded (`%2F`).
//!
//! Owns: parsing bodies and paths into registry calls and their JSON answers. Must not: decide
//! key rules (that is `governance::registry`).

use serde_json::{json, Map, Value};

use super::{now, Ctx, Reply};
use crate::error::{Error, Kind};
use crate::http::Method;

pub(super) fn route(ctx: &Ctx, method: Method, path: &str, body: &[u8]) -> Result<Reply, Error> {
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
            Method::Get => Ok(Reply::json(200, &json!({ "keys": reg.list() }))),
            Method::Post => {
                let (mut view, secret) = reg.create(&object(body)?, now())?;
                if let Value::Object(m) = &mut view {
                    m.insert("key".into(), Value::from(secret));
                }
                Ok(Reply::json(201, &view))
            }
            _ => Err(method_not_allowed()),
        },
        _ => {
            let mut parts = rest[1..].split('/');
            let name = decode(parts.next().unwrap_or_default())?;
            match (parts.next(), parts.next(), method) {
                (None, _, Method::Get) => Ok(Reply::json(200, &reg.get(&name)?)),
                (None, _, Method::Patch) => {
                    Ok(Reply::json(200, &reg.patch(&name, &object(body)?, now())?))
                }
                (None, _, Method::Delete) => Ok(Reply::json(200, &reg.revoke(&name, now())?)),
                (None, _, _) => Err(method_not_allowed()),
                (Some("usage"), None, Method::Get) => {
                    let live = reg.get(&name).is_ok();
                    drop(reg);
                    super::usage::of_key(ctx, &name, live)
                }
                (Some("usage"), None, _) => Err(method_not_allowed()),
                _ => Err(not_found(path)),
            }
        }
    }
}

/// The request body as a JSON object.
fn object(body: &[u8]) -> Result<Map<String, Value>, Error> {
    super::json_object(body)
}

/// A percent-decoded path segment.
fn decode(seg: &str) -> Result<String, Error> {
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::new(Kind::NotFound, "bad percent-encoding in the path"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::new(Kind::NotFound, "the key name is not UTF-8"))
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
}
