//! One surface request, top to bottom (the pipeline calls `serve` after the key check, before
//! any body byte is read): what the head says → admission (`max_body` for JSON, `max_upload`
//! and one window for streamed bodies) → the bytes routing needs (none, the multipart prefix,
//! the JSON body) → the provider → the upstream request (held, or streamed through `pump`)
//! → the answer, relayed piece by piece (binary answers such as speech audio and file contents
//! are never held whole).
//!
//! Every answer byte goes through `answer::Sink` (a learned-id answer whole, any other answer in
//! pieces); a failure before the first byte is returned to the pipeline, which answers it through
//! the same sink in OpenAI's shape.
//!
//! Owns: the order of those steps for the surface. Must not: translate, retry, hold a streamed
//! body, or write to the client other than through `answer::Sink` (the interim `100 Continue`
//! aside: `http::expect`, as every body reader).

use std::rc::Rc;
use std::time::Instant;

use super::pump::{pump, BodyReader, Stopped, WINDOW};
use super::{ids, Body, Call};
use crate::admit::{Permit, Reject};
use crate::answer::outcome::{gone, Outcome};
use crate::answer::{Sink, Whole};
use crate::config::provider::ProviderKind;
use crate::config::surface::serves_surface;
use crate::error::{Error, Kind};
use crate::forward::live::Routing;
use crate::forward::report::report;
use crate::forward::Env;
use crate::governance::Grant;
use crate::http::conn::ClientConn;
use crate::http::multipart::{self, Scan};
use crate::http::response::{write_chunk, Framing};
use crate::http::{BodyFraming, Method, RequestHead};
use crate::observe::trace::Trace;
use crate::route::{Provider, Route};
use crate::upstream::headers::ClientHeaders;
use crate::upstream::upload::{BodyLen, Outgoing};
use crate::upstream::Exchange;

/// Bytes of a multipart body looked through for its `model` field.
pub const PREFIX: usize = 64 << 10;
/// Largest answer read whole to learn the ids it issues (file and batch objects are ~1 KiB).
const ID_ANSWER: usize = 256 << 10;
/// Bytes of an answer relayed per write.
const PIECE: usize = 64 << 10;

/// What the request head says, copied out while the head is in the connection buffer (`serve`
/// drops the head from it before streaming a body).
pub struct SurfaceHead {
    method: Method,
    id: Option<String>,
    query: Option<String>,
    content_type: Option<Vec<u8>>,
    client_headers: ClientHeaders,
}

impl SurfaceHead {
    /// The method, id, query, Content-Type and forwarded client headers of `head` in `buf`.
    pub fn of(
        head: &RequestHead,
        buf: &[u8],
        id: crate::http::request_id::RequestId,
    ) -> Result<SurfaceHead, Error> {
        let path = head.path(buf);
        let query = match head.query(buf) {
            None | Some(b"") => None,
            Some(q) => Some(check_query(q)?),
        };
        let raw = buf.get(..head.len).unwrap_or_default();
        Ok(SurfaceHead {
            method: head.method,
            id: super::id_in(path)?.map(String::from),
            query,
            content_type: content_type(raw).map(<[u8]>::to_vec),
            client_headers: ClientHeaders::capture(head, buf, id)?,
        })
    }
}

/// Where the request goes.
struct Dest<'r> {
    provider: &'r Rc<Provider>,
    /// The model route and deployment index (`None`: the call named no model).
    routed: Option<(&'r Route, usize)>,
}

/// What a surface call is served with: the shard's forwarding environment, the routing the
/// request started with, and the caller's grant (keyed requests).
pub struct Ctx<'a, 'g> {
    pub env: &'a Env<'a>,
    pub routing: &'a Routing,
    pub grant: Option<&'a mut Grant<'g>>,
}

/// Serve one surface call (its head facts read first, while the head is in the buffer). Errors
/// before the answer started come back to the pipeline's sink (OpenAI's shape); `keep` turns
/// true once the body has been read to its end.
pub async fn serve(
    conn: &mut ClientConn,
    head: &RequestHead,
    ctx: Ctx<'_, '_>,
    call: Call,
    trace: &mut Trace,
    keep: &mut bool,
) -> Result<Outcome, Error> {
    let Ctx {
        env,
        routing,
        grant,
    } = ctx;
    let asked = SurfaceHead::of(head, &conn.buf, conn.request_id)?;
    let client_headers = &asked.client_headers;
    let rule = call.body(asked.method);
    let streamed = rule != Body::Json;
    // admission, on the head: 413 over the limit before a body byte is read
    let declared = match head.body {
        BodyFraming::Length(n) => n,
        _ => 0,
    };
    let adm = env.admission;
    let permit = match streamed {
        true => adm.admit_upload(declared, WINDOW as u64).await,
        false => adm.admit(declared).await,
    };
    let limit = if streamed {
        adm.max_upload()
    } else {
        adm.max_body()
    };
    let permit = permit.map_err(|r| rejection(r, declared, limit))?;
    if !crate::http::expect::send_continue(conn, head, env.limits.write_timeout).await {
        return Ok(gone(env.metrics, 499));
    }
    if head.body != BodyFraming::None {
        // the body is streamed from the buffer's start: the head's bytes go first
        conn.drop_head();
    }
    trace.bytes_in = head.len as u64;
    let mut reader = BodyReader::new(head.body, limit, env.limits.body_timeout);
    let body_start = Instant::now();

    // the bytes routing needs, and the model they name
    let mut model: Option<(String, Option<std::ops::Range<usize>>)> = None;
    let mut held = Vec::new();
    let mut input_file = None;
    match rule {
        Body::Json => {
            read_whole(conn, &mut reader, &mut held, &permit, limit).await?;
            let named = matches!(call, Call::Moderations)
                .then(|| serde_json::from_slice::<Named>(&held).is_ok_and(|n| n.model.is_some()));
            if call == Call::Batches {
                input_file = ids::input_file_id(&held);
            } else if named != Some(false) {
                let f = crate::dialect::extract::routing_fields(&held)?;
                model = Some((f.model, Some(f.model_span)));
            }
        }
        Body::Multipart => {
            let ct = asked.content_type.as_deref().unwrap_or_default();
            let boundary = multipart::boundary(ct)
                .map_err(|why| bad(format!("the Content-Type {why}")))?
                .to_vec();
            let (name, range) =
                multipart_model(conn, &mut reader, &mut held, &boundary, &permit).await?;
            model = Some((name, Some(range)));
        }
        Body::Stream => {}
    }
    if reader.done() {
        *keep = head.keep_alive;
    }

    // where it goes
    let id = asked.id.as_deref().or(input_file.as_deref());
    let dest = destination(routing, call, model.as_ref().map(|m| m.0.as_str()), id)?;
    let provider = dest.provider;
    if let Some((route, d)) = dest.routed {
        trace.route = Some(route.index as u32);
        trace.served = Some((route.index as u32, d as u32));
        if let (Some(g), Some((m, _))) = (grant, &model) {
            g.check_model_name(m, route)?;
        }
    }
    if let Some((m, _)) = &model {
        trace.model = Some(m.as_str().into());
    }
    trace.attempts = 1;
    conn.resp_headers
        .extend_from_slice(b"x-ringgate-provider: ");
    conn.resp_headers
        .extend_from_slice(provider.name.as_bytes());
    conn.resp_headers
        .extend_from_slice(b"\r\nx-ringgate-attempts: 1\r\n");

    // the model as the upstream knows it (a route's `upstream_model`), spliced in place
    let mut len = match head.body {
        // a bodyless POST (a batch cancel) still says so: some servers want a length
        BodyFraming::None if asked.method == Method::Post => BodyLen::Length(0),
        BodyFraming::None => BodyLen::None,
        BodyFraming::Length(n) => BodyLen::Length(n),
        BodyFraming::Chunked => BodyLen::Chunked,
    };
    if let (Some((route, d)), Some((_, Some(span)))) = (dest.routed, &model) {
        if let Some(up) = route.deployments[d].upstream_model.as_deref() {
            let quoted = rule == Body::Json;
            let new = match quoted {
                true => format!("\"{up}\""),
                false => up.to_string(),
            };
            let old = span.len() as u64;
            held.splice(span.clone(), new.bytes());
            let mut charged = 0;
            permit
                .charge_capacity(&held, &mut charged)
                .map_err(|r| Error::overloaded(r.as_str()))?;
            len = match len {
                BodyLen::Length(n) => BodyLen::Length(n.saturating_sub(old) + new.len() as u64),
                other => other,
            };
        }
    }
    // a body read whole (JSON, or a multipart body that fit in its prefix) goes with its length
    let whole = rule == Body::Json || reader.done();
    if whole && head.body != BodyFraming::None {
        len = BodyLen::Length(held.len() as u64);
    }

    // the upstream request
    let endpoint = provider.endpoint.as_ref().ok_or_else(|| {
        Error::new(
            Kind::Internal,
            format!("provider {} has no base_url", provider.name),
        )
    })?;
    let path = upstream_path(
        provider.base_path(),
        call,
        asked.id.as_deref(),
        &asked.query,
    );
    let key = match routing
        .forward
        .keys(provider.index)
        .map(|k| k.pick(Instant::now(), 0))
    {
        Some(crate::forward::keys::KeyPick::Ready(k)) => k,
        _ => 0,
    };
    let lines = client_headers.upstream_lines(provider.kind, provider.key_auth(key));
    let out = Outgoing {
        endpoint,
        method: asked.method.as_str(),
        path: &path,
        // a JSON body's type when the client named none (OpenAI refuses an untyped body)
        content_type: match (&asked.content_type, rule) {
            (None, Body::Json) if !held.is_empty() => Some(&b"application/json"[..]),
            (ct, _) => ct.as_deref(),
        },
        body: len,
        headers: &lines,
        first_byte_timeout: None,
    };
    let open_start = Instant::now();
    let pname = provider.name.as_str();
    let opened = if whole {
        env.upstream
            .send_held(&out, &held)
            .await
            .map(|ex| (ex, true))
    } else {
        stream_up(conn, env, &mut reader, &out, held, &permit).await
    };
    trace.client_body = body_start.elapsed();
    trace.bytes_in = trace.bytes_in.saturating_add(reader.got);
    let (mut ex, body_done) = opened.map_err(|e| report(env, &conn.request_id, pname, &e))?;
    if body_done {
        *keep = head.keep_alive;
    }
    let open_end = Instant::now();
    trace.upstream = open_end.saturating_duration_since(open_start);
    if ex.head.status >= 500 {
        crate::forward::report::report_status(env, &conn.request_id, pname, ex.head.status);
    }
    let learns = matches!(
        (call, asked.method),
        (Call::Files | Call::Batches, Method::Post) | (Call::Batch | Call::BatchCancel, _)
    );
    // every byte of the answer goes through the sink (`answer::Sink`)
    let outcome = if learns && (200..300).contains(&ex.head.status) {
        relay_learning(conn, env, &mut ex, &permit, pname, *keep).await?
    } else {
        relay(conn, Sink::of(env, *keep), &mut ex, &permit)
            .await
            .map_err(|e| report(env, &conn.request_id, pname, &e))?
    };
    trace.upstream += ex.waited;
    trace.first_piece = ex.first_piece_at(open_end);
    drop(permit);
    Ok(outcome)
}

#[derive(serde::Deserialize)]
struct Named<'a> {
    #[serde(borrow, default)]
    model: Option<&'a serde_json::value::RawValue>,
}

/// Longest query string passed on (`?purpose=batch&limit=20&after=file-…&order=desc`).
const MAX_QUERY: usize = 1024;

/// A list call's query, passed on only when every byte is RFC 3986 unreserved, `=`, `&` or a
/// valid `%XX` escape (nothing else can change what the upstream line means).
fn check_query(q: &[u8]) -> Result<String, Error> {
    let mut i = 0;
    let ok = q.len() <= MAX_QUERY
        && loop {
            let Some(&b) = q.get(i) else { break true };
            if b == b'%' {
                let hex = q.get(i + 1..i + 3).unwrap_or_default();
                if hex.len() != 2 || !hex.iter().all(u8::is_ascii_hexdigit) {
                    break false;
                }
                i += 3;
            } else if b.is_ascii_alphanumeric() || b"-._~=&".contains(&b) {
                i += 1;
            } else {
                break false;
            }
        };
    match std::str::from_utf8(q) {
        Ok(s) if ok => Ok(s.to_string()),
        _ => Err(bad(
            "the query string may hold only A-Z a-z 0-9 - . _ ~ = & and %XX escapes".into(),
        )),
    }
}

/// The request's `Content-Type` value, from its raw head.
fn content_type(raw: &[u8]) -> Option<&[u8]> {
    let mut headers = [httparse::EMPTY_HEADER; crate::http::head::MAX_HEADERS_CAP];
    let mut req = httparse::Request::new(&mut headers);
    req.parse(raw).ok()?;
    let v = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-type"))?
        .value;
    Some(crate::http::head::trim(v))
}

/// Read a JSON body whole (within `limit`, its growth charged to the permit).
async fn read_whole(
    conn: &mut ClientConn,
    reader: &mut BodyReader,
    out: &mut Vec<u8>,
    permit: &Permit,
    limit: u64,
) -> Result<(), Error> {
    let mut charged = 0;
    while !reader.done() {
        let room = (limit as usize)
            .min(out.len().saturating_add(PIECE))
            .max(out.len() + 64);
        reader.read(conn, out, room).await?;
        permit
            .charge_capacity(out, &mut charged)
            .map_err(|r| Error::overloaded(r.as_str()))?;
    }
    Ok(())
}

/// Read the multipart prefix until its `model` field is in it: the model and its byte range.
async fn multipart_model(
    conn: &mut ClientConn,
    reader: &mut BodyReader,
    prefix: &mut Vec<u8>,
    boundary: &[u8],
    permit: &Permit,
) -> Result<(String, std::ops::Range<usize>), Error> {
    prefix.reserve_exact(PREFIX);
    let mut charged = 0;
    permit
        .charge_capacity(prefix, &mut charged)
        .map_err(|r| Error::overloaded(r.as_str()))?;
    let missing = || {
        bad(format!(
            "the multipart body has no \"model\" field before its file within its first {} KiB (send the model field first)",
            PREFIX >> 10
        ))
    };
    loop {
        let complete = reader.done();
        match multipart::find_field(prefix, boundary, b"model", complete) {
            Ok(Scan::Found(r)) => {
                let m = std::str::from_utf8(&prefix[r.clone()]).map_err(|_| missing())?;
                crate::http::target::model_id(m).map_err(|why| {
                    bad(format!(
                        "\"model\" is not a valid model name: it {why}; {}",
                        crate::http::target::MODEL_RULE
                    ))
                })?;
                return Ok((m.to_string(), r));
            }
            Ok(Scan::Missing) => return Err(missing()),
            Ok(Scan::More) if complete || prefix.len() >= PREFIX => return Err(missing()),
            Ok(Scan::More) => {}
            Err(why) => return Err(bad(format!("the multipart body is malformed: {why}"))),
        }
        reader.read(conn, prefix, PREFIX).await?;
    }
}

/// Which provider serves the call: the model's route, the id's issuer, else the files
/// provider.
fn destination<'r>(
    routing: &'r Routing,
    call: Call,
    model: Option<&str>,
    id: Option<&str>,
) -> Result<Dest<'r>, Error> {
    let routes = &routing.routes;
    if let Some(m) = model {
        let route = routes.resolve(m).ok_or_else(|| {
            Error::new(
                Kind::UnknownModel,
                format!("The model `{m}` does not exist or is not routed by this gateway"),
            )
        })?;
        let fits = |p: &Provider| match call {
            // rerank is an engine endpoint (vLLM, llama.cpp, TEI…), not OpenAI's
            Call::Rerank => p.kind == ProviderKind::OpenAiCompatible,
            _ => serves_surface(p.kind),
        };
        let (d, dep) = route
            .deployments
            .iter()
            .enumerate()
            .find(|(_, d)| fits(&d.provider))
            .ok_or_else(|| {
                bad(format!(
                    "the model `{m}` has no deployment on a provider that serves {}: this endpoint passes through to kind = \"{}\" providers",
                    call.endpoint().as_str(),
                    if call == Call::Rerank { "openai-compatible" } else { "openai\" or \"openai-compatible" }
                ))
            })?;
        return Ok(Dest {
            provider: &dep.provider,
            routed: Some((route, d)),
        });
    }
    let providers = routes.providers();
    let issuer = id.and_then(ids::issuer).and_then(|name| {
        providers
            .iter()
            .find(|p| *p.name == *name && serves_surface(p.kind))
    });
    if let Some(p) = issuer {
        return Ok(Dest {
            provider: p,
            routed: None,
        });
    }
    let fallback = routes.files_provider.and_then(|i| providers.get(i));
    match fallback {
        Some(p) => Ok(Dest {
            provider: p,
            routed: None,
        }),
        None => {
            let n = providers.iter().filter(|p| serves_surface(p.kind)).count();
            Err(bad(match n {
                0 => "no provider of kind \"openai\" or \"openai-compatible\" is configured for this endpoint".into(),
                _ => "several OpenAI-style providers are configured: set [routing] files_provider to the one that serves requests naming no model".to_string(),
            }))
        }
    }
}

/// The upstream request target: the provider's base path, the call's path, its id, the query.
fn upstream_path(base: &str, call: Call, id: Option<&str>, query: &Option<String>) -> String {
    let mut p = String::with_capacity(base.len() + 64);
    p.push_str(base);
    let (head, tail) = match call {
        Call::Files => ("/files", ""),
        Call::File => ("/files/", ""),
        Call::FileContent => ("/files/", "/content"),
        Call::Batches => ("/batches", ""),
        Call::Batch => ("/batches/", ""),
        Call::BatchCancel => ("/batches/", "/cancel"),
        Call::Transcriptions => ("/audio/transcriptions", ""),
        Call::Translations => ("/audio/translations", ""),
        Call::Speech => ("/audio/speech", ""),
        Call::ImageGenerations => ("/images/generations", ""),
        Call::ImageEdits => ("/images/edits", ""),
        Call::Moderations => ("/moderations", ""),
        Call::Rerank => ("/rerank", ""),
    };
    p.push_str(head);
    if head.ends_with('/') {
        // checked to A-Z a-z 0-9 _ - (`surface::check_id`): one segment as it is
        p.push_str(id.unwrap_or_default());
    }
    p.push_str(tail);
    if let Some(q) = query {
        p.push('?');
        p.push_str(q);
    }
    p
}

/// Send a streamed body: the bytes read so far (`first`), then the rest as it arrives. Returns
/// the exchange and whether the client's body was read to its end.
async fn stream_up<'c>(
    conn: &mut ClientConn,
    env: &Env<'c>,
    reader: &mut BodyReader,
    out: &Outgoing<'_>,
    first: Vec<u8>,
    permit: &Permit,
) -> Result<(Exchange<'c>, bool), Error> {
    let mut up = env.upstream.open_upload(out, &first).await?;
    drop(first);
    let window = Vec::with_capacity(WINDOW);
    let mut charged = 0;
    permit
        .charge_capacity(&window, &mut charged)
        .map_err(|r| Error::overloaded(r.as_str()))?;
    match pump(conn, reader, &mut up, window).await {
        Ok(()) => Ok((up.finish(true).await?, true)),
        Err(Stopped::Client(e)) => Err(e),
        // the upstream stopped reading: relay its answer if it gave one (then close)
        Err(Stopped::Upstream(e)) => match up.finish(false).await {
            Ok(ex) => Ok((ex, false)),
            Err(_) => Err(e),
        },
    }
}

/// Relay the answer as it comes through the sink: its status, content type and forwarded
/// headers, the body in pieces (its length kept when the upstream gave one, else chunked).
/// `Err`: nothing went out yet (the piece buffer refused, or the upstream broke off before the
/// first piece) — the caller answers it.
async fn relay(
    conn: &mut ClientConn,
    sink: Sink<'_>,
    ex: &mut Exchange<'_>,
    permit: &Permit,
) -> Result<Outcome, Error> {
    let status = ex.head.status;
    let framing = match ex.head.framing {
        crate::upstream::RespFraming::Length(n) => Framing::Length(n as usize),
        _ => Framing::Chunked,
    };
    let chunked = framing == Framing::Chunked;
    // the piece buffer is charged before a byte goes out: a refusal is still a whole 503
    let mut piece = Vec::with_capacity(PIECE);
    permit
        .charge_capacity(&piece, &mut 0)
        .map_err(|r| Error::overloaded(r.as_str()))?;
    let ct = std::mem::take(&mut ex.head.content_type);
    let mut out = conn.head(status, &ct, framing, sink.keep_alive, &ex.head.forward);
    let mut sent = false;
    loop {
        piece.clear();
        let more = match ex.next_upto(&mut piece, PIECE).await {
            Ok(m) => m,
            // the upstream broke off before a byte went out: the caller answers the failure
            Err(e) if !sent => {
                conn.out = out;
                return Err(e);
            }
            // the upstream broke off mid-answer: the client's answer ends short (closed)
            Err(_) => {
                conn.out = out;
                return Ok(Outcome {
                    status,
                    keep_alive: false,
                });
            }
        };
        match chunked {
            true => write_chunk(&mut out, &piece),
            false => out.extend_from_slice(&piece),
        }
        if chunked && !more {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        if !more && !out.is_empty() {
            // the answer's last bytes
            return Ok(sink.written(conn, out, status).await);
        }
        if !more {
            // its last piece went out already (a length-framed answer ends on a full piece)
            conn.out = out;
            return Ok(Outcome {
                status,
                keep_alive: sink.keep_alive,
            });
        }
        if !out.is_empty() {
            sent = true;
            out = match sink.part(conn, out, status).await {
                Ok(mut back) => {
                    back.clear();
                    back
                }
                Err(gone) => return Ok(gone),
            };
        }
    }
}

/// Read a small id-carrying answer whole, learn its ids, write it whole through the sink.
async fn relay_learning(
    conn: &mut ClientConn,
    env: &Env<'_>,
    ex: &mut Exchange<'_>,
    permit: &Permit,
    provider: &str,
    keep: bool,
) -> Result<Outcome, Error> {
    let status = ex.head.status;
    let mut body = Vec::new();
    // nothing was written yet: a broken or oversized answer is a 502 in OpenAI's shape
    ex.read_to_end(&mut body, ID_ANSWER)
        .await
        .map_err(|e| report(env, &conn.request_id, provider, &e))?;
    permit
        .charge_capacity(&body, &mut 0)
        .map_err(|r| Error::overloaded(r.as_str()))?;
    ids::learn_from(&body, provider);
    let ct = std::mem::take(&mut ex.head.content_type);
    let w = Whole {
        status,
        content_type: &ct,
        extra: &ex.head.forward,
        body: &body,
    };
    Ok(Sink::of(env, keep).whole(conn, w).await)
}

fn bad(msg: String) -> Error {
    Error::new(Kind::InvalidBody, msg)
}

/// The client-facing error of an admission refusal: 413 over the limit, else 503.
fn rejection(r: Reject, declared: u64, limit: u64) -> Error {
    match r {
        Reject::BodyTooLarge => Error::new(
            Kind::BodyTooLarge,
            format!("request body of {declared} bytes is over the {limit}-byte limit"),
        ),
        other => Error::overloaded(other.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_paths() {
        assert_eq!(
            check_query(b"purpose=batch&limit=2&after=file-x").unwrap(),
            "purpose=batch&limit=2&after=file-x"
        );
        assert_eq!(check_query(b"a=%2F").unwrap(), "a=%2F");
        for q in [&b"a=b c"[..], b"a=%zz", b"a=\r\nx", b"a=#", b"a=/../"] {
            assert!(check_query(q).is_err(), "{q:?}");
        }
        assert_eq!(
            upstream_path("/v1", Call::FileContent, Some("file-1"), &None),
            "/v1/files/file-1/content"
        );
        assert_eq!(
            upstream_path("/v1", Call::Files, None, &Some("limit=1".into())),
            "/v1/files?limit=1"
        );
        assert_eq!(
            upstream_path("", Call::BatchCancel, Some("b1"), &None),
            "/batches/b1/cancel"
        );
    }

    #[test]
    fn content_type_from_a_raw_head() {
        let raw = b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type:  multipart/form-data; boundary=b \r\n\r\n";
        assert_eq!(
            content_type(raw),
            Some(&b"multipart/form-data; boundary=b"[..])
        );
        assert_eq!(content_type(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), None);
    }
}
