//! Same-dialect passthrough support: find `model` and `stream` in a JSON body without parsing
//! the whole document (sonic-rs lazy lookup), and splice a different model name in.
//!
//! Owns: the routing fields of a request body. Must not: validate or rewrite anything else —
//! the rest of the body is forwarded byte for byte.

use std::ops::Range;

use sonic_rs::JsonValueTrait;

use crate::error::{push_json_str, Error, Kind};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingFields {
    pub model: String,
    /// Byte range of the `model` value (including its quotes) in the body.
    pub model_span: Range<usize>,
    pub stream: bool,
}

/// Read `model` (required string) and `stream` (optional bool) from a JSON object body.
pub fn routing_fields(body: &[u8]) -> Result<RoutingFields, Error> {
    if body.is_empty() {
        return Err(Error::new(
            Kind::InvalidBody,
            "request body is empty; expected a JSON object",
        ));
    }
    // One lazy pass over the top-level object: values are skipped (SIMD), not built, and the
    // scan stops as soon as both fields were seen.
    let mut model = None;
    let mut stream = None;
    for entry in sonic_rs::to_object_iter(body) {
        let (key, value) = entry.map_err(|e| {
            Error::new(
                Kind::InvalidBody,
                format!("request body is not a valid JSON object: {e}"),
            )
        })?;
        match key.as_ref() {
            "model" => model = Some(value),
            "stream" => stream = Some(value),
            _ => continue,
        }
        if model.is_some() && stream.is_some() {
            break;
        }
    }
    let model_node =
        model.ok_or_else(|| Error::new(Kind::InvalidBody, "missing required field \"model\""))?;
    let model_str = model_node
        .as_str()
        .ok_or_else(|| Error::new(Kind::InvalidBody, "\"model\" must be a string"))?
        .to_string();
    let raw = model_node.as_raw_str();
    let start = (raw.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
    let model_span = start..start + raw.len();
    if body.get(model_span.clone()) != Some(raw.as_bytes()) {
        return Err(Error::new(
            Kind::Internal,
            "could not locate \"model\" in the body",
        ));
    }
    let stream = match stream {
        None => false,
        Some(v) if v.is_null() => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| Error::new(Kind::InvalidBody, "\"stream\" must be a boolean"))?,
    };
    Ok(RoutingFields {
        model: model_str,
        model_span,
        stream,
    })
}

/// A copy of `body` with the model value replaced by `model`.
pub fn splice_model(body: &[u8], span: &Range<usize>, model: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + model.len());
    out.extend_from_slice(&body[..span.start]);
    push_json_str(&mut out, model);
    out.extend_from_slice(&body[span.end..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let ok: &[(&str, &str, bool)] = &[
            (r#"{"model":"a","messages":[]}"#, "a", false),
            (
                r#"{"messages":[{"content":"model"}],"stream":true,"model":"gpt-4o"}"#,
                "gpt-4o",
                true,
            ),
            (r#" { "stream" : null , "model" : "x\"y" } "#, "x\"y", false),
            (r#"{"model":"\u00e9"}"#, "é", false),
        ];
        for (body, model, stream) in ok {
            let f = routing_fields(body.as_bytes()).unwrap();
            assert_eq!((f.model.as_str(), f.stream), (*model, *stream), "{body}");
        }
        let bad: &[(&str, &str)] = &[
            ("", "empty"),
            ("{", "valid JSON"),
            (r#"{"messages":[]}"#, "missing"),
            (r#"{"model":3}"#, "string"),
            (r#"{"model":"a","stream":"yes"}"#, "boolean"),
            (r#"[1,2]"#, "JSON object"),
        ];
        for (body, want) in bad {
            let e = routing_fields(body.as_bytes()).unwrap_err();
            assert_eq!(e.status(), 400, "{body}");
            assert!(e.message.contains(want), "{body}: {}", e.message);
        }
    }

    #[test]
    fn splice_keeps_the_rest_byte_for_byte() {
        let body = br#"{ "model" : "alias", "messages":[{"role":"user","content":"hi"}] }"#;
        let f = routing_fields(body).unwrap();
        let out = splice_model(body, &f.model_span, "real-\"model");
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{ "model" : "real-\"model", "messages":[{"role":"user","content":"hi"}] }"#
        );
    }
}
