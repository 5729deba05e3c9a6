//! `[[guardrail]]`: one named set of detectors with an action and the phases it checks, and the
//! rules a file must meet (known detectors, bounded patterns, names that `guardrails = [...]`
//! on `[[model]]` and `[[key]]` refer to).
//!
//! Owns: `GuardrailConfig`, its validation. Must not: compile anything on the request path
//! (shards compile guardrails when they build a route table, `Guards::build`).

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

/// Default most bytes of one text a stream holds back (and the bound every detector's longest
/// match must fit): the built-in secrets' longest match (a PEM private-key block) fits.
pub const DEFAULT_MAX_HOLD: usize = 8192;

/// Default `mask`.
pub const DEFAULT_MASK: &str = "[REDACTED:{TYPE}]";

/// One `[[guardrail]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardrailConfig {
    /// What `guardrails = [...]`, metrics and error messages call it.
    pub name: Spanned<String>,
    /// Built-in detectors: `email`, `phone`, `credit_card`, `iban`, `us_ssn`, `ipv4`,
    /// `secrets`.
    #[serde(default)]
    pub detect: Vec<Spanned<String>>,
    /// `mask` | `block` | `warn`.
    pub action: Spanned<String>,
    /// `request`, `response`, or both (default both).
    pub on: Option<Vec<Spanned<String>>>,
    /// Custom regular expressions (linear-time engine; every repetition must be bounded, so
    /// each pattern has a longest match).
    #[serde(default)]
    pub patterns: Vec<Spanned<String>>,
    /// Literal words (ASCII case-insensitive, matched anywhere).
    #[serde(default)]
    pub words: Vec<String>,
    /// The replacement text; `{TYPE}` becomes the detector type (`EMAIL`, `SECRET`, ...).
    pub mask: Option<String>,
    /// Most bytes of one text a stream holds back (default 8192, at most 65536): every
    /// detector's longest match must fit.
    pub max_hold_bytes: Option<Spanned<usize>>,
}

impl GuardrailConfig {
    pub fn on_request(&self) -> bool {
        self.on
            .as_ref()
            .is_none_or(|v| v.iter().any(|p| p.get_ref() == "request"))
    }

    pub fn on_response(&self) -> bool {
        self.on
            .as_ref()
            .is_none_or(|v| v.iter().any(|p| p.get_ref() == "response"))
    }

    pub fn max_hold(&self) -> usize {
        self.max_hold_bytes
            .as_ref()
            .map_or(DEFAULT_MAX_HOLD, |s| *s.get_ref())
    }
}

/// Every problem in the guardrail sections (`all`) and the references to them (`refs`: the
/// names models and keys give in `guardrails`).
pub fn validate<'a>(
    all: &[GuardrailConfig],
    refs: impl Iterator<Item = &'a Spanned<String>>,
) -> Vec<(Range<usize>, String)> {
    let mut errs = Vec::new();
    let mut names = std::collections::HashSet::new();
    for g in all {
        let name = g.name.get_ref();
        if name.is_empty() || !names.insert(name.as_str()) {
            errs.push((
                g.name.span(),
                format!("guardrail name {name:?} is empty or used twice"),
            ));
        }
        if !matches!(g.action.get_ref().as_str(), "mask" | "block" | "warn") {
            errs.push((
                g.action.span(),
                format!("guardrail {name:?}: action must be \"mask\", \"block\" or \"warn\""),
            ));
        }
        for p in g.on.iter().flatten() {
            if !matches!(p.get_ref().as_str(), "request" | "response") {
                errs.push((
                    p.span(),
                    format!("guardrail {name:?}: on must list \"request\" and/or \"response\""),
                ));
            }
        }
        for d in &g.detect {
            if super::detect::builtin(d.get_ref()).is_none() {
                errs.push((
                    d.span(),
                    format!(
                        "guardrail {name:?}: unknown detector {:?} (known: {})",
                        d.get_ref(),
                        super::detect::NAMES.join(", ")
                    ),
                ));
            }
        }
        if g.detect.is_empty() && g.patterns.is_empty() && g.words.is_empty() {
            errs.push((
                g.name.span(),
                format!("guardrail {name:?} detects nothing: give detect, patterns or words"),
            ));
        }
        let cap = g.max_hold();
        if !(1..=65536).contains(&cap) {
            let span = g.max_hold_bytes.as_ref().map_or(0..0, |s| s.span());
            errs.push((
                span,
                format!("guardrail {name:?}: max_hold_bytes must be 1..=65536"),
            ));
            continue;
        }
        for p in &g.patterns {
            match super::scan::max_len(p.get_ref()) {
                Err(e) => errs.push((p.span(), format!("guardrail {name:?}: pattern: {e}"))),
                Ok(None) => errs.push((
                    p.span(),
                    format!("guardrail {name:?}: pattern {:?} has no longest match: bound its repetitions (e.g. {{1,64}} instead of + or *)", p.get_ref()),
                )),
                Ok(Some(n)) if n > cap => errs.push((
                    p.span(),
                    format!("guardrail {name:?}: pattern {:?} can match {n} bytes, over max_hold_bytes = {cap}", p.get_ref()),
                )),
                Ok(Some(_)) => {}
            }
        }
        for d in &g.detect {
            if let Some(b) = super::detect::builtin(d.get_ref()) {
                if let Ok(Some(n)) = super::scan::max_len(b.pattern) {
                    if n > cap {
                        errs.push((
                            d.span(),
                            format!("guardrail {name:?}: detector {:?} can match {n} bytes, over max_hold_bytes = {cap}", d.get_ref()),
                        ));
                    }
                }
            }
        }
        if let Some(w) = g.words.iter().find(|w| w.len() > cap) {
            errs.push((
                g.name.span(),
                format!(
                    "guardrail {name:?}: word of {} bytes is over max_hold_bytes = {cap}",
                    w.len()
                ),
            ));
        }
        if g.mask.as_ref().is_some_and(|m| m.len() > 256) {
            errs.push((
                g.name.span(),
                format!("guardrail {name:?}: mask is longer than 256 bytes"),
            ));
        }
    }
    for r in refs {
        if !names.contains(r.get_ref().as_str()) {
            errs.push((
                r.span(),
                format!("guardrails: no [[guardrail]] named {:?}", r.get_ref()),
            ));
        }
    }
    errs
}
