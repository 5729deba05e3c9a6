//! One admitted keyed request: it holds its key's in-flight slot, its token reservation and its
//! budget reservation (the estimate's cost) until it ends, however it ends (`Drop`), and then
//! records the usage the answer reported (tokens, spend at the answering deployment's price) in
//! the key's metrics and ledger, reconciles the token reservation with it and gives the budget
//! reservation back. With a shared limits store, what the store must
//! decide is left `pending` for `confirm` (in `governance::shared`, which also does the store's
//! side of `Drop`).
//!
//! A traced request without a key gets a `Grant::unkeyed`: it holds and records nothing, and
//! only carries the answer's scan (usage, and what the trace asks) through `answer`.
//!
//! Owns: `Grant` — the model check, the TPM and budget reservations after the body is read, the
//! rate-limit header lines, the reconciliation and the usage record. Must not: do IO itself or outlive
//! its request.

use super::metrics::Reason;
use super::spend::{unix_now, Price};
use super::usage::UsageScan;
use super::window::Tick;
use super::Governance;
use crate::config::provider::Op;
use crate::dialect::extract::RoutingFields;
use crate::error::{Error, Kind};
use crate::route::{Deployment, Route};
use crate::upstream::ResponseHead;

/// What a shared store has yet to decide for a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pending {
    Nothing,
    /// `rpm` and `max_in_flight` (the head stage).
    Head,
    /// A leased key's request that found no units left (`lease`).
    Lease,
    /// `want` tokens against `tpm`, for route `route` (after the body).
    Tokens {
        want: u64,
        route: usize,
    },
}

/// The key index of an `unkeyed` grant (no key has it: every key lookup misses).
const NO_KEY: u32 = u32::MAX;

#[derive(Debug)]
pub struct Grant<'g> {
    pub(super) gov: &'g Governance,
    pub(super) key: u32,
    /// Where this request's `x-ratelimit-*` lines start in the response header lines.
    pub(super) hdr_at: usize,
    /// Where this request's `x-ratelimit-*-tokens` lines start in the response header lines
    /// (the last lines there until the reservation rewrites them).
    pub(super) tok_at: usize,
    /// Whether this request counts in this shard's in-flight count of its key (given back on
    /// drop, with the shared store's).
    pub(super) holds: bool,
    /// Whether this request counts in the process's in-flight count of its key (given back on
    /// drop).
    pub(super) counted: bool,
    /// Nano-USD reserved in the key's ledger (given back when the request ends).
    budget_held: u64,
    pub(super) pending: Pending,
    /// (window start, tokens) reserved against `tpm` in the process's window.
    pub(super) reserved: Option<(Tick, u64)>,
    /// (wall-clock window, tokens) reserved in the shared store.
    pub(super) shared_tokens: Option<(u64, u64)>,
    /// Tokens were reserved locally because the shared store failed (the real amount is added
    /// to the store, now or when it is back).
    pub(super) tokens_local: bool,
    /// Reads the answer's usage.
    usage: UsageScan,
    /// Status of the upstream answer, once its head arrived.
    answered: Option<u16>,
    /// The model (route index) the client asked for, and its own price.
    requested: Option<(usize, Price)>,
    /// The model (requested or fallback) and price of the deployment that answered.
    answered_by: Option<(usize, Price)>,
    /// Usage recorded and reservation reconciled (`finish`).
    finished: bool,
}

impl<'g> Grant<'g> {
    /// An admitted request (its in-flight count already taken).
    pub(super) fn new(gov: &'g Governance, key: u32, tok_at: usize) -> Grant<'g> {
        let mut g = Grant::deferred(gov, key, tok_at);
        g.holds = true;
        g.pending = Pending::Nothing;
        g
    }

    /// A request whose head-stage limits the shared store decides (`confirm`).
    pub(super) fn deferred(gov: &'g Governance, key: u32, hdr_at: usize) -> Grant<'g> {
        Grant {
            gov,
            key,
            hdr_at,
            tok_at: hdr_at,
            holds: false,
            counted: false,
            budget_held: 0,
            pending: Pending::Head,
            reserved: None,
            shared_tokens: None,
            tokens_local: false,
            usage: UsageScan::default(),
            answered: None,
            requested: None,
            answered_by: None,
            finished: false,
        }
    }

    /// A surface call (files, audio, images, …) that names `model`, routed to `route`: the
    /// key's allow-list (403) and the request counted for the model; no token estimate (these
    /// answers report no tokens the gateway reads).
    pub fn check_model_name(&mut self, model: &str, route: &Route) -> Result<(), Error> {
        if self.gov.key(self.key).is_none() {
            return Ok(());
        }
        self.allow(model, route)?;
        self.gov.metrics.request(self.key, route.index);
        Ok(())
    }

    /// The key's allow-list for `model` (403, counted), routed to `route` (a keyed grant).
    fn allow(&mut self, model: &str, route: &Route) -> Result<(), Error> {
        let gov = self.gov;
        self.requested = Some((route.index, route.price));
        match gov.key(self.key) {
            Some((key, _)) if !key.allows(model) => {
                gov.metrics.rejected(Some(self.key), Reason::ForbiddenModel);
                Err(Error::new(
                    Kind::ModelNotAllowed,
                    format!(
                        "the API key {:?} may not use the model `{model}`",
                        &*key.name
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// A traced request without a key: a grant that holds nothing and records nothing, and
    /// only reads the answer (its usage, and what `UsageScan::observe` asks) for the trace.
    pub fn unkeyed(gov: &'g Governance) -> Grant<'g> {
        let mut g = Grant::deferred(gov, NO_KEY, 0);
        g.pending = Pending::Nothing;
        g
    }

    /// Whether this grant is a key's (not `unkeyed`).
    pub fn keyed(&self) -> bool {
        self.key != NO_KEY
    }

    /// After the body's model is known (and routed to route `route`): the key's allow-list
    /// (403) and, for operations that generate or embed tokens (not `count_tokens`), its
    /// budget (429 `insufficient_quota`; reserves the estimate's cost at the route's dearest
    /// deployment) and its token window (429; reserves prompt bytes / 4 + the output cap).
    pub fn check_model(
        &mut self,
        fields: &RoutingFields,
        route: &Route,
        op: Op,
        body_len: usize,
        headers: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let gov = self.gov;
        let model = fields.model.as_str();
        let Some((key, st)) = gov.key(self.key) else {
            return Ok(());
        };
        self.allow(model, route)?;
        if op == Op::CountTokens {
            gov.metrics.request(self.key, route.index);
            return Ok(());
        }
        if let Some(l) = st.ledger.as_deref().filter(|l| l.has_budget()) {
            let (input, output) = super::estimate::split(fields, body_len);
            let nanos = dearest(route).cost_nanos(input, output);
            let now = unix_now();
            l.release(std::mem::take(&mut self.budget_held));
            match l.reserve(now, nanos) {
                Ok(held) => self.budget_held = held,
                Err(why) => {
                    let period = l.period();
                    return Err(gov.budget_refusal(self.key, &key.name, why, period, now, headers));
                }
            }
        }
        if let Some(limit) = key.tpm {
            let want = super::estimate::estimate(fields, body_len);
            if gov.store.is_some() {
                // the shared store decides (`confirm`), then counts the request
                self.pending = Pending::Tokens {
                    want,
                    route: route.index,
                };
                return Ok(());
            }
            self.reserve_local(want, limit, headers)?;
        }
        gov.metrics.request(self.key, route.index);
        Ok(())
    }

    /// Reserve `want` tokens against the key's `limit` in the process's window (429 when they
    /// do not fit).
    pub(super) fn reserve_local(
        &mut self,
        want: u64,
        limit: u64,
        headers: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let gov = self.gov;
        let Some((key, _)) = gov.key(self.key) else {
            return Ok(());
        };
        let c = gov.counters.slot(self.key);
        let now = gov.counters.now();
        match c.tpm.take(now, want, limit) {
            Ok(generation) => {
                self.reserved = Some((generation, want));
                gov.token_headers(self.key, now, self.tok_at, headers);
                Ok(())
            }
            Err(full) => {
                gov.token_headers(self.key, now, self.tok_at, headers);
                gov.metrics.rejected(Some(self.key), Reason::Tpm);
                let secs = super::window::secs_up(full.retry_after);
                Err(tpm_refusal(&key.name, want, limit, secs))
            }
        }
    }

    /// Tokens this request used, as far as known when it ends, given `was` reserved.
    fn used(&self, was: u64) -> u64 {
        match (self.usage.io().map(|(i, o)| i + o), self.answered) {
            (Some(t), _) => t,
            // answered, usage not reported (e.g. a stream from an upstream with the
            // `no_stream_options` quirk): the estimate stands
            (None, Some(s)) if (200..300).contains(&s) => was,
            // no answer, or an error answer: nothing was generated
            _ => 0,
        }
    }

    /// The upstream answer's head arrived from `by` (the answering model and deployment;
    /// `None`: answered by the gateway itself) in `dialect`: note its status and who prices
    /// it, and when this key's own `x-ratelimit-*` lines are sent, drop the provider's (they
    /// describe the provider key, shared by every client, and would duplicate ours).
    pub fn on_answer(
        &mut self,
        head: &mut ResponseHead,
        by: Option<(&Route, &Deployment)>,
        dialect: crate::dialect::Dialect,
    ) {
        self.answered = Some(head.status);
        self.answered_by = by.map(|(r, d)| (r.index, d.price));
        self.usage.restart(dialect, head.is_event_stream());
        let Some((key, _)) = self.gov.key(self.key) else {
            return;
        };
        if key.rpm.is_some() || key.tpm.is_some() {
            strip_ratelimit_lines(&mut head.forward);
        }
    }

    /// Where the relayed answer's bytes go to have their usage read (or, for translated
    /// answers, where the translator's usage is set).
    /// The key's name (the guardrails it adds).
    pub fn key_name(&self) -> Option<std::cell::Ref<'_, str>> {
        self.gov.key_name(self.key)
    }

    /// The key's MCP tool globs as they are now (`None`: every tool; a key gone since `admit`:
    /// none).
    pub fn mcp_tools(&self) -> Option<std::sync::Arc<[Box<str>]>> {
        match self.gov.key(self.key) {
            Some((k, _)) => k.mcp_tools.clone(),
            None => Some(std::sync::Arc::from(Vec::new())),
        }
    }

    pub fn usage(&mut self) -> &mut UsageScan {
        &mut self.usage
    }
}

impl Grant<'_> {
    /// The answer is complete (its last bytes are about to go to the client): record its usage
    /// and reconcile the token reservation now, so that the client's next request already sees
    /// them (a budget spent by this answer refuses the next one). Once per request; `Drop`
    /// does it for requests that end otherwise.
    pub fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let Some((_, st)) = self.gov.key(self.key) else {
            return;
        };
        let io = self.usage.io();
        // A successful answer is recorded (tokens: what it reported, 0 when nothing was).
        if self.answered.is_some_and(|s| s < 400) {
            if let Some((route, price)) = self.answered_by.or(self.requested) {
                self.gov
                    .record(self.key, route, io.unwrap_or((0, 0)), price);
            }
        }
        // given back after the real cost is in the ledger: a request checked meanwhile sees
        // one or both, never neither
        if let Some(l) = st.ledger.as_deref() {
            l.release(std::mem::take(&mut self.budget_held));
        }
        if let Some((start, was)) = self.reserved {
            let now_is = self.used(was);
            if now_is != was {
                let c = self.gov.counters.slot(self.key);
                c.tpm.correct(self.gov.counters.now(), start, was, now_is);
            }
        }
        if let Some((window, was)) = self.shared_tokens {
            self.reconcile_shared(Some(window), was, self.used(was));
        } else if let (true, Some((_, was))) = (self.tokens_local, self.reserved) {
            self.reconcile_shared(None, 0, self.used(was));
        }
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        self.finish();
        if self.counted {
            self.gov.counters.slot(self.key).leave();
        }
        if let Some((_, st)) = self.gov.key(self.key) {
            if self.holds {
                st.in_flight.set(st.in_flight.get().saturating_sub(1));
                self.release_shared();
            }
        }
    }
}

/// The dearest per-token prices among `route`'s deployments (and its own): what an estimate is
/// priced at before the answering deployment is known.
fn dearest(route: &Route) -> Price {
    route.deployments.iter().fold(route.price, |p, d| Price {
        input_pico: p.input_pico.max(d.price.input_pico),
        output_pico: p.output_pico.max(d.price.output_pico),
    })
}

/// The 429 for tokens that do not fit `limit`.
pub(super) fn tpm_refusal(name: &str, want: u64, limit: u64, secs: u64) -> Error {
    let what = if want > limit {
        format!("this request alone (~{want} tokens) is over")
    } else {
        "the request would go over".to_string()
    };
    Error::new(
        Kind::RateLimited,
        format!(
            "rate limit: {what} the API key {name:?}'s {limit} tokens per minute; retry in {secs} s"
        ),
    )
    .retry_after(secs.min(u64::from(u32::MAX)) as u32)
}

/// Remove `x-ratelimit-*` lines from raw CRLF header lines.
fn strip_ratelimit_lines(lines: &mut Vec<u8>) {
    const PREFIX: &[u8] = b"x-ratelimit-";
    let has = |l: &[u8]| l.len() >= PREFIX.len() && l[..PREFIX.len()].eq_ignore_ascii_case(PREFIX);
    if !lines.split(|&b| b == b'\n').any(has) {
        return;
    }
    let mut kept = Vec::with_capacity(lines.len());
    for line in lines.split_inclusive(|&b| b == b'\n') {
        if !has(line) {
            kept.extend_from_slice(line);
        }
    }
    *lines = kept;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ratelimit_lines_are_dropped() {
        let mut l =
            b"x-request-id: a\r\nX-RateLimit-Remaining-Requests: 9\r\nretry-after: 1\r\nx-ratelimit-limit-tokens: 5\r\n"
                .to_vec();
        strip_ratelimit_lines(&mut l);
        assert_eq!(l, b"x-request-id: a\r\nretry-after: 1\r\n");
    }
}
