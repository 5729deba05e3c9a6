//! The hub stream event: what one Chat Completions chunk can say, one thing at a time. Every
//! upstream stream decoder (`<dialect>/stream.rs`) produces these; every client encoder (the
//! same files) consumes them; `stream.rs` carries them from one to the other.
//!
//! Owns: [`Hub`], and what every decoder shares making them ([`Core`], `push_args`,
//! `upstream_error`, `parse`). Must not: encode events, or read a dialect's own event shapes
//! (its folder does).

use super::error::{extract_message, stream_error_status};
use super::{TranslateError, Usage};
use serde_json::Value;

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

/// What decoding one upstream event gives: its hub events went to the caller's list.
pub(crate) type Decoded = Result<(), TranslateError>;

/// What every upstream decoder shares (one per stream): whether the hub `Start` went out, and
/// the next hub tool index.
#[derive(Default)]
pub(crate) struct Core {
    pub(crate) started: bool,
    pub(crate) next_tool: usize,
}

impl Core {
    /// The hub `Start`, once per stream.
    pub(crate) fn start(&mut self, hub: &mut Vec<Hub>, id: Option<&str>, created: Option<u64>) {
        if !self.started {
            self.started = true;
            hub.push(Hub::Start {
                id: id.map(str::to_string),
                created,
            });
        }
    }

    /// A tool call at the next hub index; its index.
    pub(crate) fn tool(&mut self, hub: &mut Vec<Hub>, id: &str, name: &str) -> usize {
        let index = self.next_tool;
        self.next_tool += 1;
        hub.push(Hub::ToolStart {
            index,
            id: id.to_string(),
            name: name.to_string(),
        });
        index
    }
}

/// A fragment of tool call `index`'s arguments (none for an empty one).
pub(crate) fn push_args(hub: &mut Vec<Hub>, index: usize, args: &str) {
    if !args.is_empty() {
        hub.push(Hub::ToolArgs {
            index,
            args: args.to_string(),
        });
    }
}

/// An upstream's in-stream error event (any dialect) as a hub error.
pub(crate) fn upstream_error(data: &str) -> Hub {
    Hub::Error(
        stream_error_status(data.as_bytes()),
        extract_message(500, data.as_bytes()),
    )
}

/// One upstream event's JSON (the `Value`-based decoders).
pub(crate) fn parse(data: &str) -> Result<Value, TranslateError> {
    serde_json::from_str(data)
        .map_err(|e| TranslateError::new(format!("malformed upstream stream event: {e}")))
}
