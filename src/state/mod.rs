//! State that survives a restart: one SQLite file (`state.db`) in `[server] state_dir`, written
//! by one writer thread.
//!
//! - **Keys** made, changed or revoked through the admin API (and revocations of config keys)
//!   go through a bounded queue to the writer and are acknowledged once committed
//!   (`synchronous = FULL`): the admin API answers after the row is on disk, so a restart loses
//!   no key. Only the admin thread sends these; it may wait, a shard never does.
//! - **The spend ledger** is kept in memory while serving; the writer takes a snapshot of it at
//!   most every second (`Flusher`) and writes the rows that changed in one transaction, so a
//!   restart loses at most the last second of spend and shards never enqueue anything, never
//!   touch the disk, never wait. A final snapshot is written when the gateway stops.
//! - So the bounded queue (256) only ever holds admin changes; nothing a shard does can fill it
//!   or wait on it — the ledger's changes are coalesced by construction (one snapshot a second,
//!   however many requests happened).
//!
//! Owns: the state directory (default path, created 0700), the writer thread and its queue.
//! Must not: be called from a shard thread except through `Flusher` snapshots it pulls itself.

pub mod db;
pub mod ledger;

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use db::{KeyRow, KeyWrite};

/// The database file inside `state_dir`.
pub const FILE: &str = "state.db";
/// Pending admin writes the queue holds (a further sender, the admin thread, waits).
const QUEUE: usize = 256;
/// Longest time between two snapshots of the in-memory ledger.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Something the writer snapshots every `FLUSH_EVERY` and writes (the spend ledger).
pub trait Flusher: Send {
    /// Write what changed since the last call (inside the writer's transaction).
    fn flush(&mut self, conn: &rusqlite::Connection) -> Result<(), String>;
}

enum Op {
    Key(KeyWrite, SyncSender<Result<i64, String>>),
    Stop,
}

/// The default `state_dir`: `ringgate` under `$XDG_DATA_HOME`, else `~/.local/share`.
pub fn default_dir() -> Option<PathBuf> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local/share"))
        })?;
    Some(data.join("ringgate"))
}

/// The open state: a handle on the writer thread.
pub struct Store {
    tx: SyncSender<Op>,
    path: PathBuf,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.path.display())
    }
}

impl Store {
    /// Open `dir/state.db` (creating `dir` 0700 when missing); returns the store and the stored
    /// key rows. With `book`, the stored spend ledger is restored into it (before traffic) and
    /// written back every `FLUSH_EVERY`.
    pub fn open(
        dir: &Path,
        book: Option<&Arc<crate::governance::SpendBook>>,
    ) -> Result<(Store, Vec<KeyRow>), String> {
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("state_dir {}: {e}", dir.display()))?;
        }
        let path = dir.join(FILE);
        let conn = db::open(&path)?;
        let keys = db::keys(&conn)?;
        let mut flushers: Vec<Box<dyn Flusher>> = Vec::new();
        if let Some(book) = book {
            let n = ledger::restore(&conn, book)?;
            if n > 0 {
                crate::log::info(format_args!("state: {n} spend ledger row(s) restored"));
            }
            flushers.push(Box::new(ledger::LedgerFlusher::new(book.clone())));
        }
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer = std::thread::Builder::new()
            .name("ringgate-state".into())
            .spawn(move || writer(conn, rx, flushers))
            .map_err(|e| format!("cannot start the state writer: {e}"))?;
        Ok((
            Store {
                tx,
                path,
                writer: Mutex::new(Some(writer)),
            },
            keys,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commit a key change and wait for it (admin thread only: this may wait on the disk).
    pub fn write_key(&self, w: KeyWrite) -> Result<i64, String> {
        let (ack, done) = mpsc::sync_channel(1);
        self.tx
            .send(Op::Key(w, ack))
            .map_err(|_| "the state writer has stopped".to_string())?;
        done.recv()
            .map_err(|_| "the state writer has stopped".to_string())?
    }

    /// Write a last snapshot and stop the writer.
    pub fn close(&self) {
        let _ = self.tx.send(Op::Stop);
        let h = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

fn writer(conn: rusqlite::Connection, rx: Receiver<Op>, mut flushers: Vec<Box<dyn Flusher>>) {
    let mut next = Instant::now() + FLUSH_EVERY;
    let mut flush = |conn: &rusqlite::Connection| {
        let fs = &mut flushers;
        if fs.is_empty() {
            return;
        }
        let r = conn
            .unchecked_transaction()
            .map_err(|e| e.to_string())
            .and_then(|tx| {
                for f in fs.iter_mut() {
                    f.flush(&tx)?;
                }
                tx.commit().map_err(|e| e.to_string())
            });
        if let Err(e) = r {
            crate::log::info(format_args!("state: cannot write the spend ledger: {e}"));
        }
    };
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Op::Key(w, ack)) => {
                let r = db::write_key(&conn, &w);
                if let Err(e) = &r {
                    crate::log::info(format_args!("state: cannot write a key: {e}"));
                }
                let _ = ack.send(r);
            }
            Err(RecvTimeoutError::Timeout) => {
                flush(&conn);
                next = Instant::now() + FLUSH_EVERY;
            }
            Ok(Op::Stop) | Err(RecvTimeoutError::Disconnected) => {
                flush(&conn);
                return;
            }
        }
    }
}
