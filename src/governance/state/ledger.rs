//! The spend ledger in the state file: restored into the process-wide `SpendBook` at start,
//! written back by the state writer at most every second.
//!
//! Restore reads the rows that can still count against a budget (periods starting this UTC
//! month or later, and `total` rows); older periods stay in the file as history. Each flush
//! takes `SpendBook::snapshot()` (absolute totals per key × model × period, restored values
//! included) and overwrites the rows that changed since the last flush, in the writer's
//! transaction — a restart loses at most the last second of spend, and never counts a row twice.
//!
//! Owns: `LedgerFlusher` and `restore`. Must not: run on a shard (the writer thread calls it).

use std::collections::HashMap;
use std::sync::Arc;

use super::{db, Flusher};
use crate::governance::spend::{unix_now, Period, SpendBook};

/// Put the stored rows of the current month (and `total` rows) into `book`, before traffic.
/// Returns how many rows were restored.
pub fn restore(conn: &rusqlite::Connection, book: &SpendBook) -> Result<usize, String> {
    let rows = db::spend_rows(conn, Period::Month.start(unix_now()))?;
    book.restore(&rows);
    Ok(rows.len())
}

/// A row's identity (key, model, period start) and its totals (requests, input, output, nanos).
type RowId = (String, String, i64);
type Totals = (u64, u64, u64, u64);

/// Writes the rows of `book` that changed since its last call.
pub struct LedgerFlusher {
    book: Arc<SpendBook>,
    /// (key, model, period) → (requests, input, output, nanos) as last written.
    written: HashMap<RowId, Totals>,
}

impl LedgerFlusher {
    /// `book` as restored (its rows count as written).
    pub fn new(book: Arc<SpendBook>) -> LedgerFlusher {
        let mut f = LedgerFlusher {
            book,
            written: HashMap::new(),
        };
        for r in f.book.snapshot() {
            f.written.insert(
                (r.key, r.model, r.period_start),
                (r.requests, r.input_tokens, r.output_tokens, r.spend_nanos),
            );
        }
        f
    }
}

impl Flusher for LedgerFlusher {
    fn flush(&mut self, conn: &rusqlite::Connection) -> Result<(), String> {
        for r in self.book.snapshot() {
            let now = (r.requests, r.input_tokens, r.output_tokens, r.spend_nanos);
            let id = (r.key.clone(), r.model.clone(), r.period_start);
            if self.written.get(&id) == Some(&now) {
                continue;
            }
            db::put_spend(conn, &r)?;
            self.written.insert(id, now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_without_double_counting() {
        let tmp = db::TempDb::new("ledger");
        let conn = db::open(&tmp.path).unwrap();
        let book = Arc::new(SpendBook::new());
        let l = book.ensure_key("team-a");
        let t = l.tally("gpt-4o-mini", 0);
        t.add(100, 20, 3_000, unix_now());
        let mut f = LedgerFlusher::new(Arc::new(SpendBook::new()));
        f.book = book.clone();
        f.flush(&conn).unwrap();
        t.add(1, 1, 7, unix_now());
        f.flush(&conn).unwrap();
        f.flush(&conn).unwrap();
        // a restart: a fresh book restored from the file, then flushed again unchanged
        let again = Arc::new(SpendBook::new());
        assert_eq!(restore(&conn, &again).unwrap(), 1);
        let mut g = LedgerFlusher::new(again.clone());
        g.flush(&conn).unwrap();
        let rows = db::spend_rows(&conn, 0).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (
                rows[0].requests,
                rows[0].input_tokens,
                rows[0].output_tokens,
                rows[0].spend_nanos
            ),
            (2, 101, 21, 3_007)
        );
        assert_eq!(again.spent("team-a", unix_now()), 3_007);
    }
}
