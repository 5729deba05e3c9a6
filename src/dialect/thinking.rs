//! Thinking / reasoning across dialects: how the hub carries a model's reasoning, and the
//! documented table between OpenAI `reasoning_effort` and Anthropic `thinking.budget_tokens`.
//!
//! Hub conventions (a Chat request / completion / chunk, as OpenAI-compatible engines write
//! them):
//! * request `reasoning_effort` (`minimal` | `low` | `medium` | `high`; `none` = off);
//! * assistant `reasoning_content`: the reasoning text (vLLM, DeepSeek; `reasoning`, vLLM's
//!   newer name, is read too), in messages and in stream deltas;
//! * assistant `thinking_blocks`: Anthropic `thinking` / `redacted_thinking` blocks verbatim,
//!   signatures included (LiteLLM's convention), so a Chat client that echoes the assistant
//!   message gets them back to an Anthropic provider unchanged.
//!
//! Effort ⇄ budget (Anthropic needs 1,024 ≤ budget < `max_tokens`):
//!
//! | `reasoning_effort` | `budget_tokens` | back from `budget_tokens` |
//! |---|---|---|
//! | `minimal` | 1,024 | < 4,096 → `low` |
//! | `low` | 2,048 | < 4,096 → `low` |
//! | `medium` | 8,192 | 4,096 – 16,383 → `medium` |
//! | `high` | 16,384 | ≥ 16,384 → `high` |
//! | `xhigh` | 32,768 | |
//! | `none` | thinking off | `disabled` → no `reasoning_effort` |
//!
//! The budget is clamped to the client's output cap − 1 (Chat's `max_completion_tokens`
//! counts reasoning, as Anthropic's `max_tokens` counts thinking); a cap too small for the
//! 1,024 minimum means no thinking. Without a client cap, `max_tokens` = budget + the default
//! cap. Anthropic `adaptive` thinking maps to `medium`.
//!
//! Must not: perform IO, or allocate beyond the values it returns.

use super::util::{s, Obj};
use serde_json::{json, Value};

/// Anthropic's smallest thinking budget.
pub const MIN_BUDGET: u64 = 1024;

/// `reasoning_effort` → `budget_tokens` (`None`: thinking off).
pub fn effort_to_budget(effort: &str) -> Option<u64> {
    match effort {
        "none" => None,
        "minimal" => Some(MIN_BUDGET),
        "low" => Some(2048),
        "high" => Some(16_384),
        "xhigh" => Some(32_768),
        _ => Some(8192),
    }
}

/// `budget_tokens` → `reasoning_effort`.
pub fn budget_to_effort(budget: u64) -> &'static str {
    match budget {
        0..=4095 => "low",
        4096..=16_383 => "medium",
        _ => "high",
    }
}

/// An Anthropic request's `thinking` object → hub `reasoning_effort` (`None`: off).
pub(crate) fn thinking_to_effort(thinking: &Value) -> Option<&'static str> {
    match s(thinking, "type") {
        Some("enabled") => Some(budget_to_effort(
            thinking
                .get("budget_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        )),
        Some("adaptive") => Some("medium"),
        _ => None,
    }
}

/// The Anthropic `thinking` object and `max_tokens` for a hub request's `reasoning_effort`,
/// given the client's output cap (`None`: the client set none, `default_max` applies).
pub(crate) fn effort_to_thinking(
    effort: &str,
    client_max: Option<u64>,
    default_max: u64,
) -> Option<(Value, u64)> {
    let budget = effort_to_budget(effort)?;
    let (budget, max) = match client_max {
        Some(m) => (budget.min(m.saturating_sub(1)), m),
        None => (budget, budget + default_max),
    };
    (budget >= MIN_BUDGET).then(|| (json!({"type": "enabled", "budget_tokens": budget}), max))
}

/// Anthropic assistant content blocks → (reasoning text, thinking blocks kept verbatim).
pub(crate) fn blocks_to_hub(blocks: &[Value]) -> (String, Vec<Value>) {
    let mut text = String::new();
    let mut kept = Vec::new();
    for b in blocks {
        match s(b, "type") {
            Some("thinking") => {
                text.push_str(s(b, "thinking").unwrap_or_default());
                kept.push(b.clone());
            }
            Some("redacted_thinking") => kept.push(b.clone()),
            _ => {}
        }
    }
    (text, kept)
}

/// Put reasoning on a hub assistant message (nothing when there is none).
pub(crate) fn set_on_message(m: &mut Obj, text: String, blocks: Vec<Value>) {
    if !text.is_empty() {
        m.insert("reasoning_content".into(), text.into());
    }
    if !blocks.is_empty() {
        m.insert("thinking_blocks".into(), Value::Array(blocks));
    }
}

/// A hub assistant message's reasoning text (`reasoning_content`, or vLLM's `reasoning`).
pub(crate) fn reasoning_text(msg: &Value) -> Option<&str> {
    s(msg, "reasoning_content")
        .or_else(|| s(msg, "reasoning"))
        .filter(|t| !t.is_empty())
}

/// A hub assistant message's Anthropic thinking blocks: `thinking_blocks` verbatim, else (for
/// answers only: `with_text`) its reasoning text as one `thinking` block without a signature.
pub(crate) fn message_blocks(msg: &Value, with_text: bool) -> Vec<Value> {
    if let Some(b) = msg.get("thinking_blocks").and_then(Value::as_array) {
        let valid = |b: &&Value| matches!(s(b, "type"), Some("thinking" | "redacted_thinking"));
        return b.iter().filter(valid).cloned().collect();
    }
    match reasoning_text(msg) {
        Some(t) if with_text => vec![json!({"type": "thinking", "thinking": t, "signature": ""})],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips() {
        for e in ["low", "medium", "high"] {
            assert_eq!(budget_to_effort(effort_to_budget(e).unwrap()), e);
        }
        assert_eq!(
            budget_to_effort(effort_to_budget("minimal").unwrap()),
            "low"
        );
        assert_eq!(effort_to_budget("none"), None);
        let t = json!({"type": "enabled", "budget_tokens": 10_000});
        assert_eq!(thinking_to_effort(&t), Some("medium"));
        assert_eq!(thinking_to_effort(&json!({"type": "disabled"})), None);
    }

    #[test]
    fn budget_fits_the_output_cap() {
        let (t, max) = effort_to_thinking("high", None, 4096).unwrap();
        assert_eq!((t["budget_tokens"].as_u64(), max), (Some(16_384), 20_480));
        let (t, max) = effort_to_thinking("high", Some(5000), 4096).unwrap();
        assert_eq!((t["budget_tokens"].as_u64(), max), (Some(4999), 5000));
        assert!(effort_to_thinking("low", Some(1000), 4096).is_none());
        assert!(effort_to_thinking("none", None, 4096).is_none());
    }

    #[test]
    fn blocks_and_messages() {
        let blocks = vec![
            json!({"type": "thinking", "thinking": "hmm", "signature": "sig"}),
            json!({"type": "redacted_thinking", "data": "xyz"}),
            json!({"type": "text", "text": "hi"}),
        ];
        let (text, kept) = blocks_to_hub(&blocks);
        assert_eq!((text.as_str(), kept.len()), ("hmm", 2));
        let mut m = Obj::new();
        set_on_message(&mut m, text, kept);
        let msg = Value::Object(m);
        assert_eq!(message_blocks(&msg, false).len(), 2);
        let plain = json!({"role": "assistant", "reasoning_content": "why"});
        assert_eq!(message_blocks(&plain, false), Vec::<Value>::new());
        assert_eq!(message_blocks(&plain, true)[0]["thinking"], "why");
    }
}
