//! Observing requests and the process: what one request did (`trace`), where it goes when the
//! request ends (`record` → `metrics`, `accesslog`), the Prometheus text of `/metrics`
//! (`scrape`), the line logger (`log`), and OpenTelemetry traces and the request log export
//! (`telemetry`).
//!
//! Owns: counters, histograms, the access-log line and the log line. Must not: decide anything
//! about a request (the stages do; this only counts and writes down).

pub mod accesslog;
pub mod log;
pub mod metrics;
pub mod record;
pub mod scrape;
pub mod telemetry;
pub mod trace;
