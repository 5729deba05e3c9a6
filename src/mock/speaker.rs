//! How the mock speaks one dialect, one table per dialect kept in that dialect's file
//! (`chat::SPEAKER`, `responses::SPEAKER`, `anthropic::SPEAKER`, `gemini::SPEAKER`), read
//! through `mock::speaker_of`: where the dialect is served, which request fields carry the mock's
//! knobs (output limit, turns, system text, reasoning, a forced tool), which last turn is a
//! user's, and the dialect's answer bodies, streams and mid-stream failure. The dialect's wire
//! facts the mock also writes (error shape and type names, error event, terminal data) come
//! from its `crate::dialect` table (`Dialect::wire`), not from here.
//!
//! Owns: the `Speaker` table type (the one dispatch from a `Dialect` to its table,
//! `speaker_of`, is the mock folder's face, `mod.rs`). Must not: hold a dialect's facts itself
//! (each dialect's file does).

use super::pace::Events;
use super::{Fields, MockRequest};

/// One dialect's mock: request knobs in, answer bytes out.
pub struct Speaker {
    /// The path the standalone mock serves it at (`None`: Gemini, whose model is in the path).
    pub path: Option<&'static [u8]>,
    /// The top-level request field holding the turns (`messages`, `input`, `contents`).
    pub turns: &'static str,
    /// The top-level request field holding the system text, if the dialect has one apart from
    /// the turns.
    pub system: Option<&'static str>,
    /// The field of a turn (and of an object system text) holding its text parts.
    pub text: &'static str,
    /// A string in `turns` is one user turn (Responses `input`).
    pub string_turns: bool,
    /// The request's output limit (`Err`: the dialect requires one and it is missing).
    pub limit: fn(&Fields<'_>) -> Result<Option<u64>, String>,
    /// Whether the request asks for reasoning.
    pub reasoning: fn(&Fields<'_>) -> bool,
    /// Whether the request forces a tool call; may name the tool to call (in `call`).
    pub forced_tool: fn(&Fields<'_>, call: &mut Option<String>) -> bool,
    /// Whether a turn (one element of `turns`, parsed) is a user's and no tool result.
    pub user_turn: fn(&serde_json::Value) -> bool,
    /// The non-stream answer body.
    pub body: fn(&MockRequest) -> Vec<u8>,
    /// The paced stream of an answer (`sse`: Gemini's `alt=sse`, else one JSON array; the
    /// other dialects always stream SSE).
    pub events: for<'a> fn(&'a MockRequest, sse: bool) -> Box<dyn Events + 'a>,
    /// A mid-stream failure event of its own (Responses `response.failed`, with its
    /// `sequence_number`), appended to `out`; `None`: the dialect's error event
    /// (`crate::dialect` error body and event name), then its terminal data.
    pub failed: Option<fn(seq: usize, message: &str, out: &mut Vec<u8>)>,
}

/// `forced_tool` of a dialect that has no forced tool calls.
pub fn never_forced(_: &Fields<'_>, _: &mut Option<String>) -> bool {
    false
}

/// `reasoning` of a dialect the mock gives no reasoning.
pub fn no_reasoning(_: &Fields<'_>) -> bool {
    false
}
