//! What a provider's 429 limited: the API key for the model the request asked for (the
//! default), or the whole key (every model behind it). `keys::KeyRing` cools accordingly.
//!
//! The rule, from the providers' documented 429 semantics:
//! - OpenAI (and Azure OpenAI, and the OpenAI-compatible servers that copy its errors): rate
//!   limits are per model within an organization/project (`rate_limit_exceeded`, "Rate limit
//!   reached for <model> …"): key × model. `insufficient_quota` (as `error.type` or
//!   `error.code`: the organization or project has no credit or hit its spend/usage limit —
//!   the billing codes `credit_balance_exhausted`, `organization_spend_limit_exceeded`,
//!   `project_spend_limit_exceeded`, `organization_usage_limit_exceeded` all carry that type)
//!   stops every model: whole key.
//! - Anthropic: limits (RPM, input and output tokens per minute) are per model class within an
//!   organization or workspace (`rate_limit_error`, `anthropic-ratelimit-*` headers): key ×
//!   model. A 429 with `anthropic-ratelimit-unified-status: rejected` is the account-wide
//!   window that covers every model: whole key.
//! - Gemini: `RESOURCE_EXHAUSTED` quotas are per project, most per model (`QuotaFailure`
//!   violations with a `…PerModel…` quota id or a `model` dimension): key × model; a
//!   `QuotaFailure` none of whose violations is per model: whole key.
//!
//! Only what arrived with the response head is looked at (the headers, and the body bytes read
//! together with them, still framed — a provider's small JSON error nearly always is): the
//! answer is then relayed or retried untouched. Nothing found: key × model. Bytes are matched,
//! never parsed, and at most `LOOK_BYTES` of them.
//!
//! Owns: `whole_key`. Must not: read more of the body or do IO.

/// Body bytes looked at.
const LOOK_BYTES: usize = 16 * 1024;

fn has(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Whether a 429 with the forwarded header lines `forward` (`name: value\r\n` each) and the
/// body bytes `body` (those that came with the head) limits the whole key (see the module doc).
pub fn whole_key(forward: &[u8], body: &[u8]) -> bool {
    let unified = forward.split(|&b| b == b'\n').any(|l| {
        let Some(colon) = l.iter().position(|&b| b == b':') else {
            return false;
        };
        let (name, value) = l.split_at(colon);
        crate::http::head::trim(name).eq_ignore_ascii_case(b"anthropic-ratelimit-unified-status")
            && crate::http::head::trim(&value[1..]).eq_ignore_ascii_case(b"rejected")
    });
    if unified {
        return true;
    }
    let body = &body[..body.len().min(LOOK_BYTES)];
    if has(body, b"\"insufficient_quota\"") {
        return true;
    }
    has(body, b"QuotaFailure") && !has(body, b"PerModel") && !has(body, b"\"model\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_key_or_key_times_model() {
        let openai_rate = br#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on requests per min (RPM)","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        let openai_quota = br#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let openai_spend = br#"{"error":{"message":"x","type":"insufficient_quota","code":"project_spend_limit_exceeded"}}"#;
        let anthropic = br#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#;
        let gemini_model = br#"{"error":{"code":429,"message":"You exceeded your current quota","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.5-pro"}}]}]}}"#;
        let gemini_project = br#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProject"}]}]}}"#;
        let cases: [(&[u8], &[u8], bool); 9] = [
            (b"", openai_rate, false),
            (b"", openai_quota, true),
            (b"", openai_spend, true),
            (
                b"anthropic-ratelimit-requests-remaining: 0\r\n",
                anthropic,
                false,
            ),
            (
                b"retry-after: 7\r\nanthropic-ratelimit-unified-status: rejected\r\n",
                anthropic,
                true,
            ),
            (
                b"anthropic-ratelimit-unified-status: allowed\r\n",
                anthropic,
                false,
            ),
            (b"", gemini_model, false),
            (b"", gemini_project, true),
            (b"", b"<html>too many</html>", false),
        ];
        for (h, b, want) in cases {
            assert_eq!(whole_key(h, b), want, "{}", String::from_utf8_lossy(b));
        }
        // only the first LOOK_BYTES are looked at
        let mut far = vec![b' '; LOOK_BYTES];
        far.extend_from_slice(b"\"insufficient_quota\"");
        assert!(!whole_key(b"", &far));
    }
}
