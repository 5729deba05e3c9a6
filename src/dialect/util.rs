//! Small shared helpers for the converters: JSON access, Chat content
//! flattening, data-URL parsing, argument parsing.
//!
//! Must not: perform IO or hold state; it only reads its inputs and builds
//! the values it returns.

use super::TranslateError;
use serde_json::{Map, Value};

pub(crate) type Obj = Map<String, Value>;

/// Parse a body that must be a JSON object.
pub(crate) fn parse_object(body: &[u8]) -> Result<Value, TranslateError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| TranslateError::new(format!("invalid JSON body: {e}")))?;
    if v.is_object() {
        Ok(v)
    } else {
        Err(TranslateError::new("request body must be a JSON object"))
    }
}

pub(crate) fn as_object(v: &Value) -> Result<&Obj, TranslateError> {
    v.as_object()
        .ok_or_else(|| TranslateError::new("expected a JSON object"))
}

pub(crate) fn to_bytes(v: &Value) -> Result<Vec<u8>, TranslateError> {
    serde_json::to_vec(v).map_err(|e| TranslateError::new(format!("serialize: {e}")))
}

/// `v[key]` as a string slice.
pub(crate) fn s<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// `v[key]` as an array slice (empty when absent or not an array).
pub(crate) fn arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// First present key of `keys` (for camelCase / snake_case aliases).
pub(crate) fn get_any<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| v.get(*k))
}

/// Copy `from[key]` to `to[new_key]` when present and not null.
pub(crate) fn copy(from: &Value, key: &str, to: &mut Obj, new_key: &str) {
    if let Some(v) = from.get(key) {
        if !v.is_null() {
            to.insert(new_key.to_string(), v.clone());
        }
    }
}

/// Text of a Chat message `content`: a string, or the concatenation of the
/// text of its `text` / `input_text` / `output_text` parts.
pub(crate) fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                if let Some(t) = s(p, "text") {
                    out.push_str(t);
                }
            }
            out
        }
        _ => String::new(),
    }
}

/// Split a `data:<mime>;base64,<data>` URL.
pub(crate) fn parse_data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let mime = meta.strip_suffix(";base64")?;
    Some((mime, data))
}

/// Guess an image MIME type from a URL's extension.
pub(crate) fn guess_mime(url: &str) -> &'static str {
    let path = url
        .split(['?', '#'])
        .next()
        .unwrap_or(url)
        .to_ascii_lowercase();
    if path.ends_with(".png") {
        "image/png"
    } else if path.ends_with(".gif") {
        "image/gif"
    } else if path.ends_with(".webp") {
        "image/webp"
    } else {
        "image/jpeg"
    }
}

/// Tool-call arguments (a JSON string) as an object. Empty or invalid JSON,
/// or a non-object value, becomes `{}`: targets that need an object cannot
/// carry anything else.
pub(crate) fn args_object(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::Object(Map::new()),
    }
}

/// A JSON value as a compact string (for tool arguments / results).
pub(crate) fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A u64 field, if present. Usage counts are read with it: a negative, fractional or exponent
/// number, or one over `u64::MAX` (serde_json holds those as i64 or f64), is absent.
pub(crate) fn u(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// Hub usage object from counts.
pub(crate) fn chat_usage(u: &super::Usage) -> Value {
    let p = u.prompt_tokens.unwrap_or(0);
    let c = u.completion_tokens.unwrap_or(0);
    let mut o = Obj::new();
    o.insert("prompt_tokens".into(), p.into());
    o.insert("completion_tokens".into(), c.into());
    o.insert("total_tokens".into(), p.saturating_add(c).into());
    if let Some(cached) = u.cached_tokens {
        o.insert(
            "prompt_tokens_details".into(),
            serde_json::json!({ "cached_tokens": cached }),
        );
    }
    Value::Object(o)
}

/// Read a hub usage object.
pub(crate) fn read_chat_usage(v: &Value) -> super::Usage {
    super::Usage {
        prompt_tokens: u(v, "prompt_tokens"),
        completion_tokens: u(v, "completion_tokens"),
        cached_tokens: v
            .get("prompt_tokens_details")
            .and_then(|d| u(d, "cached_tokens")),
    }
}

/// A hub assistant message holding `text` (`content: null` when it is empty and the turn
/// makes tool calls, as Chat sends it).
pub(crate) fn assistant(text: String, has_calls: bool) -> Obj {
    let mut m = Obj::new();
    m.insert("role".into(), "assistant".into());
    let content = if text.is_empty() && has_calls {
        Value::Null
    } else {
        Value::from(text)
    };
    m.insert("content".into(), content);
    m
}

/// Append `items` as a turn of `role` (the items under `key`), merging with the previous turn
/// when it has the same role (Messages and Gemini expect alternating turns).
pub(crate) fn push_turn(turns: &mut Vec<Value>, role: &str, key: &str, mut items: Vec<Value>) {
    if items.is_empty() {
        return;
    }
    if let Some(last) = turns.last_mut() {
        if s(last, "role") == Some(role) {
            if let Some(p) = last.get_mut(key).and_then(Value::as_array_mut) {
                p.append(&mut items);
                return;
            }
        }
    }
    turns.push(serde_json::json!({"role": role, key: items}));
}

/// A hub Chat completion of one choice: what every non-stream `response_to_chat` returns.
pub(crate) fn completion(
    id: &str,
    created: u64,
    model: &str,
    message: Value,
    finish: &str,
    usage: &super::Usage,
) -> Value {
    serde_json::json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": chat_usage(usage),
    })
}

/// A hub completion's first choice and its message (`null` where absent), once the body is
/// known to be an object: what every `chat_to_response` starts from.
pub(crate) fn first_message(chat: &Value) -> Result<(&Value, &Value), TranslateError> {
    as_object(chat)?;
    let choice = arr(chat, "choices").first().unwrap_or(&Value::Null);
    Ok((choice, choice.get("message").unwrap_or(&Value::Null)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_url() {
        assert_eq!(
            parse_data_url("data:image/png;base64,AAAA"),
            Some(("image/png", "AAAA"))
        );
        assert_eq!(parse_data_url("https://x/y.png"), None);
        assert_eq!(parse_data_url("data:image/png,AAAA"), None);
    }

    #[test]
    fn args() {
        assert_eq!(args_object("{\"a\":1}")["a"], 1);
        assert_eq!(args_object(""), Value::Object(Map::new()));
        assert_eq!(args_object("[1]"), Value::Object(Map::new()));
    }

    #[test]
    fn mime() {
        assert_eq!(guess_mime("https://a/b.PNG?x=1"), "image/png");
        assert_eq!(guess_mime("https://a/b"), "image/jpeg");
    }
}
