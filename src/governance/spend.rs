//! The process-wide spend ledger: per virtual key × model, the requests, input and output
//! tokens and spend of the current budget period, and per key the spend of that period (what
//! budgets are checked against). Shared by every shard (`Arc<SpendBook>`); read and restored by
//! the state store and the admin API through the small API below.
//!
//! **Units.** Spend is counted in nano-USD (`u64`: room for 18 billion USD per key and
//! period); prices are held in pico-USD per token (USD per 1M tokens × 10⁶), so
//! `price_input_per_mtok = 0.15` costs exactly 150 nano-USD per 1,000 tokens. A request's cost
//! is rounded to the nearest nano-USD once, when it is recorded.
//!
//! **Periods** are UTC calendar periods: `day` starts at 00:00 UTC, `month` on the 1st at
//! 00:00 UTC, `total` at the Unix epoch (`period_start = 0`, it never rolls). A key without a
//! `budget_period` keeps `total` rows. When a key's period rolls over, its rows of the closed
//! period stay in the book (for the next `snapshot`) and new rows start at zero; the rows of
//! older periods are dropped from memory (the state store has them).
//!
//! **Hot path** (`Tally::add`, once per finished keyed request): each shard owns its own row
//! per key × model, written with plain relaxed loads and stores (one writer, no atomic
//! read-modify-write), plus one atomic add to the key's period spend when the request cost
//! anything (prices off: none). Budgets are checked on the head with one atomic load
//! (`KeyLedger::over_budget`). Locks are taken only on a key's first request for a model on a
//! shard, at a period rollover, and by `snapshot`/`restore`/`ensure_key` (never on a shard in
//! steady state).
//!
//! Concurrency: a request in flight holds a reservation of its estimated cost
//! (`KeyLedger::reserve`, one compare-and-swap, admitted while spend + reservations are under
//! the budget) until its real cost is recorded, so requests racing for a key's last budget
//! overshoot it by at most one estimate (and by what a request spends over its estimate: one
//! without an output cap reserves only its prompt). A request recorded by another shard exactly
//! at a period rollover may count in the new period.
//!
//! Keys are identified by **name** (the ledger outlives the keyring's numbering, which the
//! admin API makes dynamic); a key's `KeyLedger` is found or made with `ensure_key`.
//!
//! Owns: `SpendBook`, `KeyLedger`, `Tally`, `UsageRow`, `Price`, `Budget`, `Period`.
//! Must not: do IO, compute prices from the config (routing does, see `route::Deployment`), or
//! decide refusals (that is `Governance::admit`).

pub use crate::config::price::{usd_to_nanos, Price, NANOS_PER_USD};
use std::collections::HashMap;
use std::sync::atomic::{
    AtomicI64, AtomicU64, AtomicU8,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// A budget period (UTC calendar).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Period {
    Day,
    Month,
    /// Since the epoch: never rolls.
    #[default]
    Total,
}

impl Period {
    pub fn parse(s: &str) -> Option<Period> {
        match s {
            "day" => Some(Period::Day),
            "month" => Some(Period::Month),
            "total" => Some(Period::Total),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
            Period::Total => "total",
        }
    }

    /// Unix seconds at which the period holding `now` (Unix seconds) started.
    pub fn start(self, now: i64) -> i64 {
        const DAY: i64 = 86_400;
        match self {
            Period::Total => 0,
            Period::Day => now - now.rem_euclid(DAY),
            Period::Month => {
                let (y, m, _) = crate::util::date::civil_from_days(now.div_euclid(DAY));
                crate::util::date::days_from_civil(y, m, 1) * DAY
            }
        }
    }

    /// Unix seconds at which the period after the one holding `now` starts (`None`: `total`).
    pub fn next_start(self, now: i64) -> Option<i64> {
        const DAY: i64 = 86_400;
        match self {
            Period::Total => None,
            Period::Day => Some(self.start(now) + DAY),
            Period::Month => {
                let (y, m, _) = crate::util::date::civil_from_days(now.div_euclid(DAY));
                let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                Some(crate::util::date::days_from_civil(y, m, 1) * DAY)
            }
        }
    }

    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(c: u8) -> Period {
        match c {
            0 => Period::Day,
            1 => Period::Month,
            _ => Period::Total,
        }
    }
}

/// A key's spend limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub nanos: u64,
    pub period: Period,
}

impl Budget {
    /// `usd` per `period` (negative or NaN: 0).
    pub fn usd(usd: f64, period: Period) -> Budget {
        Budget {
            nanos: usd_to_nanos(usd),
            period,
        }
    }
}

/// One row of the ledger: a key's use of one model in one period.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRow {
    /// The key's name (never its secret).
    pub key: String,
    /// The configured model name that answered (a route name, e.g. `gpt-4o-mini` or `gpt-*`).
    pub model: String,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Spend in USD (`spend_nanos` / 10⁹).
    pub spend_usd: f64,
    /// Spend in nano-USD (exact; what `restore` reads).
    pub spend_nanos: u64,
    /// Unix seconds (UTC) at which the row's period started; 0 for `total`.
    pub period_start: i64,
}

/// Counters of one row (saturating: they never wrap). Written by one owner (a shard) with
/// relaxed load + store; read by anyone.
#[derive(Debug, Default)]
struct Cells {
    requests: AtomicU64,
    input: AtomicU64,
    output: AtomicU64,
    spend: AtomicU64,
    period: AtomicI64,
}

impl Cells {
    fn bump(c: &AtomicU64, by: u64) {
        c.store(c.load(Relaxed).saturating_add(by), Relaxed);
    }

    fn is_zero(&self) -> bool {
        self.requests.load(Relaxed) == 0
            && self.input.load(Relaxed) == 0
            && self.output.load(Relaxed) == 0
            && self.spend.load(Relaxed) == 0
    }

    fn reset(&self, period: i64) {
        for c in [&self.requests, &self.input, &self.output, &self.spend] {
            c.store(0, Relaxed);
        }
        self.period.store(period, Relaxed);
    }

    fn frozen_copy(&self) -> Cells {
        let c = Cells::default();
        c.requests.store(self.requests.load(Relaxed), Relaxed);
        c.input.store(self.input.load(Relaxed), Relaxed);
        c.output.store(self.output.load(Relaxed), Relaxed);
        c.spend.store(self.spend.load(Relaxed), Relaxed);
        c.period.store(self.period.load(Relaxed), Relaxed);
        c
    }
}

/// Who writes an entry's cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// A shard's live row.
    Shard(usize),
    /// Restored, or a closed period's copy: written only under the key's lock.
    Fixed,
}

#[derive(Debug)]
struct Entry {
    model: Box<str>,
    owner: Owner,
    cells: Arc<Cells>,
}

/// "Not yet computed" for `KeyLedger::current`.
const NO_PERIOD: i64 = i64::MIN;
/// "No budget" for `KeyLedger::budget`.
const NO_BUDGET: u64 = u64::MAX;

/// One key's ledger: its budget, its current period's spend, its rows.
#[derive(Debug)]
pub struct KeyLedger {
    name: Box<str>,
    /// Nano-USD per period, `NO_BUDGET` when unlimited.
    budget: AtomicU64,
    period: AtomicU8,
    /// Start of the period `spend` counts (`NO_PERIOD` until first needed).
    current: AtomicI64,
    /// Start of the period after it (`NO_PERIOD`: not known; `i64::MAX` for `total`): while
    /// `current <= now < until` no calendar arithmetic is needed.
    until: AtomicI64,
    /// Start of the period before it, the oldest one kept in memory (`NO_PERIOD`: none).
    previous: AtomicI64,
    /// Nano-USD spent in the current period (all shards, restored rows included).
    spend: AtomicU64,
    /// Nano-USD reserved by requests in flight (any period; saturating).
    reserved: AtomicU64,
    entries: Mutex<Vec<Entry>>,
}

impl KeyLedger {
    fn new(name: &str) -> KeyLedger {
        KeyLedger {
            name: name.into(),
            budget: AtomicU64::new(NO_BUDGET),
            period: AtomicU8::new(Period::Total.code()),
            current: AtomicI64::new(NO_PERIOD),
            until: AtomicI64::new(NO_PERIOD),
            previous: AtomicI64::new(NO_PERIOD),
            spend: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            entries: Mutex::new(Vec::new()),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Entry>> {
        // A panic while holding the lock leaves plain counters: keep using them.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn period(&self) -> Period {
        Period::from_code(self.period.load(Relaxed))
    }

    #[inline]
    pub fn has_budget(&self) -> bool {
        self.budget.load(Relaxed) != NO_BUDGET
    }

    pub fn budget(&self) -> Option<Budget> {
        let nanos = self.budget.load(Relaxed);
        (nanos != NO_BUDGET).then(|| Budget {
            nanos,
            period: self.period(),
        })
    }

    /// Set (or clear) the budget. `period` is the ledger's period whether or not there is a
    /// budget (`None`: keep the current one). A changed period starts counting anew at the
    /// next request (rows of the old period stay as history).
    pub fn set_budget(&self, budget: Option<u64>, period: Option<Period>) {
        self.budget.store(budget.unwrap_or(NO_BUDGET), Relaxed);
        if let Some(p) = period {
            if self.period.swap(p.code(), Relaxed) != p.code() {
                let _g = self.lock();
                self.until.store(NO_PERIOD, Relaxed);
                self.current.store(NO_PERIOD, Relaxed);
            }
        }
    }

    /// The current period's start for `now` (Unix seconds), rolling the key's spend over when a
    /// new period began.
    #[inline]
    pub fn current_period(&self, now: i64) -> i64 {
        // `until` is stored last (Release) when a period starts: seeing it, `current` is its.
        let until = self.until.load(Acquire);
        let current = self.current.load(Relaxed);
        if current <= now && now < until {
            return current;
        }
        let p = self.period().start(now);
        self.roll(p);
        p
    }

    /// Make `p` the current period (or just learn its end when it already is).
    #[cold]
    fn roll(&self, p: i64) {
        let mut entries = self.lock();
        let until = self.period().next_start(p).unwrap_or(i64::MAX);
        if self.current.load(Relaxed) == p {
            self.until.store(until, Release);
            return;
        }
        self.until.store(NO_PERIOD, Relaxed);
        // At a rollover, drop the closed rows of periods older than the one being closed
        // (the state store has them).
        let closing = self.current.load(Relaxed);
        if closing != NO_PERIOD {
            entries.retain(|e| e.owner != Owner::Fixed || e.cells.period.load(Relaxed) >= closing);
        }
        self.previous.store(closing, Relaxed);
        let carried: u64 = entries
            .iter()
            .filter(|e| e.cells.period.load(Relaxed) == p)
            .map(|e| e.cells.spend.load(Relaxed))
            .fold(0u64, u64::saturating_add);
        self.spend.store(carried, Relaxed);
        self.current.store(p, Relaxed);
        self.until.store(until, Release);
    }

    /// Nano-USD spent in the period holding `now`.
    pub fn spent(&self, now: i64) -> u64 {
        self.current_period(now);
        self.spend.load(Relaxed)
    }

    /// `Some((budget, spent))` when the key has a budget and has spent all of it in the period
    /// holding `now` (Unix seconds), counting what requests in flight reserved. Nothing is
    /// locked or written unless the period rolled.
    #[inline]
    pub fn over_budget(&self, now: i64) -> Option<(u64, u64)> {
        let budget = self.budget.load(Relaxed);
        if budget == NO_BUDGET {
            return None;
        }
        let spent = self.spent(now);
        let committed = spent.saturating_add(self.reserved.load(Relaxed));
        (committed >= budget).then_some((budget, spent))
    }

    /// Reserve `nanos` for a request about to be sent, if spend + reservations are still under
    /// the budget (`Err((budget, spent))` otherwise); returns what was reserved (no budget:
    /// nothing). Give it back with `release` once the request's real cost is recorded.
    pub fn reserve(&self, now: i64, nanos: u64) -> Result<u64, (u64, u64)> {
        let budget = self.budget.load(Relaxed);
        if budget == NO_BUDGET {
            return Ok(0);
        }
        let spent = self.spent(now);
        self.reserved
            .fetch_update(Relaxed, Relaxed, |r| {
                (spent.saturating_add(r) < budget).then(|| r.saturating_add(nanos))
            })
            .map(|_| nanos)
            .map_err(|_| (budget, spent))
    }

    /// Give back a reservation of `nanos` (never below zero).
    pub fn release(&self, nanos: u64) {
        let _ = self
            .reserved
            .fetch_update(Relaxed, Relaxed, |r| Some(r.saturating_sub(nanos)));
    }

    /// Nano-USD reserved by requests in flight.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Relaxed)
    }

    /// Shard `shard`'s row for `model` (made on first use). Cache the result: this locks.
    pub fn tally(self: &Arc<Self>, model: &str, shard: usize) -> Tally {
        let mut entries = self.lock();
        let found = entries
            .iter()
            .find(|e| e.owner == Owner::Shard(shard) && &*e.model == model)
            .map(|e| e.cells.clone());
        let cells = found.unwrap_or_else(|| {
            let cells = Arc::new(Cells::default());
            cells.period.store(NO_PERIOD, Relaxed);
            entries.push(Entry {
                model: model.into(),
                owner: Owner::Shard(shard),
                cells: cells.clone(),
            });
            cells
        });
        Tally {
            ledger: self.clone(),
            cells,
        }
    }

    /// Add one row's values (restore): counted in the current period's spend when the row
    /// belongs to it.
    fn restore(&self, row: &UsageRow) {
        let mut entries = self.lock();
        let cells = Cells::default();
        cells.requests.store(row.requests, Relaxed);
        cells.input.store(row.input_tokens, Relaxed);
        cells.output.store(row.output_tokens, Relaxed);
        cells.spend.store(row.spend_nanos, Relaxed);
        cells.period.store(row.period_start, Relaxed);
        entries.push(Entry {
            model: row.model.as_str().into(),
            owner: Owner::Fixed,
            cells: Arc::new(cells),
        });
        if self.current.load(Relaxed) == row.period_start {
            crate::observe::metrics::add_atomic(&self.spend, row.spend_nanos);
        }
    }

    /// Rows by (model, period), summed over shards and restored values.
    fn rows(&self, out: &mut Vec<UsageRow>) {
        let entries = self.lock();
        let first = out.len();
        for e in entries.iter() {
            let c = &e.cells;
            let period = c.period.load(Relaxed);
            if period == NO_PERIOD || c.is_zero() {
                continue;
            }
            let at = out[first..]
                .iter()
                .position(|r| r.model == *e.model && r.period_start == period);
            let row = match at {
                Some(i) => &mut out[first + i],
                None => {
                    out.push(UsageRow {
                        key: self.name.to_string(),
                        model: e.model.to_string(),
                        requests: 0,
                        input_tokens: 0,
                        output_tokens: 0,
                        spend_usd: 0.0,
                        spend_nanos: 0,
                        period_start: period,
                    });
                    let last = out.len() - 1;
                    &mut out[last]
                }
            };
            row.requests = row.requests.saturating_add(c.requests.load(Relaxed));
            row.input_tokens = row.input_tokens.saturating_add(c.input.load(Relaxed));
            row.output_tokens = row.output_tokens.saturating_add(c.output.load(Relaxed));
            row.spend_nanos = row.spend_nanos.saturating_add(c.spend.load(Relaxed));
        }
        for r in &mut out[first..] {
            r.spend_usd = r.spend_nanos as f64 / NANOS_PER_USD as f64;
        }
    }
}

/// A shard's handle on its row for one key × model: what a finished request is added to.
#[derive(Debug, Clone)]
pub struct Tally {
    ledger: Arc<KeyLedger>,
    cells: Arc<Cells>,
}

impl Tally {
    /// One finished request with `input`/`output` tokens costing `nanos`, at `now` (Unix
    /// seconds). Only the shard that made this tally may call it.
    #[inline]
    pub fn add(&self, input: u64, output: u64, nanos: u64, now: i64) {
        let p = self.ledger.current_period(now);
        let c = &*self.cells;
        if c.period.load(Relaxed) != p {
            self.roll(p);
        }
        Cells::bump(&c.requests, 1);
        Cells::bump(&c.input, input);
        Cells::bump(&c.output, output);
        if nanos > 0 {
            Cells::bump(&c.spend, nanos);
            crate::observe::metrics::add_atomic(&self.ledger.spend, nanos);
        }
    }

    /// This row starts period `p`: what it holds of an earlier period is kept as a closed row.
    #[cold]
    fn roll(&self, p: i64) {
        let mut entries = self.ledger.lock();
        let c = &*self.cells;
        let kept = self.ledger.previous.load(Relaxed);
        let held = c.period.load(Relaxed);
        // Keep what the row holds of the period just closed; older periods are gone from
        // memory already (a snapshot taken then has them).
        if held != NO_PERIOD && held >= kept && !c.is_zero() {
            let model = entries
                .iter()
                .find(|e| Arc::ptr_eq(&e.cells, &self.cells))
                .map_or_else(|| "".into(), |e| e.model.clone());
            entries.push(Entry {
                model,
                owner: Owner::Fixed,
                cells: Arc::new(c.frozen_copy()),
            });
        }
        c.reset(p);
    }

    pub fn ledger(&self) -> &Arc<KeyLedger> {
        &self.ledger
    }
}

/// Every key's ledger, by key name.
#[derive(Debug, Default)]
pub struct SpendBook {
    keys: RwLock<HashMap<Box<str>, Arc<KeyLedger>>>,
}

impl SpendBook {
    pub fn new() -> SpendBook {
        SpendBook::default()
    }

    /// The ledger of key `name`, made (no budget, period `total`) if it does not exist yet.
    /// Keys made at runtime call this, then `KeyLedger::set_budget`.
    pub fn ensure_key(&self, name: &str) -> Arc<KeyLedger> {
        if let Some(l) = self.get(name) {
            return l;
        }
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        keys.entry(name.into())
            .or_insert_with(|| Arc::new(KeyLedger::new(name)))
            .clone()
    }

    /// The ledger of key `name`, if it has one.
    pub fn get(&self, name: &str) -> Option<Arc<KeyLedger>> {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        keys.get(name).cloned()
    }

    /// Record one finished request by names (tests, tools; shards use a cached `Tally`).
    /// `shard` picks the row owner: use a number no shard uses, e.g. `usize::MAX`, from
    /// outside the shards, and one thread per number.
    pub fn record(
        &self,
        key: &str,
        model: &str,
        shard: usize,
        (input, output, nanos): (u64, u64, u64),
        now: i64,
    ) {
        self.ensure_key(key)
            .tally(model, shard)
            .add(input, output, nanos, now);
    }

    /// Every non-empty row: per key × model × period (current and just-closed periods), summed
    /// over shards and restored rows. Sorted by key, model, period.
    pub fn snapshot(&self) -> Vec<UsageRow> {
        let ledgers: Vec<Arc<KeyLedger>> = {
            let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
            keys.values().cloned().collect()
        };
        let mut out = Vec::new();
        for l in ledgers {
            l.rows(&mut out);
        }
        out.sort_by(|a, b| {
            (&a.key, &a.model, a.period_start).cmp(&(&b.key, &b.model, b.period_start))
        });
        out
    }

    /// Add saved rows (e.g. read back from the state store at start, before traffic). Rows of
    /// unknown keys make their ledger. Restoring the same rows twice counts them twice.
    pub fn restore(&self, rows: &[UsageRow]) {
        for r in rows {
            self.ensure_key(&r.key).restore(r);
        }
    }

    /// Nano-USD key `name` spent in the period holding `now` (0 for an unknown key).
    pub fn spent(&self, name: &str, now: i64) -> u64 {
        self.get(name).map_or(0, |l| l.spent(now))
    }
}

/// Unix seconds now (UTC).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JAN_31_2025: i64 = 1_738_281_600; // 2025-01-31T00:00:00Z
    const FEB_1_2025: i64 = 1_738_368_000;

    #[test]
    fn periods_are_utc_calendar() {
        assert_eq!(Period::Day.start(JAN_31_2025 + 86_399), JAN_31_2025);
        assert_eq!(Period::Day.start(FEB_1_2025), FEB_1_2025);
        assert_eq!(Period::Month.start(JAN_31_2025 + 86_399), 1_735_689_600); // 2025-01-01
        assert_eq!(Period::Month.start(FEB_1_2025 + 5), FEB_1_2025);
        // leap day
        assert_eq!(Period::Month.start(1_709_164_800), 1_706_745_600); // 2024-02-29 → 02-01
        assert_eq!(Period::Total.start(FEB_1_2025), 0);
        assert_eq!(Period::Day.next_start(JAN_31_2025 + 5), Some(FEB_1_2025));
        assert_eq!(Period::Month.next_start(JAN_31_2025 + 5), Some(FEB_1_2025));
        assert_eq!(
            Period::Month.next_start(1_735_603_200), // 2024-12-31
            Some(1_735_689_600)
        );
        assert_eq!(Period::Total.next_start(5), None);
    }

    #[test]
    fn prices_in_exact_units() {
        let p = Price::per_mtok(Some(0.15), Some(0.60)).unwrap();
        assert_eq!((p.input_pico, p.output_pico), (150_000, 600_000));
        assert_eq!(p.cost_nanos(1000, 1000), 750_000);
        assert_eq!(p.cost_nanos(1, 0), 150);
        let tiny = Price::per_mtok(Some(0.0001), None).unwrap();
        assert_eq!(tiny.input_pico, 100);
        assert_eq!(tiny.cost_nanos(4, 9), 0); // 0.4 nano rounds to 0
        assert_eq!(tiny.cost_nanos(5, 9), 1); // 0.5 nano rounds to 1
        assert_eq!(Price::per_mtok(None, None), None);
        let p = Price::per_mtok(Some(3.0), None).unwrap();
        assert_eq!(p.cost_nanos(1_000_000, 99), 3 * NANOS_PER_USD);
        assert_eq!(Budget::usd(5.0, Period::Month).nanos, 5 * NANOS_PER_USD);
    }

    #[test]
    fn rows_sum_shards_and_roll_over_per_period() {
        let book = SpendBook::new();
        let l = book.ensure_key("team-a");
        l.set_budget(Some(1000), Some(Period::Day));
        let a = l.tally("m", 0);
        let b = l.tally("m", 1);
        let t = JAN_31_2025 + 10;
        a.add(10, 5, 400, t);
        b.add(1, 2, 500, t);
        assert_eq!(l.over_budget(t), None);
        a.add(0, 1, 100, t);
        assert_eq!(l.over_budget(t), Some((1000, 1000)));
        let rows = book.snapshot();
        assert_eq!(rows.len(), 1, "{rows:?}");
        let r = &rows[0];
        assert_eq!(
            (r.requests, r.input_tokens, r.output_tokens, r.spend_nanos),
            (3, 11, 8, 1000)
        );
        assert_eq!((r.period_start, r.key.as_str()), (JAN_31_2025, "team-a"));
        assert!((r.spend_usd - 1e-6).abs() < 1e-12);
        // next day: the budget is fresh, the closed day stays in the snapshot
        let t2 = FEB_1_2025 + 1;
        assert_eq!(l.over_budget(t2), None);
        b.add(1, 1, 7, t2);
        let rows = book.snapshot();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!((rows[0].period_start, rows[0].requests), (JAN_31_2025, 3));
        assert_eq!((rows[1].period_start, rows[1].requests), (FEB_1_2025, 1));
        assert_eq!(l.spent(t2), 7);
        // a day later still: the closed day goes, the closing one stays
        a.add(0, 0, 0, FEB_1_2025 + 86_400);
        let periods: Vec<i64> = book.snapshot().iter().map(|r| r.period_start).collect();
        assert_eq!(periods, vec![FEB_1_2025, FEB_1_2025 + 86_400]);
    }

    #[test]
    fn restore_counts_toward_the_current_period_only() {
        let book = SpendBook::new();
        book.ensure_key("k")
            .set_budget(Some(100), Some(Period::Month));
        let row = |period_start, spend| UsageRow {
            key: "k".into(),
            model: "m".into(),
            requests: 2,
            input_tokens: 20,
            output_tokens: 10,
            spend_usd: 0.0,
            spend_nanos: spend,
            period_start,
        };
        let jan = Period::Month.start(JAN_31_2025);
        book.restore(&[row(jan, 60), row(jan - 86_400 * 31, 1000)]);
        assert_eq!(book.spent("k", JAN_31_2025), 60);
        book.record("k", "m", 0, (1, 1, 40), JAN_31_2025);
        let l = book.get("k").unwrap();
        assert_eq!(l.over_budget(JAN_31_2025), Some((100, 100)));
        let rows = book.snapshot();
        let cur = rows.iter().find(|r| r.period_start == jan).unwrap();
        assert_eq!((cur.requests, cur.spend_nanos), (3, 100));
        // a restored snapshot restores the same spend
        let again = SpendBook::new();
        again.restore(&rows);
        again
            .ensure_key("k")
            .set_budget(Some(100), Some(Period::Month));
        assert_eq!(again.spent("k", JAN_31_2025), 100);
        assert_eq!(again.snapshot(), rows);
    }
}
