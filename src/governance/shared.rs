//! Limits decided by the shared store (`[limits] store = "redis"`): the full `rpm`, `tpm` and
//! `max_in_flight` of each key, counted once for every shard of every process using the store
//! — no per-shard split.
//!
//! - **Head** (`confirm` after `admit`): one script run checks the key's in-flight count and
//!   counts the request in the current wall-clock window (`store::script`). Only then does the
//!   request count in this shard's own in-flight count.
//! - **Tokens** (`confirm` after `check_model`): reserves the estimate in the window; when the
//!   request ends the difference to the real usage is sent without waiting (`reconcile_shared`;
//!   if the window has turned meanwhile, the real amount counts in the new one, as locally).
//! - **In flight**: each shard's count per key is a field of the key's hash in the store; it
//!   mirrors the shard's own `in_flight` (+1 by the admitting script, -1 sent when a request
//!   ends, and set whole on every reconnect: `resync`). A crashed or cut-off process stops
//!   renewing its lease (`redis_lease_ms`), and the next admission of the key drops its field:
//!   its slots are freed after at most one lease, never leaked.
//! - **Store errors** (`Fault`): `on_store_error = "local"` decides with the process-wide
//!   counters (`Counters`, the full limits; they are charged even while the store decides, so a
//!   fallback mid-window starts from what this process really admitted); what each shard admits
//!   is noted (`Outage`) and, when the store is back and the window is still the same, added to
//!   it. `"closed"` refuses with 503.
//! - **Budgets**: every recorded cost of a key with a budget is added to the key's spend
//!   counter of its period in the store (without waiting); the head's script refuses a key
//!   whose fleet-wide spend reached its budget (429 `insufficient_quota`, as locally). The
//!   process's own ledger (`SpendBook`) is checked first and stays what the state store and the
//!   admin API read; when the store fails, it alone decides, and the costs recorded meanwhile
//!   are added to the store when it is back (same period). Budget reservations
//!   (`KeyLedger::reserve`) are the process's own: they bound this process's overshoot, not the
//!   fleet's.
//! - Rate-limit headers show the shared counts and the full limits; when the local counters
//!   decide, the process's counts (as without a store).
//!
//! Owns: `Grant::confirm`, the store's side of a grant's end, `Outage`, `resync`. Must not:
//! talk RESP or manage the connection (`store`).

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

use super::grant::{tpm_refusal, Pending};
use super::metrics::Reason;
use super::store::pipeline::Fault;
use super::store::resp::Reply;
use super::store::script::{self, Op, Verdict};
use super::store::Store;
use super::{limit_lines, secs_up, spend, Governance, Grant};
use crate::error::{Error, Kind};

/// What a store decision needs of a key, copied out of the keyring before the round trip.
struct Limits {
    name: Box<str>,
    rpm: Option<u64>,
    tpm: Option<u64>,
    max_in_flight: Option<u64>,
    /// The key's budget (from its ledger).
    budget: Option<spend::Budget>,
}

impl Limits {
    fn of(k: &super::Key, st: &super::KeyState) -> Limits {
        Limits {
            name: k.name.clone(),
            rpm: k.rpm,
            tpm: k.tpm,
            max_in_flight: k.max_in_flight,
            budget: st.ledger.as_deref().and_then(|l| l.budget()),
        }
    }
}

/// Requests and tokens one shard admitted on its own in a window while the store failed, and
/// the spend it recorded in a budget period meanwhile.
#[derive(Debug, Default)]
pub struct Outage {
    window: Cell<u64>,
    requests: Cell<u64>,
    tokens: Cell<u64>,
    /// (budget period start, nano-USD)
    spend: Cell<(i64, u64)>,
}

impl Outage {
    fn note_spend(&self, start: i64, nanos: u64) {
        let (p, n) = self.spend.get();
        let n = if p == start { n } else { 0 };
        self.spend.set((start, n.saturating_add(nanos)));
    }

    /// The spend noted for the period starting at `start`, cleared.
    fn take_spend(&self, start: i64) -> u64 {
        let (p, n) = self.spend.replace((0, 0));
        if p == start {
            n
        } else {
            0
        }
    }

    pub(super) fn note(&self, window: u64, requests: u64, tokens: u64) {
        if self.window.get() != window {
            self.window.set(window);
            self.requests.set(0);
            self.tokens.set(0);
        }
        self.requests
            .set(self.requests.get().saturating_add(requests));
        self.tokens.set(self.tokens.get().saturating_add(tokens));
    }

    /// What was noted for `window` (nothing for an older one), cleared.
    fn take(&self, window: u64) -> (u64, u64) {
        let noted = (self.requests.replace(0), self.tokens.replace(0));
        if self.window.get() == window {
            noted
        } else {
            (0, 0)
        }
    }
}

pub(super) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The answer when the store fails and `on_store_error = "closed"`.
pub(super) fn unavailable() -> Error {
    Error::new(
        Kind::LimitStoreDown,
        "the rate-limit store is unavailable, and this gateway refuses limited requests without it; retry later",
    )
    .retry_after(1)
}

/// The store failed a limits call: counted as a fallback; refused (503) when
/// `on_store_error = "closed"`, else the process's own counters decide.
fn fall_back(store: &Store) -> Result<(), Error> {
    if store.closed() {
        store.fell_back(true);
        return Err(unavailable());
    }
    store.fell_back(false);
    Ok(())
}

impl Governance {
    /// The head stage of a key with limits (or a budget) when a shared store is configured.
    pub(super) fn admit_shared(&self, i: u32, hdr_at: usize) -> Grant<'_> {
        match self.key(i) {
            Some((key, st))
                if key.rpm.is_none()
                    && key.max_in_flight.is_none()
                    && !st.ledger.as_deref().is_some_and(|l| l.has_budget()) =>
            {
                // only `tpm`: nothing to decide before the body
                st.in_flight.set(st.in_flight.get().saturating_add(1));
                Grant::new(self, i, hdr_at)
            }
            _ => Grant::deferred(self, i, hdr_at),
        }
    }

    /// Whether a shared store is configured.
    pub fn shares_limits(&self) -> bool {
        self.store.is_some()
    }

    /// A recorded cost of key `key`: into its budget period's spend in the store (or noted
    /// for when the store is back).
    pub(super) fn spend_shared(&self, key: u32, nanos: u64) {
        let (Some(store), Some((k, st))) = (&self.store, self.key(key)) else {
            return;
        };
        let Some(budget) = st.ledger.as_deref().and_then(|l| l.budget()) else {
            return;
        };
        let period = budget.period.as_str();
        let start = budget.period.start(spend::unix_now());
        let sk = script::spend_key(store.ns(), &k.name, period, start);
        if !store.add(&sk, nanos, script::spend_ttl_ms(period)) {
            st.outage.note_spend(start, nanos);
        }
    }

    /// Keep the shared store's connection (forever; nothing without a store).
    pub async fn maintain_store(&self) {
        if let Some(store) = &self.store {
            let (on_up, on_renew) = (|| self.resync(store), || self.renew_in_flight(store));
            let keep = store.maintain(&on_up, &on_renew);
            if store.leased() {
                // the refill task runs next to the connection, on this shard
                monoio::select! {
                    _ = keep => {}
                    _ = self.refill_leases(store) => {}
                }
            } else {
                keep.await;
            }
        }
    }

    /// On a Cluster, at each lease renewal: the per-key live keys of the keys this shard holds
    /// requests of (their in-flight counts are not dropped while it lives).
    fn renew_in_flight(&self, store: &Store) {
        let (Ok(ring), Ok(state)) = (self.ring.try_borrow(), self.state.try_borrow()) else {
            return;
        };
        for (key, st) in ring.keys.iter().zip(state.iter()) {
            if key.max_in_flight.is_some() && st.in_flight.get() > 0 {
                store.renew_in_flight(&script::in_flight_key(store.ns(), &key.name));
            }
        }
    }

    /// Right after (re)connecting, before the store is marked up: set this shard's in-flight
    /// count of every key with `max_in_flight`, and add what it admitted locally during the
    /// outage to the current window. Returns a note for the log.
    fn resync(&self, store: &Store) -> String {
        let (w, _) = script::window(unix_ms());
        let prefix = store.ns();
        let (mut requests, mut tokens, mut nanos) = (0, 0, 0);
        let (Ok(ring), Ok(state)) = (self.ring.try_borrow(), self.state.try_borrow()) else {
            return String::new();
        };
        for (key, st) in ring.keys.iter().zip(state.iter()) {
            if let Some(b) = st.ledger.as_deref().and_then(|l| l.budget()) {
                let start = b.period.start(spend::unix_now());
                let n = st.outage.take_spend(start);
                if n > 0 {
                    let sk = script::spend_key(prefix, &key.name, b.period.as_str(), start);
                    store.add(&sk, n, script::spend_ttl_ms(b.period.as_str()));
                    nanos = u64::saturating_add(nanos, n);
                }
            }
            if key.max_in_flight.is_some() {
                let hash = script::in_flight_key(prefix, &key.name);
                store.send(Op::Sync {
                    hash: &hash,
                    n: st.in_flight.get(),
                });
            }
            let (r, t) = st.outage.take(w);
            let counted = [
                ("rpm", r, key.rpm.is_some(), &mut requests),
                ("tpm", t, key.tpm.is_some(), &mut tokens),
            ];
            for (kind, n, limited, sum) in counted {
                if n > 0 && limited {
                    let k = script::window_key(prefix, kind, &key.name, w);
                    store.add(&k, n, script::WINDOW_TTL_MS);
                    *sum = u64::saturating_add(*sum, n);
                }
            }
        }
        if requests > 0 || tokens > 0 || nanos > 0 {
            format!(
                "; caught up {requests} requests and {tokens} tokens admitted locally in this window, {:.6} USD spent",
                nanos as f64 / spend::NANOS_PER_USD as f64
            )
        } else {
            String::new()
        }
    }
}

impl Grant<'_> {
    /// The store failed the head stage (exact or leased, in window `w`): refused when closed,
    /// else admitted by the process's own counters and noted in the key's `outage` (added to
    /// the store when it is back).
    pub(super) fn store_down(
        &mut self,
        store: &Store,
        outage: &Outage,
        w: u64,
        headers: &mut Vec<u8>,
    ) -> Result<(), Error> {
        fall_back(store)?;
        (self.tok_at, self.counted) = self.gov.admit_local(self.key, self.hdr_at, headers)?;
        self.holds = true;
        outage.note(w, 1, 0);
        Ok(())
    }

    /// Let the shared store decide what `admit` (head: `rpm`, `max_in_flight`) or
    /// `check_model` (`tpm`) left to it; nothing otherwise (a branch). Call after each.
    pub async fn confirm(&mut self, headers: &mut Vec<u8>) -> Result<(), Error> {
        match std::mem::replace(&mut self.pending, Pending::Nothing) {
            Pending::Nothing => Ok(()),
            Pending::Head => self.confirm_head(headers).await,
            Pending::Lease => self.confirm_lease(headers).await,
            Pending::Tokens { want, route } => self.confirm_tokens(want, route, headers).await,
        }
    }

    async fn confirm_head(&mut self, headers: &mut Vec<u8>) -> Result<(), Error> {
        let gov = self.gov;
        let Some(store) = &gov.store else {
            return Ok(());
        };
        // The key's view is copied out: no keyring borrow is held across the store's round trip
        // (the shard may take a new keyring snapshot meanwhile; slots are stable).
        let Some(key) = gov.key(self.key).map(|(k, st)| Limits::of(&k, &st)) else {
            return Ok(());
        };
        let (w, left_ms) = script::window(unix_ms());
        let prefix = store.ns();
        let rpm_key = script::window_key(prefix, "rpm", &key.name, w);
        let tpm_key = script::window_key(prefix, "tpm", &key.name, w);
        let hash = script::in_flight_key(prefix, &key.name);
        let now_s = spend::unix_now();
        let budget = key.budget;
        // (without a budget the script never reads it; named anyway so that on a Cluster every
        // key of the call is in one slot)
        let spend_key = match budget {
            Some(b) => {
                script::spend_key(prefix, &key.name, b.period.as_str(), b.period.start(now_s))
            }
            None => script::spend_key(prefix, &key.name, "none", 0),
        };
        let op = Op::Admit {
            rpm_key: &rpm_key,
            tpm_key: &tpm_key,
            hash: &hash,
            spend_key: &spend_key,
            rpm: key.rpm.unwrap_or(0),
            max_in_flight: key.max_in_flight.unwrap_or(0),
            tpm: key.tpm.unwrap_or(0),
            budget: budget.map_or(0, |b| b.nanos.max(1)),
        };
        let v = verdict(store, op, Verdict::admit).await;
        let Some((_, st)) = gov.key(self.key) else {
            return Ok(());
        };
        let v = match v {
            Ok(v) => v,
            Err(_) => return self.store_down(store, &st.outage, w, headers),
        };
        let reset = secs_up(std::time::Duration::from_millis(left_ms));
        headers.truncate(self.hdr_at);
        if let (3, Some(b)) = (v.code, budget) {
            let why = (b.nanos, v.spent);
            return Err(gov.budget_refusal(self.key, &key.name, why, b.period, now_s, headers));
        }
        if let Some(l) = key.rpm {
            limit_lines(headers, "requests", l, l.saturating_sub(v.requests), reset);
        }
        self.tok_at = headers.len();
        if let Some(l) = key.tpm {
            limit_lines(headers, "tokens", l, l.saturating_sub(v.tokens), reset);
        }
        let (reason, limit, secs) = match v.code {
            0 => {
                st.in_flight.set(st.in_flight.get().saturating_add(1));
                self.holds = true;
                // the process's own counters too: a fallback mid-window starts from them
                let c = gov.counters.slot(self.key);
                if key.rpm.is_some() {
                    c.rpm.charge(gov.counters.now(), 1);
                }
                if key.max_in_flight.is_some() {
                    c.enter_anyway();
                    self.counted = true;
                }
                return Ok(());
            }
            1 => (Reason::Rpm, key.rpm.unwrap_or(0), reset),
            _ => (Reason::InFlight, key.max_in_flight.unwrap_or(0), 1),
        };
        gov.metrics.rejected(Some(self.key), reason);
        Err(super::over_limit(&key.name, reason, limit, secs))
    }

    async fn confirm_tokens(
        &mut self,
        want: u64,
        route: usize,
        headers: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let gov = self.gov;
        let Some(store) = &gov.store else {
            return Ok(());
        };
        // copied out: nothing of the keyring is borrowed across the round trip
        let Some(key) = gov.key(self.key).map(|(k, st)| Limits::of(&k, &st)) else {
            return Ok(());
        };
        let Some(limit) = key.tpm else {
            return Ok(());
        };
        let (w, left_ms) = script::window(unix_ms());
        let tpm_key = script::window_key(store.ns(), "tpm", &key.name, w);
        let op = Op::Tokens {
            key: &tpm_key,
            limit,
            want,
        };
        let v = verdict(store, op, Verdict::tokens).await;
        if gov.key(self.key).is_none() {
            return Ok(());
        }
        let v = match v {
            Ok(v) => v,
            Err(_) => {
                fall_back(store)?;
                self.reserve_local(want, limit, headers)?;
                self.tokens_local = true;
                gov.metrics.request(self.key, route);
                return Ok(());
            }
        };
        let reset = secs_up(std::time::Duration::from_millis(left_ms));
        headers.truncate(self.tok_at);
        limit_lines(
            headers,
            "tokens",
            limit,
            limit.saturating_sub(v.tokens),
            reset,
        );
        if v.code != 0 {
            gov.metrics.rejected(Some(self.key), Reason::Tpm);
            return Err(tpm_refusal(&key.name, want, limit, reset));
        }
        self.shared_tokens = Some((w, want));
        // the process's own window too (reconciled on drop like a local reservation)
        let c = gov.counters.slot(self.key);
        self.reserved = Some((c.tpm.charge(gov.counters.now(), want), want));
        gov.metrics.request(self.key, route);
        Ok(())
    }

    /// The request ended: its in-flight slot in the store (when the store counts it).
    pub(super) fn release_shared(&self) {
        let gov = self.gov;
        let (Some(store), Some((key, _))) = (&gov.store, gov.key(self.key)) else {
            return;
        };
        if key.max_in_flight.is_some() {
            let hash = script::in_flight_key(store.ns(), &key.name);
            // not connected: the next connection's resync sets the count
            store.send(Op::Release { hash: &hash });
        }
    }

    /// The request ended having used `now_is` tokens: correct the store's window `window`
    /// (reserved `was` there), or — when the tokens were reserved locally (`window` None) —
    /// add them to the store's current window (or note them for when it is back).
    pub(super) fn reconcile_shared(&self, window: Option<u64>, was: u64, now_is: u64) {
        let gov = self.gov;
        let (Some(store), Some((key, st))) = (&gov.store, gov.key(self.key)) else {
            return;
        };
        if now_is == was {
            return;
        }
        let (cur, _) = script::window(unix_ms());
        // (hostile usage numbers: clamped to i64, the difference saturating)
        let int = |n: u64| n.min(i64::MAX as u64) as i64;
        let amount = match window {
            Some(w) if w == cur => int(now_is).saturating_sub(int(was)),
            // the window turned meanwhile (or the tokens were never in the store): the real
            // amount counts in the current one
            _ => int(now_is),
        };
        if amount == 0 {
            return;
        }
        let k = script::window_key(store.ns(), "tpm", &key.name, cur);
        let op = Op::Add {
            key: &k,
            amount,
            ttl_ms: script::WINDOW_TTL_MS,
        };
        if !store.send(op) && amount > 0 {
            st.outage.note(cur, 0, amount as u64);
        }
    }
}

/// Run `op` and read its reply with `read` (a reply that does not read is a store error).
async fn verdict(
    store: &Store,
    op: Op<'_>,
    read: fn(&Reply) -> Option<Verdict>,
) -> Result<Verdict, Fault> {
    let reply = store.eval(op).await?;
    read(&reply).ok_or_else(|| {
        store.reply_error(b"unexpected reply from the limits script");
        Fault::Reply
    })
}
