//! One model request as it travels down the stages once it is routed (`Call`): what the client
//! asked (dialect, operation, the body's routing fields), where it goes (the routing it runs
//! on, its model's route), what it holds (the permit, a key's grant) and what its attempts did
//! (`Tried`). The pipeline builds it after governance and the guardrails; `forward::open`, the
//! answer (`answer::write`) and the cache (`cache::serve::lookup`) take it instead of its
//! parts.
//!
//! Owns: `Call`, `Tried`. Must not: do IO or decide anything (a carrier; its parts decide).

use crate::admit::Permit;
use crate::config::provider::Op;
use crate::dialect::extract::RoutingFields;
use crate::dialect::Dialect;
use crate::forward::live::Routing;
use crate::governance::Grant;
use crate::route::Route;
use crate::upstream::headers::ClientHeaders;

/// One routed model request (see the module doc). `'s`: the request's own span (its routing,
/// its fields and permit, the shard's parts its grant reads).
pub struct Call<'s> {
    /// The client's dialect and operation (from the path).
    pub dialect: Dialect,
    pub op: Op,
    /// What the body says for routing (model, stream, usage option, tenant, metered).
    pub fields: &'s RoutingFields,
    /// The routing this request runs on to its end (a reload swaps it for the next request).
    pub routing: &'s Routing,
    /// The requested model's route in it.
    pub route: &'s Route,
    /// The client headers the header policy forwards (`upstream::headers`).
    pub headers: &'s ClientHeaders,
    /// The request's share of the shard's memory budget (every copy it makes is charged here).
    pub permit: &'s Permit,
    /// A keyed request's limits, usage and spend (`None`: keys off or open).
    pub grant: Option<Grant<'s>>,
    /// What the attempts did (the client's `x-ringgate-provider` / `-attempts` headers).
    pub tried: Tried<'s>,
    /// Whether the connection may carry another request once this one is answered.
    pub keep_alive: bool,
    /// When forwarding started (the routing plan's deadline counts from it).
    pub start: std::time::Instant,
}

/// What the attempts of one request did, for the client's `x-ringgate-provider` and
/// `x-ringgate-attempts` headers (filled whether or not an answer came).
#[derive(Debug, Default)]
pub struct Tried<'s> {
    /// The provider of the last attempt.
    pub provider: Option<&'s str>,
    /// The deployment of the last attempt: (route index, deployment index).
    pub served: Option<(u32, u32)>,
    pub attempts: u32,
    /// The request's span state while it is traced: each attempt adds its CLIENT span.
    pub otel: Option<Box<crate::telemetry::Request>>,
}

impl Tried<'_> {
    /// Append the two header lines (nothing when no attempt was made).
    pub fn write_headers(&self, out: &mut Vec<u8>) {
        let Some(p) = self.provider else { return };
        out.extend_from_slice(b"x-ringgate-provider: ");
        out.extend_from_slice(p.as_bytes());
        out.extend_from_slice(b"\r\nx-ringgate-attempts: ");
        // the digits written in place (a `to_string` was an allocation per request)
        crate::util::decimal::push_u64(out, u64::from(self.attempts));
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::Tried;

    #[test]
    fn the_header_lines_name_the_provider_and_count_the_attempts() {
        let mut out = b"x: 1\r\n".to_vec();
        Tried::default().write_headers(&mut out);
        assert_eq!(out, b"x: 1\r\n", "no attempt, no lines");
        let t = Tried {
            provider: Some("openai"),
            attempts: 12,
            ..Tried::default()
        };
        t.write_headers(&mut out);
        assert_eq!(
            out,
            b"x: 1\r\nx-ringgate-provider: openai\r\nx-ringgate-attempts: 12\r\n"
        );
    }
}
