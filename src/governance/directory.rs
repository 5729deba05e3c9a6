//! The process-wide key directory: the current `Keyring` snapshot every shard follows.
//!
//! The admin API (through `registry::Registry`) publishes a new keyring when a key is created,
//! changed or revoked — derived from the last one in O(log n) (`Keyring::set`: persistent maps
//! that share every unchanged key, never a copy of the key list); each shard's `Governance`
//! compares the directory's generation once per request (one `Relaxed` atomic load) and takes
//! the new snapshot when it moved, visiting only the slots that changed
//! (`Slots::changed_since`), so a new key works on the very next request on every shard and a
//! revoked one stops there — well within the 1 s the issue allows, with no timer and no lock on
//! the request path, at a cost that does not grow with the number of keys.
//!
//! The mechanism is `crate::util::versioned::Versioned`, shared with config hot reload (the route
//! table swapped between requests the same way, `shard::routing`).
//!
//! Owns: the `Directory` type. Must not: be published to from a shard.

pub type Directory = crate::util::versioned::Versioned<super::Keyring>;
