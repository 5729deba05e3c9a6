//! Same-dialect passthrough support: find `model` and `stream` in a JSON body without building
//! the document, and splice a different model name (and a Chat stream's `include_usage`) in.
//!
//! Before anything is forwarded the body must be one JSON object, nested at most
//! `nesting::MAX_DEPTH` deep, followed by nothing but whitespace, with at most one `model` and
//! one `stream` key (after unescaping), so the gateway and the upstream can never read a
//! different model; and `model` must be a valid model identifier (`upstream::target::model_id`),
//! since it may become part of an upstream path. Every violation is a 400 (`Kind::InvalidBody`)
//! before routing.
//!
//! One targeted pass: the body is validated whole by `util::json_check` (flat, no allocation),
//! then only its top-level members are walked (values skipped by their brackets and string
//! quotes, which the check has proven balanced); the few values routing reads are read from
//! their bytes. Nothing is allocated but the model's name. The same pass reads what the
//! request's span reports (`Sampling`: `temperature`, `top_p`; the output cap is `max_tokens`).
//!
//! Owns: the routing fields of a request body and those checks. Must not: validate or rewrite
//! anything else — the rest of the body is forwarded byte for byte.

use std::ops::Range;

use crate::error::{push_json_str, Error, Kind};
use crate::http::target::{self, MODEL_RULE};
use crate::util::json_check;
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
    /// The sampling parameters the body asks for (read in the same pass; never validated).
    pub sampling: Sampling,
    /// The request's usage is metered (a keyed request; set by the pipeline, not read from
    /// the body): Chat streams ask the upstream for usage (see `plan`).
    pub metered: bool,
    /// The Responses state namespace of a Responses request while the store is on (set by the
    /// pipeline, not read from the body; see `responses_state`).
    pub tenant: Option<u64>,
}

/// `temperature` and `top_p` as the body gives them (Gemini: `generationConfig.temperature` and
/// `.topP`), numbers only; for the request's span. Kept as the `f64`'s bits so that
/// `RoutingFields` stays `Eq`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sampling {
    temperature: Option<u64>,
    top_p: Option<u64>,
}

impl Sampling {
    pub fn temperature(&self) -> Option<f64> {
        self.temperature.map(f64::from_bits)
    }

    pub fn top_p(&self) -> Option<f64> {
        self.top_p.map(f64::from_bits)
    }
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
    let span = scan
        .model
        .ok_or_else(|| Error::new(Kind::InvalidBody, "missing required field \"model\""))?;
    let model_str = match body.get(span.clone()) {
        Some([b'"', inner @ .., b'"']) => unescape(inner),
        _ => None,
    }
    .ok_or_else(|| Error::new(Kind::InvalidBody, "\"model\" must be a string"))?;
    if let Err(why) = target::model_id(&model_str) {
        return Err(Error::new(
            Kind::InvalidBody,
            format!("\"model\" is not a valid model name: it {why}; {MODEL_RULE}"),
        ));
    }
    let stream = match scan.stream.and_then(|r| body.get(r)) {
        None | Some(b"null") | Some(b"false") => false,
        Some(b"true") => true,
        Some(_) => {
            return Err(Error::new(
                Kind::InvalidBody,
                "\"stream\" must be a boolean",
            ))
        }
    };
    Ok(RoutingFields {
        model: model_str,
        model_span: span,
        stream,
        max_tokens: scan.max_tokens,
        usage_option: scan.usage_option,
        sampling: scan.sampling,
        metered: false,
        tenant: None,
    })
}

/// The routing fields of a Gemini-dialect request: the model and the stream choice come from
/// its path (`gemini::call`), so the body is only checked like any other (one JSON object,
/// bounded nesting, nothing after it) and read for `generationConfig.maxOutputTokens`. The
/// model span is empty: a Gemini model is never spliced into the body (it goes in the URL).
pub fn gemini_fields(
    body: &[u8],
    call: &crate::dialect::gemini::call::Call,
) -> Result<RoutingFields, Error> {
    let scan = scan(body, true)?;
    Ok(RoutingFields {
        model: call.model.clone(),
        model_span: 0..0,
        stream: call.stream,
        max_tokens: scan.max_tokens,
        usage_option: UsageOption::Absent,
        sampling: scan.sampling,
        metered: false,
        tenant: None,
    })
}

/// What one pass over a body found: the routing values' byte ranges and the parameters read.
struct Scan {
    model: Option<Range<usize>>,
    stream: Option<Range<usize>>,
    max_tokens: Option<u64>,
    usage_option: UsageOption,
    sampling: Sampling,
}

/// The checks every body passes (non-empty, nesting bound, one object with no duplicate routing
/// key and nothing after it) and its routing keys, in one pass. `gemini`: the output cap and
/// the sampling parameters are `generationConfig`'s.
fn scan(body: &[u8], gemini: bool) -> Result<Scan, Error> {
    if body.is_empty() {
        return Err(Error::new(
            Kind::InvalidBody,
            "request body is empty; expected a JSON object",
        ));
    }
    // the depth first: its message wins over any other a deep body would also earn
    nesting::check(body).map_err(|e| {
        Error::new(
            Kind::InvalidBody,
            format!("request body is not acceptable: {e}"),
        )
    })?;
    if let Err(why) = json_check::check(body) {
        return Err(invalid(body, why));
    }
    let Some(open) = body
        .iter()
        .position(|b| !is_ws(*b))
        .filter(|&i| body[i] == b'{')
    else {
        return Err(Error::new(
            Kind::InvalidBody,
            "request body must be one JSON object",
        ));
    };
    let mut s = Scan {
        model: None,
        stream: None,
        max_tokens: None,
        usage_option: UsageOption::Absent,
        sampling: Sampling::default(),
    };
    let mut duplicate = None;
    members(body, open, |name, value| {
        let key = key_of(name);
        let raw = &body[value.clone()];
        let slot = match key {
            Key::Model => &mut s.model,
            Key::Stream => &mut s.stream,
            Key::MaxTokens if !gemini => {
                s.max_tokens = s.max_tokens.or_else(|| whole_number(raw));
                return;
            }
            Key::StreamOptions if !gemini => {
                s.usage_option = match s.usage_option {
                    UsageOption::Absent => usage_option_of(body, value),
                    _ => UsageOption::Unclear,
                };
                return;
            }
            Key::Temperature if !gemini => return first_number(&mut s.sampling.temperature, raw),
            Key::TopP if !gemini => return first_number(&mut s.sampling.top_p, raw),
            Key::GenerationConfig(camel) if gemini && raw.first() == Some(&b'{') => {
                generation_config(body, value.start, camel, &mut s);
                return;
            }
            _ => return,
        };
        if slot.replace(value).is_some() && duplicate.is_none() {
            duplicate = Some(key);
        }
    });
    if let Some(key) = duplicate {
        let name = if key == Key::Model { "model" } else { "stream" };
        return Err(Error::new(
            Kind::InvalidBody,
            format!("request body has a duplicate {name:?} key"),
        ));
    }
    Ok(s)
}

/// The error for a body `json_check` refused: data after a complete top-level value is said as
/// such, anything else is not a valid JSON object.
fn invalid(body: &[u8], why: json_check::Invalid) -> Error {
    let first = body.iter().position(|b| !is_ws(*b)).unwrap_or(0);
    let after_value = match why {
        // the value was complete where the check met a byte it could not take: data after it
        json_check::Invalid::At(at) => value_end(body, first).is_some_and(|end| end <= at),
        _ => false,
    };
    if after_value {
        return Error::new(
            Kind::InvalidBody,
            "request body has data after its JSON object",
        );
    }
    let at = match why {
        json_check::Invalid::At(at) => format!("unexpected byte at offset {at}"),
        json_check::Invalid::Eof => "it ends inside a value".to_string(),
        json_check::Invalid::TooDeep => nesting::TooDeep.to_string(),
    };
    Error::new(
        Kind::InvalidBody,
        format!("request body is not a valid JSON object: {at}"),
    )
}

/// The top-level keys the scan reads (after unescaping); anything else is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Model,
    Stream,
    MaxTokens,
    StreamOptions,
    Temperature,
    TopP,
    /// `generationConfig` (true) or `generation_config`.
    GenerationConfig(bool),
    Other,
}

fn key_of(name: &[u8]) -> Key {
    match name {
        b"model" => Key::Model,
        b"stream" => Key::Stream,
        b"max_tokens" | b"max_completion_tokens" | b"max_output_tokens" => Key::MaxTokens,
        b"stream_options" => Key::StreamOptions,
        b"temperature" => Key::Temperature,
        b"top_p" => Key::TopP,
        b"generationConfig" => Key::GenerationConfig(true),
        b"generation_config" => Key::GenerationConfig(false),
        _ => Key::Other,
    }
}

/// Call `f` with a raw key's name (between its quotes), unescaped if it has escapes (into a
/// small stack buffer: a name longer than any the scan reads is handed over as `""`).
fn with_name(raw: &[u8], f: &mut impl FnMut(&[u8], Range<usize>), value: Range<usize>) {
    if !raw.contains(&b'\\') {
        return f(raw, value);
    }
    let mut out = [0u8; 24];
    let mut n = 0;
    let fits = unescape_into(raw, |bytes| {
        let end = n + bytes.len();
        let Some(dst) = out.get_mut(n..end) else {
            return false;
        };
        dst.copy_from_slice(bytes);
        n = end;
        true
    });
    f(if fits { &out[..n] } else { b"" }, value)
}

/// Call `f` with each member (its unescaped name, its value's byte range) of the object whose
/// `{` is at `open` in `b`, which `json_check` has accepted. Returns the offset after the
/// closing `}`.
fn members(b: &[u8], open: usize, mut f: impl FnMut(&[u8], Range<usize>)) -> Option<usize> {
    let mut i = skip_ws(b, open + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        // `"key"`
        let key_end = string_end(b, i)?;
        let name = b.get(i + 1..key_end - 1)?;
        // `:` value
        i = skip_ws(b, skip_ws(b, key_end) + 1);
        let end = value_end(b, i)?;
        with_name(name, &mut f, i..end);
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// The end of the (valid) value starting at `i`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            // brackets are balanced outside strings (the body passed `json_check`)
            let mut depth = 0usize;
            let mut j = i;
            loop {
                let k = j + memchr::memchr3(b'"', b'{', b'[', &b[j..]).map_or(b.len() - j, |k| k);
                let closes = memchr::memchr2_iter(b'}', b']', &b[j..k]);
                for c in closes {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        return Some(j + c + 1);
                    }
                }
                match b.get(k)? {
                    b'"' => j = string_end(b, k)?,
                    _ => {
                        depth += 1;
                        j = k + 1;
                    }
                }
            }
        }
        _ => {
            let n = b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']') || is_ws(*c))
                .unwrap_or(b.len() - i);
            Some(i + n)
        }
    }
}

/// The offset after the closing quote of the string whose opening quote is at `i`.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        j += memchr::memchr2(b'"', b'\\', b.get(j..)?)?;
        if b[j] == b'"' {
            return Some(j + 1);
        }
        j += 2;
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| is_ws(*c)) {
        i += 1;
    }
    i
}

/// A JSON number that is a whole number in `u64`'s range (`16`, not `16.0` or `-1`).
fn whole_number(raw: &[u8]) -> Option<u64> {
    if raw.is_empty() || !raw.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(raw).ok()?.parse().ok()
}

/// Keep the first number a key has (its `f64`'s bits).
fn first_number(slot: &mut Option<u64>, raw: &[u8]) {
    if slot.is_none() && matches!(raw.first(), Some(b'-' | b'0'..=b'9')) {
        let n = std::str::from_utf8(raw)
            .ok()
            .and_then(|t| t.parse::<f64>().ok());
        *slot = n.map(f64::to_bits);
    }
}

/// Gemini's `generationConfig` object at `open`: `maxOutputTokens` (else `max_output_tokens`)
/// for the cap; `camel`: its `temperature` and `topP` for the span.
fn generation_config(body: &[u8], open: usize, camel: bool, s: &mut Scan) {
    let (mut cap, mut cap_snake) = (None, None);
    let (mut temperature, mut top_p) = (None, None);
    members(body, open, |name, value| {
        let raw = &body[value];
        match name {
            b"maxOutputTokens" => cap = cap.or_else(|| whole_number(raw)),
            b"max_output_tokens" => cap_snake = cap_snake.or_else(|| whole_number(raw)),
            b"temperature" if camel => first_number(&mut temperature, raw),
            b"topP" if camel => first_number(&mut top_p, raw),
            _ => {}
        }
    });
    s.max_tokens = s.max_tokens.or(cap.or(cap_snake));
    if s.sampling.temperature.is_none() {
        s.sampling.temperature = temperature;
    }
    if s.sampling.top_p.is_none() {
        s.sampling.top_p = top_p;
    }
}

/// `stream_options`' value at `value` (a range of `body`) → what it says about usage.
fn usage_option_of(body: &[u8], value: Range<usize>) -> UsageOption {
    let raw = &body[value.clone()];
    if raw == b"null" {
        return UsageOption::NotAsked(value);
    }
    if raw.first() != Some(&b'{') {
        return UsageOption::Unclear;
    }
    let mut asked = None;
    members(body, value.start, |name, v| {
        if name == b"include_usage" && asked.is_none() {
            asked = Some(&body[v] == b"true");
        }
    });
    match asked {
        Some(true) => UsageOption::Asked,
        _ => UsageOption::NotAsked(value),
    }
}

/// A JSON string's contents (between its quotes, valid per `json_check`) unescaped; `None`
/// for an escaped lone surrogate (no character).
fn unescape(raw: &[u8]) -> Option<String> {
    let Some(first) = memchr::memchr(b'\\', raw) else {
        return std::str::from_utf8(raw).ok().map(str::to_owned);
    };
    let mut out = Vec::with_capacity(raw.len());
    out.extend_from_slice(&raw[..first]);
    let ok = unescape_into(&raw[first..], |bytes| {
        out.extend_from_slice(bytes);
        true
    });
    if !ok {
        return None;
    }
    String::from_utf8(out).ok()
}

/// Hand `emit` the unescaped bytes of a JSON string's contents (valid per `json_check`), run by
/// run; false when `emit` refuses or an escape is a lone surrogate.
fn unescape_into(raw: &[u8], mut emit: impl FnMut(&[u8]) -> bool) -> bool {
    let mut i = 0;
    while i < raw.len() {
        let Some(k) = memchr::memchr(b'\\', &raw[i..]) else {
            return emit(&raw[i..]);
        };
        if k > 0 && !emit(&raw[i..i + k]) {
            return false;
        }
        i += k;
        let simple: &[u8] = match raw.get(i + 1) {
            Some(b'"') => b"\"",
            Some(b'\\') => b"\\",
            Some(b'/') => b"/",
            Some(b'b') => b"\x08",
            Some(b'f') => b"\x0c",
            Some(b'n') => b"\n",
            Some(b'r') => b"\r",
            Some(b't') => b"\t",
            Some(b'u') => b"",
            _ => return false,
        };
        if !simple.is_empty() {
            if !emit(simple) {
                return false;
            }
            i += 2;
            continue;
        }
        let Some(hi) = hex4(raw, i + 2) else {
            return false;
        };
        i += 6;
        let code = match hi {
            0xD800..=0xDBFF => {
                let lo = match (raw.get(i), raw.get(i + 1)) {
                    (Some(b'\\'), Some(b'u')) => hex4(raw, i + 2),
                    _ => None,
                };
                match lo {
                    Some(lo @ 0xDC00..=0xDFFF) => {
                        i += 6;
                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                    }
                    _ => return false,
                }
            }
            0xDC00..=0xDFFF => return false,
            c => c,
        };
        let Some(c) = char::from_u32(code) else {
            return false;
        };
        let mut utf8 = [0u8; 4];
        if !emit(c.encode_utf8(&mut utf8).as_bytes()) {
            return false;
        }
    }
    true
}

/// The four hex digits at `raw[i..i + 4]`.
fn hex4(raw: &[u8], i: usize) -> Option<u32> {
    let digits = raw.get(i..i + 4)?;
    let text = std::str::from_utf8(digits).ok()?;
    u32::from_str_radix(text, 16).ok()
}

/// A copy of `body` with the model value replaced by `rename` (when given) and, when
/// `ask_usage`, `stream_options.include_usage` set to true: inserted first in the object when
/// the body has no `stream_options`, else that value rewritten with its other fields kept.
/// Everything else stays byte for byte.
pub fn splice(
    body: &[u8],
    fields: &RoutingFields,
    rename: Option<&str>,
    ask_usage: bool,
) -> Vec<u8> {
    let mut edits: Vec<(std::ops::Range<usize>, Vec<u8>)> = Vec::with_capacity(2);
    if let Some(m) = rename {
        let mut v = Vec::with_capacity(m.len() + 2);
        push_json_str(&mut v, m);
        edits.push((fields.model_span.clone(), v));
    }
    if ask_usage {
        match &fields.usage_option {
            UsageOption::NotAsked(span) => {
                let opts = body
                    .get(span.clone())
                    .and_then(|raw| serde_json::from_slice::<serde_json::Value>(raw).ok());
                let mut map = match opts {
                    Some(serde_json::Value::Object(m)) => m,
                    _ => serde_json::Map::new(),
                };
                map.insert("include_usage".into(), serde_json::Value::Bool(true));
                let v = serde_json::to_vec(&map).unwrap_or_else(|_| INCLUDE_USAGE.to_vec());
                edits.push((span.clone(), v));
            }
            _ => {
                // after the object's opening brace (the body has at least `model`)
                let at = body.iter().position(|&b| b == b'{').map_or(0, |i| i + 1);
                let mut v = b"\"stream_options\":".to_vec();
                v.extend_from_slice(INCLUDE_USAGE);
                v.push(b',');
                edits.push((at..at, v));
            }
        }
    }
    edits.sort_by_key(|(r, _)| r.start);
    let extra: usize = edits.iter().map(|(_, v)| v.len()).sum();
    let mut out = Vec::with_capacity(body.len() + extra);
    let mut at = 0;
    for (r, v) in edits {
        out.extend_from_slice(body.get(at..r.start).unwrap_or_default());
        out.extend_from_slice(&v);
        at = r.end;
    }
    out.extend_from_slice(body.get(at..).unwrap_or_default());
    out
}

const INCLUDE_USAGE: &[u8] = b"{\"include_usage\":true}";

#[cfg(test)]
#[path = "extract_tests.rs"]
mod tests;
