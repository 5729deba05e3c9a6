//! Prices from the config: USD per 1M tokens turned into integer pico-USD per token, and
//! USD amounts into nano-USD (the spend ledger's unit, see `governance::spend`).
//!
//! Owns: `Price`, `usd_to_nanos`. Must not: count spend (that is `governance`).

/// Nano-USD per USD.
pub const NANOS_PER_USD: u64 = 1_000_000_000;

/// USD → nano-USD (rounded; negative or NaN: 0; saturating).
pub fn usd_to_nanos(usd: f64) -> u64 {
    let n = (usd * NANOS_PER_USD as f64).round();
    if n.is_nan() || n <= 0.0 {
        0
    } else if n >= u64::MAX as f64 {
        u64::MAX
    } else {
        n as u64
    }
}

/// What one model (or deployment) costs, in pico-USD per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Price {
    pub input_pico: u64,
    pub output_pico: u64,
}

impl Price {
    /// From the config's USD per 1M tokens (`None` when neither is given).
    pub fn per_mtok(input: Option<f64>, output: Option<f64>) -> Option<Price> {
        if input.is_none() && output.is_none() {
            return None;
        }
        // USD per 1M tokens × 10^12 pico / 10^6 tokens = × 10^6 pico-USD per token
        let pico = |p: Option<f64>| usd_to_nanos(p.unwrap_or(0.0) / 1000.0);
        Some(Price {
            input_pico: pico(input),
            output_pico: pico(output),
        })
    }

    pub fn is_free(&self) -> bool {
        self.input_pico == 0 && self.output_pico == 0
    }

    /// Cost of `input` + `output` tokens in nano-USD, rounded to the nearest.
    pub fn cost_nanos(&self, input: u64, output: u64) -> u64 {
        let pico = u128::from(input) * u128::from(self.input_pico)
            + u128::from(output) * u128::from(self.output_pico);
        u64::try_from((pico + 500) / 1000).unwrap_or(u64::MAX)
    }
}
