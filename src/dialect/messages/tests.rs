//! Unit tests of `translate::anthropic` (Messages ⇄ Chat translation).

use super::*;

#[test]
fn stop_reasons_roundtrip() {
    for (f, a) in [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
    ] {
        assert_eq!(finish_to_stop(f), a);
        assert_eq!(stop_to_finish(a), f);
    }
    assert_eq!(stop_to_finish("stop_sequence"), "stop");
}

#[test]
fn default_max_tokens_and_system() {
    let hub = json!({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"}]});
    let a = chat_to_request(&hub, "claude").unwrap();
    assert_eq!(a["max_tokens"], DEFAULT_MAX_TOKENS);
    assert_eq!(a["system"], "be brief");
    assert_eq!(a["messages"][0]["content"][0]["text"], "hi");
}

#[test]
fn tool_results_merge_into_one_user_turn() {
    let hub = json!({"messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "user", "content": "thanks"}]});
    let a = chat_to_request(&hub, "m").unwrap();
    let msgs = a["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    assert_eq!(msgs[1]["content"][0]["input"]["x"], 1);
    assert_eq!(msgs[1]["content"][1]["input"], json!({}));
    assert_eq!(msgs[2]["content"][0]["tool_use_id"], "a");
    assert_eq!(msgs[2]["content"][1]["tool_use_id"], "b");
    assert_eq!(msgs[2]["content"][2]["text"], "thanks");
}

#[test]
fn server_tool_rejected() {
    let body = br#"{"model":"m","max_tokens":5,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}"#;
    assert!(request_to_chat(body).is_err());
}

#[test]
fn usage_cache_semantics() {
    let u = usage_to_hub(
        &json!({"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 5}),
    );
    assert_eq!(u.prompt_tokens, Some(100));
    assert_eq!(u.cached_tokens, Some(90));
    let back = usage_from_hub(&u);
    assert_eq!(back["input_tokens"], 10);
    assert_eq!(back["cache_read_input_tokens"], 90);
}

#[test]
fn hostile_usage_numbers() {
    let read = |v: &str| {
        let v: Value = serde_json::from_str(&format!(
            r#"{{"input_tokens":{v},"cache_read_input_tokens":{v},"output_tokens":{v}}}"#
        ))
        .unwrap();
        usage_to_hub(&v)
    };
    for bad in ["-5", "1e308", "1.5", "18446744073709551616"] {
        let u = read(bad);
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens),
            (None, None),
            "{bad}"
        );
    }
    // exact, and sums saturate (here and in the hub's total)
    let u = read("18446744073709551615");
    assert_eq!(u.prompt_tokens, Some(u64::MAX));
    assert_eq!(u.completion_tokens, Some(u64::MAX));
    assert_eq!(util::chat_usage(&u)["total_tokens"], u64::MAX);
    let g = crate::dialect::gemini::usage_from_hub(&u);
    assert_eq!(g["totalTokenCount"], u64::MAX);
    let v: Value = serde_json::from_str(
        r#"{"candidatesTokenCount":18446744073709551615,"thoughtsTokenCount":7}"#,
    )
    .unwrap();
    assert_eq!(
        crate::dialect::gemini::usage_to_hub(&v).completion_tokens,
        Some(u64::MAX)
    );
    let r = crate::dialect::responses::usage_from_hub(&u);
    assert_eq!(r["total_tokens"], u64::MAX);
}
