//! What the translated path lets through from a broken upstream, with raw-socket fake
//! upstreams on 127.0.0.1 port 0: an upstream stream event nested deeper than the JSON bound
//! (`nesting::MAX_DEPTH`) ends the client's stream with its dialect's error event and no
//! success terminator — on translated routes (Anthropic and Responses clients in front of a
//! Chat-only upstream) exactly as on the same-dialect route. Both drivers, 1 and 2 shards.

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;

use common::*;
use ringgate::config::Config;

/// A Chat stream whose second event carries `extra` as an unknown member.
fn stream_with(extra: &str) -> Vec<u8> {
    let chunk = |rest: &str| {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",{rest}}}\n\n")
    };
    let mut body = chunk(
        r#""choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]"#,
    );
    body += &chunk(&format!(
        r#""choices":[{{"index":0,"delta":{{"content":" there"}},"finish_reason":null}}],"x":{extra}"#
    ));
    body += &chunk(r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"}]"#);
    body += "data: [DONE]\n\n";
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn gateway(up: std::net::SocketAddr, d: &str, shards: usize) -> ringgate::server::Running {
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{d}"

[[provider]]
name = "compat"
kind = "openai-compatible"
base_url = "http://{up}/v1"

[[model]]
name = "m"
provider = "compat"

[routing]
max_attempts = 1
breaker = {{ failures = 0 }}
"#
    );
    ringgate::server::start(Config::parse(&text).unwrap()).unwrap()
}

/// Deep: one level over the bound with the event's own object; at the bound: just under.
fn nest(n: usize) -> String {
    format!("{}{}", "[".repeat(n), "]".repeat(n))
}

#[test]
fn a_deep_upstream_event_ends_every_stream_with_the_dialects_error_event() {
    let deep = nest(ringgate::util::nesting::MAX_DEPTH);
    let shallow = nest(20);
    for d in DRIVERS {
        for shards in [1, 2] {
            let deep_body = stream_with(&deep);
            let ok_body = stream_with(&shallow);
            let up = fake_upstream(move |s, _, req| {
                let body = if String::from_utf8_lossy(req).contains("deep please") {
                    &deep_body
                } else {
                    &ok_body
                };
                s.write_all(body).is_ok()
            });
            let gw = gateway(up, d, shards);
            let clients = [
                (
                    "messages",
                    "/v1/messages",
                    r#"{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"WHAT"}]}"#,
                ),
                (
                    "responses",
                    "/v1/responses",
                    r#"{"model":"m","stream":true,"input":"WHAT"}"#,
                ),
                (
                    "chat",
                    "/v1/chat/completions",
                    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"WHAT"}]}"#,
                ),
            ];
            for (name, path, body) in clients {
                let what = format!("{d} shards={shards} {name}");
                // the same stream nested within the bound is a success
                let r = request(gw.addr, &post(path, &body.replace("WHAT", "shallow")));
                assert_eq!(r.status, 200, "{what}: {}", r.text());
                let text = r.text();
                match name {
                    "messages" => assert!(text.contains("event: message_stop"), "{what}: {text}"),
                    "responses" => assert!(text.contains("response.completed"), "{what}: {text}"),
                    _ => assert!(text.ends_with("data: [DONE]\n\n"), "{what}: {text}"),
                }
                // over the bound: the stream ends with the error event, nothing after it
                let r = request(gw.addr, &post(path, &body.replace("WHAT", "deep please")));
                assert_eq!(r.status, 200, "{what}: {}", r.text());
                assert_eq!(
                    r.header("content-type"),
                    Some("text/event-stream"),
                    "{what}"
                );
                let text = r.text();
                assert!(
                    text.contains("invalid or incomplete response"),
                    "{what}: {text}"
                );
                let last = text.trim_end().rsplit("\n\n").next().unwrap().to_string();
                match name {
                    "messages" => {
                        assert!(last.starts_with("event: error\n"), "{what}: {text}");
                        assert!(!text.contains("message_stop"), "{what}: {text}");
                    }
                    "responses" => {
                        assert!(
                            last.starts_with("event: response.failed\n"),
                            "{what}: {text}"
                        );
                        assert!(!text.contains("response.completed"), "{what}: {text}");
                    }
                    _ => {
                        assert!(last.contains("\"error\""), "{what}: {text}");
                        assert!(!text.contains("[DONE]"), "{what}: {text}");
                    }
                }
                // no upstream byte of the deep event reached the client
                assert!(!text.contains("[[[["), "{what}: {text}");
                assert!(!text.contains(" there"), "{what}: {text}");
            }
            gw.stop();
        }
    }
}
