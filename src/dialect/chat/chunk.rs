//! A typed, borrowing view of one OpenAI Chat Completions streaming chunk: what the Chat stream
//! decoder reads, deserialized without building `Value` maps (strings borrow from the event
//! unless they carry escapes). Every field is optional and `null`-tolerant; unknown fields are
//! ignored, as they are in the `Value`-based decoders.
//!
//! Owns: the chunk's shape. Must not: interpret it (see `chat::stream`) or allocate beyond escaped
//! strings and the `usage`/`error` objects.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// `Option<Cow<str>>` that borrows from the input when the string has no escapes (serde's
/// `borrow` alone does not reach through `Option`).
fn opt_cow<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Option::<Borrowed<'a>>::deserialize(d).map(|o| o.map(|b| b.0))
}

#[derive(Deserialize)]
pub(crate) struct Chunk<'a> {
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub id: Option<Cow<'a, str>>,
    #[serde(default)]
    pub created: Option<u64>,
    #[serde(borrow, default)]
    pub choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    pub usage: Option<Value>,
    #[serde(default)]
    pub error: Option<Value>,
}

#[derive(Deserialize)]
pub(crate) struct Choice<'a> {
    #[serde(default)]
    pub index: Option<u64>,
    #[serde(borrow, default)]
    pub delta: Option<Delta<'a>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub(crate) struct Delta<'a> {
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub refusal: Option<Cow<'a, str>>,
    /// Reasoning text (vLLM, DeepSeek).
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub reasoning_content: Option<Cow<'a, str>>,
    /// Reasoning text under vLLM's newer name.
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub tool_calls: Option<Vec<ToolCall<'a>>>,
}

#[derive(Deserialize)]
pub(crate) struct ToolCall<'a> {
    #[serde(default)]
    pub index: Option<u64>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub function: Option<Function<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct Function<'a> {
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_cow")]
    pub arguments: Option<Cow<'a, str>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrows_and_tolerates_nulls() {
        let data = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"hi","tool_calls":null},"logprobs":null,"finish_reason":null}],"usage":null}"#;
        let c: Chunk = serde_json::from_str(data).unwrap();
        assert!(matches!(c.id, Some(Cow::Borrowed("c1"))));
        let ch = &c.choices.as_ref().unwrap()[0];
        assert!(matches!(
            ch.delta.as_ref().unwrap().content,
            Some(Cow::Borrowed("hi"))
        ));
        assert!(c.usage.is_none() && ch.finish_reason.is_none());
        let c: Chunk = serde_json::from_str(r#"{"choices":null,"error":{"message":"x"}}"#).unwrap();
        assert!(c.choices.is_none() && c.error.is_some());
    }
}
