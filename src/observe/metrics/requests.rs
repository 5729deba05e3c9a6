//! Requests of one shard by (endpoint, model, provider): counts by status class, latency
//! histograms (total, gateway overhead, first token of streams, upstream) and tokens, and
//! their Prometheus text. A series is made the first time its (endpoint, route, provider)
//! occurs; all three come from the config (route and provider indices, a closed endpoint
//! enum), never from client input, so the number of series is bounded by the config.
//!
//! Rendered without a `shard` label: the scrape merge (`metrics::expose`) sums the shards'
//! series into one.
//!
//! Owns: `RequestMetrics`. Must not: allocate on the request path beyond a series' first
//! request, or use atomics (one shard touches it, through its one `RefCell`).

/// The names behind the route and provider indices a series is counted under (the route
/// table the scrape runs on: `route::RouteTable`).
pub trait Names {
    fn model(&self, route: u32) -> Option<&str>;
    fn provider(&self, provider: u32) -> Option<&str>;
}

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Instant;

use super::escape;
use super::expose::help;
use super::histogram::{Histogram, LATENCY, OVERHEAD};
use crate::observe::trace::{Endpoint, Trace};

const CLASSES: [&str; 4] = ["2xx", "4xx", "5xx", "other"];
const NONE: u64 = 0x0fff_ffff;

pub const REQUESTS: &str = "ringgate_requests_total";
pub const DURATION: &str = "ringgate_request_duration_seconds";
pub const OVERHEAD_NAME: &str = "ringgate_gateway_overhead_seconds";
pub const FIRST_TOKEN: &str = "ringgate_time_to_first_token_seconds";
pub const UPSTREAM: &str = "ringgate_upstream_duration_seconds";
pub const TOKENS: &str = "ringgate_tokens_total";

#[derive(Debug)]
struct Series {
    endpoint: Endpoint,
    route: Option<u32>,
    provider: Option<u32>,
    requests: [u64; 4],
    duration: Histogram,
    overhead: Histogram,
    first_token: Histogram,
    upstream: Histogram,
    tokens_in: u64,
    tokens_out: u64,
}

#[derive(Debug, Default)]
struct Inner {
    index: HashMap<u64, u32, BuildHasherDefault<KeyHasher>>,
    series: Vec<Series>,
}

#[derive(Debug, Default)]
pub struct RequestMetrics {
    inner: RefCell<Inner>,
}

/// Status class index into `CLASSES`.
fn class(status: u16) -> usize {
    match status {
        200..=299 => 0,
        400..=499 => 1,
        500..=599 => 2,
        _ => 3,
    }
}

impl RequestMetrics {
    /// Count a request that ended at `end` with `status`; `provider` is the index of the
    /// provider that served it (or was tried last).
    pub fn observe(&self, t: &Trace, status: u16, provider: Option<u32>, end: Instant) {
        let Ok(mut inner) = self.inner.try_borrow_mut() else {
            return;
        };
        let route = t.route.map_or(NONE, |r| u64::from(r).min(NONE - 1));
        let prov = provider.map_or(NONE, |p| u64::from(p).min(NONE - 1));
        let key = ((t.endpoint as u64) << 56) | (route << 28) | prov;
        let Inner { index, series } = &mut *inner;
        let i = *index.entry(key).or_insert_with(|| {
            series.push(Series {
                endpoint: t.endpoint,
                route: t.route,
                provider,
                requests: [0; 4],
                duration: Histogram::default(),
                overhead: Histogram::default(),
                first_token: Histogram::default(),
                upstream: Histogram::default(),
                tokens_in: 0,
                tokens_out: 0,
            });
            (series.len() - 1) as u32
        });
        let Some(s) = series.get_mut(i as usize) else {
            return;
        };
        let c = &mut s.requests[class(status)];
        *c = c.saturating_add(1);
        let total = end.saturating_duration_since(t.start);
        s.duration.observe(&LATENCY, nanos(total));
        s.overhead.observe(&OVERHEAD, nanos(t.overhead(total)));
        if let Some(ft) = t.first_token() {
            s.first_token.observe(&LATENCY, nanos(ft));
        }
        if t.served.is_some() {
            s.upstream.observe(&LATENCY, nanos(t.upstream));
        }
        if let Some((i, o)) = t.tokens {
            s.tokens_in = s.tokens_in.saturating_add(i);
            s.tokens_out = s.tokens_out.saturating_add(o);
        }
    }

    /// Requests counted for `endpoint` (all models, providers and classes).
    pub fn requests(&self, endpoint: Endpoint) -> u64 {
        self.inner.try_borrow().map_or(0, |i| {
            i.series
                .iter()
                .filter(|s| s.endpoint == endpoint)
                .flat_map(|s| s.requests)
                .fold(0u64, u64::saturating_add)
        })
    }

    /// The families' headers, then every series (see the module doc).
    pub fn render(&self, names: &dyn Names, out: &mut String) {
        help(
            out,
            REQUESTS,
            "counter",
            "Requests by endpoint, model, provider (that served it or was tried last) and status class.",
        );
        help(
            out,
            DURATION,
            "histogram",
            "Request latency, from the parsed head to the last byte written.",
        );
        help(
            out,
            OVERHEAD_NAME,
            "histogram",
            "Gateway overhead: request latency minus time waiting on upstreams and on the client's request body.",
        );
        help(
            out,
            FIRST_TOKEN,
            "histogram",
            "Streams: time from the parsed head to the first piece of the upstream's answer.",
        );
        help(
            out,
            UPSTREAM,
            "histogram",
            "Time waiting on upstreams per request: attempts until an answer's head, then reads of its body.",
        );
        help(
            out,
            TOKENS,
            "counter",
            "Tokens reported by answers, by model, provider and direction (input, output).",
        );
        let Ok(inner) = self.inner.try_borrow() else {
            return;
        };
        let model = |r: Option<u32>| r.and_then(|r| names.model(r)).map_or(String::new(), escape);
        let provider = |p: Option<u32>| {
            p.and_then(|p| names.provider(p))
                .map_or(String::new(), escape)
        };
        for s in &inner.series {
            let (ep, m, p) = (s.endpoint.as_str(), model(s.route), provider(s.provider));
            for (c, n) in CLASSES.iter().zip(s.requests) {
                if n > 0 {
                    out.push_str(&format!(
                        "{REQUESTS}{{endpoint=\"{ep}\",model=\"{m}\",provider=\"{p}\",status_class=\"{c}\"}} {n}\n"
                    ));
                }
            }
            let by_model = format!("endpoint=\"{ep}\",model=\"{m}\"");
            s.duration.render(&LATENCY, DURATION, &by_model, out);
            s.overhead.render(&OVERHEAD, OVERHEAD_NAME, &by_model, out);
            if s.first_token.count() > 0 {
                s.first_token.render(&LATENCY, FIRST_TOKEN, &by_model, out);
            }
            if s.upstream.count() > 0 {
                let l = format!("model=\"{m}\",provider=\"{p}\"");
                s.upstream.render(&LATENCY, UPSTREAM, &l, out);
            }
            if s.tokens_in > 0 || s.tokens_out > 0 {
                for (dir, n) in [("input", s.tokens_in), ("output", s.tokens_out)] {
                    out.push_str(&format!(
                        "{TOKENS}{{model=\"{m}\",provider=\"{p}\",direction=\"{dir}\"}} {n}\n"
                    ));
                }
            }
        }
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A multiply-rotate hasher for the packed series key (one `u64` per lookup).
#[derive(Debug, Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
