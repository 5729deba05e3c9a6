//! What each provider kind receives of the agent-traffic fields on translated routes (a
//! capturing fake upstream records the bytes): Anthropic `cache_control` markers and thinking
//! blocks reach Anthropic providers from Chat and Responses clients; OpenAI's own API gets only
//! its documented fields (no markers, `thinking_blocks`, `reasoning_content`, `top_k`), while
//! OpenAI-compatible engines keep the conventions they read; `reasoning_effort` becomes
//! Anthropic `thinking` and Gemini `thinkingConfig`; structured output becomes the forced
//! answer tool / `responseSchema`; what cannot be mapped is a 400 in the client's dialect.
//! Every test runs under both I/O drivers.

#[path = "../common/mod.rs"]
mod common;

use common::capture::Capture;
use common::*;
use ringgate::config::Config;
use ringgate::server::{self, Running};
use serde_json::{json, Value};

fn gateway(up: std::net::SocketAddr, v: Variant) -> Running {
    let Variant { driver, shards } = v;
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\npin = false\ndriver = \"{driver}\"\n"
    );
    for (kind, model) in [
        ("openai", "to-oa"),
        ("openai-compatible", "to-compat"),
        ("anthropic", "to-an"),
        ("gemini", "to-ge"),
    ] {
        text.push_str(&format!(
            "[[provider]]\nname = \"{kind}\"\nkind = \"{kind}\"\nbase_url = \"http://{up}/v1\"\n\
             [[model]]\nname = \"{model}\"\nprovider = \"{kind}\"\nupstream_model = \"up\"\n"
        ));
    }
    server::start(Config::parse(&text).unwrap()).unwrap()
}

fn post(path: &str, body: &Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         anthropic-version: 2023-06-01\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const CC: &str = r#"{"type":"ephemeral"}"#;

/// An Anthropic client's agent turn: cached system and tools, thinking on, a signed thinking
/// block in the history, `top_k`.
fn messages_body(model: &str) -> Value {
    let cc: Value = serde_json::from_str(CC).unwrap();
    json!({"model": model, "max_tokens": 20000, "top_k": 40,
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "system": [{"type": "text", "text": "Stable.", "cache_control": cc}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": cc}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "go", "cache_control": cc}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "call f", "signature": "sig"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]})
}

#[test]
fn openai_gets_documented_fields_compatible_engines_the_conventions() {
    for d in variants() {
        let up = Capture::start("");
        let gw = gateway(up.addr, d);
        for (i, model) in ["to-oa", "to-compat"].into_iter().enumerate() {
            let r = request(gw.addr, &post("/v1/messages", &messages_body(model)));
            assert_eq!(r.status, 200, "{d} {model}: {}", r.text());
            let sent = up.nth(i).json();
            let text = sent.to_string();
            assert_eq!(sent["reasoning_effort"], "medium", "{d} {model}");
            assert!(!text.contains("thinking_blocks"), "{d} {model}: {text}");
            if model == "to-oa" {
                for k in ["cache_control", "reasoning_content", "top_k"] {
                    assert!(!text.contains(k), "{d} {model}: {k} in {text}");
                }
            } else {
                assert_eq!(sent["top_k"], 40);
                assert_eq!(
                    sent["messages"][0]["content"][0]["cache_control"]["type"],
                    "ephemeral"
                );
                assert_eq!(sent["tools"][0]["cache_control"]["type"], "ephemeral");
                assert_eq!(sent["messages"][2]["reasoning_content"], "call f");
            }
        }
    }
}

#[test]
fn chat_and_responses_clients_reach_anthropic_with_markers_and_thinking() {
    for d in variants() {
        let up = Capture::start("");
        let gw = gateway(up.addr, d);
        let cc: Value = serde_json::from_str(CC).unwrap();
        // A Chat client (LiteLLM-style markers, an echoed Anthropic thinking block).
        let chat = json!({"model": "to-an", "reasoning_effort": "low", "temperature": 0.3,
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "Stable.", "cache_control": cc}]},
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": null,
                 "thinking_blocks": [{"type": "thinking", "thinking": "call f", "signature": "sig"}],
                 "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "ok", "cache_control": cc}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}, "cache_control": cc}]});
        let r = request(gw.addr, &post("/v1/chat/completions", &chat));
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        let sent = up.nth(0).json();
        assert_eq!(
            sent["system"][0]["cache_control"]["type"], "ephemeral",
            "{d}"
        );
        assert_eq!(sent["tools"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(sent["messages"][1]["content"][0]["signature"], "sig");
        assert_eq!(
            sent["messages"][2]["content"][0]["cache_control"]["type"],
            "ephemeral"
        );
        assert_eq!(
            sent["thinking"],
            json!({"type": "enabled", "budget_tokens": 2048})
        );
        assert!(sent.get("temperature").is_none(), "refused with thinking");
        assert_eq!(sent["max_tokens"], 2048 + 4096);
        // A Responses client: a marked input part, structured output → the answer tool.
        let resp = json!({"model": "to-an", "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "Ada, 36", "cache_control": cc}]}],
            "text": {"format": {"type": "json_schema", "name": "p", "schema": {"type": "object",
                "properties": {"name": {"type": "string"}}}}}});
        let r = request(gw.addr, &post("/v1/responses", &resp));
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        let sent = up.nth(1).json();
        assert_eq!(
            sent["messages"][0]["content"][0]["cache_control"]["type"],
            "ephemeral"
        );
        assert_eq!(sent["tools"][0]["name"], "ringgate_structured_output");
        assert_eq!(
            sent["tool_choice"],
            json!({"type": "tool", "name": "ringgate_structured_output"})
        );
    }
}

#[test]
fn gemini_gets_thinking_config_and_response_schema() {
    for d in variants() {
        let up = Capture::start("");
        let gw = gateway(up.addr, d);
        let chat = json!({"model": "to-ge", "reasoning_effort": "high", "top_k": 8,
            "messages": [{"role": "user", "content": "go"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "p",
                "schema": {"type": "object", "additionalProperties": false,
                    "properties": {"a": {"type": "string"}}}}}});
        let r = request(gw.addr, &post("/v1/chat/completions", &chat));
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        let gc = &up.nth(0).json()["generationConfig"];
        assert_eq!(
            gc["thinkingConfig"],
            json!({"thinkingBudget": 16384, "includeThoughts": true})
        );
        assert_eq!(gc["topK"], 8);
        assert_eq!(gc["responseMimeType"], "application/json");
        assert_eq!(
            gc["responseSchema"],
            json!({"type": "object", "properties": {"a": {"type": "string"}}})
        );
    }
}

#[test]
fn what_cannot_be_mapped_is_a_400_in_the_client_dialect() {
    for d in variants() {
        let up = Capture::start("");
        let gw = gateway(up.addr, d);
        let msgs = json!([{"role": "user", "content": "go"}]);
        for (path, body, what) in [
            (
                "/v1/chat/completions",
                json!({"model": "to-an", "n": 2, "messages": msgs}),
                "`n`",
            ),
            (
                "/v1/chat/completions",
                json!({"model": "to-ge", "n": 3, "messages": msgs}),
                "`n`",
            ),
            (
                "/v1/chat/completions",
                json!({"model": "to-an", "messages": msgs, "response_format": {"type": "json_schema",
                    "json_schema": {"name": "l", "schema": {"type": "array"}}}}),
                "top-level type",
            ),
            (
                "/v1/messages",
                json!({"model": "to-oa", "max_tokens": 5, "messages": msgs,
                    "tools": [{"name": "ringgate_structured_output", "input_schema": {"type": "object"}}]}),
                "reserved",
            ),
        ] {
            let r = request(gw.addr, &post(path, &body));
            assert_eq!(r.status, 400, "{d} {path} {what}: {}", r.text());
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            let m = v["error"]["message"].as_str().unwrap_or_default();
            assert!(m.contains(what), "{d}: {m}");
            if path == "/v1/messages" {
                assert_eq!(v["type"], "error");
                assert_eq!(v["error"]["type"], "invalid_request_error");
            } else {
                assert_eq!(v["error"]["type"], "invalid_request_error");
            }
        }
        assert_eq!(up.count(), 0, "nothing reached the upstream");
    }
}
