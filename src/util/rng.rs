//! The one tiny per-shard pseudo-random generator (SplitMix64): the balancer's picks, the
//! mock's fault dice and the telemetry ids all draw from it.
//!
//! Owns: `Rng`. Must not: be used for anything secret; it is seeded, fast and predictable,
//! which is what the balancer and its tests want (telemetry seeds it from the system).

use std::cell::Cell;

#[derive(Debug)]
pub struct Rng(Cell<u64>);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(Cell::new(seed))
    }

    pub fn next_u64(&self) -> u64 {
        let s = self.0.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.0.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; returns 0 for `n == 0`).
    pub fn below(&self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let r = Rng::new(7);
        let mut hist = [0u32; 5];
        for _ in 0..50_000 {
            hist[r.below(5)] += 1;
        }
        assert!(
            hist.iter().all(|&h| (9_000..11_000).contains(&h)),
            "{hist:?}"
        );
        assert_eq!(r.below(0), 0);
        assert_eq!(Rng::new(1).next_u64(), Rng::new(1).next_u64());
        let u = (0..1_000).map(|_| r.unit());
        assert!(u.clone().all(|u| (0.0..1.0).contains(&u)));
        let mean = u.sum::<f64>() / 1_000.0;
        assert!((0.4..0.6).contains(&mean), "{mean}");
    }
}
