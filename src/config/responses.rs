//! `[responses]`: the Responses API state store of translated routes — how many bytes it may
//! hold and how long an entry lives (see `responses_state` and docs/dialects.md "Responses state").
//!
//! Owns: `ResponsesConfig` and its defaults. Must not: build the store or be consulted on the
//! hot path (the store copies what it needs at start).

use serde::Deserialize;

use crate::admit::ByteSize;

/// `[responses]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponsesConfig {
    /// Most bytes the store holds, whole process (entries are charged to the shard budget that
    /// stored them, within this cap). `0` turns the store off: `previous_response_id` and
    /// `item_reference` then get a 400 on translated routes. Default `64MiB`.
    pub store_max_bytes: ByteSize,
    /// Seconds an entry lives after it was stored. Default 3600.
    pub ttl_s: u64,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        ResponsesConfig {
            store_max_bytes: ByteSize(64 << 20),
            ttl_s: 3600,
        }
    }
}
