//! Admission: bounded memory for one shard — config, and the `Admission` facade the request path
//! calls on the parsed head, before a byte of body is allocated.
//!
//! Owns: [`AdmissionConfig`] (serde, documented defaults), splitting process-wide limits across
//! shards, and [`Admission`], which turns "a head arrived with this declared body size" into a
//! [`Permit`] or a counted [`Reject`].
//! Must not: parse HTTP, write responses, share state across shards/threads (one `Admission` per
//! shard, built on that shard's thread), or use locks, atomics or `Arc`.
//!
//! Pieces: `budget` (byte/slot accounting), `permit` (a request's claim, returned on drop),
//! `connection` (an open connection's fixed claim), `held` (a cache's claim),
//! `queue` (block-mode FIFO), `pool` (fixed-size chunks), `chain` (bodies as chunk chains), `memlimit` (the
//! default budget from cgroup/host memory), `size` (byte-size strings), `stats` (metrics and the
//! rate-limited rejection log).

pub mod peer;

pub mod budget;
pub mod chain;
pub mod connection;
pub mod held;
pub mod memlimit;
pub mod permit;
pub mod pool;
pub mod queue;
pub mod size;
pub mod stats;

use std::time::{Duration, Instant};

use serde::{Deserialize, Deserializer};

pub use budget::{Budget, Reject};
pub use chain::ChunkChain;
pub use connection::ConnCharge;
pub use held::Held;
pub use memlimit::{default_budget, parse_size};
pub use permit::Permit;
pub use pool::{Chunk, ChunkPool, PoolStats, Reserved, DEFAULT_CHUNK_SIZE};
pub use size::ByteSize;
pub use stats::{RejectLog, Stats};

/// What to do when a request does not fit right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refuse immediately (503 + `Retry-After`). The default.
    #[default]
    Drop,
    /// Wait in a bounded FIFO for up to `queue_timeout_ms`, then refuse.
    Block,
}

/// `[admission]` config. Sizes accept integers (bytes) or strings like `"64MiB"`, `"2G"`.
/// `memory_budget`, `max_in_flight` and `max_queue` are process-wide and split across shards.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Bytes for everything request-sized (bodies, response/stream buffers), whole process.
    /// Default: 50 % of the cgroup/host memory limit (see `memlimit`), at least 16 MiB.
    /// Also accepts `"auto"` (the default) or a percentage of the detected limit, e.g. `"60%"`.
    #[serde(deserialize_with = "de_budget")]
    pub memory_budget: u64,
    /// `drop` (default) or `block`.
    pub mode: Mode,
    /// Block mode: longest wait in the queue before a 503. Default 2000.
    pub queue_timeout_ms: u64,
    /// Requests admitted at once, whole process. Default 10000.
    pub max_in_flight: u32,
    /// Largest declared request body; larger gets 413 before the body is read. Default 32 MiB.
    #[serde(deserialize_with = "de_size")]
    pub max_body: u64,
    /// Largest declared body of a streamed upload (`/v1/files`, audio, image edits: forwarded
    /// as it arrives, never held whole; see `surface`); larger gets 413 before the body is read.
    /// Default 512 MiB.
    #[serde(deserialize_with = "de_size")]
    pub max_upload: u64,
    /// Block mode: waiters queued at once, whole process. Default 1024.
    pub max_queue: u32,
    /// Bytes reserved per request on admission for its response, on top of the body. Default
    /// 64 KiB. Streams needing more call `Permit::grow`. Also covers the request's own state
    /// (its task, response head and write buffers, the upstream read buffer).
    #[serde(deserialize_with = "de_size")]
    pub response_reserve: u64,
    /// Bytes charged per open client connection, from accept to close, for its state and head
    /// read buffer (measured ~6.7 KiB). A connection that does not fit is refused with 503 like
    /// one over `server.max_connections`. Default 8 KiB.
    #[serde(deserialize_with = "de_size")]
    pub connection_reserve: u64,
    /// Percent of the budget open connections may hold through `connection_reserve` (1..=100).
    /// The rest stays for requests, which with keys on means requests that passed the key
    /// check: connections that send nothing cannot take the whole budget. Default 50.
    pub connection_share: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            memory_budget: default_budget(),
            mode: Mode::Drop,
            queue_timeout_ms: 2000,
            max_in_flight: 10_000,
            max_body: 32 << 20,
            max_upload: 512 << 20,
            max_queue: 1024,
            response_reserve: 64 << 10,
            connection_reserve: 8 << 10,
            connection_share: 50,
        }
    }
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ByteSize::deserialize(d).map(ByteSize::bytes)
}

fn de_budget<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u64),
        Str(String),
    }
    match Raw::deserialize(d)? {
        Raw::Int(n) => Ok(n),
        Raw::Str(s) => parse_budget(&s).map_err(serde::de::Error::custom),
    }
}

/// Parses a `memory_budget` string: `"auto"`, `"NN%"` of the detected limit, or a size.
pub fn parse_budget(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("auto") {
        return Ok(default_budget());
    }
    if let Some(p) = t.strip_suffix('%') {
        let pct: u64 = p
            .trim()
            .parse()
            .map_err(|_| format!("memory_budget {s:?}: bad percentage"))?;
        if pct == 0 || pct > 100 {
            return Err(format!("memory_budget {s:?}: percentage must be 1..=100"));
        }
        let limit = memlimit::memory_limit()
            .map(|l| l.bytes)
            .ok_or_else(|| format!("memory_budget {s:?}: no memory limit detectable"))?;
        return Ok((limit / 100).saturating_mul(pct));
    }
    parse_size(t)
}

impl AdmissionConfig {
    /// Hard errors (`ringgate check` fails on these).
    pub fn validate(&self) -> Result<(), String> {
        if self.memory_budget == 0 {
            return Err("admission.memory_budget must be > 0".into());
        }
        if self.max_in_flight == 0 {
            return Err("admission.max_in_flight must be > 0".into());
        }
        if !(1..=100).contains(&self.connection_share) {
            return Err("admission.connection_share must be a percentage, 1..=100".into());
        }
        if self.mode == Mode::Block && self.queue_timeout_ms == 0 {
            return Err("admission.queue_timeout_ms must be > 0 in block mode".into());
        }
        Ok(())
    }

    /// Soft problems worth a startup warning, for `shard_count` shards.
    pub fn warnings(&self, shard_count: usize) -> Vec<String> {
        let mut w = Vec::new();
        let per_shard = self.memory_budget / shard_count.max(1) as u64;
        let biggest = self.max_body.saturating_add(self.response_reserve);
        if biggest > per_shard {
            w.push(format!(
                "admission: max_body + response_reserve ({biggest} bytes) exceeds the per-shard \
                 budget ({per_shard} bytes); such requests will always be rejected"
            ));
        }
        if self.mode == Mode::Block && self.max_queue == 0 {
            w.push("admission: block mode with max_queue = 0 behaves like drop mode".into());
        }
        w
    }
}

/// One shard's admission: its budget slice, chunk pool, mode and rejection log.
pub struct Admission {
    budget: Budget,
    pool: ChunkPool,
    mode: Mode,
    queue_timeout: Duration,
    /// This shard's share of `max_queue`.
    max_queue: u32,
    max_body: u64,
    max_upload: u64,
    response_reserve: u64,
    connection_reserve: u64,
    shard: usize,
    log: RejectLog,
}

impl Admission {
    /// This shard's admission from the process-wide `cfg`: budget `memory_budget / shard_count`,
    /// in-flight and queue limits `ceil(limit / shard_count)` (at least 1 in flight).
    pub fn new(cfg: &AdmissionConfig, shard_count: usize) -> Admission {
        let n = shard_count.max(1);
        let capacity = cfg.memory_budget / n as u64;
        let max_in_flight = cfg.max_in_flight.div_ceil(n as u32).max(1);
        let max_queue = cfg.max_queue.div_ceil(n as u32);
        let chunk = DEFAULT_CHUNK_SIZE;
        let max_free = (capacity / chunk as u64 / 8).clamp(16, 256) as usize;
        let budget = Budget::new(capacity, max_in_flight, max_queue);
        budget.set_connection_share(cfg.connection_share);
        Admission {
            budget,
            pool: ChunkPool::new(chunk, max_free),
            mode: cfg.mode,
            queue_timeout: Duration::from_millis(cfg.queue_timeout_ms),
            max_queue,
            max_body: cfg.max_body,
            max_upload: cfg.max_upload,
            response_reserve: cfg.response_reserve,
            connection_reserve: cfg.connection_reserve,
            shard: 0,
            log: RejectLog::default(),
        }
    }

    /// Sets the shard id used in log lines (default 0).
    pub fn with_shard(mut self, shard: usize) -> Admission {
        self.shard = shard;
        self
    }

    /// Admits a request whose head declares `declared_body` bytes (Content-Length, or the cap
    /// for a chunked body): `BodyTooLarge` above `max_body`, else charges `declared_body +
    /// response_reserve` — immediately in drop mode, waiting up to the queue timeout in block
    /// mode. Every rejection is counted and feeds the rate-limited log.
    pub async fn admit(&self, declared_body: u64) -> Result<Permit, Reject> {
        let r = match self.precheck(declared_body) {
            Err(e) => Err(e),
            Ok(bytes) => match self.mode {
                Mode::Drop => self.budget.try_acquire(bytes),
                Mode::Block => self.budget.acquire_or_wait(bytes, self.queue_timeout).await,
            },
        };
        if r.is_err() {
            self.log_tick();
        }
        r
    }

    /// Admits a streamed upload whose head declares `declared` bytes (0 for a chunked body):
    /// `BodyTooLarge` above `max_upload`, else charges `min(declared, window) +
    /// response_reserve` like [`Admission::admit`] — the body is never held whole: at most
    /// `window` bytes of it are in the gateway at once, the rest waits in the sockets.
    pub async fn admit_upload(&self, declared: u64, window: u64) -> Result<Permit, Reject> {
        if declared > self.max_upload {
            self.budget.record_rejection(Reject::BodyTooLarge);
            self.log_tick();
            return Err(Reject::BodyTooLarge);
        }
        let bytes = declared.min(window).saturating_add(self.response_reserve);
        let r = match self.mode {
            Mode::Drop => self.budget.try_acquire(bytes),
            Mode::Block => self.budget.acquire_or_wait(bytes, self.queue_timeout).await,
        };
        if r.is_err() {
            self.log_tick();
        }
        r
    }

    /// Like [`Admission::admit`] but never waits, whatever the mode.
    pub fn try_admit(&self, declared_body: u64) -> Result<Permit, Reject> {
        let r = self
            .precheck(declared_body)
            .and_then(|bytes| self.budget.try_acquire(bytes));
        if r.is_err() {
            self.log_tick();
        }
        r
    }

    /// Charges `connection_reserve` for a newly accepted connection, held until the returned
    /// charge is dropped (when the connection closes). Never waits; a refusal is counted (reason
    /// `budget`) and feeds the rejection log.
    pub fn connection(&self) -> Result<ConnCharge, Reject> {
        let r = self.budget.charge_connection(self.connection_reserve);
        if r.is_err() {
            self.log_tick();
        }
        r
    }

    /// [`Admission::connection`] past the connection share, for a connection whose first
    /// request has a valid key.
    pub fn keyed_connection(&self) -> Result<ConnCharge, Reject> {
        let r = self.budget.charge_keyed_connection(self.connection_reserve);
        if r.is_err() {
            self.log_tick();
        }
        r
    }

    fn precheck(&self, declared_body: u64) -> Result<u64, Reject> {
        if declared_body > self.max_body {
            self.budget.record_rejection(Reject::BodyTooLarge);
            return Err(Reject::BodyTooLarge);
        }
        Ok(declared_body.saturating_add(self.response_reserve))
    }

    /// Writes the rejection summary line if one is due (at most one per second). `admit` calls
    /// this on rejection; call it from a periodic tick too so the last burst gets reported.
    pub fn log_tick(&self) {
        self.log.emit(self.shard, &self.stats(), Instant::now());
    }

    /// The shard's budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The shard's chunk pool (bodies: `pool().chain(&permit)`).
    pub fn pool(&self) -> &ChunkPool {
        &self.pool
    }

    /// Configured mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Block mode: the longest wait for a place (`queue_timeout_ms`) and this shard's share of
    /// `max_queue` (also bounds `lb = "load"` requests waiting for a non-full engine).
    pub fn queue_bounds(&self) -> (Duration, u32) {
        (self.queue_timeout, self.max_queue)
    }

    /// Largest admissible declared body.
    pub fn max_body(&self) -> u64 {
        self.max_body
    }

    /// Largest admissible declared upload (streamed bodies).
    pub fn max_upload(&self) -> u64 {
        self.max_upload
    }

    /// Bytes reserved per request for the response.
    pub fn response_reserve(&self) -> u64 {
        self.response_reserve
    }

    /// Block-mode queue timeout.
    pub fn queue_timeout(&self) -> Duration {
        self.queue_timeout
    }

    /// A snapshot of this shard.
    pub fn stats(&self) -> Stats {
        let b = &self.budget;
        Stats {
            capacity: b.capacity(),
            used: b.used(),
            connection_bytes: b.connection_bytes(),
            connections: b.connections(),
            peak: b.peak(),
            in_flight: b.in_flight(),
            max_in_flight: b.max_in_flight(),
            queued: b.queued(),
            max_queue: b.max_queue(),
            rejected_by_reason: b.rejections_all(),
            pool: self.pool.stats(),
        }
    }

    /// Appends this shard's metrics (with `# HELP`/`# TYPE`) to `out`. To render several shards
    /// in one scrape, collect their `stats()` and call [`stats::render_prometheus`] once instead
    /// (each family must appear once).
    pub fn render_prometheus(&self, shard: usize, out: &mut String) {
        stats::render_prometheus(&[(shard, self.stats())], out);
    }
}

#[cfg(test)]
mod tests;
