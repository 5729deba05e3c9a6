//! Controlling the gateway from outside the request path: the configuration (`config`), live
//! reloads (`reload`), the admin listener (`admin`), the state store (`state`: keys, spend,
//! the ledger on disk) and the `doctor` command's checks.
//!
//! Owns: what an operator sets and reads. Must not: serve API requests (that is `pipeline`).

pub mod admin;
pub mod config;
pub mod doctor;
pub mod reload;
pub mod state;
