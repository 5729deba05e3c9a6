//! The answer stage: everything that writes bytes to the client once a request has been
//! forwarded — the seam (`respond`), the same-dialect relay (`relay`, vetted by `vet` and
//! `json_check`), the translated way back (`bridge`), the one stream loop both stand on
//! (`stream`: passthrough vetting and translation are its per-event strategies; read buffer,
//! drain-raced read, guardrails, the stream's last write) and how a request ended (`outcome`).
//! Upstream failures are reported through `forward::report`.
//!
//! Owns: the upstream → client byte path. Must not: choose deployments or open upstream
//! connections (that is `forward` and `upstream`), or see the shard (it gets a `forward::Env`).

pub mod bridge;
pub use crate::util::json_check;
pub mod outcome;
pub mod relay;
pub mod respond;
pub mod stream;
pub mod vet;
