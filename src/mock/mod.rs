//! `ringgate mock`: the project's own upstream simulator, used by tests, benches and the
//! embedded default config (as an in-process provider).
//!
//! Owns: latency profiles, request knobs (`max_tokens` picks the output size), and the
//! per-dialect response writers (`chat` today; more dialects and fault injection grow here as
//! sibling files). Must not: depend on the gateway pipeline — the gateway calls `respond`, the
//! standalone server in `server` calls the same function.

pub mod chat;
pub mod server;
pub mod text;

use std::time::Duration;

use sonic_rs::JsonValueTrait;

/// Latency profile (see ../shared/bench-protocol.md "Mock profiles").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Answer at once.
    Instant,
    /// Non-stream after 50 ms; streams send headers at once, the first content token at 50 ms,
    /// and spread the output over a fixed 500 ms span.
    Seed,
}

impl Profile {
    pub fn parse(s: &str) -> Option<Profile> {
        match s {
            "instant" => Some(Profile::Instant),
            "seed" => Some(Profile::Seed),
            _ => None,
        }
    }

    pub fn first_token_delay(self) -> Duration {
        match self {
            Profile::Instant => Duration::ZERO,
            Profile::Seed => Duration::from_millis(50),
        }
    }

    pub fn stream_span(self) -> Duration {
        match self {
            Profile::Instant => Duration::ZERO,
            Profile::Seed => Duration::from_millis(500),
        }
    }
}

/// Output tokens when the request does not say.
pub const DEFAULT_OUTPUT_TOKENS: u32 = 16;
/// Hard cap on generated output tokens.
pub const MAX_OUTPUT_TOKENS: u32 = 100_000;

/// What the mock reads from a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockRequest {
    pub model: String,
    pub stream: bool,
    pub output_tokens: u32,
    pub include_usage: bool,
    /// Rough prompt size (bytes / 4), reported as usage.
    pub input_tokens: u32,
}

impl MockRequest {
    pub fn parse(body: &[u8]) -> Result<MockRequest, String> {
        let mut tree = sonic_rs::PointerTree::new();
        tree.add_path(["model"].iter());
        tree.add_path(["stream"].iter());
        tree.add_path(["max_tokens"].iter());
        tree.add_path(["max_completion_tokens"].iter());
        tree.add_path(["stream_options", "include_usage"].iter());
        let nodes =
            sonic_rs::get_many(body, &tree).map_err(|e| format!("invalid JSON body: {e}"))?;
        let get = |i: usize| nodes.get(i).and_then(|n| n.as_ref());
        let model = get(0)
            .and_then(|v| v.as_str())
            .ok_or("missing \"model\"")?
            .to_string();
        let stream = get(1).and_then(|v| v.as_bool()).unwrap_or(false);
        let max = get(3)
            .and_then(|v| v.as_u64())
            .or_else(|| get(2).and_then(|v| v.as_u64()))
            .map_or(DEFAULT_OUTPUT_TOKENS, |n| {
                n.min(u64::from(MAX_OUTPUT_TOKENS)) as u32
            });
        let include_usage = get(4).and_then(|v| v.as_bool()).unwrap_or(false);
        Ok(MockRequest {
            model,
            stream,
            output_tokens: max.max(1),
            include_usage,
            input_tokens: (body.len() / 4).max(1) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_knobs() {
        let r = MockRequest::parse(br#"{"model":"m","messages":[],"stream":true,"max_tokens":7,"stream_options":{"include_usage":true}}"#).unwrap();
        assert_eq!(
            (r.model.as_str(), r.stream, r.output_tokens, r.include_usage),
            ("m", true, 7, true)
        );
        let r = MockRequest::parse(br#"{"model":"m","max_completion_tokens":3}"#).unwrap();
        assert_eq!((r.stream, r.output_tokens), (false, 3));
        assert!(MockRequest::parse(br#"{"messages":[]}"#).is_err());
        assert!(MockRequest::parse(b"{nope").is_err());
    }
}
