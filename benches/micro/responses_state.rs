//! Group `responses_state`: what the Responses state store costs a translated Responses request
//! (Responses client → Chat upstream), against the same work with the store off:
//! - request without references: translation alone (off) vs + the reference byte search and
//!   the own-input read kept for recording (on)
//! - non-stream answer: Chat → Responses translation alone (off) vs + recording it (parse,
//!   items, one store insert) (on)
//! - a lookup, and the expansion of a tool loop's second step (two item references)

use criterion::{black_box, Criterion, Throughput};
use ringgate::admit::Budget;
use ringgate::config::responses::ResponsesConfig;
use ringgate::dialect::{self, references, Dialect};
use ringgate::responses_state::{ShardStore, Shared};
use serde_json::json;

fn responses_body(prompt_bytes: usize) -> Vec<u8> {
    let text = "lorem ipsum dolor sit amet ".repeat(prompt_bytes / 27 + 1);
    serde_json::to_vec(&json!({
        "model": "gpt-4o-mini", "instructions": "You are a helpful assistant.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": &text[..prompt_bytes]}]}],
        "max_output_tokens": 256, "temperature": 0.2,
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    }))
    .unwrap_or_default()
}

fn tool_call_completion() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": "chatcmpl-0123456789", "object": "chat.completion", "created": 1_700_000_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Let me check.",
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"location\":\"Paris, France\"}"}}]},
            "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 512, "completion_tokens": 20, "total_tokens": 532}
    }))
    .unwrap_or_default()
}

pub fn responses_state(c: &mut Criterion) {
    let budget = Budget::new(1 << 30, 1024, 0);
    let shared = Shared::from_config(&ResponsesConfig::default(), 1, false);
    let store = ShardStore::new(shared, 0, &budget);
    let tenant = store.tenant(false, Some(b"sk-bench"));
    let body = responses_body(2_000);
    let answer = tool_call_completion();

    let mut g = c.benchmark_group("responses_state");
    g.throughput(Throughput::Elements(1));
    g.bench_function("request_no_refs_store_off", |b| {
        b.iter(|| {
            let hub = dialect::request_to_chat(Dialect::Responses, black_box(&body)).ok()?;
            dialect::chat_to_request(Dialect::Chat, &hub, "gpt-4o-mini").ok()
        })
    });
    g.bench_function("request_no_refs_store_on", |b| {
        b.iter(|| {
            let refs = references::has_references(black_box(&body));
            let remember = store.remember(tenant, &body, None);
            let hub = dialect::request_to_chat(Dialect::Responses, black_box(&body)).ok()?;
            let out = dialect::chat_to_request(Dialect::Chat, &hub, "gpt-4o-mini").ok();
            black_box((refs, remember));
            out
        })
    });
    g.bench_function("answer_store_off", |b| {
        b.iter(|| {
            let chat = dialect::response_to_chat(Dialect::Chat, black_box(&answer)).ok()?;
            dialect::chat_to_response(Dialect::Responses, &chat, "gpt-4o-mini").ok()
        })
    });
    g.bench_function("answer_store_on", |b| {
        b.iter(|| {
            let chat = dialect::response_to_chat(Dialect::Chat, black_box(&answer)).ok()?;
            let (v, out) = dialect::chat_to_responses_answer(&chat, "gpt-4o-mini").ok()?;
            if let Some(r) = store.remember(tenant, &body, None) {
                store.record(r, &v);
            }
            Some(out)
        })
    });
    // the answer above is stored: its items resolve
    let step2 = serde_json::to_vec(&json!({"model": "gpt-4o-mini", "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "item_reference", "id": "msg_chatcmpl-0123456789"},
        {"type": "item_reference", "id": "fc_call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "20C"}]}))
    .unwrap_or_default();
    g.bench_function("expand_tool_loop_step2", |b| {
        b.iter(|| store.expand_local(tenant, black_box(&step2)).ok())
    });
    let unknown = br#"{"model":"m","previous_response_id":"resp_missing","input":"x"}"#;
    g.bench_function("expand_unknown_id_400", |b| {
        b.iter(|| store.expand_local(tenant, black_box(unknown)).err())
    });
    g.finish();
    assert!(
        store.expand_local(tenant, &step2).is_ok(),
        "the bench's references resolve"
    );
}
