//! Small leaf utilities every stage may use: calendar dates (`date`), decimal digits without
//! `fmt` (`decimal`), strict JSON validation without building anything (`json_check`: the
//! answer's vetting and the request body's routing scan), the JSON nesting bound (`nesting`), process-wide versioned snapshots
//! (`versioned`), non-consuming socket peeks (`sock`), the one PRNG (`rng`) and
//! unit tests' scratch directories (`scratch`).
//!
//! Owns: pure helpers with no knowledge of requests. Must not: import any other module of the
//! crate.

pub mod cpus;

pub mod date;
pub mod decimal;
pub mod json_check;
pub mod nesting;
pub mod rng;
#[cfg(test)]
pub mod scratch;
pub mod sock;
pub mod versioned;
