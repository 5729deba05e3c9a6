//! `lb = "load"`: pick the deployment whose engine is least loaded and whose prefix cache is
//! warmest for this prompt, and shed before the engine when every deployment is full.
//!
//! Per candidate (eligible: breaker closed, not tried, keys free; engines whose last poll
//! failed are out while any other engine is up):
//! - queue `q` = the engine's waiting requests + this gateway's requests sent since its last
//!   poll and still in flight (the herd between polls: the engine has not reported them yet;
//!   those already answered load it no more); KV `kv` = its KV usage, grown by
//!   `kv / running` for each of those; a signal older than `stale_ms` counts as saturated (the
//!   worst queue among the fresh candidates, KV 1, full when the model sheds). Deployments without an engine signal (Ollama, or no `engine`) use
//!   the gateway's own in-flight count as their queue, and so do engines whose signal URL
//!   answers 404/501 (up, unsignalled: never dropped for a missing flag). llama.cpp's `/slots` has no queue
//!   series: there `q` = what is occupied (this gateway's in-flight requests there, plus the
//!   slots the page showed busy beyond what the gateway had in flight when it arrived) beyond
//!   the slots, plus the queued requests of other clients its `/metrics` reported (when
//!   polled: `poller`), and the busy share stands in for KV (`View::slots_queue`). When no candidate has a usable signal
//!   (every polled engine down or stale: a broken metrics page), all of them are routed so, by
//!   the gateway's own view, instead of shedding forever; `ringgate_engine_blind_routes_total`
//!   counts it and the poller logs it once per outage.
//! - full when one more request would make its waiting exceed `max_waiting` (waiting + sent
//!   since the poll while it queues), or its in-flight (this gateway's, all shards) reach
//!   `max_in_flight`. Full deployments are not picked; all full → `LoadPick::Full` (the
//!   caller answers 429 + Retry-After before anything goes upstream).
//! - score (the Gateway API inference extension's EPP scorers): queue `(max q − q) / (max q −
//!   min q)` (1 when all equal), KV `1 − kv`, prefix = leading prompt blocks the gateway
//!   (any shard) routed there recently / prompt blocks, counted only while the deployment's queue is
//!   within `affinity_slack` of the shortest (bounded load). Weighted sum (default 2/2/3);
//!   highest wins; equal scores go to the deployment with the fewest of this gateway's
//!   requests in flight, and only a tie on both is broken at random (never a coin toss while
//!   one engine is busier by the gateway's own count).
//!
//! The prefix index (`PrefixIndex`, approximate by design) and the engine signals
//! (`EngineCell`) are process-wide: a turn routed by one shard is warm for the next turn on
//! any shard.
//!
//! Owns: `LoadPicker`, `LoadSettings`, `LoadPick`. Must not: read clocks (callers pass
//! `now_ms`), do IO, or decide retries.

pub use crate::config::policy::LoadSettings;
use std::sync::Arc;

use super::prefix::PrefixIndex;
use super::signal::{EngineCell, View};
use crate::util::rng::Rng;

/// Prefix-index capacity per deployment, process-wide (block hashes; 8 bytes each).
pub const INDEX_BLOCKS: usize = 16_384;
/// How long a routed prefix is assumed warm at the engine.
pub const INDEX_TTL_MS: u64 = 120_000;

/// What `pick` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadPick {
    Pick(usize),
    /// Candidates existed, every one of them full.
    Full,
    /// No candidate at all.
    None,
}

#[derive(Debug)]
struct Dep {
    cell: Option<Arc<EngineCell>>,
    index: Arc<PrefixIndex>,
}

/// One model's load-aware picker on one shard (over process-wide signals and indexes).
#[derive(Debug)]
pub struct LoadPicker {
    pub settings: LoadSettings,
    deps: Vec<Dep>,
}

struct Cand {
    d: usize,
    /// Its signal is older than `stale_ms`: `q` is the worst fresh one's.
    stale: bool,
    q: f64,
    kv: f64,
    matched: usize,
    /// This gateway's requests on it (all shards): the tie-breaker.
    in_flight: u32,
}

impl LoadPicker {
    /// `cells[i]`: deployment i's engine signal, if its provider has one; prefix indexes of
    /// its own (tests).
    pub fn new(settings: LoadSettings, cells: Vec<Option<Arc<EngineCell>>>) -> LoadPicker {
        let indexes = cells
            .iter()
            .map(|_| Arc::new(PrefixIndex::new(INDEX_BLOCKS, INDEX_TTL_MS)))
            .collect();
        LoadPicker::shared(settings, cells, indexes)
    }

    /// As `new`, with deployment i's process-wide prefix index `indexes[i]`
    /// (`forward::shared`).
    pub fn shared(
        settings: LoadSettings,
        cells: Vec<Option<Arc<EngineCell>>>,
        indexes: Vec<Arc<PrefixIndex>>,
    ) -> LoadPicker {
        LoadPicker {
            settings,
            deps: cells
                .into_iter()
                .zip(indexes)
                .map(|(cell, index)| Dep { cell, index })
                .collect(),
        }
    }

    fn view(&self, d: usize, now_ms: u64, local_in_flight: u32) -> View {
        match self.deps.get(d).and_then(|x| x.cell.as_ref()) {
            Some(c) => {
                let mut v = c.view(now_ms);
                if !c.polled || v.unsignalled {
                    v.waiting = v.in_flight;
                    v.sent_since = 0;
                }
                v
            }
            None => View {
                age_ms: 0,
                up: true,
                unsignalled: false,
                waiting: local_in_flight,
                running: 0,
                kv: None,
                slots: 0,
                in_flight: local_in_flight,
                in_flight_at_poll: 0,
                sent_since: 0,
                tokens_since: 0,
            },
        }
    }

    fn stale(&self, d: usize, v: &View) -> bool {
        self.deps
            .get(d)
            .and_then(|x| x.cell.as_ref())
            .is_some_and(|c| c.polled && v.age_ms > c.stale_ms)
    }

    /// Pick a deployment for a prompt with `blocks` (see the module doc).
    pub fn pick(
        &self,
        now_ms: u64,
        blocks: &[u64],
        rng: &Rng,
        eligible: impl Fn(usize) -> bool,
        local_in_flight: impl Fn(usize) -> u32,
    ) -> LoadPick {
        let s = &self.settings;
        let mut cands: smallvec::SmallVec<[(usize, View); 8]> = (0..self.deps.len())
            .filter(|&d| eligible(d))
            .map(|d| (d, self.view(d, now_ms, local_in_flight(d))))
            .collect();
        if cands.is_empty() {
            return LoadPick::None;
        }
        // engines whose metrics fail are out while another one answers its polls
        if cands.iter().any(|(_, v)| v.up) {
            cands.retain(|(_, v)| v.up);
        }
        // No usable signal at all (every engine down, or every signal stale): route by the
        // gateway's own view — its in-flight count as the queue, no KV — rather than shed
        // forever on a broken metrics page; the cells count it (`EngineCell::routed_blind`).
        let blind = cands
            .iter()
            .all(|(d, v)| self.polled(*d) && (!v.up || self.stale(*d, v)));
        if blind {
            for (d, v) in cands.iter_mut() {
                *v = View {
                    age_ms: 0,
                    up: true,
                    unsignalled: false,
                    waiting: local_in_flight(*d),
                    running: 0,
                    kv: None,
                    slots: 0,
                    in_flight: v.in_flight,
                    in_flight_at_poll: 0,
                    sent_since: 0,
                    tokens_since: 0,
                };
            }
        }
        let mut live: smallvec::SmallVec<[Cand; 8]> = smallvec::SmallVec::new();
        for (d, v) in &cands {
            let stale = !blind && self.stale(*d, v);
            let unseen = v.sent_since.min(v.in_flight);
            let (waiting_est, q, util) = if v.slots > 0 {
                v.slots_queue()
            } else {
                let queued = if v.waiting > 0 { unseen } else { 0 };
                let kv = v.kv.map_or(0.0, |k| {
                    let per = if v.running > 0 {
                        k / f64::from(v.running)
                    } else {
                        0.0
                    };
                    (k + per * f64::from(unseen)).min(1.0)
                });
                (
                    v.waiting.saturating_add(queued),
                    f64::from(v.waiting) + f64::from(unseen),
                    kv,
                )
            };
            let full = (stale && (s.max_waiting.is_some() || s.max_in_flight.is_some()))
                || s.max_waiting.is_some_and(|m| waiting_est >= m)
                || s.max_in_flight.is_some_and(|m| v.in_flight >= m);
            if full {
                continue;
            }
            // stale: KV 1, and the worst queue of the fresh ones (filled in below)
            let (q, kv) = if stale { (0.0, 1.0) } else { (q, util) };
            let matched = match (blocks.is_empty(), self.deps.get(*d)) {
                (false, Some(dep)) => dep.index.matched(blocks, now_ms),
                _ => 0,
            };
            live.push(Cand {
                d: *d,
                stale,
                q,
                kv,
                matched,
                in_flight: v.in_flight,
            });
        }
        if live.is_empty() {
            return LoadPick::Full;
        }
        // a stale signal counts as saturated: as long a queue as the busiest fresh engine's,
        // so it never beats an idler one, and against that busiest one the gateway's own
        // in-flight count decides (not an infinite queue that sends every request to a
        // known-busy engine while one poll is slow)
        let worst_fresh = live
            .iter()
            .filter(|c| !c.stale)
            .map(|c| c.q)
            .fold(0.0, f64::max);
        for c in live.iter_mut().filter(|c| c.stale) {
            c.q = worst_fresh;
        }
        let min_q = live.iter().map(|c| c.q).fold(f64::INFINITY, f64::min);
        let max_q = live.iter().map(|c| c.q).fold(0.0, f64::max);
        let [wq, wk, wp] = s.weights;
        // (score, in flight, deployment): the highest score wins; among equal scores the one
        // with the fewest of this gateway's requests; only a full tie is a coin toss
        let mut best: Option<(f64, u32, usize)> = None;
        let mut ties = 0usize;
        for c in &live {
            let sq = if max_q > min_q {
                (max_q - c.q) / (max_q - min_q)
            } else {
                1.0
            };
            let sp = if blocks.is_empty() || c.q > min_q + f64::from(s.affinity_slack) {
                0.0
            } else {
                c.matched as f64 / blocks.len() as f64
            };
            let score = wq * sq + wk * (1.0 - c.kv) + wp * sp;
            match best {
                Some((b, _, _)) if score < b - 1e-9 => {}
                Some((b, f, _)) if score <= b + 1e-9 && c.in_flight > f => {}
                Some((b, f, _)) if score <= b + 1e-9 && c.in_flight == f => {
                    ties += 1;
                    if rng.below(ties + 1) == 0 {
                        best = Some((b, f, c.d));
                    }
                }
                _ => {
                    best = Some((score, c.in_flight, c.d));
                    ties = 0;
                }
            }
        }
        match best {
            Some((_, _, d)) => {
                if blind {
                    if let Some(c) = self.deps.get(d).and_then(|x| x.cell.as_ref()) {
                        c.routed_blind();
                    }
                }
                LoadPick::Pick(d)
            }
            None => LoadPick::None,
        }
    }

    /// Whether deployment `d` has an engine signal to poll.
    fn polled(&self, d: usize) -> bool {
        self.deps
            .get(d)
            .and_then(|x| x.cell.as_ref())
            .is_some_and(|c| c.polled)
    }

    /// The request with `blocks` went to deployment `d`: its prefix is now warm there.
    pub fn routed(&self, d: usize, blocks: &[u64], now_ms: u64) {
        if let Some(dep) = self.deps.get(d) {
            if !blocks.is_empty() {
                dep.index.insert(blocks, now_ms);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::signal::{EngineKind, Sample};

    fn cell(waiting: u32, running: u32, kv: f64, at: u64) -> Arc<EngineCell> {
        let c = Arc::new(EngineCell::new(EngineKind::Vllm, true, 1_000));
        c.publish(
            Sample {
                waiting,
                running,
                kv: Some(kv),
                slots: 0,
            },
            at,
        );
        c
    }

    fn picker(cells: Vec<Arc<EngineCell>>, s: LoadSettings) -> LoadPicker {
        LoadPicker::new(s, cells.into_iter().map(Some).collect())
    }

    fn share(p: &LoadPicker, blocks: &[u64], n: usize) -> Vec<usize> {
        let rng = Rng::new(7);
        let mut got = vec![0; 2];
        for _ in 0..n {
            if let LoadPick::Pick(d) = p.pick(100, blocks, &rng, |_| true, |_| 0) {
                got[d] += 1;
            }
        }
        got
    }

    #[test]
    fn the_idle_engine_wins_and_ties_split() {
        let p = picker(
            vec![cell(20, 8, 0.9, 100), cell(0, 1, 0.1, 100)],
            LoadSettings::default(),
        );
        assert_eq!(share(&p, &[], 100), vec![0, 100]);
        let p = picker(
            vec![cell(0, 0, 0.0, 100), cell(0, 0, 0.0, 100)],
            LoadSettings::default(),
        );
        let got = share(&p, &[], 1_000);
        assert!(got[0] > 400 && got[1] > 400, "{got:?}");
    }

    #[test]
    fn prefix_affinity_sticks_within_the_slack_only() {
        let (a, b) = (cell(0, 1, 0.1, 100), cell(0, 1, 0.1, 100));
        let p = picker(vec![a, b.clone()], LoadSettings::default());
        let blocks = [1u64, 2, 3, 4];
        p.routed(1, &blocks, 100);
        assert_eq!(share(&p, &blocks, 100), vec![0, 100]);
        // the warm engine queues far beyond the slack: the cold one wins
        b.publish(
            Sample {
                waiting: 10,
                running: 8,
                kv: Some(0.9),
                slots: 0,
            },
            100,
        );
        assert_eq!(share(&p, &blocks, 100), vec![100, 0]);
    }

    #[test]
    fn full_stale_and_down_engines() {
        let s = LoadSettings {
            max_waiting: Some(8),
            ..LoadSettings::default()
        };
        let rng = Rng::new(1);
        let p = picker(vec![cell(8, 8, 1.0, 100), cell(9, 4, 1.0, 100)], s);
        assert_eq!(p.pick(100, &[], &rng, |_| true, |_| 0), LoadPick::Full);
        assert_eq!(p.pick(100, &[], &rng, |_| false, |_| 0), LoadPick::None);
        // stale (> 1,000 ms): saturated, hence full — while another engine has a signal
        let p = picker(vec![cell(0, 0, 0.0, 100), cell(0, 0, 0.0, 4_500)], s);
        assert_eq!(p.pick(5_000, &[], &rng, |_| true, |_| 0), LoadPick::Pick(1));
        // every signal stale or down: routed by the gateway's own in-flight count, counted
        let (a, b) = (cell(0, 0, 0.0, 100), cell(0, 0, 0.0, 100));
        a.fail();
        b.fail();
        let p = picker(vec![a.clone(), b.clone()], s);
        assert_eq!(
            p.pick(5_000, &[], &rng, |_| true, |d| [3, 0][d]),
            LoadPick::Pick(1)
        );
        assert_eq!(b.blind_routes.load(std::sync::atomic::Ordering::Relaxed), 1);
        // …and its max_in_flight still holds (on the gateway's count)
        let capped = LoadSettings {
            max_in_flight: Some(1),
            ..s
        };
        let p = picker(vec![a.clone(), b.clone()], capped);
        b.start(0);
        a.start(0);
        assert_eq!(p.pick(5_000, &[], &rng, |_| true, |_| 1), LoadPick::Full);
        // a failed poll takes an engine out while the other answers
        let (a, b) = (cell(0, 0, 0.0, 100), cell(5, 8, 0.9, 100));
        a.fail();
        let p = picker(vec![a.clone(), b], LoadSettings::default());
        assert_eq!(p.pick(100, &[], &rng, |_| true, |_| 0), LoadPick::Pick(1));
        // the herd between polls: sends since the poll count as queue
        let (a, b) = (cell(0, 0, 0.0, 100), cell(0, 0, 0.0, 100));
        let p = picker(vec![a.clone(), b.clone()], LoadSettings::default());
        for _ in 0..10 {
            match p.pick(100, &[], &rng, |_| true, |_| 0) {
                LoadPick::Pick(0) => a.start(10),
                LoadPick::Pick(_) => b.start(10),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(a.view(100).sent_since, 5);
    }

    #[test]
    fn a_stale_signal_ties_the_busiest_fresh_engine() {
        let rng = Rng::new(3);
        // eng0 fresh and busy (a queue, KV full, 4 of the gateway's requests on it); eng1's
        // last good poll 1.5 s ago (its polls are slow), none of ours on it
        let busy = cell(4, 8, 1.0, 4_900);
        let stale = cell(0, 0, 0.0, 3_500);
        for _ in 0..4 {
            busy.start(10);
        }
        let p = picker(vec![busy.clone(), stale.clone()], LoadSettings::default());
        for _ in 0..20 {
            assert_eq!(
                p.pick(5_000, &[], &rng, |_| true, |_| 0),
                LoadPick::Pick(1),
                "a known-busy engine must not win over a stale one the gateway loads less"
            );
        }
        // more of ours on the stale one than on the busy one: the busy one
        for _ in 0..5 {
            stale.start(10);
        }
        assert_eq!(p.pick(5_000, &[], &rng, |_| true, |_| 0), LoadPick::Pick(0));
        // a fresh idle engine always beats a stale one, however idle that one was
        let idle = cell(0, 0, 0.0, 4_900);
        let p = picker(vec![cell(0, 0, 0.0, 3_500), idle], LoadSettings::default());
        for _ in 0..20 {
            assert_eq!(p.pick(5_000, &[], &rng, |_| true, |_| 0), LoadPick::Pick(1));
        }
    }

    fn slots_cell(busy: u32, slots: u32, in_flight: u32) -> Arc<EngineCell> {
        let c = Arc::new(EngineCell::new(EngineKind::Llamacpp, true, 1_000));
        for _ in 0..in_flight {
            c.start(10);
        }
        c.publish(
            Sample {
                waiting: 0,
                running: busy,
                kv: None,
                slots,
            },
            100,
        );
        c
    }

    #[test]
    fn equal_scores_go_to_the_engine_with_fewer_in_flight() {
        // the same signal (every slot busy on both): the gateway's own count decides
        let (a, b) = (slots_cell(2, 2, 2), slots_cell(2, 2, 0));
        let p = picker(vec![a, b], LoadSettings::default());
        assert_eq!(share(&p, &[], 200), vec![0, 200]);
        // and for engines with a queue series too
        let (a, b) = (cell(0, 4, 0.5, 100), cell(0, 4, 0.5, 100));
        a.start(1);
        let p = picker(vec![a, b], LoadSettings::default());
        assert_eq!(share(&p, &[], 200), vec![0, 200]);
    }

    #[test]
    fn a_slots_engine_queues_what_the_gateway_sent_beyond_its_slots() {
        // eng0: 2 slots busy, 4 of ours in flight (2 queued); eng1 idle. New requests go to
        // eng1 until it, too, queues more than eng0
        let (a, b) = (slots_cell(2, 2, 4), slots_cell(0, 2, 0));
        let p = picker(vec![a.clone(), b.clone()], LoadSettings::default());
        let rng = Rng::new(3);
        for _ in 0..3 {
            assert_eq!(p.pick(100, &[], &rng, |_| true, |_| 0), LoadPick::Pick(1));
            b.start(10);
        }
        // max_waiting counts that estimate: eng0 (2 queued) is full at 2, eng1 (1) is not
        let s = LoadSettings {
            max_waiting: Some(2),
            ..LoadSettings::default()
        };
        let p = picker(vec![a, b.clone()], s);
        assert_eq!(p.pick(100, &[], &rng, |_| true, |_| 0), LoadPick::Pick(1));
        b.start(10);
        assert_eq!(p.pick(100, &[], &rng, |_| true, |_| 0), LoadPick::Full);
    }

    #[test]
    fn a_slots_page_that_lags_does_not_count_our_finished_requests_twice() {
        // eng0: both slots busy with our long jobs, two more of ours queued (4 in flight);
        // eng1: its last page showed both slots busy with our two short requests, which have
        // ended since; three new ones are on their way. eng1 holds 3 (1 waiting), eng0 4
        // (2 waiting): the fourth goes to eng1 too (busy + sent-since said 5 there)
        let a = slots_cell(2, 2, 4);
        let b = slots_cell(2, 2, 2);
        b.end();
        b.end();
        let p = picker(vec![a.clone(), b.clone()], LoadSettings::default());
        let rng = Rng::new(9);
        for _ in 0..3 {
            assert_eq!(p.pick(100, &[], &rng, |_| true, |_| 0), LoadPick::Pick(1));
            b.start(10);
        }
        assert_eq!(p.pick(100, &[], &rng, |_| true, |_| 0), LoadPick::Pick(1));
        // busy slots that were not ours when the page came (another client) still count
        let c = slots_cell(2, 2, 0);
        let p = picker(vec![c, slots_cell(0, 2, 1)], LoadSettings::default());
        assert_eq!(p.pick(100, &[], &rng, |_| true, |_| 0), LoadPick::Pick(1));
    }

    #[test]
    fn an_engine_without_a_signal_page_is_routed_by_in_flight_not_dropped() {
        let (a, b) = (slots_cell(0, 2, 0), slots_cell(1, 2, 0));
        a.no_signal(100);
        let p = picker(vec![a.clone(), b.clone()], LoadSettings::default());
        let rng = Rng::new(5);
        let mut got = [0usize; 2];
        for _ in 0..6 {
            match p.pick(100, &[], &rng, |_| true, |_| 0) {
                LoadPick::Pick(d) => {
                    got[d] += 1;
                    [&a, &b][d].start(10);
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(
            got[0] >= 2,
            "the unsignalled engine is still routed: {got:?}"
        );
        assert!(a.view(100).up);
    }
}
