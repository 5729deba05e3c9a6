//! `POST /v1/completions` (issue 22): passed through to OpenAI-style providers (openai,
//! openai-compatible, azure) on their `/completions` path with the model renamed, keys,
//! limits and usage as for Chat; refused in the client's dialect for providers that have no
//! such endpoint (Anthropic, Gemini) and for models with guardrails (which do not read a text
//! prompt). A fake upstream records what reaches it; the gateway at 1 and 2 shards, both
//! drivers.

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{key_digest_hex, post, request, variants};
use ringgate::config::Config;
use ringgate::server;

const SECRET: &str = "rg-completions-test-3f2a1b0c9d8e7f6a5b4c";

const ANSWER: &str = r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"/models/smollm2.gguf","choices":[{"text":" blue, red","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"completion_tokens":3,"prompt_tokens":5,"total_tokens":8}}"#;

fn stream_answer() -> Vec<u8> {
    let events = [
        r#"{"choices":[{"text":" blue","index":0,"logprobs":null,"finish_reason":null}],"created":1,"id":"cmpl-2","model":"m","object":"text_completion"}"#,
        r#"{"choices":[{"text":", red","index":0,"logprobs":null,"finish_reason":"length"}],"created":1,"id":"cmpl-2","model":"m","object":"text_completion","usage":{"completion_tokens":2,"prompt_tokens":5,"total_tokens":7}}"#,
    ];
    let mut body = String::new();
    for e in events {
        body.push_str(&format!("data: {e}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn config(v: common::Variant, upstream: std::net::SocketAddr) -> String {
    let common::Variant { driver, shards } = v;
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"

[[provider]]
name = "engine"
kind = "openai-compatible"
base_url = "http://{upstream}/v1"

[[provider]]
name = "claude"
kind = "anthropic"
base_url = "http://{upstream}"

[[model]]
name = "local"
provider = "engine"
upstream_model = "smollm2"

[[model]]
name = "guarded"
provider = "engine"
guardrails = ["no-secrets"]

[[model]]
name = "claude-x"
provider = "claude"

[[guardrail]]
name = "no-secrets"
words = ["swordfish"]
action = "block"
on = ["request"]

[[key]]
name = "team"
key_sha256 = "{}"
"#,
        key_digest_hex(SECRET)
    )
}

fn with_key(path: &str, body: &str) -> Vec<u8> {
    let raw = String::from_utf8(post(path, body)).unwrap();
    raw.replacen(
        "Host: localhost\r\n",
        &format!("Host: localhost\r\nAuthorization: Bearer {SECRET}\r\n"),
        1,
    )
    .into_bytes()
}

#[test]
fn completions_pass_through_with_keys_and_usage() {
    for v in variants() {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s2 = seen.clone();
        let upstream = common::fake_upstream(move |s, _, req| {
            let text = String::from_utf8_lossy(req).into_owned();
            let stream = text.contains("\"stream\":true");
            s2.lock().unwrap().push(text);
            let out = if stream {
                stream_answer()
            } else {
                common::json_response(ANSWER)
            };
            s.write_all(&out).is_ok()
        });
        let cfg = Config::parse(&config(v, upstream)).unwrap_or_else(|e| panic!("{e:?}"));
        let gw = server::start(cfg).unwrap();

        // without a key: 401 (keys are configured), nothing sent
        let r = request(
            gw.addr,
            &post(
                "/v1/completions",
                r#"{"model":"local","prompt":"Colours:","max_tokens":3}"#,
            ),
        );
        assert_eq!(r.status, 401, "{v}: {}", r.text());
        assert!(seen.lock().unwrap().is_empty());

        let r = request(
            gw.addr,
            &with_key(
                "/v1/completions",
                r#"{"model":"local","prompt":"Colours:","max_tokens":3}"#,
            ),
        );
        assert_eq!(r.status, 200, "{v}: {}", r.text());
        assert_eq!(r.json()["choices"][0]["text"], " blue, red", "{v}");
        assert_eq!(r.json()["usage"]["prompt_tokens"], 5);
        {
            let got = seen.lock().unwrap();
            assert!(
                got[0].starts_with("POST /v1/completions HTTP/1.1"),
                "{v}: {}",
                got[0]
            );
            assert!(
                got[0].contains(r#""model":"smollm2""#),
                "renamed: {}",
                got[0]
            );
            assert!(got[0].contains(r#""prompt":"Colours:""#), "{}", got[0]);
        }

        // streamed: relayed as sent, usage counted from the last event
        let r = request(
            gw.addr,
            &with_key(
                "/completions",
                r#"{"model":"local","prompt":"Colours:","max_tokens":2,"stream":true}"#,
            ),
        );
        assert_eq!(r.status, 200, "{v}: {}", r.text());
        let body = r.text();
        assert!(body.contains(r#""text":" blue""#), "{body}");
        assert!(body.contains("data: [DONE]"), "{body}");
        common::wait_metric(
            gw.addr,
            "ringgate_key_input_tokens_total{key=\"team\"",
            10,
            "both answers' prompt tokens are the key's",
        );
        common::wait_metric(
            gw.addr,
            "ringgate_key_output_tokens_total{key=\"team\"",
            5,
            "both answers' completion tokens are the key's",
        );

        // no such endpoint at Anthropic: 400, nothing sent
        let n = seen.lock().unwrap().len();
        let r = request(
            gw.addr,
            &with_key("/v1/completions", r#"{"model":"claude-x","prompt":"x"}"#),
        );
        assert_eq!(r.status, 400, "{v}: {}", r.text());
        assert!(
            r.text().contains("does not offer /v1/completions"),
            "{}",
            r.text()
        );
        // guardrails cannot read a text prompt: refused, not passed unchecked
        let r = request(
            gw.addr,
            &with_key(
                "/v1/completions",
                r#"{"model":"guarded","prompt":"swordfish"}"#,
            ),
        );
        assert_eq!(r.status, 400, "{v}: {}", r.text());
        assert!(r.text().contains("guardrails"), "{}", r.text());
        assert_eq!(
            seen.lock().unwrap().len(),
            n,
            "nothing more reached the upstream"
        );
        gw.stop();
    }
}
