//! Guardrails: named sets of detectors (PII, secrets, custom patterns, literal words) that
//! `mask`, `block` or `warn` on the text a client sends (`request`) and on the answer's text,
//! reasoning and tool-call arguments (`response`), non-stream and stream, same-dialect and
//! translated. Streams are masked in flight: each text holds back at most its guardrails'
//! longest possible match (`scan`), released as soon as it cannot start one, at the end of each
//! content block and at the end of the stream.
//!
//! The pieces: `detect` (built-in patterns), `checks` (Luhn, mod 97), `scan` (one guardrail's
//! compiled detectors and the incremental scan), `chain` (several guardrails over one text),
//! `json_str` (tool-call arguments: only inside JSON string values), `request` (the request
//! body's text per dialect), `answer` (a non-stream answer's text per dialect), `stream` (SSE
//! events per dialect), `config` (`[[guardrail]]`), `hits` (metrics and the access log).
//!
//! Owns: `Guards` (a shard's compiled guardrails and who uses which, rebuilt with each route
//! table, so a reload changes them), `Session` (the guardrails of one request and its hits).
//! Must not: do IO, or ever put matched text into an error, a log line or a metric (only the
//! guardrail's name and the detector's type). Off (no guardrail on the model or key) costs one
//! branch per request.

pub mod answer;
pub mod chain;
pub mod config;
mod checks;
pub mod detect;
pub mod hits;
pub mod json_str;
pub mod request;
pub mod scan;
pub mod stream;

use std::collections::HashMap;
use std::rc::Rc;

pub use chain::Chain;
pub use detect::Kind;
pub use hits::Phase;
pub use scan::Action;

use crate::error::{Error, Kind as ErrorKind};

/// One compiled `[[guardrail]]`.
pub struct Guard {
    pub name: Rc<str>,
    pub action: Action,
    pub request: bool,
    pub response: bool,
    /// The mask text per detector type (`Kind as usize`).
    masks: Vec<Box<str>>,
    pub scanner: scan::Scanner,
}

impl Guard {
    /// Compile `g` (validated by `config::validate`).
    pub fn compile(g: &config::GuardrailConfig) -> Result<Guard, String> {
        let mut sources = Vec::new();
        for d in &g.detect {
            let b = detect::builtin(d.get_ref())
                .ok_or_else(|| format!("unknown detector {:?}", d.get_ref()))?;
            sources.push(scan::Source::Pattern(
                b.kind,
                b.pattern.to_string(),
                b.check,
            ));
        }
        for p in &g.patterns {
            sources.push(scan::Source::Pattern(
                Kind::Pattern,
                p.get_ref().clone(),
                checks::Check::None,
            ));
        }
        if !g.words.is_empty() {
            sources.push(scan::Source::Words(g.words.clone()));
        }
        let scanner = scan::Scanner::new(sources)?;
        if scanner.hold() > g.max_hold() {
            return Err(format!(
                "its detectors can match {} bytes, over max_hold_bytes = {}",
                scanner.hold(),
                g.max_hold()
            ));
        }
        let template = g.mask.as_deref().unwrap_or(config::DEFAULT_MASK);
        let masks = Kind::ALL
            .iter()
            .map(|k| template.replace("{TYPE}", k.label()).into_boxed_str())
            .collect();
        let action = match g.action.get_ref().as_str() {
            "block" => Action::Block,
            "warn" => Action::Warn,
            _ => Action::Mask,
        };
        Ok(Guard {
            name: g.name.get_ref().as_str().into(),
            action,
            request: g.on_request(),
            response: g.on_response(),
            masks,
            scanner,
        })
    }

    pub fn mask(&self, kind: Kind) -> &str {
        self.masks.get(kind as usize).map_or("", |m| m)
    }
}

/// A shard's compiled guardrails and which models and keys use them.
#[derive(Default)]
pub struct Guards {
    all: Vec<Rc<Guard>>,
    by_model: HashMap<String, Vec<usize>>,
    by_key: HashMap<String, Vec<usize>>,
}

impl std::fmt::Debug for Guards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guards")
            .field("guardrails", &self.all.len())
            .finish()
    }
}

impl Guards {
    /// Compile the guardrails `all` (the config's `[[guardrail]]`s) that the models and keys
    /// use (each: its name and the guardrails it names). One that does not compile (validation
    /// compiles them too, so only a programming error) is left out and logged.
    pub fn build<'a>(
        all: &[config::GuardrailConfig],
        models: impl Iterator<Item = (&'a str, &'a [toml::Spanned<String>])>,
        keys: impl Iterator<Item = (&'a str, &'a [toml::Spanned<String>])>,
    ) -> Guards {
        let mut g = Guards::default();
        if all.is_empty() {
            return g;
        }
        let mut index = HashMap::new();
        for c in all {
            match Guard::compile(c) {
                Ok(guard) => {
                    index.insert(c.name.get_ref().clone(), g.all.len());
                    g.all.push(Rc::new(guard));
                }
                Err(e) => crate::observe::log::info(format_args!(
                    "guardrail {:?} left out: {e}",
                    c.name.get_ref()
                )),
            }
        }
        let pick = |names: &[toml::Spanned<String>]| -> Vec<usize> {
            let mut v: Vec<usize> = names
                .iter()
                .filter_map(|n| index.get(n.get_ref()).copied())
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        for (name, uses) in models {
            let v = pick(uses);
            if !v.is_empty() {
                g.by_model.insert(name.to_string(), v);
            }
        }
        for (name, uses) in keys {
            let v = pick(uses);
            if !v.is_empty() {
                g.by_key.insert(name.to_string(), v);
            }
        }
        g
    }

    /// Whether any model or key uses a guardrail (the one branch a request pays when off).
    #[inline]
    pub fn active(&self) -> bool {
        !(self.by_model.is_empty() && self.by_key.is_empty())
    }

    /// The guardrails of a request to the model configured as `model` (the route's name) by
    /// the key named `key`: the union of both, in config order. `None`: none applies.
    pub fn select(&self, model: &str, key: Option<&str>) -> Option<Rc<Session>> {
        if self.by_model.is_empty() && self.by_key.is_empty() {
            return None;
        }
        let m = self.by_model.get(model).map_or(&[][..], |v| &v[..]);
        let k = key
            .and_then(|k| self.by_key.get(k))
            .map_or(&[][..], |v| &v[..]);
        if m.is_empty() && k.is_empty() {
            return None;
        }
        let mut idx: Vec<usize> = m.iter().chain(k).copied().collect();
        idx.sort_unstable();
        idx.dedup();
        let guards: Vec<Rc<Guard>> = idx
            .iter()
            .filter_map(|&i| self.all.get(i).cloned())
            .collect();
        let request = guards.iter().filter(|g| g.request).cloned().collect();
        let response = guards.iter().filter(|g| g.response).cloned().collect();
        Some(Rc::new(Session {
            request,
            response,
            hits: Default::default(),
        }))
    }
}

/// The guardrails of one request, by phase, and the hits so far.
pub struct Session {
    pub request: Vec<Rc<Guard>>,
    pub response: Vec<Rc<Guard>>,
    pub hits: hits::Tally,
}

/// A `block` guardrail matched: which one and what type (never the text).
#[derive(Debug, Clone)]
pub struct Blocked {
    pub guard: Rc<str>,
    pub kind: Kind,
    pub phase: Phase,
}

impl Blocked {
    pub fn message(&self) -> String {
        let what = match self.phase {
            Phase::Request => "request",
            Phase::Response => "response",
        };
        format!(
            "{what} blocked by guardrail {:?}: {} detected (guardrail_blocked)",
            &*self.guard,
            self.kind.name()
        )
    }

    pub fn error(&self) -> Error {
        Error::new(ErrorKind::GuardrailBlocked, self.message())
    }
}

#[cfg(test)]
mod tests;
