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
//! **TLS** (`rediss://`): rustls, trusting `redis_ca_file` or the system roots, the server's
//! certificate checked against the URL's host (`tls`); the handshake is part of the connect
//! deadline. **ACL users**: `AUTH <redis_username> <password>` (the password from
//! `redis_password_env` or the URL).
//!
//! **Logging**: one line per state change per shard (down with the reason, up with what was
//! caught up); script error replies at most one line a second. The password is never logged
//! (`RedisUrl`'s `Display`). **Metrics**: `ringgate_limit_store_up`, errors by kind, requests
//! decided without the store by mode, connects.
//!
//! Owns: `Store` (state, deadlines, reconnect loop, lease; its log lines and metrics in
//! `report`, its `Settings` in `settings`). Must not:
//! decide limits (that is `governance::shared` with the script), or block the shard.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::io::{AsyncReadRent, AsyncWriteRent, Split};

use crate::observe::log::RateLimited;

pub mod cluster;
pub mod pipeline;
mod report;
pub mod resp;
pub mod script;
mod settings;
pub mod tls;

pub use settings::Settings;
use settings::{open, Conn};

use pipeline::{Fault, Pipeline};
use resp::{Arg, Reply};
use script::{By, Ident, Op};

/// Longest a connect plus handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The key of a plain command (its second word, as in `GET k` / `SET k v`).
fn key_of<'a>(args: &[Arg<'a>]) -> &'a [u8] {
    match args.get(1) {
        Some(Arg::B(b)) => b,
        Some(Arg::S(s)) => s.as_bytes(),
        _ => b"",
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
    /// `redis_cluster = true`: the slot map and a connection per master (`pipe` is unused).
    cluster: Option<cluster::Cluster>,
    /// The fleet's connection (`governance::fleet`), not a shard's: its own log lines.
    fleet: bool,
    /// Another user's connection on a shard (`Store::for_user`): its log lines name it.
    user: Option<(&'static str, &'static str)>,
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
            cluster: s.cluster.then(cluster::Cluster::default),
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
            fleet: false,
            user: None,
        }
    }

    /// Shard `shard`'s connection for another user of the store (`what`, e.g. "responses"),
    /// whose log lines say what happens while it is down (`meanwhile`).
    pub fn for_user(
        s: Settings,
        shard: usize,
        what: &'static str,
        meanwhile: &'static str,
    ) -> Store {
        Store {
            user: Some((what, meanwhile)),
            ..Store::new(s, shard)
        }
    }

    /// The fleet thread's connection (`governance::fleet`): same settings, its own log lines
    /// (`keys`: shared keys are on, else it carries fleet usage only).
    pub fn for_fleet(s: Settings, keys: bool) -> Store {
        Store {
            fleet: true,
            user: (!keys).then_some(("fleet: usage", "fleet usage answers 503 until it is back")),
            ..Store::new(s, 0)
        }
    }

    /// How long a request waits for a reply (`redis_timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.s.timeout
    }

    /// Whether the store is connected and ready.
    pub fn up(&self) -> bool {
        self.up.get()
    }

    /// `on_store_error = "closed"`.
    pub fn closed(&self) -> bool {
        self.s.closed
    }

    /// `mode = "leased"` (`governance::lease`).
    pub fn leased(&self) -> bool {
        self.s.leased
    }

    /// This shard's number.
    pub fn shard(&self) -> usize {
        self.shard
    }

    pub fn prefix(&self) -> &str {
        &self.s.prefix
    }

    /// How the limits' keys are named (hash-tagged on a Cluster).
    pub fn ns(&self) -> script::Ns<'_> {
        script::Ns {
            prefix: &self.s.prefix,
            tag: self.cluster.is_some(),
        }
    }

    /// The node serving `key` on a Cluster (`Ok(None)`: not a Cluster, use `pipe`); a slot
    /// without a connected node is a store error (and asks for a fresh map).
    fn target(&self, key: &[u8]) -> Result<Option<Rc<cluster::Node>>, Fault> {
        let Some(c) = &self.cluster else {
            return Ok(None);
        };
        match c.route(key) {
            Some(n) => Ok(Some(n)),
            None => {
                c.refresh.set(true);
                c.changed.notify();
                Err(Fault::Down)
            }
        }
    }

    fn pipe_of<'p>(&'p self, node: &'p Option<Rc<cluster::Node>>) -> &'p Pipeline {
        node.as_ref().map_or(&self.pipe, |n| &n.pipe)
    }

    /// Send what `encode` writes to `key`'s node and wait for the reply until `deadline`,
    /// following Cluster redirections (at most 3) and `NOSCRIPT` (once).
    async fn exchange(
        &self,
        key: &[u8],
        encode: &dyn Fn(&mut Vec<u8>, By<'_>),
        deadline: Instant,
    ) -> Result<Reply, Fault> {
        let mut node = self.target(key)?;
        let mut by = By::Sha(&self.sha);
        let (mut asking, mut hops) = (false, 0);
        loop {
            let pipe = self.pipe_of(&node);
            if asking {
                pipe.send(|out| resp::command(out, &[Arg::S("ASKING")]));
            }
            let slot = pipe.call(|out| encode(out, by))?;
            let reply = match slot.until(deadline).await {
                Some(r) => r?,
                None => {
                    self.count(Fault::Timeout);
                    *self.reason.borrow_mut() =
                        format!("no reply within {} ms", self.s.timeout.as_millis());
                    pipe.fail(Fault::Timeout);
                    return Err(Fault::Timeout);
                }
            };
            let Some(e) = reply.error() else {
                return Ok(reply);
            };
            if e.starts_with(b"NOSCRIPT") && matches!(by, By::Sha(_)) {
                by = By::Source;
                continue;
            }
            if let (Some(c), Some(r), true) = (&self.cluster, cluster::redirect(e), hops < 3) {
                hops += 1;
                crate::observe::metrics::bump(&c.redirects);
                (node, asking) = match r {
                    cluster::Redirect::Moved(slot, addr) => (
                        Some(c.moved(&self.s, slot, addr).ok_or(Fault::Down)?),
                        false,
                    ),
                    cluster::Redirect::Ask(_, addr) => {
                        let n = c.node(&self.s, addr).filter(|n| n.up());
                        (Some(n.ok_or(Fault::Down)?), true)
                    }
                };
                continue;
            }
            self.reply_error(e);
            return Err(Fault::Reply);
        }
    }

    fn ident(&self) -> Ident<'_> {
        Ident {
            instance: &self.instance,
            live_prefix: if self.cluster.is_some() {
                ""
            } else {
                &self.live_prefix
            },
            lease_ms: if self.cluster.is_some() {
                self.s.lease.as_millis() as u64
            } else {
                0
            },
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
        let id = self.ident();
        self.exchange(op.key(), &|out, by| op.encode(out, by, &id), deadline)
            .await
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
        let Ok(node) = self.target(op.key()) else {
            return false;
        };
        let id = self.ident();
        self.pipe_of(&node)
            .send(|out| op.encode(out, By::Sha(&self.sha), &id))
    }

    /// Queue adding `amount` (capped at `i64::MAX`) to the counter `key`, whose time to live
    /// becomes `ttl_ms` (false: not connected, nothing sent).
    pub fn add(&self, key: &[u8], amount: u64, ttl_ms: u64) -> bool {
        let amount = amount.min(i64::MAX as u64) as i64;
        self.send(Op::Add {
            key,
            amount,
            ttl_ms,
        })
    }

    /// Connect, serve, reconnect — forever (the shard's runtime drops it at shutdown).
    /// `on_up` runs in the step that marks the store up (resync and catch-up: it queues
    /// commands and returns what it caught up, for the log).
    /// On a Cluster, `on_renew` runs at every lease renewal (it renews the per-key live keys of
    /// the keys this shard holds requests of: `renew_in_flight`).
    pub async fn maintain(&self, on_up: &dyn Fn() -> String, on_renew: &dyn Fn()) {
        if let Some(c) = &self.cluster {
            return self.maintain_cluster(c, on_up, on_renew).await;
        }
        let mut backoff = MIN_BACKOFF;
        loop {
            let started = Instant::now();
            let fault = match self.connect().await {
                Ok(Conn::Plain(stream)) => self.connection(stream, on_up).await,
                Ok(Conn::Tls(stream)) => self.connection(*stream, on_up).await,
                Err(why) => {
                    *self.reason.borrow_mut() = why;
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

    /// Connect to the store's address (counted).
    async fn connect(&self) -> Result<Conn, String> {
        let c = open(&self.s, self.s.addr, None).await?;
        crate::observe::metrics::bump(&self.connects);
        Ok(c)
    }

    /// A Cluster's life: the slot map (fetched at start, every `cluster::REFRESH`, and when a
    /// redirect or a node's failure asks), the nodes' connections (their own tasks), the lease.
    /// The store is up while every slot's master is connected; a node going down takes it down
    /// (requests are decided as `on_store_error` says) until the map is whole again, and coming
    /// back up resyncs like a reconnect.
    async fn maintain_cluster(
        &self,
        c: &cluster::Cluster,
        on_up: &dyn Fn() -> String,
        on_renew: &dyn Fn(),
    ) {
        let started = Instant::now();
        let seed = self.s.addr;
        let mut mapped: Option<Instant> = None;
        let mut leased = started;
        loop {
            let now = Instant::now();
            if c.nodes.borrow().is_empty() {
                c.node(&self.s, seed);
            }
            let stale = mapped.is_none_or(|t| now.duration_since(t) >= cluster::REFRESH);
            if c.refresh.get() || stale {
                if let Some(n) = c.any_up(seed) {
                    c.refresh.set(false);
                    let asked = &[Arg::S("CLUSTER"), Arg::S("SLOTS")];
                    let got = cluster::ask(&n.pipe, asked, now + CONNECT_TIMEOUT).await;
                    match got.map(|r| cluster::parse_slots(&r, n.addr)) {
                        Ok(Ok(ranges)) => {
                            if !c.apply(&self.s, &ranges) {
                                *self.reason.borrow_mut() =
                                    "the slot map does not cover every slot".into();
                            }
                            mapped = Some(now);
                        }
                        Ok(Err(why)) => {
                            self.count(Fault::Reply);
                            *self.reason.borrow_mut() = why;
                        }
                        Err(f) => {
                            *self.reason.borrow_mut() = format!("CLUSTER SLOTS: {}", f.as_str())
                        }
                    }
                }
            }
            let ready = mapped.is_some() && c.all_up();
            if ready && !self.up.get() {
                // like a fresh connection: the lease, then (in the step that marks it up) resync
                if self.renew_lease(now + CONNECT_TIMEOUT).await.is_ok() {
                    leased = Instant::now();
                    let caught_up = on_up();
                    self.up.set(true);
                    self.note(true, &caught_up);
                }
            } else if !ready {
                if self.up.replace(false) {
                    self.count(Fault::Connect);
                    // a master went away: a failover may have moved its slots
                    c.refresh.set(true);
                }
                if self.up.get() || started.elapsed() > 2 * CONNECT_TIMEOUT || c.failed() {
                    if self.reason.borrow().is_empty() || mapped.is_some() {
                        *self.reason.borrow_mut() = c.reason();
                    }
                    self.note(false, "");
                }
            } else if now.duration_since(leased) >= self.s.lease / 3 {
                leased = now;
                on_renew();
                let _ = self.renew_lease(now + CONNECT_TIMEOUT).await;
            }
            let tick = if ready {
                (self.s.lease / 3).min(cluster::REFRESH)
            } else {
                MIN_BACKOFF
            };
            monoio::select! {
                _ = c.changed.wait() => {}
                _ = monoio::time::sleep(tick) => {}
            }
        }
    }

    /// One connection's life: handshake, up, lease renewals until something fails.
    async fn connection<S: Split + AsyncReadRent + AsyncWriteRent>(
        &self,
        stream: S,
        on_up: &dyn Fn() -> String,
    ) -> Fault {
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
        let deadline = Instant::now() + self.s.timeout;
        self.exchange(key_of(args), &|out, _| resp::command(out, args), deadline)
            .await
    }

    /// One plain command routed by `key` (on a Cluster), waited for until `deadline`: for
    /// commands whose key is not their second word (`EVAL script n key ...`).
    pub async fn call_at(
        &self,
        key: &[u8],
        args: &[Arg<'_>],
        deadline: Instant,
    ) -> Result<Reply, Fault> {
        if !self.up.get() {
            return Err(Fault::Down);
        }
        self.exchange(key, &|out, _| resp::command(out, args), deadline)
            .await
    }

    /// Queue one plain command without waiting for its reply (false: not connected).
    pub fn send_command(&self, args: &[Arg<'_>]) -> bool {
        let Ok(node) = self.target(key_of(args)) else {
            return false;
        };
        self.up.get() && self.pipe_of(&node).send(|out| resp::command(out, args))
    }

    /// Send one plain command and wait for its reply until `deadline`.
    async fn command(&self, args: &[Arg<'_>], deadline: Instant) -> Result<Reply, Fault> {
        let slot = self.pipe.call(|out| resp::command(out, args))?;
        slot.until(deadline).await.unwrap_or_else(|| {
            self.count(Fault::Timeout);
            *self.reason.borrow_mut() = "no reply in time".into();
            Err(Fault::Timeout)
        })
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

    /// `SET <prefix>live:<instance> 1 PX <lease>` (on a Cluster, to the key's master).
    async fn renew_lease(&self, deadline: Instant) -> Result<(), Fault> {
        let key = format!("{}{}", self.live_prefix, self.instance);
        let ms = self.s.lease.as_millis() as u64;
        let args = [
            Arg::S("SET"),
            Arg::S(&key),
            Arg::S("1"),
            Arg::S("PX"),
            Arg::U(ms),
        ];
        let reply = match self.cluster {
            Some(_) => {
                self.exchange(
                    key.as_bytes(),
                    &|out, _| resp::command(out, &args),
                    deadline,
                )
                .await?
            }
            None => self.command(&args, deadline).await?,
        };
        match reply {
            Reply::Simple(_) => Ok(()),
            other => {
                self.reply_error(other.error().unwrap_or(b"unexpected reply to SET"));
                Err(Fault::Reply)
            }
        }
    }

    /// On a Cluster: renew this shard's live key of the in-flight hash `hash` (without waiting;
    /// it holds requests of that key).
    pub fn renew_in_flight(&self, hash: &[u8]) {
        if self.cluster.is_none() {
            return;
        }
        let mut key = hash.to_vec();
        key.extend_from_slice(b":live:");
        key.extend_from_slice(self.instance.as_bytes());
        let ms = self.s.lease.as_millis() as u64;
        self.send_command(&[
            Arg::S("SET"),
            Arg::B(&key),
            Arg::S("1"),
            Arg::S("PX"),
            Arg::U(ms),
        ]);
    }
}
