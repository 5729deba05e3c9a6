//! `[reload]`: what a config reload may do that it refuses by default (see `reload::guard` and
//! docs/reload.md).
//!
//! Owns: `ReloadConfig` and its defaults. Must not: decide a refusal (that is `reload::guard`).

use serde::Deserialize;

/// `[reload]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReloadConfig {
    /// The file may leave the gateway with no `[[model]]` or no `[[key]]` (a reload of a file
    /// that would remove every model or every config key is refused without it: that is what a
    /// truncated or emptied file looks like). Also silences the "no models" start-up warning.
    /// Default false.
    pub allow_empty: bool,
}
