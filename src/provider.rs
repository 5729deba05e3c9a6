//! Provider kinds: the closed set of upstream families ringgate speaks to.
//!
//! Owns: `ProviderKind` (the one enum every provider-specific decision matches on) and the
//! per-kind facts that do not need IO: which wire dialect it speaks, which auth header it takes,
//! and the upstream path for an endpoint.
//! Must not: build bodies or open connections (translation lives in `translate`, IO in `upstream`).

use serde::Deserialize;

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
    /// The in-process mock (no network): what the embedded default config serves.
    Mock,
}

use crate::translate::Dialect;

/// Operations a client can ask for (besides generation in its dialect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Generate a reply (Chat, Responses, Messages, Gemini generateContent).
    Generate,
    /// Anthropic `count_tokens`.
    CountTokens,
    /// OpenAI `embeddings`.
    Embeddings,
}

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
            ProviderKind::Mock => true,
        }
    }

    /// The dialect a translated request is sent in.
    pub fn native(self) -> Dialect {
        match self {
            ProviderKind::Anthropic => Dialect::Messages,
            ProviderKind::Gemini => Dialect::Gemini,
            _ => Dialect::Chat,
        }
    }

    /// Upstream request target for `op` in `dialect`, below the provider's base path.
    /// `model` is the upstream model (Azure deployment, Gemini URL model).
    pub fn path(
        self,
        base: &str,
        op: Op,
        dialect: Dialect,
        model: &str,
        stream: bool,
        api_version: Option<&str>,
    ) -> String {
        match (self, op, dialect) {
            (ProviderKind::Anthropic, Op::CountTokens, _) => {
                format!("{base}/v1/messages/count_tokens")
            }
            (ProviderKind::Anthropic, _, _) => format!("{base}/v1/messages"),
            (ProviderKind::Gemini, _, _) if stream => {
                format!("{base}/v1beta/models/{model}:streamGenerateContent?alt=sse")
            }
            (ProviderKind::Gemini, _, _) => format!("{base}/v1beta/models/{model}:generateContent"),
            (ProviderKind::Azure, op, _) => {
                let what = if op == Op::Embeddings {
                    "embeddings"
                } else {
                    "chat/completions"
                };
                let v = api_version.unwrap_or(DEFAULT_AZURE_API_VERSION);
                format!("{base}/openai/deployments/{model}/{what}?api-version={v}")
            }
            (_, Op::Embeddings, _) => format!("{base}/embeddings"),
            (_, _, Dialect::Responses) => format!("{base}/responses"),
            _ => format!("{base}/chat/completions"),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::OpenAiCompatible => "openai-compatible",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
            ProviderKind::Azure => "azure",
            ProviderKind::Mock => "mock",
        }
    }
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
            p(ProviderKind::Azure, Op::Generate, Dialect::Chat, false),
            "/b/openai/deployments/m/chat/completions?api-version=2024-10-21"
        );
    }
}
