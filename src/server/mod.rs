//! Starting the gateway: bind the listeners, build each shard's state (route table, upstream
//! client, metrics) on its own thread, run its accept loop until shutdown.
//!
//! Also opens the state store (`governance::state`), builds the key registry and its directory
//! (the shards follow it), the published config and its `reload::Reloader` (SIGHUP, `POST
//! /admin/reload`; the shards follow it through `forward::live`), the per-address tables every
//! shard shares (`admit::peer`: connections per address on accept, unknown-key guesses), and
//! starts the admin listener (`admin`) when `[admin]` is configured. `accept`: the accept
//! policy both listeners apply (charge, caps, probes); `tls`: the TLS client listener. Threads, drivers and shutdown signals are `runtime`.
//!
//! Owns: building each `Shard` (see `pipeline::shard`) and `Running` (the handle tests and
//! `main` hold). Must not: handle requests — that is `pipeline`.

pub mod accept;
pub mod tls;

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::admit::Admission;
use crate::config::Config;
use crate::forward::live::LiveRouting;
use crate::governance::registry::Registry;
use crate::governance::{self, Governance, SpendBook};
use crate::http::conn::{ClientConn, Limits, ReadBufs};
use crate::http::edge::EdgePolicy;
use crate::http::request_id::{self, IdGen};
use crate::observe::accesslog::{AccessLog, ShardLog};
use crate::observe::metrics::{MetricsHub, ShardMetrics};
use crate::pipeline;
use crate::pipeline::shard::Shard;
use crate::runtime::shutdown::{LocalSignal, Shutdown};
use crate::runtime::{self, DriverChoice};
use crate::upstream::Client;
use accept::Verdict;

/// How long the last spans may take to leave at shutdown.
const TELEMETRY_FLUSH: Duration = Duration::from_secs(5);

/// A started gateway.
pub struct Running {
    pub addr: SocketAddr,
    /// The TLS listener's address (`server.tls_listen`), when there is one.
    pub tls_addr: Option<SocketAddr>,
    /// The certificate the TLS listener serves (a reload swaps it: `TlsCerts::reload`).
    pub tls_certs: Option<Arc<crate::server::tls::TlsCerts>>,
    pub shards: usize,
    /// Stops accepting and drains every shard (SIGTERM, `POST /admin/drain`).
    pub shutdown: Shutdown,
    /// The process-wide usage and spend ledger (per key × model), shared by every shard.
    pub spend: Arc<SpendBook>,
    /// Ends the process: the admin listener closes too (SIGTERM, `stop`).
    pub exit: Shutdown,
    /// The admin listener's bound address, when `[admin]` is configured.
    pub admin_addr: Option<SocketAddr>,
    /// The state file, when there is one.
    pub state_file: Option<std::path::PathBuf>,
    /// Reloads the config file into the running shards (SIGHUP, `POST /admin/reload`).
    pub reloader: Arc<crate::control::reload::Reloader>,
    /// Whether API requests needed a key at start (keys can turn on later, see `registry`).
    pub keys_checked: bool,
    handles: Vec<JoinHandle<()>>,
    /// The access-log writer (ends after the shards, once it wrote their last lines).
    log_writer: Option<JoinHandle<()>>,
    /// The request log export's writer (the same).
    request_log_writer: Option<JoinHandle<()>>,
    /// The trace export (flushed after the shards, within `TELEMETRY_FLUSH`).
    telemetry: Arc<crate::telemetry::switch::Switch>,
    admin: Option<crate::control::admin::Admin>,
    state: Option<Arc<crate::governance::state::Store>>,
}

impl Running {
    /// Stop accepting, drain, close the admin listener, wait for every thread, write the last
    /// state snapshot.
    pub fn stop(self) {
        self.shutdown.fire();
        self.exit.fire();
        self.wait();
    }

    /// Wait until the shards have drained and, with an admin listener, until `exit` fires
    /// (after `POST /admin/drain` the process stays up for the orchestrator to stop).
    pub fn wait(self) {
        for h in self.handles {
            let _ = h.join();
        }
        if !self.telemetry.flush(TELEMETRY_FLUSH) {
            crate::observe::log::info(format_args!(
                "telemetry: the collector did not take the last spans within {} s; they are lost",
                TELEMETRY_FLUSH.as_secs()
            ));
        }
        if let Some(w) = self.log_writer {
            let _ = w.join();
        }
        if let Some(w) = self.request_log_writer {
            let _ = w.join();
        }
        if let Some(a) = self.admin {
            a.join();
        }
        if let Some(s) = self.state {
            s.close();
        }
    }
}

/// The state store (when `state_dir` is set and something is worth keeping: keys or the admin
/// API; the spend ledger in it restored into `book`) and the key registry built from the config
/// and the stored keys.
fn keys_and_state(
    cfg: &Config,
    book: &Arc<SpendBook>,
) -> Result<(Registry, Option<Arc<crate::governance::state::Store>>), String> {
    let (store, stored) = match (&cfg.server.state_dir, crate::governance::state::wanted(cfg)) {
        (Some(dir), true) => {
            let (store, rows) =
                crate::governance::state::Store::open(std::path::Path::new(dir), Some(book))?;
            (Some(Arc::new(store)), rows)
        }
        _ => (None, Vec::new()),
    };
    let (registry, notes) = Registry::build(cfg, &stored, store.clone())?;
    let registry = registry.with_book(book.clone());
    for n in notes {
        crate::observe::log::info(format_args!("{n}"));
    }
    Ok((registry, store))
}

pub fn start(cfg: Config) -> io::Result<Running> {
    start_with_spend(cfg, Arc::new(SpendBook::new()))
}

/// `start`, recording usage and spend in `spend` (e.g. a ledger restored from the state store
/// before traffic).
pub fn start_with_spend(cfg: Config, spend: Arc<SpendBook>) -> io::Result<Running> {
    let addr = cfg
        .listen_addr()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let n = cfg
        .server
        .shards
        .unwrap_or_else(crate::util::cpus::available_cpus)
        .max(1);
    // Secure by default (before anything binds), then the keys, read and hashed once.
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
    let admin_plan = crate::control::admin::plan(&cfg).map_err(invalid)?;
    let (registry, state) = keys_and_state(&cfg, &spend).map_err(invalid)?;
    governance::exposure::check_with(&cfg, addr, registry.checked()).map_err(invalid)?;
    // Keys can change while serving (the admin API, a reload) unless `auth = "none"`: shards
    // follow the directory (one atomic load per request).
    let live_keys = registry.can_check();
    let keys_checked = registry.checked();
    let directory = registry.directory();
    // the shared limits store as before reload existed: keys at start, or the admin API
    let store = match keys_checked || (live_keys && admin_plan.is_some()) {
        true => governance::store::Settings::from_config(&cfg.limits).map_err(invalid)?,
        false => None,
    };
    let (listeners, bound) = runtime::bind_listeners(addr, n)?;
    let tls_listeners = crate::server::tls::bind(&cfg, n)?;
    let tls_loopback = tls_listeners.as_ref().map(|t| t.addr.ip().is_loopback());
    let (tls_addr, tls_certs) = match &tls_listeners {
        Some(t) => (Some(t.addr), Some(t.certs.clone())),
        None => (None, None),
    };
    // Upstream host names are looked up now, off the shards (see `upstream::resolve`).
    let endpoints: Vec<_> = cfg
        .providers
        .iter()
        .filter_map(|p| {
            crate::config::endpoint::Endpoint::parse(p.base_url.as_ref()?.get_ref()).ok()
        })
        .collect();
    let tcp = endpoints.iter().filter(|e| e.unix.is_none());
    crate::upstream::resolve::global().prime(tcp.map(|e| (e.host.as_str(), e.port)));
    let driver = DriverChoice::resolve(cfg.server.driver.get_ref());
    let needs_tls = cfg.providers.iter().any(|p| {
        p.base_url
            .as_ref()
            .is_some_and(|u| u.get_ref().starts_with("https://"))
    });
    let ca_files: Vec<String> = cfg
        .providers
        .iter()
        .filter_map(|p| p.ca_file.clone())
        .collect();
    let tls = match needs_tls {
        true => Some(
            crate::upstream::tls::client_config(&ca_files)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        ),
        false => None,
    };
    let loopback = addr.ip().is_loopback();
    // /metrics on the client listeners only while every one of them is loopback (a shard serves
    // the plain and the TLS listener alike), or when the config asks for it
    let metrics_here = (loopback && tls_loopback.unwrap_or(true)) || cfg.server.metrics_on_main;
    let drain_timeout_ms = cfg.server.drain_timeout_ms;
    // engine load signals: one poller thread per engine provider (none without `engine`)
    let engines = crate::engine::Engines::start(&cfg, None);
    // what every shard follows: a reload publishes here (`reload`, `shard::routing`)
    let published = Arc::new(crate::forward::live::Published::new(
        crate::forward::live::Setup {
            config: cfg.clone(),
            engines,
            routing_cells: Default::default(),
        },
    ));
    let cfg = Arc::new(cfg);
    let registry = Arc::new(std::sync::Mutex::new(registry));
    let shutdown = Shutdown::new();
    let exit = Shutdown::new();
    let hub = MetricsHub::new(n, &cfg.hash);
    // the fleet thread: shared keys (it follows the store's keys into the registry) and fleet
    // usage (this node's ledger rows published for `?scope=fleet`, with an admin listener)
    let mut fleet_keys = None;
    let shared_keys = cfg.fleet.keys() && live_keys;
    if let (true, Some(s)) = (shared_keys || admin_plan.is_some(), &store) {
        let sink = shared_keys.then(|| {
            Arc::new(governance::registry::Sink(registry.clone()))
                as Arc<dyn governance::fleet::KeySink>
        });
        let book = spend.clone();
        let fleet = governance::fleet::Fleet::start(
            s.clone(),
            sink,
            cfg.fleet.node_name(),
            Arc::new(move || book.snapshot()),
            exit.clone(),
        )
        .map_err(invalid)?;
        if shared_keys {
            if let Ok(mut r) = registry.lock() {
                r.with_fleet(fleet.clone());
            }
        }
        fleet_keys = Some(fleet);
    }
    let admin_fleet = fleet_keys.clone();
    let cache = crate::cache::Cache::build(&cfg, n).map(Arc::new);
    if let Some(c) = &cache {
        let c = c.clone();
        let _ = hub
            .process
            .extra
            .set(crate::observe::metrics::process::Extra(Arc::new(
                move |out: &mut String| c.stats.render(c.settings.max_bytes, out),
            )));
    }
    let admin_cache = cache.clone();
    // the exact layer in the [limits] Redis (whether or not the limits use it)
    let cache_redis = match (&cache, cfg.cache.redis()) {
        (Some(_), true) => {
            let mut l = cfg.limits.clone();
            l.store = toml::Spanned::new(0..0, "redis".into());
            governance::store::Settings::from_config(&l).map_err(invalid)?
        }
        _ => None,
    };
    let tag = request_id::process_tag();
    let dropped = hub.process.access_log_dropped.clone();
    let (access_log, log_writer) = match AccessLog::start(&cfg.log.access(), dropped)? {
        Some((log, writer)) => (Some(log), Some(writer)),
        None => (None, None),
    };
    let telemetry = crate::telemetry::switch::Switch::start(
        &cfg.telemetry,
        hub.process.telemetry_spans.clone(),
    )?;
    let (request_log, request_log_writer) = match crate::telemetry::requests::start(
        cfg.log.requests_file.as_deref(),
        cfg.log.requests_file_max_bytes.bytes(),
        hub.process.request_log_dropped.clone(),
    )? {
        Some((log, writer)) => (Some(log), Some(writer)),
        None => (None, None),
    };
    let admin_hub = hub.clone();
    let reloader = Arc::new(
        crate::control::reload::Reloader::new(
            &cfg,
            cfg.origin.text.as_deref(),
            published.clone(),
            hub.process.clone(),
            live_keys.then(|| registry.clone()),
            tls_certs.clone(),
        )
        .with_cache(cache.clone())
        .with_telemetry(telemetry.clone()),
    );
    // the Responses state store: one for the process (see `responses_state`)
    // shared Responses state: the same store, also without keys (`auth = "none"`)
    let responses_store = match (cfg.fleet.responses(), &store) {
        (false, _) => None,
        (true, Some(s)) => Some(s.clone()),
        (true, None) => governance::store::Settings::from_config(&cfg.limits).map_err(invalid)?,
    };
    let responses =
        crate::responses_state::Shared::from_config(&cfg.responses, n, responses_store.is_some());
    if fleet_keys.is_some() || cfg.fleet.responses() {
        let r = responses.clone();
        let _ = hub
            .process
            .fleet
            .set(crate::observe::metrics::process::Extra(Arc::new(
                move |out: &mut String| {
                    if let Some(f) = &fleet_keys {
                        f.render(out);
                    }
                    if let Some(r) = &r {
                        r.render(out);
                    }
                },
            )));
    }
    let pin = cfg.server.pin;
    // per client address, process-wide: open connections, and unknown keys presented
    let peers = crate::admit::peer::Addresses::new(
        cfg.server.max_connections_per_address,
        cfg.server.max_connections as u64,
    );
    let key_guesses = live_keys.then(|| Arc::new(crate::admit::peer::Slowdown::new()));
    let admin_edge = admin_plan
        .as_ref()
        .map(|(a, ..)| EdgePolicy::new(&[], a.ip().is_loopback(), &cfg.server.allowed_hosts));
    let spin = Duration::from_micros(cfg.server.idle_spin_us);
    let sd = shutdown.clone();
    let book = spend.clone();
    // every key's limit counters, shared by the shards (limits are per key, not per shard)
    let counters = Arc::new(governance::Counters::new());
    // MCP sessions belong to the process: a session's next request may land on any shard
    let mcp = Arc::new(crate::mcp::Hub::new(&cfg.mcp));
    let for_scrape = mcp.clone();
    let _ = hub
        .process
        .mcp
        .set(crate::observe::metrics::process::Extra(Arc::new(
            move |out: &mut String| for_scrape.render(out),
        )));
    let shard_telemetry = telemetry.clone();
    let handles = runtime::spawn(
        listeners,
        driver,
        pin,
        move |id, std_listener, driver_name| {
            let cfg = cfg.clone();
            let tls = tls.clone();
            let sd = sd.clone();
            let hub = hub.clone();
            let tls_listeners = tls_listeners.clone();
            let governance = Governance::follow(directory.clone(), live_keys, id)
                .with_counters(counters.clone())
                .with_store(store.clone().map(|s| governance::store::Store::new(s, id)));
            let book = book.clone();
            let access_log = ShardLog::new(access_log.clone());
            let request_log = ShardLog::new(request_log.clone());
            let cache = cache.clone();
            let cache_remote = cache_redis
                .clone()
                .map(|s| Rc::new(crate::cache::redis::Remote::new(s, id)));
            let published = published.clone();
            let responses = responses.clone();
            let responses_store = responses_store.clone();
            let peers = peers.clone();
            let key_guesses = key_guesses.clone();
            let telemetry = shard_telemetry.clone();
            let mcp = mcp.clone();
            async move {
                let s = &cfg.server;
                // Each shard seeds its own p2c choices (state is per shard, never shared).
                let seed = 0x9e37_79b9_7f4a_7c15 ^ id as u64;
                let live = LiveRouting::new(&published.load().1, Some(published), 0, seed);
                let governance = governance.with_spend(&book, &live.peek().routes);
                drop(book);
                let admission = Admission::new(&cfg.admission, n).with_shard(id);
                let shard = Rc::new(Shard {
                    id,
                    driver: driver_name,
                    limits: Limits {
                        max_head: s.max_head_bytes,
                        max_headers: s.max_headers,
                        header_timeout: Duration::from_millis(s.header_timeout_ms),
                        body_timeout: Duration::from_millis(s.body_timeout_ms),
                        idle_timeout: Duration::from_millis(s.idle_timeout_ms),
                        first_head_timeout: Duration::from_millis(
                            s.first_request_timeout_ms.min(s.idle_timeout_ms),
                        ),
                        write_timeout: Duration::from_millis(cfg.upstream.stream_gap_timeout_ms),
                    },
                    responses: crate::responses_state::ShardStore::new(
                        responses.clone(),
                        id,
                        admission.budget(),
                    )
                    .with_remote(responses.and_then(|r| r.remote(responses_store.clone(), id))),
                    admission,
                    live,
                    upstream: Client::new(
                        &cfg.upstream,
                        tls.map(monoio_rustls::TlsConnector::from),
                    ),
                    governance,
                    metrics: ShardMetrics::default(),
                    guardrail_hits: Default::default(),
                    hub,
                    draining: LocalSignal::default(),
                    drain_expired: LocalSignal::default(),
                    over_cap: std::cell::Cell::new(0),
                    peers,
                    key_guesses,
                    read_bufs: ReadBufs::new(Duration::from_millis(s.idle_release_ms)),
                    edge: EdgePolicy::new(&s.cors_allow_origins, loopback, &s.allowed_hosts)
                        .with_tls_listener(tls_loopback.unwrap_or(loopback)),
                    tls: Default::default(),
                    drain_time: Duration::from_millis(s.drain_timeout_ms),
                    request_ids: IdGen::new(id, tag),
                    access_log,
                    request_log,
                    stopping: sd.clone(),
                    metrics_here,
                    cache,
                    cache_remote,
                    telemetry: Some(crate::telemetry::ShardTelemetry::new(telemetry)),
                    mcp,
                });
                drop(cfg);
                if let Some(t) = &tls_listeners {
                    t.start_shard(id, &shard, &sd);
                }
                if spin > Duration::ZERO {
                    monoio::spawn(crate::runtime::spin::run(spin));
                }
                accept_loop(std_listener, shard, sd).await;
            }
        },
    )?;
    let admin = match admin_plan {
        Some((admin_addr, token, token_env)) => Some(crate::control::admin::start(
            admin_addr,
            crate::control::admin::Ctx {
                registry,
                reloader: reloader.clone(),
                token,
                token_env,
                hub: admin_hub,
                spend: spend.clone(),
                drain: shutdown.clone(),
                drain_timeout_ms,
                exit: exit.clone(),
                cache: admin_cache,
                fleet: admin_fleet,
                edge: admin_edge.unwrap_or_default(),
            },
        )?),
        None => None,
    };
    Ok(Running {
        addr: bound,
        tls_addr,
        tls_certs,
        shards: n,
        shutdown,
        spend,
        exit,
        admin_addr: admin.as_ref().map(|a| a.addr),
        state_file: state.as_ref().map(|s| s.path().to_path_buf()),
        reloader,
        keys_checked,
        handles,
        log_writer,
        request_log_writer,
        telemetry,
        admin,
        state,
    })
}

async fn accept_loop(std_listener: std::net::TcpListener, shard: Rc<Shard>, shutdown: Shutdown) {
    monoio::spawn(publish_metrics(shard.clone()));
    if shard.governance.shares_limits() {
        let s = shard.clone();
        monoio::spawn(async move { s.governance.maintain_store().await });
    }
    if shard.access_log.on() || shard.request_log.on() {
        monoio::spawn(flush_access_log(shard.clone()));
    }
    if let Some(r) = shard.cache_remote.clone() {
        monoio::spawn(async move { r.maintain().await });
    }
    if let Some(r) = shard.responses.remote() {
        monoio::spawn(async move { r.maintain().await });
    }
    let name = format!("shard {}", shard.id);
    let open = || shard.metrics.connections.get();
    runtime::accept_until(
        &name,
        std_listener,
        &shutdown,
        runtime::Drain {
            started: &shard.draining,
            expired: Some(&shard.drain_expired),
            time: shard.drain_time,
        },
        open,
        |stream, addr| {
            let mut conn = ClientConn::pooled(stream, &shard.read_bufs);
            let peer = crate::admit::peer::Peer::of(addr.ip());
            conn.peer = Some(peer);
            match accept::admit(&shard, peer, 0) {
                Verdict::Serve(held) => {
                    let shard = shard.clone();
                    monoio::spawn(async move {
                        pipeline::serve_connection(conn, shard).await;
                        drop(held);
                    });
                }
                Verdict::Probe => {
                    monoio::spawn(pipeline::serve_over_cap(conn, shard.clone()));
                }
                Verdict::Refuse => {
                    monoio::spawn(pipeline::refuse_connection(conn, shard.clone()));
                }
            }
        },
    )
    .await;
    // Drained: the last access-log lines go to the writer, and this shard's end of its queue
    // closes.
    shard.access_log.finish();
    shard.request_log.finish();
}

/// Publish this shard's metrics for scrapes served by other shards, once a second.
/// Also flushes the rate-limited admission log.
async fn publish_metrics(shard: Rc<Shard>) {
    loop {
        shard.admission.log_tick();
        shard.responses.settle();
        crate::forward::report::log_tick(&shard.env(None));
        let mut text = String::with_capacity(8192);
        crate::pipeline::scrape::render_shard(&shard, &mut text);
        shard.hub.publish(shard.id, text);
        monoio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Hand this shard's access-log lines to the writer every `FLUSH_EVERY` (full buffers go at
/// once, see `accesslog`).
async fn flush_access_log(shard: Rc<Shard>) {
    loop {
        monoio::time::sleep(crate::observe::accesslog::FLUSH_EVERY).await;
        shard.access_log.flush();
        shard.request_log.flush();
    }
}
