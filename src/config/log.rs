//! `[log]`: where the access log goes.
//!
//! ```toml
//! [log]
//! access = "stdout"   # "off" (default) | "stdout" | a file path (appended to, created 0640)
//! requests_file = "/var/log/ringgate/requests.jsonl"   # request log export (off by default)
//! requests_file_max_bytes = "64MiB"                    # rotate at this size (keeps one previous file)
//! ```
//!
//! Owns: `LogConfig`, `AccessLog` and their validation. Must not: open files (see `accesslog`).

use serde::Deserialize;
use toml::Spanned;

use super::{line_of, ConfigError};
use crate::admit::ByteSize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `off` (default), `stdout`, or a file path: one JSON line per request.
    pub access: Spanned<String>,
    /// The request log export (`telemetry::requests`): one JSON line per request, with usage,
    /// cost and trace id, to this file, rotated by size.
    pub requests_file: Option<String>,
    /// Rotate the request log at this size (the previous file is kept as `<file>.1`).
    pub requests_file_max_bytes: ByteSize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            access: Spanned::new(0..0, "off".to_string()),
            requests_file: None,
            requests_file_max_bytes: ByteSize(64 << 20),
        }
    }
}

pub use crate::observe::accesslog::Target as AccessLog;

impl LogConfig {
    pub fn access(&self) -> AccessLog {
        match self.access.get_ref().as_str() {
            "off" => AccessLog::Off,
            "stdout" => AccessLog::Stdout,
            path => AccessLog::File(path.to_string()),
        }
    }

    pub(super) fn validate(&self, text: &str) -> Vec<ConfigError> {
        let a = self.access.get_ref();
        let span = self.access.span();
        let mut errors = Vec::new();
        if a.is_empty() || a.contains('\0') || a.trim() != a {
            errors.push(ConfigError {
                line: (span.end > 0).then(|| line_of(text, span.start)),
                message: format!("log.access {a:?}: expected \"off\", \"stdout\" or a file path"),
            });
        }
        if let Some(f) = &self.requests_file {
            if f.is_empty() || f.contains('\0') || f.trim() != f || f.ends_with('/') {
                errors.push(ConfigError {
                    line: None,
                    message: format!("log.requests_file {f:?}: expected a file path"),
                });
            }
        }
        if self.requests_file_max_bytes.0 < 4096 {
            errors.push(ConfigError {
                line: None,
                message: "log.requests_file_max_bytes: at least 4KiB".into(),
            });
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{AccessLog, Config};

    #[test]
    fn access_log_contract() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.log.access(), AccessLog::Off);
        for (v, want) in [
            ("off", AccessLog::Off),
            ("stdout", AccessLog::Stdout),
            (
                "/var/log/ringgate/access.log",
                AccessLog::File("/var/log/ringgate/access.log".into()),
            ),
        ] {
            let c = Config::parse(&format!("[log]\naccess = \"{v}\"\n")).unwrap();
            assert_eq!(c.log.access(), want);
        }
        let e = Config::parse("[server]\nshards = 1\n[log]\naccess = \"\"\n").unwrap_err();
        assert_eq!(e[0].line, Some(4), "{e:?}");
        assert!(Config::parse("[log]\nerror = \"x\"\n").is_err());
    }

    #[test]
    fn hash_follows_the_text() {
        let a = Config::parse("[server]\nshards = 1\n").unwrap();
        let b = Config::parse("[server]\nshards = 2\n").unwrap();
        assert_eq!(a.hash.len(), 16);
        assert_ne!(a.hash, b.hash);
        assert_eq!(
            a.hash,
            Config::parse("[server]\nshards = 1\n").unwrap().hash
        );
    }
}
