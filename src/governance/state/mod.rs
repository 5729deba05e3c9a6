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
//! Owns: the state directory (its default — one per config file, `default_dir` — created
//! 0700, and the one check of it `serve`, `check` and `doctor` share, `check_dir`), the writer
//! thread and its queue.
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

/// Where `ringgate serve`'s default state dirs live: `ringgate` under `$XDG_DATA_HOME`, else
/// `~/.local/share`. Holding a `state.db` itself, it is the one shared default of ringgate
/// before state dirs were per config file (`legacy_note`).
pub fn data_dir() -> Option<PathBuf> {
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

/// The default `state_dir` of `ringgate serve` for the config file `config`: one per config
/// file, so unrelated gateways on one box never share keys, budgets or the spend ledger —
/// `data_dir()/<file stem>-<first 16 hex digits of the SHA-256 of its canonical path>`
/// (`~/.local/share/ringgate/gateway-3f0a…`); `data_dir()/built-in` for the built-in config.
pub fn default_dir(config: Option<&Path>) -> Option<PathBuf> {
    let data = data_dir()?;
    let Some(file) = config else {
        return Some(data.join("built-in"));
    };
    let canonical = std::fs::canonicalize(file).unwrap_or_else(|_| match file.is_absolute() {
        true => file.to_path_buf(),
        false => std::env::current_dir()
            .map(|d| d.join(file))
            .unwrap_or_else(|_| file.to_path_buf()),
    });
    let stem: String = canonical
        .file_stem()
        .map(|s| s.to_string_lossy())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(32)
        .collect();
    let stem = stem.trim_start_matches('.');
    let hash = crate::config::text_hash(&canonical.to_string_lossy());
    Some(data.join(match stem.is_empty() {
        true => hash,
        false => format!("{stem}-{hash}"),
    }))
}

/// Whether `serve` keeps state for `cfg` (the admin listener or keys are on; see
/// `gateway::start`): only then is `state_dir` opened, and checked.
pub fn wanted(cfg: &crate::config::Config) -> bool {
    cfg.admin.is_some() || cfg.auth_mode() == crate::config::AuthMode::Keys
}

/// The state directory `ringgate serve` would use for `cfg`: its `server.state_dir`, else the
/// default for its config file (`default_dir`).
pub fn serve_dir(cfg: &crate::config::Config) -> Option<PathBuf> {
    match &cfg.server.state_dir {
        Some(d) => Some(PathBuf::from(d)),
        None => default_dir(cfg.origin.path.as_deref()),
    }
}

/// What `Store::open` refuses about `dir`, found without creating or writing anything: the
/// one check `serve` (through `Store::open`), `check` and `doctor` share. `dir` must be a
/// directory this process may write (or one it may create: its nearest existing ancestor is a
/// writable directory), and a `state.db` in it must be a ringgate state file of a schema this
/// version reads.
pub fn check_dir(dir: &Path) -> Result<(), String> {
    use rustix::fs::Access;
    let shown = dir.display();
    if dir.as_os_str().is_empty() {
        return Err("server.state_dir is empty: name a directory, e.g. /var/lib/ringgate".into());
    }
    let writable = |d: &Path| {
        rustix::fs::access(d, Access::WRITE_OK | Access::EXEC_OK).map_err(|e| {
            format!(
                "server.state_dir {shown}: {} is not writable by this user ({e})",
                d.display()
            )
        })
    };
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => Err(format!("server.state_dir {shown} is not a directory")),
        Ok(_) => {
            writable(dir)?;
            let file = dir.join(FILE);
            match std::fs::metadata(&file) {
                Ok(m) if !m.is_file() => Err(format!(
                    "server.state_dir {shown}: {} is not a file",
                    file.display()
                )),
                Ok(_) => db::probe(&file),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(format!("server.state_dir {shown}: {}: {e}", file.display())),
            }
        }
        Err(e) if missing(&e) => {
            // created at start: the nearest existing ancestor must be a writable directory
            let mut up = dir.parent();
            while let Some(p) = up {
                let p = if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                };
                match std::fs::metadata(p) {
                    Ok(m) if m.is_dir() => return writable(p),
                    Ok(_) => {
                        return Err(format!(
                            "server.state_dir {shown} cannot be created: {} is not a directory",
                            p.display()
                        ))
                    }
                    Err(e) if missing(&e) => up = p.parent(),
                    Err(e) => {
                        return Err(format!("server.state_dir {shown}: {}: {e}", p.display()))
                    }
                }
            }
            Ok(())
        }
        Err(e) => Err(format!("server.state_dir {shown}: {e}")),
    }
}

/// Not there (a component under a file counts: `create_dir_all` fails on that file).
fn missing(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// A note for the start-up log when `used` is a per-file default and the old shared default
/// (`data_dir()/state.db`, before state dirs were per config file) holds state: it is not used
/// any more, and how to keep using it.
pub fn legacy_note(used: &Path) -> Option<String> {
    let data = data_dir()?;
    let old = data.join(FILE);
    (used != data && old.is_file()).then(|| {
        format!(
            "state: {} holds state from the shared default state_dir of an older ringgate; this gateway uses {} (one default state_dir per config file). To keep the keys and spend ledger there, write state_dir = \"{}\" in [server]",
            old.display(),
            used.display(),
            data.display()
        )
    })
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
        check_dir(dir)?;
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
                crate::observe::log::info(format_args!("state: {n} spend ledger row(s) restored"));
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
            crate::observe::log::info(format_args!("state: cannot write the spend ledger: {e}"));
        }
    };
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Op::Key(w, ack)) => {
                let r = db::write_key(&conn, &w);
                if let Err(e) = &r {
                    crate::observe::log::info(format_args!("state: cannot write a key: {e}"));
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
