//! Usage, spend and budgets end to end: real sockets on 127.0.0.1 port 0, the project's mock
//! (standalone as every provider kind, and in-process) or a raw fake upstream; the ledger
//! (`Running::spend`) and `/metrics` must hold exactly the tokens the upstream reported —
//! streams included, whether or not the client asked for usage — priced per model; budgets
//! refuse exactly the request after the one whose spend reached them.
//!
//! The mock counts input tokens from the prompt's text (bytes / 4, rounded up), the same in
//! every dialect, and answers `max_tokens` output tokens: expected counts are known here.

#[path = "../common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use common::*;
use ringgate::governance::spend::UsageRow;
use ringgate::mock::Profile;

const SECRET: &str = "rg-test-usage-5e4d3c2b1a09f8e7d6c5b4a3";
const TEXT: &str = "hello there, gateway"; // 20 bytes: 5 input tokens at the mock

fn post_key(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {SECRET}\r\nx-api-key-unused: 1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Every provider kind on the standalone mock (and the in-process mock), each model priced,
/// one key (`key_extra` added to it).
fn config(v: Variant, key_extra: &str) -> String {
    let Variant { driver, shards } = v;
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"

[[provider]]
name = "oa"
kind = "openai"
base_url = "http://{{mock}}/v1"

[[provider]]
name = "an"
kind = "anthropic"
base_url = "http://{{mock}}"

[[provider]]
name = "gm"
kind = "gemini"
base_url = "http://{{mock}}"

[[provider]]
name = "inproc"
kind = "mock"

[[model]]
name = "gpt"
provider = "oa"
price_input_per_mtok = 1.0
price_output_per_mtok = 2.0

[[model]]
name = "claude"
provider = "an"
price_input_per_mtok = 3.0
price_output_per_mtok = 15.0

[[model]]
name = "gem"
deployments = [{{ provider = "gm", price_output_per_mtok = 5.0 }}]
price_input_per_mtok = 0.5
price_output_per_mtok = 99.0

[[model]]
name = "local"
provider = "inproc"

[[key]]
name = "team-a"
key_sha256 = "{}"
{key_extra}
"#,
        key_digest_hex(SECRET)
    )
}

/// The ledger once it holds `requests` requests in all (a request is recorded when it ends,
/// just after its last byte went out: poll).
fn rows_after(st: &Stack, requests: u64) -> Vec<UsageRow> {
    let mut rows = Vec::new();
    for _ in 0..400 {
        rows = st.gateway().spend.snapshot();
        if rows.iter().map(|r| r.requests).sum::<u64>() == requests {
            return rows;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("want {requests} requests in the ledger: {rows:?}");
}

fn chat(model: &str, max: u32, stream: bool, usage: bool) -> String {
    let opts = if usage {
        r#","stream_options":{"include_usage":true}"#
    } else {
        ""
    };
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"{TEXT}"}}],"max_tokens":{max},"stream":{stream}{opts}}}"#
    )
}

fn messages(model: &str, max: u32, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","max_tokens":{max},"stream":{stream},"messages":[{{"role":"user","content":"{TEXT}"}}]}}"#
    )
}

fn responses(model: &str, max: u32, stream: bool) -> String {
    format!(r#"{{"model":"{model}","input":"{TEXT}","max_output_tokens":{max},"stream":{stream}}}"#)
}

fn gemini(max: u32) -> String {
    format!(
        r#"{{"contents":[{{"role":"user","parts":[{{"text":"{TEXT}"}}]}}],"generationConfig":{{"maxOutputTokens":{max}}}}}"#
    )
}

/// Whether a Chat SSE transcript carries a usage chunk, and its (prompt, completion) tokens.
fn chat_usage_chunk(body: &str) -> Option<(u64, u64)> {
    body.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<serde_json::Value>(d).unwrap())
        .find(|v| v["usage"].is_object())
        .map(|v| {
            assert_eq!(v["choices"], serde_json::json!([]), "{v}");
            (
                v["usage"]["prompt_tokens"].as_u64().unwrap(),
                v["usage"]["completion_tokens"].as_u64().unwrap(),
            )
        })
}

#[test]
fn every_answer_is_counted_exactly_in_each_dialect_and_path() {
    for d in variants() {
        let mock = start_mock(Profile::Instant, d);
        let st = Stack::with_config(mock, &config(d, ""));
        let mut s = connect(st.addr);
        let mut buf = Vec::new();
        // (path, body, model, output tokens, client sees a Chat usage chunk?)
        let cases: Vec<(&str, String, &str, u64, Option<bool>)> = vec![
            // passthrough
            (
                "/v1/chat/completions",
                chat("gpt", 7, false, false),
                "gpt",
                7,
                None,
            ),
            (
                "/v1/chat/completions",
                chat("gpt", 5, true, false),
                "gpt",
                5,
                Some(false),
            ),
            (
                "/v1/chat/completions",
                chat("gpt", 4, true, true),
                "gpt",
                4,
                Some(true),
            ),
            (
                "/v1/messages",
                messages("claude", 6, false),
                "claude",
                6,
                None,
            ),
            (
                "/v1/messages",
                messages("claude", 3, true),
                "claude",
                3,
                None,
            ),
            ("/v1/responses", responses("gpt", 2, false), "gpt", 2, None),
            ("/v1/responses", responses("gpt", 8, true), "gpt", 8, None),
            // the in-process mock
            (
                "/v1/chat/completions",
                chat("local", 3, true, false),
                "local",
                3,
                Some(false),
            ),
            (
                "/v1/chat/completions",
                chat("local", 2, true, true),
                "local",
                2,
                Some(true),
            ),
            // translated: to an Anthropic upstream, a Gemini upstream, a Chat upstream
            (
                "/v1/chat/completions",
                chat("claude", 9, false, false),
                "claude",
                9,
                None,
            ),
            (
                "/v1/chat/completions",
                chat("claude", 5, true, false),
                "claude",
                5,
                Some(false),
            ),
            (
                "/v1/chat/completions",
                chat("claude", 4, true, true),
                "claude",
                4,
                Some(true),
            ),
            (
                "/v1/chat/completions",
                chat("gem", 6, false, false),
                "gem",
                6,
                None,
            ),
            (
                "/v1/chat/completions",
                chat("gem", 7, true, false),
                "gem",
                7,
                Some(false),
            ),
            ("/v1/messages", messages("gpt", 5, true), "gpt", 5, None),
            ("/v1/messages", messages("gem", 3, false), "gem", 3, None),
            (
                "/v1/responses",
                responses("claude", 4, true),
                "claude",
                4,
                None,
            ),
            // Gemini clients: passthrough (usageMetadata in every chunk) and translated
            (
                "/v1beta/models/gem:generateContent",
                gemini(3),
                "gem",
                3,
                None,
            ),
            (
                "/v1beta/models/gem:streamGenerateContent?alt=sse",
                gemini(4),
                "gem",
                4,
                None,
            ),
            (
                "/v1beta/models/gpt:streamGenerateContent?alt=sse",
                gemini(2),
                "gpt",
                2,
                None,
            ),
            (
                "/v1beta/models/claude:generateContent",
                gemini(5),
                "claude",
                5,
                None,
            ),
        ];
        let mut want: HashMap<&str, (u64, u64, u64)> = HashMap::new();
        for (n, (path, body, model, out, chunk)) in cases.iter().enumerate() {
            let what = format!("{d} case {n}: {path} {body}");
            s.write_all(&post_key(path, body)).unwrap();
            let r = read_response(&mut s, &mut buf).unwrap();
            assert_eq!(r.status, 200, "{what}: {}", r.text());
            match chunk {
                Some(true) => assert_eq!(chat_usage_chunk(&r.text()), Some((5, *out)), "{what}"),
                Some(false) => {
                    assert_eq!(chat_usage_chunk(&r.text()), None, "{what}");
                    assert!(!r.text().contains("prompt_tokens"), "{what}");
                    assert!(r.text().ends_with("data: [DONE]\n\n"), "{what}");
                }
                None => {}
            }
            let w = want.entry(model).or_default();
            *w = (w.0 + 1, w.1 + 5, w.2 + out);
            let rows = rows_after(&st, n as u64 + 1);
            for (m, (req, i, o)) in &want {
                let row = rows.iter().find(|r| r.model == *m).unwrap();
                assert_eq!(
                    (row.requests, row.input_tokens, row.output_tokens),
                    (*req, *i, *o),
                    "{what}: {m}"
                );
            }
        }
        // priced per model; a deployment's price wins over the model's, field by field
        let rows = st.gateway().spend.snapshot();
        let price = |m: &str, pin: u64, pout: u64| {
            let r = rows.iter().find(|r| r.model == m).unwrap();
            assert_eq!(
                r.spend_nanos,
                r.input_tokens * pin + r.output_tokens * pout,
                "{m}"
            );
        };
        price("gpt", 1000, 2000);
        price("claude", 3000, 15_000);
        price("gem", 500, 5000);
        price("local", 0, 0);
        let total_in: u64 = rows.iter().map(|r| r.input_tokens).sum();
        let total_out: u64 = rows.iter().map(|r| r.output_tokens).sum();
        wait_metric(
            st.addr,
            "ringgate_key_input_tokens_total{",
            total_in,
            "counted",
        );
        wait_metric(
            st.addr,
            "ringgate_key_output_tokens_total{",
            total_out,
            "counted",
        );
        // (summed over the shards' series)
        let spend = |text: &str| -> f64 {
            text.lines()
                .filter(|l| {
                    l.starts_with("ringgate_key_spend_usd_total{") && l.contains("model=\"claude\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let claude = rows.iter().find(|r| r.model == "claude").unwrap();
        scrape_until(
            st.addr,
            &format!("{d}: spend as the ledger: {claude:?}"),
            |t| (spend(t) - claude.spend_usd).abs() < 1e-12,
        );
    }
}

/// A fake OpenAI upstream: records each request body and answers a Chat stream that carries
/// the usage chunk (11 prompt, 7 completion tokens) only when the request asked for it.
fn usage_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = bodies.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let seen = seen.clone();
            std::thread::spawn(move || {
                while let Some(req) = read_request(&mut s) {
                    let text = String::from_utf8_lossy(&req).into_owned();
                    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
                    let asked = body.contains(r#""include_usage":true"#);
                    seen.lock().unwrap().push(body);
                    if !answer(&mut s, asked) {
                        return;
                    }
                }
            });
        }
    });
    (addr, bodies)
}

fn answer(s: &mut TcpStream, usage: bool) -> bool {
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let mut body = chunk(r#"{"role":"assistant","content":"hi"}"#, "null");
    body.push_str(&chunk("{}", "\"stop\""));
    if usage {
        body.push_str("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":7,\"total_tokens\":18}}\n\n");
    }
    body.push_str("data: [DONE]\n\n");
    let out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(out.as_bytes()).is_ok()
}

#[test]
fn the_gateway_asks_for_stream_usage_and_the_client_gets_only_what_it_asked() {
    for d in variants() {
        let (up, bodies) = usage_upstream();
        let cfg = config(d, "").replace("{mock}", &up.to_string());
        let st = Stack::with_config(start_mock(Profile::Instant, d), &cfg);
        let mut s = connect(st.addr);
        let mut buf = Vec::new();
        // not asked: the upstream is asked, the client gets no usage chunk
        let body = r#"{"model":"gpt","stream":true,"messages":[{"role":"user","content":"x"}]}"#;
        s.write_all(&post_key("/v1/chat/completions", body))
            .unwrap();
        let r = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        let sent = bodies.lock().unwrap().last().cloned().unwrap();
        assert_eq!(
            sent,
            r#"{"stream_options":{"include_usage":true},"model":"gpt","stream":true,"messages":[{"role":"user","content":"x"}]}"#,
            "{d}"
        );
        assert_eq!(chat_usage_chunk(&r.text()), None, "{d}: {}", r.text());
        assert_eq!(r.text().matches("data: ").count(), 3, "{d}: {}", r.text());
        let rows = rows_after(&st, 1);
        assert_eq!(
            (rows[0].input_tokens, rows[0].output_tokens),
            (11, 7),
            "{d}"
        );
        // other stream_options are kept
        let body = r#"{"model":"gpt","stream":true,"stream_options":{"include_obfuscation":false},"messages":[]}"#;
        s.write_all(&post_key("/v1/chat/completions", body))
            .unwrap();
        let r = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(chat_usage_chunk(&r.text()), None, "{d}");
        let sent = bodies.lock().unwrap().last().cloned().unwrap();
        assert!(
            sent.contains(r#""stream_options":{"include_obfuscation":false,"include_usage":true}"#),
            "{sent}"
        );
        rows_after(&st, 2);
        // asked: relayed unchanged, the body byte for byte
        let body = r#"{"model":"gpt","stream":true,"messages":[],"stream_options":{"include_usage":true}}"#;
        s.write_all(&post_key("/v1/chat/completions", body))
            .unwrap();
        let r = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(chat_usage_chunk(&r.text()), Some((11, 7)), "{d}");
        assert_eq!(bodies.lock().unwrap().last().unwrap(), body);
        let rows = rows_after(&st, 3);
        assert_eq!(
            (rows[0].input_tokens, rows[0].output_tokens),
            (33, 21),
            "{d}"
        );
        assert_eq!(rows[0].spend_nanos, 33 * 1000 + 21 * 2000);
        // a non-stream request is sent as it is
        let body = r#"{"model":"gpt","messages":[]}"#;
        s.write_all(&post_key("/v1/chat/completions", body))
            .unwrap();
        let _ = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(bodies.lock().unwrap().last().unwrap(), body);
    }
}

/// Send `n` requests one after the other, each on a new connection (a refusal on the head
/// closes its connection: the body was not read); return the statuses and the last response.
fn send_all(st: &Stack, path: &str, body: &str, n: usize) -> (Vec<u16>, Response) {
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..n {
        let r = request(st.addr, &post_key(path, body));
        statuses.push(r.status);
        last = Some(r);
    }
    (statuses, last.unwrap())
}

#[test]
fn a_budget_runs_out_at_the_right_request_in_both_dialects() {
    for d in variants() {
        // "claude" costs 15 USD per 1M output tokens: 4 output tokens = 60 µUSD per request
        // (plus 5 input tokens × 3 µUSD = 15 µUSD): 75 µUSD. A 225 µUSD budget is three.
        for (path, body, kind) in [
            (
                "/v1/chat/completions",
                chat("claude", 4, true, false),
                "openai",
            ),
            ("/v1/messages", messages("claude", 4, false), "anthropic"),
        ] {
            let st = Stack::with_config(
                start_mock(Profile::Instant, d),
                &config(d, "budget_usd = 0.000225\nbudget_period = \"day\""),
            );
            let (statuses, r) = send_all(&st, path, &body, 5);
            assert_eq!(statuses, [200, 200, 200, 429, 429], "{d} {kind}");
            let v = r.json();
            if kind == "openai" {
                assert_eq!(v["error"]["type"], "insufficient_quota", "{v}");
                assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
            } else {
                assert_eq!(v["type"], "error", "{v}");
                assert_eq!(v["error"]["type"], "billing_error", "{v}");
            }
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(msg.contains("team-a") && msg.contains("budget"), "{msg}");
            assert_eq!(r.header("x-should-retry"), Some("false"));
            let secs: u64 = r.header("retry-after").unwrap().parse().unwrap();
            assert!(
                (1..=86_400).contains(&secs),
                "until the next UTC day: {secs}"
            );
            let rows = st.gateway().spend.snapshot();
            assert_eq!((rows[0].requests, rows[0].spend_nanos), (3, 225_000), "{d}");
            let day = ringgate::governance::spend::Period::Day
                .start(ringgate::governance::spend::unix_now());
            assert_eq!(rows[0].period_start, day);
            wait_metric(
                st.addr,
                "ringgate_key_rejections_total{key=\"team-a\",reason=\"budget\"}",
                2,
                "counted",
            );
            // a new period (here: the budget raised at runtime) admits again
            st.gateway()
                .spend
                .get("team-a")
                .unwrap()
                .set_budget(Some(300_000), None);
            let (statuses, _) = send_all(&st, path, &body, 2);
            assert_eq!(statuses, [200, 429], "{d} {kind}");
        }
    }
}

#[test]
fn restored_spend_counts_toward_the_budget() {
    one_driver("epoll").for_each(restored_spend_counts_toward_the_budget_at);
}

fn restored_spend_counts_toward_the_budget_at(v: Variant) {
    let st = Stack::with_config(
        start_mock(Profile::Instant, v),
        &config(v, "budget_usd = 0.0001\nbudget_period = \"month\""),
    );
    let now = ringgate::governance::spend::unix_now();
    let month = ringgate::governance::spend::Period::Month.start(now);
    st.gateway().spend.restore(&[UsageRow {
        key: "team-a".into(),
        model: "claude".into(),
        requests: 9,
        input_tokens: 0,
        output_tokens: 0,
        spend_usd: 0.0001,
        spend_nanos: 100_000,
        period_start: month,
    }]);
    let (statuses, r) = send_all(&st, "/v1/messages", &messages("claude", 1, false), 1);
    assert_eq!(statuses, [429], "{}", r.text());
}

/// A fake OpenAI upstream whose answers report `"prompt_tokens": V` (V: the text after
/// `usage=` in the request's message, verbatim) and 3 completion tokens: a Chat answer, or a
/// Chat stream with its usage chunk when the request asked for a stream.
fn hostile_usage_upstream() -> SocketAddr {
    fake_upstream(|s, _, req| {
        let text = String::from_utf8_lossy(req);
        let v = text
            .split("usage=")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("0")
            .to_string();
        let usage = format!(r#"{{"prompt_tokens":{v},"completion_tokens":3,"total_tokens":{v}}}"#);
        let (ct, body) = if text.contains(r#""stream":true"#) {
            let chunk = |rest: &str| {
                format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",{rest}}}\n\n")
            };
            let mut b = chunk(
                r#""choices":[{"index":0,"delta":{"role":"assistant","content":"x"},"finish_reason":null}]"#,
            );
            b += &chunk(r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"}]"#);
            b += &chunk(&format!(r#""choices":[],"usage":{usage}"#));
            b += "data: [DONE]\n\n";
            ("text/event-stream", b)
        } else {
            let b = format!(
                r#"{{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"x"}},"finish_reason":"stop"}}],"usage":{usage}}}"#
            );
            ("application/json", b)
        };
        let out = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(out.as_bytes()).is_ok()
    })
}

/// Usage numbers an upstream should never send: a negative, fractional, exponent or over
/// u64::MAX count is no count (the ledger gets 0 input tokens for it, not the digits it starts
/// with); u64::MAX is read exactly; the ledger's spend and tokens saturate and never run
/// backwards. Passthrough (scanned, JSON and stream) and translated (Anthropic client, parsed).
#[test]
fn hostile_usage_numbers_are_absent_or_exact_and_spend_never_runs_backwards() {
    for d in DRIVERS {
        for shards in [1, 2] {
            let up = hostile_usage_upstream();
            let cfg = config(Variant { driver: d, shards }, "").replace("{mock}", &up.to_string());
            let st = Stack::with_config(start_mock(Profile::Instant, d), &cfg);
            let paths = |v: &str| {
                let m = format!(r#"[{{"role":"user","content":"usage={v}"}}]"#);
                [
                    (
                        "/v1/chat/completions",
                        format!(r#"{{"model":"gpt","messages":{m}}}"#),
                    ),
                    (
                        "/v1/chat/completions",
                        format!(r#"{{"model":"gpt","stream":true,"messages":{m}}}"#),
                    ),
                    (
                        "/v1/messages",
                        format!(r#"{{"model":"gpt","max_tokens":3,"messages":{m}}}"#),
                    ),
                ]
            };
            let now = ringgate::governance::spend::unix_now();
            let mut n = 0u64;
            let mut last_spend = 0u64;
            let values = [
                ("-5", 0),
                ("-0", 0),
                ("1e308", 0),
                ("1E3", 0),
                ("1.5", 0),
                ("2.0", 0),
                ("18446744073709551616", 0),
                ("184467440737095516150", 0),
                ("18446744073709551615", u64::MAX),
                ("18446744073709551615", u64::MAX),
                ("7", u64::MAX),
            ];
            for (v, want_input) in values {
                for (path, body) in paths(v) {
                    let what = format!("{d} shards={shards} {path} {body}");
                    let r = request(st.addr, &post_key(path, &body));
                    assert_eq!(r.status, 200, "{what}: {}", r.text());
                    n += 1;
                    let rows = rows_after(&st, n);
                    let row = rows.iter().find(|r| r.model == "gpt").unwrap();
                    assert_eq!(row.input_tokens, want_input, "{what}");
                    assert_eq!(row.output_tokens, 3 * n, "{what}");
                    let spent = st.gateway().spend.spent("team-a", now);
                    assert!(spent >= last_spend, "{what}: spend ran backwards");
                    assert!(
                        row.spend_nanos >= last_spend,
                        "{what}: ledger ran backwards"
                    );
                    last_spend = spent;
                    if shards == 1 {
                        // one shard: /metrics agrees (no snapshot of another shard; Prometheus
                        // values are float64, so u64::MAX shows as 2^64)
                        let text = request(st.addr, &get("/metrics")).text();
                        let input: f64 = text
                            .lines()
                            .filter(|l| l.starts_with("ringgate_key_input_tokens_total{"))
                            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
                            .sum();
                        assert_eq!(input, want_input as f64, "{what}");
                    }
                }
            }
            assert_eq!(last_spend, u64::MAX, "{d}: saturated, not wrapped");
        }
    }
}
