//! The shared limits store (`[limits] store = "redis"`): per-key counters (request and token
//! windows, requests in flight, budget spend) kept in Redis/Valkey so that every gateway
//! process (every shard of every appliance) that points at the same store enforces one limit
//! together, not one each.
//!
//! **One connection per shard, on the shard's own runtime.** Each shard keeps its own pipelined
//! connection (`pipeline`, with the small bounded RESP2 codec in `resp`) and awaits replies like
//! any other IO: a shard never blocks on Redis, and nothing crosses threads on the request
//! path (a dedicated Redis thread would put a cross-thread hop, a wake-up and a shared queue
//! in front of every keyed request, and make the store's latency depend on that thread's
//! scheduling). Redis serves each connection in order, so one connection per shard carries any
//! number of concurrent requests. The cost is N connections per process (N = shards), which
//! Redis handles trivially.
//!
//! **Deadlines.** A request waits at most `redis_timeout_ms` (default 50) for its reply; past
//! that it counts as a store error, the connection is dropped (a store that slow is treated as
//! gone: later requests do not each wait the deadline) and the request is decided without the
//! store: by this shard's local counters (`on_store_error = "local"`, the default: today's
//! per-shard split) or refused with 503 (`"closed"`).
//!
//! **Reconnects** with backoff (100 ms doubling to 2 s). A fresh connection authenticates
//! (`AUTH`), selects the database, loads the script (`SCRIPT LOAD`; calls use `EVALSHA` and fall
//! back to `EVAL` on `NOSCRIPT`), renews this shard's lease, and then — in the same step that
//! marks the store up, so nothing can slip between — resyncs this shard's in-flight counts and
//! adds the requests and tokens it admitted locally during the outage to the current window
//! (`Governance::resync`). The lease is renewed every `redis_lease_ms / 3`.
//!
//! **Logging**: one line per state change per shard (down with the reason, up with what was
//! caught up); script error replies at most one line a second. The password is never logged
//! (`RedisUrl`'s `Display`). **Metrics**: `ringgate_limit_store_up`, errors by kind, requests
//! decided without the store by mode, connects.
//!
//! Owns: `Settings`, `Store` (state, deadlines, reconnect loop, lease, metrics). Must not:
//! decide limits (that is `governance::shared` with the script), or block the shard.

use std::cell::{Cell, RefCell};
use std::fmt::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use monoio::net::TcpStream;

use crate::control::config::limits::{LimitsConfig, RedisUrl};
use crate::observe::log::RateLimited;

pub mod pipeline;
pub mod resp;
pub mod script;

use pipeline::{Fault, Pipeline};
use resp::{Arg, Reply};
use script::{By, Ident, Op};

/// Longest a connect plus handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The process-wide store settings, read once at start.
#[derive(Clone)]
pub struct Settings {
    /// For logs (no password).
    pub url: RedisUrl,
    pub addr: SocketAddr,
    pub timeout: Duration,
    pub lease: Duration,
    pub prefix: Box<str>,
    pub closed: bool,
    /// This process's part of each shard's instance name (random).
    pub process: Box<str>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Settings({}, {})", self.url, self.addr)
    }
}

impl Settings {
    /// `None` for the local store. Resolves the host once (blocking: call before the shards
    /// start) and reads `redis_password_env`.
    pub fn from_config(l: &LimitsConfig) -> Result<Option<Settings>, String> {
        if !l.shared() {
            return Ok(None);
        }
        let mut url = l.url().map_err(|e| format!("limits.redis_url: {e}"))?;
        if let Some(env) = &l.redis_password_env {
            if let Ok(p) = std::env::var(env.get_ref()) {
                url.password = Some(p);
            }
        }
        let addr = (url.host.as_str(), url.port)
            .to_socket_addrs()
            .map_err(|e| format!("limits.redis_url {url}: cannot resolve the host: {e}"))?
            .next()
            .ok_or_else(|| format!("limits.redis_url {url}: the host has no address"))?;
        let mut rnd = [0u8; 8];
        let process =
            match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut rnd) {
                Ok(()) => u64::from_ne_bytes(rnd),
                Err(_) => {
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.subsec_nanos());
                    (u64::from(std::process::id()) << 32) | u64::from(nanos)
                }
            };
        Ok(Some(Settings {
            url,
            addr,
            timeout: Duration::from_millis(*l.redis_timeout_ms.get_ref()),
            lease: Duration::from_millis(*l.redis_lease_ms.get_ref()),
            prefix: l.redis_prefix.get_ref().as_str().into(),
            closed: l.closed(),
            process: format!("{process:016x}").into(),
        }))
    }
}

/// Fault kinds counted in `ringgate_limit_store_errors_total`.
const COUNTED: [Fault; 4] = [Fault::Connect, Fault::Timeout, Fault::Io, Fault::Reply];

/// One shard's connection to the shared store and its state.
pub struct Store {
    s: Settings,
    shard: usize,
    /// `<process>-<shard>`: this shard's name in in-flight hashes and its lease key.
    instance: Box<str>,
    live_prefix: Box<str>,
    sha: [u8; 40],
    pipe: Pipeline,
    up: Cell<bool>,
    /// The state last logged (`None`: nothing logged yet).
    logged: Cell<Option<bool>>,
    /// Why the last connection attempt or connection failed (for the log line).
    reason: RefCell<String>,
    errors: [Cell<u64>; 4],
    fallbacks: [Cell<u64>; 2],
    connects: Cell<u64>,
    reply_log: RateLimited,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({}, up: {})", self.s.url, self.up.get())
    }
}

impl Store {
    pub fn new(s: Settings, shard: usize) -> Store {
        Store {
            instance: format!("{}-{shard}", s.process).into(),
            live_prefix: script::live_prefix(&s.prefix).into(),
            sha: script::sha1(),
            s,
            shard,
            pipe: Pipeline::default(),
            up: Cell::new(false),
            logged: Cell::new(None),
            reason: RefCell::new(String::new()),
            errors: Default::default(),
            fallbacks: Default::default(),
            connects: Cell::new(0),
            reply_log: RateLimited::new(1),
        }
    }

    /// Whether the store is connected and ready.
    pub fn up(&self) -> bool {
        self.up.get()
    }

    /// `on_store_error = "closed"`.
    pub fn closed(&self) -> bool {
        self.s.closed
    }

    pub fn prefix(&self) -> &str {
        &self.s.prefix
    }

    fn ident(&self) -> Ident<'_> {
        Ident {
            instance: &self.instance,
            live_prefix: &self.live_prefix,
        }
    }

    /// A request was decided without the store (`closed`: refused).
    pub fn fell_back(&self, closed: bool) {
        let c = &self.fallbacks[usize::from(closed)];
        crate::observe::metrics::bump(c);
    }

    fn count(&self, f: Fault) {
        if let Some(i) = COUNTED.iter().position(|&k| k == f) {
            crate::observe::metrics::bump(&self.errors[i]);
        }
    }

    /// Run `op` and wait for its reply (at most `redis_timeout_ms`).
    pub async fn eval(&self, op: Op<'_>) -> Result<Reply, Fault> {
        if !self.up.get() {
            return Err(Fault::Down);
        }
        let deadline = Instant::now() + self.s.timeout;
        let mut by = By::Sha(&self.sha);
        loop {
            let id = self.ident();
            let slot = self.pipe.call(|out| op.encode(out, by, &id))?;
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = match monoio::time::timeout(left, slot.wait()).await {
                Ok(r) => r?,
                Err(_) => {
                    self.count(Fault::Timeout);
                    *self.reason.borrow_mut() =
                        format!("no reply within {} ms", self.s.timeout.as_millis());
                    self.pipe.fail(Fault::Timeout);
                    return Err(Fault::Timeout);
                }
            };
            if let Some(e) = reply.error() {
                if e.starts_with(b"NOSCRIPT") && matches!(by, By::Sha(_)) {
                    by = By::Source;
                    continue;
                }
                self.reply_error(e);
                return Err(Fault::Reply);
            }
            return Ok(reply);
        }
    }

    /// An error reply to a request's call, or one that made no sense: counted, logged at most
    /// once a second.
    pub fn reply_error(&self, e: &[u8]) {
        self.count(Fault::Reply);
        if let Some(skipped) = self.reply_log.admit(Instant::now()) {
            crate::observe::log::info(format_args!(
                "shard {}: limit store {}: error reply: {} ({skipped} more not logged)",
                self.shard,
                self.s.url,
                String::from_utf8_lossy(&e[..e.len().min(200)])
            ));
        }
    }

    /// Queue `op` without waiting for its reply (false: not connected, nothing sent).
    pub fn send(&self, op: Op<'_>) -> bool {
        let id = self.ident();
        self.pipe
            .send(|out| op.encode(out, By::Sha(&self.sha), &id))
    }

    /// Connect, serve, reconnect — forever (the shard's runtime drops it at shutdown).
    /// `on_up` runs in the step that marks the store up (resync and catch-up: it queues
    /// commands and returns what it caught up, for the log).
    pub async fn maintain(&self, on_up: &dyn Fn() -> String) {
        let mut backoff = MIN_BACKOFF;
        loop {
            let started = Instant::now();
            let fault =
                match monoio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect_addr(self.s.addr))
                    .await
                {
                    Ok(Ok(stream)) => {
                        let _ = stream.set_nodelay(true);
                        crate::observe::metrics::bump(&self.connects);
                        self.connection(stream, on_up).await
                    }
                    Ok(Err(e)) => {
                        *self.reason.borrow_mut() = format!("connect: {e}");
                        Fault::Connect
                    }
                    Err(_) => {
                        *self.reason.borrow_mut() = "connect timed out".into();
                        Fault::Connect
                    }
                };
            self.up.set(false);
            if fault != Fault::Timeout {
                // (a missed deadline was counted where it happened)
                self.count(fault);
            }
            self.note(false, "");
            if started.elapsed() > 4 * MAX_BACKOFF {
                backoff = MIN_BACKOFF;
            }
            monoio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One connection's life: handshake, up, lease renewals until something fails.
    async fn connection(&self, stream: TcpStream, on_up: &dyn Fn() -> String) -> Fault {
        let life = async {
            if let Err(f) = self.handshake().await {
                return f;
            }
            let caught_up = on_up();
            self.up.set(true);
            self.note(true, &caught_up);
            loop {
                monoio::time::sleep(self.s.lease / 3).await;
                if let Err(f) = self.renew_lease(Instant::now() + CONNECT_TIMEOUT).await {
                    return f;
                }
            }
        };
        // open before either side runs (`select!` may poll `life` first)
        self.pipe.start();
        let fault = monoio::select! {
            f = self.pipe.serve(stream) => f,
            f = life => f,
        };
        self.up.set(false);
        self.pipe.fail(fault);
        if fault == Fault::Io && self.reason.borrow().is_empty() {
            *self.reason.borrow_mut() = "connection lost".into();
        }
        fault
    }

    /// One plain command (not the limits script) and its reply, within `redis_timeout_ms`;
    /// for other users of the same store (the response cache's exact layer).
    pub async fn call(&self, args: &[Arg<'_>]) -> Result<Reply, Fault> {
        if !self.up.get() {
            return Err(Fault::Down);
        }
        self.command(args, Instant::now() + self.s.timeout).await
    }

    /// Queue one plain command without waiting for its reply (false: not connected).
    pub fn send_command(&self, args: &[Arg<'_>]) -> bool {
        self.up.get() && self.pipe.send(|out| resp::command(out, args))
    }

    /// Send one plain command and wait for its reply until `deadline`.
    async fn command(&self, args: &[Arg<'_>], deadline: Instant) -> Result<Reply, Fault> {
        let slot = self.pipe.call(|out| resp::command(out, args))?;
        let left = deadline.saturating_duration_since(Instant::now());
        match monoio::time::timeout(left, slot.wait()).await {
            Ok(r) => r,
            Err(_) => {
                self.count(Fault::Timeout);
                *self.reason.borrow_mut() = "no reply in time".into();
                Err(Fault::Timeout)
            }
        }
    }

    /// `AUTH`, `SELECT`, `SCRIPT LOAD`, the first lease.
    async fn handshake(&self) -> Result<(), Fault> {
        self.reason.borrow_mut().clear();
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let url = &self.s.url;
        let must_ok = |what: &str, r: Result<Reply, Fault>| match r {
            Ok(Reply::Simple(_)) => Ok(()),
            Ok(other) => {
                let e = other.error().map_or_else(
                    || "unexpected reply".into(),
                    |e| String::from_utf8_lossy(&e[..e.len().min(200)]).into_owned(),
                );
                *self.reason.borrow_mut() = format!("{what}: {e}");
                Err(Fault::Connect)
            }
            Err(f) => Err(f),
        };
        if let Some(pass) = &url.password {
            let r = match &url.username {
                Some(user) => {
                    self.command(&[Arg::S("AUTH"), Arg::S(user), Arg::S(pass)], deadline)
                        .await
                }
                None => {
                    self.command(&[Arg::S("AUTH"), Arg::S(pass)], deadline)
                        .await
                }
            };
            must_ok("AUTH", r)?;
        }
        if url.db != 0 {
            let r = self
                .command(&[Arg::S("SELECT"), Arg::U(u64::from(url.db))], deadline)
                .await;
            must_ok("SELECT", r)?;
        }
        // Not fatal: a server that refuses SCRIPT LOAD may still run EVAL (the NOSCRIPT path).
        let r = self
            .command(
                &[Arg::S("SCRIPT"), Arg::S("LOAD"), Arg::S(script::SOURCE)],
                deadline,
            )
            .await?;
        if let Some(e) = r.error() {
            self.reply_error(e);
        }
        self.renew_lease(deadline).await
    }

    /// `SET <prefix>live:<instance> 1 PX <lease>`.
    async fn renew_lease(&self, deadline: Instant) -> Result<(), Fault> {
        let key = format!("{}{}", self.live_prefix, self.instance);
        let ms = self.s.lease.as_millis() as u64;
        match self
            .command(
                &[
                    Arg::S("SET"),
                    Arg::S(&key),
                    Arg::S("1"),
                    Arg::S("PX"),
                    Arg::U(ms),
                ],
                deadline,
            )
            .await?
        {
            Reply::Simple(_) => Ok(()),
            other => {
                self.reply_error(other.error().unwrap_or(b"unexpected reply to SET"));
                Err(Fault::Reply)
            }
        }
    }

    /// Log a state change (once per change).
    fn note(&self, up: bool, detail: &str) {
        if self.logged.get() == Some(up) {
            return;
        }
        self.logged.set(Some(up));
        let (shard, url) = (self.shard, &self.s.url);
        if up {
            crate::observe::log::info(format_args!(
                "shard {shard}: limit store {url} up: limits are shared{detail}"
            ));
        } else {
            let then = if self.s.closed {
                "refusing requests of limited keys with 503 until it is back (on_store_error = \"closed\")"
            } else {
                "limits are per process until it is back (on_store_error = \"local\")"
            };
            crate::observe::log::info(format_args!(
                "shard {shard}: limit store {url} unavailable ({}); {then}",
                self.reason.borrow()
            ));
        }
    }

    /// `ringgate_limit_store_*` for this shard.
    pub fn render(&self, out: &mut String) {
        let shard = self.shard;
        let help = crate::observe::metrics::help;
        help(
            out,
            "ringgate_limit_store_up",
            "gauge",
            "1 when the shard's connection to the shared limits store is up.",
        );
        let _ = writeln!(
            out,
            "ringgate_limit_store_up{{shard=\"{shard}\"}} {}",
            u8::from(self.up.get())
        );
        help(
            out,
            "ringgate_limit_store_errors_total",
            "counter",
            "Shared limits store errors by kind (connect, timeout, io, reply).",
        );
        for (i, f) in COUNTED.iter().enumerate() {
            let _ = writeln!(
                out,
                "ringgate_limit_store_errors_total{{shard=\"{shard}\",kind=\"{}\"}} {}",
                f.as_str(),
                self.errors[i].get()
                    + if *f == Fault::Reply {
                        self.pipe.ignored_errors.get()
                    } else {
                        0
                    }
            );
        }
        help(
            out,
            "ringgate_limit_store_fallbacks_total",
            "counter",
            "Requests whose limits were decided without the shared store (local) or refused (closed).",
        );
        for (i, mode) in ["local", "closed"].iter().enumerate() {
            let _ = writeln!(
                out,
                "ringgate_limit_store_fallbacks_total{{shard=\"{shard}\",mode=\"{mode}\"}} {}",
                self.fallbacks[i].get()
            );
        }
        help(
            out,
            "ringgate_limit_store_connects_total",
            "counter",
            "Connections made to the shared limits store.",
        );
        let _ = writeln!(
            out,
            "ringgate_limit_store_connects_total{{shard=\"{shard}\"}} {}",
            self.connects.get()
        );
    }
}
