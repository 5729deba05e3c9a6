//! The MCP gateway: many Model Context Protocol tool servers behind one `/mcp` endpoint, per-key
//! tool allow-lists enforced at every call, through the same admission as model traffic
//! (docs/mcp.md).
//!
//! - `serve`: the client side (Streamable HTTP on `/mcp`, sessions, method dispatch)
//! - `federate`: the union of servers (`server__tool` names, the allow-list at dispatch,
//!   upstream sessions opened lazily and reopened after a restart)
//! - `client`: Streamable HTTP to one server; `servers`: the configured servers of one config
//!   generation (in `shard::routing::Routing`, swapped by a reload)
//! - `session`: the process-wide bounded session table; `jsonrpc`: bounded message parsing;
//!   `glob`: `mcp_tools` patterns; `metrics`: the `ringgate_mcp_*` series
//!
//! Owns: `Hub`, the process-wide MCP state (sessions, series, a log-line limiter), one per
//! process and shared by every shard. Must not: be touched by a request that is not for
//! `/mcp` (off — no `/mcp` request — costs nothing but the path compare in `pipeline`).

pub mod client;
pub mod federate;
pub mod glob;
pub mod jsonrpc;
pub mod metrics;
pub mod serve;
pub mod servers;
pub mod session;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use servers::Servers;

/// MCP log lines per second, process-wide (the rest are dropped: failures repeat at call rate).
const LOG_LINES_PER_SEC: u64 = 20;

/// The process-wide MCP state.
#[derive(Debug)]
pub struct Hub {
    pub sessions: session::Sessions,
    pub metrics: metrics::McpMetrics,
    /// (second << 16) | lines logged in it.
    log_window: AtomicU64,
}

impl Hub {
    pub fn new(cfg: &crate::config::mcp::McpConfig) -> Hub {
        Hub {
            sessions: session::Sessions::new(
                cfg.max_sessions,
                Duration::from_millis(cfg.session_idle_ms),
            ),
            metrics: metrics::McpMetrics::default(),
            log_window: AtomicU64::new(0),
        }
    }

    /// A log line, unless `LOG_LINES_PER_SEC` went out this second already.
    pub fn log(&self, args: std::fmt::Arguments<'_>) {
        let sec = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let w = self.log_window.load(Ordering::Relaxed);
        let next = if w >> 16 == sec & 0xffff_ffff_ffff {
            w + 1
        } else {
            (sec << 16) | 1
        };
        self.log_window.store(next, Ordering::Relaxed);
        if next & 0xffff <= LOG_LINES_PER_SEC {
            crate::observe::log::info(args);
        }
    }

    /// The `ringgate_mcp_*` series.
    pub fn render(&self, out: &mut String) {
        self.metrics.render(self.sessions.len(), out);
    }
}
