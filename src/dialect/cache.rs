//! Prompt caching markers across dialects: Anthropic `cache_control` on system blocks,
//! message content blocks, tool results, tool uses and tools.
//!
//! Hub convention (LiteLLM's and OpenRouter's, for Chat bodies): `cache_control` on a Chat
//! content part (`{"type":"text","text":…,"cache_control":{…}}`), on a tool (next to
//! `function`), on a tool call, or on a whole message (it then marks the message's last
//! block). A system prompt carrying markers stays an array of text parts. Going to Anthropic
//! every marker lands on the block it was on; OpenAI caches on its own (no markers): strict
//! OpenAI upstreams get the hub without them (`extensions`), OpenAI-compatible ones keep them
//! (proxies such as OpenRouter and LiteLLM honour them). Cache usage is carried by
//! `Usage::cached_tokens` (see `anthropic::usage_to_hub`).
//!
//! Must not: perform IO, or allocate beyond the values it returns.

use super::util::Obj;
use serde_json::Value;

/// The `cache_control` marker of a block, part, message or tool.
pub(crate) fn marker(v: &Value) -> Option<&Value> {
    v.get("cache_control").filter(|c| !c.is_null())
}

/// Whether `v` carries a marker.
pub(crate) fn has(v: &Value) -> bool {
    marker(v).is_some()
}

/// Copy `from`'s marker onto `to` (an object under construction).
pub(crate) fn copy(from: &Value, to: &mut Obj) {
    if let Some(c) = marker(from) {
        to.insert("cache_control".into(), c.clone());
    }
}

/// Copy `from`'s marker onto the value `to` (when it is an object).
pub(crate) fn copy_onto(from: &Value, to: &mut Value) {
    if let (Some(c), Some(o)) = (marker(from), to.as_object_mut()) {
        o.insert("cache_control".into(), c.clone());
    }
}

/// A message-level marker goes on the message's last block (when that has none).
pub(crate) fn mark_last(message: &Value, blocks: &mut [Value]) {
    if let (Some(c), Some(last)) = (marker(message), blocks.last_mut()) {
        if let Some(o) = last.as_object_mut() {
            o.entry("cache_control").or_insert_with(|| c.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn markers_move() {
        let from = json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}});
        let mut to = Obj::new();
        copy(&from, &mut to);
        assert_eq!(to["cache_control"]["type"], "ephemeral");
        let msg = json!({"role": "user", "content": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"}});
        let mut blocks = vec![
            json!({"type": "text", "text": "a"}),
            json!({"type": "text", "text": "b"}),
        ];
        mark_last(&msg, &mut blocks);
        assert!(!has(&blocks[0]));
        assert_eq!(blocks[1]["cache_control"]["ttl"], "1h");
        assert!(!has(&json!({"cache_control": null})));
    }
}
