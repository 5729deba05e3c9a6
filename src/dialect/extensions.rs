//! The hub's fields beyond OpenAI's documented Chat request, and what each Chat upstream gets
//! of them. A hub built from another dialect may carry: `top_k` (Anthropic, Gemini),
//! assistant `reasoning_content` and `thinking_blocks` (`thinking`), and `cache_control`
//! markers on messages, content parts, tools and tool calls (`cache`).
//!
//! | field | OpenAI / Azure (`openai`, `azure` kinds) | OpenAI-compatible engines |
//! |---|---|---|
//! | `top_k` | dropped (OpenAI rejects unknown fields) | kept (vLLM, SGLang, llama.cpp read it) |
//! | `reasoning_content` | dropped | kept (vLLM, DeepSeek: reasoning of earlier turns) |
//! | `thinking_blocks` | dropped | dropped (Anthropic signatures mean nothing there) |
//! | `cache_control` | dropped (OpenAI caches prefixes on its own) | kept (OpenRouter, LiteLLM proxies honour it) |
//!
//! Must not: perform IO, or allocate beyond the values it edits.

use serde_json::Value;

/// Which Chat upstream a hub request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatUpstream {
    /// OpenAI's own API (and Azure OpenAI): documented fields only.
    OpenAi,
    /// An OpenAI-compatible engine: the conventions it reads are kept.
    Compatible,
}

/// Remove what `to` does not take from a hub request (see the table).
pub fn fit_chat_upstream(hub: &mut Value, to: ChatUpstream) {
    let strict = to == ChatUpstream::OpenAi;
    let Some(o) = hub.as_object_mut() else {
        return;
    };
    if strict {
        o.remove("top_k");
    }
    if let Some(msgs) = o.get_mut("messages").and_then(Value::as_array_mut) {
        for m in msgs.iter_mut().filter_map(Value::as_object_mut) {
            m.remove("thinking_blocks");
            if strict {
                m.remove("reasoning_content");
                m.remove("cache_control");
                for part in m
                    .get_mut("content")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    unmark(part);
                }
                for tc in m
                    .get_mut("tool_calls")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    unmark(tc);
                }
            }
        }
    }
    if strict {
        for t in o
            .get_mut("tools")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            unmark(t);
        }
    }
}

fn unmark(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        o.remove("cache_control");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hub() -> Value {
        json!({"top_k": 5, "messages": [
            {"role": "system", "content": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": "a", "reasoning_content": "r",
             "thinking_blocks": [{"type": "thinking", "thinking": "r", "signature": "x"}],
             "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}, "cache_control": {"type": "ephemeral"}}]}],
            "tools": [{"type": "function", "function": {"name": "f"}, "cache_control": {"type": "ephemeral"}}]})
    }

    #[test]
    fn openai_gets_documented_fields_only() {
        let mut h = hub();
        fit_chat_upstream(&mut h, ChatUpstream::OpenAi);
        let text = h.to_string();
        for k in [
            "top_k",
            "reasoning_content",
            "thinking_blocks",
            "cache_control",
        ] {
            assert!(!text.contains(k), "{k} left in {text}");
        }
    }

    #[test]
    fn compatible_keeps_conventions() {
        let mut h = hub();
        fit_chat_upstream(&mut h, ChatUpstream::Compatible);
        assert_eq!(h["top_k"], 5);
        assert_eq!(h["messages"][1]["reasoning_content"], "r");
        assert!(h["messages"][1].get("thinking_blocks").is_none());
        assert_eq!(h["tools"][0]["cache_control"]["type"], "ephemeral");
    }
}
