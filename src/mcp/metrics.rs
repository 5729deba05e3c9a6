//! MCP series, process-wide (MCP traffic is tool calls, not tokens: one short lock per
//! upstream request is cheap next to the call): `ringgate_mcp_requests_total{server,method,
//! result}`, `ringgate_mcp_request_duration_seconds{server}` (histogram), and the open
//! session gauge.
//!
//! Owns: the series and their Prometheus text. Bounded: at most `MAX_SERIES` label sets
//! (servers are at most 64 per config; names of servers removed by reloads stay until then).
//! Must not: take a label value a client chose (server names are configured ones or `-`;
//! methods and results are fixed strings).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

const MAX_SERIES: usize = 4096;
/// Histogram bucket bounds, seconds.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Default)]
struct Hist {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Debug, Default)]
struct Inner {
    requests: BTreeMap<(Box<str>, &'static str, &'static str), u64>,
    durations: BTreeMap<Box<str>, Hist>,
}

#[derive(Debug, Default)]
pub struct McpMetrics {
    inner: Mutex<Inner>,
}

impl McpMetrics {
    /// One request of `method` to (or refused for) `server` ended with `result`; `took` is the
    /// time spent on the server (`None`: it never reached one).
    pub fn record(
        &self,
        server: &str,
        method: &'static str,
        result: &'static str,
        took: Option<Duration>,
    ) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let full = g.requests.len() + g.durations.len() >= MAX_SERIES;
        let key = (Box::<str>::from(server), method, result);
        match g.requests.get_mut(&key) {
            Some(n) => *n = n.saturating_add(1),
            None if !full => {
                g.requests.insert(key, 1);
            }
            None => {}
        }
        if let Some(d) = took {
            let secs = d.as_secs_f64();
            if !g.durations.contains_key(server) && !full {
                g.durations.insert(server.into(), Hist::default());
            }
            if let Some(h) = g.durations.get_mut(server) {
                for (i, b) in BUCKETS.iter().enumerate() {
                    if secs <= *b {
                        h.counts[i] = h.counts[i].saturating_add(1);
                    }
                }
                h.count = h.count.saturating_add(1);
                h.sum += secs;
            }
        }
    }

    /// How many requests of `method` to `server` ended with `result` (tests, the bench).
    pub fn count(&self, server: &str, method: &'static str, result: &'static str) -> u64 {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.requests
            .get(&(Box::<str>::from(server), method, result))
            .copied()
            .unwrap_or(0)
    }

    /// The Prometheus text of every series, and the session gauge (nothing before the first
    /// MCP request).
    pub fn render(&self, sessions: usize, out: &mut String) {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if sessions == 0 && g.requests.is_empty() {
            // MCP unused: nothing in everyone's scrape
            return;
        }
        out.push_str("# HELP ringgate_mcp_sessions Open MCP sessions (process-wide).\n# TYPE ringgate_mcp_sessions gauge\n");
        let _ = writeln!(out, "ringgate_mcp_sessions {sessions}");
        if !g.requests.is_empty() {
            out.push_str("# HELP ringgate_mcp_requests_total MCP requests by server, method and result.\n# TYPE ringgate_mcp_requests_total counter\n");
            for ((server, method, result), n) in &g.requests {
                let _ = writeln!(
                    out,
                    "ringgate_mcp_requests_total{{server=\"{server}\",method=\"{method}\",result=\"{result}\"}} {n}"
                );
            }
        }
        if !g.durations.is_empty() {
            out.push_str("# HELP ringgate_mcp_request_duration_seconds Time spent on an MCP server per request.\n# TYPE ringgate_mcp_request_duration_seconds histogram\n");
            for (server, h) in &g.durations {
                for (i, b) in BUCKETS.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "ringgate_mcp_request_duration_seconds_bucket{{server=\"{server}\",le=\"{b}\"}} {}",
                        h.counts[i]
                    );
                }
                let _ = writeln!(
                    out,
                    "ringgate_mcp_request_duration_seconds_bucket{{server=\"{server}\",le=\"+Inf\"}} {}\nringgate_mcp_request_duration_seconds_sum{{server=\"{server}\"}} {}\nringgate_mcp_request_duration_seconds_count{{server=\"{server}\"}} {}",
                    h.count, h.sum, h.count
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_render_and_count() {
        let m = McpMetrics::default();
        m.record("files", "tools/call", "ok", Some(Duration::from_millis(20)));
        m.record("files", "tools/call", "ok", Some(Duration::from_millis(2)));
        m.record("-", "tools/call", "denied", None);
        assert_eq!(m.count("files", "tools/call", "ok"), 2);
        let mut out = String::new();
        m.render(3, &mut out);
        assert!(out.contains("ringgate_mcp_sessions 3\n"));
        assert!(out.contains(
            "ringgate_mcp_requests_total{server=\"files\",method=\"tools/call\",result=\"ok\"} 2\n"
        ));
        assert!(out.contains(
            "ringgate_mcp_requests_total{server=\"-\",method=\"tools/call\",result=\"denied\"} 1\n"
        ));
        assert!(out.contains(
            "ringgate_mcp_request_duration_seconds_bucket{server=\"files\",le=\"0.005\"} 1\n"
        ));
        assert!(out.contains("ringgate_mcp_request_duration_seconds_count{server=\"files\"} 2\n"));
    }
}
