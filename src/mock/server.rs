//! The standalone mock server behind `ringgate mock --listen ADDR --profile P`: the same shard
//! machinery as the gateway, answering each dialect's standard path: `/v1/chat/completions`,
//! `/v1/responses`, `/v1/messages` (+ `/count_tokens`), `/v1beta/models/{model}:generateContent`
//! / `:streamGenerateContent[?alt=sse]`, `/v1/embeddings`, `GET /v1/models`.
//!
//! Owns: the mock's accept loop and path dispatch (404 / 405 for anything else). Must not: share
//! state with the gateway or write any dialect's bytes itself.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use super::error::{self, Shape};
use super::{anthropic, embeddings, gemini, pace, Dialect, MockRequest, Profile};
use crate::error::ErrorShape;
use crate::http::body::read_body;
use crate::http::conn::{ClientConn, Limits};
use crate::http::head::Method;
use crate::http::io::deadline;
use crate::mock;
use crate::shard::{self, DriverChoice};
use crate::shutdown::{LocalSignal, Shutdown};

pub struct MockServer {
    pub addr: SocketAddr,
    pub shutdown: Shutdown,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl MockServer {
    pub fn stop(self) {
        self.shutdown.fire();
        for h in self.handles {
            let _ = h.join();
        }
    }

    pub fn wait(self) {
        for h in self.handles {
            let _ = h.join();
        }
    }
}

const LIMITS: Limits = Limits {
    max_head: 64 * 1024,
    max_headers: 100,
    header_timeout: Duration::from_secs(10),
    body_timeout: Duration::from_secs(60),
    idle_timeout: Duration::from_secs(120),
    write_timeout: Duration::from_secs(60),
};
const MAX_BODY: u64 = 256 * 1024 * 1024;

pub fn start(
    listen: SocketAddr,
    profile: Profile,
    shards: usize,
    driver: DriverChoice,
) -> io::Result<MockServer> {
    let (listeners, addr) = shard::bind_listeners(listen, shards)?;
    let shutdown = Shutdown::new();
    let sd = shutdown.clone();
    let handles = shard::spawn(
        listeners,
        driver,
        false,
        move |_id, std_listener, _driver| {
            let sd = sd.clone();
            async move {
                let local = Rc::new(Local::default());
                let open = || local.conns.get() as u64;
                shard::accept_until(
                    "mock",
                    std_listener,
                    &sd,
                    &local.draining,
                    Duration::from_secs(5),
                    open,
                    |stream| {
                        monoio::spawn(serve(ClientConn::new(stream), profile, local.clone()));
                    },
                )
                .await;
            }
        },
    )?;
    Ok(MockServer {
        addr,
        shutdown,
        handles,
    })
}

#[derive(Default)]
struct Local {
    draining: LocalSignal,
    conns: Cell<usize>,
}

async fn serve(conn: ClientConn, profile: Profile, local: Rc<Local>) {
    local.conns.set(local.conns.get() + 1);
    serve_conn(conn, profile, &local).await;
    local.conns.set(local.conns.get() - 1);
}

async fn serve_conn(mut conn: ClientConn, profile: Profile, local: &Local) {
    loop {
        let next = monoio::select! {
            _ = local.draining.wait() => return,
            h = conn.read_head(&LIMITS) => h,
        };
        let head = match next {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                conn.respond_error(&e, ErrorShape::OpenAi, false, LIMITS.write_timeout)
                    .await;
                return;
            }
        };
        let keep_alive = head.keep_alive;
        let method = head.method;
        let route = Route::of(head.path(&conn.buf), head.query(&conn.buf));
        let body = match read_body(
            &mut conn.stream,
            &mut conn.buf,
            head.len,
            head.body,
            MAX_BODY,
            deadline(LIMITS.body_timeout.as_millis() as u64),
            None,
        )
        .await
        {
            Ok(b) => b,
            Err(e) => {
                conn.respond_error(&e, ErrorShape::OpenAi, false, LIMITS.write_timeout)
                    .await;
                return;
            }
        };
        let ok = answer(&mut conn, method, route, &body, profile, keep_alive).await;
        if !ok || !keep_alive {
            return;
        }
    }
}

/// What a request path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Dialect(Dialect),
    /// Gemini: model from the path, `Some(sse)` for `:streamGenerateContent`.
    Gemini(String, Option<bool>),
    /// Azure OpenAI deployment URL (`/openai/deployments/{dep}/chat/completions?api-version=…`):
    /// Chat with the deployment as the model; `None` when `api-version` is missing.
    Azure(Option<String>),
    CountTokens,
    Embeddings,
    Models,
    Unknown,
}

impl Route {
    fn of(path: &[u8], query: Option<&[u8]>) -> Route {
        match path {
            b"/v1/chat/completions" => return Route::Dialect(Dialect::Chat),
            b"/v1/responses" => return Route::Dialect(Dialect::Responses),
            b"/v1/messages" => return Route::Dialect(Dialect::Messages),
            b"/v1/messages/count_tokens" => return Route::CountTokens,
            b"/v1/embeddings" => return Route::Embeddings,
            b"/v1/models" => return Route::Models,
            _ => {}
        }
        if let Some(dep) = path
            .strip_prefix(b"/openai/deployments/")
            .and_then(|r| r.strip_suffix(b"/chat/completions"))
        {
            let versioned = query.is_some_and(|q| {
                q.split(|&b| b == b'&')
                    .any(|kv| kv.starts_with(b"api-version=") && kv.len() > 12)
            });
            return Route::Azure(versioned.then(|| String::from_utf8_lossy(dep).into_owned()));
        }
        let Some(rest) = path.strip_prefix(b"/v1beta/models/") else {
            return Route::Unknown;
        };
        let Some(colon) = rest.iter().rposition(|&b| b == b':') else {
            return Route::Unknown;
        };
        let model = String::from_utf8_lossy(&rest[..colon]).into_owned();
        let sse = query.is_some_and(|q| q.split(|&b| b == b'&').any(|kv| kv == b"alt=sse"));
        match &rest[colon + 1..] {
            b"generateContent" => Route::Gemini(model, None),
            b"streamGenerateContent" => Route::Gemini(model, Some(sse)),
            _ => Route::Unknown,
        }
    }

    fn shape(&self) -> Shape {
        match self {
            Route::Dialect(d) => Shape::of(*d),
            Route::Gemini(..) => Shape::Gemini,
            Route::CountTokens => Shape::Anthropic,
            _ => Shape::OpenAi,
        }
    }
}

/// Answer one request; false when the connection must close.
async fn answer(
    conn: &mut ClientConn,
    method: Method,
    route: Route,
    body: &[u8],
    profile: Profile,
    keep_alive: bool,
) -> bool {
    let s = &mut conn.stream;
    let r = match (method, route) {
        (Method::Post, Route::Dialect(d)) => {
            mock::respond(s, d, "", body, profile, keep_alive).await
        }
        (Method::Post, Route::Azure(Some(dep))) => {
            mock::respond(s, Dialect::Chat, &dep, body, profile, keep_alive).await
        }
        (Method::Post, Route::Azure(None)) => {
            let msg = "Missing required query parameter: api-version";
            error::write(s, Shape::OpenAi, 400, msg, keep_alive).await
        }
        (Method::Post, Route::Gemini(model, stream)) => {
            match MockRequest::parse_dialect(Dialect::Gemini, &model, body) {
                Ok(mut req) => {
                    req.stream = stream.is_some();
                    let sse = stream.unwrap_or(true);
                    gemini::respond_framed(s, &req, sse, profile, keep_alive).await
                }
                Err(msg) => error::write(s, Shape::Gemini, 400, &msg, keep_alive).await,
            }
        }
        (Method::Post, Route::CountTokens) => {
            let b = anthropic::count_tokens_body(body);
            pace::json(s, 200, &b, Profile::Instant, keep_alive).await
        }
        (Method::Post, Route::Embeddings) => {
            embeddings::respond(s, body, profile, keep_alive).await
        }
        (Method::Get, Route::Models) => {
            let body = br#"{"object":"list","data":[{"id":"mock","object":"model","created":1700000000,"owned_by":"ringgate-mock"}]}"#;
            pace::json(s, 200, body, Profile::Instant, keep_alive).await
        }
        (_, Route::Unknown) => {
            let msg = "the mock does not serve this path";
            error::write(s, Shape::OpenAi, 404, msg, keep_alive).await
        }
        (_, route) => {
            let msg = "method not allowed on this path";
            error::write(s, route.shape(), 405, msg, keep_alive).await
        }
    };
    r.is_ok()
}
