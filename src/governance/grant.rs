//! One admitted keyed request: it holds its key's in-flight slot and its token reservation
//! until it ends, however it ends (`Drop`), and then reconciles the reservation with the usage
//! the answer reported.
//!
//! Owns: `Grant` — the model check and TPM reservation after the body is read, the rate-limit
//! header lines, the reconciliation. Must not: do IO or outlive its request.

use std::time::Instant;

use super::metrics::Reason;
use super::usage::UsageScan;
use super::Governance;
use crate::error::{Error, Kind};
use crate::extract::RoutingFields;
use crate::provider::Op;
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
    /// Reads the answer's usage (only when a reservation is to be reconciled).
    usage: Option<UsageScan>,
    /// Status of the upstream answer, once its head arrived.
    answered: Option<u16>,
}

impl<'g> Grant<'g> {
    pub(super) fn new(gov: &'g Governance, key: u32, tok_at: usize) -> Grant<'g> {
        Grant {
            gov,
            key,
            tok_at,
            reserved: None,
            usage: None,
            answered: None,
        }
    }

    /// After the body's model is known (and routed to route `route`): the key's allow-list
    /// (403) and, for operations that generate or embed tokens (not `count_tokens`), its token
    /// window (429; reserves prompt bytes / 4 + the output cap).
    pub fn check_model(
        &mut self,
        fields: &RoutingFields,
        route: usize,
        op: Op,
        body_len: usize,
        headers: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let gov = self.gov;
        let model = fields.model.as_str();
        let Some((key, st)) = gov.key(self.key) else {
            return Ok(());
        };
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
                Ok(generation) => {
                    self.reserved = Some((generation, want));
                    self.usage = Some(UsageScan::default());
                }
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
        gov.metrics.request(self.key, route);
        Ok(())
    }

    /// The upstream answer's head arrived: note its status, and when this key's own
    /// `x-ratelimit-*` lines are sent, drop the provider's (they describe the provider key,
    /// shared by every client, and would duplicate ours).
    pub fn on_answer(&mut self, head: &mut ResponseHead) {
        self.answered = Some(head.status);
        let Some((key, _)) = self.gov.key(self.key) else {
            return;
        };
        if key.rpm.is_some() || key.tpm.is_some() {
            strip_ratelimit_lines(&mut head.forward);
        }
    }

    /// Where the relayed answer's bytes go to have their usage read (when it is needed).
    pub fn usage(&mut self) -> Option<&mut UsageScan> {
        self.usage.as_mut()
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        let Some((_, st)) = self.gov.key(self.key) else {
            return;
        };
        st.in_flight.set(st.in_flight.get().saturating_sub(1));
        let Some((generation, was)) = self.reserved else {
            return;
        };
        let reported = self.usage.as_ref().and_then(UsageScan::tokens);
        let now_is = match (reported, self.answered) {
            (Some(t), _) => t,
            // answered, usage not reported (e.g. a stream without a usage chunk, a
            // translated answer): the estimate stands
            (None, Some(s)) if (200..300).contains(&s) => was,
            // no answer, or an error answer: nothing was generated
            _ => 0,
        };
        if now_is != was {
            st.tpm.correct(Instant::now(), generation, was, now_is);
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
