//! JSON-RPC 2.0 as MCP uses it: the messages of one client `POST` (one message, or a batch as
//! protocol revision 2025-03-26 allows), parsed with bounds, and the answers the gateway
//! writes (results and errors).
//!
//! Owns: `Message`, `parse`, the error codes and the answer builders. Must not: know MCP
//! methods beyond their names, or do IO. Every input is hostile: the body's size is bounded by
//! the caller (`admission.max_body`), its nesting by `nesting::check` before serde sees it, a
//! batch by `MAX_BATCH`.

use serde_json::{Map, Value};

/// Invalid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// Not a JSON-RPC message.
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Also what a hidden or unknown tool gets (exactly as an unknown tool: MCP's rule).
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// A server that is down, slow or answered garbage (JSON-RPC's implementation-defined range).
pub const SERVER_UNAVAILABLE: i64 = -32000;

/// Most messages in one batch.
pub const MAX_BATCH: usize = 64;

/// One message a client sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request: it gets an answer with its `id`.
    Request {
        id: Value,
        method: String,
        params: Option<Value>,
    },
    /// A notification: no answer.
    Notification {
        method: String,
        params: Option<Value>,
    },
    /// A response to a request the server side sent (the gateway sends none: dropped).
    Response,
}

/// What a `POST` body held.
#[derive(Debug)]
pub struct Parsed {
    pub messages: Vec<Message>,
    /// It was a JSON array (its answers go back as one).
    pub batch: bool,
}

/// The messages of a body. `Err`: the JSON-RPC error to answer with (id `null`).
pub fn parse(body: &[u8]) -> Result<Parsed, (i64, &'static str)> {
    if crate::util::nesting::check(body).is_err() {
        return Err((PARSE_ERROR, "JSON nested too deeply"));
    }
    let v: Value = serde_json::from_slice(body).map_err(|_| (PARSE_ERROR, "parse error"))?;
    match v {
        Value::Array(items) => {
            if items.is_empty() || items.len() > MAX_BATCH {
                return Err((INVALID_REQUEST, "a batch holds 1 to 64 messages"));
            }
            let messages = items.into_iter().map(message).collect::<Result<_, _>>()?;
            Ok(Parsed {
                messages,
                batch: true,
            })
        }
        v => Ok(Parsed {
            messages: vec![message(v)?],
            batch: false,
        }),
    }
}

fn message(v: Value) -> Result<Message, (i64, &'static str)> {
    let Value::Object(mut o) = v else {
        return Err((INVALID_REQUEST, "not a JSON-RPC message"));
    };
    if o.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((INVALID_REQUEST, "jsonrpc must be \"2.0\""));
    }
    let params = o.remove("params");
    if params
        .as_ref()
        .is_some_and(|p| !p.is_object() && !p.is_array())
    {
        return Err((INVALID_REQUEST, "params must be an object or an array"));
    }
    match (o.remove("method"), o.remove("id")) {
        (Some(Value::String(method)), Some(id)) => {
            if !(id.is_string() || id.is_i64() || id.is_u64()) {
                return Err((INVALID_REQUEST, "id must be a string or an integer"));
            }
            Ok(Message::Request { id, method, params })
        }
        (Some(Value::String(method)), None) => Ok(Message::Notification { method, params }),
        (Some(_), _) => Err((INVALID_REQUEST, "method must be a string")),
        (None, Some(_)) if o.contains_key("result") || o.contains_key("error") => {
            Ok(Message::Response)
        }
        (None, _) => Err((INVALID_REQUEST, "not a JSON-RPC message")),
    }
}

/// `{"jsonrpc":"2.0","id":…,"result":…}`.
pub fn result(id: &Value, result: Value) -> Value {
    let mut m = Map::with_capacity(3);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("id".into(), id.clone());
    m.insert("result".into(), result);
    Value::Object(m)
}

/// `{"jsonrpc":"2.0","id":…,"error":{"code":…,"message":…}}`.
pub fn error(id: &Value, code: i64, message: &str) -> Value {
    let mut e = Map::with_capacity(2);
    e.insert("code".into(), Value::from(code));
    e.insert("message".into(), Value::from(message));
    let mut m = Map::with_capacity(3);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("id".into(), id.clone());
    m.insert("error".into(), Value::Object(e));
    Value::Object(m)
}

/// A request to a server: `{"jsonrpc":"2.0","id":…,"method":…,"params":…}`.
pub fn request(id: &Value, method: &str, params: Option<Value>) -> Vec<u8> {
    let mut m = Map::with_capacity(4);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("id".into(), id.clone());
    m.insert("method".into(), Value::from(method));
    if let Some(p) = params {
        m.insert("params".into(), p);
    }
    serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
}

/// A notification to a server.
pub fn notification(method: &str, params: Option<Value>) -> Vec<u8> {
    let mut m = Map::with_capacity(3);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("method".into(), Value::from(method));
    if let Some(p) = params {
        m.insert("params".into(), p);
    }
    serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_notifications_and_responses() {
        let p = parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).unwrap();
        assert!(!p.batch);
        assert_eq!(
            p.messages,
            vec![Message::Request {
                id: Value::from(1),
                method: "tools/list".into(),
                params: None
            }]
        );
        let p = parse(br#"[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":"a","result":{}}]"#).unwrap();
        assert!(p.batch);
        assert_eq!(p.messages.len(), 2);
        assert!(matches!(p.messages[0], Message::Notification { .. }));
        assert_eq!(p.messages[1], Message::Response);
    }

    #[test]
    fn hostile_bodies_are_refused_with_their_code() {
        let deep = "[".repeat(100_000);
        assert_eq!(parse(deep.as_bytes()).unwrap_err().0, PARSE_ERROR);
        assert_eq!(parse(b"{").unwrap_err().0, PARSE_ERROR);
        assert_eq!(parse(b"[]").unwrap_err().0, INVALID_REQUEST);
        assert_eq!(parse(b"3").unwrap_err().0, INVALID_REQUEST);
        assert_eq!(
            parse(br#"{"jsonrpc":"1.0","id":1,"method":"x"}"#)
                .unwrap_err()
                .0,
            INVALID_REQUEST
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#)
                .unwrap_err()
                .0,
            INVALID_REQUEST
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":3}"#)
                .unwrap_err()
                .0,
            INVALID_REQUEST
        );
        let many = format!(
            "[{}]",
            vec![r#"{"jsonrpc":"2.0","method":"n"}"#; 65].join(",")
        );
        assert_eq!(parse(many.as_bytes()).unwrap_err().0, INVALID_REQUEST);
    }
}
