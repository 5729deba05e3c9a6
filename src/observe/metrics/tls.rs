//! The TLS client listener's counters (handshakes, timeouts, errors, plain HTTP on the TLS
//! port), per shard, summed by the scrape.
//!
//! Owns: `TlsStats`. Must not: accept or handshake (that is `server::tls`).

use std::cell::Cell;

/// A shard's TLS counters (`/metrics`).
#[derive(Default)]
pub struct TlsStats {
    pub handshakes: Cell<u64>,
    pub timeouts: Cell<u64>,
    pub errors: Cell<u64>,
    pub plain_http: Cell<u64>,
}

impl TlsStats {
    /// Counters without a `shard` label: the scrape sums them over shards.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        crate::observe::metrics::single(
            out,
            (
                "ringgate_tls_handshakes_total",
                "counter",
                "TLS handshakes completed on the TLS client listener.",
            ),
            "",
            self.handshakes.get(),
        );
        crate::observe::metrics::help(
            out,
            "ringgate_tls_handshake_failures_total",
            "counter",
            "Connections to the TLS listener closed before a completed handshake, by reason (timeout: the handshake deadline; error: a failed handshake or a first byte that is neither TLS nor HTTP; plain_http: answered 400).",
        );
        for (reason, v) in [
            ("timeout", &self.timeouts),
            ("error", &self.errors),
            ("plain_http", &self.plain_http),
        ] {
            let _ = writeln!(
                out,
                "ringgate_tls_handshake_failures_total{{reason=\"{reason}\"}} {}",
                v.get()
            );
        }
    }
}
