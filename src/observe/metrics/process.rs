//! Process-wide metrics that belong to no shard: the running config's hash (an info metric),
//! config reloads by result, access-log lines dropped. Shared by every shard through `MetricsHub` (an `Arc`); touched
//! only at start-up, on a reload and on a scrape — never on the request path.
//!
//! Owns: `ProcessMetrics`. Must not: count per-request events (those are per shard).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{escape, help, single};

#[derive(Debug, Default)]
pub struct ProcessMetrics {
    config_hash: Mutex<String>,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    /// Access-log lines dropped (shared with the access log, which counts them).
    pub access_log_dropped: Arc<AtomicU64>,
    /// Request-log lines dropped (shared with the request log export).
    pub request_log_dropped: Arc<AtomicU64>,
    /// Trace spans by result (shared with the telemetry export, which counts them).
    pub telemetry_spans: Arc<SpanCounts>,
    /// Process-wide lines of a part that lives above this module (the response cache).
    pub extra: std::sync::OnceLock<Extra>,
    /// The MCP gateway's process-wide lines (`mcp::Hub`).
    pub mcp: std::sync::OnceLock<Extra>,
    /// Shared keys' process-wide lines (`governance::fleet`).
    pub fleet: std::sync::OnceLock<Extra>,
}

/// Renders more process-wide lines.
#[derive(Clone)]
pub struct Extra(pub Arc<dyn Fn(&mut String) + Send + Sync>);

impl std::fmt::Debug for Extra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Extra")
    }
}

impl ProcessMetrics {
    pub fn new(config_hash: &str) -> ProcessMetrics {
        ProcessMetrics {
            config_hash: Mutex::new(config_hash.to_string()),
            ..ProcessMetrics::default()
        }
    }

    /// A config reload finished: `Some(hash)` when the new config runs, `None` when it was
    /// refused (the old one keeps running).
    pub fn reloaded(&self, hash: Option<&str>) {
        match hash {
            Some(h) => {
                if let Ok(mut c) = self.config_hash.lock() {
                    *c = h.to_string();
                }
                super::add_atomic(&self.reloads_ok, 1);
            }
            None => {
                super::add_atomic(&self.reloads_failed, 1);
            }
        }
    }

    pub fn render(&self, out: &mut String) {
        let hash = self
            .config_hash
            .lock()
            .map(|h| escape(&h))
            .unwrap_or_default();
        single(
            out,
            (
                "ringgate_config_info",
                "gauge",
                "The running config: hash is the first 16 hex digits of the SHA-256 of its file.",
            ),
            &format!("hash=\"{hash}\""),
            1,
        );
        help(
            out,
            "ringgate_config_reloads_total",
            "counter",
            "Config reloads by result (ok: the new config runs; error: refused, the old one runs).",
        );
        for (result, n) in [("ok", &self.reloads_ok), ("error", &self.reloads_failed)] {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "ringgate_config_reloads_total{{result=\"{result}\"}} {n}"
            );
        }
        for (family, n) in [
            (
                (
                    "ringgate_access_log_dropped_total",
                    "counter",
                    "Access-log lines dropped because the writer fell behind (queue full) or failed.",
                ),
                &self.access_log_dropped,
            ),
            (
                (
                    "ringgate_request_log_dropped_total",
                    "counter",
                    "Request-log export lines dropped because its writer fell behind (queue full) or the file could not be written.",
                ),
                &self.request_log_dropped,
            ),
        ] {
            single(out, family, "", n.load(Ordering::Relaxed));
        }
        self.telemetry_spans.render(out);
        for f in [self.extra.get(), self.mcp.get(), self.fleet.get()]
            .into_iter()
            .flatten()
        {
            (f.0)(out);
        }
    }
}

/// Spans by what became of them (`ringgate_telemetry_spans_total{result}`).
#[derive(Debug, Default)]
pub struct SpanCounts {
    pub exported: AtomicU64,
    pub dropped: AtomicU64,
    pub failed: AtomicU64,
}

impl SpanCounts {
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        out.push_str(
            "# HELP ringgate_telemetry_spans_total Trace spans: exported (the collector took them), dropped (queue full), failed (the collector refused them or could not be reached after retries).\n# TYPE ringgate_telemetry_spans_total counter\n",
        );
        for (r, n) in [
            ("exported", &self.exported),
            ("dropped", &self.dropped),
            ("failed", &self.failed),
        ] {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(out, "ringgate_telemetry_spans_total{{result=\"{r}\"}} {n}");
        }
    }
}
