//! Cache keys: the canonical form of a request body (object keys in a stable order, the
//! fields that do not change the answer removed) and the key over (tenant, model, dialect,
//! canonical body); the tenant a request belongs to; the request's cache directives.
//!
//! Owns: what makes two requests "the same" for the exact layer. Must not: look anything up
//! or allocate beyond the canonical bytes it returns. Pure: unit-tested without sockets.

use serde_json::Value;

use crate::dialect::Dialect;
use crate::error::push_json_str;

/// Top-level fields that do not change the answer (who asks, how it is delivered).
pub const VOLATILE: [&str; 4] = ["user", "metadata", "stream", "stream_options"];

/// A 128-bit cache key.
pub type Key = [u8; 16];

/// The canonical bytes of a request body: volatile top-level fields removed, object keys
/// sorted at every depth, no insignificant whitespace. `None` when the body is not a JSON
/// object.
pub fn canonical(body: &[u8]) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object_mut()?;
    for f in VOLATILE {
        o.remove(f);
    }
    let mut out = Vec::with_capacity(body.len());
    write_sorted(&v, &mut out);
    Some(out)
}

/// `v` as compact JSON with object keys in byte order.
pub fn write_sorted(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(m) => {
            let mut fields: Vec<(&String, &Value)> = m.iter().collect();
            fields.sort_unstable_by_key(|(k, _)| *k);
            write_seq(out, b'{', b'}', fields, |out, (k, x)| {
                push_json_str(out, k);
                out.push(b':');
                write_sorted(x, out);
            });
        }
        Value::Array(a) => write_seq(out, b'[', b']', a, |out, x| write_sorted(x, out)),
        Value::String(s) => push_json_str(out, s),
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

/// `open`, the items written by `each` with commas between, `close`.
fn write_seq<T>(
    out: &mut Vec<u8>,
    open: u8,
    close: u8,
    items: impl IntoIterator<Item = T>,
    mut each: impl FnMut(&mut Vec<u8>, T),
) {
    out.push(open);
    for (i, x) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        each(out, x);
    }
    out.push(close);
}

/// SHA-256 over the parts, each length-prefixed, cut to 128 bits.
pub fn digest(parts: &[&[u8]]) -> Key {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"ringgate-cache-v1");
    for p in parts {
        ctx.update(&(p.len() as u64).to_le_bytes());
        ctx.update(p);
    }
    let d = ctx.finish();
    let mut k = [0u8; 16];
    k.copy_from_slice(&d.as_ref()[..16]);
    k
}

/// The exact layer's key.
pub fn exact_key(tenant: &str, model: &str, dialect: Dialect, canonical: &[u8]) -> Key {
    digest(&[
        tenant.as_bytes(),
        model.as_bytes(),
        dialect.name().as_bytes(),
        canonical,
    ])
}

/// Lowercase hex of a key (Redis keys, logs).
pub fn hex(k: &Key) -> String {
    let mut s = String::with_capacity(32);
    for b in k {
        s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    s
}

/// The tenant of a request presenting `credential` (the presented secret) when no virtual
/// key names it: `client:` and 16 hex digits of the credential's SHA-256.
pub fn client_tenant(credential: &[u8]) -> String {
    let k = digest(&[b"client", credential]);
    let mut s = String::from("client:");
    s.push_str(&hex(&k)[..16]);
    s
}

/// What the request's headers ask of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Directives {
    /// `cache-control: no-cache` or `x-ringgate-cache: refresh`: do not answer from the cache
    /// (the fresh answer is stored).
    pub no_lookup: bool,
    /// `cache-control: no-store`: neither answer from nor store into the cache.
    pub no_store: bool,
}

impl Directives {
    /// From the `cache-control` and `x-ringgate-cache` header values.
    pub fn of(cache_control: Option<&[u8]>, ringgate: Option<&[u8]>) -> Directives {
        let mut d = Directives::default();
        if let Some(v) = cache_control {
            for tok in v.split(|&b| b == b',') {
                let t = tok.trim_ascii();
                if t.eq_ignore_ascii_case(b"no-cache") {
                    d.no_lookup = true;
                } else if t.eq_ignore_ascii_case(b"no-store") {
                    d.no_store = true;
                    d.no_lookup = true;
                }
            }
        }
        if let Some(v) = ringgate {
            let t = v.trim_ascii();
            if t.eq_ignore_ascii_case(b"refresh") {
                d.no_lookup = true;
            } else if t.eq_ignore_ascii_case(b"bypass") || t.eq_ignore_ascii_case(b"no-store") {
                d.no_lookup = true;
                d.no_store = true;
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_sorts_keys_and_drops_volatile_fields() {
        let a = br#"{"model":"m","stream":true,"user":"u1","messages":[{"role":"user","content":"hi"}],"temperature":0,"stream_options":{"include_usage":true},"metadata":{"a":1}}"#;
        let b = br#"{ "messages" : [ {"content":"hi","role":"user"} ], "temperature":0, "model":"m", "user":"u2" }"#;
        let ca = canonical(a).unwrap();
        assert_eq!(ca, canonical(b).unwrap());
        assert_eq!(
            std::str::from_utf8(&ca).unwrap(),
            r#"{"messages":[{"content":"hi","role":"user"}],"model":"m","temperature":0}"#
        );
        // a nested "user" is content, not a volatile field
        let c = br#"{"model":"m","messages":[{"role":"user","content":"hi","user":"x"}]}"#;
        assert_ne!(canonical(c).unwrap(), ca);
        // order inside arrays matters
        let d = br#"{"model":"m","messages":[{"role":"user","content":"b"},{"role":"user","content":"a"}]}"#;
        let e = br#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}"#;
        assert_ne!(canonical(d), canonical(e));
        assert!(canonical(b"[1]").is_none());
        assert!(canonical(b"{").is_none());
        // escapes are canonical too
        assert_eq!(
            canonical(br#"{"a":"\u0041\n"}"#).unwrap(),
            canonical(br#"{"a":"A\n"}"#).unwrap()
        );
    }

    #[test]
    fn write_sorted_nests_and_empties() {
        let v: Value = serde_json::from_str(
            r#"{"b":[1,{"d":null,"c":[]},"x"],"a":{},"e":[[],{"z":1.5,"y":true}]}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        write_sorted(&v, &mut out);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"a":{},"b":[1,{"c":[],"d":null},"x"],"e":[[],{"y":true,"z":1.5}]}"#
        );
    }

    #[test]
    fn keys_separate_tenants_models_and_dialects() {
        let c = canonical(br#"{"model":"m","messages":[]}"#).unwrap();
        let k = exact_key("t1", "m", Dialect::Chat, &c);
        assert_eq!(k, exact_key("t1", "m", Dialect::Chat, &c));
        assert_ne!(k, exact_key("t2", "m", Dialect::Chat, &c));
        assert_ne!(k, exact_key("t1", "n", Dialect::Chat, &c));
        assert_ne!(k, exact_key("t1", "m", Dialect::Messages, &c));
        // length prefixes: moving a byte between parts changes the key
        assert_ne!(digest(&[b"ab", b"c"]), digest(&[b"a", b"bc"]));
        assert_eq!(hex(&k).len(), 32);
        assert!(client_tenant(b"Bearer x").starts_with("client:"));
        assert_ne!(client_tenant(b"Bearer x"), client_tenant(b"Bearer y"));
    }

    #[test]
    fn directives() {
        let d = Directives::of(Some(b"max-age=0, No-Store"), None);
        assert!(d.no_store && d.no_lookup);
        let d = Directives::of(Some(b"no-cache"), None);
        assert!(d.no_lookup && !d.no_store);
        let d = Directives::of(None, Some(b"refresh"));
        assert!(d.no_lookup && !d.no_store);
        assert_eq!(Directives::of(None, None), Directives::default());
    }
}
