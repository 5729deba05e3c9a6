//! Fixtures of the conformance matrix: one client request, one upstream
//! response and one upstream stream per dialect, written from the providers'
//! documented wire formats (text, a tool call, an image, a system prompt).

use ringgate::dialect::Dialect;
use serde_json::{json, Value};

use super::agent::sse;
use super::{ARGS, IMG};

pub fn client_request(d: Dialect) -> Value {
    match d {
        Dialect::Chat => json!({"model": "m", "messages": [
            {"role": "system", "content": "SYS-PROMPT"},
            {"role": "user", "content": [{"type": "text", "text": "hello"},
                {"type": "image_url", "image_url": {"url": IMG}}]}]}),
        Dialect::Responses => json!({"model": "m", "instructions": "SYS-PROMPT", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hello"},
                {"type": "input_image", "image_url": IMG}]}]}),
        Dialect::Messages => {
            json!({"model": "m", "max_tokens": 10, "system": "SYS-PROMPT", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hello"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}}]}]})
        }
        Dialect::Gemini => {
            json!({"systemInstruction": {"parts": [{"text": "SYS-PROMPT"}]}, "contents": [
            {"role": "user", "parts": [{"text": "hello"},
                {"inlineData": {"mimeType": "image/png", "data": "QUJD"}}]}]})
        }
    }
}

pub fn upstream_response(d: Dialect, tool: bool) -> Value {
    match (d, tool) {
        (Dialect::Chat, false) => {
            json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "u",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello world"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}})
        }
        (Dialect::Chat, true) => {
            json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "u",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
                "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}})
        }
        (Dialect::Responses, false) => {
            json!({"id": "resp_1", "object": "response", "created_at": 1,
            "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "model": "u",
            "output": [{"type": "message", "id": "m1", "status": "incomplete", "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello world", "annotations": []}]}],
            "usage": {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}})
        }
        (Dialect::Responses, true) => json!({"id": "resp_1", "object": "response", "created_at": 1,
            "status": "completed", "incomplete_details": null, "model": "u",
            "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                "arguments": ARGS, "status": "completed"}],
            "usage": {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}}),
        (Dialect::Messages, false) => {
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "u",
            "content": [{"type": "text", "text": "Hello world"}], "stop_reason": "max_tokens",
            "stop_sequence": null, "usage": {"input_tokens": 11, "output_tokens": 7}})
        }
        (Dialect::Messages, true) => {
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "u",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            "stop_reason": "tool_use", "stop_sequence": null, "usage": {"input_tokens": 11, "output_tokens": 7}})
        }
        (Dialect::Gemini, false) => {
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello world"}]},
            "finishReason": "MAX_TOKENS", "index": 0}],
            "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 7, "totalTokenCount": 18}, "modelVersion": "u"})
        }
        (Dialect::Gemini, true) => json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 7, "totalTokenCount": 18}, "modelVersion": "u"}),
    }
}

fn chat_chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "u",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

pub fn upstream_stream(d: Dialect, tool: bool) -> Vec<u8> {
    let (a1, a2) = ("{\"city\":", "\"Paris\"}");
    match d {
        Dialect::Chat => {
            let mut ev = vec![(
                None,
                chat_chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            )];
            if tool {
                ev.push((
                    None,
                    chat_chunk(json!({"content": "Checking."}), Value::Null),
                ));
                ev.push((
                    None,
                    chat_chunk(
                        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": ""}}]}),
                        Value::Null,
                    ),
                ));
                for a in [a1, a2] {
                    ev.push((
                        None,
                        chat_chunk(
                            json!({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}),
                            Value::Null,
                        ),
                    ));
                }
                ev.push((None, chat_chunk(json!({}), json!("tool_calls"))));
            } else {
                ev.push((None, chat_chunk(json!({"content": "Hel"}), Value::Null)));
                ev.push((
                    None,
                    chat_chunk(json!({"content": "lo world"}), Value::Null),
                ));
                ev.push((None, chat_chunk(json!({}), json!("length"))));
            }
            ev.push((None, json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "u", "choices": [],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}})));
            ev.push((None, json!("[DONE]")));
            sse(&ev)
        }
        Dialect::Messages => {
            let mut ev = vec![(
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": "msg_1",
                "type": "message", "role": "assistant", "content": [], "model": "u", "stop_reason": null,
                "stop_sequence": null, "usage": {"input_tokens": 11, "output_tokens": 1}}}),
            )];
            let start = |i: u64, b: Value| {
                (
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": i, "content_block": b}),
                )
            };
            let delta = |i: u64, d: Value| {
                (
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": i, "delta": d}),
                )
            };
            let stop = |i: u64| {
                (
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": i}),
                )
            };
            ev.push(start(0, json!({"type": "text", "text": ""})));
            ev.push((Some("ping"), json!({"type": "ping"})));
            if tool {
                ev.push(delta(0, json!({"type": "text_delta", "text": "Checking."})));
                ev.push(stop(0));
                ev.push(start(1, json!({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}})));
                for a in [a1, a2] {
                    ev.push(delta(
                        1,
                        json!({"type": "input_json_delta", "partial_json": a}),
                    ));
                }
                ev.push(stop(1));
            } else {
                ev.push(delta(0, json!({"type": "text_delta", "text": "Hel"})));
                ev.push(delta(0, json!({"type": "text_delta", "text": "lo world"})));
                ev.push(stop(0));
            }
            let reason = if tool { "tool_use" } else { "max_tokens" };
            ev.push((
                Some("message_delta"),
                json!({"type": "message_delta", "delta": {"stop_reason": reason,
                "stop_sequence": null}, "usage": {"output_tokens": 7}}),
            ));
            ev.push((Some("message_stop"), json!({"type": "message_stop"})));
            sse(&ev)
        }
        Dialect::Responses => {
            let resp = |status: &str| json!({"id": "resp_1", "object": "response", "created_at": 1, "status": status, "model": "u", "output": []});
            let mut ev = vec![(
                Some("response.created"),
                json!({"type": "response.created", "sequence_number": 0, "response": resp("in_progress")}),
            )];
            ev.push((Some("response.output_item.added"), json!({"type": "response.output_item.added", "sequence_number": 1,
                "output_index": 0, "item": {"id": "m1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}})));
            ev.push((Some("response.content_part.added"), json!({"type": "response.content_part.added", "sequence_number": 2,
                "item_id": "m1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})));
            let text = |t: &str| {
                (
                    Some("response.output_text.delta"),
                    json!({"type": "response.output_text.delta",
                "sequence_number": 3, "item_id": "m1", "output_index": 0, "content_index": 0, "delta": t}),
                )
            };
            let usage = json!({"input_tokens": 11, "output_tokens": 7, "total_tokens": 18});
            if tool {
                ev.push(text("Checking."));
                ev.push((Some("response.output_item.added"), json!({"type": "response.output_item.added", "sequence_number": 4,
                    "output_index": 1, "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                    "arguments": "", "status": "in_progress"}})));
                for a in [a1, a2] {
                    ev.push((
                        Some("response.function_call_arguments.delta"),
                        json!({"type": "response.function_call_arguments.delta",
                        "sequence_number": 5, "item_id": "fc_1", "output_index": 1, "delta": a}),
                    ));
                }
                ev.push((
                    Some("response.function_call_arguments.done"),
                    json!({"type": "response.function_call_arguments.done",
                    "sequence_number": 7, "item_id": "fc_1", "output_index": 1, "arguments": ARGS}),
                ));
                let mut r = resp("completed");
                r["usage"] = usage;
                ev.push((
                    Some("response.completed"),
                    json!({"type": "response.completed", "sequence_number": 8, "response": r}),
                ));
            } else {
                ev.push(text("Hel"));
                ev.push(text("lo world"));
                let mut r = resp("incomplete");
                r["usage"] = usage;
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
                ev.push((
                    Some("response.incomplete"),
                    json!({"type": "response.incomplete", "sequence_number": 6, "response": r}),
                ));
            }
            sse(&ev)
        }
        Dialect::Gemini => {
            let chunk = |parts: Value, finish: Option<&str>, out: u64| {
                let mut c = json!({"content": {"role": "model", "parts": parts}, "index": 0});
                if let Some(f) = finish {
                    c["finishReason"] = json!(f);
                }
                (
                    None,
                    json!({"candidates": [c], "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": out,
                    "totalTokenCount": 11 + out}, "modelVersion": "u"}),
                )
            };
            let ev = if tool {
                vec![
                    chunk(json!([{"text": "Checking."}]), None, 2),
                    chunk(
                        json!([{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]),
                        Some("STOP"),
                        7,
                    ),
                ]
            } else {
                vec![
                    chunk(json!([{"text": "Hel"}]), None, 2),
                    chunk(json!([{"text": "lo world"}]), Some("MAX_TOKENS"), 7),
                ]
            };
            sse(&ev)
        }
    }
}
