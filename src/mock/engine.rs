//! The engine simulator behind `ringgate mock --engine vllm|sglang|llamacpp`: the mock's Chat
//! endpoint answered the way a self-hosted inference engine answers under load, plus that
//! engine's own load signals (`engine_page`).
//!
//! The model (one process = one engine; the server runs it on one shard):
//! - **Slots.** At most `slots` sequences run at once (vLLM `--max-num-seqs`, SGLang
//!   `--max-running-requests`, llama.cpp `--parallel`), and only while the KV cache has room
//!   for their tokens (`kv_tokens`; a lone sequence always runs). Everything else waits in
//!   a FIFO queue (vLLM's waiting queue, llama.cpp's deferred requests); a client that leaves
//!   while waiting is dropped from it, one that leaves while running frees its slot.
//! - **Prefill.** Time to the first token once admitted: `prefill_base + uncached prompt
//!   tokens × prefill_per_token`. Defaults 10 ms + 100 µs/token: ~10k prompt tokens/s, the
//!   order of an 8B model on one mid-range GPU; a 2,000-token system prompt costs 210 ms cold
//!   and 10 ms warm — the gap prefix-aware routing exists to exploit.
//! - **Prefix cache.** The prompt's chained 64-byte block hashes (`engine::prefix`, ~16
//!   tokens a block, vLLM's default block size) are looked up in an LRU of `cache_blocks`
//!   blocks (default 4,096 ≈ 64k tokens); the leading blocks found are not prefilled again.
//! - **Decode.** One token every `tpot × (1 + batch_slowdown × (running − 1))`: default 20 ms
//!   at batch 1 (50 tokens/s) and +6 % per extra running sequence (decode is memory-bound, so
//!   a batch of 8 costs ~1.4× a step, not 8×). The batch is read at every token, so a
//!   sequence slows down as others join. Prefill does not stall other sequences' decode
//!   (chunked prefill hides most of it in real engines) — a simplification.
//! - **KV usage** = tokens held by running sequences (prompt + generated so far) / `kv_tokens`
//!   (default `slots × 4096`).
//!
//! - **llama.cpp's own view** (`Load::tasks`, `Load::llama`): each slot's current or last task
//!   (prompt tokens, how many were prefilled and how many came from the cache, tokens decoded)
//!   and llama-server's counters (prefill and decode tokens and times, decode calls, busy
//!   slots per decode), with the two throughput buckets every `GET /metrics` restarts
//!   (`scrape`); a sequence's generation is counted when its slot is released, as there.
//!   `load_time`: answers are llama-server's 503 "Loading model" for that long after start.
//!
//! Streams send their head and first token together when the first token is ready (queue
//! time counts into time to first token, as it does at a real engine); non-stream answers
//! come when the last token is.
//!
//! Owns: `EngineKind`, `EngineSpec`, `Engine` (admission, the queue, the prefix cache, the
//! counters, the slots' tasks). Must not: know the gateway, or render the metrics pages
//! (`engine_page`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
#[cfg(test)]
use std::time::Instant;

use monoio::io::AsyncWriteRent;

use super::{chat, engine_answer, pace, MockRequest, Profile};
use crate::engine::prefix;
use crate::http::io::write_all;
use crate::http::response::{write_chunk, LAST_CHUNK};

/// llama-server's answer to every page and request while its model loads (its middleware's
/// 503; `EngineSpec::load_time`).
pub const LOADING: &str =
    r#"{"error":{"message":"Loading model","type":"unavailable_error","code":503}}"#;

/// Which engine's API and metrics the simulator imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Vllm,
    Sglang,
    Llamacpp,
}

impl EngineKind {
    pub fn parse(s: &str) -> Option<EngineKind> {
        match s {
            "vllm" => Some(EngineKind::Vllm),
            "sglang" => Some(EngineKind::Sglang),
            "llamacpp" | "llama.cpp" => Some(EngineKind::Llamacpp),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Llamacpp => "llamacpp",
        }
    }
}

/// The simulated engine's size and speed (see the module doc for the defaults' reasons).
#[derive(Debug, Clone)]
pub struct EngineSpec {
    pub kind: EngineKind,
    pub slots: u32,
    pub tpot: Duration,
    pub batch_slowdown: f64,
    pub prefill_base: Duration,
    pub prefill_per_token: Duration,
    pub kv_tokens: u64,
    pub cache_blocks: usize,
    /// The `model_name` label of the metrics (llama.cpp: the served model's name, as
    /// `--alias`).
    pub model_name: String,
    /// llama.cpp: for this long after the start every page and request is its 503 "Loading
    /// model" (a restarted engine is not ready at once).
    pub load_time: Duration,
    /// llama.cpp: `GET /metrics` is served (`llama-server --metrics`; else 501, as the real
    /// one). vLLM and SGLang always serve it.
    pub metrics: bool,
    /// llama.cpp: `GET /slots` is served (the default; `--no-slots`: 501).
    pub slots_page: bool,
}

impl EngineSpec {
    pub fn new(kind: EngineKind, slots: u32) -> EngineSpec {
        let slots = slots.max(1);
        EngineSpec {
            kind,
            slots,
            tpot: Duration::from_millis(20),
            batch_slowdown: 0.06,
            prefill_base: Duration::from_millis(10),
            prefill_per_token: Duration::from_micros(100),
            kv_tokens: u64::from(slots) * 4096,
            cache_blocks: 4096,
            model_name: "mock".into(),
            metrics: kind != EngineKind::Llamacpp,
            slots_page: true,
            load_time: Duration::ZERO,
        }
    }
}

/// The engine's load right now (what its metrics endpoint reports).
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    pub running: u32,
    pub waiting: u32,
    /// 0..=1
    pub kv_usage: f64,
    /// Per slot: whether it serves a request (llama.cpp `/slots`).
    pub busy: Vec<bool>,
    /// Per slot: its current task, or the last one once it is idle (`None` before its first).
    pub tasks: Vec<Option<SlotTask>>,
    /// llama.cpp's own counters (`/metrics`).
    pub llama: LlamaStats,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub requests: u64,
    /// Prompt tokens looked up in / found in the prefix cache.
    pub cache_queries: u64,
    pub cache_hits: u64,
}

/// A slot's task as llama.cpp's `/slots` shows it (`n_prompt_tokens*`, `next_token`).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotTask {
    pub id_task: u64,
    pub n_prompt_tokens: u64,
    /// Prompt tokens prefilled (not taken from the prefix cache).
    pub n_prompt_tokens_processed: u64,
    /// Prompt tokens taken from the prefix cache.
    pub n_prompt_tokens_cache: u64,
    /// The request's `max_tokens` (`n_predict`).
    pub n_predict: u64,
    pub n_decoded: u64,
    pub stream: bool,
    /// The answer is complete and the slot released (llama.cpp then shows the task's prompt
    /// size, its per-task counters reset).
    pub done: bool,
}

/// llama.cpp's server-wide counters (`server_metrics`): cumulative ones, and the two
/// throughput buckets every `GET /metrics` resets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LlamaStats {
    /// Prompt tokens prefilled (cached ones excluded) and the time it took.
    pub prompt: Spent,
    pub prompt_cached: u64,
    /// Tokens generated; decode steps (the first token comes with the prompt) and their time.
    pub predicted: u64,
    pub predict: Spent,
    /// Decode calls and the busy slots summed over them.
    pub decodes: u64,
    pub busy_in_decodes: u64,
    /// Largest prompt + generation seen.
    pub tokens_max: u64,
    /// Since the last `GET /metrics`: prompt tokens / µs, decode steps / µs.
    pub bucket_prompt: Spent,
    pub bucket_predict: Spent,
}

/// Tokens (or decode steps) and the time they took (µs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spent {
    pub n: u64,
    pub us: u64,
}

impl Spent {
    fn add(&mut self, n: u64, us: u64) {
        self.n += n;
        self.us += us;
    }
}

struct Ticket {
    need: u64,
    slot: Cell<Option<u32>>,
    waker: Cell<Option<Waker>>,
}

struct State {
    running: u32,
    kv_used: u64,
    queue: VecDeque<Rc<Ticket>>,
    busy: Vec<bool>,
    tasks: Vec<Option<SlotTask>>,
    llama: LlamaStats,
    next_task: u64,
    /// block hash → last use (a counter): the LRU prefix cache.
    cache: HashMap<u64, u64>,
    tick: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    requests: u64,
    cache_queries: u64,
    cache_hits: u64,
}

/// One simulated engine (single-threaded: lives on the mock's one shard).
pub struct Engine {
    pub spec: EngineSpec,
    state: RefCell<State>,
    started: std::time::Instant,
}

impl Engine {
    pub fn new(spec: EngineSpec) -> Rc<Engine> {
        let slots = spec.slots as usize;
        Rc::new(Engine {
            spec,
            started: std::time::Instant::now(),
            state: RefCell::new(State {
                running: 0,
                kv_used: 0,
                queue: VecDeque::new(),
                busy: vec![false; slots],
                tasks: vec![None; slots],
                llama: LlamaStats::default(),
                next_task: 0,
                cache: HashMap::new(),
                tick: 0,
                prompt_tokens: 0,
                generation_tokens: 0,
                requests: 0,
                cache_queries: 0,
                cache_hits: 0,
            }),
        })
    }

    /// Still loading its model (`EngineSpec::load_time` after the start).
    pub fn loading(&self) -> bool {
        self.started.elapsed() < self.spec.load_time
    }

    pub fn load(&self) -> Load {
        let st = self.state.borrow();
        Load {
            running: st.running,
            // a ticket whose client left is only held by the queue
            waiting: st.queue.iter().filter(|t| Rc::strong_count(t) > 1).count() as u32,
            kv_usage: (st.kv_used as f64 / self.spec.kv_tokens.max(1) as f64).min(1.0),
            busy: st.busy.clone(),
            tasks: st.tasks.clone(),
            llama: st.llama,
            prompt_tokens: st.prompt_tokens,
            generation_tokens: st.generation_tokens,
            requests: st.requests,
            cache_queries: st.cache_queries,
            cache_hits: st.cache_hits,
        }
    }

    /// `load()` for a `GET /metrics`: llama.cpp restarts its throughput buckets on every one.
    pub fn scrape(&self) -> Load {
        let l = self.load();
        let mut st = self.state.borrow_mut();
        st.llama.bucket_prompt = Spent::default();
        st.llama.bucket_predict = Spent::default();
        l
    }

    fn fits(&self, st: &State, need: u64) -> bool {
        st.running < self.spec.slots
            && (st.running == 0 || st.kv_used + need <= self.spec.kv_tokens)
    }

    fn take(&self, st: &mut State, need: u64) -> u32 {
        st.running += 1;
        st.kv_used += need;
        let slot = st.busy.iter().position(|b| !b).unwrap_or(0);
        if let Some(b) = st.busy.get_mut(slot) {
            *b = true;
        }
        slot as u32
    }

    fn release(&self, slot: u32, kv: u64) {
        let mut st = self.state.borrow_mut();
        st.running = st.running.saturating_sub(1);
        st.kv_used = st.kv_used.saturating_sub(kv);
        if let Some(b) = st.busy.get_mut(slot as usize) {
            *b = false;
        }
        // FIFO: the head of the queue goes first, or nobody does
        while let Some(t) = st.queue.front() {
            if Rc::strong_count(t) == 1 {
                st.queue.pop_front();
                continue;
            }
            if !self.fits(&st, t.need) {
                break;
            }
            let Some(t) = st.queue.pop_front() else { break };
            let s = self.take(&mut st, t.need);
            t.slot.set(Some(s));
            if let Some(w) = t.waker.take() {
                w.wake();
            }
        }
    }

    /// Wait for a slot for a sequence of `need` prompt tokens.
    async fn admit(self: &Rc<Self>, need: u64) -> Running {
        let ticket = {
            let mut st = self.state.borrow_mut();
            if st.queue.iter().all(|t| Rc::strong_count(t) == 1) && self.fits(&st, need) {
                st.queue.clear();
                let slot = self.take(&mut st, need);
                return Running {
                    engine: self.clone(),
                    slot,
                    kv: Cell::new(need),
                    gen_us: Cell::new(0),
                };
            }
            let t = Rc::new(Ticket {
                need,
                slot: Cell::new(None),
                waker: Cell::new(None),
            });
            st.queue.push_back(t.clone());
            t
        };
        let slot = Queued {
            engine: self.clone(),
            ticket,
            done: false,
        }
        .await;
        Running {
            engine: self.clone(),
            slot,
            kv: Cell::new(need),
            gen_us: Cell::new(0),
        }
    }

    /// Look the prompt's blocks up in the prefix cache (and insert them): leading blocks hit.
    fn prefix_hits(&self, blocks: &[u64]) -> usize {
        let mut st = self.state.borrow_mut();
        st.tick += 1;
        let tick = st.tick;
        let hits = prefix::leading(blocks, |b| st.cache.contains_key(&b));
        for &b in blocks {
            st.cache.insert(b, tick);
        }
        let cap = self.spec.cache_blocks.max(1);
        if st.cache.len() > cap {
            // evict the least recently used quarter (amortised)
            let mut ticks: Vec<u64> = st.cache.values().copied().collect();
            let cut = (st.cache.len() - cap + cap / 4).min(ticks.len() - 1);
            ticks.select_nth_unstable(cut);
            let limit = ticks[cut];
            st.cache.retain(|_, t| *t > limit);
        }
        hits
    }

    /// Time to prefill `tokens` uncached prompt tokens.
    pub fn prefill_time(&self, tokens: u64) -> Duration {
        self.spec.prefill_base
            + self.spec.prefill_per_token * tokens.min(u64::from(u32::MAX)) as u32
    }

    fn step(&self) -> Duration {
        let running = self.state.borrow().running.max(1);
        self.spec
            .tpot
            .mul_f64(1.0 + self.spec.batch_slowdown * f64::from(running - 1))
    }

    /// Serve one Chat completion (`req` parsed from `body`) as the engine would.
    pub async fn serve<S: AsyncWriteRent>(
        self: &Rc<Self>,
        s: &mut S,
        req: &MockRequest,
        body: &[u8],
        keep_alive: bool,
    ) -> io::Result<()> {
        if self.loading() {
            let body = LOADING.as_bytes();
            return pace::json(s, 503, body, Profile::Instant, keep_alive).await;
        }
        let blocks = prefix::prompt_blocks(body);
        let input = u64::from(req.input_tokens);
        let run = self.admit(input).await;
        let hit_tokens = (self.prefix_hits(&blocks) as u64 * 16).min(input);
        let prefill = self.prefill_time(input - hit_tokens);
        {
            let mut st = self.state.borrow_mut();
            st.requests += 1;
            st.prompt_tokens += input;
            st.cache_queries += input;
            st.cache_hits += hit_tokens;
            st.next_task += 1;
            let task = SlotTask {
                id_task: st.next_task,
                n_prompt_tokens: input,
                n_prompt_tokens_processed: input - hit_tokens,
                n_prompt_tokens_cache: hit_tokens,
                n_predict: u64::from(req.output_tokens),
                n_decoded: 0,
                stream: req.stream,
                done: false,
            };
            if let Some(t) = st.tasks.get_mut(run.slot as usize) {
                *t = Some(task);
            }
        }
        monoio::time::sleep(prefill).await;
        {
            let mut st = self.state.borrow_mut();
            let (n, us) = (input - hit_tokens, prefill.as_micros() as u64);
            let l = &mut st.llama;
            l.prompt.add(n, us);
            l.bucket_prompt.add(n, us);
            l.prompt_cached += hit_tokens;
        }
        // llama.cpp answers in its own shape (`engine_answer`); the others as the mock's Chat
        let llama = (self.spec.kind == EngineKind::Llamacpp).then(|| engine_answer::Answer {
            req,
            cached: hit_tokens,
            processed: input - hit_tokens,
            prompt_us: prefill.as_micros() as u64,
            gen_us: &run.gen_us,
        });
        let mut ev: Box<dyn pace::Events + '_> = match &llama {
            Some(a) => Box::new(engine_answer::Answer { ..*a }),
            None => Box::new(chat::events(req)),
        };
        let units = ev.units().max(1);
        if !req.stream {
            // the first token comes with the prompt's batch, each next after a decode step
            run.token(Duration::ZERO);
            for _ in 1..units {
                let step = self.step();
                monoio::time::sleep(step).await;
                run.token(step);
            }
            let body = match &llama {
                Some(a) => a.body(),
                None => chat::completion_body(req),
            };
            return pace::json(s, 200, &body, Profile::Instant, keep_alive).await;
        }
        let mut out = pace::sse_head(1024, keep_alive);
        let mut buf = Vec::with_capacity(512);
        ev.head(&mut buf);
        for i in 0..units {
            let mut step = Duration::ZERO;
            if i > 0 {
                step = self.step();
                monoio::time::sleep(step).await;
                buf.clear();
            }
            run.token(step);
            ev.unit(i, &mut buf);
            if i + 1 == units {
                ev.tail(&mut buf);
            }
            write_chunk(&mut out, &buf);
            if i + 1 == units {
                out.extend_from_slice(LAST_CHUNK);
            }
            let (r, back) = write_all(s, out).await;
            r?;
            out = back;
            out.clear();
        }
        Ok(())
    }
}

/// A running sequence: holds its slot and KV tokens until dropped.
struct Running {
    engine: Rc<Engine>,
    slot: u32,
    kv: Cell<u64>,
    /// Decode time of this sequence so far (µs).
    gen_us: Cell<u64>,
}

impl Running {
    /// One token generated, `step` after the previous one (zero: the first, with the prompt).
    fn token(&self, step: Duration) {
        self.kv.set(self.kv.get() + 1);
        self.gen_us.set(self.gen_us.get() + step.as_micros() as u64);
        let mut st = self.engine.state.borrow_mut();
        st.kv_used += 1;
        st.generation_tokens += 1;
        let running = u64::from(st.running);
        let held = self.kv.get();
        let l = &mut st.llama;
        l.decodes += 1;
        l.busy_in_decodes += running;
        l.tokens_max = l.tokens_max.max(held);
        if let Some(Some(t)) = st.tasks.get_mut(self.slot as usize) {
            t.n_decoded += 1;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        {
            // llama.cpp counts a sequence's generation when its slot is released
            let mut st = self.engine.state.borrow_mut();
            let mut n = 0;
            if let Some(Some(t)) = st.tasks.get_mut(self.slot as usize) {
                t.done = true;
                n = t.n_decoded;
            }
            let (steps, us) = (n.saturating_sub(1), self.gen_us.get());
            let l = &mut st.llama;
            l.predict.add(steps, us);
            l.bucket_predict.add(steps, us);
            l.predicted += n;
        }
        self.engine.release(self.slot, self.kv.get());
    }
}

/// Waiting in the queue for a slot.
struct Queued {
    engine: Rc<Engine>,
    ticket: Rc<Ticket>,
    done: bool,
}

impl Future for Queued {
    type Output = u32;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
        match self.ticket.slot.get() {
            Some(s) => {
                self.done = true;
                Poll::Ready(s)
            }
            None => {
                self.ticket.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        // granted but never taken (the client left in between): give the slot back
        if !self.done {
            if let Some(s) = self.ticket.slot.get() {
                self.engine.release(s, self.ticket.need);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(sys: &str, user: &str) -> Vec<u8> {
        format!(r#"{{"model":"m","max_tokens":4,"messages":[{{"role":"system","content":"{sys}"}},{{"role":"user","content":"{user}"}}]}}"#).into_bytes()
    }

    #[test]
    fn slots_queue_fifo_and_prefix_cache_speeds_up_prefill() {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(async {
                let mut spec = EngineSpec::new(EngineKind::Vllm, 2);
                spec.tpot = Duration::from_millis(5);
                let e = Engine::new(spec);
                let sys = "x".repeat(4000);
                let b = body(&sys, "hi");
                let req = MockRequest::parse(&b).unwrap();
                // cold: 1,000 prompt tokens → 10 + 100 ms prefill; warm: the leading blocks
                // come from the prefix cache. What each prefilled is the engine's own count
                // (as llama.cpp's /slots shows it), and each took at least its prefill: lower
                // bounds only (a loaded CI box makes timers late, never early)
                let last = |e: &Engine| {
                    e.load()
                        .tasks
                        .into_iter()
                        .flatten()
                        .max_by_key(|t| t.id_task)
                        .unwrap()
                };
                let t = Instant::now();
                let sink = || crate::upstream::pipe::pipe(1 << 20);
                let (mut w, _r) = sink();
                e.serve(&mut w, &req, &b, true).await.unwrap();
                let cold = (t.elapsed(), last(&e));
                let t = Instant::now();
                let (mut w, _r) = sink();
                e.serve(&mut w, &req, &b, true).await.unwrap();
                let warm = (t.elapsed(), last(&e));
                let input = u64::from(req.input_tokens);
                assert!(input >= 1_000);
                assert_eq!(
                    (
                        cold.1.n_prompt_tokens_processed,
                        cold.1.n_prompt_tokens_cache
                    ),
                    (input, 0),
                    "{cold:?}"
                );
                assert!(warm.1.n_prompt_tokens_cache >= 900, "{warm:?}");
                assert_eq!(
                    warm.1.n_prompt_tokens_processed + warm.1.n_prompt_tokens_cache,
                    input
                );
                let (cold_fill, warm_fill) = (
                    e.prefill_time(cold.1.n_prompt_tokens_processed),
                    e.prefill_time(warm.1.n_prompt_tokens_processed),
                );
                assert!(cold_fill >= Duration::from_millis(110), "{cold_fill:?}");
                assert!(warm_fill < cold_fill / 2, "{warm_fill:?}");
                assert!(
                    cold.0 >= cold_fill && warm.0 >= warm_fill,
                    "{cold:?} {warm:?}"
                );
                assert!(e.load().cache_hits >= 900);
                let l = e.load().llama;
                assert_eq!(l.prompt.n, input + warm.1.n_prompt_tokens_processed);
                assert_eq!(l.prompt_cached, warm.1.n_prompt_tokens_cache);
                assert_eq!((l.predicted, l.predict.n), (8, 6), "{l:?}");
                // three at once on two slots: one waits
                let e2 = e.clone();
                let (b2, r2) = (b.clone(), req.clone());
                let h: Vec<_> = (0..3)
                    .map(|_| {
                        let (e, b, r) = (e2.clone(), b2.clone(), r2.clone());
                        monoio::spawn(async move {
                            let (mut w, _r) = crate::upstream::pipe::pipe(1 << 20);
                            e.serve(&mut w, &r, &b, true).await.unwrap();
                        })
                    })
                    .collect();
                monoio::time::sleep(Duration::from_millis(5)).await;
                let l = e.load();
                assert_eq!((l.running, l.waiting), (2, 1), "{l:?}");
                assert!(l.kv_usage > 0.0);
                for j in h {
                    j.await;
                }
                let l = e.load();
                assert_eq!((l.running, l.waiting, l.kv_usage), (0, 0, 0.0));
            });
    }
}
