//! One admitted keyed request: it holds its key's in-flight slot and its token reservation
//! until it ends, however it ends (`Drop`), and then reconciles the reservation with the usage
//! the answer reported and records that usage (tokens, spend at the answering deployment's
//! price) in the key's metrics and ledger.
//!
//! Owns: `Grant` — the model check and TPM reservation after the body is read, the rate-limit
//! header lines, the reconciliation and the usage record. Must not: do IO or outlive its
//! request.

use std::time::Instant;

use super::metrics::Reason;
use super::spend::Price;
use super::usage::UsageScan;
use super::Governance;
use crate::error::{Error, Kind};
use crate::extract::RoutingFields;
use crate::provider::Op;
use crate::route::{Deployment, Route};
use crate::upstream::ResponseHead;

#[derive(Debug)]
pub struct Grant<'g> {
    pub(super) gov: &'g Governance,
    pub(super) key: u32,
    /// Where this request's `x-ratelimit-*-tokens` lines start in the response header lines
    /// (the last lines there until the reservation rewrites them).
    pub(super) tok_at: usize,
    /// (window generation, tokens) reserved against `tpm`.
    reserved: Option<(u32, u64)>,
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
    pub(super) fn new(gov: &'g Governance, key: u32, tok_at: usize) -> Grant<'g> {
        Grant {
            gov,
            key,
            tok_at,
            reserved: None,
            usage: UsageScan::default(),
            answered: None,
            requested: None,
            answered_by: None,
            finished: false,
        }
    }

    /// After the body's model is known (and routed to route `route`): the key's allow-list
    /// (403) and, for operations that generate or embed tokens (not `count_tokens`), its token
    /// window (429; reserves prompt bytes / 4 + the output cap).
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
        self.requested = Some((route.index, route.price));
        if !key.allows(model) {
            gov.metrics.rejected(Some(self.key), Reason::ForbiddenModel);
            return Err(Error::new(
                Kind::ModelNotAllowed,
                format!(
                    "the API key {:?} may not use the model `{model}`",
                    &*key.name
                ),
            ));
        }
        if let Some(limit) = st.share.tpm.filter(|_| op != Op::CountTokens) {
            let now = Instant::now();
            let want = super::estimate::estimate(fields, body_len);
            match st.tpm.take(now, want, limit) {
                Ok(generation) => self.reserved = Some((generation, want)),
                Err(full) => {
                    gov.token_headers(self.key, now, self.tok_at, headers);
                    gov.metrics.rejected(Some(self.key), Reason::Tpm);
                    let secs = super::window::secs_up(full.retry_after);
                    let what = if want > limit {
                        format!("this request alone (~{want} tokens) is over")
                    } else {
                        "the request would go over".to_string()
                    };
                    return Err(Error::new(
                        Kind::RateLimited,
                        format!(
                            "rate limit: {what} the API key {:?}'s {limit} tokens per minute; retry in {secs} s",
                            &*key.name
                        ),
                    )
                    .retry_after(secs as u32));
                }
            }
            gov.token_headers(self.key, now, self.tok_at, headers);
        }
        gov.metrics.request(self.key, route.index);
        Ok(())
    }

    /// The upstream answer's head arrived from `by` (the answering model and deployment;
    /// `None`: answered by the gateway itself) in `dialect`: note its status and who prices
    /// it, and when this key's own `x-ratelimit-*` lines are sent, drop the provider's (they
    /// describe the provider key, shared by every client, and would duplicate ours).
    pub fn on_answer(
        &mut self,
        head: &mut ResponseHead,
        by: Option<(&Route, &Deployment)>,
        dialect: crate::translate::Dialect,
    ) {
        self.answered = Some(head.status);
        self.answered_by = by.map(|(r, d)| (r.index, d.price));
        self.usage = UsageScan::new(dialect);
        let Some((key, _)) = self.gov.key(self.key) else {
            return;
        };
        if key.rpm.is_some() || key.tpm.is_some() {
            strip_ratelimit_lines(&mut head.forward);
        }
    }

    /// Where the relayed answer's bytes go to have their usage read (or, for translated
    /// answers, where the translator's usage is set).
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
        let Some((generation, was)) = self.reserved else {
            return;
        };
        let reported = io.map(|(i, o)| i + o);
        let now_is = match (reported, self.answered) {
            (Some(t), _) => t,
            // answered, usage not reported (e.g. a stream from an upstream with the
            // `no_stream_options` quirk): the estimate stands
            (None, Some(s)) if (200..300).contains(&s) => was,
            // no answer, or an error answer: nothing was generated
            _ => 0,
        };
        if now_is != was {
            st.tpm.correct(Instant::now(), generation, was, now_is);
        }
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        self.finish();
        if let Some((_, st)) = self.gov.key(self.key) {
            st.in_flight.set(st.in_flight.get().saturating_sub(1));
        }
    }
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
