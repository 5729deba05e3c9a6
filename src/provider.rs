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

/// What the client asked for, independent of dialect details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Responses,
    Messages,
    CountTokens,
    Embeddings,
}

impl ProviderKind {
    /// Speaks the OpenAI Chat Completions dialect natively (passthrough possible).
    pub fn speaks_openai_chat(self) -> bool {
        matches!(
            self,
            ProviderKind::OpenAi | ProviderKind::OpenAiCompatible | ProviderKind::Azure
        )
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
