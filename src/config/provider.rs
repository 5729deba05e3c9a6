//! Providers: the `[[provider]]` section and the closed set of upstream families ringgate
//! speaks to.
//!
//! Owns: `ProviderConfig` (one `[[provider]]` section), `ProviderKind` (the one enum every
//! provider-specific decision matches on) and the per-kind facts that do not need IO: which wire
//! dialect it speaks, which auth header it takes, and the upstream path for an endpoint.
//! Must not: build bodies or open connections (translation lives in `dialect`, IO in `upstream`).

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    #[serde(rename = "openai")]
    OpenAi,
    #[serde(rename = "openai-compatible")]
    OpenAiCompatible,
    Anthropic,
    Gemini,
    Azure,
    /// AWS Bedrock's Converse API (SigV4 or a Bedrock API key; `upstream::bedrock`).
    Bedrock,
    /// Google Vertex AI: Gemini models (`publishers/google`) and Anthropic models
    /// (`publishers/anthropic`, `rawPredict`), with OAuth tokens (`upstream::vertex`).
    Vertex,
    /// The in-process mock (no network): what the embedded default config serves.
    Mock,
}

use crate::config::engines::EngineKind;
use crate::config::routing::ApiKeyConfig;
pub use crate::dialect::op::Op;
use crate::dialect::Dialect;
use crate::http::target;

/// Azure OpenAI `api-version` when the config does not give one.
pub const DEFAULT_AZURE_API_VERSION: &str = "2024-10-21";

impl ProviderKind {
    /// Whether this provider can take `client`'s dialect as is (same-dialect passthrough).
    pub fn speaks(self, client: Dialect) -> bool {
        match self {
            ProviderKind::OpenAi => matches!(client, Dialect::Chat | Dialect::Responses),
            ProviderKind::OpenAiCompatible | ProviderKind::Azure => client == Dialect::Chat,
            ProviderKind::Anthropic => client == Dialect::Messages,
            ProviderKind::Gemini => client == Dialect::Gemini,
            // Vertex: the publisher decides (`for_model`); Bedrock speaks Converse only
            ProviderKind::Vertex | ProviderKind::Bedrock => false,
            ProviderKind::Mock => true,
        }
    }

    /// The kind whose wire format serves `model` at this provider: a Vertex model speaks
    /// Anthropic's Messages (`publisher = "anthropic"`, or a `claude*` model) or Gemini's;
    /// every other kind is itself.
    pub fn for_model(self, model: &str, publisher: Option<Publisher>) -> ProviderKind {
        match self {
            ProviderKind::Vertex => match Publisher::of(model, publisher) {
                Publisher::Anthropic => ProviderKind::Anthropic,
                Publisher::Google => ProviderKind::Gemini,
            },
            k => k,
        }
    }

    /// The dialect a translated request is sent in.
    pub fn native(self) -> Dialect {
        match self {
            ProviderKind::Anthropic => Dialect::Messages,
            ProviderKind::Gemini | ProviderKind::Vertex => Dialect::Gemini,
            // Converse converts at the hub's edge (`dialect::converse`): the hub is what it speaks
            ProviderKind::Bedrock => Dialect::Chat,
            _ => Dialect::Chat,
        }
    }

    /// Upstream request target for `op` in `dialect`, below the provider's base path.
    /// `model` is the upstream model (Azure deployment, Gemini URL model): it and `api_version`
    /// go in percent-encoded (`upstream::target`), so whatever they hold stays one path segment /
    /// one query value of one request line.
    pub fn path(
        self,
        base: &str,
        op: Op,
        dialect: Dialect,
        model: &str,
        stream: bool,
        api_version: Option<&str>,
    ) -> String {
        let mut p = String::with_capacity(base.len() + model.len() + 64);
        p.push_str(base);
        match (self, op, dialect) {
            (ProviderKind::Anthropic, Op::CountTokens, _) => {
                p.push_str("/v1/messages/count_tokens")
            }
            (ProviderKind::Anthropic, _, _) => p.push_str("/v1/messages"),
            (ProviderKind::Bedrock, _, _) => {
                p.push_str("/model/");
                target::push_segment(&mut p, model);
                p.push_str(if stream {
                    "/converse-stream"
                } else {
                    "/converse"
                });
            }
            (ProviderKind::Gemini | ProviderKind::Vertex, _, _) => {
                p.push_str(match self {
                    ProviderKind::Gemini => "/v1beta/models/",
                    // `base` is `/v1/projects/{project}/locations/{location}` (`vertex_base`);
                    // a `claude*` model reaching here is sent to Google's publisher path only
                    // when the deployment says `publisher = "google"` (the caller picks the
                    // kind).
                    _ => "/publishers/google/models/",
                });
                target::push_segment(&mut p, model);
                p.push_str(match (op, stream) {
                    (Op::CountTokens, _) => ":countTokens",
                    (_, true) => ":streamGenerateContent?alt=sse",
                    (_, false) => ":generateContent",
                });
            }
            (ProviderKind::Azure, op, _) => {
                p.push_str("/openai/deployments/");
                target::push_segment(&mut p, model);
                p.push_str(match op {
                    Op::Embeddings => "/embeddings",
                    Op::Completions => "/completions",
                    _ => "/chat/completions",
                });
                p.push_str("?api-version=");
                target::push_query_value(&mut p, api_version.unwrap_or(DEFAULT_AZURE_API_VERSION));
            }
            (_, Op::Embeddings, _) => p.push_str("/embeddings"),
            (_, Op::Completions, _) => p.push_str("/completions"),
            (_, _, Dialect::Responses) => p.push_str("/responses"),
            _ => p.push_str("/chat/completions"),
        }
        p
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::OpenAiCompatible => "openai-compatible",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
            ProviderKind::Azure => "azure",
            ProviderKind::Bedrock => "bedrock",
            ProviderKind::Vertex => "vertex",
            ProviderKind::Mock => "mock",
        }
    }
}

/// Who publishes a Vertex model: its path (`publishers/{p}`) and wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Publisher {
    Anthropic,
    Google,
}

impl Publisher {
    /// The configured publisher, else the model's: `claude*` → Anthropic, anything else Google.
    pub fn of(model: &str, configured: Option<Publisher>) -> Publisher {
        configured.unwrap_or(if model.starts_with("claude") {
            Publisher::Anthropic
        } else {
            Publisher::Google
        })
    }
}

/// The Vertex Anthropic path below `base` (`/v1/projects/{p}/locations/{l}`):
/// `…/publishers/anthropic/models/{m}:rawPredict` or `:streamRawPredict`.
pub fn vertex_anthropic_path(base: &str, model: &str, op: Op, stream: bool) -> String {
    let mut p = String::with_capacity(base.len() + model.len() + 48);
    p.push_str(base);
    p.push_str("/publishers/anthropic/models/");
    target::push_segment(&mut p, model);
    p.push_str(match (op, stream) {
        (Op::CountTokens, _) => ":countTokens",
        (_, true) => ":streamRawPredict",
        (_, false) => ":rawPredict",
    });
    p
}

/// The `anthropic_version` a Vertex Anthropic body carries (in the body, not a header).
pub const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// Latency profile (see docs/bench-protocol.md "Mock profiles").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Answer at once.
    Instant,
    /// Non-stream after 50 ms; streams send headers at once, the first content token at 50 ms,
    /// and spread the output over a fixed 500 ms span.
    Seed,
    /// The bench protocol's S5 streams: non-stream at once; streams send one content delta
    /// every 20 ms, the first at once (64 deltas = `max_tokens: 64`).
    Paced,
}

/// Gap between deltas of the `paced` profile.
pub const PACED_GAP: Duration = Duration::from_millis(20);

impl Profile {
    pub fn parse(s: &str) -> Option<Profile> {
        match s {
            "instant" => Some(Profile::Instant),
            "seed" => Some(Profile::Seed),
            "paced" => Some(Profile::Paced),
            _ => None,
        }
    }

    pub fn first_token_delay(self) -> Duration {
        match self {
            Profile::Instant | Profile::Paced => Duration::ZERO,
            Profile::Seed => Duration::from_millis(50),
        }
    }

    pub fn stream_span(self) -> Duration {
        match self {
            Profile::Instant | Profile::Paced => Duration::ZERO,
            Profile::Seed => Duration::from_millis(500),
        }
    }

    /// A fixed gap between content units (one unit per write), if the profile has one.
    pub fn unit_gap(self) -> Option<Duration> {
        match self {
            Profile::Paced => Some(PACED_GAP),
            _ => None,
        }
    }
}

/// `[[provider]]`: one upstream account — its kind, base URL, key env vars and the
/// kind-specific settings (Azure api-version, Bedrock region and role, Vertex project and
/// credentials, a self-hosted engine's load signal).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub name: Spanned<String>,
    pub kind: Spanned<ProviderKind>,
    /// As you would give it to that provider's own SDK, e.g. `https://api.openai.com/v1`.
    /// Not needed for `kind = "mock"`.
    pub base_url: Option<Spanned<String>>,
    /// Name of the environment variable holding the API key (never the key itself).
    pub api_key_env: Option<Spanned<String>>,
    /// More keys, weighted: `[{ env = "A_KEY", weight = 2 }, { env = "A_KEY2" }]` (besides
    /// `api_key_env`, which counts as one key of weight 1). A key that got a 429 cools down.
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    /// `kind = "mock"` only: `instant` (default) or `seed`.
    pub profile: Option<Spanned<String>>,
    /// Extra PEM CA certificate(s) trusted for this provider's `https://` base_url (added to the
    /// system roots), e.g. an internal CA in front of a local engine.
    pub ca_file: Option<String>,
    /// `kind = "azure"`: the `api-version` query parameter (default 2024-10-21).
    pub api_version: Option<Spanned<String>>,
    /// Engine quirks for `openai-compatible` upstreams: `no_stream_options` (the engine rejects
    /// `stream_options`, so streamed usage is not requested from it).
    #[serde(default)]
    pub quirks: Vec<String>,
    /// The self-hosted inference engine behind this provider (`vllm`, `sglang`, `llamacpp`,
    /// `ollama`, `tgi`): its load signal is polled for `lb = "load"` (see `engine`).
    pub engine: Option<Spanned<EngineKind>>,
    /// The engine's load-signal URL (`http://`); default: the engine's usual path on the
    /// base URL's host (`/metrics`; llama.cpp `/slots`; Ollama has none).
    pub metrics_url: Option<Spanned<String>>,
    /// How often the load signal is polled (default 100 ms, at least 10).
    pub poll_ms: Option<Spanned<u64>>,
    /// A signal older than this counts as saturated (default max(1000, 3 × poll_ms)).
    pub stale_ms: Option<Spanned<u64>>,
    /// `kind = "bedrock"`: the AWS region (the endpoint's and SigV4's signing region).
    pub region: Option<Spanned<String>>,
    /// `kind = "bedrock"`: a role assumed (STS `AssumeRole`) with the chain's credentials.
    pub role_arn: Option<Spanned<String>>,
    /// `kind = "bedrock"`: the STS endpoint (default `https://sts.{region}.amazonaws.com`).
    pub sts_url: Option<Spanned<String>>,
    /// `kind = "vertex"`: the Google Cloud project.
    pub project: Option<Spanned<String>>,
    /// `kind = "vertex"`: the location (`us-central1`, `global`, …).
    pub location: Option<Spanned<String>>,
    /// `kind = "vertex"`: a service-account (or authorized-user) JSON key file; else
    /// `GOOGLE_APPLICATION_CREDENTIALS`, else the metadata server.
    pub credentials_file: Option<Spanned<String>>,
    /// `kind = "vertex"`: the OAuth token endpoint (default: the key file's `token_uri`).
    pub token_url: Option<Spanned<String>>,
    /// `kind = "vertex"`: `anthropic` or `google` for every model of this provider (default:
    /// `claude*` models are Anthropic's, the rest Google's).
    pub publisher: Option<Publisher>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_each_sdks_base_url_convention() {
        let p = |k: ProviderKind, op, d, stream| k.path("/b", op, d, "m", stream, None);
        assert_eq!(
            p(ProviderKind::OpenAi, Op::Generate, Dialect::Chat, false),
            "/b/chat/completions"
        );
        assert_eq!(
            p(ProviderKind::OpenAi, Op::Generate, Dialect::Responses, true),
            "/b/responses"
        );
        assert_eq!(
            p(ProviderKind::OpenAi, Op::Embeddings, Dialect::Chat, false),
            "/b/embeddings"
        );
        assert_eq!(
            p(
                ProviderKind::Anthropic,
                Op::Generate,
                Dialect::Messages,
                true
            ),
            "/b/v1/messages"
        );
        assert_eq!(
            p(
                ProviderKind::Anthropic,
                Op::CountTokens,
                Dialect::Messages,
                false
            ),
            "/b/v1/messages/count_tokens"
        );
        assert_eq!(
            p(ProviderKind::Gemini, Op::Generate, Dialect::Gemini, true),
            "/b/v1beta/models/m:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            p(ProviderKind::Gemini, Op::Generate, Dialect::Gemini, false),
            "/b/v1beta/models/m:generateContent"
        );
        assert_eq!(
            p(
                ProviderKind::Gemini,
                Op::CountTokens,
                Dialect::Gemini,
                false
            ),
            "/b/v1beta/models/m:countTokens"
        );
        assert_eq!(
            p(ProviderKind::Azure, Op::Generate, Dialect::Chat, false),
            "/b/openai/deployments/m/chat/completions?api-version=2024-10-21"
        );
    }

    #[test]
    fn model_and_api_version_cannot_leave_their_segment() {
        let evil =
            "x/chat/completions?api-version=1 HTTP/1.1\r\nHost: u\r\n\r\nPOST /o HTTP/1.1\r\nX: ";
        let az = ProviderKind::Azure.path(
            "/b",
            Op::Generate,
            Dialect::Chat,
            evil,
            false,
            Some("1 &x\r\n"),
        );
        assert_eq!(
            az,
            "/b/openai/deployments/x%2Fchat%2Fcompletions%3Fapi-version%3D1%20HTTP%2F1.1%0D%0AHost%3A%20u%0D%0A%0D%0APOST%20%2Fo%20HTTP%2F1.1%0D%0AX%3A%20/chat/completions?api-version=1%20%26x%0D%0A"
        );
        let ge =
            ProviderKind::Gemini.path("", Op::Generate, Dialect::Gemini, "../../v1/x", true, None);
        assert_eq!(
            ge,
            "/v1beta/models/..%2F..%2Fv1%2Fx:streamGenerateContent?alt=sse"
        );
        let ge = ProviderKind::Gemini.path("", Op::Generate, Dialect::Gemini, "..", false, None);
        assert_eq!(ge, "/v1beta/models/%2E%2E:generateContent");
        for p in [az, ge] {
            assert!(target::check_head(&p, "h", b"").is_ok(), "{p}");
        }
    }
}
