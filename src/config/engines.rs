//! The engine part of the config: a provider's `engine`, `metrics_url`, `poll_ms`,
//! `stale_ms`, and a model's `lb = "load"` knobs (`max_waiting`, `max_in_flight`,
//! `load_weights`, `affinity_slack`); their validation and the model's `LoadSettings`.
//!
//! Owns: `validate`, `load_settings`. Must not: start pollers or build runtime state
//! (`engine::Engines` does).

use std::ops::Range;

use serde::Deserialize;

use super::{Config, ModelConfig};
use crate::config::policy::{Lb, LoadSettings};

type Sink<'e> = dyn FnMut(Range<usize>, String) + 'e;

/// A model's `lb = "load"` settings (defaults where unset).
pub fn load_settings(m: &ModelConfig) -> LoadSettings {
    let d = LoadSettings::default();
    let w = m.load_weights.unwrap_or_default();
    LoadSettings {
        weights: [
            w.queue.unwrap_or(d.weights[0]),
            w.kv.unwrap_or(d.weights[1]),
            w.prefix.unwrap_or(d.weights[2]),
        ],
        affinity_slack: m.affinity_slack.unwrap_or(d.affinity_slack),
        max_waiting: m.max_waiting.as_ref().map(|v| *v.get_ref()),
        max_in_flight: m.max_in_flight.as_ref().map(|v| *v.get_ref()),
    }
}

pub(super) fn validate(cfg: &Config, err: &mut Sink<'_>) {
    for p in &cfg.providers {
        let name = p.name.get_ref();
        if p.engine.is_none() {
            for (field, span) in [
                ("metrics_url", p.metrics_url.as_ref().map(|v| v.span())),
                ("poll_ms", p.poll_ms.as_ref().map(|v| v.span())),
                ("stale_ms", p.stale_ms.as_ref().map(|v| v.span())),
            ] {
                if let Some(span) = span {
                    err(span, format!("provider {name:?}: {field} needs `engine`"));
                }
            }
            continue;
        }
        if let Some(u) = &p.metrics_url {
            match crate::config::endpoint::Endpoint::parse(u.get_ref()) {
                Ok(ep) if ep.tls || ep.unix.is_some() => err(
                    u.span(),
                    format!(
                        "provider {name:?}: metrics_url must be http:// (polled in plain HTTP)"
                    ),
                ),
                Ok(_) => {}
                Err(e) => err(u.span(), format!("provider {name:?}: metrics_url: {e}")),
            }
        } else if let Some(u) = &p.base_url {
            // the poller speaks plain HTTP over TCP only
            let which = match u.get_ref() {
                u if u.starts_with("https://") => Some("an https"),
                u if u.starts_with(crate::config::endpoint::UNIX) => Some("a unix:"),
                _ => None,
            };
            let polled = p
                .engine
                .as_ref()
                .is_some_and(|e| e.get_ref().default_metrics_path().is_some());
            if let (Some(which), true) = (which, polled) {
                err(
                    u.span(),
                    format!("provider {name:?}: {which} base_url needs an http:// metrics_url for its engine's load signal"),
                );
            }
        }
        if let Some(v) = &p.poll_ms {
            if !(10..=60_000).contains(v.get_ref()) {
                err(
                    v.span(),
                    format!("provider {name:?}: poll_ms must be 10..=60000"),
                );
            }
        }
        if let (Some(s), poll) = (
            &p.stale_ms,
            p.poll_ms.as_ref().map_or(100, |v| *v.get_ref()),
        ) {
            if *s.get_ref() < poll {
                err(
                    s.span(),
                    format!("provider {name:?}: stale_ms must be at least poll_ms"),
                );
            }
        }
    }
    for m in &cfg.models {
        let name = m.name.get_ref();
        let load = m.lb.or(cfg.routing.lb) == Some(Lb::Load);
        if let Some(w) = &m.load_weights {
            for v in [w.queue, w.kv, w.prefix].into_iter().flatten() {
                if !(v.is_finite() && v >= 0.0) {
                    err(
                        m.name.span(),
                        format!("model {name:?}: load_weights must be numbers ≥ 0"),
                    );
                }
            }
        }
        if !load {
            let set = [
                m.max_waiting.as_ref().map(|v| v.span()),
                m.max_in_flight.as_ref().map(|v| v.span()),
            ];
            for span in set.into_iter().flatten() {
                err(
                    span,
                    format!("model {name:?}: max_waiting / max_in_flight need lb = \"load\""),
                );
            }
        }
        if let Some(v) = &m.max_in_flight {
            if *v.get_ref() == 0 {
                err(
                    v.span(),
                    format!("model {name:?}: max_in_flight must be at least 1"),
                );
            }
        }
    }
}

/// A provider's inference engine (`engine = "…"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Vllm,
    Sglang,
    Llamacpp,
    Ollama,
    Tgi,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Llamacpp => "llamacpp",
            EngineKind::Ollama => "ollama",
            EngineKind::Tgi => "tgi",
        }
    }

    /// The engine's usual load-signal path on the base URL's host (`None`: Ollama has none).
    pub fn default_metrics_path(self) -> Option<&'static str> {
        match self {
            EngineKind::Vllm | EngineKind::Sglang | EngineKind::Tgi => Some("/metrics"),
            // on by default in llama-server (`/metrics` needs `--metrics`)
            EngineKind::Llamacpp => Some("/slots"),
            EngineKind::Ollama => None,
        }
    }
}
