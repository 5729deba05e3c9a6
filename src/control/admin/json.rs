//! Admin request bodies as JSON, strictly: a field named twice in one object (`{"rpm":1,
//! "rpm":1000}`) is refused (400) instead of the last one silently winning — a proxy, a log
//! or a reviewer reading the first would see another request than the one applied.
//!
//! Owns: `value` and `object` (parse with the duplicate check). Must not: interpret fields
//! (that is each endpoint's).

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::{Error, Kind};

/// `body` as one JSON value, refusing duplicate fields in any object (400 `invalid_body`).
pub fn value(body: &[u8]) -> Result<Value, Error> {
    let mut d = serde_json::Deserializer::from_slice(body);
    let v = Strict
        .deserialize(&mut d)
        .and_then(|v| d.end().map(|()| v))
        .map_err(|e| Error::new(Kind::InvalidBody, format!("the body is not JSON: {e}")))?;
    Ok(v)
}

/// `body` as a JSON object (see [`value`]).
pub fn object(body: &[u8]) -> Result<Map<String, Value>, Error> {
    match value(body)? {
        Value::Object(m) => Ok(m),
        _ => Err(Error::new(
            Kind::InvalidBody,
            "the body must be a JSON object",
        )),
    }
}

/// A `Value`, built with a duplicate-field check.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(de::Error::custom(format!("duplicate field `{k}`")));
            }
            let v = map.next_value_seed(Strict)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_refused_at_any_depth() {
        let ok = value(br#"{"a":1,"b":[1,2.5,"x",null,true],"c":{"a":{"d":-3}}}"#).unwrap();
        let want: Value =
            serde_json::from_str(r#"{"a":1,"b":[1,2.5,"x",null,true],"c":{"a":{"d":-3}}}"#)
                .unwrap();
        assert_eq!(ok, want);
        for bad in [
            r#"{"rpm":1,"rpm":1000}"#,
            r#"{"x":{"a":1,"a":2}}"#,
            r#"[{"k":1,"k":1}]"#,
            r#"{"a":1} {"b":2}"#,
            r#"{"a":1"#,
        ] {
            let e = value(bad.as_bytes()).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
        }
        assert!(value(br#"{"rpm":1,"rpm":1}"#)
            .unwrap_err()
            .message
            .contains("duplicate field `rpm`"));
        assert_eq!(object(b"[1]").unwrap_err().status(), 400);
    }
}
