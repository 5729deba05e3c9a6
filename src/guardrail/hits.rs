//! Guardrail hits: a request's tally (`Tally`, by guardrail, type, action and phase) and a
//! shard's counters of them (`Counters`, `ringgate_guardrail_hits_total`), and the access log's
//! summary (`type:count` pairs, never text).
//!
//! Owns: `Phase`, `Tally`, `Counters`. Must not: hold matched text.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::rc::Rc;

use super::{Action, Kind};

/// Which side's text a guardrail checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Request,
    Response,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Request => "request",
            Phase::Response => "response",
        }
    }
}

type Key = (Rc<str>, Kind, Action, Phase);

/// One request's hits.
#[derive(Default)]
pub struct Tally {
    hits: RefCell<smallvec::SmallVec<[(Key, u64); 4]>>,
}

impl Tally {
    pub fn add(&self, guard: &Rc<str>, kind: Kind, action: Action, phase: Phase) {
        let Ok(mut h) = self.hits.try_borrow_mut() else {
            return;
        };
        if let Some((_, n)) = h.iter_mut().find(|((g, k, a, p), _)| {
            Rc::ptr_eq(g, guard) && *k == kind && *a == action && *p == phase
        }) {
            *n = n.saturating_add(1);
        } else {
            h.push(((guard.clone(), kind, action, phase), 1));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.hits.try_borrow().map_or(true, |h| h.is_empty())
    }

    /// `type:count` pairs (summed over guardrails and phases), e.g. `email:2,secrets:1`.
    pub fn summary(&self) -> String {
        let mut by: BTreeMap<&'static str, u64> = BTreeMap::new();
        if let Ok(h) = self.hits.try_borrow() {
            for ((_, k, _, _), n) in h.iter() {
                let e = by.entry(k.name()).or_default();
                *e = e.saturating_add(*n);
            }
        }
        let mut s = String::new();
        for (k, n) in by {
            if !s.is_empty() {
                s.push(',');
            }
            let _ = write!(s, "{k}:{n}");
        }
        s
    }

    /// Add this request's hits to a shard's counters.
    pub fn count_into(&self, c: &Counters) {
        let (Ok(h), Ok(mut m)) = (self.hits.try_borrow(), c.by.try_borrow_mut()) else {
            return;
        };
        for ((g, k, a, p), n) in h.iter() {
            let e = m.entry((g.to_string(), *k, *a, *p)).or_default();
            *e = e.saturating_add(*n);
        }
    }
}

/// A shard's `ringgate_guardrail_hits_total` series (they outlive reloads).
#[derive(Default)]
pub struct Counters {
    by: RefCell<BTreeMap<(String, Kind, Action, Phase), u64>>,
}

impl Counters {
    pub fn render(&self, out: &mut String) {
        let Ok(m) = self.by.try_borrow() else { return };
        if m.is_empty() {
            return;
        }
        crate::observe::metrics::help(
            out,
            "ringgate_guardrail_hits_total",
            "counter",
            "Guardrail matches, by guardrail, detector type, action and phase.",
        );
        for ((g, k, a, p), n) in m.iter() {
            let _ = writeln!(
                out,
                "ringgate_guardrail_hits_total{{guardrail=\"{}\",type=\"{}\",action=\"{}\",phase=\"{}\"}} {n}",
                crate::observe::metrics::escape(g),
                k.name(),
                a.name(),
                p.name()
            );
        }
    }
}

/// A request ended: its hits go to the shard's counters and, as `type:count` pairs, to its
/// access-log line.
pub fn ended(sess: &super::Session, counters: &Counters, trace: &mut crate::observe::trace::Trace) {
    if sess.hits.is_empty() {
        return;
    }
    sess.hits.count_into(counters);
    trace.guardrail_hits = Some(sess.hits.summary().into_boxed_str());
}
