//! Picking one of a model's deployments (lock-free):
//! - `weighted`: smooth weighted round-robin (nginx): every pick adds each eligible
//!   deployment's weight to its running score, takes the highest and subtracts the total —
//!   deterministic, interleaved, exact over every full cycle (3:1 → a a b a, a a b a, …);
//! - `p2c`: power of two choices (Finagle "peak EWMA"): two distinct eligible deployments at
//!   random, the one with the lower `latency EWMA × (in-flight + 1)` wins.
//!
//! What is learnt is process-wide: each deployment's latency estimate and in-flight count live
//! in a `LoadCell` every shard shares (`forward::shared`), so a slow deployment looks slow to
//! every shard after one shard measured it, and p2c sees the requests of all shards. The
//! estimate is one `AtomicU64` (the cost as `f32` nanoseconds and the time of the last sample
//! as 32 bits of the ms routing clock, compared wrapping: ±24 days), updated by
//! compare-and-swap; the in-flight count is an `AtomicU32`. The weighted rotation's running
//! scores stay per shard (a rotation, not knowledge: each shard's own sequence is exact).
//! Nothing is written to the cells of a model that never reads them (one deployment under
//! p2c, or `weighted`): its requests touch no shared line here.
//!
//! Eligibility (breaker open, already tried in this request, keys cooling) is the caller's
//! predicate; with one eligible deployment it is picked, with none `pick` returns `None`.
//!
//! Owns: `Balancer`, `PeakEwma`, `LoadCell`. Must not: read clocks (callers pass `now`), do
//! IO, or decide what counts as a failure.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rng::Rng;
use crate::config::policy::Lb;
use crate::engine::signal::ms_of;

/// How fast the latency estimate forgets: a sample's weight halves every ~3.5 s.
pub const EWMA_DECAY: Duration = Duration::from_secs(5);

/// Latency charged for a failed attempt (at least; a slower failure counts as its time), so a
/// deployment that fails fast does not look fast.
pub const FAILURE_PENALTY: Duration = Duration::from_secs(1);

/// Finagle's peak EWMA: a sample above the estimate replaces it at once (peak), lower samples
/// are blended in with weight `1 - exp(-Δt / decay)`; while idle the estimate decays towards
/// zero, so a deployment that was slow gets probed again after a while.
#[derive(Debug)]
pub struct PeakEwma {
    /// `f32` cost in ns (high 32 bits) | the last sample's time, ms (low 32 bits). 0: none.
    word: AtomicU64,
    decay_ms: f64,
}

impl PeakEwma {
    pub fn new(decay: Duration) -> PeakEwma {
        PeakEwma {
            word: AtomicU64::new(0),
            decay_ms: (decay.as_secs_f64() * 1e3).max(1e-3),
        }
    }

    fn split(w: u64) -> (f64, u32) {
        (f64::from(f32::from_bits((w >> 32) as u32)), w as u32)
    }

    fn weight(&self, w: u64, now: u32) -> f64 {
        if w == 0 {
            return 0.0;
        }
        // another shard's newer sample: no decay
        let dt = (now.wrapping_sub(Self::split(w).1) as i32).max(0);
        (-f64::from(dt) / self.decay_ms).exp()
    }

    pub fn observe(&self, now: Instant, rtt: Duration) {
        let now = ms_of(now) as u32;
        let rtt = rtt.as_nanos() as f64;
        let mut cur = self.word.load(Relaxed);
        loop {
            let cost = Self::split(cur).0;
            let next = if rtt > cost {
                rtt
            } else {
                let w = self.weight(cur, now);
                cost * w + rtt * (1.0 - w)
            };
            let word = u64::from((next as f32).to_bits()) << 32 | u64::from(now);
            match self
                .word
                .compare_exchange_weak(cur, word.max(1), Relaxed, Relaxed)
            {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// The estimate at `now` in nanoseconds (decayed towards zero since the last sample).
    pub fn get(&self, now: Instant) -> f64 {
        let w = self.word.load(Relaxed);
        Self::split(w).0 * self.weight(w, ms_of(now) as u32)
    }
}

/// One deployment's learnt load, shared by every shard: latency estimate and requests in
/// flight (this gateway's, all shards).
#[derive(Debug)]
pub struct LoadCell {
    pub ewma: PeakEwma,
    in_flight: AtomicU32,
}

impl LoadCell {
    pub fn new(decay: Duration) -> LoadCell {
        LoadCell {
            ewma: PeakEwma::new(decay),
            in_flight: AtomicU32::new(0),
        }
    }
}

impl Default for LoadCell {
    fn default() -> Self {
        LoadCell::new(EWMA_DECAY)
    }
}

/// Smooth weighted round-robin (nginx) over fixed weights: deterministic, exact over a full
/// cycle of the same eligible entries. Deployments (`Balancer`) and provider keys (`KeyRing`)
/// rotate with it.
#[derive(Debug)]
pub(super) struct Rotation {
    /// (weight ≥ 1, the running score: this shard's).
    slots: Vec<(i64, Cell<i64>)>,
}

impl Rotation {
    pub(super) fn new(weights: &[u32]) -> Rotation {
        Rotation {
            slots: weights
                .iter()
                .map(|&w| (i64::from(w.max(1)), Cell::new(0)))
                .collect(),
        }
    }

    /// The next entry by weight among those `eligible` (asked once per entry, in order).
    pub(super) fn pick(&self, mut eligible: impl FnMut(usize) -> bool) -> Option<usize> {
        let mut total = 0;
        let mut best: Option<usize> = None;
        for (i, (weight, current)) in self.slots.iter().enumerate() {
            if !eligible(i) {
                continue;
            }
            current.set(current.get() + weight);
            total += weight;
            if best.is_none_or(|b| current.get() > self.slots[b].1.get()) {
                best = Some(i);
            }
        }
        let current = &self.slots[best?].1;
        current.set(current.get() - total);
        best
    }
}

/// One model's balancer over its deployments (indices into `Route::deployments`).
#[derive(Debug)]
pub struct Balancer {
    lb: Lb,
    /// `loads[i]`: deployment i's (shared with the other shards).
    loads: Vec<Arc<LoadCell>>,
    rotation: Rotation,
    /// Whether anything reads the latency estimates and in-flight counts (p2c over two or
    /// more deployments, `load`): else nothing is written to them (a shared cache line less
    /// per request for one-deployment and weighted models).
    learn: bool,
}

impl Balancer {
    /// A balancer whose deployments have load cells of their own (tests).
    pub fn new(lb: Lb, weights: &[u32], decay: Duration) -> Balancer {
        let cells = weights
            .iter()
            .map(|_| Arc::new(LoadCell::new(decay)))
            .collect();
        Balancer::shared(lb, weights, cells)
    }

    /// A balancer over the shared `cells` (`cells[i]`: deployment i's, `forward::shared`).
    pub fn shared(lb: Lb, weights: &[u32], mut cells: Vec<Arc<LoadCell>>) -> Balancer {
        cells.truncate(weights.len());
        Balancer {
            lb,
            learn: lb == Lb::Load || (lb == Lb::P2c && weights.len() > 1),
            rotation: Rotation::new(&weights[..cells.len()]),
            loads: cells,
        }
    }

    pub fn lb(&self) -> Lb {
        self.lb
    }

    /// Whether latency and in-flight are tracked for this model (see `learn`).
    pub fn learns(&self) -> bool {
        self.learn
    }

    pub fn len(&self) -> usize {
        self.loads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.loads.is_empty()
    }

    /// Pick an eligible deployment, or `None` when none is.
    pub fn pick(&self, now: Instant, rng: &Rng, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        match self.lb {
            Lb::Weighted => self.pick_weighted(&eligible),
            // `load` picks through `engine::load`; its balancer is the p2c fallback
            Lb::P2c | Lb::Load => self.pick_p2c(now, rng, &eligible),
        }
    }

    fn pick_weighted(&self, eligible: &impl Fn(usize) -> bool) -> Option<usize> {
        self.rotation.pick(eligible)
    }

    fn pick_p2c(
        &self,
        now: Instant,
        rng: &Rng,
        eligible: &impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let n = (0..self.loads.len()).filter(|&i| eligible(i)).count();
        let nth = |k: usize| (0..self.loads.len()).filter(|&i| eligible(i)).nth(k);
        match n {
            0 => None,
            1 => nth(0),
            _ => {
                let a = rng.below(n);
                let mut b = rng.below(n - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (nth(a)?, nth(b)?);
                Some(if self.score(b, now) < self.score(a, now) {
                    b
                } else {
                    a
                })
            }
        }
    }

    /// p2c load of a deployment: latency estimate (ns) × (in-flight + 1). A deployment without
    /// a sample yet scores 0 (new deployments get tried) unless requests are in flight on it.
    pub fn score(&self, i: usize, now: Instant) -> f64 {
        let Some(s) = self.loads.get(i) else {
            return f64::INFINITY;
        };
        let cost = s.ewma.get(now);
        let pending = f64::from(s.in_flight.load(Relaxed));
        if cost == 0.0 && pending > 0.0 {
            // Finagle's penalty for unmeasured-but-busy: keep it behind measured ones.
            return 1e12 + pending;
        }
        cost * (pending + 1.0)
    }

    /// Requests in flight on deployment `i` (every shard's).
    pub fn in_flight(&self, i: usize) -> u32 {
        self.loads.get(i).map_or(0, |s| s.in_flight.load(Relaxed))
    }

    /// An attempt on deployment `i` started.
    pub fn start(&self, i: usize) {
        if let Some(s) = self.loads.get(i).filter(|_| self.learn) {
            // paired with `end` by the attempt's guard: at most the requests in flight
            s.in_flight.fetch_add(1, Relaxed);
        }
    }

    /// An attempt on deployment `i` ended (after its body/stream, or its failure).
    pub fn end(&self, i: usize) {
        if let Some(s) = self.loads.get(i).filter(|_| self.learn) {
            let _ = s
                .in_flight
                .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(1)));
        }
    }

    /// A latency sample (time to the response head) for deployment `i`.
    pub fn observe(&self, i: usize, now: Instant, latency: Duration) {
        if let Some(s) = self.loads.get(i).filter(|_| self.learn) {
            s.ewma.observe(now, latency);
        }
    }

    /// A failed attempt: charged as `max(elapsed, FAILURE_PENALTY)`.
    pub fn observe_failure(&self, i: usize, now: Instant, elapsed: Duration) {
        self.observe(i, now, elapsed.max(FAILURE_PENALTY));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    #[test]
    fn weighted_3_to_1_is_exact_over_2000_picks_and_interleaved() {
        let b = Balancer::new(Lb::Weighted, &[3, 1], EWMA_DECAY);
        let rng = Rng::new(1);
        let now = Instant::now();
        let picks: Vec<usize> = (0..2_000)
            .map(|_| b.pick(now, &rng, |_| true).unwrap())
            .collect();
        assert_eq!(picks.iter().filter(|&&p| p == 0).count(), 1_500);
        assert_eq!(picks.iter().filter(|&&p| p == 1).count(), 500);
        // smooth: never more than 3 in a row of the heavy one, each cycle of 4 is exact
        assert_eq!(&picks[..8], &[0, 0, 1, 0, 0, 0, 1, 0]);
        assert!(picks
            .chunks(4)
            .all(|c| c.iter().filter(|&&p| p == 1).count() == 1));
    }

    #[test]
    fn weighted_table() {
        // (weights, picks, expected counts)
        let cases: [(&[u32], usize, &[usize]); 4] = [
            (&[1], 10, &[10]),
            (&[1, 1], 10, &[5, 5]),
            (&[5, 3, 2], 1_000, &[500, 300, 200]),
            (&[7, 1, 1, 1], 1_000, &[700, 100, 100, 100]),
        ];
        let now = Instant::now();
        for (weights, n, want) in cases {
            let b = Balancer::new(Lb::Weighted, weights, EWMA_DECAY);
            let mut got = vec![0; weights.len()];
            for _ in 0..n {
                got[b.pick(now, &Rng::new(0), |_| true).unwrap()] += 1;
            }
            assert_eq!(got, want, "{weights:?}");
        }
    }

    #[test]
    fn ineligible_deployments_are_skipped_and_none_when_all_are() {
        let now = Instant::now();
        let rng = Rng::new(3);
        for lb in [Lb::Weighted, Lb::P2c] {
            let b = Balancer::new(lb, &[3, 1, 1], EWMA_DECAY);
            for _ in 0..100 {
                assert_eq!(b.pick(now, &rng, |i| i == 2), Some(2), "{lb:?}");
                assert_ne!(b.pick(now, &rng, |i| i != 0), Some(0), "{lb:?}");
            }
            assert_eq!(b.pick(now, &rng, |_| false), None);
        }
        // weighted: with the heavy one excluded the others split evenly
        let b = Balancer::new(Lb::Weighted, &[3, 1, 1], EWMA_DECAY);
        let mut got = [0; 3];
        for _ in 0..100 {
            got[b.pick(now, &rng, |i| i != 0).unwrap()] += 1;
        }
        assert_eq!(got, [0, 50, 50]);
    }

    #[test]
    fn peak_ewma_takes_peaks_at_once_and_decays() {
        let t0 = Instant::now();
        let e = PeakEwma::new(Duration::from_secs(5));
        assert_eq!(e.get(t0), 0.0);
        e.observe(t0, Duration::from_millis(100));
        assert_eq!(e.get(t0), 100e6);
        // a lower sample right away barely moves it; after 5 s it weighs 63 %
        e.observe(t0 + Duration::from_secs(5), Duration::from_millis(10));
        let v = e.get(t0 + Duration::from_secs(5));
        let want = 100e6 * (-1f64).exp() + 10e6 * (1.0 - (-1f64).exp());
        assert!((v - want).abs() < 1e3, "{v} vs {want}");
        // idle: decays toward zero
        assert!(e.get(t0 + Duration::from_secs(60)) < 1e3);
        e.observe(t0 + Duration::from_secs(61), Duration::from_millis(500));
        assert_eq!(e.get(t0 + Duration::from_secs(61)), 500e6);
    }

    /// Discrete-event simulation with an injected clock: one request per ms for 4 s, each
    /// deployment answers after a fixed latency. Returns each deployment's share of picks.
    fn simulate(latencies_ms: &[u64], seed: u64) -> Vec<f64> {
        let weights = vec![1; latencies_ms.len()];
        let b = Balancer::new(Lb::P2c, &weights, EWMA_DECAY);
        let rng = Rng::new(seed);
        let t0 = Instant::now();
        let mut done: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
        let mut picks = vec![0usize; latencies_ms.len()];
        let n = 4_000u64;
        for ms in 0..n {
            while let Some(&Reverse((at, i))) = done.peek() {
                if at > ms {
                    break;
                }
                done.pop();
                b.end(i);
                b.observe(
                    i,
                    t0 + Duration::from_millis(at),
                    Duration::from_millis(latencies_ms[i]),
                );
            }
            let now = t0 + Duration::from_millis(ms);
            let i = b.pick(now, &rng, |_| true).unwrap();
            b.start(i);
            picks[i] += 1;
            done.push(Reverse((ms + latencies_ms[i], i)));
        }
        picks.iter().map(|&p| p as f64 / n as f64).collect()
    }

    #[test]
    fn p2c_prefers_the_faster_deployment() {
        // 10 ms vs 50 ms at 1,000 req/s: the fast one takes 95.95–95.98 % over seeds 0–4.
        // Equilibrium of 10·(n_fast+1) = 50·(n_slow+1) with n = rate × latency × share gives
        // 97.7 %: the slow one keeps a trickle because in-flight multiplies the latency.
        for seed in 0..5 {
            let share = simulate(&[10, 50], seed);
            assert!(share[0] > 0.94 && share[0] < 0.99, "seed {seed}: {share:?}");
        }
        // three deployments, one slow: measured [0.498, 0.495, 0.007]
        let share = simulate(&[10, 10, 80], 9);
        assert!(
            share[2] < 0.15 && share[0] > 0.3 && share[1] > 0.3,
            "{share:?}"
        );
    }

    #[test]
    fn p2c_splits_evenly_between_equals() {
        let share = simulate(&[20, 20], 4);
        assert!((share[0] - 0.5).abs() < 0.02, "{share:?}");
    }

    #[test]
    fn p2c_avoids_a_failing_deployment_then_probes_it_again() {
        let t0 = Instant::now();
        let b = Balancer::new(Lb::P2c, &[1, 1], EWMA_DECAY);
        let rng = Rng::new(5);
        b.observe(0, t0, Duration::from_millis(20));
        b.observe_failure(1, t0, Duration::from_millis(1));
        assert!((0..50).all(|_| b.pick(t0, &rng, |_| true) == Some(0)));
        // after a while idle the failure penalty has decayed below the healthy one's estimate
        let later = t0 + Duration::from_secs(30);
        b.observe(0, later, Duration::from_millis(20));
        assert_eq!(b.pick(later, &rng, |_| true), Some(1));
    }
}
