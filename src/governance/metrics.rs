//! Governance counters of one shard and their Prometheus text: requests by key name and model,
//! rejections by key name and reason. Keys appear by name only.
//!
//! Owns: `KeyMetrics` (plain `Cell`s; per key a short list of (route, count) pairs, since a key
//! uses few models). Must not: allocate per request beyond a key's first request for a model,
//! or render anything when keys are off.

use std::cell::{Cell, RefCell};
use std::fmt::Write;

use crate::metrics::bump;
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
}

impl Reason {
    pub const ALL: [Reason; 5] = [
        Reason::Auth,
        Reason::ForbiddenModel,
        Reason::Rpm,
        Reason::Tpm,
        Reason::InFlight,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Auth => "auth",
            Reason::ForbiddenModel => "forbidden_model",
            Reason::Rpm => "rpm",
            Reason::Tpm => "tpm",
            Reason::InFlight => "in_flight",
        }
    }
}

#[derive(Debug, Default)]
struct PerKey {
    /// (route index, requests) for the models this key used.
    requests: RefCell<Vec<(u32, u64)>>,
    rejections: [Cell<u64>; 5],
}

#[derive(Debug, Default)]
pub struct KeyMetrics {
    keys: Vec<PerKey>,
    /// Refusals that name no key (none sent, unknown, ambiguous).
    anonymous: Cell<u64>,
}

impl KeyMetrics {
    pub fn new(keys: usize) -> KeyMetrics {
        KeyMetrics {
            keys: (0..keys).map(|_| PerKey::default()).collect(),
            anonymous: Cell::new(0),
        }
    }

    /// A request of key `key` for route `route` passed every check.
    pub fn request(&self, key: u32, route: usize) {
        let Some(k) = self.keys.get(key as usize) else {
            return;
        };
        let Ok(mut list) = k.requests.try_borrow_mut() else {
            return;
        };
        let route = route as u32;
        match list.iter_mut().find(|(r, _)| *r == route) {
            Some((_, n)) => *n += 1,
            None => list.push((route, 1)),
        }
    }

    /// A refusal; `key` is `None` when the request named no known key.
    pub fn rejected(&self, key: Option<u32>, reason: Reason) {
        let slot = key
            .and_then(|k| self.keys.get(k as usize))
            .and_then(|k| k.rejections.get(reason as usize));
        match slot {
            Some(c) => bump(c),
            None => bump(&self.anonymous),
        }
    }

    pub fn requests(&self, key: u32, route: usize) -> u64 {
        self.keys
            .get(key as usize)
            .and_then(|k| k.requests.try_borrow().ok())
            .and_then(|l| l.iter().find(|(r, _)| *r == route as u32).map(|p| p.1))
            .unwrap_or(0)
    }

    /// `ringgate_key_requests_total{shard,key,model}` and
    /// `ringgate_key_rejections_total{shard,key,reason}` (`key=""` when no key was named).
    pub fn render(&self, names: &[&str], routes: &RouteTable, shard: usize, out: &mut String) {
        for (k, name) in self.keys.iter().zip(names) {
            if let Ok(list) = k.requests.try_borrow() {
                for &(r, n) in list.iter() {
                    let model = routes.route(r as usize).map_or("", |r| r.name.as_str());
                    let _ = writeln!(
                        out,
                        "ringgate_key_requests_total{{shard=\"{shard}\",key=\"{name}\",model=\"{model}\"}} {n}"
                    );
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
