//! The standalone mock server behind `ringgate mock --listen ADDR --profile P`: the same shard
//! machinery as the gateway, answering each dialect's standard path: `/v1/chat/completions`,
//! `/v1/responses`, `/v1/messages` (+ `/count_tokens`), `/v1beta/models/{model}:generateContent`
//! / `:streamGenerateContent[?alt=sse]`, `/v1/embeddings`, `GET /v1/models`, and
//! `GET /mock/requests` (generation and embedding requests answered so far, process-wide
//! counters: tests check what reached the upstream).
//!
//! Faults (`fault`, written by `inject`): a request's `x-mock-fault` header, else the process's
//! fault plan (`ringgate mock --fault …`), replaces the normal answer on any of these paths.
//!
//! Engine mode (`--engine`, `start_engine`): Chat completions go through the simulated
//! engine (`engine`: slots, queue, prefix cache, batch-dependent decode) and the engine's own
//! GET pages (`/metrics`, `/health`; llama.cpp also `/slots`, `/v1/models`, `/props`) answer
//! with its load (`engine_page::page`).
//!
//! Owns: the mock's accept loop, path dispatch (404 / 405 for anything else) and the per-shard
//! fault dice. Must not: share state with the gateway or write any dialect's bytes itself.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use super::answer::Answer;
use super::dialect_at;
use super::engine::{Engine, EngineSpec};
use super::engine_page;
use super::error;
use super::fault::{self, Dice, Plan};
use super::inject::{self, After};
use super::{anthropic, embeddings, Dialect, MockRequest, Profile};
use crate::http::body::Bound;
use crate::http::conn::{ClientConn, Limits};
use crate::http::head::Method;
use crate::http::io::deadline;
use crate::runtime::shutdown::{LocalSignal, Shutdown};
use crate::runtime::{self, DriverChoice};

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
    first_head_timeout: Duration::from_secs(120),
    write_timeout: Duration::from_secs(60),
};
const MAX_BODY: u64 = 256 * 1024 * 1024;

pub fn start(
    listen: SocketAddr,
    profile: Profile,
    shards: usize,
    driver: DriverChoice,
) -> io::Result<MockServer> {
    start_with(listen, profile, shards, driver, Plan::default())
}

/// [`start`] with a per-process fault plan (each shard rolls its own dice, seeded from the
/// plan's seed and the shard index).
pub fn start_with(
    listen: SocketAddr,
    profile: Profile,
    shards: usize,
    driver: DriverChoice,
    plan: Plan,
) -> io::Result<MockServer> {
    start_full(listen, profile, shards, driver, plan, None)
}

/// A simulated inference engine (`engine`'s model; one shard: one engine) on `listen`.
pub fn start_engine(listen: SocketAddr, spec: EngineSpec) -> io::Result<MockServer> {
    let driver = DriverChoice::resolve("auto");
    start_full(
        listen,
        Profile::Instant,
        1,
        driver,
        Plan::default(),
        Some(spec),
    )
}

/// [`start_with`], optionally as a simulated engine (`shards` is then 1).
pub fn start_full(
    listen: SocketAddr,
    profile: Profile,
    shards: usize,
    driver: DriverChoice,
    plan: Plan,
    engine: Option<EngineSpec>,
) -> io::Result<MockServer> {
    let shards = if engine.is_some() { 1 } else { shards };
    let (listeners, addr) = runtime::bind_listeners(listen, shards)?;
    let shutdown = Shutdown::new();
    let sd = shutdown.clone();
    let handles = runtime::spawn(listeners, driver, false, move |id, listener, _| {
        shard(
            id,
            listener,
            profile,
            sd.clone(),
            plan.clone(),
            engine.clone(),
        )
    })?;
    Ok(MockServer {
        addr,
        shutdown,
        handles,
    })
}

struct Local {
    /// `Some` when this mock simulates an inference engine (`--engine`).
    engine: Option<Rc<Engine>>,
    draining: LocalSignal,
    conns: Cell<usize>,
    plan: Plan,
    dice: Dice,
}

/// One shard of the standalone mock: accept and serve until shutdown (then drain).
async fn shard(
    id: usize,
    std_listener: std::net::TcpListener,
    profile: Profile,
    sd: Shutdown,
    plan: Plan,
    engine: Option<EngineSpec>,
) {
    let local = Rc::new(Local {
        engine: engine.map(Engine::new),
        draining: LocalSignal::default(),
        conns: Cell::new(0),
        dice: Dice::new(plan.seed, id),
        plan,
    });
    let open = || local.conns.get() as u64;
    runtime::accept_until(
        "mock",
        std_listener,
        &sd,
        runtime::Drain {
            started: &local.draining,
            expired: None,
            time: Duration::from_secs(5),
        },
        open,
        |stream, _peer| {
            monoio::spawn(serve(ClientConn::new(stream), profile, local.clone()));
        },
    )
    .await;
}

async fn serve(conn: ClientConn, profile: Profile, local: Rc<Local>) {
    local.conns.set(local.conns.get() + 1);
    serve_conn(conn, profile, &local).await;
    local.conns.set(local.conns.get() - 1);
}

async fn serve_conn(mut conn: ClientConn, profile: Profile, local: &Local) {
    loop {
        let Some(head) = conn.next_head(&LIMITS, local.draining.wait()).await else {
            return;
        };
        let keep_alive = head.keep_alive;
        let method = head.method;
        let route = Route::of(head.path(&conn.buf), head.query(&conn.buf));
        let asked = fault::from_header(conn.buf.get(..head.len).unwrap_or_default());
        let page = local
            .engine
            .as_ref()
            .and_then(|e| engine_page(e, method, head.path(&conn.buf)));
        let path = if local.plan.is_empty() {
            Vec::new()
        } else {
            head.path(&conn.buf).to_vec()
        };
        let bound = Bound {
            max: MAX_BODY,
            deadline: deadline(LIMITS.body_timeout.as_millis() as u64),
            permit: None,
        };
        let body = match conn.read_body(&head, bound).await {
            Ok(b) => {
                // the head's bytes stay in the buffer through the body read
                conn.consume(head.len);
                b
            }
            Err(e) => {
                conn.respond_error(
                    &e,
                    Dialect::Chat.wire().error_shape,
                    false,
                    LIMITS.write_timeout,
                )
                .await;
                return;
            }
        };
        if let Some((status, ctype, page)) = page {
            let mut out = Vec::with_capacity(page.len() + 160);
            let framing = crate::http::response::Framing::Length(page.len());
            crate::http::response::write_head(&mut out, status, ctype, framing, keep_alive, b"");
            out.extend_from_slice(page.as_bytes());
            let (r, _) = crate::http::io::write_all(&mut conn.stream, out).await;
            if r.is_err() || !keep_alive {
                return;
            }
            continue;
        }
        let answer = answer(method, route, &body);
        let fault = match asked {
            Ok(Some(f)) => Some(f),
            Ok(None)
                if answer
                    .model()
                    .is_some_and(|m| m.starts_with(fault::MODEL_PREFIX)) =>
            {
                fault::from_model(answer.model())
            }
            Ok(None) if local.plan.is_empty() => None,
            Ok(None) => local.plan.pick(&path, answer.model(), &local.dice),
            Err(msg) => {
                let b = error::body(answer.errors(), 400, &msg);
                let bad = Answer::Json {
                    status: 400,
                    body: b,
                    errors: answer.errors(),
                    paced: false,
                };
                let ok = bad.write(&mut conn.stream, profile, keep_alive).await;
                if ok.is_err() || !keep_alive {
                    return;
                }
                continue;
            }
        };
        // The mock listens on plain TCP only.
        let crate::http::stream::ClientStream::Plain(s) = &mut conn.stream else {
            return;
        };
        let after = match fault {
            None => After::Normal,
            Some(f) => monoio::select! {
                _ = local.draining.wait() => After::Close,
                a = inject::inject(s, &f, &answer, keep_alive) => a,
            },
        };
        let ok = match after {
            After::Normal => match (&local.engine, &answer) {
                (
                    Some(e),
                    Answer::Generate {
                        dialect: Dialect::Chat,
                        req,
                        ..
                    },
                ) => e.serve(s, req, &body, keep_alive).await.is_ok(),
                _ => answer.write(s, profile, keep_alive).await.is_ok(),
            },
            After::Keep => true,
            After::Close => false,
        };
        if !ok || !keep_alive {
            return;
        }
    }
}

/// A simulated engine's own pages (`engine_page::page`), for GETs.
fn engine_page(e: &Engine, method: Method, path: &[u8]) -> Option<(u16, &'static [u8], String)> {
    if method != Method::Get {
        return None;
    }
    engine_page::page(e, path)
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
    /// Gemini `:countTokens`.
    GeminiCount,
    Embeddings,
    Models,
    /// `GET /mock/requests`: how many generation and embedding requests this process answered
    /// (tests check what reached the upstream, e.g. that a cache hit did not).
    Requests,
    Unknown,
}

/// Requests answered by this mock process: generation calls (every dialect), embeddings.
static GENERATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static EMBEDDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Route {
    fn of(path: &[u8], query: Option<&[u8]>) -> Route {
        if let Some(d) = dialect_at(path) {
            return Route::Dialect(d);
        }
        match path {
            b"/v1/messages/count_tokens" => return Route::CountTokens,
            b"/v1/embeddings" => return Route::Embeddings,
            b"/v1/models" => return Route::Models,
            b"/mock/requests" => return Route::Requests,
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
            b"countTokens" => Route::GeminiCount,
            _ => Route::Unknown,
        }
    }

    /// The dialect of this path's errors.
    fn errors(&self) -> Dialect {
        match self {
            Route::Dialect(d) => *d,
            Route::Gemini(..) | Route::GeminiCount => Dialect::Gemini,
            Route::CountTokens => Dialect::Messages,
            _ => Dialect::Chat,
        }
    }
}

/// What to answer to `method` on `route` with `body`.
fn answer(method: Method, route: Route, body: &[u8]) -> Answer {
    let json = |status, body, errors, paced| Answer::Json {
        status,
        body,
        errors,
        paced,
    };
    let invalid = |d, msg: String| json(400, error::body(d, 400, &msg), d, false);
    use std::sync::atomic::Ordering::Relaxed;
    match (method, &route) {
        (Method::Post, Route::Dialect(_) | Route::Azure(_) | Route::Gemini(..)) => {
            GENERATED.fetch_add(1, Relaxed);
        }
        (Method::Post, Route::Embeddings) => {
            EMBEDDED.fetch_add(1, Relaxed);
        }
        _ => {}
    }
    match (method, route) {
        (Method::Get, Route::Requests) => {
            let (g, e) = (GENERATED.load(Relaxed), EMBEDDED.load(Relaxed));
            let body = format!("{{\"generate\":{g},\"embeddings\":{e}}}");
            json(200, body.into_bytes(), Dialect::Chat, false)
        }
        (Method::Post, Route::Dialect(d)) => match MockRequest::parse_dialect(d, "", body) {
            Ok(req) => Answer::generate(d, req),
            Err(msg) => invalid(d, msg),
        },
        (Method::Post, Route::Azure(Some(dep))) => {
            match MockRequest::parse_dialect(Dialect::Chat, &dep, body) {
                Ok(req) => Answer::generate(Dialect::Chat, req),
                Err(msg) => invalid(Dialect::Chat, msg),
            }
        }
        (Method::Post, Route::Azure(None)) => invalid(
            Dialect::Chat,
            "Missing required query parameter: api-version".into(),
        ),
        (Method::Post, Route::Gemini(model, stream)) => {
            match MockRequest::parse_dialect(Dialect::Gemini, &model, body) {
                Ok(mut req) => {
                    req.stream = stream.is_some();
                    Answer::Generate {
                        dialect: Dialect::Gemini,
                        req,
                        sse: stream.unwrap_or(true),
                    }
                }
                Err(msg) => invalid(Dialect::Gemini, msg),
            }
        }
        (Method::Post, Route::CountTokens) => json(
            200,
            anthropic::count_tokens_body(body),
            Dialect::Messages,
            false,
        ),
        (Method::Post, Route::GeminiCount) => json(
            200,
            super::gemini::count_tokens_body(body),
            Dialect::Gemini,
            false,
        ),
        (Method::Post, Route::Embeddings) => match embeddings::embeddings_body(body) {
            Ok(b) => json(200, b, Dialect::Chat, true),
            Err(msg) => invalid(Dialect::Chat, msg),
        },
        (Method::Get, Route::Models) => {
            let body = br#"{"object":"list","data":[{"id":"mock","object":"model","created":1700000000,"owned_by":"ringgate-mock"}]}"#;
            json(200, body.to_vec(), Dialect::Chat, false)
        }
        (_, Route::Unknown) => {
            let msg = "the mock does not serve this path";
            json(
                404,
                error::body(Dialect::Chat, 404, msg),
                Dialect::Chat,
                false,
            )
        }
        (_, route) => {
            let msg = "method not allowed on this path";
            let d = route.errors();
            json(405, error::body(d, 405, msg), d, false)
        }
    }
}
