//! The admin listener (`[admin]`, default `127.0.0.1:8081`): `/admin/*` (keys, usage, drain) and
//! `/metrics`, plus `/healthz` and `/readyz`, served on a thread of its own (a small epoll
//! runtime) so nothing it does — a scrape, a key write waiting on the disk — runs on a shard.
//!
//! - **Token**: every `/admin/*` request needs `Authorization: Bearer <token>`, the token read
//!   once at start from the env var `token_env` names (compared as SHA-256 digests in constant
//!   time). A non-loopback admin address without a token, or with one shorter than 16 bytes or
//!   only whitespace, refuses to start (`weak_token`; a reload refuses such a file too). On
//!   loopback without a token the admin API answers 401 (the start-up log says how to set one)
//!   and `/metrics` is served to anyone on the machine; with a token, `/metrics` needs it too.
//!   Two `Authorization` headers: 400.
//! - **Guessing**: an address that keeps sending new wrong tokens is slowed down before its
//!   next token check (`peer::slowdown`: 4 free, then doubling delays up to 5 s per guess; a
//!   correct token forgives the address).
//! - **Bounds**: heads up to 16 KiB, bodies up to 64 KiB (413), the first head within 5 s of
//!   the connect (then 30 s idle between requests, 5 s per head, 10 s per body), at most 128
//!   connections and 8 per client address (IPv6: per /64); the loopback `Host` rule of the main
//!   listener (`http::edge`, with `server.allowed_hosts`) and no cross-site `Origin`; bodies
//!   are strict JSON (`json`: a field named twice is a 400); every error is JSON
//!   (`{"error":{"message","type","code"}}`).
//! - **Reload** (`POST /admin/reload`): the config file read again and applied, or refused
//!   (422) with every problem; the JSON report says what changed and what needs a restart
//!   (`reload`). `GET /admin/config`: the running file, secrets masked, and its hash.
//! - **Drain** (`POST /admin/drain`): `/readyz` answers 503 at once (here and on the main
//!   listener), every shard stops accepting and lets in-flight requests finish (the same drain
//!   as SIGTERM, bounded by `drain_timeout_ms`); the process then stays up with this listener
//!   until SIGTERM/SIGINT, so an orchestrator can watch it and stop it.
//!
//! - **Status page** (`GET /admin/`): one self-contained HTML page that asks for the token and
//!   shows the box from the JSON endpoints (`page`); served without the token (it holds no
//!   data).
//!
//! Owns: the admin thread, its listener, its per-address limits, request routing and the token
//! check. Must not: touch a shard's state (it sees the key registry, the published metrics
//! snapshots and the shutdown signal only).

mod cache;
mod json;
mod keys;
mod page;
mod usage;

pub(crate) use json::object as json_object;

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use monoio::{LegacyDriver, RuntimeBuilder};
use serde_json::Value;

use crate::admit::peer::{Addresses, Peer, Slowdown};
use crate::config::Config;
use crate::error::{Error, ErrorShape, Kind};
use crate::governance::keyring::Digest;
use crate::governance::registry::Registry;
use crate::http::body::Bound;
use crate::http::conn::{ClientConn, Limits};
use crate::http::edge::EdgePolicy;
use crate::http::Method;
use crate::observe::metrics::MetricsHub;
use crate::runtime::shutdown::Shutdown;

const MAX_BODY: u64 = 64 * 1024;
const MAX_CONNECTIONS: u32 = 128;
/// Admin connections one client address may hold open (IPv6: one /64).
const MAX_PER_PEER: u32 = 8;
pub use crate::config::admin_token::{weak_token, MIN_TOKEN_BYTES};
const LIMITS: Limits = Limits {
    max_head: 16 * 1024,
    max_headers: 64,
    header_timeout: Duration::from_secs(5),
    body_timeout: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(30),
    first_head_timeout: Duration::from_secs(5),
    write_timeout: Duration::from_secs(10),
};

/// What the admin listener serves from.
pub struct Ctx {
    pub registry: Arc<Mutex<Registry>>,
    /// `POST /admin/reload`, `GET /admin/config`.
    pub reloader: Arc<crate::control::reload::Reloader>,
    /// Digest of the admin token (`None`: no token set; the admin API answers 401).
    pub token: Option<Digest>,
    pub token_env: String,
    pub hub: MetricsHub,
    /// The process-wide spend ledger (usage endpoints).
    pub spend: Arc<crate::governance::SpendBook>,
    /// Fired by `POST /admin/drain` (and by SIGTERM): shards stop accepting and drain.
    pub drain: Shutdown,
    pub drain_timeout_ms: u64,
    /// Fired when the process ends: this listener closes.
    pub exit: Shutdown,
    /// The response cache (`/admin/cache`, `/admin/cache/purge`), when on.
    pub cache: Option<Arc<crate::cache::Cache>>,
    /// The fleet thread (`[limits] store = "redis"`): `?scope=fleet` on the usage endpoints.
    pub fleet: Option<Arc<crate::governance::fleet::Fleet>>,
    /// The loopback `Host` rule (on a loopback admin address; `server.allowed_hosts` too) and
    /// no cross-site `Origin` at all.
    pub edge: EdgePolicy,
}

/// What the admin listener keeps per client address: open connections and wrong tokens.
struct Guard {
    peers: Arc<Addresses>,
    guesses: Slowdown,
}

/// A started admin listener.
pub struct Admin {
    pub addr: SocketAddr,
    handle: JoinHandle<()>,
}

impl Admin {
    /// Wait for the admin thread (it ends when `exit` fires).
    pub fn join(self) {
        let _ = self.handle.join();
    }
}

/// The admin address and token `cfg` asks for (`None`: no `[admin]`). Refuses a non-loopback
/// address without a token, or with a weak one (`weak_token`).
pub fn plan(cfg: &Config) -> Result<Option<(SocketAddr, Option<Digest>, String)>, String> {
    let (Some(a), Some(addr)) = (&cfg.admin, cfg.admin_addr()) else {
        return Ok(None);
    };
    let addr = addr?;
    let env = a.token_env.get_ref().clone();
    let raw = std::env::var_os(&env).filter(|v| !v.is_empty());
    let raw = raw
        .as_ref()
        .map(|v| std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()));
    if let Some(why) = weak_token(addr, &env, raw) {
        return Err(why);
    }
    Ok(Some((addr, raw.map(Digest::of), env)))
}

/// Bind `addr` and serve on a thread of its own until `ctx.exit` fires.
pub fn start(addr: SocketAddr, ctx: Ctx) -> io::Result<Admin> {
    let (mut listeners, bound) = crate::runtime::bind_listeners(addr, 1)?;
    let listener = listeners
        .pop()
        .ok_or_else(|| io::Error::other("no admin listener"))?;
    if ctx.token.is_none() {
        crate::observe::log::info(format_args!(
            "admin: no token: /admin/* answers 401 until ringgate is started with {} set (a long random secret); /metrics is served without one",
            ctx.token_env
        ));
    }
    let handle = std::thread::Builder::new()
        .name("ringgate-admin".into())
        .spawn(
            move || match RuntimeBuilder::<LegacyDriver>::new().enable_timer().build() {
                Ok(mut rt) => rt.block_on(accept_loop(listener, Rc::new(ctx))),
                Err(e) => crate::observe::log::info(format_args!("admin: no runtime: {e}")),
            },
        )?;
    Ok(Admin {
        addr: bound,
        handle,
    })
}

async fn accept_loop(std_listener: std::net::TcpListener, ctx: Rc<Ctx>) {
    let listener = match monoio::net::TcpListener::from_std(std_listener) {
        Ok(l) => l,
        Err(e) => {
            crate::observe::log::info(format_args!("admin: cannot adopt listener: {e}"));
            return;
        }
    };
    let open = Rc::new(Cell::new(0u32));
    let guard = Rc::new(Guard {
        peers: Addresses::new(MAX_PER_PEER, u64::from(MAX_CONNECTIONS)),
        guesses: Slowdown::new(),
    });
    let mut exit = std::pin::pin!(ctx.exit.wait());
    loop {
        monoio::select! {
            _ = &mut exit => break,
            r = listener.accept() => match r {
                Ok((stream, addr)) => {
                    let mut conn = ClientConn::new(stream);
                    let peer = Peer::of(addr.ip());
                    conn.peer = Some(peer);
                    let slot = match open.get() < MAX_CONNECTIONS {
                        true => guard.peers.enter(peer).ok_or("too many admin connections from this address"),
                        false => Err("too many admin connections"),
                    };
                    let slot = match slot {
                        Ok(s) => s,
                        Err(why) => {
                            let e = Error::new(Kind::Overloaded, why);
                            monoio::spawn(async move {
                                conn.respond_error(&e, ErrorShape::OpenAi, false, LIMITS.write_timeout).await;
                            });
                            continue;
                        }
                    };
                    open.set(open.get() + 1);
                    let (ctx, open, guard) = (ctx.clone(), open.clone(), guard.clone());
                    monoio::spawn(async move {
                        conn.first_head_by = Some(Instant::now() + LIMITS.first_head_timeout);
                        serve(conn, &ctx, &guard).await;
                        drop(slot);
                        open.set(open.get() - 1);
                    });
                }
                Err(e) => {
                    crate::observe::log::info(format_args!("admin: accept: {e}"));
                    monoio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// One answer: status, content type, body.
struct Reply {
    status: u16,
    content_type: &'static [u8],
    /// More header lines (each ending in CRLF).
    headers: &'static [u8],
    body: Vec<u8>,
}

impl Reply {
    fn json(status: u16, v: &Value) -> Reply {
        Reply {
            status,
            content_type: b"application/json",
            headers: b"",
            body: v.to_string().into_bytes(),
        }
    }
}

async fn serve(mut conn: ClientConn, ctx: &Ctx, guard: &Guard) {
    loop {
        let Some(head) = conn.next_head(&LIMITS, ctx.exit.wait()).await else {
            return;
        };
        let keep = head.keep_alive;
        // the loopback Host rule, no Origin; one credential at most
        let refused = match ctx.edge.check(&head, &conn.buf) {
            Err(e) => Some(e),
            Ok(_) if head.dup_credential => Some(Error::new(
                Kind::BadRequest,
                "more than one Authorization header: send the admin token once",
            )),
            Ok(_) => None,
        };
        if let Some(e) = refused {
            conn.respond_error(&e, ErrorShape::OpenAi, false, LIMITS.write_timeout)
                .await;
            return;
        }
        // copy what routing needs before the body read moves the buffer
        let method = head.method;
        // the target (path and query): `route` splits it
        let target = conn.buf.get(head.target.clone()).unwrap_or_default();
        let path = String::from_utf8_lossy(target).into_owned();
        let bare = head.path(&conn.buf);
        // a guess: a token sent where one is checked (told apart by its fingerprint)
        let sent = head.header(&conn.buf, &head.authorization);
        let presented = sent.is_some() && (bare.starts_with(b"/admin/") || bare == b"/metrics");
        let fingerprint = sent.map_or(0, |t| guard.guesses.fingerprint(t));
        // an address that keeps sending wrong tokens waits before its token is checked
        if let (Some(peer), true, Some(_)) = (conn.peer, presented, ctx.token) {
            if let Err(d) = guard.guesses.wait(peer, Instant::now()).await {
                let e = Error::new(
                    Kind::RateLimited,
                    "too many wrong admin tokens from this address; retry later",
                )
                .retry_after(d.as_secs().clamp(1, 3600) as u32);
                conn.respond_error(&e, ErrorShape::OpenAi, false, LIMITS.write_timeout)
                    .await;
                return;
            }
        }
        let authorized = authorize(ctx, head.header(&conn.buf, &head.authorization));
        if let (Some(peer), true) = (conn.peer, presented) {
            match authorized {
                Some(true) => guard.guesses.forgive(peer),
                Some(false) => guard.guesses.failed(peer, Instant::now(), fingerprint),
                None => {}
            }
        }
        let bound = Bound {
            max: MAX_BODY,
            deadline: Instant::now() + LIMITS.body_timeout,
            permit: None,
        };
        let body = conn.read_body(&head, bound).await;
        // the head's bytes stay in the buffer through the body read
        conn.consume(head.len);
        let reply = match body {
            Ok(body) => route(ctx, method, &path, authorized, &body),
            Err(e) => {
                conn.respond_error(&e, ErrorShape::OpenAi, false, LIMITS.write_timeout)
                    .await;
                return;
            }
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                if !conn
                    .respond_error(&e, ErrorShape::OpenAi, keep, LIMITS.write_timeout)
                    .await
                {
                    return;
                }
                continue;
            }
        };
        let ok = conn
            .respond(
                reply.status,
                reply.content_type,
                reply.headers,
                &reply.body,
                keep,
                LIMITS.write_timeout,
            )
            .await;
        if !ok || !keep {
            return;
        }
    }
}

/// Whether the request carries the admin token (`None`: no token is set).
fn authorize(ctx: &Ctx, authorization: Option<&[u8]>) -> Option<bool> {
    let want = ctx.token?;
    let presented = authorization
        .map(crate::http::head::trim)
        .and_then(|v| v.split_at_checked(7))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|(_, t)| crate::http::head::trim(t));
    Some(presented.is_some_and(|t| Digest::of(t) == want))
}

fn route(
    ctx: &Ctx,
    method: Method,
    target: &str,
    authorized: Option<bool>,
    body: &[u8],
) -> Result<Reply, Error> {
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let draining = ctx.drain.is_fired();
    match path {
        "/healthz" => {
            return only(method, Method::Get, || {
                Reply::json(200, &serde_json::json!({"status": "ok"}))
            })
        }
        "/readyz" => {
            return only(method, Method::Get, || match draining {
                true => Reply::json(503, &serde_json::json!({"status": "draining"})),
                false => Reply::json(200, &serde_json::json!({"status": "ready"})),
            })
        }
        "/metrics" => {
            if authorized == Some(false) {
                return Err(unauthorized(ctx));
            }
            return only(method, Method::Get, || Reply {
                status: 200,
                content_type: b"text/plain; version=0.0.4",
                headers: b"",
                body: ctx.hub.render_published().into_bytes(),
            });
        }
        _ => {}
    }
    if !path.starts_with("/admin/") {
        return Err(Error::new(Kind::NotFound, format!("no route for {path}")));
    }
    if path == "/admin/" {
        return only(method, Method::Get, page::reply);
    }
    match authorized {
        Some(true) => {}
        Some(false) => return Err(unauthorized(ctx)),
        None => {
            return Err(Error::new(
                Kind::Unauthorized,
                format!(
                    "the admin API needs a token: start ringgate with the env var {} set to a long random secret, then send it as `Authorization: Bearer <token>`",
                    ctx.token_env
                ),
            ))
        }
    }
    if path == "/admin/drain" {
        return only(method, Method::Post, || {
            if !ctx.drain.is_fired() {
                crate::observe::log::info(format_args!(
                    "admin: drain: /readyz answers 503, listeners close, in-flight requests finish (up to {} ms)",
                    ctx.drain_timeout_ms
                ));
                ctx.drain.fire();
            }
            Reply::json(
                202,
                &serde_json::json!({"status": "draining", "drain_timeout_ms": ctx.drain_timeout_ms}),
            )
        });
    }
    if path.starts_with("/admin/cache") {
        return cache::route(ctx, method, path, body);
    }
    if path == "/admin/reload" {
        return only(method, Method::Post, || {
            let report = ctx.reloader.reload("admin");
            Reply::json(if report.ok { 200 } else { 422 }, &report.to_json())
        });
    }
    if path == "/admin/config" {
        return only(method, Method::Get, || {
            Reply::json(200, &ctx.reloader.running())
        });
    }
    if path == "/admin/usage" {
        if method != Method::Get {
            return Err(Error::new(
                Kind::MethodNotAllowed,
                "method not allowed on this path",
            ));
        }
        return usage::all(ctx, query);
    }
    keys::route(ctx, method, path, query, body)
}

fn only(method: Method, want: Method, f: impl FnOnce() -> Reply) -> Result<Reply, Error> {
    if method != want {
        return Err(Error::new(
            Kind::MethodNotAllowed,
            "method not allowed on this path",
        ));
    }
    Ok(f())
}

fn unauthorized(ctx: &Ctx) -> Error {
    Error::new(
        Kind::Unauthorized,
        format!(
            "invalid admin token: send the token from {} as `Authorization: Bearer <token>`",
            ctx.token_env
        ),
    )
}

/// Unix seconds now.
fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
