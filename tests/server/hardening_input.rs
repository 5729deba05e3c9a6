//! Hostile client input (issue 8): request-line injection through `model`, JSON nested deep
//! enough to overflow a recursive parser, trailing data and duplicate routing keys.
//!
//! The client-controlled bytes that can reach an upstream request head are the `model` (Azure
//! deployment and Gemini model path segments, and an exact/prefix route's name) and the `stream`
//! flag (Gemini's method and query); the body is re-framed by the gateway and these requests
//! carry no client header the header policy forwards (`tests/route/header_policy.rs` covers those). A raw-socket fake upstream on 127.0.0.1 port 0 records every byte each connection
//! carried, so the tests can assert that exactly one request line arrived per client request.
//! Every test runs under both I/O drivers.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ringgate::config::Config;
use ringgate::mock::Profile;
use ringgate::server::{self, Running};

const KEY_ENV: &str = "RINGGATE_HARDENING_KEY";
const KEY: &str = "sk-test_key-1";

type Answer = dyn Fn(&str, &[u8]) -> Vec<u8> + Send + Sync;

/// A fake upstream: answers each request (one per connection, `connection: close`) with
/// `answer(target, body)` and records all bytes the connection carried until the gateway closed
/// it.
struct FakeUpstream {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl FakeUpstream {
    fn start(answer: Arc<Answer>) -> FakeUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(Mutex::new(Vec::new()));
        let rec = conns.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                let (rec, answer) = (rec.clone(), answer.clone());
                std::thread::spawn(move || {
                    let bytes = serve_one(s, &*answer);
                    rec.lock().unwrap().push(bytes);
                });
            }
        });
        FakeUpstream { addr, conns }
    }

    fn count(&self) -> usize {
        self.conns.lock().unwrap().len()
    }

    /// The bytes of connection number `n` (0-based), waiting for it to finish.
    fn wait_conn(&self, n: usize) -> Vec<u8> {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Some(c) = self.conns.lock().unwrap().get(n) {
                return c.clone();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the fake upstream never saw connection {n}");
    }
}

fn serve_one(mut s: TcpStream, answer: &Answer) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut all = Vec::new();
    let mut tmp = [0u8; 65536];
    let mut answered = false;
    loop {
        if !answered {
            if let Some((target, body)) = first_request(&all) {
                let _ = s.write_all(&answer(&target, &body));
                let _ = s.shutdown(std::net::Shutdown::Write);
                answered = true;
            }
        }
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return all,
            Ok(n) => all.extend_from_slice(&tmp[..n]),
        }
    }
}

/// The target and body of the first complete request in `buf`.
fn first_request(buf: &[u8]) -> Option<(String, Vec<u8>)> {
    let mut hs = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Request::new(&mut hs);
    let httparse::Status::Complete(n) = r.parse(buf).ok()? else {
        return None;
    };
    let cl: usize = r
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
        .unwrap_or(0);
    let body = buf.get(n..n + cl)?.to_vec();
    Some((r.path?.to_string(), body))
}

/// Every request in `bytes`, in order: (request line, header lines, body). Panics on bytes that
/// are not a sequence of complete requests.
fn requests(bytes: &[u8]) -> Vec<(String, Vec<String>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let mut hs = [httparse::EMPTY_HEADER; 32];
        let mut r = httparse::Request::new(&mut hs);
        let n = match r.parse(rest) {
            Ok(httparse::Status::Complete(n)) => n,
            other => panic!(
                "not a request ({other:?}): {:?}",
                String::from_utf8_lossy(rest)
            ),
        };
        let line = format!("{} {} HTTP/1.1", r.method.unwrap(), r.path.unwrap());
        let headers: Vec<String> = r
            .headers
            .iter()
            .map(|h| format!("{}: {}", h.name, String::from_utf8_lossy(h.value)))
            .collect();
        let cl: usize = r
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .map_or(0, |h| {
                std::str::from_utf8(h.value).unwrap().parse().unwrap()
            });
        let end = (n + cl).min(rest.len());
        out.push((line, headers, rest[n..end].to_vec()));
        rest = &rest[end..];
    }
    out
}

fn http_answer(ct: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A well-formed answer in the dialect the target implies (streams when the body asks).
fn dialect_answer(target: &str, body: &[u8]) -> Vec<u8> {
    let stream = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["stream"].as_bool())
        .unwrap_or(false);
    let sse = |s: &str| http_answer("text/event-stream", s.as_bytes());
    let json = |s: &str| http_answer("application/json", s.as_bytes());
    if target.contains(":streamGenerateContent") {
        sse(include_str!(
            "../golden/stream_gemini_to_messages/text_then_call.in.sse"
        ))
    } else if target.contains(":generateContent") {
        json(include_str!("../golden/response_in_gemini/text.in.json"))
    } else if target.ends_with("/count_tokens") {
        json(r#"{"input_tokens":3}"#)
    } else if target.ends_with("/v1/messages") && stream {
        sse(include_str!(
            "../golden/stream_messages_to_chat/text_then_tool.in.sse"
        ))
    } else if target.ends_with("/v1/messages") {
        json(include_str!("../golden/response_in_messages/text.in.json"))
    } else if target.contains("/embeddings") {
        json(
            r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}"#,
        )
    } else if stream {
        sse(include_str!(
            "../golden/stream_chat_to_messages/text.in.sse"
        ))
    } else {
        json(include_str!(
            "../golden/response_out_messages/length.in.json"
        ))
    }
}

/// Kinds, route prefixes and the client model used to reach each.
const KINDS: [(&str, &str); 5] = [
    ("openai", "oa-"),
    ("openai-compatible", "oc-"),
    ("anthropic", "an-"),
    ("gemini", "ge-"),
    ("azure", "az-"),
];

fn gateway_for(up: SocketAddr, v: Variant) -> Running {
    let Variant { driver, shards } = v;
    std::env::set_var(KEY_ENV, KEY);
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\npin = false\ndriver = \"{driver}\"\n\
         [upstream]\nfirst_byte_timeout_ms = 5000\n"
    );
    for (kind, prefix) in KINDS {
        text.push_str(&format!(
            "[[provider]]\nname = \"{kind}\"\nkind = \"{kind}\"\nbase_url = \"http://{up}/base\"\n\
             api_key_env = \"{KEY_ENV}\"\n[[model]]\nname = \"{prefix}*\"\nprovider = \"{kind}\"\n"
        ));
    }
    // A configured upstream name with every allowed punctuation character.
    text.push_str("[[model]]\nname = \"renamed\"\nprovider = \"azure\"\nupstream_model = \"dep.1_x:y@z+w/v-2\"\n");
    server::start(Config::parse(&text).unwrap()).unwrap()
}

/// Client endpoints: (path, body for `model` and `stream`, error shape is Anthropic).
fn client_body(path: &str, model: &str, stream: bool) -> String {
    let m = serde_json::to_string(model).unwrap();
    match path {
        "/v1/chat/completions" => format!(
            r#"{{"model":{m},"messages":[{{"role":"user","content":"hi"}}],"max_tokens":5,"stream":{stream}}}"#
        ),
        "/v1/responses" => {
            format!(r#"{{"model":{m},"input":"hi","max_output_tokens":5,"stream":{stream}}}"#)
        }
        "/v1/messages" => format!(
            r#"{{"model":{m},"max_tokens":5,"messages":[{{"role":"user","content":"hi"}}],"stream":{stream}}}"#
        ),
        "/v1/messages/count_tokens" => {
            format!(r#"{{"model":{m},"messages":[{{"role":"user","content":"hi"}}]}}"#)
        }
        _ => format!(r#"{{"model":{m},"input":"hi"}}"#),
    }
}

const PATHS: [&str; 5] = [
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/embeddings",
    "/v1/messages/count_tokens",
];

fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The upstream target a valid request must produce, or `None` if it must not reach upstream.
fn expected_target(kind: &str, path: &str, up_model: &str, stream: bool) -> Option<String> {
    let m = pct(up_model);
    let t = match (kind, path) {
        (_, "/v1/messages/count_tokens") if kind != "anthropic" => return None,
        ("anthropic" | "gemini", "/v1/embeddings") => return None,
        ("anthropic", "/v1/messages/count_tokens") => "/base/v1/messages/count_tokens".into(),
        ("anthropic", _) => "/base/v1/messages".into(),
        ("gemini", _) if stream => format!("/base/v1beta/models/{m}:streamGenerateContent?alt=sse"),
        ("gemini", _) => format!("/base/v1beta/models/{m}:generateContent"),
        ("azure", "/v1/embeddings") => {
            format!("/base/openai/deployments/{m}/embeddings?api-version=2024-10-21")
        }
        ("azure", _) => {
            format!("/base/openai/deployments/{m}/chat/completions?api-version=2024-10-21")
        }
        (_, "/v1/embeddings") => "/base/embeddings".into(),
        ("openai", "/v1/responses") => "/base/responses".into(),
        _ => "/base/chat/completions".into(),
    };
    Some(t)
}

fn auth_lines(kind: &str) -> Vec<String> {
    match kind {
        "openai" | "openai-compatible" => vec![format!("authorization: Bearer {KEY}")],
        "azure" => vec![format!("api-key: {KEY}")],
        "anthropic" => vec![
            "anthropic-version: 2023-06-01".into(),
            format!("x-api-key: {KEY}"),
        ],
        _ => vec![format!("x-goog-api-key: {KEY}")],
    }
}

#[test]
fn valid_models_reach_every_provider_kind_as_one_encoded_request_line() {
    for d in variants() {
        let up = FakeUpstream::start(Arc::new(dialect_answer));
        let gw = gateway_for(up.addr, d);
        let mut seen = 0;
        let mut cases: Vec<(&str, String, String)> = KINDS
            .iter()
            .map(|(k, p)| {
                (
                    *k,
                    format!("{p}a.b_c:d@e+f/g-1"),
                    format!("{p}a.b_c:d@e+f/g-1"),
                )
            })
            .collect();
        cases.push(("azure", "renamed".into(), "dep.1_x:y@z+w/v-2".into()));
        for (kind, model, up_model) in &cases {
            for path in PATHS {
                for stream in [false, true] {
                    if stream && (path.contains("count_tokens") || path.contains("embeddings")) {
                        continue;
                    }
                    let body = client_body(path, model, stream);
                    let r = request(gw.addr, &post(path, &body));
                    let what = format!("{d} {kind} {path} stream={stream}");
                    let Some(target) = expected_target(kind, path, up_model, stream) else {
                        assert!(r.status == 200 || r.status == 400, "{what}: {}", r.status);
                        continue;
                    };
                    assert_eq!(r.status, 200, "{what}: {}", r.text());
                    let bytes = up.wait_conn(seen);
                    seen += 1;
                    let reqs = requests(&bytes);
                    assert_eq!(reqs.len(), 1, "{what}: exactly one request line");
                    let (line, headers, _) = &reqs[0];
                    assert_eq!(line, &format!("POST {target} HTTP/1.1"), "{what}");
                    let mut want = vec![
                        format!("host: {}", up.addr),
                        "content-type: application/json".to_string(),
                    ];
                    want.extend(auth_lines(kind));
                    let got: Vec<&String> = headers
                        .iter()
                        .filter(|h| !h.starts_with("content-length: "))
                        .collect();
                    assert_eq!(got, want.iter().collect::<Vec<_>>(), "{what}");
                }
            }
        }
        assert_eq!(up.count(), seen, "{d}: no stray upstream connections");
        gw.stop();
    }
}

/// Names that must never reach an upstream (appended to a routed prefix).
const HOSTILE: &[&str] = &[
    "x/chat/completions?api-version=1 HTTP/1.1\r\nHost: u\r\nContent-Length: 0\r\n\r\nPOST /other HTTP/1.1\r\nX-Ignore: ",
    "x HTTP/1.1\r\nX: y",
    "x\ny",
    "x\ry",
    "x\u{0}y",
    "x\ty",
    "x y",
    "../../other",
    "x/../../../admin",
    "x/./y",
    "x//y",
    "x/",
    "x?y=1",
    "x#frag",
    "x%2F..%2F",
    "x%0D%0A",
    "x\u{e9}",
    "x\"y",
    "x\\y",
];

#[test]
fn invalid_model_names_get_400_in_the_clients_dialect_and_never_reach_upstream() {
    for d in variants() {
        let up = FakeUpstream::start(Arc::new(dialect_answer));
        let gw = gateway_for(up.addr, d);
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        let long = format!("x{}", "a".repeat(300));
        for (kind, prefix) in KINDS {
            for tail in HOSTILE.iter().copied().chain([long.as_str()]) {
                let model = format!("{prefix}{tail}");
                for path in PATHS {
                    for stream in [false, true] {
                        let what = format!("{d} {kind} {path} {model:?}");
                        s.write_all(&post(path, &client_body(path, &model, stream)))
                            .unwrap();
                        let r = read_response(&mut s, &mut buf).expect(&what);
                        assert_eq!(r.status, 400, "{what}: {}", r.text());
                        let v = r.json();
                        let message = if path.starts_with("/v1/messages") {
                            assert_eq!(v["type"], "error", "{what}");
                            assert_eq!(v["error"]["type"], "invalid_request_error", "{what}");
                            v["error"]["message"].as_str().unwrap().to_string()
                        } else {
                            assert_eq!(v["error"]["code"], "invalid_body", "{what}");
                            assert_eq!(v["error"]["type"], "invalid_request_error", "{what}");
                            v["error"]["message"].as_str().unwrap().to_string()
                        };
                        assert!(
                            message.contains("not a valid model name"),
                            "{what}: {message}"
                        );
                        assert!(!message.contains('\n') && !message.contains("HTTP/1.1"));
                    }
                }
            }
        }
        // The same keep-alive connection still serves, and nothing ever reached the upstream.
        s.write_all(&post(
            "/v1/chat/completions",
            &client_body("/v1/chat/completions", "oa-fine", false),
        ))
        .unwrap();
        assert_eq!(read_response(&mut s, &mut buf).unwrap().status, 200, "{d}");
        let bytes = up.wait_conn(0);
        assert_eq!(requests(&bytes).len(), 1, "{d}");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            up.count(),
            1,
            "{d}: only the valid request reached the upstream"
        );
        gw.stop();
    }
}

fn nest(open: &str, close: &str, n: usize) -> String {
    format!("{}{}", open.repeat(n), close.repeat(n))
}

/// Bodies nested 12,000 deep (the issue's reproduction), and 200,000 deep (beyond what any
/// shard stack would hold without the bound), in every position.
fn deep_bodies(model: &str) -> Vec<String> {
    let mut out = Vec::new();
    for n in [12_000, 200_000] {
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let deep = nest(open, close, n);
            out.push(format!(r#"{{"model":"{model}","messages":{deep}}}"#));
            out.push(format!(
                r#"{{"messages":{deep},"model":"{model}","max_tokens":5}}"#
            ));
            out.push(format!(
                r#"{{"model":"{model}","max_tokens":5,"x":{deep}}}"#
            ));
            out.push(format!(r#"{{"model":"{model}"}}{deep}"#));
            out.push(deep);
        }
    }
    out
}

fn assert_deep_refused(addr: SocketAddr, model: &str, what: &str) {
    let mut s = connect(addr);
    let mut buf = Vec::new();
    for body in deep_bodies(model) {
        for path in ["/v1/chat/completions", "/v1/messages"] {
            s.write_all(&post(path, &body)).unwrap();
            let r = read_response(&mut s, &mut buf)
                .unwrap_or_else(|| panic!("{what}: no answer (process dead?) to {path}"));
            assert_eq!(r.status, 400, "{what} {path}: {}", r.text());
            let v = r.json();
            let msg = if path == "/v1/messages" {
                assert_eq!(v["type"], "error", "{what}");
                &v["error"]["message"]
            } else {
                assert_eq!(v["error"]["code"], "invalid_body", "{what}");
                &v["error"]["message"]
            };
            assert!(
                msg.as_str().unwrap().contains("nested deeper than 128"),
                "{what}: {msg}"
            );
        }
    }
    // Alive, on the same connection and on a new one.
    let ok = format!(
        r#"{{"model":"{model}","max_tokens":3,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    s.write_all(&post("/v1/chat/completions", &ok)).unwrap();
    assert_eq!(
        read_response(&mut s, &mut buf).unwrap().status,
        200,
        "{what}"
    );
    assert_eq!(
        request(addr, &post("/v1/chat/completions", &ok)).status,
        200,
        "{what}"
    );
}

#[test]
fn deeply_nested_bodies_get_400_and_the_process_keeps_serving() {
    for d in variants() {
        // The default configuration's shape: the in-process mock provider.
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nshards = {}\npin = false\ndriver = \"{}\"\n\
             [[provider]]\nname = \"mock\"\nkind = \"mock\"\nprofile = \"instant\"\n\
             [[model]]\nname = \"mock\"\nprovider = \"mock\"\n",
            d.shards, d.driver
        );
        let gw = server::start(Config::parse(&text).unwrap()).unwrap();
        assert_deep_refused(gw.addr, "mock", &format!("{d} in-process mock"));
        gw.stop();
        // A passthrough route to an upstream (the project's mock server).
        let stack = Stack::new(Profile::Instant, d, "");
        assert_deep_refused(stack.addr, "gpt-4o-mini", &format!("{d} passthrough"));
        drop(stack);
        // The standalone mock server parses request bodies itself.
        let mock = start_mock(Profile::Instant, d);
        for body in deep_bodies("m") {
            let r = request(mock.addr, &post("/v1/chat/completions", &body));
            assert_eq!(r.status, 400, "{d} mock server: {}", r.text());
        }
        let r = request(mock.addr, &post("/v1/chat/completions", r#"{"model":"m"}"#));
        assert_eq!(r.status, 200, "{d}: mock server alive");
        mock.stop();
    }
}

#[test]
fn deeply_nested_upstream_answers_get_502_or_an_error_event() {
    let deep = Arc::new(nest("[", "]", 12_000));
    for d in variants() {
        let dd = deep.clone();
        let up = FakeUpstream::start(Arc::new(move |_: &str, body: &[u8]| {
            let stream = String::from_utf8_lossy(body).contains("\"stream\":true");
            if stream {
                let ev = format!("data: {{\"id\":\"c\",\"choices\":{dd}}}\n\n");
                http_answer("text/event-stream", ev.as_bytes())
            } else {
                http_answer("application/json", format!("{{\"id\":{dd}}}").as_bytes())
            }
        }));
        let gw = gateway_for(up.addr, d);
        // Anthropic client, OpenAI provider: the answer is parsed for translation.
        let r = request(
            gw.addr,
            &post("/v1/messages", &client_body("/v1/messages", "oa-x", false)),
        );
        assert_eq!(r.status, 502, "{d}: {}", r.text());
        assert_eq!(r.json()["type"], "error", "{d}");
        let r = request(
            gw.addr,
            &post("/v1/messages", &client_body("/v1/messages", "oa-x", true)),
        );
        assert_eq!(r.status, 200, "{d}");
        assert!(r.text().contains("event: error"), "{d}: {}", r.text());
        gw.stop();
    }
}

#[test]
fn trailing_data_and_duplicate_routing_keys_get_400() {
    for d in variants() {
        let gw = Stack::new(Profile::Instant, d, "");
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        let bad = [
            r#"{"model":"gpt-4o-mini"} x"#,
            r#"{"model":"gpt-4o-mini"}{"model":"alias"}"#,
            r#"{"model":"gpt-4o-mini"}}"#,
            r#"{"model":"gpt-4o-mini"},[]"#,
            r#"{"model":"gpt-4o-mini","model":"alias"}"#,
            r#"{"model":"alias","messages":[],"model":"gpt-4o-mini"}"#,
            r#"{"model":"gpt-4o-mini","mod\u0065l":"alias"}"#,
            r#"{"model":"gpt-4o-mini","stream":false,"stream":true}"#,
        ];
        for body in bad {
            s.write_all(&post("/v1/chat/completions", body)).unwrap();
            let r = read_response(&mut s, &mut buf).unwrap();
            assert_eq!(r.status, 400, "{d} {body}: {}", r.text());
            assert_eq!(r.json()["error"]["code"], "invalid_body", "{d} {body}");
            s.write_all(&post("/v1/messages", body)).unwrap();
            let r = read_response(&mut s, &mut buf).unwrap();
            assert_eq!(r.status, 400, "{d} {body}: {}", r.text());
            assert_eq!(r.json()["type"], "error", "{d} {body}");
        }
        // Whitespace after the object is fine.
        s.write_all(&post(
            "/v1/chat/completions",
            "{\"model\":\"gpt-4o-mini\"} \r\n\t",
        ))
        .unwrap();
        assert_eq!(read_response(&mut s, &mut buf).unwrap().status, 200, "{d}");
    }
}
