//! Minimal line logger to stderr with a timestamp. Bounded by construction: callers on hot
//! paths must rate-limit (see `admit`), this module never queues.
//!
//! Owns: the log line format. Must not: buffer, allocate per call beyond formatting, or block on
//! anything but the stderr write.

use std::fmt::Arguments;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn info(args: Arguments<'_>) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "{}.{:03} ringgate: {args}",
        now.as_secs(),
        now.subsec_millis()
    );
}
