//! Federation: many servers behind one session. `tools/list` is the union of every server's
//! tools renamed `<server>__<tool>` (schemas unchanged) and filtered by the key's allow-list;
//! `tools/call` is checked against that allow-list at dispatch — a hidden, unknown or
//! unroutable name gets `-32602` exactly as an unknown tool and never reaches a server — then
//! routed by its prefix with the server's own name. Upstream sessions are opened lazily
//! (`initialize` + `notifications/initialized`) and opened again when a server forgot them
//! (404, a restart) or could not be reached.
//!
//! Owns: `Ctx`, the upstream session handshake, per-server calls bounded by the server's
//! `timeout_ms`, and the two federated methods. Must not: see the client's credentials (the
//! client's key is never an input here), or write to the client.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use serde_json::{json, Map, Value};

use super::client::{self, Call, Fail};
use super::jsonrpc::{self, INVALID_PARAMS, SERVER_UNAVAILABLE};
use super::servers::{Server, Servers};
use super::session::Upstream;
use super::{glob, Hub};
use crate::admit::permit::Permit;

/// The protocol revision the gateway asks its servers for.
pub const UPSTREAM_PROTOCOL: &str = "2025-06-18";
/// Pages of one server's `tools/list` followed, at most.
const MAX_PAGES: usize = 16;
/// Tools taken from one server, at most.
const MAX_TOOLS_PER_SERVER: usize = 4096;
/// Longest tool name taken from a server.
const MAX_TOOL_NAME: usize = 128;

/// What one request of one session works with.
pub struct Ctx<'a> {
    pub up: &'a crate::upstream::Client,
    pub hub: &'a Hub,
    pub servers: &'a Servers,
    pub session: &'a str,
    /// The key's `mcp_tools` as of this request (`None`: every tool).
    pub tools: Option<&'a [Box<str>]>,
    pub permit: &'a Permit,
    /// A traced request's `traceparent` line for its `tools/call` (its CLIENT span).
    pub trace: Option<&'a [u8]>,
}

/// A server's answer to one forwarded request.
pub struct Upcall {
    pub response: Value,
    /// Notifications the server sent before its answer (progress, log messages).
    pub notes: Vec<Value>,
    /// It answered as an event stream.
    pub sse: bool,
}

/// What one `tools/call` did (access log, metrics).
pub struct Called {
    pub server: Option<Box<str>>,
    pub tool: Box<str>,
    pub result: &'static str,
    /// The forwarded call's start and end and the server's (host, port) (a traced request).
    pub upstream: Option<(Instant, Instant, Box<str>, u16)>,
}

impl Ctx<'_> {
    /// `method` on `s`, bounded by the server's timeout; the session reopened once if the
    /// server forgot it.
    pub async fn call(
        &self,
        s: &Server,
        method: &'static str,
        params: Option<Value>,
        id: &Value,
    ) -> Result<Upcall, Fail> {
        let started = Instant::now();
        let body = jsonrpc::request(id, method, params);
        let r = match monoio::time::timeout(s.timeout, self.post(s, method, &body)).await {
            Ok(r) => r,
            Err(_) => Err(Fail::Timeout),
        };
        let result = match &r {
            Ok(u) if u.response.get("error").is_some() => "error",
            Ok(u) if u.response["result"]["isError"] == Value::Bool(true) => "error",
            Ok(_) => "ok",
            Err(_) => "unavailable",
        };
        self.hub
            .metrics
            .record(&s.name, method, result, Some(started.elapsed()));
        if let Err(f) = &r {
            self.hub.log(format_args!(
                "mcp: {method} to server {:?} failed: {}",
                &*s.name,
                f.text()
            ));
        }
        r
    }

    /// POST `body` (a JSON-RPC `method` request) to `s`, in a session reopened once if the
    /// server forgot it.
    async fn post(&self, s: &Server, method: &'static str, body: &[u8]) -> Result<Upcall, Fail> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let up = self.ensure(s).await?;
            let call = Call {
                method: "POST",
                session: up.id.as_deref(),
                protocol: Some(&up.protocol),
                body,
                lines: match (method, self.trace) {
                    ("tools/call", Some(l)) => l,
                    _ => b"",
                },
            };
            let ans = match client::send(
                self.up,
                s,
                &call,
                self.servers.max_response,
                Some(self.permit),
            )
            .await
            {
                Ok(a) => a,
                Err(e) => {
                    // a server that could not be reached gets a new session next time
                    self.hub.sessions.forget_upstream(self.session, &s.name);
                    return Err(e);
                }
            };
            if ans.status == 404 || (ans.status == 400 && up.id.is_some()) {
                // the server forgot the session (a restart): open a new one, once
                self.hub.sessions.forget_upstream(self.session, &s.name);
                if attempt < 2 {
                    continue;
                }
            }
            if ans.status != 200 {
                return Err(Fail::Status(ans.status));
            }
            return split(client::messages(&ans)?, ans.sse);
        }
    }

    /// The upstream session this session holds with `s`, opened now if there is none.
    async fn ensure(&self, s: &Server) -> Result<Upstream, Fail> {
        if let Some(u) = self.hub.sessions.upstream(self.session, &s.name, &s.url) {
            return Ok(u);
        }
        let params = json!({
            "protocolVersion": UPSTREAM_PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "ringgate", "version": env!("CARGO_PKG_VERSION")},
        });
        let body = jsonrpc::request(&Value::from(0), "initialize", Some(params));
        let call = Call {
            method: "POST",
            session: None,
            protocol: None,
            body: &body,
            lines: b"",
        };
        let ans = client::send(
            self.up,
            s,
            &call,
            self.servers.max_response,
            Some(self.permit),
        )
        .await?;
        if ans.status != 200 {
            return Err(Fail::Status(ans.status));
        }
        let got = split(client::messages(&ans)?, ans.sse)?;
        let protocol = got.response["result"]["protocolVersion"]
            .as_str()
            .filter(|p| !p.is_empty() && p.len() <= 32 && p.bytes().all(|c| c.is_ascii_graphic()))
            .ok_or(Fail::Garbage("initialize result"))?;
        let up = Upstream {
            server: s.name.clone(),
            url: s.url.clone(),
            id: ans.session.map(Into::into),
            protocol: protocol.into(),
        };
        let note = jsonrpc::notification("notifications/initialized", None);
        let call = Call {
            method: "POST",
            session: up.id.as_deref(),
            protocol: Some(&up.protocol),
            body: &note,
            lines: b"",
        };
        let ans = client::send(self.up, s, &call, 64 * 1024, Some(self.permit)).await?;
        if !(200..300).contains(&ans.status) {
            return Err(Fail::Status(ans.status));
        }
        self.hub.sessions.set_upstream(self.session, up.clone());
        Ok(up)
    }

    /// `tools/list`: every server's tools this key may call, renamed, in config order. A
    /// server that fails is left out (and logged); the others are listed.
    pub async fn list_tools(&self, id: &Value) -> Value {
        let mut tools = Vec::new();
        if self.tools.is_some_and(|t| t.is_empty()) {
            return json!({ "tools": tools });
        }
        let asks: Vec<_> = self
            .servers
            .list
            .iter()
            .map(|s| Box::pin(self.list_one(s, id)))
            .collect();
        let answers = JoinAll::new(asks).await;
        for (s, listed) in self.servers.list.iter().zip(answers) {
            let Ok(listed) = listed else {
                self.hub.log(format_args!(
                    "mcp: tools/list: server {:?} is missing from the list",
                    &*s.name
                ));
                continue;
            };
            for mut t in listed {
                let Some(name) = t.get("name").and_then(Value::as_str) else {
                    continue;
                };
                if name.is_empty() || name.len() > MAX_TOOL_NAME {
                    continue;
                }
                let full = format!("{}__{name}", s.name);
                if !glob::allowed(self.tools, &full) {
                    continue;
                }
                if let Some(o) = t.as_object_mut() {
                    o.insert("name".into(), Value::from(full));
                }
                tools.push(t);
            }
        }
        json!({ "tools": tools })
    }

    async fn list_one(&self, s: &Server, id: &Value) -> Result<Vec<Value>, Fail> {
        let mut out = Vec::new();
        let mut cursor: Option<Value> = None;
        for _ in 0..MAX_PAGES {
            let params = cursor.take().map(|c| json!({ "cursor": c }));
            let got = self.call(s, "tools/list", params, id).await?;
            let Some(result) = got.response.get("result") else {
                return Err(Fail::Garbage("tools/list error"));
            };
            let Some(Value::Array(page)) = result.get("tools") else {
                return Err(Fail::Garbage("tools/list result"));
            };
            out.extend(page.iter().filter(|t| t.is_object()).cloned());
            if out.len() > MAX_TOOLS_PER_SERVER {
                out.truncate(MAX_TOOLS_PER_SERVER);
                break;
            }
            match result.get("nextCursor") {
                Some(c @ Value::String(_)) => cursor = Some(c.clone()),
                _ => break,
            }
        }
        Ok(out)
    }

    /// `tools/call`: the answer to send (with the client's `id`), the server's notifications,
    /// whether it came as a stream, and what the call did.
    pub async fn call_tool(&self, id: &Value, params: Option<Value>) -> (Value, Upcall, Called) {
        let mut params = match params {
            Some(Value::Object(o)) => o,
            _ => Map::new(),
        };
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let shown: String = name.chars().take(160).collect();
        let denied = |server: Option<Box<str>>| {
            let answer = jsonrpc::error(id, INVALID_PARAMS, &format!("Unknown tool: {shown}"));
            let called = Called {
                server,
                tool: shown.as_str().into(),
                result: "denied",
                upstream: None,
            };
            (answer, empty(), called)
        };
        if name.is_empty() || !glob::allowed(self.tools, &name) {
            self.hub.metrics.record("-", "tools/call", "denied", None);
            return denied(None);
        }
        let Some((server, tool)) = name.split_once("__") else {
            self.hub.metrics.record("-", "tools/call", "denied", None);
            return denied(None);
        };
        let Some(s) = self.servers.get(server) else {
            self.hub.metrics.record("-", "tools/call", "denied", None);
            return denied(None);
        };
        params.insert("name".into(), Value::from(tool));
        let started = Instant::now();
        let r = self
            .call(s, "tools/call", Some(Value::Object(params)), id)
            .await;
        let upstream = self.trace.map(|_| {
            let ep = &s.endpoint;
            (started, Instant::now(), ep.host.as_str().into(), ep.port)
        });
        let called = |result| Called {
            server: Some(s.name.clone()),
            tool: tool.into(),
            result,
            upstream: upstream.clone(),
        };
        match r {
            Ok(mut up) => {
                let result = match &up.response {
                    r if r.get("error").is_some() => "error",
                    r if r["result"]["isError"] == Value::Bool(true) => "error",
                    _ => "ok",
                };
                let answer = with_id(std::mem::take(&mut up.response), id);
                (answer, up, called(result))
            }
            Err(f) => {
                let msg = format!("MCP server {:?} unavailable: {}", &*s.name, f.text());
                let answer = jsonrpc::error(id, SERVER_UNAVAILABLE, &msg);
                (answer, empty(), called("unavailable"))
            }
        }
    }
}

fn empty() -> Upcall {
    Upcall {
        response: Value::Null,
        notes: Vec::new(),
        sse: false,
    }
}

/// `response` answering the client's `id` (a server answers the id it was sent, which is the
/// client's; set again so that nothing else can come back).
fn with_id(mut response: Value, id: &Value) -> Value {
    if let Some(o) = response.as_object_mut() {
        o.insert("id".into(), id.clone());
        o.insert("jsonrpc".into(), Value::from("2.0"));
    }
    response
}

/// The answer among a server's messages, and the notifications before it. Requests the
/// server sends the client (sampling, elicitation) are dropped: the gateway does not relay
/// them (docs/mcp.md).
fn split(messages: Vec<Value>, sse: bool) -> Result<Upcall, Fail> {
    let mut notes = Vec::new();
    for m in messages {
        let Value::Object(o) = &m else {
            return Err(Fail::Garbage("not a JSON-RPC message"));
        };
        if o.contains_key("method") {
            if !o.contains_key("id") && notes.len() < 1024 {
                notes.push(m);
            }
            continue;
        }
        if o.contains_key("result") || o.contains_key("error") {
            return Ok(Upcall {
                response: m,
                notes,
                sse,
            });
        }
    }
    Err(Fail::Garbage("no answer"))
}

/// Polls every future until all are done; their outputs in order (one task: the futures may
/// borrow the request's state).
struct JoinAll<F: Future> {
    futs: Vec<Option<Pin<Box<F>>>>,
    out: Vec<Option<F::Output>>,
}

impl<F: Future> JoinAll<F> {
    fn new(futs: Vec<Pin<Box<F>>>) -> Self {
        let out = futs.iter().map(|_| None).collect();
        JoinAll {
            futs: futs.into_iter().map(Some).collect(),
            out,
        }
    }
}

impl<F: Future> Future for JoinAll<F>
where
    F::Output: Unpin,
{
    type Output = Vec<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut pending = false;
        for (slot, out) in this.futs.iter_mut().zip(this.out.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *out = Some(v);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(this.out.drain(..).flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_finds_the_answer_after_notifications() {
        let msgs = vec![
            json!({"jsonrpc":"2.0","method":"notifications/progress","params":{}}),
            json!({"jsonrpc":"2.0","id":9,"method":"sampling/createMessage"}),
            json!({"jsonrpc":"2.0","id":1,"result":{"content":[]}}),
        ];
        let u = split(msgs, true).unwrap();
        assert_eq!(u.notes.len(), 1);
        assert_eq!(u.response["id"], 1);
        assert!(split(vec![json!({"jsonrpc":"2.0","method":"x"})], false).is_err());
        assert!(split(vec![json!(3)], false).is_err());
        assert_eq!(
            with_id(json!({"id":"other","result":{}}), &json!(5))["id"],
            5
        );
    }
}
