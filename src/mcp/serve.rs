//! `/mcp` on the main listener: MCP Streamable HTTP toward clients. `POST` carries JSON-RPC
//! requests, notifications and responses (answered `application/json`, or
//! `text/event-stream` when a server streamed notifications before its answer and the
//! client's `Accept` allows it; notifications and responses alone get 202); `GET` (a server-to-client stream) is 405,
//! as the spec allows; `DELETE` ends the session. The gateway issues its own
//! `Mcp-Session-Id` on `initialize` and negotiates revision 2025-03-26 or 2025-06-18.
//!
//! Called by `pipeline` after the edge checks (Origin: 403) and the key's admission (401,
//! 429): this module never sees a request that did not pass them. The body is read within the
//! request's permit, as model requests are.
//!
//! `serve` returns its answer (`Reply`: status, content type, header lines, body) and the
//! pipeline writes it through `answer::Sink`, the one writer of client bytes; this module does not
//! name the answer stage (`forward` holds `mcp::Servers`, so that import would close a cycle).
//! Its one write of its own is the interim `100 Continue` (`http::expect`, as every body reader).
//!
//! Owns: the HTTP side of MCP (status codes, session header, answer framing) and method
//! dispatch. Must not: forward a client header (or the client's key) to a server, or write an
//! answer to the client itself.

use std::borrow::Cow;
use std::time::Instant;

use serde_json::{json, Value};

use super::federate::{Called, Ctx};
use super::jsonrpc::{self, Message, INVALID_REQUEST, METHOD_NOT_FOUND};
use super::session::Missing;
use crate::admit::Admission;
use crate::error::{Error, Kind};
use crate::governance::Grant;
use crate::http::body::Bound;
use crate::http::conn::ClientConn;
use crate::http::conn::Limits;
use crate::http::{BodyFraming, Method, RequestHead};
use crate::observe::trace::{McpCall, Trace};
use crate::upstream::Client;

/// What one `/mcp` request reads of its shard (built by the pipeline; MCP never sees the shard).
pub struct Env<'a> {
    pub hub: &'a super::Hub,
    pub servers: &'a super::Servers,
    pub limits: &'a Limits,
    pub admission: &'a Admission,
    pub upstream: &'a Client,
    /// A traced request's `traceparent` line for the `tools/call` it forwards (naming its
    /// CLIENT span, `telemetry::Request::tool_call`).
    pub trace: Option<Vec<u8>>,
}

/// Revisions the gateway speaks to clients, oldest first.
pub const PROTOCOLS: [&str; 2] = ["2025-03-26", "2025-06-18"];

/// What the head says that MCP needs, read while it is in the buffer.
#[derive(Debug, Default)]
pub struct McpHead {
    pub session: Option<Vec<u8>>,
    /// `Accept` names `text/event-stream` (or `*/*`).
    pub sse_ok: bool,
    /// `Accept` names `application/json` (or `*/*`, or there is none).
    pub json_ok: bool,
}

impl McpHead {
    /// Read from the raw head (`buf[..head.len]`): two header lookups, bounded by the head.
    pub fn of(head: &RequestHead, buf: &[u8]) -> McpHead {
        let raw = buf.get(..head.len).unwrap_or_default();
        let mut out = McpHead::default();
        let mut accept = None;
        for line in raw.split(|&c| c == b'\n').skip(1) {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(i) = memchr::memchr(b':', line) else {
                continue;
            };
            let (name, value) = (&line[..i], crate::http::head::trim(&line[i + 1..]));
            if name.eq_ignore_ascii_case(b"mcp-session-id") {
                out.session = Some(value.to_vec());
            } else if name.eq_ignore_ascii_case(b"accept") {
                accept = Some(value);
            }
        }
        let has =
            |v: &[u8], what: &[u8]| v.windows(what.len()).any(|w| w.eq_ignore_ascii_case(what));
        match accept {
            None => out.json_ok = true,
            Some(a) => {
                let any = has(a, b"*/*");
                out.sse_ok = any || has(a, b"text/event-stream");
                out.json_ok = any || has(a, b"application/json");
            }
        }
        out
    }
}

/// One `/mcp` answer, whole, for the pipeline to write through `answer::Sink` (Content-Length
/// framed; the connection's keep-alive is the request's).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static [u8],
    /// Extra header lines, each CRLF-terminated.
    pub extra: Cow<'static, [u8]>,
    pub body: Vec<u8>,
}

impl Reply {
    fn json(status: u16, v: &Value) -> Reply {
        Reply {
            status,
            content_type: b"application/json",
            extra: Cow::Borrowed(b""),
            body: serde_json::to_vec(v).unwrap_or_default(),
        }
    }

    /// A JSON answer with no body (202, a session's DELETE).
    fn empty(status: u16) -> Reply {
        Reply {
            status,
            content_type: b"application/json",
            extra: Cow::Borrowed(b""),
            body: Vec::new(),
        }
    }
}

/// The 405 body of a method other than POST and DELETE.
const NOT_ALLOWED: &[u8] = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Method Not Allowed: this endpoint takes POST and DELETE (no server-to-client stream)"}}"#;

/// One `/mcp` request (its MCP head facts read here, while the head is in the buffer): its
/// answer, for the caller to write (`None`: the client left before its body was read — the
/// `100 Continue` it asked for could not be written). `Err`: a failure answered in OpenAI's
/// shape by the pipeline (admission 413/503, a body that could not be read, sessions full).
pub async fn serve(
    conn: &mut ClientConn,
    head: &RequestHead,
    env: &Env<'_>,
    grant: Option<&Grant<'_>>,
    trace: &mut Trace,
    keep: &mut bool,
) -> Result<Option<Reply>, Error> {
    let mh = McpHead::of(head, &conn.buf);
    let owner = grant.and_then(|g| g.key_name().map(|n| n.to_string()));
    let owner = owner.as_deref();
    let hub = env.hub;
    let wt = env.limits.write_timeout;
    match head.method {
        Method::Post => {}
        Method::Delete if head.body == BodyFraming::None => {
            let Some(id) = &mh.session else {
                return Ok(Some(no_session()));
            };
            let ups = match hub.sessions.remove(id, owner) {
                Ok(u) => u,
                Err(m) => return Ok(Some(missing(m))),
            };
            trace.mcp = Some(Box::new(McpCall {
                method: "session/delete".into(),
                ..McpCall::default()
            }));
            // close the servers' sessions too (best effort, each within its timeout)
            for u in ups {
                let (Some(s), Some(uid)) = (env.servers.get(&u.server), u.id.as_deref()) else {
                    continue;
                };
                let call = super::client::Call {
                    method: "DELETE",
                    session: Some(uid),
                    protocol: Some(&u.protocol),
                    body: b"",
                    lines: b"",
                };
                let send = super::client::send(env.upstream, s, &call, 64 * 1024, None);
                let _ = monoio::time::timeout(s.timeout, send).await;
            }
            return Ok(Some(Reply::empty(200)));
        }
        _ => {
            *keep = *keep && head.body == BodyFraming::None;
            return Ok(Some(Reply {
                status: 405,
                content_type: b"application/json",
                extra: Cow::Borrowed(b"allow: POST, DELETE\r\n"),
                body: NOT_ALLOWED.to_vec(),
            }));
        }
    }

    // admit and read the body, within the request's permit (as model requests)
    let declared = match head.body {
        BodyFraming::Length(n) => n,
        _ => 0,
    };
    let max_body = env.admission.max_body();
    let permit = env.admission.admit(declared).await.map_err(|r| match r {
        crate::admit::Reject::BodyTooLarge => Error::new(
            Kind::BodyTooLarge,
            format!("request body of {declared} bytes is over the {max_body}-byte limit"),
        ),
        other => Error::overloaded(other.as_str()),
    })?;
    if !crate::http::expect::send_continue(conn, head, wt).await {
        return Ok(None);
    }
    // the head's bytes stay in the buffer until the request ends (`http::Request`)
    let bound = Bound {
        max: max_body,
        deadline: Instant::now() + env.limits.body_timeout,
        permit: Some(&permit),
    };
    let body = conn.read_body(head, bound).await?;
    *keep = head.keep_alive;
    trace.bytes_in = (head.len + body.len()) as u64;
    let parsed = match jsonrpc::parse(&body) {
        Ok(p) => p,
        Err((code, msg)) => {
            let v = jsonrpc::error(&Value::Null, code, msg);
            return Ok(Some(Reply::json(400, &v)));
        }
    };
    drop(body);
    let now = Instant::now();

    // initialize: a new session (alone in its POST)
    if let [Message::Request { id, method, params }] = parsed.messages.as_slice() {
        if method == "initialize" {
            let asked = params
                .as_ref()
                .and_then(|p| p.get("protocolVersion"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let protocol = PROTOCOLS
                .iter()
                .find(|p| **p == asked)
                .copied()
                .unwrap_or(PROTOCOLS[1]);
            let Some(sid) = hub.sessions.create(owner, protocol, now) else {
                return Err(Error::overloaded("too many open MCP sessions").retry_after(5));
            };
            trace.mcp = Some(Box::new(McpCall {
                method: "initialize".into(),
                result: "ok",
                ..McpCall::default()
            }));
            let result = json!({
                "protocolVersion": protocol,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": "ringgate", "version": env!("CARGO_PKG_VERSION")},
            });
            let v = jsonrpc::result(id, result);
            let mut extra = b"mcp-session-id: ".to_vec();
            extra.extend_from_slice(sid.as_bytes());
            extra.extend_from_slice(b"\r\n");
            return Ok(Some(Reply {
                extra: Cow::Owned(extra),
                ..Reply::json(200, &v)
            }));
        }
        if method == "server/discover" && mh.session.is_none() {
            // the stateless revision's probe: not spoken here (clients fall back to initialize)
            let v = jsonrpc::error(id, METHOD_NOT_FOUND, "Method not found: server/discover");
            return Ok(Some(Reply::json(200, &v)));
        }
    }
    let Some(sid) = mh.session.as_deref() else {
        return Ok(Some(no_session()));
    };
    if let Err(m) = hub.sessions.touch(sid, owner, now) {
        return Ok(Some(missing(m)));
    }
    let sid = std::str::from_utf8(sid).unwrap_or_default();
    let tools = grant.and_then(|g| g.mcp_tools());
    let ctx = Ctx {
        up: env.upstream,
        hub,
        servers: env.servers,
        session: sid,
        tools: tools.as_deref(),
        permit: &permit,
        trace: env.trace.as_deref(),
    };
    let mut answers = Vec::new();
    let mut notes = Vec::new();
    let mut streamed = false;
    for m in parsed.messages {
        let Message::Request { id, method, params } = m else {
            continue;
        };
        let (answer, call) = match method.as_str() {
            "tools/call" => {
                let (answer, up, called) = ctx.call_tool(&id, params).await;
                notes.extend(up.notes);
                streamed |= up.sse;
                (answer, Some(called))
            }
            "tools/list" => (jsonrpc::result(&id, ctx.list_tools(&id).await), None),
            "ping" | "logging/setLevel" => (jsonrpc::result(&id, json!({})), None),
            "initialize" => (
                jsonrpc::error(&id, INVALID_REQUEST, "this session is already initialized"),
                None,
            ),
            other => (
                jsonrpc::error(
                    &id,
                    METHOD_NOT_FOUND,
                    &format!("Method not found: {}", short(other)),
                ),
                None,
            ),
        };
        let first_call = trace.mcp.as_ref().is_none_or(|c| c.tool.is_none());
        match call {
            Some(c) if first_call => trace.mcp = Some(Box::new(mcp_call(c))),
            None if trace.mcp.is_none() => {
                let result = if answer.get("error").is_some() {
                    "error"
                } else {
                    "ok"
                };
                trace.mcp = Some(Box::new(McpCall {
                    method: short(&method).into(),
                    result,
                    ..McpCall::default()
                }));
            }
            _ => {}
        }
        answers.push(answer);
    }
    if answers.is_empty() {
        // notifications and responses only
        if trace.mcp.is_none() {
            trace.mcp = Some(Box::new(McpCall {
                method: "notification".into(),
                result: "ok",
                ..McpCall::default()
            }));
        }
        return Ok(Some(Reply::empty(202)));
    }
    // an event stream only to carry a server's notifications along (or for a client that takes
    // nothing else): one JSON answer is what every client reads with the least buffering
    let sse = mh.sse_ok && ((streamed && !notes.is_empty()) || !mh.json_ok);
    if sse {
        let mut out = Vec::new();
        for v in notes.iter().chain(answers.iter()) {
            out.extend_from_slice(b"event: message\ndata: ");
            let _ = serde_json::to_writer(&mut out, v);
            out.extend_from_slice(b"\n\n");
        }
        return Ok(Some(Reply {
            status: 200,
            content_type: b"text/event-stream",
            extra: Cow::Borrowed(b"cache-control: no-cache\r\n"),
            body: out,
        }));
    }
    let v = match parsed.batch {
        true => Value::Array(answers),
        false => answers.pop().unwrap_or(Value::Null),
    };
    Ok(Some(Reply::json(200, &v)))
}

fn mcp_call(c: Called) -> McpCall {
    McpCall {
        method: "tools/call".into(),
        server: c.server,
        tool: Some(c.tool),
        result: c.result,
        upstream: c.upstream,
    }
}

/// A method name for logs and errors (clients choose it: bounded).
fn short(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// A JSON-RPC error answer with no id (the request could not be taken as one).
fn rpc_error(status: u16, msg: &str) -> Reply {
    Reply::json(status, &jsonrpc::error(&Value::Null, INVALID_REQUEST, msg))
}

/// A request that needs a session named none: 400.
fn no_session() -> Reply {
    rpc_error(400, "Bad Request: Mcp-Session-Id header is required")
}

fn missing(m: Missing) -> Reply {
    match m {
        Missing::NotFound => rpc_error(404, "Session not found"),
        Missing::Malformed => rpc_error(400, "Bad Request: malformed Mcp-Session-Id"),
    }
}
