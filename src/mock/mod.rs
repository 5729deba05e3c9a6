//! `ringgate mock`: the project's own upstream simulator, used by tests, benches and the
//! embedded default config (as an in-process provider).
//!
//! Owns: latency profiles, request knobs (`max_tokens` & co. pick the output size, a tools list
//! plus a user turn triggers a tool call, `reasoning_effort` / `thinking` add reasoning, the
//! prompt's text gives the input tokens), and the one dispatch to the per-dialect mocks
//! (`speaker_of`: `chat`, `responses`, `anthropic`, `gemini` each hold their dialect's
//! `speaker::Speaker` table — knob fields, user-turn rule, answer bodies and streams — beside
//! its writers; `embeddings` apart), which share `pace` (timing and framing), `tools` (the
//! tool-call decision) and `prompt` (the input token count). The standalone server (`server`)
//! also injects faults on purpose: `fault` says which and when (the `x-mock-fault` header, or
//! the process's `--fault` plan), `inject` writes them in place of the `answer`; with
//! `--engine` it simulates an inference engine under load (`engine`, its metrics pages
//! `engine_page`, llama.cpp's own answer shape `engine_answer`). The dialects' wire facts it
//! writes (error bodies and their type names, error events, terminal data) come from
//! `crate::dialect` (`Dialect::wire`, through `error`). Must not: match on a dialect outside
//! `speaker_of`; depend on the gateway pipeline — the gateway calls `respond_with` (its
//! in-process mock injects no faults), the standalone server writes the same `answer::Answer`.

pub mod answer;
pub mod anthropic;
pub mod chat;
pub mod embeddings;
pub mod engine;
pub mod engine_answer;
pub mod engine_page;
pub mod error;
pub mod fault;
pub mod gemini;
pub mod inject;
pub mod pace;
pub mod prompt;
pub mod responses;
pub mod server;
pub mod speaker;
pub mod text;
pub mod tools;

use std::io;

use monoio::io::AsyncWriteRent;
use sonic_rs::JsonValueTrait;

use answer::Answer;
use speaker::Speaker;

pub use crate::config::provider::{Profile, PACED_GAP};
pub use crate::dialect::Dialect;
pub use tools::TOOL_ARGS;

/// Output tokens when the request does not say.
pub const DEFAULT_OUTPUT_TOKENS: u32 = 16;
/// Hard cap on generated output tokens.
pub const MAX_OUTPUT_TOKENS: u32 = 100_000;

/// Every top-level field some dialect's knobs are read from (see each `Speaker`). Top-level
/// keys only: a nested path through a `null` (e.g. `"stream_options": null`) would fail the
/// whole lookup, so nested knobs are read from their object ([`Fields::nested`]).
const KEYS: [&str; 17] = [
    "model",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "generationConfig",
    "stream_options",
    "tools",
    "messages",
    "input",
    "contents",
    "system",
    "instructions",
    "systemInstruction",
    "reasoning_effort",
    "thinking",
    "tool_choice",
];

/// What the mock reads from a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockRequest {
    pub model: String,
    pub stream: bool,
    /// The request's output limit (or `DEFAULT_OUTPUT_TOKENS`): the text answer's length.
    pub output_tokens: u32,
    pub include_usage: bool,
    /// The prompt's text bytes / 4 (see `prompt`), reported as usage.
    pub input_tokens: u32,
    /// `Some(name)`: answer with "Let me check." and one call of tool `name` (see `tools`).
    pub tool_call: Option<String>,
    /// The request asks for reasoning (Chat `reasoning_effort` other than `none`, Anthropic
    /// `thinking` enabled): Chat answers carry `reasoning_content`, Anthropic answers a
    /// `thinking` block first (`text::REASONING`, signed `text::SIGNATURE`).
    pub reasoning: bool,
    /// Anthropic `tool_choice` `any` / `tool`: the tool call comes without text before it
    /// (a named tool is the one called).
    pub forced_tool: bool,
}

impl MockRequest {
    /// Parse an OpenAI Chat request (the model must be in the body).
    pub fn parse(body: &[u8]) -> Result<MockRequest, String> {
        MockRequest::parse_dialect(Dialect::Chat, "", body)
    }

    /// Parse a request of `dialect`. A non-empty `model` wins over the body's `model` (Gemini
    /// carries it in the URL; the gateway passes the upstream model). Gemini's `stream` comes
    /// from the URL too: the body's `stream` (absent in real Gemini bodies) is read for it, and
    /// callers that know better overwrite the field.
    pub fn parse_dialect(
        dialect: Dialect,
        model: &str,
        body: &[u8],
    ) -> Result<MockRequest, String> {
        crate::util::nesting::check(body).map_err(|e| format!("invalid JSON body: {e}"))?;
        let mut tree = sonic_rs::PointerTree::new();
        for k in KEYS {
            tree.add_path([k].iter());
        }
        let nodes =
            sonic_rs::get_many(body, &tree).map_err(|e| format!("invalid JSON body: {e}"))?;
        let f = Fields { nodes };
        let speaker = speaker_of(dialect);
        let model = if model.is_empty() {
            f.str("model").ok_or("missing \"model\"")?.to_string()
        } else {
            model.to_string()
        };
        let stream = f.get("stream").and_then(|v| v.as_bool()).unwrap_or(false);
        let output_tokens = (speaker.limit)(&f)?
            .map_or(DEFAULT_OUTPUT_TOKENS, |n| {
                n.min(u64::from(MAX_OUTPUT_TOKENS)) as u32
            })
            .max(1);
        let include_usage = f
            .nested("stream_options", "include_usage")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let turns = f.get(speaker.turns).map(|v| v.as_raw_str());
        let mut tool_call = match f.get("tools") {
            Some(t) => tools::decide(speaker, t.as_raw_str(), turns),
            None => None,
        };
        let system = speaker
            .system
            .and_then(|k| f.get(k))
            .map(|v| v.as_raw_str());
        let input_tokens = prompt::input_tokens(speaker, turns, system);
        let forced_tool = (speaker.forced_tool)(&f, &mut tool_call);
        let reasoning = (speaker.reasoning)(&f);
        Ok(MockRequest {
            model,
            stream,
            output_tokens,
            include_usage,
            input_tokens,
            tool_call,
            reasoning,
            forced_tool,
        })
    }

    /// Content units of the streamed answer (OpenAI dialects): one per token, or (tool call)
    /// the text before the call, then one per argument fragment.
    pub fn stream_units(&self) -> u32 {
        match self.tool_call {
            Some(_) => 1 + tools::fragment_count(),
            None => self.output_tokens,
        }
    }

    /// Output tokens reported in usage: the text length, or `tools::OUTPUT_TOKENS` for a
    /// tool-call answer.
    pub fn usage_output_tokens(&self) -> u32 {
        if self.tool_call.is_some() {
            tools::OUTPUT_TOKENS
        } else {
            self.output_tokens
        }
    }
}

/// The request's top-level fields the mock reads (any of `KEYS`), looked up by name.
pub struct Fields<'b> {
    nodes: Vec<Option<sonic_rs::LazyValue<'b>>>,
}

impl<'b> Fields<'b> {
    /// Top-level field `key` (one of `KEYS`), when the body has it.
    pub fn get(&self, key: &str) -> Option<&sonic_rs::LazyValue<'b>> {
        let i = KEYS.iter().position(|k| *k == key)?;
        self.nodes.get(i)?.as_ref()
    }

    /// Field `key` as a whole number.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Field `key` as a string.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// `key.inner`, when field `key` is an object that has it.
    pub fn nested(&self, key: &str, inner: &str) -> Option<sonic_rs::LazyValue<'_>> {
        nested(self.get(key)?, inner)
    }
}

/// `obj[key]` when `obj` is an object that has it.
fn nested<'b>(obj: &'b sonic_rs::LazyValue<'_>, key: &str) -> Option<sonic_rs::LazyValue<'b>> {
    if !obj.as_raw_str().starts_with('{') {
        return None;
    }
    sonic_rs::get(obj.as_raw_str(), [key]).ok()
}

/// How the mock speaks dialect `d` (its table, in its file): the one place the mock matches on
/// a dialect.
pub fn speaker_of(d: Dialect) -> &'static Speaker {
    match d {
        Dialect::Chat => &chat::SPEAKER,
        Dialect::Responses => &responses::SPEAKER,
        Dialect::Messages => &anthropic::SPEAKER,
        Dialect::Gemini => &gemini::SPEAKER,
    }
}

/// The dialect the standalone mock serves at `path`, if one is (`Speaker::path`).
pub fn dialect_at(path: &[u8]) -> Option<Dialect> {
    Dialect::ALL
        .into_iter()
        .find(|d| speaker_of(*d).path == Some(path))
}

/// Answer one request of `dialect` (any of the four) with a complete HTTP response, paced by
/// `profile`; an invalid body gets a 400 in the dialect's own error shape. `model` (when
/// non-empty) overrides the body's; Gemini's `stream` is read from the body's `stream` field
/// here (use [`respond_with`] to pass the URL's choice).
pub async fn respond<S: AsyncWriteRent>(
    s: &mut S,
    dialect: Dialect,
    model: &str,
    body: &[u8],
    profile: Profile,
    keep_alive: bool,
) -> io::Result<()> {
    respond_with(s, dialect, model, None, body, profile, keep_alive).await
}

/// [`respond`] with an explicit stream choice (`Some` overrides the body's `stream`), as
/// Gemini's `:streamGenerateContent` needs.
pub async fn respond_with<S: AsyncWriteRent>(
    s: &mut S,
    dialect: Dialect,
    model: &str,
    stream: Option<bool>,
    body: &[u8],
    profile: Profile,
    keep_alive: bool,
) -> io::Result<()> {
    let mut req = match MockRequest::parse_dialect(dialect, model, body) {
        Ok(r) => r,
        Err(msg) => {
            return error::write(s, dialect, 400, &msg, keep_alive).await;
        }
    };
    if let Some(st) = stream {
        req.stream = st;
    }
    Answer::generate(dialect, req)
        .write(s, profile, keep_alive)
        .await
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

    #[test]
    fn reasoning_knob_and_answers() {
        let r =
            MockRequest::parse(br#"{"model":"m","reasoning_effort":"low","messages":[]}"#).unwrap();
        assert!(r.reasoning);
        let r = MockRequest::parse(br#"{"model":"m","reasoning_effort":"none"}"#).unwrap();
        assert!(!r.reasoning);
        let body = br#"{"model":"m","max_tokens":3,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[]}"#;
        let mut r = MockRequest::parse_dialect(Dialect::Messages, "", body).unwrap();
        assert!(r.reasoning);
        let v: serde_json::Value = serde_json::from_slice(&anthropic::message_body(&r)).unwrap();
        assert_eq!(v["content"][0]["type"], "thinking");
        assert_eq!(v["content"][0]["signature"], text::SIGNATURE);
        assert_eq!(v["content"][1]["text"], text::tokens(0, 3));
        r.stream = true;
        let t = String::from_utf8(pace::transcript(&mut anthropic::events(&r))).unwrap();
        assert!(t.contains(r#""delta":{"type":"signature_delta","signature":"mock-signature"}"#));
        assert!(t.contains(r#""index":1,"delta":{"type":"text_delta""#));
        assert!(t.contains(r#"{"type":"content_block_stop","index":1}"#));
        let forced = br#"{"model":"m","max_tokens":3,"tools":[{"name":"a","input_schema":{}},{"name":"b","input_schema":{}}],"tool_choice":{"type":"tool","name":"b"},"messages":[{"role":"user","content":"x"}]}"#;
        let mut f = MockRequest::parse_dialect(Dialect::Messages, "", forced).unwrap();
        assert!(f.forced_tool);
        assert_eq!(f.tool_call.as_deref(), Some("b"));
        let v: serde_json::Value = serde_json::from_slice(&anthropic::message_body(&f)).unwrap();
        assert_eq!(v["content"][0]["type"], "tool_use");
        f.stream = true;
        let t = String::from_utf8(pace::transcript(&mut anthropic::events(&f))).unwrap();
        assert!(
            !t.contains("text_delta")
                && t.contains(r#""index":0,"content_block":{"type":"tool_use""#)
        );
        assert!(t.contains(r#"{"type":"content_block_stop","index":0}"#));
        let c = MockRequest::parse(br#"{"model":"m","stream":true,"reasoning_effort":"high"}"#)
            .unwrap();
        let t = String::from_utf8(pace::transcript(&mut chat::events(&c))).unwrap();
        assert!(t.contains(r#""delta":{"reasoning_content":"Thinking"}"#));
    }

    #[test]
    fn parses_dialect_limits() {
        let r = MockRequest::parse_dialect(
            Dialect::Responses,
            "",
            br#"{"model":"m","input":"hi","max_output_tokens":5,"stream_options":null}"#,
        )
        .unwrap();
        assert_eq!(r.output_tokens, 5);
        let r = MockRequest::parse_dialect(
            Dialect::Gemini,
            "g",
            br#"{"contents":[],"generationConfig":{"maxOutputTokens":4}}"#,
        )
        .unwrap();
        assert_eq!((r.model.as_str(), r.output_tokens), ("g", 4));
        assert!(MockRequest::parse_dialect(
            Dialect::Messages,
            "",
            br#"{"model":"m","messages":[]}"#
        )
        .is_err());
        let r = MockRequest::parse_dialect(
            Dialect::Messages,
            "x",
            br#"{"model":"m","max_tokens":2,"messages":[]}"#,
        )
        .unwrap();
        assert_eq!(
            (r.model.as_str(), r.output_tokens, r.tool_call),
            ("x", 2, None)
        );
    }
}
