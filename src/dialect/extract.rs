//! Same-dialect passthrough support: find `model` and `stream` in a JSON body without building
//! the document (sonic-rs lazy iteration over the top-level object), and splice a different model
//! name in.
//!
//! Before anything is forwarded the body must be one JSON object, nested at most
//! `nesting::MAX_DEPTH` deep (checked before sonic-rs recurses), followed by nothing but
//! whitespace, with at most one `model` and one `stream` key (after unescaping), so the gateway
//! and the upstream can never read a different model; and `model` must be a valid model
//! identifier (`upstream::target::model_id`), since it may become part of an upstream path.
//! Every violation is a 400 (`Kind::InvalidBody`) before routing.
//!
//! Owns: the routing fields of a request body and those checks. Must not: validate or rewrite
//! anything else — the rest of the body is forwarded byte for byte.

use std::ops::Range;

use sonic_rs::JsonValueTrait;

use crate::error::{push_json_str, Error, Kind};
use crate::http::target::{self, MODEL_RULE};
use crate::util::nesting;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingFields {
    pub model: String,
    /// Byte range of the `model` value (including its quotes) in the body.
    pub model_span: Range<usize>,
    pub stream: bool,
    /// The output-token cap the request asks for (`max_tokens`, `max_completion_tokens` or
    /// `max_output_tokens`, the first one that is a whole number), for token estimates
    /// (`governance`). Read in the same pass; never validated or enforced here.
    pub max_tokens: Option<u64>,
    /// What the body says about `stream_options.include_usage` (read in the same pass).
    pub usage_option: UsageOption,
    /// The request's usage is metered (a keyed request; set by the pipeline, not read from
    /// the body): Chat streams ask the upstream for usage (see `plan`).
    pub metered: bool,
    /// The Responses state namespace of a Responses request while the store is on (set by the
    /// pipeline, not read from the body; see `responses_state`).
    pub tenant: Option<u64>,
}

/// A Chat body's `stream_options.include_usage`, as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageOption {
    /// No `stream_options`.
    Absent,
    /// `stream_options.include_usage` is `true`: the client wants the usage chunk.
    Asked,
    /// `stream_options` is `null` or an object without `include_usage: true`, at this byte
    /// range of the body.
    NotAsked(Range<usize>),
    /// Anything else (a duplicate key, a value that is neither an object nor null): the body
    /// is left as it is.
    Unclear,
}

/// Read `model` (required string) and `stream` (optional bool) from a JSON object body, and the
/// output-token cap if there is one.
pub fn routing_fields(body: &[u8]) -> Result<RoutingFields, Error> {
    let scan = scan(body, false)?;
    let model_node = scan
        .model
        .ok_or_else(|| Error::new(Kind::InvalidBody, "missing required field \"model\""))?;
    let model_str = model_node
        .as_str()
        .ok_or_else(|| Error::new(Kind::InvalidBody, "\"model\" must be a string"))?
        .to_string();
    if let Err(why) = target::model_id(&model_str) {
        return Err(Error::new(
            Kind::InvalidBody,
            format!("\"model\" is not a valid model name: it {why}; {MODEL_RULE}"),
        ));
    }
    let raw = model_node.as_raw_str();
    let start = offset_in(body, raw).unwrap_or(usize::MAX);
    let model_span = start..start.saturating_add(raw.len());
    if body.get(model_span.clone()) != Some(raw.as_bytes()) {
        return Err(Error::new(
            Kind::Internal,
            "could not locate \"model\" in the body",
        ));
    }
    let stream = match scan.stream {
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
        max_tokens: scan.max_tokens,
        usage_option: scan.usage_option,
        metered: false,
        tenant: None,
    })
}

/// The routing fields of a Gemini-dialect request: the model and the stream choice come from
/// its path (`gemini_call`), so the body is only checked like any other (one JSON object,
/// bounded nesting, nothing after it) and read for `generationConfig.maxOutputTokens`. The
/// model span is empty: a Gemini model is never spliced into the body (it goes in the URL).
pub fn gemini_fields(
    body: &[u8],
    call: &crate::dialect::gemini_call::Call,
) -> Result<RoutingFields, Error> {
    let scan = scan(body, true)?;
    Ok(RoutingFields {
        model: call.model.clone(),
        model_span: 0..0,
        stream: call.stream,
        max_tokens: scan.max_tokens,
        usage_option: UsageOption::Absent,
        metered: false,
        tenant: None,
    })
}

/// What one pass over a body found.
struct Scan<'b> {
    model: Option<sonic_rs::LazyValue<'b>>,
    stream: Option<sonic_rs::LazyValue<'b>>,
    max_tokens: Option<u64>,
    usage_option: UsageOption,
}

/// The checks every body passes (non-empty, nesting bound, one object with no duplicate routing
/// key and nothing after it) and its routing keys, in one lazy pass. `gemini`: the output cap
/// is `generationConfig.maxOutputTokens`.
fn scan(body: &[u8], gemini: bool) -> Result<Scan<'_>, Error> {
    if body.is_empty() {
        return Err(Error::new(
            Kind::InvalidBody,
            "request body is empty; expected a JSON object",
        ));
    }
    // Bound the nesting before sonic-rs recurses into it (see `nesting`).
    nesting::check(body).map_err(|e| {
        Error::new(
            Kind::InvalidBody,
            format!("request body is not acceptable: {e}"),
        )
    })?;
    // One lazy pass over the whole top-level object: values are skipped (SIMD), not built.
    let mut model = None;
    let mut stream = None;
    let mut max_tokens = None;
    let mut usage_option = UsageOption::Absent;
    let mut after_last = None;
    for entry in sonic_rs::to_object_iter(body) {
        let (key, value) = entry.map_err(|e| {
            Error::new(
                Kind::InvalidBody,
                format!("request body is not a valid JSON object: {e}"),
            )
        })?;
        let raw = value.as_raw_str();
        after_last = Some(offset_in(body, raw).map_or(usize::MAX, |o| o + raw.len()));
        let slot = match key.as_ref() {
            "model" => &mut model,
            "stream" => &mut stream,
            "max_tokens" | "max_completion_tokens" | "max_output_tokens" if !gemini => {
                max_tokens = max_tokens.or_else(|| value.as_u64());
                continue;
            }
            "stream_options" if !gemini => {
                usage_option = match usage_option {
                    UsageOption::Absent => usage_option_of(body, raw),
                    _ => UsageOption::Unclear,
                };
                continue;
            }
            "generationConfig" | "generation_config" if gemini && raw.starts_with('{') => {
                max_tokens = max_tokens.or_else(|| {
                    let cap = sonic_rs::get(raw, ["maxOutputTokens"])
                        .or_else(|_| sonic_rs::get(raw, ["max_output_tokens"]));
                    cap.ok()?.as_u64()
                });
                continue;
            }
            _ => continue,
        };
        if slot.replace(value).is_some() {
            return Err(Error::new(
                Kind::InvalidBody,
                format!("request body has a duplicate {:?} key", key.as_ref()),
            ));
        }
    }
    // The iterator stopped at the object's closing brace (after optional whitespace following
    // the last value); only whitespace may follow that brace. (No entries: `model` is missing,
    // or, for Gemini, the object is empty — `{}` — and was checked whole by the iterator.)
    match after_last {
        Some(end) if !only_whitespace_after_close(body.get(end..).unwrap_or_default()) => {
            return Err(Error::new(
                Kind::InvalidBody,
                "request body has data after its JSON object",
            ));
        }
        None if gemini && !is_empty_object(body) => {
            return Err(Error::new(
                Kind::InvalidBody,
                "request body must be one JSON object",
            ));
        }
        _ => {}
    }
    Ok(Scan {
        model,
        stream,
        max_tokens,
        usage_option,
    })
}

/// `stream_options`' raw value `raw` (a slice of `body`) → what it says about usage.
fn usage_option_of(body: &[u8], raw: &str) -> UsageOption {
    let Some(start) = offset_in(body, raw) else {
        return UsageOption::Unclear;
    };
    let span = start..start + raw.len();
    if raw == "null" {
        return UsageOption::NotAsked(span);
    }
    if !raw.starts_with('{') {
        return UsageOption::Unclear;
    }
    match sonic_rs::get(raw, ["include_usage"]) {
        Ok(v) if v.as_bool() == Some(true) => UsageOption::Asked,
        _ => UsageOption::NotAsked(span),
    }
}

/// `body` is `{}` with optional whitespace around and inside.
fn is_empty_object(body: &[u8]) -> bool {
    let mut it = body
        .iter()
        .filter(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    it.next() == Some(&b'{') && it.next() == Some(&b'}') && it.next().is_none()
}

/// Offset of `raw` (a slice sonic-rs handed out for `body`) in `body`, if it lies there.
fn offset_in(body: &[u8], raw: &str) -> Option<usize> {
    let start = (raw.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    (start + raw.len() <= body.len()).then_some(start)
}

/// `rest` is optional whitespace, `}`, optional whitespace.
fn only_whitespace_after_close(rest: &[u8]) -> bool {
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let mut it = rest.iter().skip_while(|b| ws(b));
    it.next() == Some(&b'}') && it.all(ws)
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
            (r#" { "stream" : null , "model" : "x\/y" } "#, "x/y", false),
            (r#"{"model":"gpt\u002d4"}"#, "gpt-4", false),
            (
                "{\"model\":\"a\",\"m\":{\"model\":1,\"stream\":2}}\r\n \t",
                "a",
                false,
            ),
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
            // not a model identifier (it may become part of an upstream path)
            (r#"{"model":"\u00e9"}"#, "valid model name"),
            (r#"{"model":""}"#, "valid model name"),
            (r#"{"model":"a\r\nb"}"#, "valid model name"),
            (r#"{"model":"../x"}"#, "valid model name"),
            (r#"{"model":"a?b"}"#, "valid model name"),
            // duplicate routing keys: the gateway and the upstream might read different ones
            (r#"{"model":"a","model":"b"}"#, "duplicate \"model\""),
            (r#"{"model":"a","mod\u0065l":"b"}"#, "duplicate \"model\""),
            (
                r#"{"stream":false,"model":"a","stream":true}"#,
                "duplicate \"stream\"",
            ),
            // trailing data after the object
            (r#"{"model":"a"} x"#, "after its JSON object"),
            (r#"{"model":"a"}{"model":"b"}"#, "after its JSON object"),
            (r#"{"model":"a"}}"#, "after its JSON object"),
            (r#"{"model":"a"},"#, "after its JSON object"),
            (r#"{"model":"a" } \n {}"#, "after its JSON object"),
            ("{} x", "missing"),
        ];
        for (body, want) in bad {
            let e = routing_fields(body.as_bytes()).unwrap_err();
            assert_eq!(e.status(), 400, "{body}");
            assert!(e.message.contains(want), "{body}: {}", e.message);
        }
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let inner = format!("{}{}", open.repeat(12_000), close.repeat(12_000));
            for body in [
                format!(r#"{{"model":"m","messages":{inner}}}"#),
                format!(r#"{{"messages":{inner},"model":"m"}}"#),
                format!(r#"{{"model":"m"}} {inner}"#),
                inner.clone(),
            ] {
                let e = routing_fields(body.as_bytes()).unwrap_err();
                assert_eq!(e.status(), 400);
                assert!(
                    e.message.contains("nested deeper than 128"),
                    "{}",
                    e.message
                );
            }
        }
        // 128 levels in all (the top-level object is one of them) still pass, on a stack the
        // size of a shard's (sonic-rs recurses once per level: ~6.7 MiB in debug builds).
        let ok = format!(
            r#"{{"model":"m","x":{}{}}}"#,
            "[".repeat(127),
            "]".repeat(127)
        );
        let parsed = std::thread::Builder::new()
            .stack_size(crate::runtime::STACK_BYTES)
            .spawn(move || routing_fields(ok.as_bytes()).map(|f| f.model))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(parsed.unwrap(), "m");
    }

    #[test]
    fn gemini_bodies() {
        let call = crate::dialect::gemini_call::Call {
            model: "g".into(),
            stream: true,
        };
        let f = gemini_fields(
            br#"{"contents":[],"generationConfig":{"temperature":1,"maxOutputTokens":7}}"#,
            &call,
        )
        .unwrap();
        assert_eq!(
            (f.model.as_str(), f.stream, f.max_tokens, f.model_span),
            ("g", true, Some(7), 0..0)
        );
        let f = gemini_fields(br#"{"contents":[],"max_tokens":9}"#, &call).unwrap();
        assert_eq!(f.max_tokens, None, "not a Gemini field");
        assert!(gemini_fields(b" { } ", &call).is_ok());
        for bad in [
            &b""[..],
            b"[]",
            b"{",
            b"{} x",
            br#"{"contents":[]} {}"#,
            b"1",
            br#""s""#,
        ] {
            let e = gemini_fields(bad, &call).unwrap_err();
            assert_eq!(e.status(), 400, "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = format!("{{\"contents\":{}{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(
            gemini_fields(deep.as_bytes(), &call).unwrap_err().status(),
            400
        );
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
