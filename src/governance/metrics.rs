//! Governance counters of one shard and their Prometheus text: requests, input and output
//! tokens and spend by key name and model, rejections by key name and reason. Keys appear by
//! name only.
//!
//! Owns: `KeyMetrics` (plain `Cell`s; per key a short list of per-route counters, since a key
//! uses few models). Must not: allocate per request beyond a key's first request for a model,
//! or render anything when keys are off.

use std::cell::{Cell, RefCell};
use std::fmt::Write;

use crate::observe::metrics::bump;
use crate::route::RouteTable;

/// Why a keyed request was refused (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No key, an unknown, expired or disabled key, or two keys (401).
    Auth,
    /// The model is outside the key's allow-list (403).
    ForbiddenModel,
    Rpm,
    Tpm,
    InFlight,
    /// The key spent its budget for the period (429 `insufficient_quota`).
    Budget,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::Auth,
        Reason::ForbiddenModel,
        Reason::Rpm,
        Reason::Tpm,
        Reason::InFlight,
        Reason::Budget,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Auth => "auth",
            Reason::ForbiddenModel => "forbidden_model",
            Reason::Rpm => "rpm",
            Reason::Tpm => "tpm",
            Reason::InFlight => "in_flight",
            Reason::Budget => "budget",
        }
    }
}

/// One key's counters for one model (route).
#[derive(Debug, Default, Clone, Copy)]
struct PerModel {
    route: u32,
    /// Requests that passed every check (counted under the requested model).
    requests: u64,
    /// Usage and spend of finished requests (counted under the model that answered).
    input: u64,
    output: u64,
    spend_nanos: u64,
}

#[derive(Debug, Default)]
struct PerKey {
    models: RefCell<Vec<PerModel>>,
    rejections: [Cell<u64>; 6],
}

impl PerKey {
    fn with_model(&self, route: usize, f: impl FnOnce(&mut PerModel)) {
        let Ok(mut list) = self.models.try_borrow_mut() else {
            return;
        };
        let route = route as u32;
        match list.iter_mut().find(|m| m.route == route) {
            Some(m) => f(m),
            None => {
                let mut m = PerModel {
                    route,
                    ..PerModel::default()
                };
                f(&mut m);
                list.push(m);
            }
        }
    }
}

#[derive(Debug, Default)]
pub struct KeyMetrics {
    /// By key slot; grows when runtime keys are added (`grow`).
    keys: RefCell<Vec<PerKey>>,
    /// Refusals that name no key (none sent, unknown, ambiguous).
    anonymous: Cell<u64>,
}

impl KeyMetrics {
    /// Room for `keys` key slots (slots are stable: existing counters stay).
    pub fn grow(&self, keys: usize) {
        if let Ok(mut k) = self.keys.try_borrow_mut() {
            while k.len() < keys {
                k.push(PerKey::default());
            }
        }
    }

    /// `f` on key `key`'s counters of route `route` (nothing when either is busy or unknown).
    fn with_model(&self, key: u32, route: usize, f: impl FnOnce(&mut PerModel)) {
        let Ok(keys) = self.keys.try_borrow() else {
            return;
        };
        if let Some(k) = keys.get(key as usize) {
            k.with_model(route, f);
        }
    }

    /// A request of key `key` for route `route` passed every check.
    pub fn request(&self, key: u32, route: usize) {
        self.with_model(key, route, |m| m.requests = m.requests.saturating_add(1));
    }

    /// A finished request of key `key` answered by route `route`: its tokens and cost.
    pub fn usage(&self, key: u32, route: usize, (input, output): (u64, u64), nanos: u64) {
        self.with_model(key, route, |m| {
            m.input = m.input.saturating_add(input);
            m.output = m.output.saturating_add(output);
            m.spend_nanos = m.spend_nanos.saturating_add(nanos);
        });
    }

    /// A refusal; `key` is `None` when the request named no known key.
    pub fn rejected(&self, key: Option<u32>, reason: Reason) {
        let keys = self.keys.try_borrow().ok();
        let slot = key
            .zip(keys.as_ref())
            .and_then(|(k, keys)| keys.get(k as usize))
            .and_then(|k| k.rejections.get(reason as usize));
        match slot {
            Some(c) => bump(c),
            None => bump(&self.anonymous),
        }
    }

    pub fn requests(&self, key: u32, route: usize) -> u64 {
        self.model(key, route).map_or(0, |m| m.requests)
    }

    /// (input tokens, output tokens, nano-USD) of key `key` on route `route` on this shard.
    pub fn usage_of(&self, key: u32, route: usize) -> (u64, u64, u64) {
        self.model(key, route)
            .map_or((0, 0, 0), |m| (m.input, m.output, m.spend_nanos))
    }

    fn model(&self, key: u32, route: usize) -> Option<PerModel> {
        let keys = self.keys.try_borrow().ok()?;
        let k = keys.get(key as usize)?;
        let list = k.models.try_borrow().ok()?;
        list.iter().find(|m| m.route == route as u32).copied()
    }

    /// `ringgate_key_requests_total{shard,key,model}`,
    /// `ringgate_key_{input,output}_tokens_total{shard,key,model}`,
    /// `ringgate_key_spend_usd_total{shard,key,model}` and
    /// `ringgate_key_rejections_total{shard,key,reason}` (`key=""` when no key was named).
    /// `name(i)` is key `i`'s name, asked only for keys with something to show (a shard renders
    /// every second: a quiet key costs one check, not a name lookup).
    pub fn render<'n>(
        &self,
        name: &dyn Fn(usize) -> &'n str,
        routes: &RouteTable,
        shard: usize,
        out: &mut String,
    ) {
        crate::observe::metrics::help(
            out,
            "ringgate_key_requests_total",
            "counter",
            "Requests that passed every check, by virtual key name and model.",
        );
        crate::observe::metrics::help(
            out,
            "ringgate_key_rejections_total",
            "counter",
            "Requests refused by governance, by virtual key name (empty: none named) and reason.",
        );
        for (name, what) in [
            ("ringgate_key_input_tokens_total", "Input (prompt) tokens"),
            (
                "ringgate_key_output_tokens_total",
                "Output (completion) tokens",
            ),
            (
                "ringgate_key_spend_usd_total",
                "Spend in USD at the configured prices",
            ),
        ] {
            crate::observe::metrics::help(
                out,
                name,
                "counter",
                &format!("{what} of answers to keyed requests, by virtual key name and the model that answered."),
            );
        }
        let Ok(keys) = self.keys.try_borrow() else {
            return;
        };
        for (i, k) in keys.iter().enumerate() {
            let quiet = k.models.try_borrow().map_or(true, |l| l.is_empty())
                && k.rejections.iter().all(|c| c.get() == 0);
            if quiet {
                continue;
            }
            let name = name(i);
            if let Ok(list) = k.models.try_borrow() {
                for m in list.iter() {
                    let model = routes
                        .route(m.route as usize)
                        .map_or("", |r| r.name.as_str());
                    let labels = format!("shard=\"{shard}\",key=\"{name}\",model=\"{model}\"");
                    if m.requests > 0 {
                        let _ = writeln!(
                            out,
                            "ringgate_key_requests_total{{{labels}}} {}",
                            m.requests
                        );
                    }
                    if m.input > 0 || m.output > 0 || m.spend_nanos > 0 {
                        let _ = writeln!(
                            out,
                            "ringgate_key_input_tokens_total{{{labels}}} {}\nringgate_key_output_tokens_total{{{labels}}} {}\nringgate_key_spend_usd_total{{{labels}}} {}",
                            m.input,
                            m.output,
                            m.spend_nanos as f64 / super::spend::NANOS_PER_USD as f64
                        );
                    }
                }
            }
            for reason in Reason::ALL {
                let n = k.rejections[reason as usize].get();
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "ringgate_key_rejections_total{{shard=\"{shard}\",key=\"{name}\",reason=\"{}\"}} {n}",
                        reason.as_str()
                    );
                }
            }
        }
        let n = self.anonymous.get();
        if n > 0 {
            let _ = writeln!(
                out,
                "ringgate_key_rejections_total{{shard=\"{shard}\",key=\"\",reason=\"auth\"}} {n}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_key_counters_saturate() {
        let k = KeyMetrics::default();
        k.grow(1);
        for _ in 0..3 {
            k.request(0, 0);
            k.usage(0, 0, (u64::MAX, u64::MAX - 1), u64::MAX);
        }
        assert_eq!(k.usage_of(0, 0), (u64::MAX, u64::MAX, u64::MAX));
        assert_eq!(k.requests(0, 0), 3);
    }
}
