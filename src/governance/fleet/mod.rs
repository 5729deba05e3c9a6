//! Shared keys (`[fleet] share = ["keys"]`): runtime keys made, patched or revoked through any
//! node's admin API live in the limits store, and every node follows them.
//!
//! - **In the store** (`record`, `keys.lua`): one hash of records by name (`<prefix>{fleet}:keys`:
//!   the SHA-256 of the secret, never the secret; settings; created/updated/revoked; the version
//!   that wrote it), a change log (`<prefix>{fleet}:keys:log`, a sorted set of names scored by
//!   their record's version) and a version counter (`<prefix>{fleet}:keys:ver`). Every key has
//!   the `{fleet}` hash tag, so on a Cluster the script's keys share one slot.
//! - **Writes** (admin thread, `Fleet::put`): the script, atomic in the store, decides: a new
//!   name (or one whose last key was revoked) is written; a patch is written when it was made
//!   on the version the store holds (otherwise the store's record wins: 409 to the admin
//!   client, the node takes the store's record); **a revocation always lands**. The admin API
//!   answers once the store and then the SQLite copy hold the change.
//! - **Change feed: version-counter polling, not pub/sub.** Every `POLL` (250 ms) the fleet
//!   thread reads the counter (one `GET`); when it moved, it reads the names changed since the
//!   version it holds (`ZRANGEBYSCORE`, pages of `PAGE`) and their records (`HMGET`) and hands
//!   them to the registry. Polling because a revocation must never be lost: pub/sub delivers
//!   only to subscribers connected at that moment (a node that was disconnected, restarting or
//!   slow misses it for good and needs this catch-up read anyway), it needs a connection of its
//!   own in subscriber mode, and on a Cluster messages are broadcast over the bus to every
//!   node. The counter read is idempotent, works over the same pipelined connection, through
//!   TLS, ACLs and Clusters, and costs one small command per node per 250 ms; a change reaches
//!   every node within one poll plus a round trip (well under the 1 s the issue asks).
//! - **Store down**: nodes keep serving the keys they hold (the registry and its SQLite copy; a
//!   node starts from its copy); with `on_store_error = "local"` admin changes are made locally
//!   and marked pending, with `"closed"` they are refused (503). **Reconcile** when the store
//!   is back (and at start): this node's pending changes are pushed through the same script
//!   (store wins, revocations always land), then every record is read again from version 0;
//!   the registry applies what differs from its copy.
//! - Config `[[key]]` entries stay per node (never written to the store; a fleet key named like
//!   a config key is not applied on that node, and the log says so).
//! - Logs: one line per store state change; metrics `ringgate_fleet_*` (`Stats`).
//! - **Fleet usage** (`usage`): the same thread writes this node's ledger rows to the store
//!   when they changed (at most once per `usage::EVERY`) and answers the admin thread's
//!   `?scope=fleet` reads. It also runs without shared keys (store configured, admin on):
//!   then it never touches the keys.
//!
//! Owns: the fleet thread (its own small runtime and store connection, `Store::for_fleet`),
//! `Fleet` (the admin thread's handle), `KeySink` (what the registry implements). Must not:
//! run on a shard, hold the registry's lock while waiting on the store (the sink is called
//! with `try_lock` semantics: a busy registry is tried again next poll), or see a secret.

mod record;
pub mod usage;

pub use record::Shared;
pub use usage::NodeUsage;

use std::cell::Cell;
use std::fmt::Write;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use super::spend::UsageRow;
use super::store::resp::{Arg, Reply};
use super::store::{Settings, Store};
use crate::runtime::shutdown::Shutdown;

/// How often the version counter is read.
pub const POLL: Duration = Duration::from_millis(250);
/// Names read per change-log page.
const PAGE: usize = 256;
/// How long an admin write waits for the store's answer.
const WRITE_WAIT: Duration = Duration::from_secs(3);
/// Deadline of one store command of the fleet thread (it may read many records; the request
/// path's `redis_timeout_ms` is not its budget).
const COMMAND: Duration = Duration::from_secs(2);
const SCRIPT: &str = include_str!("keys.lua");

/// What the registry does with the fleet's records.
pub trait KeySink: Send + Sync {
    /// Apply records read from the store (the store wins; a local revocation is kept and pushed
    /// again). `false`: busy (the registry was locked), nothing applied: try again.
    fn apply(&self, recs: &[Shared]) -> bool;
    /// This node's changes the store does not hold yet, each with the version it was made on
    /// (`None`: busy, try again).
    fn pending(&self) -> Option<Vec<(Shared, Option<u64>)>>;
    /// The highest store version among the records held here (`None`: busy).
    fn top(&self) -> Option<u64>;
    /// The store lost records this node holds (flushed, replaced, a fresh server): mark every
    /// API key held here pending, so the next reconcile writes them back (`false`: busy).
    fn reseed(&self) -> bool;
}

/// The answer to a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// The store holds the change (or already held it): its record.
    Stored(Shared),
    /// The store's record stands (it wins): apply it.
    Conflict(Shared),
    /// The store could not be asked (down, too slow, an error): the change is this node's only.
    Down,
}

/// Counters of the fleet thread (`ringgate_fleet_*`).
#[derive(Debug, Default)]
pub struct Stats {
    up: AtomicBool,
    version: AtomicU64,
    polls: AtomicU64,
    applied: AtomicU64,
    pushed: AtomicU64,
    conflicts: AtomicU64,
    errors: AtomicU64,
    bad_records: AtomicU64,
    usage_published: AtomicU64,
    usage_bad: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

enum Req {
    /// A key change to write.
    Put {
        rec: Shared,
        base: Option<u64>,
        ack: SyncSender<Put>,
    },
    /// Every node's usage rows (`None`: a store error).
    Usage {
        ack: SyncSender<Option<Vec<NodeUsage>>>,
    },
}

/// This node's ledger rows, for fleet usage (the spend book's snapshot).
pub type Rows = Arc<dyn Fn() -> Vec<UsageRow> + Send + Sync>;

/// A wake-up another thread can ring (the admin thread, for a write).
#[derive(Default)]
struct Bell {
    rung: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Bell {
    fn ring(&self) {
        self.rung.store(true, Ordering::SeqCst);
        let w = self.waker.lock().ok().and_then(|mut w| w.take());
        if let Some(w) = w {
            w.wake();
        }
    }

    async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.rung.swap(false, Ordering::SeqCst) {
                return Poll::Ready(());
            }
            if let Ok(mut w) = self.waker.lock() {
                *w = Some(cx.waker().clone());
            }
            match self.rung.swap(false, Ordering::SeqCst) {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        })
        .await
    }
}

/// The admin thread's handle on the fleet thread.
pub struct Fleet {
    tx: Mutex<Sender<Req>>,
    bell: Arc<Bell>,
    pub stats: Arc<Stats>,
    /// This node's name in fleet usage (`[fleet] node`).
    node: String,
    /// Shared keys are on (else the thread carries fleet usage only).
    keys: bool,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fleet(up: {})", self.up())
    }
}

impl Fleet {
    /// Start the fleet thread: its store connection, the change feed into `sink` and the key
    /// writes (shared keys on: `sink` given), this node's usage rows published as `node`.
    /// It ends when `exit` fires.
    pub fn start(
        settings: Settings,
        sink: Option<Arc<dyn KeySink>>,
        node: String,
        rows: Rows,
        exit: Shutdown,
    ) -> Result<Arc<Fleet>, String> {
        let (tx, rx) = mpsc::channel();
        let bell = Arc::new(Bell::default());
        let stats = Arc::new(Stats::default());
        let (b, st) = (bell.clone(), stats.clone());
        let keys = sink.is_some();
        let name = node.clone();
        std::thread::Builder::new()
            .name("ringgate-fleet".into())
            .spawn(move || {
                use monoio::{LegacyDriver, RuntimeBuilder};
                match RuntimeBuilder::<LegacyDriver>::new().enable_timer().build() {
                    Ok(mut rt) => rt.block_on(async move {
                        let feed = Feed::new(settings, sink, rx, b, st, name, rows);
                        monoio::select! {
                            _ = feed.run() => {}
                            _ = exit.wait() => {}
                        }
                    }),
                    Err(e) => crate::observe::log::info(format_args!("fleet: no runtime: {e}")),
                }
            })
            .map_err(|e| format!("cannot start the fleet thread: {e}"))?;
        Ok(Arc::new(Fleet {
            tx: Mutex::new(tx),
            bell,
            stats,
            node,
            keys,
        }))
    }

    /// This node's name in fleet usage.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Every node's usage rows as the store holds them (`None`: the store is down or did not
    /// answer in time). Admin thread only (it waits, at most `WRITE_WAIT`).
    pub fn usage(&self) -> Option<Vec<NodeUsage>> {
        let (ack, done) = mpsc::sync_channel(1);
        let sent = self
            .tx
            .lock()
            .ok()
            .is_some_and(|tx| tx.send(Req::Usage { ack }).is_ok());
        if !sent {
            return None;
        }
        self.bell.ring();
        done.recv_timeout(WRITE_WAIT).ok().flatten()
    }

    /// Whether the store is up (as the fleet thread last saw it).
    pub fn up(&self) -> bool {
        self.stats.up.load(Ordering::Relaxed)
    }

    /// The store version this node has applied up to.
    pub fn version(&self) -> u64 {
        self.stats.version.load(Ordering::Relaxed)
    }

    /// Write `rec` (made on store version `base`) and wait for the answer, at most
    /// `WRITE_WAIT` (admin thread only: it may wait, a shard never does).
    pub fn put(&self, rec: &Shared, base: Option<u64>) -> Put {
        if !self.up() {
            return Put::Down;
        }
        let (ack, done) = mpsc::sync_channel(1);
        let sent = self.tx.lock().ok().is_some_and(|tx| {
            tx.send(Req::Put {
                rec: rec.clone(),
                base,
                ack,
            })
            .is_ok()
        });
        if !sent {
            return Put::Down;
        }
        self.bell.ring();
        done.recv_timeout(WRITE_WAIT).unwrap_or(Put::Down)
    }

    /// `ringgate_fleet_*`.
    pub fn render(&self, out: &mut String) {
        let s = &self.stats;
        let help = crate::observe::metrics::help;
        let rows: [(&str, &str, &str, u64); 10] = [
            (
                "ringgate_fleet_store_up",
                "gauge",
                "1 when the fleet thread's connection to the shared store is up (shared keys).",
                u64::from(s.up.load(Ordering::Relaxed)),
            ),
            (
                "ringgate_fleet_keys_version",
                "gauge",
                "The store version of the fleet's keys this node has applied.",
                s.version.load(Ordering::Relaxed),
            ),
            (
                "ringgate_fleet_keys_polls_total",
                "counter",
                "Reads of the fleet's key version counter.",
                s.polls.load(Ordering::Relaxed),
            ),
            (
                "ringgate_fleet_keys_applied_total",
                "counter",
                "Key records read from the store and handed to the registry.",
                s.applied.load(Ordering::Relaxed),
            ),
            (
                "ringgate_fleet_keys_pushed_total",
                "counter",
                "Key changes written to the store (admin writes and pending changes).",
                s.pushed.load(Ordering::Relaxed),
            ),
            (
                "ringgate_fleet_keys_conflicts_total",
                "counter",
                "Key changes the store refused because its record wins.",
                s.conflicts.load(Ordering::Relaxed),
            ),
            (
                "ringgate_fleet_store_errors_total",
                "counter",
                "Fleet store commands that failed (timeouts, errors, the store down).",
                s.errors.load(Ordering::Relaxed),
            ),
            (
                "ringgate_fleet_keys_bad_records_total",
                "counter",
                "Key records in the store this node refused (malformed).",
                s.bad_records.load(Ordering::Relaxed),
            ),
            (
                "ringgate_fleet_usage_published_total",
                "counter",
                "Times this node's usage rows were written to the store (fleet usage).",
                s.usage_published.load(Ordering::Relaxed),
            ),
            (
                "ringgate_fleet_usage_bad_rows_total",
                "counter",
                "Usage rows or node names in the store this node refused (malformed).",
                s.usage_bad.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, text, v) in rows {
            if !self.keys && name.contains("_keys_") {
                continue;
            }
            help(out, name, kind, text);
            let _ = writeln!(out, "{name} {v}");
        }
    }
}

/// The fleet thread's state.
struct Feed {
    store: Rc<Store>,
    /// `None`: shared keys are off (fleet usage only).
    sink: Option<Arc<dyn KeySink>>,
    node: String,
    rows: Rows,
    /// The rows last written (written again only when they changed).
    published: std::cell::RefCell<Option<Vec<UsageRow>>>,
    prefix: String,
    rx: Receiver<Req>,
    bell: Arc<Bell>,
    stats: Arc<Stats>,
    /// The version applied up to (0 after a reconnect: everything is read again).
    seen: Cell<u64>,
    keys: [String; 3],
}

impl Feed {
    fn new(
        mut settings: Settings,
        sink: Option<Arc<dyn KeySink>>,
        rx: Receiver<Req>,
        bell: Arc<Bell>,
        stats: Arc<Stats>,
        node: String,
        rows: Rows,
    ) -> Feed {
        settings.timeout = settings.timeout.max(COMMAND);
        let p = settings.prefix.to_string();
        Feed {
            keys: [
                format!("{p}{{fleet}}:keys"),
                format!("{p}{{fleet}}:keys:log"),
                format!("{p}{{fleet}}:keys:ver"),
            ],
            prefix: p.clone(),
            store: Rc::new(Store::for_fleet(settings, sink.is_some())),
            sink,
            node,
            rows,
            published: Default::default(),
            rx,
            bell,
            stats,
            seen: Cell::new(0),
        }
    }

    async fn run(&self) {
        let store = self.store.clone();
        monoio::spawn(async move { store.maintain(&String::new, &|| {}).await });
        // `None`: not reconciled since the store came up
        let mut synced = false;
        let mut usage_at: Option<Instant> = None;
        loop {
            self.writes().await;
            let up = self.store.up();
            self.stats.up.store(up, Ordering::Relaxed);
            if self.sink.is_none() {
                // fleet usage only
            } else if !up {
                synced = false;
            } else if !synced {
                synced = self.reconcile().await;
            } else if !self.pull().await {
                synced = false;
            }
            if up && usage_at.is_none_or(|t| t.elapsed() >= usage::EVERY) {
                usage_at = Some(Instant::now());
                self.publish().await;
            }
            monoio::select! {
                _ = self.bell.wait() => {}
                _ = monoio::time::sleep(POLL) => {}
            }
        }
    }

    /// Answer the admin thread's requests waiting in the queue.
    async fn writes(&self) {
        while let Ok(req) = self.rx.try_recv() {
            match req {
                Req::Put { rec, base, ack } => {
                    let put = match self.store.up() {
                        true => self.push(&rec, base).await,
                        false => Put::Down,
                    };
                    let _ = ack.send(put);
                }
                Req::Usage { ack } if !self.store.up() => {
                    let _ = ack.send(None);
                }
                Req::Usage { ack } => {
                    // this node's latest rows first, so its own part is current
                    self.publish().await;
                    let mut bad = 0;
                    let got = usage::read(&self.store, &self.prefix, &mut bad).await;
                    add(&self.stats.usage_bad, bad);
                    if let Err(e) = &got {
                        self.failed(&format!("fleet usage: {e}"));
                    }
                    let _ = ack.send(got.ok());
                }
            }
        }
    }

    /// Write this node's usage rows when they changed since the last write.
    async fn publish(&self) {
        let rows = (self.rows)();
        if self.published.borrow().as_ref() == Some(&rows) {
            return;
        }
        if usage::publish(&self.store, &self.prefix, &self.node, &rows).await {
            add(&self.stats.usage_published, 1);
            *self.published.borrow_mut() = Some(rows);
        } else {
            add(&self.stats.errors, 1);
        }
    }

    /// The store came up (or this node started): push what changed here meanwhile, then read
    /// every record again. `false`: do it again next poll.
    async fn reconcile(&self) -> bool {
        let Some(ver) = self.version().await else {
            return false;
        };
        let Some(top) = self.sink.as_ref().and_then(|k| k.top()) else {
            return false;
        };
        let known = top.max(self.seen.get());
        if ver < known {
            crate::observe::log::info(format_args!(
                "fleet: the store holds key version {ver}, this node has seen {known}: it lost records; writing back the keys held here"
            ));
            if !self.sink.as_ref().is_some_and(|k| k.reseed()) {
                return false;
            }
        }
        let Some(pending) = self.sink.as_ref().and_then(|k| k.pending()) else {
            return false;
        };
        let mut back = Vec::new();
        for (rec, base) in &pending {
            match self.push(rec, *base).await {
                Put::Stored(r) | Put::Conflict(r) => back.push(r),
                Put::Down => return false,
            }
        }
        if !back.is_empty() {
            let kept = back
                .iter()
                .zip(&pending)
                .filter(|(b, (p, _))| {
                    b.sha256 != p.sha256
                        || b.spec != p.spec
                        || b.revoked.is_some() != p.revoked.is_some()
                })
                .count();
            crate::observe::log::info(format_args!(
                "fleet: {} key change(s) held here pushed to the store ({kept} of them: the store's record stands)",
                pending.len()
            ));
        }
        if !back.is_empty() && !self.sink.as_ref().is_some_and(|k| k.apply(&back)) {
            return false;
        }
        self.seen.set(0);
        self.pull().await
    }

    /// One script call; counted.
    async fn push(&self, rec: &Shared, base: Option<u64>) -> Put {
        let sha = rec.sha_hex();
        let base = base.map(|b| b.to_string()).unwrap_or_default();
        let [k1, k2, k3] = &self.keys;
        let args = [
            Arg::S("EVAL"),
            Arg::S(SCRIPT),
            Arg::U(3),
            Arg::S(k1),
            Arg::S(k2),
            Arg::S(k3),
            Arg::S(&rec.name),
            Arg::S(&sha),
            Arg::I(rec.created),
            Arg::I(rec.updated),
            Arg::I(rec.revoked_arg()),
            Arg::S(&rec.spec),
            Arg::S(&base),
        ];
        let Some(items) = self.array("script reply", k1, &args).await else {
            return Put::Down;
        };
        let (status, value) = match items.as_slice() {
            [Reply::Bulk(Some(s)), Reply::Bulk(Some(v))] => (s.as_slice(), v),
            _ => {
                self.failed("script reply of the wrong shape");
                return Put::Down;
            }
        };
        let parsed = match Shared::parse(rec.name.as_bytes(), value) {
            Ok(p) => p,
            Err(e) => {
                add(&self.stats.bad_records, 1);
                self.failed(&e);
                return Put::Down;
            }
        };
        match status {
            b"conflict" => {
                add(&self.stats.conflicts, 1);
                Put::Conflict(parsed)
            }
            _ => {
                add(&self.stats.pushed, 1);
                Put::Stored(parsed)
            }
        }
    }

    /// One command of the fleet thread, routed by `key`, `COMMAND` to answer (`None`: a store
    /// error, counted).
    async fn call(&self, key: &str, args: &[Arg<'_>]) -> Option<Reply> {
        let got = self
            .store
            .call_at(key.as_bytes(), args, Instant::now() + COMMAND)
            .await;
        if got.is_err() {
            add(&self.stats.errors, 1);
        }
        got.ok()
    }

    /// `call` whose answer must be an array (any other answer is counted and logged as `what`).
    async fn array(&self, what: &str, key: &str, args: &[Arg<'_>]) -> Option<Vec<Reply>> {
        match self.call(key, args).await? {
            Reply::Array(Some(items)) => Some(items),
            other => {
                self.failed(&format!("{what}: {other:?}"));
                None
            }
        }
    }

    fn failed(&self, why: &str) {
        add(&self.stats.errors, 1);
        crate::observe::log::info(format_args!("fleet: store: {why}"));
    }

    /// The store's version counter (`None`: a store error).
    async fn version(&self) -> Option<u64> {
        add(&self.stats.polls, 1);
        let ver_key = &self.keys[2];
        match self
            .call(ver_key, &[Arg::S("GET"), Arg::S(ver_key)])
            .await?
        {
            Reply::Bulk(None) => Some(0),
            Reply::Bulk(Some(v)) => {
                let v = std::str::from_utf8(&v).ok().and_then(|v| v.parse().ok());
                if v.is_none() {
                    self.failed("the key version counter is not a number");
                }
                v
            }
            other => {
                self.failed(&format!("GET version: {other:?}"));
                None
            }
        }
    }

    /// Read the version counter; when it moved, the records changed since `seen`. `false`: a
    /// store error (reconcile again when it works).
    async fn pull(&self) -> bool {
        let [rec_key, log_key, _] = &self.keys;
        let Some(ver) = self.version().await else {
            return false;
        };
        if ver < self.seen.get() {
            // the store lost its records (flushed, replaced): read everything, push what is ours
            crate::observe::log::info(format_args!(
                "fleet: the store's key version went back ({} -> {ver}): reconciling",
                self.seen.get()
            ));
            return false;
        }
        while ver > self.seen.get() {
            let from = format!("({}", self.seen.get());
            let args = [
                Arg::S("ZRANGEBYSCORE"),
                Arg::S(log_key),
                Arg::S(&from),
                Arg::S("+inf"),
                Arg::S("WITHSCORES"),
                Arg::S("LIMIT"),
                Arg::U(0),
                Arg::U(PAGE as u64),
            ];
            let Some(names) = self.array("ZRANGEBYSCORE", log_key, &args).await else {
                return false;
            };
            let mut page: Vec<(&[u8], u64)> = Vec::new();
            for pair in names.chunks(2) {
                if let [Reply::Bulk(Some(n)), Reply::Bulk(Some(s))] = pair {
                    let score = std::str::from_utf8(s)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok());
                    if let Some(score) = score {
                        page.push((n.as_slice(), score));
                    }
                }
            }
            if page.is_empty() {
                // the counter moved past the log (a write in flight): take the counter
                self.seen.set(ver);
                break;
            }
            let mut args = vec![Arg::S("HMGET"), Arg::S(rec_key)];
            args.extend(page.iter().map(|(n, _)| Arg::B(n)));
            let Some(values) = self.array("HMGET", rec_key, &args).await else {
                return false;
            };
            if values.len() != page.len() {
                self.failed(&format!(
                    "HMGET: {} values for {} names",
                    values.len(),
                    page.len()
                ));
                return false;
            }
            let mut recs = Vec::with_capacity(page.len());
            for ((name, _), v) in page.iter().zip(&values) {
                let Reply::Bulk(Some(v)) = v else { continue };
                match Shared::parse(name, v) {
                    Ok(r) => recs.push(r),
                    Err(e) => {
                        add(&self.stats.bad_records, 1);
                        crate::observe::log::info(format_args!(
                            "fleet: a key record in the store is refused: {e}"
                        ));
                    }
                }
            }
            if !self.sink.as_ref().is_some_and(|k| k.apply(&recs)) {
                // the registry is busy: the same page next poll
                return true;
            }
            add(&self.stats.applied, recs.len() as u64);
            let top = page.iter().map(|(_, s)| *s).max().unwrap_or(ver);
            self.seen.set(top.max(self.seen.get()));
            self.stats.version.store(self.seen.get(), Ordering::Relaxed);
            if page.len() < PAGE {
                break;
            }
        }
        true
    }
}
