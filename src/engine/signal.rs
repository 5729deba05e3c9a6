//! Engine load signals: which series each engine reports, their normalised form (`Sample`:
//! waiting, running, KV usage where the engine reports it, busy / total slots for llama.cpp's
//! `/slots`), and the process-wide `EngineCell` one poller writes and every shard reads.
//!
//! llama.cpp's `/slots` lists slots, not its queue (deferred requests are not on that page):
//! a `/slots` sample has `slots > 0` and `waiting = 0`, and `load` estimates the queue from the
//! gateway's own in-flight count (`View::slots_queue`; the cell keeps that count as it was when
//! the page arrived, so the busy slots that were not this gateway's can be told apart). With
//! `/metrics` configured the poller adds its `requests_deferred` to a `/slots` sample as
//! `waiting` (read only while every slot is busy: see `poller`). Its busy share is published as busy slots,
//! never as KV usage (llama.cpp reports no KV series).
//!
//! `EngineCell` is a handful of atomics, not a locked snapshot: the poller stores the fields
//! and then the stamp (`Release`); a shard reads the stamp (`Acquire`) and the fields, so it
//! sees a whole poll or — rarely — fields of the next one with the previous stamp (harmless:
//! newer). The gateway's own counts (requests in flight to the engine, requests and prompt
//! tokens sent since the last poll) are `Relaxed` counters touched only for providers with an
//! `engine` — nothing is shared or written for the others.
//!
//! A page with a negative queue, running or KV value is no signal (`normalise` refuses it: the
//! poll failed), never an idle engine.
//!
//! Owns: `EngineKind`, `Sample`, `normalise`, `EngineCell`, the process clock in ms
//! (`now_ms`). Must not: do IO (the poller does) or decide routing (`load` does).

pub use crate::config::engines::EngineKind;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::OnceLock;
use std::time::Instant;

use super::prom::{scan, Fold};

/// One poll's load, normalised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub waiting: u32,
    pub running: u32,
    /// 0..=1; `None` when the engine reports none (llama.cpp, TGI).
    pub kv: Option<f64>,
    /// llama.cpp `/slots`: the number of slots (`running` of them busy; `waiting` then is
    /// what `/metrics` reported deferred, 0 without it); 0 for a page with a queue series (the
    /// queue is then `waiting`).
    pub slots: u32,
}

fn count(v: f64) -> u32 {
    v.clamp(0.0, f64::from(u32::MAX)) as u32
}

/// A metrics page of `kind` (Prometheus text; llama.cpp's `/slots` JSON when `slots`).
/// Errors name what is missing: a page without the waiting series is no signal.
pub fn normalise(kind: EngineKind, page: &[u8], slots: bool) -> Result<Sample, &'static str> {
    if slots {
        return slots_page(page);
    }
    let (w, r, k, k_old) = match kind {
        EngineKind::Vllm => (
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
        ),
        EngineKind::Sglang => (
            "sglang:num_queue_reqs",
            "sglang:num_running_reqs",
            "sglang:token_usage",
            "",
        ),
        EngineKind::Llamacpp => (
            "llamacpp:requests_deferred",
            "llamacpp:requests_processing",
            "",
            "",
        ),
        EngineKind::Tgi => ("tgi_queue_size", "tgi_batch_current_size", "", ""),
        EngineKind::Ollama => return Err("ollama has no metrics endpoint"),
    };
    let [waiting, running, kv, kv_old] = scan(
        page,
        &[
            (w, Fold::Sum),
            (r, Fold::Sum),
            (k, Fold::Max),
            (k_old, Fold::Max),
        ],
    );
    let waiting = waiting.ok_or("no waiting-requests series on the page")?;
    // a count or usage below zero is a broken page, not an idle engine
    if [Some(waiting), running, kv, kv_old]
        .iter()
        .any(|v| v.is_some_and(|v| v < 0.0))
    {
        return Err("a negative queue, running or KV value on the page");
    }
    Ok(Sample {
        waiting: count(waiting),
        running: running.map_or(0, count),
        kv: kv.or(kv_old).map(|v| v.clamp(0.0, 1.0)),
        slots: 0,
    })
}

/// llama.cpp `GET /slots`: running = slots with `is_processing`, `slots` = their number (no
/// queue: deferred requests are not listed there, so waiting is 0; no KV either).
fn slots_page(page: &[u8]) -> Result<Sample, &'static str> {
    let page = &page[..page.len().min(super::prom::MAX_PAGE)];
    crate::util::nesting::check(page).map_err(|_| "slots page is not valid JSON")?;
    let mut total = 0u32;
    let mut busy = 0u32;
    let iter = sonic_rs::to_array_iter(page);
    for item in iter {
        let item = item.map_err(|_| "slots page is not a JSON array")?;
        let raw = item.as_raw_str();
        if !raw.starts_with('{') {
            return Err("slots page entries are not objects");
        }
        let p: sonic_rs::Result<bool> = sonic_rs::get(raw, ["is_processing"])
            .and_then(|v| sonic_rs::from_str::<bool>(v.as_raw_str()));
        let p = p.map_err(|_| "a slot without is_processing")?;
        total += 1;
        busy += u32::from(p);
    }
    if total == 0 {
        return Err("slots page lists no slots");
    }
    Ok(Sample {
        waiting: 0,
        running: busy,
        kv: None,
        slots: total,
    })
}

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// How far before the first call the scale starts: every `Instant` a caller can hold (taken a
/// little before the first call, or `t0 + n` in a test) lies after it, so none saturates to
/// the same value.
const EPOCH_BEFORE: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Milliseconds on the process's routing clock (never 0: 0 means "never"). The scale starts
/// a day before the first call (`EPOCH_BEFORE`); only differences mean anything.
pub fn now_ms() -> u64 {
    ms_of(Instant::now())
}

/// `now` on the same millisecond scale as `now_ms` (no clock read after the first call).
pub fn ms_of(now: Instant) -> u64 {
    let epoch = EPOCH.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(EPOCH_BEFORE).unwrap_or(now)
    });
    now.saturating_duration_since(*epoch).as_millis() as u64 + 1
}

/// `kv` stored as millionths; this means "not reported".
const KV_NONE: u32 = u32::MAX;

/// One engine's latest signal and the gateway's own counts toward it (process-wide).
#[derive(Debug)]
pub struct EngineCell {
    pub kind: EngineKind,
    /// Whether the engine has a load signal to poll (Ollama: no; its in-flight is the signal).
    pub polled: bool,
    /// A signal older than this counts as saturated (`stale_ms`).
    pub stale_ms: u64,
    /// The last poll's time (`now_ms`), 0 before the first.
    stamp: AtomicU64,
    /// Whether the last poll got a valid page (false: the engine is out until one does).
    up: AtomicBool,
    /// The last poll found no signal page (404/501): the engine answers, its load is judged
    /// by this gateway's in-flight count alone (as Ollama's).
    unsignalled: AtomicBool,
    waiting: AtomicU32,
    running: AtomicU32,
    kv_millionths: AtomicU32,
    slots: AtomicU32,
    /// Requests of this gateway on the engine now.
    in_flight: AtomicU32,
    /// `in_flight` when the last poll's page arrived: how many of the busy slots it reports
    /// were (at most) this gateway's own.
    in_flight_at_poll: AtomicU32,
    /// Requests / prompt tokens sent, ever, and their values at the last poll.
    sent: AtomicU64,
    sent_at_poll: AtomicU64,
    tokens: AtomicU64,
    tokens_at_poll: AtomicU64,
    pub polls_ok: AtomicU64,
    pub polls_failed: AtomicU64,
    /// Requests routed to this engine by the gateway's own in-flight count because no engine
    /// of the model had a usable signal (`load`); the poller logs the first of an outage.
    pub blind_routes: AtomicU64,
}

/// What a shard reads from a cell at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// ms since the last good poll (`u64::MAX`: never polled).
    pub age_ms: u64,
    pub up: bool,
    /// Up without a signal page (404/501): judged by the in-flight count alone.
    pub unsignalled: bool,
    pub waiting: u32,
    pub running: u32,
    pub kv: Option<f64>,
    /// Slots of a `/slots` signal (0: the signal has a queue series, or none).
    pub slots: u32,
    pub in_flight: u32,
    /// `in_flight` when the last poll's page arrived.
    pub in_flight_at_poll: u32,
    /// Requests / prompt tokens this gateway sent since the last poll.
    pub sent_since: u32,
    pub tokens_since: u64,
}

impl View {
    /// A `/slots` signal's queue (llama.cpp: busy slots, no queue series). What this gateway
    /// sent and has not seen finish is running or queued there (`in_flight`, exact and
    /// current); the page adds the busy slots that were not this gateway's when it was read
    /// (busy beyond our in-flight then: other clients). Beyond the slots, it waits — plus the
    /// deferred requests `/metrics` reported beyond our own queued ones then (`waiting`, 0
    /// without `/metrics`). Not `busy + sent since the poll`: the page lags by up to a poll,
    /// and our requests it shows busy may have ended since — that made an engine just drained
    /// of short requests look busier than one with a real queue.
    /// Returns (waiting, queue score input, busy share 0..=1 in place of KV).
    pub fn slots_queue(&self) -> (u32, f64, f64) {
        let others_running = self.running.saturating_sub(self.in_flight_at_poll);
        let ours_queued = self.in_flight_at_poll.saturating_sub(self.running);
        let others_queued = self.waiting.saturating_sub(ours_queued);
        let occupied = others_running.saturating_add(self.in_flight);
        let waiting = occupied
            .saturating_sub(self.slots)
            .saturating_add(others_queued);
        let busy = (f64::from(occupied) / f64::from(self.slots.max(1))).min(1.0);
        (waiting, f64::from(waiting), busy)
    }
}

impl EngineCell {
    pub fn new(kind: EngineKind, polled: bool, stale_ms: u64) -> EngineCell {
        EngineCell {
            kind,
            polled,
            stale_ms,
            stamp: AtomicU64::new(0),
            up: AtomicBool::new(true),
            unsignalled: AtomicBool::new(false),
            waiting: AtomicU32::new(0),
            running: AtomicU32::new(0),
            kv_millionths: AtomicU32::new(KV_NONE),
            slots: AtomicU32::new(0),
            in_flight: AtomicU32::new(0),
            in_flight_at_poll: AtomicU32::new(0),
            sent: AtomicU64::new(0),
            sent_at_poll: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            tokens_at_poll: AtomicU64::new(0),
            polls_ok: AtomicU64::new(0),
            polls_failed: AtomicU64::new(0),
            blind_routes: AtomicU64::new(0),
        }
    }

    /// A good poll at `now` (the poller).
    pub fn publish(&self, s: Sample, now: u64) {
        self.waiting.store(s.waiting, Relaxed);
        self.running.store(s.running, Relaxed);
        let kv = s.kv.map_or(KV_NONE, |k| (k * 1e6) as u32);
        self.kv_millionths.store(kv, Relaxed);
        self.slots.store(s.slots, Relaxed);
        self.in_flight_at_poll
            .store(self.in_flight.load(Relaxed), Relaxed);
        self.sent_at_poll.store(self.sent.load(Relaxed), Relaxed);
        self.tokens_at_poll
            .store(self.tokens.load(Relaxed), Relaxed);
        self.up.store(true, Relaxed);
        self.unsignalled.store(false, Relaxed);
        sat_add(&self.polls_ok, 1);
        self.stamp.store(now, Release);
    }

    /// The engine answered the poll without a signal page (404/501) at `now`: up, routed by
    /// the gateway's own in-flight count (counted as a failed poll).
    pub fn no_signal(&self, now: u64) {
        self.unsignalled.store(true, Relaxed);
        self.waiting.store(0, Relaxed);
        self.running.store(0, Relaxed);
        self.kv_millionths.store(KV_NONE, Relaxed);
        self.slots.store(0, Relaxed);
        self.up.store(true, Relaxed);
        sat_add(&self.polls_failed, 1);
        self.stamp.store(now, Release);
    }

    /// A failed poll (connection refused or reset, bad status, unparsable page).
    pub fn fail(&self) {
        self.up.store(false, Relaxed);
        sat_add(&self.polls_failed, 1);
    }

    /// A poll that ran out of its time budget at `now` (counted as failed). The engine took
    /// the connection but did not answer in time: on a loaded box, or with llama.cpp answering
    /// `/slots` from its decode loop, one such poll says the box is busy, not that the engine
    /// is gone. It stays in on its last signal while that is younger than `stale_ms` (it then
    /// ages into stale: saturated); a timeout once the signal is stale takes it down as
    /// `fail` does (a hung engine is out within `stale_ms` plus one poll budget). Returns
    /// whether the engine is down now.
    pub fn slow(&self, now: u64) -> bool {
        sat_add(&self.polls_failed, 1);
        let stamp = self.stamp.load(Acquire);
        let stale = stamp == 0 || now.saturating_sub(stamp) > self.stale_ms;
        if stale {
            self.up.store(false, Relaxed);
        }
        stale
    }

    /// A request went to this engine without a usable signal (see `blind_routes`).
    pub fn routed_blind(&self) {
        let _ = self
            .blind_routes
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_add(1)));
    }

    /// A request of ~`tokens` prompt tokens goes to this engine.
    pub fn start(&self, tokens: u64) {
        let _ = self
            .in_flight
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_add(1)));
        sat_add(&self.sent, 1);
        sat_add(&self.tokens, tokens);
    }

    /// It ended (answer relayed, or the attempt failed).
    pub fn end(&self) {
        let _ = self
            .in_flight
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(1)));
    }

    pub fn view(&self, now: u64) -> View {
        let stamp = self.stamp.load(Acquire);
        let kv = self.kv_millionths.load(Relaxed);
        let sent = self.sent.load(Relaxed);
        let tokens = self.tokens.load(Relaxed);
        View {
            age_ms: if !self.polled {
                0
            } else if stamp == 0 {
                u64::MAX
            } else {
                now.saturating_sub(stamp)
            },
            up: self.up.load(Relaxed),
            unsignalled: self.unsignalled.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            running: self.running.load(Relaxed),
            kv: (kv != KV_NONE).then(|| f64::from(kv) / 1e6),
            slots: self.slots.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            in_flight_at_poll: self.in_flight_at_poll.load(Relaxed),
            sent_since: sent.saturating_sub(self.sent_at_poll.load(Relaxed)) as u32,
            tokens_since: tokens.saturating_sub(self.tokens_at_poll.load(Relaxed)),
        }
    }
}

/// Add `n` to a shared counter, saturating (counters never wrap and run backwards).
fn sat_add(c: &AtomicU64, n: u64) {
    let _ = c.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_add(n)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_poll_keeps_a_fresh_signal_and_downs_a_stale_one() {
        let c = EngineCell::new(EngineKind::Llamacpp, true, 1_000);
        // never polled: a timeout is as good as down
        assert!(c.slow(50));
        assert!(!c.view(50).up);
        let s = Sample {
            waiting: 0,
            running: 1,
            kv: None,
            slots: 2,
        };
        c.publish(s, 100);
        // a poll that timed out 900 ms after the last good one: still in, on that signal
        assert!(!c.slow(1_000));
        let v = c.view(1_000);
        assert!(v.up && v.running == 1 && v.age_ms == 900, "{v:?}");
        // still timing out past stale_ms: down
        assert!(c.slow(1_200));
        assert!(!c.view(1_200).up);
        assert_eq!(c.polls_failed.load(Relaxed), 3);
        // the next good poll brings it back
        c.publish(s, 1_300);
        assert!(c.view(1_300).up);
    }

    #[test]
    fn cell_publishes_and_counts_since_the_poll() {
        let c = EngineCell::new(EngineKind::Vllm, true, 1_000);
        assert_eq!(c.view(10).age_ms, u64::MAX);
        c.start(100);
        c.publish(
            Sample {
                waiting: 3,
                running: 8,
                kv: Some(0.5),
                slots: 0,
            },
            5,
        );
        c.start(50);
        let v = c.view(15);
        assert_eq!((v.age_ms, v.waiting, v.running), (10, 3, 8));
        assert_eq!((v.in_flight, v.sent_since, v.tokens_since), (2, 1, 50));
        assert!((v.kv.unwrap() - 0.5).abs() < 1e-6);
        c.end();
        c.end();
        c.end();
        assert_eq!(c.view(15).in_flight, 0);
        c.fail();
        assert!(!c.view(15).up);
        let o = EngineCell::new(EngineKind::Ollama, false, 1_000);
        assert_eq!(o.view(1_000_000).age_ms, 0, "not polled: never stale");
    }
}
