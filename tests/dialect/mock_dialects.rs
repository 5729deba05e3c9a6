//! `ringgate mock` answers every dialect at its standard path: non-stream bodies and stream
//! transcripts parse, carry the deterministic text, tool calls reassemble to `TOOL_ARGS`, stop
//! reasons, usage and terminal events are right, and the seed profile paces non-Chat streams.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use ringgate::mock::{server::MockServer, text, tools, Profile, DEFAULT_OUTPUT_TOKENS, TOOL_ARGS};
use serde_json::{json, Value};

fn mock() -> MockServer {
    start_mock(Profile::Instant, "epoll")
}

fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Response {
    request(addr, &post(path, &body.to_string()))
}

/// SSE events as (`event:` name, parsed `data:`); `[DONE]` becomes `Value::Null`.
fn sse_events(r: &Response) -> Vec<(Option<String>, Value)> {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let text = r.text();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|ev| {
            let mut name = None;
            let mut data = None;
            for line in ev.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_string());
                } else {
                    panic!("bad SSE line {line:?}");
                }
            }
            let data = data.expect("event without data");
            let v = if data == "[DONE]" {
                Value::Null
            } else {
                serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"))
            };
            (name, v)
        })
        .collect()
}

fn tool_args() -> Value {
    serde_json::from_str(TOOL_ARGS).unwrap()
}

fn weather_tool_chat() -> Value {
    json!([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])
}

// ---------------------------------------------------------------- OpenAI Chat

#[test]
fn chat_text_and_tool_calls() {
    let m = mock();
    let a = m.addr;
    let r = post_json(
        a,
        "/v1/chat/completions",
        &json!({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], text::tokens(0, 5));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 5);

    let tools_body = json!({"model":"m","tools":weather_tool_chat(),"messages":[{"role":"user","content":"weather?"}]});
    let v = post_json(a, "/v1/chat/completions", &tools_body).json();
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["content"], tools::TOOL_TEXT);
    assert_eq!(msg["tool_calls"][0]["id"], "call_mock_1");
    assert_eq!(msg["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(msg["tool_calls"][0]["function"]["arguments"], TOOL_ARGS);
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(v["usage"]["completion_tokens"], tools::OUTPUT_TOKENS);

    let mut sb = tools_body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let ev = sse_events(&post_json(a, "/v1/chat/completions", &sb));
    let (mut content, mut args, mut finish, mut usage) = (String::new(), String::new(), None, None);
    let mut name = None;
    for (_, v) in &ev[..ev.len() - 1] {
        let d = &v["choices"][0]["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        if let Some(tc) = d["tool_calls"].get(0) {
            if let Some(n) = tc["function"]["name"].as_str() {
                name = Some(n.to_string());
                assert_eq!(tc["id"], "call_mock_1");
            }
            let frag = tc["function"]["arguments"].as_str().unwrap();
            assert!(frag.len() <= 7, "fragment {frag:?}");
            args.push_str(frag);
        }
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
        if v["usage"].is_object() {
            usage = v["usage"]["completion_tokens"].as_u64();
        }
    }
    assert_eq!(ev.last().unwrap().1, Value::Null, "ends with [DONE]");
    assert_eq!(content, tools::TOOL_TEXT);
    assert_eq!(args, TOOL_ARGS);
    assert_eq!(name.as_deref(), Some("get_weather"));
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert_eq!(usage, Some(u64::from(tools::OUTPUT_TOKENS)));

    // The tool result is the last turn: plain text.
    let mut after = tools_body;
    after["messages"] = json!([{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_mock_1","type":"function","function":{"name":"get_weather","arguments":TOOL_ARGS}}]},{"role":"tool","tool_call_id":"call_mock_1","content":"20C"}]);
    let v = post_json(a, "/v1/chat/completions", &after).json();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        text::tokens(0, DEFAULT_OUTPUT_TOKENS)
    );
    assert!(v["choices"][0]["message"]["tool_calls"].is_null());
    m.stop();
}

// ---------------------------------------------------------------- OpenAI Responses

/// Check the envelope of every Responses event and return (types, text, args, completed).
fn responses_stream(r: &Response) -> (Vec<String>, String, String, Value) {
    let ev = sse_events(r);
    let (mut types, mut text, mut args, mut completed) =
        (vec![], String::new(), String::new(), Value::Null);
    for (i, (name, v)) in ev.iter().enumerate() {
        let ty = v["type"].as_str().unwrap().to_string();
        assert_eq!(name.as_deref(), Some(ty.as_str()), "event line = type");
        assert_eq!(v["sequence_number"], i as u64);
        match ty.as_str() {
            "response.output_text.delta" => text.push_str(v["delta"].as_str().unwrap()),
            "response.function_call_arguments.delta" => {
                let d = v["delta"].as_str().unwrap();
                assert!(d.len() <= 7, "fragment {d:?}");
                args.push_str(d);
            }
            "response.function_call_arguments.done" => assert_eq!(v["arguments"], TOOL_ARGS),
            "response.completed" => completed = v["response"].clone(),
            _ => {}
        }
        types.push(ty);
    }
    (types, text, args, completed)
}

#[test]
fn responses_text_and_tool_calls() {
    let m = mock();
    let a = m.addr;
    let v = post_json(
        a,
        "/v1/responses",
        &json!({"model":"m","input":"hi","instructions":"be brief","max_output_tokens":6}),
    )
    .json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["output"][0]["content"][0]["text"], text::tokens(0, 6));
    let u = &v["usage"];
    assert_eq!(u["output_tokens"], 6);
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap() + 6)
    );

    let r = post_json(
        a,
        "/v1/responses",
        &json!({"model":"m","input":[{"role":"user","content":"hi"}],"max_output_tokens":7,"stream":true}),
    );
    let (types, text_out, _, done) = responses_stream(&r);
    assert_eq!(text_out, text::tokens(0, 7));
    assert_eq!(
        &types[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        &types[types.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert_eq!(done["status"], "completed");
    assert_eq!(done["usage"]["output_tokens"], 7);
    assert_eq!(done["output"][0]["content"][0]["text"], text::tokens(0, 7));

    let tools_def =
        json!([{"type":"function","name":"get_weather","parameters":{"type":"object"}}]);
    let body = json!({"model":"m","input":"weather?","tools":tools_def});
    let v = post_json(a, "/v1/responses", &body).json();
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["content"][0]["text"], tools::TOOL_TEXT);
    let call = &v["output"][1];
    assert_eq!(
        (
            call["type"].as_str(),
            call["call_id"].as_str(),
            call["name"].as_str()
        ),
        (
            Some("function_call"),
            Some("call_mock_1"),
            Some("get_weather")
        )
    );
    assert_eq!(call["arguments"], TOOL_ARGS);
    assert_eq!(v["usage"]["output_tokens"], tools::OUTPUT_TOKENS);

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (types, text_out, args, done) = responses_stream(&post_json(a, "/v1/responses", &sb));
    assert_eq!(text_out, tools::TOOL_TEXT);
    assert_eq!(args, TOOL_ARGS);
    for t in [
        "response.function_call_arguments.done",
        "response.output_item.done",
    ] {
        assert!(types.contains(&t.to_string()), "{t} missing");
    }
    assert_eq!(types.last().map(String::as_str), Some("response.completed"));
    assert_eq!(done["output"][1]["arguments"], TOOL_ARGS);
    assert_eq!(done["usage"]["output_tokens"], tools::OUTPUT_TOKENS);

    let mut after = body;
    after["input"] = json!([{"role":"user","content":"w?"},{"type":"function_call","call_id":"call_mock_1","name":"get_weather","arguments":TOOL_ARGS},{"type":"function_call_output","call_id":"call_mock_1","output":"20C"}]);
    let v = post_json(a, "/v1/responses", &after).json();
    assert_eq!(v["output"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["output"][0]["content"][0]["text"],
        text::tokens(0, DEFAULT_OUTPUT_TOKENS)
    );
    m.stop();
}

// ---------------------------------------------------------------- Anthropic Messages

#[test]
fn anthropic_text_tools_errors_and_count() {
    let m = mock();
    let a = m.addr;
    let r = post_json(
        a,
        "/v1/messages",
        &json!({"model":"c","messages":[{"role":"user","content":"hi"}]}),
    );
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens"));

    let v = post_json(
        a,
        "/v1/messages",
        &json!({"model":"c","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}),
    )
    .json();
    assert_eq!(
        (v["type"].as_str(), v["role"].as_str(), v["model"].as_str()),
        (Some("message"), Some("assistant"), Some("c"))
    );
    assert_eq!(v["content"][0]["text"], text::tokens(0, 4));
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["stop_sequence"].is_null());
    assert_eq!(v["usage"]["output_tokens"], 4);
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0);

    let r = post_json(
        a,
        "/v1/messages",
        &json!({"model":"c","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}),
    );
    let ev = sse_events(&r);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        &names[..3],
        ["message_start", "content_block_start", "ping"]
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let mut out = String::new();
    for (n, v) in &ev {
        assert_eq!(v["type"].as_str(), n.as_deref());
        if v["delta"]["type"] == "text_delta" {
            out.push_str(v["delta"]["text"].as_str().unwrap());
        }
    }
    assert_eq!(out, text::tokens(0, 9));
    assert!(
        ev[0].1["message"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let md = &ev[ev.len() - 2].1;
    assert_eq!(md["delta"]["stop_reason"], "end_turn");
    assert_eq!(md["usage"]["output_tokens"], 9);

    let tools_def =
        json!([{"name":"get_weather","description":"w","input_schema":{"type":"object"}}]);
    let body = json!({"model":"c","max_tokens":100,"tools":tools_def,"messages":[{"role":"user","content":"weather?"}]});
    let v = post_json(a, "/v1/messages", &body).json();
    assert_eq!(v["content"][0]["text"], tools::TOOL_TEXT);
    assert_eq!(v["content"][1]["type"], "tool_use");
    assert_eq!(v["content"][1]["id"], "toolu_mock_1");
    assert_eq!(v["content"][1]["name"], "get_weather");
    assert_eq!(v["content"][1]["input"], tool_args());
    assert_eq!(v["stop_reason"], "tool_use");

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let ev = sse_events(&post_json(a, "/v1/messages", &sb));
    let (mut text_out, mut json_out) = (String::new(), String::new());
    for (_, v) in &ev {
        match v["delta"]["type"].as_str() {
            Some("text_delta") => text_out.push_str(v["delta"]["text"].as_str().unwrap()),
            Some("input_json_delta") => {
                assert_eq!(v["index"], 1);
                let p = v["delta"]["partial_json"].as_str().unwrap();
                assert!(p.len() <= 7, "fragment {p:?}");
                json_out.push_str(p);
            }
            _ => {}
        }
        if v["type"] == "content_block_start" && v["index"] == 1 {
            assert_eq!(v["content_block"]["type"], "tool_use");
            assert_eq!(v["content_block"]["id"], "toolu_mock_1");
        }
    }
    assert_eq!(text_out, tools::TOOL_TEXT);
    assert_eq!(json_out, TOOL_ARGS);
    let md = &ev[ev.len() - 2].1;
    assert_eq!(md["delta"]["stop_reason"], "tool_use");
    assert_eq!(md["usage"]["output_tokens"], tools::OUTPUT_TOKENS);
    assert_eq!(ev.last().unwrap().1["type"], "message_stop");

    let mut after = body;
    after["messages"] = json!([{"role":"user","content":"w?"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_mock_1","name":"get_weather","input":tool_args()}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_mock_1","content":"20C"}]}]);
    let v = post_json(a, "/v1/messages", &after).json();
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["content"][0]["text"], text::tokens(0, 100));

    let body = json!({"model":"c","messages":[{"role":"user","content":"hello there"}]});
    let v = post_json(a, "/v1/messages/count_tokens", &body).json();
    assert_eq!(
        v["input_tokens"].as_u64(),
        Some((body.to_string().len() / 4) as u64)
    );
    m.stop();
}

// ---------------------------------------------------------------- Gemini

#[test]
fn gemini_text_tools_and_errors() {
    let m = mock();
    let a = m.addr;
    let user = json!([{"role":"user","parts":[{"text":"hi"}]}]);
    let v = post_json(
        a,
        "/v1beta/models/gemini-x:generateContent",
        &json!({"contents":user,"generationConfig":{"maxOutputTokens":5}}),
    )
    .json();
    let c = &v["candidates"][0];
    assert_eq!(c["content"]["role"], "model");
    assert_eq!(c["content"]["parts"][0]["text"], text::tokens(0, 5));
    assert_eq!(c["finishReason"], "STOP");
    assert_eq!(v["modelVersion"], "gemini-x");
    let u = &v["usageMetadata"];
    assert_eq!(u["candidatesTokenCount"], 5);
    assert_eq!(
        u["totalTokenCount"].as_u64(),
        Some(u["promptTokenCount"].as_u64().unwrap() + 5)
    );

    let r = post_json(
        a,
        "/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
        &json!({"contents":user,"generationConfig":{"maxOutputTokens":6}}),
    );
    let ev = sse_events(&r);
    let mut out = String::new();
    for (i, (name, v)) in ev.iter().enumerate() {
        assert!(name.is_none());
        out.push_str(
            v["candidates"][0]["content"]["parts"][0]["text"]
                .as_str()
                .unwrap(),
        );
        let last = i + 1 == ev.len();
        assert_eq!(v["candidates"][0]["finishReason"].is_string(), last);
        // every chunk carries usageMetadata (as Gemini's do), with the output so far
        assert_eq!(v["usageMetadata"]["candidatesTokenCount"], i + 1);
    }
    assert_eq!(out, text::tokens(0, 6));
    assert_eq!(
        ev.last().unwrap().1["usageMetadata"]["candidatesTokenCount"],
        6
    );

    // Without alt=sse: one JSON array of the same chunks.
    let r = post_json(
        a,
        "/v1beta/models/gemini-x:streamGenerateContent",
        &json!({"contents":user,"generationConfig":{"maxOutputTokens":3}}),
    );
    let arr = r.json();
    assert_eq!(arr.as_array().unwrap().len(), 3);

    let tools_def =
        json!([{"functionDeclarations":[{"name":"get_weather","parameters":{"type":"object"}}]}]);
    let body = json!({"contents":user,"tools":tools_def});
    let v = post_json(a, "/v1beta/models/g:generateContent", &body).json();
    let parts = &v["candidates"][0]["content"]["parts"];
    assert_eq!(parts[0]["text"], tools::TOOL_TEXT);
    assert_eq!(parts[1]["functionCall"]["name"], "get_weather");
    assert_eq!(parts[1]["functionCall"]["args"], tool_args());
    assert_eq!(v["candidates"][0]["finishReason"], "STOP");
    assert_eq!(
        v["usageMetadata"]["candidatesTokenCount"],
        tools::OUTPUT_TOKENS
    );

    let ev = sse_events(&post_json(
        a,
        "/v1beta/models/g:streamGenerateContent?alt=sse",
        &body,
    ));
    assert_eq!(ev.len(), 2);
    assert_eq!(
        ev[0].1["candidates"][0]["content"]["parts"][0]["text"],
        tools::TOOL_TEXT
    );
    let last = &ev[1].1["candidates"][0];
    assert_eq!(
        last["content"]["parts"][0]["functionCall"]["args"],
        tool_args()
    );
    assert_eq!(last["finishReason"], "STOP");

    let mut after = body;
    after["contents"] = json!([{"role":"user","parts":[{"text":"w?"}]},{"role":"model","parts":[{"functionCall":{"name":"get_weather","args":tool_args()}}]},{"role":"user","parts":[{"functionResponse":{"name":"get_weather","response":{"t":20}}}]}]);
    let v = post_json(a, "/v1beta/models/g:generateContent", &after).json();
    let parts = v["candidates"][0]["content"]["parts"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0]["text"], text::tokens(0, DEFAULT_OUTPUT_TOKENS));

    let r = request(a, &post("/v1beta/models/g:generateContent", "{nope"));
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["error"]["code"], 400);
    assert_eq!(v["error"]["status"], "INVALID_ARGUMENT");
    assert!(v["error"]["message"].is_string());
    m.stop();
}

// ---------------------------------------------------------------- embeddings, models, misc

#[test]
fn embeddings_models_and_unknown_paths() {
    let m = mock();
    let a = m.addr;
    let body = json!({"model":"e","input":["alpha","beta"]});
    let v1 = post_json(a, "/v1/embeddings", &body).json();
    let v2 = post_json(a, "/v1/embeddings", &body).json();
    assert_eq!(v1, v2, "deterministic");
    assert_eq!(v1["object"], "list");
    let data = v1["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i as u64);
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["embedding"].as_array().unwrap().len(), 64);
    }
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    assert!(v1["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let single = post_json(a, "/v1/embeddings", &json!({"model":"e","input":"alpha"})).json();
    assert_eq!(single["data"][0]["embedding"], data[0]["embedding"]);
    assert_eq!(
        post_json(a, "/v1/embeddings", &json!({"model":"e"})).status,
        400
    );

    let r = request(a, &get("/v1/models"));
    assert_eq!(r.json()["data"][0]["id"], "mock");
    let r = request(a, &post("/v2/nothing", "{}"));
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"].is_string());
    let r = request(a, &get("/v1/messages"));
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["type"], "error");
    m.stop();
}

#[test]
fn keep_alive_across_dialects() {
    let m = mock();
    let mut s = connect(m.addr);
    let mut buf = Vec::new();
    let reqs = [
        (
            "/v1/chat/completions",
            json!({"model":"m","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"x"}]}),
        ),
        (
            "/v1/responses",
            json!({"model":"m","max_output_tokens":2,"stream":true,"input":"x"}),
        ),
        (
            "/v1/messages",
            json!({"model":"m","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"x"}]}),
        ),
        (
            "/v1beta/models/g:streamGenerateContent?alt=sse",
            json!({"contents":[{"parts":[{"text":"x"}]}]}),
        ),
    ];
    for (path, body) in reqs {
        s.write_all(&post(path, &body.to_string())).unwrap();
        let r = read_response(&mut s, &mut buf).expect("response");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert!(!sse_events(&r).is_empty());
    }
    m.stop();
}

// ---------------------------------------------------------------- seed pacing

#[test]
fn seed_profile_paces_a_responses_stream() {
    for d in DRIVERS {
        let m = start_mock(Profile::Seed, d);
        let body =
            json!({"model":"m","input":"hi","max_output_tokens":20,"stream":true}).to_string();
        let mut s = connect(m.addr);
        let t0 = Instant::now();
        s.write_all(&post("/v1/responses", &body)).unwrap();
        let mut got = Vec::new();
        let mut tmp = [0u8; 65536];
        let (mut head_at, mut first_at) = (None, None);
        while !got.ends_with(b"0\r\n\r\n") {
            let n = s.read(&mut tmp).unwrap();
            assert!(n > 0, "EOF before the end of the stream");
            got.extend_from_slice(&tmp[..n]);
            let has = |needle: &[u8]| got.windows(needle.len()).any(|w| w == needle);
            if head_at.is_none() && has(b"response.created") {
                head_at = Some(t0.elapsed());
            }
            if first_at.is_none() && has(b"response.output_text.delta") {
                first_at = Some(t0.elapsed());
            }
        }
        let total = t0.elapsed();
        let (head_at, first_at) = (head_at.unwrap(), first_at.unwrap());
        assert!(head_at < first_at, "{d}: head events before content");
        assert!(
            first_at >= Duration::from_millis(50),
            "{d}: first content at {first_at:?}"
        );
        assert!(
            total >= Duration::from_millis(500),
            "{d}: stream took {total:?}"
        );
        assert!(total < Duration::from_secs(3), "{d}: stream took {total:?}");

        // Non-stream answers after the delay.
        let t0 = Instant::now();
        let r = post_json(
            m.addr,
            "/v1/messages",
            &json!({"model":"m","max_tokens":3,"messages":[{"role":"user","content":"x"}]}),
        );
        assert_eq!(r.status, 200);
        assert!(t0.elapsed() >= Duration::from_millis(50));
        m.stop();
    }
}

#[test]
fn paced_profile_sends_one_delta_every_20_ms() {
    let mock = ringgate::mock::server::start(
        "127.0.0.1:0".parse().unwrap(),
        ringgate::mock::Profile::Paced,
        1,
        ringgate::runtime::DriverChoice::IoUring,
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let r = common::request(
        mock.addr,
        &common::post(
            "/v1/chat/completions",
            r#"{"model":"m","stream":true,"max_tokens":6}"#,
        ),
    );
    let took = t0.elapsed();
    assert_eq!(
        common::sse_content(&r.body).0,
        ringgate::mock::text::tokens(0, 6)
    );
    assert!(
        took >= std::time::Duration::from_millis(100),
        "5 gaps of 20 ms, took {took:?}"
    );
    assert!(took < std::time::Duration::from_millis(1000));
    let t0 = std::time::Instant::now();
    let r = common::request(
        mock.addr,
        &common::post("/v1/chat/completions", r#"{"model":"m","max_tokens":6}"#),
    );
    assert_eq!(r.status, 200);
    assert!(
        t0.elapsed() < std::time::Duration::from_millis(50),
        "non-stream answers at once"
    );
    mock.stop();
}
