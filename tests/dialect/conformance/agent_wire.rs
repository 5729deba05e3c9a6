//! Fixtures of the agent sections: upstream answers and streams with reasoning, cache usage and
//! in-stream errors, and client requests asking for reasoning, structured output, tool-choice
//! variants and cache markers, in each dialect's documented wire format.

use ringgate::dialect::Dialect;
use serde_json::{json, Value};

use super::{sse, R, SIG};

// ------------------------------------------------------------ fixtures

pub(super) fn chat_chunk(delta: Value, finish: Value) -> (Option<&'static str>, Value) {
    (
        None,
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "u",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
    )
}

pub(super) fn an(v: Value) -> (Option<&'static str>, Value) {
    // Anthropic and Responses events are named by their `type`.
    let name: &'static str = match v["type"].as_str().unwrap_or_default() {
        "message_start" => "message_start",
        "content_block_start" => "content_block_start",
        "content_block_delta" => "content_block_delta",
        "content_block_stop" => "content_block_stop",
        "message_delta" => "message_delta",
        "message_stop" => "message_stop",
        "error" => "error",
        "response.created" => "response.created",
        "response.output_item.added" => "response.output_item.added",
        "response.reasoning_summary_text.delta" => "response.reasoning_summary_text.delta",
        "response.output_text.delta" => "response.output_text.delta",
        "response.completed" => "response.completed",
        "response.failed" => "response.failed",
        _ => "other",
    };
    (Some(name), v)
}

/// An upstream answer with reasoning `R` (Anthropic: signed `SIG`), text "Hello", and a
/// cache read of 900 of 1,000 prompt tokens.
pub(super) fn reasoning_answer(up: Dialect) -> Value {
    match up {
        Dialect::Chat => {
            json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "u",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello", "reasoning_content": R},
                "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 7, "total_tokens": 1007,
                "prompt_tokens_details": {"cached_tokens": 900}}})
        }
        Dialect::Responses => {
            json!({"id": "resp_1", "object": "response", "created_at": 1, "status": "completed",
            "model": "u", "output": [
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": R}]},
                {"type": "message", "id": "m1", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}],
            "usage": {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 900},
                "output_tokens": 7, "total_tokens": 1007}})
        }
        Dialect::Messages => {
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "u",
            "content": [{"type": "thinking", "thinking": R, "signature": SIG}, {"type": "text", "text": "Hello"}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 100, "cache_read_input_tokens": 900, "output_tokens": 7}})
        }
        Dialect::Gemini => json!({"candidates": [{"content": {"role": "model", "parts": [
                {"text": R, "thought": true}, {"text": "Hello"}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 1000, "cachedContentTokenCount": 900,
                "candidatesTokenCount": 7, "totalTokenCount": 1007}, "modelVersion": "u"}),
    }
}

/// The same answer streamed (reasoning in two deltas).
pub(super) fn reasoning_stream(up: Dialect) -> Vec<u8> {
    let (r1, r2) = R.split_at(2);
    match up {
        Dialect::Chat => sse(&[
            chat_chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chat_chunk(json!({"reasoning_content": r1}), Value::Null),
            chat_chunk(json!({"reasoning_content": r2}), Value::Null),
            chat_chunk(json!({"content": "Hello"}), Value::Null),
            chat_chunk(json!({}), json!("stop")),
            (
                None,
                json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "u", "choices": [],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 7, "total_tokens": 1007,
                    "prompt_tokens_details": {"cached_tokens": 900}}}),
            ),
            (None, json!("[DONE]")),
        ]),
        Dialect::Responses => sse(&[
            an(
                json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
            ),
            an(
                json!({"type": "response.output_item.added", "output_index": 0,
                "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
            ),
            an(
                json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "delta": r1}),
            ),
            an(
                json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "delta": r2}),
            ),
            an(
                json!({"type": "response.output_text.delta", "item_id": "m1", "output_index": 1, "delta": "Hello"}),
            ),
            an(
                json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": [],
                "usage": {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 900},
                    "output_tokens": 7, "total_tokens": 1007}}}),
            ),
        ]),
        Dialect::Messages => sse(&[
            an(
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                "content": [], "model": "u", "usage": {"input_tokens": 100, "cache_read_input_tokens": 900, "output_tokens": 1}}}),
            ),
            an(
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            ),
            an(
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": r1}}),
            ),
            an(
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": r2}}),
            ),
            an(
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": SIG}}),
            ),
            an(json!({"type": "content_block_stop", "index": 0})),
            an(
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            ),
            an(
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hello"}}),
            ),
            an(json!({"type": "content_block_stop", "index": 1})),
            an(
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}}),
            ),
            an(json!({"type": "message_stop"})),
        ]),
        Dialect::Gemini => sse(&[
            (
                None,
                json!({"candidates": [{"content": {"role": "model", "parts": [{"text": r1, "thought": true}]}, "index": 0}]}),
            ),
            (
                None,
                json!({"candidates": [{"content": {"role": "model", "parts": [{"text": r2, "thought": true}]}, "index": 0}]}),
            ),
            (
                None,
                json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello"}]}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 1000, "cachedContentTokenCount": 900,
                    "candidatesTokenCount": 7, "totalTokenCount": 1007}}),
            ),
        ]),
    }
}

/// One text delta, then the upstream's own in-stream error (as each provider sends one).
pub(super) fn failing_stream(up: Dialect) -> Vec<u8> {
    match up {
        Dialect::Chat => sse(&[
            chat_chunk(json!({"content": "Hel"}), Value::Null),
            (
                None,
                json!({"error": {"message": "boom", "type": "server_error"}}),
            ),
            (None, json!("[DONE]")),
        ]),
        Dialect::Responses => sse(&[
            an(
                json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
            ),
            an(
                json!({"type": "response.output_text.delta", "item_id": "m1", "output_index": 0, "delta": "Hel"}),
            ),
            an(
                json!({"type": "response.failed", "response": {"id": "resp_1", "status": "failed",
                "error": {"code": "server_error", "message": "boom"}}}),
            ),
        ]),
        Dialect::Messages => sse(&[
            an(
                json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 1}}}),
            ),
            an(
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            an(
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
            ),
            an(json!({"type": "error", "error": {"type": "overloaded_error", "message": "boom"}})),
        ]),
        Dialect::Gemini => sse(&[
            (
                None,
                json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}, "index": 0}]}),
            ),
            (
                None,
                json!({"error": {"code": 503, "message": "boom", "status": "UNAVAILABLE"}}),
            ),
        ]),
    }
}

pub(super) fn with(base: Value, extra: Value) -> Value {
    let mut b = base;
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

/// A minimal client request of dialect `d` plus `extra` top-level fields.
pub(super) fn client(d: Dialect, extra: Value) -> Value {
    let base = match d {
        Dialect::Chat => json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        Dialect::Responses => json!({"model": "m", "input": "hi"}),
        Dialect::Messages => {
            json!({"model": "m", "max_tokens": 30000, "messages": [{"role": "user", "content": "hi"}]})
        }
        Dialect::Gemini => json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
    };
    with(base, extra)
}

pub(super) fn tools(d: Dialect) -> Value {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    match d {
        Dialect::Chat => json!([
            {"type": "function", "function": {"name": "f", "parameters": schema}},
            {"type": "function", "function": {"name": "g", "parameters": schema}}]),
        Dialect::Responses => json!([
            {"type": "function", "name": "f", "parameters": schema},
            {"type": "function", "name": "g", "parameters": schema}]),
        Dialect::Messages => json!([
            {"name": "f", "input_schema": schema}, {"name": "g", "input_schema": schema}]),
        Dialect::Gemini => json!([{"functionDeclarations": [
            {"name": "f", "parameters": schema}, {"name": "g", "parameters": schema}]}]),
    }
}

/// The client's reasoning knob asking for effort `high` (Anthropic / Gemini: 16,384 tokens).
pub(super) fn reasoning_req(d: Dialect) -> Value {
    match d {
        Dialect::Chat => client(
            d,
            json!({"reasoning_effort": "high", "max_completion_tokens": 30000}),
        ),
        Dialect::Responses => client(
            d,
            json!({"reasoning": {"effort": "high"}, "max_output_tokens": 30000}),
        ),
        Dialect::Messages => client(
            d,
            json!({"thinking": {"type": "enabled", "budget_tokens": 16384}}),
        ),
        Dialect::Gemini => client(
            d,
            json!({"generationConfig": {"maxOutputTokens": 30000,
            "thinkingConfig": {"thinkingBudget": 16384, "includeThoughts": true}}}),
        ),
    }
}

/// Client request with a structured-output schema (property `city`).
pub(super) fn structured_req(d: Dialect) -> Value {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    match d {
        Dialect::Chat => client(
            d,
            json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "w", "schema": schema}}}),
        ),
        Dialect::Responses => client(
            d,
            json!({"text": {"format": {"type": "json_schema",
            "name": "w", "schema": schema}}}),
        ),
        Dialect::Messages => client(
            d,
            json!({"output_format": {"type": "json_schema", "schema": schema}}),
        ),
        Dialect::Gemini => client(
            d,
            json!({"generationConfig": {"responseMimeType": "application/json",
            "responseSchema": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}}),
        ),
    }
}

/// The four tool-choice variants in dialect `d` (named: `g`), with parallel calls off.
pub(super) fn tool_choice_req(d: Dialect, variant: &str) -> Value {
    let t = tools(d);
    match d {
        Dialect::Chat => {
            let c = match variant {
                "named" => json!({"type": "function", "function": {"name": "g"}}),
                v => json!(v),
            };
            client(
                d,
                json!({"tools": t, "tool_choice": c, "parallel_tool_calls": false}),
            )
        }
        Dialect::Responses => {
            let c = match variant {
                "named" => json!({"type": "function", "name": "g"}),
                v => json!(v),
            };
            client(
                d,
                json!({"tools": t, "tool_choice": c, "parallel_tool_calls": false}),
            )
        }
        Dialect::Messages => {
            let ty = match variant {
                "required" => "any",
                "named" => "tool",
                v => v,
            };
            let mut c = json!({"type": ty, "disable_parallel_tool_use": true});
            if variant == "named" {
                c["name"] = json!("g");
            }
            if variant == "none" {
                c = json!({"type": "none"});
            }
            client(d, json!({"tools": t, "tool_choice": c}))
        }
        Dialect::Gemini => {
            let mut f = json!({"mode": match variant {
                "required" | "named" => "ANY",
                "none" => "NONE",
                _ => "AUTO",
            }});
            if variant == "named" {
                f["allowedFunctionNames"] = json!(["g"]);
            }
            client(
                d,
                json!({"tools": t, "toolConfig": {"functionCallingConfig": f}}),
            )
        }
    }
}

pub(super) fn cache_req(d: Dialect) -> Value {
    let cc = json!({"type": "ephemeral"});
    match d {
        Dialect::Chat => client(
            d,
            json!({"messages": [
            {"role": "system", "content": [{"type": "text", "text": "S", "cache_control": cc}]},
            {"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}, "cache_control": cc}]}),
        ),
        Dialect::Responses => client(
            d,
            json!({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "S", "cache_control": cc}]}],
            "tools": [{"type": "function", "name": "f", "cache_control": cc}]}),
        ),
        Dialect::Messages => client(
            d,
            json!({"system": [{"type": "text", "text": "S", "cache_control": cc}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": cc}]}),
        ),
        Dialect::Gemini => client(d, json!({})),
    }
}
