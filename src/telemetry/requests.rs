//! The request log export (`[log] requests_file`, off by default): the access-log record of
//! every request plus its cost and trace id, one JSON line each, written by its own writer
//! thread to a file rotated by size (`requests_file_max_bytes`; the previous file is kept as
//! `<file>.1`, older ones are removed).
//!
//! The shards' side is the access log's (`accesslog::ShardLog`): lines formatted into a shard's
//! own buffer, handed over through a bounded queue (64 buffers of 16 KiB), dropped and counted
//! (`ringgate_request_log_dropped_total`) when the queue is full or the file cannot be
//! written — a slow disk never blocks a shard nor grows memory.
//!
//! Owns: `start`, `Rotating` (the size-rotated file). Must not: write on a shard, or split a
//! buffer of lines across two files.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::observe::accesslog::{AccessLog, QUEUE_BATCHES};

/// Start the request log's writer on `path` (`Ok(None)` when no file is configured).
pub fn start(
    path: Option<&str>,
    max_bytes: u64,
    dropped: Arc<AtomicU64>,
) -> io::Result<Option<(AccessLog, JoinHandle<()>)>> {
    let Some(path) = path else { return Ok(None) };
    let out = Rotating::open(path.into(), max_bytes).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("log.requests_file: cannot open {path}: {e}"),
        )
    })?;
    AccessLog::start_with(Box::new(out), QUEUE_BATCHES, dropped).map(Some)
}

/// A file that moves to `<path>.1` and starts over before a write would take it past `max`.
pub struct Rotating {
    path: PathBuf,
    max: u64,
    file: File,
    size: u64,
}

impl Rotating {
    pub fn open(path: PathBuf, max: u64) -> io::Result<Rotating> {
        let file = open(&path)?;
        let size = file.metadata()?.len();
        Ok(Rotating {
            path,
            max,
            file,
            size,
        })
    }

    fn rotate(&mut self) -> io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, old)?;
        self.file = open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

fn open(path: &std::path::Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

impl Write for Rotating {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    /// A whole buffer of lines goes to one file: the file rotates first when it would pass
    /// `max` (a buffer larger than `max` still goes whole into a fresh file).
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.size > 0 && self.size.saturating_add(buf.len() as u64) > self.max {
            self.rotate()?;
        }
        self.file.write_all(buf)?;
        self.size = self.size.saturating_add(buf.len() as u64);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_keeping_one_previous_file() {
        let dir = crate::util::scratch::dir("reqlog");
        let path = dir.join("requests.jsonl");
        let mut r = Rotating::open(path.clone(), 100).unwrap();
        let line = [b'x'; 39];
        let mut line = line.to_vec();
        line.push(b'\n'); // 40 bytes
        for _ in 0..2 {
            r.write_all(&line).unwrap();
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 80);
        r.write_all(&line).unwrap(); // 120 > 100: rotated first
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 40);
        let old = dir.join("requests.jsonl.1");
        assert_eq!(std::fs::metadata(&old).unwrap().len(), 80);
        for _ in 0..3 {
            r.write_all(&line).unwrap();
        }
        // rotated again: the previous .1 replaced, never a .2
        assert_eq!(std::fs::metadata(&old).unwrap().len(), 80);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 80);
        assert!(!dir.join("requests.jsonl.2").exists());
        // reopened: appends and counts what is there
        drop(r);
        let mut r = Rotating::open(path.clone(), 100).unwrap();
        r.write_all(&line).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 40);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
