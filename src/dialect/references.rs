//! Responses API state, the pure half: expanding a Responses request's references
//! (`previous_response_id`, `{"type":"item_reference","id":…}` input items) into full input
//! items from what a store recalls, and reading what a store keeps from a request (its own input
//! items) and from an answer (the response id, its output items).
//!
//! The store itself (bounded, per tenant, TTL, charged to the byte budget) is
//! `crate::responses_state`; it is consulted before translation, through [`Recall`], so a
//! translated route (Responses client → Chat / Anthropic / Gemini upstream) sees only full input
//! items. Same-dialect routes never call this: their references go upstream untouched.
//!
//! Semantics (as OpenAI documents them): `previous_response_id` prepends, oldest first, every
//! earlier turn of the chain — each turn's input items then its output items; the earlier
//! turns' `instructions` are not carried over. An `item_reference` is replaced by the stored
//! item with that id, in place.
//!
//! Must not: perform IO, read clocks, hold state, or allocate beyond the values it returns.

use super::util::{self, s};
use super::TranslateError;
use serde_json::{json, Value};

/// One stored turn of a conversation: the response it answered with, by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastTurn {
    /// The turn's own `previous_response_id` (the chain goes on through it).
    pub previous: Option<Box<str>>,
    /// The turn's own input items (references already expanded), a JSON array.
    pub input: Box<[u8]>,
    /// The response's output items, a JSON array.
    pub output: Box<[u8]>,
}

/// What a store recalls for one tenant.
pub trait Recall {
    /// The stored item `id` (raw JSON of one output item).
    fn item(&mut self, id: &str) -> Option<std::sync::Arc<[u8]>>;
    /// The stored response `id`.
    fn response(&mut self, id: &str) -> Option<std::sync::Arc<PastTurn>>;
}

/// A reference that cannot be resolved: 400 `invalid_request_error`, `param` named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefError {
    /// The request field at fault, as OpenAI names it (`previous_response_id`, `input[2].id`).
    pub param: String,
    pub message: String,
}

/// A request with its references expanded.
#[derive(Debug, Clone, PartialEq)]
pub struct Expanded {
    /// The body to translate: `input` = the chain's items + this request's own items,
    /// `previous_response_id` removed.
    pub body: Vec<u8>,
    /// This request's own input items, references expanded (a JSON array): what a store keeps.
    pub own_input: Vec<u8>,
    /// This request's `previous_response_id`.
    pub previous: Option<String>,
}

/// Longest `previous_response_id` chain followed.
pub const MAX_CHAIN: usize = 1_000;

/// True when `body` may carry a reference (a byte search; a false positive only costs the
/// parse of [`expand`]). Requests without one never touch the store on the way in.
pub fn has_references(body: &[u8]) -> bool {
    memchr::memmem::find(body, b"item_reference").is_some()
        || memchr::memmem::find(body, b"previous_response_id").is_some()
}

fn invalid(e: TranslateError) -> RefError {
    RefError {
        param: "input".into(),
        message: e.message,
    }
}

/// A request's `input` as items: a string is one user message.
fn input_items(req: &mut Value) -> Result<Vec<Value>, RefError> {
    match req.get_mut("input").map(Value::take) {
        Some(Value::String(t)) => Ok(vec![
            json!({"type": "message", "role": "user", "content": t}),
        ]),
        Some(Value::Array(items)) => Ok(items),
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(_) => Err(RefError {
            param: "input".into(),
            message: "`input` must be a string or an array".into(),
        }),
    }
}

fn parse_array(raw: &[u8]) -> Vec<Value> {
    match serde_json::from_slice(raw) {
        Ok(Value::Array(a)) => a,
        _ => Vec::new(),
    }
}

/// Expand the references of a Responses request `body` with what `recall` finds. An unknown
/// (never stored, expired or evicted) id is a [`RefError`] naming the field.
pub fn expand(body: &[u8], recall: &mut dyn Recall) -> Result<Expanded, RefError> {
    let mut req = util::parse_object(body).map_err(invalid)?;
    let previous = match req
        .as_object_mut()
        .and_then(|o| o.remove("previous_response_id"))
    {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id),
        Some(_) => {
            return Err(RefError {
                param: "previous_response_id".into(),
                message: "`previous_response_id` must be a string".into(),
            })
        }
    };
    let mut own = input_items(&mut req)?;
    for (i, item) in own.iter_mut().enumerate() {
        if s(item, "type") != Some("item_reference") {
            continue;
        }
        let param = format!("input[{i}].id");
        let Some(id) = s(item, "id") else {
            return Err(RefError {
                param,
                message: "an `item_reference` needs a string `id`".into(),
            });
        };
        let stored = recall.item(id).ok_or_else(|| RefError {
            message: format!(
                "Item with id '{id}' not found: it was never stored by this gateway, or it \
                 expired or was evicted from its Responses store (send the item itself, or \
                 start the conversation again)"
            ),
            param: param.clone(),
        })?;
        *item = serde_json::from_slice(&stored).map_err(|_| RefError {
            param,
            message: format!("Item with id '{id}' could not be read back"),
        })?;
    }
    let mut turns = Vec::new();
    let mut next = previous.clone();
    // An upstream that repeats ids can make a chain come back to itself: each turn once.
    let mut seen = std::collections::HashSet::new();
    while let Some(id) = next.take() {
        if turns.len() >= MAX_CHAIN || !seen.insert(id.clone()) {
            break;
        }
        let turn = recall.response(&id).ok_or_else(|| RefError {
            param: "previous_response_id".into(),
            message: format!(
                "Previous response with id '{id}' not found: it was never stored by this \
                 gateway, or it expired or was evicted from its Responses store (send the \
                 conversation as input items instead)"
            ),
        })?;
        next = turn.previous.as_deref().map(str::to_string);
        turns.push(turn);
    }
    let own_input =
        serde_json::to_vec(&own).map_err(|e| invalid(TranslateError::new(e.to_string())))?;
    let mut input = Vec::new();
    for t in turns.iter().rev() {
        input.extend(parse_array(&t.input));
        input.extend(parse_array(&t.output));
    }
    input.extend(own);
    if let Some(o) = req.as_object_mut() {
        o.insert("input".into(), Value::Array(input));
    }
    let body = util::to_bytes(&req).map_err(invalid)?;
    Ok(Expanded {
        body,
        own_input,
        previous,
    })
}

/// What a request without references gives a store: its own input items (a JSON array) and its
/// `previous_response_id`; `None` when the client said `store: false` (nothing is kept) or the
/// body is not a Responses request object.
pub fn own_input(body: &[u8]) -> Option<(Vec<u8>, Option<String>)> {
    #[derive(serde::Deserialize)]
    struct Fields<'a> {
        #[serde(borrow, default)]
        input: Option<&'a serde_json::value::RawValue>,
        #[serde(default)]
        store: Option<bool>,
        #[serde(default)]
        previous_response_id: Option<String>,
    }
    let f: Fields<'_> = serde_json::from_slice(body).ok()?;
    if f.store == Some(false) {
        return None;
    }
    let raw = f.input.map_or("[]", |r| r.get());
    let input = if raw.starts_with('"') {
        let mut v = br#"[{"type":"message","role":"user","content":"#.to_vec();
        v.extend_from_slice(raw.as_bytes());
        v.extend_from_slice(b"}]");
        v
    } else if raw.starts_with('[') {
        raw.as_bytes().to_vec()
    } else {
        b"[]".to_vec()
    };
    Some((input, f.previous_response_id))
}

/// The items of several JSON arrays, in order, as one JSON array (bytes spliced, not parsed;
/// each part must be an array).
pub fn concat_arrays(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum::<usize>() + 2);
    out.push(b'[');
    for p in parts {
        let inner = p.trim_ascii();
        let inner = inner
            .strip_prefix(b"[")
            .and_then(|i| i.strip_suffix(b"]"))
            .unwrap_or_default()
            .trim_ascii();
        if inner.is_empty() {
            continue;
        }
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(inner);
    }
    out.push(b']');
    out
}

/// True when the client asked that nothing be stored (`"store": false`).
pub fn store_refused(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Fields {
        #[serde(default)]
        store: Option<bool>,
    }
    serde_json::from_slice::<Fields>(body).is_ok_and(|f| f.store == Some(false))
}

/// What a store keeps of a Responses answer (`response` object): its id, each output item
/// with an id (raw JSON), and the whole output array. `None` for a failed response or one
/// without an id.
#[allow(clippy::type_complexity)]
pub fn answer(response: &Value) -> Option<(String, Vec<(String, Vec<u8>)>, Vec<u8>)> {
    let id = s(response, "id")?;
    if matches!(s(response, "status"), Some("failed" | "cancelled")) {
        return None;
    }
    // each item written once: the output array is spliced from the items' bytes
    let mut items = Vec::new();
    let mut output = vec![b'['];
    for it in response.get("output")?.as_array()? {
        let raw = serde_json::to_vec(it).ok()?;
        if output.len() > 1 {
            output.push(b',');
        }
        output.extend_from_slice(&raw);
        if let Some(item_id) = s(it, "id") {
            items.push((item_id.to_string(), raw));
        }
    }
    output.push(b']');
    Some((id.to_string(), items, output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    #[derive(Default)]
    struct Mem {
        items: HashMap<String, Arc<[u8]>>,
        turns: HashMap<String, Arc<PastTurn>>,
    }

    impl Recall for Mem {
        fn item(&mut self, id: &str) -> Option<Arc<[u8]>> {
            self.items.get(id).cloned()
        }
        fn response(&mut self, id: &str) -> Option<Arc<PastTurn>> {
            self.turns.get(id).cloned()
        }
    }

    fn turn(previous: Option<&str>, input: &str, output: &str) -> Arc<PastTurn> {
        Arc::new(PastTurn {
            previous: previous.map(Into::into),
            input: input.as_bytes().into(),
            output: output.as_bytes().into(),
        })
    }

    fn body(e: &Expanded) -> String {
        String::from_utf8(e.body.clone()).unwrap()
    }

    /// The Vercel AI SDK's second step: the assistant's items by reference, the tool result in
    /// full. Golden: the expanded body, byte for byte.
    #[test]
    fn golden_item_reference_expansion() {
        let mut m = Mem::default();
        m.items.insert(
            "msg_1".into(),
            br#"{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Let me check.","annotations":[]}]}"#[..].into(),
        );
        m.items.insert(
            "fc_1".into(),
            br#"{"type":"function_call","id":"fc_1","call_id":"call_1","name":"weather","arguments":"{\"city\":\"Paris\"}","status":"completed"}"#[..].into(),
        );
        let req = br#"{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"Weather in Paris?"}]},{"type":"item_reference","id":"msg_1"},{"type":"item_reference","id":"fc_1"},{"type":"function_call_output","call_id":"call_1","output":"20C"}],"tools":[{"type":"function","name":"weather","parameters":{}}]}"#;
        assert!(has_references(req));
        let e = expand(req, &mut m).unwrap();
        assert_eq!(
            body(&e),
            r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"Weather in Paris?"}]},{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Let me check.","annotations":[]}]},{"type":"function_call","id":"fc_1","call_id":"call_1","name":"weather","arguments":"{\"city\":\"Paris\"}","status":"completed"},{"type":"function_call_output","call_id":"call_1","output":"20C"}],"tools":[{"type":"function","name":"weather","parameters":{}}]}"#
        );
        assert_eq!(e.previous, None);
        // the expansion translates like the full items would
        let hub = super::super::request_to_chat(super::super::Dialect::Responses, &e.body).unwrap();
        let msgs = hub["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[1]["content"], "Let me check.");
        assert_eq!(msgs[1]["tool_calls"][0]["id"], "call_1");
        assert_eq!(msgs[2]["role"], "tool");
    }

    /// A chain of two earlier turns: oldest first, each turn's input then its output, then the
    /// request's own input; `previous_response_id` is gone, `instructions` stays this request's.
    #[test]
    fn golden_previous_response_chain() {
        let mut m = Mem::default();
        m.turns.insert(
            "resp_1".into(),
            turn(
                None,
                r#"[{"type":"message","role":"user","content":"a"}]"#,
                r#"[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"b"}]}]"#,
            ),
        );
        m.turns.insert(
            "resp_2".into(),
            turn(
                Some("resp_1"),
                r#"[{"type":"message","role":"user","content":"c"}]"#,
                r#"[{"type":"message","id":"msg_2","role":"assistant","content":[{"type":"output_text","text":"d"}]}]"#,
            ),
        );
        let e = expand(
            br#"{"model":"m","instructions":"be brief","previous_response_id":"resp_2","input":"e"}"#,
            &mut m,
        )
        .unwrap();
        assert_eq!(
            body(&e),
            r#"{"model":"m","instructions":"be brief","input":[{"type":"message","role":"user","content":"a"},{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"b"}]},{"type":"message","role":"user","content":"c"},{"type":"message","id":"msg_2","role":"assistant","content":[{"type":"output_text","text":"d"}]},{"type":"message","role":"user","content":"e"}]}"#
        );
        assert_eq!(e.previous.as_deref(), Some("resp_2"));
        assert_eq!(
            e.own_input,
            br#"[{"type":"message","role":"user","content":"e"}]"#
        );
    }

    #[test]
    fn a_chain_that_comes_back_is_followed_once() {
        let mut m = Mem::default();
        m.turns
            .insert("r".into(), turn(Some("r"), r#"[{"a":1}]"#, r#"[{"b":2}]"#));
        let e = expand(br#"{"previous_response_id":"r","input":[]}"#, &mut m).unwrap();
        assert_eq!(body(&e), r#"{"input":[{"a":1},{"b":2}]}"#);
    }

    #[test]
    fn unknown_ids_name_the_param() {
        let mut m = Mem::default();
        let e = expand(br#"{"previous_response_id":"resp_x","input":"hi"}"#, &mut m).unwrap_err();
        assert_eq!(e.param, "previous_response_id");
        assert!(e.message.contains("resp_x"), "{}", e.message);
        let e = expand(
            br#"{"input":[{"role":"user","content":"x"},{"type":"item_reference","id":"fc_gone"}]}"#,
            &mut m,
        )
        .unwrap_err();
        assert_eq!(e.param, "input[1].id");
        assert!(e.message.contains("fc_gone"));
        // a broken link in the middle of a chain is the request's previous_response_id too
        m.turns
            .insert("resp_2".into(), turn(Some("resp_1"), "[]", "[]"));
        let e = expand(br#"{"previous_response_id":"resp_2","input":"x"}"#, &mut m).unwrap_err();
        assert_eq!(e.param, "previous_response_id");
        assert!(e.message.contains("resp_1"));
    }

    #[test]
    fn own_input_and_store_false() {
        let (input, prev) = own_input(br#"{"model":"m","input":"hi \"x\""}"#).unwrap();
        assert_eq!(
            input,
            br#"[{"type":"message","role":"user","content":"hi \"x\""}]"#
        );
        assert_eq!(prev, None);
        let (input, prev) =
            own_input(br#"{"input":[{"role":"user","content":"x"}],"previous_response_id":"r"}"#)
                .unwrap();
        assert_eq!(input, br#"[{"role":"user","content":"x"}]"#);
        assert_eq!(prev.as_deref(), Some("r"));
        assert!(own_input(br#"{"input":"x","store":false}"#).is_none());
        assert!(store_refused(br#"{"input":"x","store":false}"#));
        assert!(!store_refused(br#"{"input":"x","store":true}"#));
        assert!(!has_references(br#"{"input":"x"}"#));
    }

    #[test]
    fn arrays_concatenate() {
        assert_eq!(concat_arrays(&[b"[1]", b" [] ", b"[2,3]"]), b"[1,2,3]");
        assert_eq!(concat_arrays(&[b"[]"]), b"[]");
    }

    #[test]
    fn answer_items() {
        let r = json!({"id":"resp_1","status":"completed","output":[
            {"type":"function_call","id":"fc_1","call_id":"c","name":"f","arguments":"{}"},
            {"type":"message","role":"assistant","content":[]}]});
        let (id, items, output) = answer(&r).unwrap();
        assert_eq!(id, "resp_1");
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].0, "fc_1");
        assert!(output.starts_with(b"[{\"type\":\"function_call\""));
        let back: Value = serde_json::from_slice(&output).unwrap();
        assert_eq!(back, r["output"]);
        assert!(answer(&json!({"id":"r","status":"failed","output":[]})).is_none());
    }
}
