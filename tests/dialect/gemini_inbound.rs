//! The Gemini dialect inbound (`/v1beta/models/{model}:generateContent`, `:streamGenerateContent`,
//! `:countTokens`, also under `/v1/`): what each provider kind receives — a capturing fake
//! upstream records every request byte — and what the client gets back, errors in Gemini's
//! shape. Every test runs under both I/O drivers.

#[path = "../common/mod.rs"]
mod common;

use common::capture::Capture;
use common::*;
use ringgate::config::Config;
use ringgate::server::{self, Running};
use serde_json::{json, Value};

const KEY_ENV: &str = "RINGGATE_GEMINI_IN_PROVIDER_KEY";
const PROVIDER_KEY: &str = "sk-provider-key-1";

/// The request the `google-genai` SDK sends for a tool turn: system instruction, multi-turn,
/// an inline image, a function call and its response, a declaration with upper-case schema
/// types (and `nullable`, `propertyOrdering`), generation settings.
fn sdk_body() -> Value {
    json!({
        "systemInstruction": {"parts": [{"text": "Be brief."}], "role": "user"},
        "contents": [
            {"role": "user", "parts": [{"text": "Weather here?"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}]},
            {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp": 18}}}]}
        ],
        "tools": [{"functionDeclarations": [{"name": "get_weather", "description": "Weather",
            "parameters": {"type": "OBJECT", "propertyOrdering": ["city", "unit"],
                "properties": {"city": {"type": "STRING"},
                    "unit": {"type": "STRING", "enum": ["c", "f"], "nullable": true}},
                "required": ["city"]}}]}],
        "generationConfig": {"maxOutputTokens": 50, "temperature": 0.5}
    })
}

fn gateway(up: std::net::SocketAddr, v: Variant, keys: &str) -> Running {
    let Variant { driver, shards } = v;
    std::env::set_var(KEY_ENV, PROVIDER_KEY);
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\npin = false\ndriver = \"{driver}\"\n{keys}\n"
    );
    for (kind, model, upstream) in [
        ("openai", "g-oa", "up-oa"),
        ("anthropic", "g-an", "up-an"),
        ("gemini", "g-ge", "up/ge:1"),
    ] {
        text.push_str(&format!(
            "[[provider]]\nname = \"{kind}\"\nkind = \"{kind}\"\nbase_url = \"http://{up}/base\"\n\
             api_key_env = \"{KEY_ENV}\"\n[[model]]\nname = \"{model}\"\nprovider = \"{kind}\"\n\
             upstream_model = \"{upstream}\"\n"
        ));
    }
    server::start(Config::parse(&text).unwrap()).unwrap()
}

fn post_with(path: &str, body: &str, headers: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Types of every schema node under `v` (keys named `type` whose value is a string or list).
fn types_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("type", Value::String(s)) => out.push(s.clone()),
                    ("type", Value::Array(a)) => out.push(format!("{a:?}")),
                    ("properties", Value::Object(p)) => p.values().for_each(|s| types_in(s, out)),
                    _ => types_in(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| types_in(x, out)),
        _ => {}
    }
}

#[test]
fn translated_to_openai_and_anthropic_passed_through_to_gemini() {
    for d in variants() {
        let up = Capture::start("");
        let gw = gateway(up.addr, d, "");
        let body = sdk_body().to_string();
        let mut n = 0;
        for version in ["v1beta", "v1"] {
            for (model, stream) in [
                ("g-oa", false),
                ("g-oa", true),
                ("g-an", false),
                ("g-an", true),
                ("g-ge", false),
                ("g-ge", true),
            ] {
                let what = format!("{d} {version} {model} stream={stream}");
                let path = if stream {
                    format!("/{version}/models/{model}:streamGenerateContent?alt=sse&key=client-q")
                } else {
                    format!("/{version}/models/{model}:generateContent")
                };
                let r = request(
                    gw.addr,
                    &post_with(&path, &body, "x-goog-api-key: client-secret\r\n"),
                );
                assert_eq!(r.status, 200, "{what}: {}", r.text());
                let seen = up.nth(n);
                n += 1;
                // the client's credentials never travel; the provider's key does
                let raw_head = format!("{} {:?}", seen.target, seen.headers);
                assert!(
                    !raw_head.contains("client-secret") && !raw_head.contains("client-q"),
                    "{what}: {raw_head}"
                );
                let sent = seen.json();
                match model {
                    "g-oa" => {
                        assert_eq!(seen.target, "/base/chat/completions", "{what}");
                        assert_eq!(
                            seen.header("authorization"),
                            Some(format!("Bearer {PROVIDER_KEY}").as_str())
                        );
                        assert_eq!(sent["model"], "up-oa");
                        assert_eq!(sent["stream"], stream, "{what}");
                        if stream {
                            assert_eq!(sent["stream_options"]["include_usage"], true);
                        }
                        let m = sent["messages"].as_array().unwrap();
                        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
                        assert_eq!(
                            m[1]["content"][1]["image_url"]["url"],
                            "data:image/png;base64,iVBORw0KGgo="
                        );
                        assert_eq!(
                            m[2]["tool_calls"][0]["function"]["arguments"],
                            r#"{"city":"Paris"}"#
                        );
                        assert_eq!(m[3]["role"], "tool");
                        assert_eq!(m[3]["tool_call_id"], m[2]["tool_calls"][0]["id"]);
                        assert_eq!(sent["max_tokens"], 50);
                        let params = &sent["tools"][0]["function"]["parameters"];
                        let mut t = Vec::new();
                        types_in(params, &mut t);
                        assert_eq!(
                            t,
                            ["object", "string", r#"[String("string"), String("null")]"#]
                        );
                        assert!(params.get("propertyOrdering").is_none(), "{what}");
                    }
                    "g-an" => {
                        assert_eq!(seen.target, "/base/v1/messages", "{what}");
                        assert_eq!(seen.header("x-api-key"), Some(PROVIDER_KEY));
                        assert_eq!(sent["model"], "up-an");
                        assert_eq!(sent["system"], "Be brief.");
                        assert_eq!(sent["stream"].as_bool().unwrap_or(false), stream, "{what}");
                        assert_eq!(
                            sent["messages"][0]["content"][1]["source"]["media_type"],
                            "image/png"
                        );
                        assert_eq!(sent["messages"][1]["content"][0]["type"], "tool_use");
                        assert_eq!(sent["messages"][2]["content"][0]["type"], "tool_result");
                        let mut t = Vec::new();
                        types_in(&sent["tools"][0]["input_schema"], &mut t);
                        assert_eq!(
                            t,
                            ["object", "string", r#"[String("string"), String("null")]"#]
                        );
                    }
                    _ => {
                        // passthrough: the body byte for byte, the upstream model in the URL
                        let want = if stream {
                            "/base/v1beta/models/up%2Fge%3A1:streamGenerateContent?alt=sse"
                        } else {
                            "/base/v1beta/models/up%2Fge%3A1:generateContent"
                        };
                        assert_eq!(seen.target, want, "{what}");
                        assert_eq!(seen.header("x-goog-api-key"), Some(PROVIDER_KEY));
                        assert_eq!(seen.body, body.as_bytes(), "{what}");
                    }
                }
                // the answer, in Gemini's shape
                if stream {
                    assert_eq!(
                        r.header("content-type"),
                        Some("text/event-stream"),
                        "{what}"
                    );
                    let text = r.text();
                    let chunks: Vec<Value> = text
                        .split("\n\n")
                        .filter(|e| !e.trim().is_empty())
                        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
                        .collect();
                    let last = chunks.last().unwrap();
                    assert!(
                        last["candidates"][0]["finishReason"].is_string(),
                        "{what}: {text}"
                    );
                    assert!(
                        last["usageMetadata"]["totalTokenCount"].is_u64(),
                        "{what}: {text}"
                    );
                    let calls: Vec<&Value> = chunks
                        .iter()
                        .flat_map(|c| c["candidates"][0]["content"]["parts"].as_array().unwrap())
                        .filter_map(|p| p.get("functionCall"))
                        .collect();
                    // whole calls, each once (the Gemini fixture has two, the others one)
                    let want = if model == "g-ge" { 2 } else { 1 };
                    assert_eq!(calls.len(), want, "{what}: {text}");
                    assert!(calls[0]["args"].is_object(), "{what}");
                } else {
                    let v = r.json();
                    assert_eq!(v["candidates"][0]["content"]["role"], "model", "{what}");
                    assert!(v["candidates"][0]["finishReason"].is_string(), "{what}");
                    assert!(v["usageMetadata"]["promptTokenCount"].is_u64(), "{what}");
                }
            }
        }
        gw.stop();
    }
}

#[test]
fn count_tokens_exact_from_gemini_estimated_elsewhere() {
    for d in variants() {
        let up = Capture::start("");
        let gw = gateway(up.addr, d, "");
        let body = r#"{"contents":[{"role":"user","parts":[{"text":"hello there"}]}]}"#;
        let r = request(gw.addr, &post("/v1/models/g-ge:countTokens", body));
        assert_eq!(
            (r.status, r.json()),
            (200, json!({"totalTokens": 31})),
            "{d}"
        );
        let seen = up.nth(0);
        assert_eq!(seen.target, "/base/v1beta/models/up%2Fge%3A1:countTokens");
        assert_eq!(seen.body, body.as_bytes());
        for m in ["g-oa", "g-an"] {
            let r = request(
                gw.addr,
                &post(&format!("/v1beta/models/{m}:countTokens"), body),
            );
            let want = (body.len() as u64).div_ceil(4);
            assert_eq!(
                (r.status, r.json()),
                (200, json!({"totalTokens": want})),
                "{d} {m}"
            );
        }
        assert_eq!(up.count(), 1, "estimates reach no upstream");
        gw.stop();
    }
}

#[test]
fn errors_are_in_gemini_shape() {
    for d in variants() {
        let up = Capture::start("");
        let gw = gateway(up.addr, d, "");
        let ok = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
        let cases: [(&str, &str, u16, &str); 8] = [
            ("/v1beta/models/nope:generateContent", ok, 404, "NOT_FOUND"),
            (
                "/v1beta/models/a%20b:generateContent",
                ok,
                400,
                "INVALID_ARGUMENT",
            ),
            (
                "/v1beta/models/..:generateContent",
                ok,
                400,
                "INVALID_ARGUMENT",
            ),
            (
                "/v1/models/g-oa:streamGenerateContent",
                ok,
                400,
                "INVALID_ARGUMENT",
            ),
            (
                "/v1beta/models/g-oa:generateContent",
                "[1]",
                400,
                "INVALID_ARGUMENT",
            ),
            (
                "/v1beta/models/g-oa:generateContent",
                r#"{"contents":[]} x"#,
                400,
                "INVALID_ARGUMENT",
            ),
            (
                "/v1beta/models/g-oa:generateContent",
                r#"{"contents":1}"#,
                400,
                "INVALID_ARGUMENT",
            ),
            ("/v1beta/models/g-oa:embedContent", ok, 404, "NOT_FOUND"),
        ];
        for (path, body, status, name) in cases {
            let r = request(gw.addr, &post(path, body));
            let v = r.json();
            assert_eq!(r.status, status, "{d} {path} {body}: {}", r.text());
            assert_eq!(v["error"]["code"], status, "{d} {path}");
            assert_eq!(v["error"]["status"], name, "{d} {path}");
            assert!(v["error"]["message"].is_string());
        }
        let r = request(gw.addr, &get("/v1beta/models/g-oa:generateContent"));
        assert_eq!(r.status, 405);
        assert_eq!(r.json()["error"]["status"], "UNIMPLEMENTED");
        assert_eq!(up.count(), 0, "no bad request reached the upstream");
        gw.stop();
    }
}

#[test]
fn keys_from_header_or_query_never_forwarded() {
    const KEY: &str = "rg-gemini-in-4d2c6a8e0f1b3d5c7e9a1b3c";
    std::env::set_var("RINGGATE_GEMINI_IN_CLIENT_KEY", KEY);
    let keys = "[[key]]\nname = \"t\"\nkey_env = \"RINGGATE_GEMINI_IN_CLIENT_KEY\"\n";
    // (`[[key]]` must follow `[server]`'s lines: the gateway text puts it before providers)
    for d in variants() {
        let up = Capture::start("");
        let gw = gateway(up.addr, d, keys);
        let body = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
        let gen = "/v1beta/models/g-ge:generateContent";
        let r = request(gw.addr, &post(gen, body));
        assert_eq!(r.status, 401, "{d}: no key");
        assert_eq!(r.json()["error"]["status"], "UNAUTHENTICATED");
        let r = request(
            gw.addr,
            &post_with(gen, body, "x-goog-api-key: rg-wrong\r\n"),
        );
        assert_eq!(r.status, 401, "{d}: wrong key");
        let r = request(gw.addr, &post(&format!("{gen}?key=a&key={KEY}"), body));
        assert_eq!(r.status, 401, "{d}: two query keys");
        assert_eq!(up.count(), 0);
        for (n, (path, headers)) in [
            (gen.to_string(), format!("x-goog-api-key: {KEY}\r\n")),
            (format!("{gen}?key={KEY}"), String::new()),
            (
                format!("/v1/models/g-oa:streamGenerateContent?key={KEY}&alt=sse"),
                String::new(),
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let r = request(gw.addr, &post_with(&path, body, &headers));
            assert_eq!(r.status, 200, "{d} {path}: {}", r.text());
            let seen = up.nth(n);
            let all = format!(
                "{} {:?} {}",
                seen.target,
                seen.headers,
                String::from_utf8_lossy(&seen.body)
            );
            assert!(
                !all.contains(KEY),
                "{d}: the client's key reached the upstream: {all}"
            );
            assert!(!seen.target.contains("key="), "{d}: {}", seen.target);
        }
        // models endpoints: the key gate, Gemini's shape
        let r = request(gw.addr, &get(&format!("/v1beta/models?key={KEY}")));
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["models"][0]["name"], "models/g-oa");
        let r = request(gw.addr, &get("/v1beta/models"));
        assert_eq!(
            (r.status, &r.json()["error"]["status"]),
            (401, &json!("UNAUTHENTICATED"))
        );
        gw.stop();
    }
}
