//! Observing requests and the process: what one request did (`trace`), the counters and
//! histograms it ends in (`metrics`, and their Prometheus text), the access-log line
//! (`accesslog`) and the line logger (`log`). Gathering a shard's parts at the end of a request
//! and for `/metrics` is the pipeline's (`pipeline::record`, `pipeline::scrape`); OpenTelemetry
//! traces and the request log export are the feature module `telemetry`.
//!
//! Owns: counters, histograms, the access-log line and the log line. Must not: decide anything
//! about a request (the stages do; this only counts and writes down).

pub mod accesslog;
pub mod answer;
pub mod log;
pub mod metrics;
pub mod trace;
