//! The SQLite file of `state_dir` (`state.db`): its schema and every statement the writer runs.
//!
//! Tables: `keys` (one row per key made through the admin API, and one per revoked config key:
//! the SHA-256 of the secret, the settings as JSON, created/updated/revoked Unix seconds — never
//! a secret; with shared keys also `fleet_ver`, the fleet store's version of the row, and
//! `pending`, changed here while the store was away), `spend` (the ledger: per key name × model × period start, absolute requests,
//! tokens in/out and nano-USD — each flush overwrites a row with its current totals), `meta`
//! (schema version).
//!
//! Owns: opening (WAL, `synchronous = FULL`: a key the admin API acknowledged survives a crash),
//! the schema, and the row types. A key change is one row in one transaction (`write_key`),
//! never a rewrite of the table: its cost does not grow with the number of keys. Must not: be
//! called from a shard thread (only from start-up and the writer thread in `state`).

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

use crate::governance::spend::UsageRow;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keys (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    source TEXT NOT NULL CHECK (source IN ('api', 'config')),
    sha256 BLOB NOT NULL,
    spec TEXT NOT NULL,
    created INTEGER NOT NULL,
    updated INTEGER NOT NULL,
    revoked INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS keys_live_name ON keys(name)
    WHERE revoked IS NULL AND source = 'api';
CREATE TABLE IF NOT EXISTS spend (
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    period_start INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    spend_nanos INTEGER NOT NULL,
    PRIMARY KEY (key, model, period_start)
);
";

const VERSION: &str = "1";

/// One stored key row.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyRow {
    pub id: i64,
    pub name: String,
    /// `api` (made through the admin API) or `config` (a revoked `[[key]]`).
    pub source: String,
    pub sha256: [u8; 32],
    /// `KeySpec` JSON.
    pub spec: String,
    pub created: i64,
    pub updated: i64,
    pub revoked: Option<i64>,
    /// Shared keys: the fleet store's version of this row (`None`: never in the store).
    pub fleet_ver: Option<i64>,
    /// Shared keys: changed here while the store was away (pushed when it is back).
    pub pending: bool,
}

/// A change to the `keys` table.
#[derive(Debug, Clone)]
pub enum KeyWrite {
    /// A new key; the answer is its row id.
    Insert {
        name: String,
        source: &'static str,
        sha256: [u8; 32],
        spec: String,
        at: i64,
        revoked: Option<i64>,
    },
    Update {
        id: i64,
        spec: String,
        at: i64,
    },
    Revoke {
        id: i64,
        at: i64,
    },
    /// The inner change, then its row's fleet columns (shared keys: the store's version, and
    /// whether the change is still to be pushed), in the same transaction.
    Marked {
        write: Box<KeyWrite>,
        fleet_ver: Option<i64>,
        pending: bool,
    },
}

/// Open (creating when missing) `path`, readable by its owner only.
pub fn open(path: &Path) -> Result<Connection, String> {
    let conn = Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .and_then(|_| conn.pragma_update(None, "journal_mode", "WAL"))
        .and_then(|_| conn.pragma_update(None, "synchronous", "FULL"))
        .and_then(|_| conn.execute_batch(SCHEMA))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // shared keys (issue 24): two columns older files lack (older readers ignore them)
    if conn
        .prepare("SELECT fleet_ver, pending FROM keys LIMIT 0")
        .is_err()
    {
        conn.execute_batch(
            "ALTER TABLE keys ADD COLUMN fleet_ver INTEGER;
             ALTER TABLE keys ADD COLUMN pending INTEGER NOT NULL DEFAULT 0;",
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let version: Option<String> = conn
        .query_row("SELECT v FROM meta WHERE k = 'schema'", [], |r| r.get(0))
        .optional()
        .map_err(|e| e.to_string())?;
    match version.as_deref() {
        None => {
            conn.execute(
                "INSERT INTO meta (k, v) VALUES ('schema', ?1)",
                params![VERSION],
            )
            .map_err(|e| e.to_string())?;
        }
        Some(VERSION) => {}
        Some(v) => return Err(newer(path, v)),
    }
    Ok(conn)
}

/// Whether `path` (an existing file) is a state file `open` accepts, read without writing: an
/// SQLite database (empty counts: `open` makes the schema) of a schema version this ringgate
/// reads.
pub fn probe(path: &Path) -> Result<(), String> {
    use rusqlite::OpenFlags;
    let shown = path.display();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("{shown}: {e}"))?;
    let meta: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| format!("{shown}: {e}"))?;
    if meta == 0 {
        return Ok(());
    }
    let version: Option<String> = conn
        .query_row("SELECT v FROM meta WHERE k = 'schema'", [], |r| r.get(0))
        .optional()
        .map_err(|e| format!("{shown}: {e}"))?;
    match version.as_deref() {
        None | Some(VERSION) => Ok(()),
        Some(v) => Err(newer(path, v)),
    }
}

fn newer(path: &Path, v: &str) -> String {
    format!(
        "{}: schema version {v} is newer than this ringgate understands ({VERSION})",
        path.display()
    )
}

/// Every key row, oldest first.
pub fn keys(conn: &Connection) -> Result<Vec<KeyRow>, String> {
    let mut st = conn
        .prepare(
            "SELECT id, name, source, sha256, spec, created, updated, revoked, fleet_ver, pending
             FROM keys ORDER BY id",
        )
        .map_err(|e| e.to_string())?;
    let rows = st
        .query_map([], |r| {
            let digest: Vec<u8> = r.get(3)?;
            let mut sha256 = [0u8; 32];
            if digest.len() == 32 {
                sha256.copy_from_slice(&digest);
            }
            Ok(KeyRow {
                id: r.get(0)?,
                name: r.get(1)?,
                source: r.get(2)?,
                sha256,
                spec: r.get(4)?,
                created: r.get(5)?,
                updated: r.get(6)?,
                revoked: r.get(7)?,
                fleet_ver: r.get(8)?,
                pending: r.get::<_, i64>(9)? != 0,
            })
        })
        .map_err(|e| e.to_string())?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// Apply one key change in a transaction of its own: one row inserted or updated, whatever the
/// number of keys (`id` is the primary key), never a rewrite of the table. Returns the row id.
pub fn write_key(conn: &Connection, w: &KeyWrite) -> Result<i64, String> {
    let tx = conn.unchecked_transaction().map_err(|e| e.to_string())?;
    let id = write_key_row(&tx, w)?;
    tx.commit().map_err(|e| e.to_string())?;
    Ok(id)
}

fn write_key_row(conn: &Connection, w: &KeyWrite) -> Result<i64, String> {
    let r = match w {
        KeyWrite::Insert {
            name,
            source,
            sha256,
            spec,
            at,
            revoked,
        } => conn
            .prepare_cached(
                "INSERT INTO keys (name, source, sha256, spec, created, updated, revoked)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)",
            )
            .and_then(|mut st| st.execute(params![name, source, &sha256[..], spec, at, revoked]))
            .map(|_| conn.last_insert_rowid()),
        KeyWrite::Update { id, spec, at } => conn
            .prepare_cached("UPDATE keys SET spec = ?2, updated = ?3 WHERE id = ?1")
            .and_then(|mut st| st.execute(params![id, spec, at]))
            .map(|_| *id),
        KeyWrite::Revoke { id, at } => conn
            .prepare_cached("UPDATE keys SET revoked = ?2, updated = ?2 WHERE id = ?1")
            .and_then(|mut st| st.execute(params![id, at]))
            .map(|_| *id),
        KeyWrite::Marked {
            write,
            fleet_ver,
            pending,
        } => {
            let id = write_key_row(conn, write)?;
            conn.prepare_cached("UPDATE keys SET fleet_ver = ?2, pending = ?3 WHERE id = ?1")
                .and_then(|mut st| st.execute(params![id, fleet_ver, i64::from(*pending)]))
                .map(|_| id)
        }
    };
    r.map_err(|e| e.to_string())
}

/// Ledger rows of periods starting at or after `since` (and `total` rows, period 0).
pub fn spend_rows(conn: &Connection, since: i64) -> Result<Vec<UsageRow>, String> {
    let mut st = conn
        .prepare(
            "SELECT key, model, period_start, requests, input_tokens, output_tokens, spend_nanos
             FROM spend WHERE period_start = 0 OR period_start >= ?1 ORDER BY key, model, period_start",
        )
        .map_err(|e| e.to_string())?;
    let rows = st
        .query_map(params![since], |r| {
            let nanos: i64 = r.get(6)?;
            Ok(UsageRow {
                key: r.get(0)?,
                model: r.get(1)?,
                period_start: r.get(2)?,
                requests: r.get::<_, i64>(3)?.max(0) as u64,
                input_tokens: r.get::<_, i64>(4)?.max(0) as u64,
                output_tokens: r.get::<_, i64>(5)?.max(0) as u64,
                spend_usd: nanos as f64 / crate::governance::spend::NANOS_PER_USD as f64,
                spend_nanos: nanos.max(0) as u64,
            })
        })
        .map_err(|e| e.to_string())?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// Write `row`'s totals (insert or overwrite).
pub fn put_spend(conn: &Connection, row: &UsageRow) -> Result<(), String> {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "INSERT INTO spend (key, model, period_start, requests, input_tokens, output_tokens, spend_nanos)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (key, model, period_start) DO UPDATE SET
           requests = excluded.requests, input_tokens = excluded.input_tokens,
           output_tokens = excluded.output_tokens, spend_nanos = excluded.spend_nanos",
    )
    .and_then(|mut st| {
        st.execute(params![
            row.key,
            row.model,
            row.period_start,
            clamp(row.requests),
            clamp(row.input_tokens),
            clamp(row.output_tokens),
            clamp(row.spend_nanos)
        ])
    })
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// A test's database file in a folder of its own (named by `tag` and the process), removed
/// with the folder when dropped.
#[cfg(test)]
pub(super) struct TempDb {
    dir: std::path::PathBuf,
    pub path: std::path::PathBuf,
}

#[cfg(test)]
impl TempDb {
    pub fn new(tag: &str) -> TempDb {
        let dir = std::env::temp_dir().join(format!("rg-{tag}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("t.db");
        let _ = std::fs::remove_file(&path);
        TempDb { dir, path }
    }
}

#[cfg(test)]
impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_live_names_are_unique() {
        let tmp = TempDb::new("db");
        let path = tmp.path.as_path();
        let c = open(path).unwrap();
        let ins = |name: &str| KeyWrite::Insert {
            name: name.into(),
            source: "api",
            sha256: [7; 32],
            spec: "{}".into(),
            at: 5,
            revoked: None,
        };
        let id = write_key(&c, &ins("a")).unwrap();
        assert!(write_key(&c, &ins("a")).is_err(), "a live name is unique");
        write_key(&c, &KeyWrite::Revoke { id, at: 9 }).unwrap();
        let id2 = write_key(&c, &ins("a")).unwrap();
        write_key(
            &c,
            &KeyWrite::Update {
                id: id2,
                spec: "{\"rpm\":1}".into(),
                at: 10,
            },
        )
        .unwrap();
        drop(c);
        let c = open(path).unwrap();
        let rows = keys(&c).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].revoked, Some(9));
        assert_eq!(
            (rows[1].spec.as_str(), rows[1].updated),
            ("{\"rpm\":1}", 10)
        );
        assert_eq!(rows[1].sha256, [7; 32]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn an_old_file_gets_the_fleet_columns_and_marked_writes_set_them() {
        let tmp = TempDb::new("db-fleet");
        let path = tmp.path.as_path();
        {
            // a file of the schema before shared keys: no fleet columns
            let c = Connection::open(path).unwrap();
            c.execute_batch(&SCHEMA.replace("CREATE UNIQUE INDEX", "CREATE INDEX"))
                .unwrap();
            c.execute("INSERT INTO meta (k, v) VALUES ('schema', '1')", [])
                .unwrap();
            c.execute(
                "INSERT INTO keys (name, source, sha256, spec, created, updated) VALUES ('old', 'api', x'00', '{}', 1, 1)",
                [],
            )
            .unwrap();
        }
        let c = open(path).unwrap();
        let rows = keys(&c).unwrap();
        assert_eq!((rows[0].fleet_ver, rows[0].pending), (None, false));
        let id = write_key(
            &c,
            &KeyWrite::Marked {
                write: Box::new(KeyWrite::Insert {
                    name: "new".into(),
                    source: "api",
                    sha256: [3; 32],
                    spec: "{}".into(),
                    at: 2,
                    revoked: None,
                }),
                fleet_ver: Some(41),
                pending: true,
            },
        )
        .unwrap();
        let row = keys(&c).unwrap().into_iter().find(|r| r.id == id).unwrap();
        assert_eq!(
            (row.name.as_str(), row.fleet_ver, row.pending),
            ("new", Some(41), true)
        );
    }

    #[test]
    fn each_key_change_writes_one_row_whatever_the_table_size() {
        let tmp = TempDb::new("db-rows");
        let path = tmp.path.as_path();
        let c = open(path).unwrap();
        c.pragma_update(None, "synchronous", "OFF").unwrap(); // speed only: rows are counted
        let ins = |i: usize| KeyWrite::Insert {
            name: format!("k{i}"),
            source: "api",
            sha256: [1; 32],
            spec: "{}".into(),
            at: 1,
            revoked: None,
        };
        let mut last = 0;
        for i in 0..3_000 {
            let before = c.total_changes();
            last = write_key(&c, &ins(i)).unwrap();
            assert_eq!(c.total_changes() - before, 1, "insert {i}");
        }
        for w in [
            ins(3_000),
            KeyWrite::Update {
                id: last,
                spec: "{\"rpm\":2}".into(),
                at: 2,
            },
            KeyWrite::Revoke { id: last, at: 3 },
        ] {
            let before = c.total_changes();
            write_key(&c, &w).unwrap();
            assert_eq!(c.total_changes() - before, 1, "{w:?}");
        }
        assert_eq!(keys(&c).unwrap().len(), 3_001);
    }
}
