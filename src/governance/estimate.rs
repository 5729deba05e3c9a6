//! The token estimate a request reserves against its key's `tpm` before it is forwarded:
//! prompt bytes / 4 (the usual ~4 bytes per token) + the output cap the request asks for
//! (`max_tokens`, `max_completion_tokens` or `max_output_tokens`, read by `extract` in its one
//! pass over the body; none: 0, and the real usage is charged when the answer reports it).
//!
//! The same estimate, priced, is what a request reserves against its key's budget.
//!
//! Owns: `estimate`, `split`. Must not: parse the body again.

use crate::dialect::extract::RoutingFields;

/// Tokens to reserve for a body of `body_len` bytes with routing fields `fields` (saturating).
pub fn estimate(fields: &RoutingFields, body_len: usize) -> u64 {
    let (input, output) = split(fields, body_len);
    input.saturating_add(output)
}

/// The estimate as (input, output) tokens (what its cost is priced as).
pub fn split(fields: &RoutingFields, body_len: usize) -> (u64, u64) {
    (body_len as u64 / 4, fields.max_tokens.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::extract::routing_fields;

    #[test]
    fn prompt_bytes_and_caps() {
        let est = |b: &[u8]| estimate(&routing_fields(b).unwrap(), b.len());
        let b = br#"{"model":"m","max_tokens":100,"messages":[]}"#;
        assert_eq!(est(b), b.len() as u64 / 4 + 100);
        let b = br#"{"model":"m","input":"hi","max_output_tokens":7}"#;
        assert_eq!(est(b), b.len() as u64 / 4 + 7);
        let b = br#"{"model":"m","max_completion_tokens":9}"#;
        assert_eq!(est(b), b.len() as u64 / 4 + 9);
        let b = br#"{"model":"m","max_tokens":null,"nested":{"max_tokens":5}}"#;
        assert_eq!(est(b), b.len() as u64 / 4, "top level only");
    }
}
