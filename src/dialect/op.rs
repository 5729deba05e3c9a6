//! What a client asks for besides plain generation in its dialect (the request path and the
//! upstream path both depend on it).
//!
//! Owns: `Op`. Must not: know providers (see `config::provider`).

/// Operations a client can ask for (besides generation in its dialect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Generate a reply (Chat, Responses, Messages, Gemini generateContent).
    Generate,
    /// Anthropic `count_tokens`, Gemini `countTokens`.
    CountTokens,
    /// OpenAI `embeddings`.
    Embeddings,
    /// OpenAI's legacy text `completions` (llama.cpp, vLLM and many local tools serve it):
    /// passthrough to OpenAI-style providers only.
    Completions,
}
