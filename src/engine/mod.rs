//! Engine-aware routing next to self-hosted inference engines (vLLM, SGLang, llama.cpp,
//! Ollama, TGI): the engines' load signals, their pollers, and the `lb = "load"` picker.
//!
//! - `prefix`: chained block hashes of a request's prompt, the per-engine prefix index;
//! - `prom`: the bounded Prometheus-text reader for a few series;
//! - `signal`: engine kinds, normalised samples, the process-wide `EngineCell`;
//! - `poller`: one helper thread per polled engine, publishing into its cell;
//! - `load`: the per-shard `LoadPicker` (scores, prefix affinity, shedding).
//!
//! `Engines` is the process's set of cells, keyed by provider name: built once per config
//! (`Engines::start`, which starts the pollers), found by the route table when it resolves a
//! provider. A reload builds a new set from the new config and may pass the old one: a
//! provider whose engine and metrics URL did not change keeps its cell (and poller), so its
//! signal survives the swap; the others get fresh ones and the old pollers end on their own.
//!
//! Owns: `Engines`, the config → poll target rules (`metrics_url` default, `poll_ms`,
//! `stale_ms`). Must not: write to clients or run on a shard's request path (the request path
//! only reads cells through `load`).

pub mod load;
pub mod poller;
pub mod prefix;
pub mod prom;
pub mod signal;

use std::sync::Arc;
use std::time::Duration;

use signal::{EngineCell, EngineKind};

use crate::config::{Config, ProviderConfig};

/// Default `poll_ms`.
pub const POLL_MS: u64 = 100;
/// Default `stale_ms` (at least 3 polls).
pub const STALE_MS: u64 = 1_000;

#[derive(Debug, Clone)]
struct Entry {
    provider: String,
    /// What the cell was built from (kind, URL, poll, stale): reused only when equal.
    key: String,
    cell: Arc<EngineCell>,
}

/// The engine cells of one config, keyed by provider name.
#[derive(Debug, Clone, Default)]
pub struct Engines {
    entries: Vec<Entry>,
}

/// A provider's poll target: (metrics URL or `None` for Ollama, poll, stale).
pub fn target_of(p: &ProviderConfig) -> Option<(EngineKind, Option<String>, u64, u64)> {
    let kind = *p.engine.as_ref()?.get_ref();
    let poll = p.poll_ms.as_ref().map_or(POLL_MS, |v| *v.get_ref()).max(10);
    let stale = p
        .stale_ms
        .as_ref()
        .map_or(STALE_MS.max(3 * poll), |v| *v.get_ref())
        .max(poll);
    let url = match &p.metrics_url {
        Some(u) => Some(u.get_ref().clone()),
        None => kind.default_metrics_path().and_then(|path| {
            let base = p.base_url.as_ref()?.get_ref();
            let ep = crate::config::endpoint::Endpoint::parse(base).ok()?;
            let scheme = if ep.tls { "https" } else { "http" };
            Some(format!("{scheme}://{}{path}", ep.host_header))
        }),
    };
    Some((kind, url, poll, stale))
}

impl Engines {
    /// Cells for every provider with an `engine`, pollers started for the new ones; cells of
    /// `previous` are kept where nothing about the engine changed.
    pub fn start(cfg: &Config, previous: Option<&Engines>) -> Engines {
        let mut entries = Vec::new();
        for p in &cfg.providers {
            let Some((kind, url, poll, stale)) = target_of(p) else {
                continue;
            };
            let name = p.name.get_ref().clone();
            let key = format!(
                "{}|{}|{poll}|{stale}",
                kind.as_str(),
                url.as_deref().unwrap_or("")
            );
            let kept = previous.and_then(|prev| {
                prev.entries
                    .iter()
                    .find(|e| e.provider == name && e.key == key)
                    .map(|e| e.cell.clone())
            });
            let cell = match kept {
                Some(c) => c,
                None => {
                    let cell = Arc::new(EngineCell::new(kind, url.is_some(), stale));
                    if let Some(url) = url {
                        let target = poller::Target {
                            provider: name.clone(),
                            url,
                            poll: Duration::from_millis(poll),
                            timeout: Duration::from_millis(stale.min(2_000)),
                        };
                        if let Err(e) = poller::spawn(target, &cell) {
                            crate::observe::log::info(format_args!(
                                "engine {name}: cannot start its poller: {e}"
                            ));
                            cell.fail();
                        }
                    }
                    cell
                }
            };
            entries.push(Entry {
                provider: name,
                key,
                cell,
            });
        }
        Engines { entries }
    }

    /// The cell of provider `name`, if it declares an engine (and pollers were started).
    pub fn cell(&self, name: &str) -> Option<Arc<EngineCell>> {
        self.entries
            .iter()
            .find(|e| e.provider == name)
            .map(|e| e.cell.clone())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// `ringgate_engine_*` gauges (Prometheus text), one set per engine provider.
pub fn render<'a>(cells: &[(&'a str, &'a EngineCell)], out: &mut String) {
    use std::fmt::Write;
    if cells.is_empty() {
        return;
    }
    let now = signal::now_ms();
    for (name, help) in [
        (
            "ringgate_engine_up",
            "1 while the engine's last load poll succeeded",
        ),
        (
            "ringgate_engine_waiting",
            "Requests waiting at the engine (last poll; llama.cpp: this gateway's requests beyond its slots, plus other clients' deferred ones when /metrics is polled)",
        ),
        (
            "ringgate_engine_running",
            "Requests running at the engine (last poll)",
        ),
        (
            "ringgate_engine_kv_usage",
            "KV-cache usage 0..1 (last poll; only engines that report it)",
        ),
        (
            "ringgate_engine_busy_slots",
            "Busy slots of a llama.cpp /slots signal (last poll)",
        ),
        (
            "ringgate_engine_slots",
            "Slots of a llama.cpp /slots signal (last poll)",
        ),
        (
            "ringgate_engine_signal_age_seconds",
            "Age of the engine's load signal (-1: none yet)",
        ),
        (
            "ringgate_engine_in_flight",
            "This gateway's requests on the engine (running or queued there)",
        ),
    ] {
        let mut header = false;
        for (provider, cell) in cells {
            let v = cell.view(now);
            let value = match name {
                "ringgate_engine_up" => f64::from(u8::from(v.up)),
                "ringgate_engine_waiting" if v.slots > 0 => f64::from(v.slots_queue().0),
                "ringgate_engine_waiting" => f64::from(v.waiting),
                "ringgate_engine_running" => f64::from(v.running),
                "ringgate_engine_kv_usage" => match v.kv {
                    Some(k) => k,
                    None => continue,
                },
                "ringgate_engine_busy_slots" | "ringgate_engine_slots" if v.slots == 0 => continue,
                "ringgate_engine_busy_slots" => f64::from(v.running),
                "ringgate_engine_slots" => f64::from(v.slots),
                "ringgate_engine_signal_age_seconds" if v.age_ms == u64::MAX => -1.0,
                "ringgate_engine_signal_age_seconds" => v.age_ms as f64 / 1e3,
                _ => f64::from(v.in_flight),
            };
            if !header {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
                header = true;
            }
            let _ = writeln!(
                out,
                "{name}{{provider=\"{provider}\",engine=\"{}\"}} {value}",
                cell.kind.as_str()
            );
        }
    }
    let _ = writeln!(out, "# HELP ringgate_engine_polls_total Load polls by result\n# TYPE ringgate_engine_polls_total counter");
    for (provider, cell) in cells {
        use std::sync::atomic::Ordering::Relaxed;
        for (result, n) in [
            ("ok", cell.polls_ok.load(Relaxed)),
            ("failed", cell.polls_failed.load(Relaxed)),
        ] {
            let _ = writeln!(
                out,
                "ringgate_engine_polls_total{{provider=\"{provider}\",result=\"{result}\"}} {n}"
            );
        }
    }
    let _ = writeln!(out, "# HELP ringgate_engine_blind_routes_total Requests lb=load routed to the engine by the gateway's own in-flight count, no engine of the model having a usable load signal\n# TYPE ringgate_engine_blind_routes_total counter");
    for (provider, cell) in cells {
        let n = cell.blind_routes.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(
            out,
            "ringgate_engine_blind_routes_total{{provider=\"{provider}\",engine=\"{}\"}} {n}",
            cell.kind.as_str()
        );
    }
}
