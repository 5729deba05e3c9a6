//! Several guardrails over one text: the first one's released text is the next one's input,
//! so each sees what the client (or the upstream) would have got from the ones before it. A
//! chain of streaming scans is itself streaming-equal to the chain over the whole text.
//!
//! Owns: `Chain`, and the one-shot `mask_text`. Must not: keep text beyond the guardrails'
//! hold-backs.

use std::rc::Rc;

use super::scan::{step, Tail};
use super::{Blocked, Guard, Phase, Session};

/// The state of one text (a content block, a string value) under a request's guardrails.
pub struct Chain {
    tails: smallvec::SmallVec<[Tail; 2]>,
}

impl Chain {
    pub fn new(guards: &[Rc<Guard>]) -> Chain {
        Chain {
            tails: guards.iter().map(|_| Tail::default()).collect(),
        }
    }

    /// Bytes held back by all guardrails of this text.
    pub fn held(&self) -> usize {
        self.tails.iter().map(Tail::held).sum()
    }

    /// Feed `text` (`last`: the text ends here) and append what may go out to `out`. A `block`
    /// match returns `Err` with nothing of the match in `out`.
    pub fn feed(
        &mut self,
        guards: &[Rc<Guard>],
        sess: &Session,
        phase: Phase,
        text: &str,
        last: bool,
        out: &mut String,
    ) -> Result<(), Blocked> {
        let n = guards.len().min(self.tails.len());
        if n == 0 {
            out.push_str(text);
            return Ok(());
        }
        let mut cur = std::borrow::Cow::Borrowed(text);
        for (i, (g, tail)) in guards.iter().zip(self.tails.iter_mut()).enumerate() {
            let mut next = String::with_capacity(cur.len() + 16);
            let into: &mut String = if i + 1 == n { out } else { &mut next };
            let mut hit = |k| sess.hits.add(&g.name, k, g.action, phase);
            step(g, tail, &cur, last, into, &mut hit).map_err(|kind| Blocked {
                guard: g.name.clone(),
                kind,
                phase,
            })?;
            if i + 1 < n {
                cur = std::borrow::Cow::Owned(next);
            }
        }
        Ok(())
    }
}

/// One whole text under `guards`: `None` when nothing changed (no mask applied).
pub fn mask_text(
    guards: &[Rc<Guard>],
    sess: &Session,
    phase: Phase,
    text: &str,
) -> Result<Option<String>, Blocked> {
    if guards.is_empty() || text.is_empty() {
        return Ok(None);
    }
    let mut out = String::with_capacity(text.len());
    Chain::new(guards).feed(guards, sess, phase, text, true, &mut out)?;
    Ok((out != text).then_some(out))
}

/// `text` fed in pieces cut at `cuts` (snapped up to character boundaries) and whole, under
/// `guards` (mask actions): (streamed, whole, most bytes held after a piece, the sum of the
/// guards' hold-backs). Tests and the fuzz target assert streamed == whole and held ≤ bound.
pub fn stream_vs_whole(
    guards: &[Rc<Guard>],
    text: &str,
    cuts: &[usize],
) -> (String, String, usize, usize) {
    let sess = Session {
        request: Vec::new(),
        response: guards.to_vec(),
        hits: Default::default(),
    };
    let bound = guards.iter().map(|g| g.scanner.hold()).sum();
    let whole = mask_text(guards, &sess, Phase::Response, text)
        .ok()
        .flatten()
        .unwrap_or_else(|| text.to_string());
    let mut points: Vec<usize> = cuts.iter().map(|&c| c.min(text.len())).collect();
    points.sort_unstable();
    points.push(text.len());
    let mut chain = Chain::new(guards);
    let (mut out, mut at, mut most) = (String::new(), 0, 0);
    for mut p in points {
        while !text.is_char_boundary(p) {
            p += 1;
        }
        if p < at {
            continue;
        }
        let piece = text.get(at..p).unwrap_or_default();
        if chain
            .feed(guards, &sess, Phase::Response, piece, false, &mut out)
            .is_err()
        {
            break;
        }
        most = most.max(chain.held());
        at = p;
    }
    let _ = chain.feed(guards, &sess, Phase::Response, "", true, &mut out);
    (out, whole, most, bound)
}
