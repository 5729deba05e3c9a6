//! Controlling the gateway from outside the request path: live reloads (`reload`), the admin
//! listener (`admin`) and the `doctor` command's checks. The configuration itself is the leaf
//! module `config`; the state store is `governance::state`.
//!
//! Owns: what an operator sets and reads. Must not: serve API requests (that is `pipeline`).

pub mod admin;
pub mod doctor;
pub mod reload;
