//! Responses API state on translated routes, with real sockets: a Responses client served by a
//! Chat (`openai-compatible`) or Anthropic upstream — the project's mock over HTTP, or a
//! capturing fake that records what the upstream received — resolves `item_reference` input
//! items and `previous_response_id` from the gateway's store; unknown ids are a 400 naming the
//! field; `store: false` stores nothing; tenants do not see each other's entries; a same-dialect
//! route forwards references untouched. Two shards: each request goes on a fresh connection, so
//! consecutive steps land on either shard and must resolve from both.

#[path = "../common/mod.rs"]
mod common;

use common::capture::Capture;
use common::*;
use ringgate::config::Config;
use ringgate::mock::Profile;
use ringgate::server::{self, Running};
use serde_json::{json, Value};

fn gateway(up: std::net::SocketAddr, extra: &str) -> Running {
    let mut text = "[server]\nlisten = \"127.0.0.1:0\"\nshards = 2\npin = false\n".to_string();
    for (kind, model, base) in [
        ("openai", "to-oa", "/v1"),
        ("openai-compatible", "to-compat", "/v1"),
        ("anthropic", "to-an", ""),
    ] {
        text.push_str(&format!(
            "[[provider]]\nname = \"{kind}\"\nkind = \"{kind}\"\nbase_url = \"http://{up}{base}\"\n\
             [[model]]\nname = \"{model}\"\nprovider = \"{kind}\"\nupstream_model = \"up\"\n"
        ));
    }
    text.push_str(extra);
    server::start(Config::parse(&text).unwrap()).unwrap()
}

fn call(addr: std::net::SocketAddr, key: &str, body: &Value) -> Response {
    let body = body.to_string();
    let raw = format!(
        "POST /v1/responses HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    request(addr, raw.as_bytes())
}

fn tools() -> Value {
    json!([{"type": "function", "name": "weather",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}])
}

/// The finished `response` object of a Responses SSE body.
fn completed(body: &[u8]) -> Value {
    let text = String::from_utf8_lossy(body);
    let data = text
        .split("\n\n")
        .find(|ev| ev.starts_with("event: response.completed"))
        .and_then(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .unwrap_or_else(|| panic!("no response.completed in {text}"));
    serde_json::from_str::<Value>(data).unwrap()["response"].clone()
}

fn ids(output: &Value, kind: &str) -> Vec<String> {
    output
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == kind)
        .map(|i| i["id"].as_str().unwrap().to_string())
        .collect()
}

/// The Vercel AI SDK's two-step tool loop, streamed and not, through a Chat and an Anthropic
/// upstream: step 2 sends the assistant's items by reference.
#[test]
fn tool_loop_with_item_references() {
    let mock = start_mock(Profile::Instant, "epoll");
    let gw = gateway(mock.addr, "");
    for model in ["to-compat", "to-an"] {
        for stream in [false, true] {
            let user = json!({"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]});
            let r = call(
                gw.addr,
                "k1",
                &json!({"model": model, "stream": stream,
                "input": [user], "tools": tools()}),
            );
            assert_eq!(r.status, 200, "{model} {stream}: {}", r.text());
            let resp = if stream { completed(&r.body) } else { r.json() };
            let output = &resp["output"];
            let calls = ids(output, "function_call");
            let msgs = ids(output, "message");
            assert_eq!(calls.len(), 1, "{model} {stream}: {output}");
            let call_id = output
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["type"] == "function_call")
                .unwrap()["call_id"]
                .clone();
            let mut input = vec![user.clone()];
            for id in msgs.iter().chain(&calls) {
                input.push(json!({"type": "item_reference", "id": id}));
            }
            input
                .push(json!({"type": "function_call_output", "call_id": call_id, "output": "20C"}));
            // several fresh connections: whichever shard each lands on resolves the references
            for _ in 0..4 {
                let r2 = call(
                    gw.addr,
                    "k1",
                    &json!({"model": model, "stream": stream,
                    "input": input, "tools": tools()}),
                );
                assert_eq!(r2.status, 200, "{model} {stream}: {}", r2.text());
                let resp2 = if stream {
                    completed(&r2.body)
                } else {
                    r2.json()
                };
                let out2 = resp2["output"].as_array().unwrap();
                assert!(out2.iter().all(|i| i["type"] != "function_call"), "{resp2}");
                let text = out2
                    .iter()
                    .find(|i| i["type"] == "message")
                    .map(|m| {
                        m["content"][0]["text"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string()
                    })
                    .unwrap_or_default();
                assert!(!text.is_empty(), "{model} {stream}: {resp2}");
            }
        }
    }
    gw.stop();
    mock.stop();
}

/// `previous_response_id` puts the earlier turns back in front of the new input: the upstream
/// receives the whole conversation (a capturing Anthropic upstream shows it).
#[test]
fn previous_response_id_sends_the_history() {
    let cap = Capture::start("");
    let gw = gateway(cap.addr, "");
    let r1 = call(
        gw.addr,
        "k1",
        &json!({"model": "to-an", "input": "first question"}),
    );
    assert_eq!(r1.status, 200, "{}", r1.text());
    let id = r1.json()["id"].as_str().unwrap().to_string();
    let answer1 = r1.json()["output"][0]["content"][0]["text"].clone();
    let r2 = call(
        gw.addr,
        "k1",
        &json!({"model": "to-an", "input": "second question",
        "previous_response_id": id, "instructions": "be brief"}),
    );
    assert_eq!(r2.status, 200, "{}", r2.text());
    let seen = cap.nth(1).json();
    assert_eq!(seen["system"], "be brief", "{seen}");
    let msgs = seen["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{seen}");
    assert_eq!(msgs[0]["role"], "user");
    assert!(
        msgs[0]["content"].to_string().contains("first question"),
        "{seen}"
    );
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(msgs[1]["content"][0]["text"], answer1, "{seen}");
    assert!(
        msgs[2]["content"].to_string().contains("second question"),
        "{seen}"
    );
    // a chain: the third turn carries both earlier ones
    let id2 = r2.json()["id"].as_str().unwrap().to_string();
    let r3 = call(
        gw.addr,
        "k1",
        &json!({"model": "to-an", "input": "third",
        "previous_response_id": id2}),
    );
    assert_eq!(r3.status, 200, "{}", r3.text());
    assert_eq!(cap.nth(2).json()["messages"].as_array().unwrap().len(), 5);
    gw.stop();
}

/// Unknown ids, another tenant's ids and `store: false` answers: a 400 in OpenAI's shape with
/// the field named; nothing went upstream.
#[test]
fn unknown_ids_other_tenants_and_store_false() {
    let mock = start_mock(Profile::Instant, "epoll");
    let gw = gateway(mock.addr, "");
    let r = call(
        gw.addr,
        "k1",
        &json!({"model": "to-compat", "input": "x",
        "previous_response_id": "resp_nope"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["param"], "previous_response_id");
    assert!(e["message"].as_str().unwrap().contains("resp_nope"), "{e}");
    let r = call(
        gw.addr,
        "k1",
        &json!({"model": "to-compat",
        "input": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "fc_nope"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "input[1].id");

    // stored for k1: k2 does not see it
    let r = call(
        gw.addr,
        "k1",
        &json!({"model": "to-compat", "input": "hello"}),
    );
    let id = r.json()["id"].as_str().unwrap().to_string();
    let again = json!({"model": "to-compat", "input": "x", "previous_response_id": id});
    assert_eq!(call(gw.addr, "k1", &again).status, 200);
    assert_eq!(call(gw.addr, "k2", &again).status, 400);

    // store: false: the answer is not kept (the mock's ids repeat, so ask under a new tenant)
    let r = call(
        gw.addr,
        "k3",
        &json!({"model": "to-compat", "input": "x", "store": false}),
    );
    assert_eq!(r.status, 200);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let r = call(
        gw.addr,
        "k3",
        &json!({"model": "to-compat", "input": "x",
        "previous_response_id": id}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    gw.stop();
    mock.stop();
}

/// `[responses] store_max_bytes = 0`: the store is off, references on translated routes are a
/// clear 400.
#[test]
fn store_off_is_a_clear_400() {
    let mock = start_mock(Profile::Instant, "epoll");
    let gw = gateway(mock.addr, "[responses]\nstore_max_bytes = 0\n");
    let r = call(
        gw.addr,
        "k1",
        &json!({"model": "to-compat", "input": "x",
        "previous_response_id": "resp_1"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("previous_response_id"), "{}", r.text());
    gw.stop();
    mock.stop();
}

/// Same dialect (Responses client, OpenAI provider): references go upstream untouched.
#[test]
fn same_dialect_forwards_references_untouched() {
    let cap = Capture::start("");
    let gw = gateway(cap.addr, "");
    let body = json!({"model": "to-oa", "previous_response_id": "resp_upstream",
        "input": [{"type": "item_reference", "id": "msg_upstream"}]});
    let r = call(gw.addr, "k1", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = cap.nth(0).json();
    assert_eq!(seen["previous_response_id"], "resp_upstream");
    assert_eq!(
        seen["input"][0],
        json!({"type": "item_reference", "id": "msg_upstream"})
    );
    gw.stop();
}
