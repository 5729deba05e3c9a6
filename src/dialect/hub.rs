//! The hub stream event: what one Chat Completions chunk can say, one thing at a time. Every
//! upstream stream decoder (`stream.rs`) produces these; every client encoder (`stream_out.rs`,
//! `responses::stream_out`) consumes them.
//!
//! Owns: [`Hub`]. Must not: encode or decode anything.

use super::Usage;

/// One hub event: what a Chat chunk can say, one thing at a time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Hub {
    /// Stream opened (upstream id and creation time when known).
    Start {
        id: Option<String>,
        created: Option<u64>,
    },
    /// Assistant text.
    Text(String),
    /// Reasoning text (Chat `reasoning_content`, Anthropic `thinking_delta`, Responses
    /// reasoning text / summary deltas, Gemini `thought` parts).
    Reasoning(String),
    /// The signature of the reasoning so far (Anthropic `signature_delta`).
    Signature(String),
    /// A redacted reasoning block's data (Anthropic `redacted_thinking`).
    Redacted(String),
    /// A tool call begins (Chat `tool_calls[index]` with id and name).
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A fragment of a tool call's arguments.
    ToolArgs { index: usize, args: String },
    /// Chat `finish_reason`.
    Finish(String),
    /// Usage report (fields present override).
    Usage(Usage),
    /// Upstream error mid-stream: its HTTP-status class (`error::stream_error_status`, mapped
    /// to the client's dialect) and message. Ends the stream.
    Error(u16, String),
    /// End of stream.
    Done,
}
