//! The semantic layer: which requests take part (no tools, at most `max_turns` messages, no
//! explicit `temperature > 0` unless allowed), what must match exactly (the group: tenant,
//! model, dialect, every message but the last user one, the system prompt, tools and the other
//! parameters) and what is compared by meaning (the last user message's text, embedded by the
//! configured `embedding_model` through this gateway's own routing — any provider that serves
//! embeddings, the mock included). An embedding that fails or times out is a miss, never an
//! error.
//!
//! Search: brute force over the group's entries (one dot product per entry; a group is one
//! tenant's entries for one model and context, see bench-results/cache.md for the cost).
//!
//! Owns: `Query` and `embed`. Must not: write to the client.

use serde_json::Value;

use super::key::{self, Key};
use super::{Cache, Policy};
use crate::admit::Permit;
use crate::config::provider::Op;
use crate::dialect::extract::routing_fields;
use crate::dialect::{self, Dialect};
use crate::forward::open::{open, Call, Tried};
use crate::http::conn::ClientConn;
use crate::upstream::headers::ClientHeaders;

/// A request's semantic lookup: the text to embed and the group its entries live in.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub text: String,
    pub group: Key,
}

impl Query {
    /// The query of a request body in `dialect`, or `None` when it does not take part.
    pub fn of(
        cache: &Cache,
        dialect: Dialect,
        body: &[u8],
        tenant: &str,
        model: &str,
    ) -> Option<Query> {
        query(
            dialect,
            body,
            tenant,
            model,
            cache.settings.max_turns,
            cache.settings.allow_temperature,
        )
    }
}

/// See [`Query::of`].
pub fn query(
    dialect: Dialect,
    body: &[u8],
    tenant: &str,
    model: &str,
    max_turns: usize,
    allow_temperature: bool,
) -> Option<Query> {
    let mut hub = dialect::request_to_chat(dialect, body).ok()?;
    let o = hub.as_object_mut()?;
    if o.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
    {
        return None;
    }
    if !allow_temperature
        && o.get("temperature")
            .and_then(Value::as_f64)
            .is_some_and(|t| t > 0.0)
    {
        return None;
    }
    let mut messages = match o.remove("messages") {
        Some(Value::Array(m)) => m,
        _ => return None,
    };
    let turns = messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) != Some("system"))
        .count();
    if turns == 0 || turns > max_turns {
        return None;
    }
    let last = messages.pop()?;
    if last.get("role").and_then(Value::as_str) != Some("user") {
        return None;
    }
    let text = content_text(last.get("content")?)?;
    for f in key::VOLATILE {
        o.remove(f);
    }
    o.remove("model");
    // everything but the last user message must match exactly
    let mut ctx = Vec::new();
    key::write_sorted(&hub, &mut ctx);
    ctx.push(0);
    key::write_sorted(&Value::Array(messages), &mut ctx);
    let group = key::digest(&[
        b"semantic",
        tenant.as_bytes(),
        model.as_bytes(),
        dialect.name().as_bytes(),
        &ctx,
    ]);
    Some(Query { text, group })
}

/// The text of a message's content (a string, or the text parts of an array); `None` when it
/// has other parts (images, files: not compared by meaning).
fn content_text(c: &Value) -> Option<String> {
    match c {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text" | "input_text"), Some(Value::String(t))) => {
                        if !out.is_empty() {
                            out.push('\n');
                        }
                        out.push_str(t);
                    }
                    _ => return None,
                }
            }
            Some(out)
        }
        _ => None,
    }
}

/// Embed `text` with the policy's embedding model, routed by this gateway; the normalised
/// vector, or `None` (unrouted model, upstream failure, timeout, bad answer).
pub async fn embed(
    cache: &Cache,
    fwd: &crate::forward::Env<'_>,
    live: &crate::forward::live::LiveRouting,
    conn: &ClientConn,
    permit: &Permit,
    policy: &Policy,
    text: &str,
) -> Option<Box<[f32]>> {
    let model = policy.embedding_model.as_deref()?;
    let routing = live.peek();
    let route = routing.routes.resolve(model)?;
    let mut body = Vec::with_capacity(text.len() + model.len() + 32);
    body.extend_from_slice(b"{\"model\":");
    crate::error::push_json_str(&mut body, model);
    body.extend_from_slice(b",\"input\":");
    crate::error::push_json_str(&mut body, text);
    body.push(b'}');
    let fields = routing_fields(&body).ok()?;
    let headers = ClientHeaders::default();
    let call = async {
        let mut call = Call {
            dialect: Dialect::Chat,
            op: Op::Embeddings,
            fields: &fields,
            routing: &routing,
            route,
            headers: &headers,
            permit,
            grant: None,
            tried: Tried::default(),
            keep_alive: true,
            start: std::time::Instant::now(),
        };
        let mut opened = open(conn, fwd, &mut call, &body).await.ok()?;
        if opened.ex.head.status != 200 {
            return None;
        }
        let mut out = Vec::new();
        opened.ex.read_to_end(&mut out, 1 << 20).await.ok()?;
        vector_of(&out)
    };
    monoio::time::timeout(cache.settings.embedding_timeout, call)
        .await
        .ok()
        .flatten()
}

/// The first embedding of an OpenAI embeddings answer (float array or base64 of LE f32s),
/// normalised to unit length.
pub fn vector_of(answer: &[u8]) -> Option<Box<[f32]>> {
    let v: Value = serde_json::from_slice(answer).ok()?;
    let e = v.get("data")?.get(0)?.get("embedding")?;
    let mut x: Vec<f32> = match e {
        Value::Array(a) => a
            .iter()
            .map(|n| n.as_f64().map(|f| f as f32))
            .collect::<Option<_>>()?,
        Value::String(b64) => base64_f32(b64)?,
        _ => return None,
    };
    let norm = x.iter().map(|a| a * a).sum::<f32>().sqrt();
    if x.is_empty() || norm == 0.0 || !norm.is_finite() {
        return None;
    }
    for a in &mut x {
        *a /= norm;
    }
    Some(x.into())
}

fn base64_f32(s: &str) -> Option<Vec<f32>> {
    let mut bytes = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            bytes.push((acc >> bits) as u8);
        }
    }
    if bytes.len() % 4 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_takes_part_and_what_must_match() {
        let q = |b: &str| query(Dialect::Chat, b.as_bytes(), "t", "m", 4, false);
        let a = q(r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"What is the capital of France?"}]}"#).unwrap();
        assert_eq!(a.text, "What is the capital of France?");
        let b = q(r#"{"model":"m","user":"x","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"capital of france please"}]}"#).unwrap();
        assert_eq!(a.group, b.group, "only the last user message may differ");
        let c = q(r#"{"model":"m","messages":[{"role":"system","content":"be long"},{"role":"user","content":"What is the capital of France?"}]}"#).unwrap();
        assert_ne!(a.group, c.group, "the system prompt must match");
        assert!(q(r#"{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"x"}]}"#).is_none());
        assert!(
            q(r#"{"model":"m","temperature":0.7,"messages":[{"role":"user","content":"x"}]}"#)
                .is_none()
        );
        assert!(
            q(r#"{"model":"m","temperature":0,"messages":[{"role":"user","content":"x"}]}"#)
                .is_some()
        );
        let long = format!(
            r#"{{"model":"m","messages":[{}]}}"#,
            [r#"{"role":"user","content":"x"}"#; 5].join(",")
        );
        assert!(q(&long).is_none());
    }

    #[test]
    fn vectors_from_floats_and_base64() {
        let v = vector_of(br#"{"data":[{"embedding":[3,4]}]}"#).unwrap();
        assert_eq!(&*v, &[0.6, 0.8]);
        // [1.0f32, 0.0f32] little-endian, base64
        let v = vector_of(br#"{"data":[{"embedding":"AACAPwAAAAA="}]}"#).unwrap();
        assert_eq!(&*v, &[1.0, 0.0]);
        assert!(vector_of(br#"{"data":[{"embedding":[0,0]}]}"#).is_none());
        assert!(vector_of(br#"{"error":{}}"#).is_none());
    }
}
