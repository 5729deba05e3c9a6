//! What a shard's store connection tells the operator: one log line per state change (`note`)
//! and the `ringgate_limit_store_*` metrics (`render`).
//!
//! Owns: `Store::note`, `Store::render`. Must not: change the connection's state.

use std::fmt::Write;

use super::pipeline::Fault;
use super::{cluster, Store, COUNTED};

impl Store {
    /// Log a state change (once per change).
    pub(super) fn note(&self, up: bool, detail: &str) {
        if self.logged.get() == Some(up) {
            return;
        }
        self.logged.set(Some(up));
        let (shard, url) = (self.shard, &self.s.url);
        if let Some((what, meanwhile)) = self.user {
            let at = match self.fleet {
                true => String::new(),
                false => format!("shard {shard}: "),
            };
            match up {
                true => crate::observe::log::info(format_args!("{at}{what} store {url} up")),
                false => crate::observe::log::info(format_args!(
                    "{at}{what} store {url} unavailable ({}); {meanwhile}",
                    self.reason.borrow()
                )),
            }
            return;
        }
        if self.fleet {
            match up {
                true => crate::observe::log::info(format_args!(
                    "fleet: store {url} up: keys are shared{detail}"
                )),
                false => crate::observe::log::info(format_args!(
                    "fleet: store {url} unavailable ({}); serving the keys this node holds, changes made here reach the fleet when it is back",
                    self.reason.borrow()
                )),
            }
            return;
        }
        if up {
            let kind = match &self.cluster {
                Some(c) => format!(" (Cluster of {} masters)", c.nodes.borrow().len()),
                None => String::new(),
            };
            crate::observe::log::info(format_args!(
                "shard {shard}: limit store {url}{kind} up: limits are shared{detail}"
            ));
        } else {
            let then = if self.s.closed {
                "refusing requests of limited keys with 503 until it is back (on_store_error = \"closed\")"
            } else {
                "limits are per process until it is back (on_store_error = \"local\")"
            };
            crate::observe::log::info(format_args!(
                "shard {shard}: limit store {url} unavailable ({}); {then}",
                self.reason.borrow()
            ));
        }
    }

    /// `ringgate_limit_store_*` for this shard.
    pub fn render(&self, out: &mut String) {
        let shard = self.shard;
        let help = crate::observe::metrics::help;
        help(
            out,
            "ringgate_limit_store_up",
            "gauge",
            "1 when the shard's connection to the shared limits store is up.",
        );
        let _ = writeln!(
            out,
            "ringgate_limit_store_up{{shard=\"{shard}\"}} {}",
            u8::from(self.up.get())
        );
        help(
            out,
            "ringgate_limit_store_errors_total",
            "counter",
            "Shared limits store errors by kind (connect, timeout, io, reply).",
        );
        for (i, f) in COUNTED.iter().enumerate() {
            let _ = writeln!(
                out,
                "ringgate_limit_store_errors_total{{shard=\"{shard}\",kind=\"{}\"}} {}",
                f.as_str(),
                self.errors[i].get()
                    + match *f {
                        Fault::Reply => self.pipe.ignored_errors.get(),
                        Fault::Connect => self.cluster.as_ref().map_or(0, |c| c.failures()),
                        _ => 0,
                    }
            );
        }
        help(
            out,
            "ringgate_limit_store_fallbacks_total",
            "counter",
            "Requests whose limits were decided without the shared store (local) or refused (closed).",
        );
        for (i, mode) in ["local", "closed"].iter().enumerate() {
            let _ = writeln!(
                out,
                "ringgate_limit_store_fallbacks_total{{shard=\"{shard}\",mode=\"{mode}\"}} {}",
                self.fallbacks[i].get()
            );
        }
        help(
            out,
            "ringgate_limit_store_connects_total",
            "counter",
            "Connections made to the shared limits store.",
        );
        let _ = writeln!(
            out,
            "ringgate_limit_store_connects_total{{shard=\"{shard}\"}} {}",
            self.connects.get() + self.cluster.as_ref().map_or(0, cluster::Cluster::connects)
        );
        if let Some(c) = &self.cluster {
            help(
                out,
                "ringgate_limit_store_redirects_total",
                "counter",
                "Cluster MOVED and ASK replies followed.",
            );
            let _ = writeln!(
                out,
                "ringgate_limit_store_redirects_total{{shard=\"{shard}\"}} {}",
                c.redirects.get()
            );
            help(
                out,
                "ringgate_limit_store_nodes_up",
                "gauge",
                "Cluster masters this shard is connected to.",
            );
            let up = c.nodes.borrow().iter().filter(|n| n.up()).count();
            let _ = writeln!(
                out,
                "ringgate_limit_store_nodes_up{{shard=\"{shard}\"}} {up}"
            );
        }
    }
}
