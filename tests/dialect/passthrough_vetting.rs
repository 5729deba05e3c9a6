//! What the same-dialect passthrough path lets through from a broken upstream, with raw-socket
//! fake upstreams on 127.0.0.1 port 0: error pages become errors in the client's dialect (same
//! status, Retry-After kept, hosts never shown), errors already in the client's dialect are
//! relayed byte for byte, invalid JSON answers become a 502 (or, past one relay chunk, a body
//! cut short), and an SSE event whose data is not JSON ends the stream with the dialect's error
//! event instead of being forwarded.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use common::*;

/// A fake upstream answering request `n` (from 1, across connections) with `answer(n)`, then
/// closing the connection.
fn upstream(answer: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let answer = std::sync::Arc::new(answer);
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let (answer, count) = (answer.clone(), count.clone());
            std::thread::spawn(move || {
                if read_request(&mut s).is_some() {
                    let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    let _ = s.write_all(&answer(n));
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        }
    });
    addr
}

fn response(status: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

const ANTHROPIC: &str = r#"
[[provider]]
name = "anth"
kind = "anthropic"
base_url = "http://UP"

[[model]]
name = "claude-x"
provider = "anth"

# One attempt per request, no breaker: every request sees the fake upstream's answer.
[routing]
max_attempts = 1
breaker = { failures = 0 }
"#;

/// The three passthrough clients: (name, path, body, Anthropic-shaped errors).
fn clients(stream: bool) -> [(&'static str, &'static str, String, bool); 3] {
    [
        (
            "chat",
            "/v1/chat/completions",
            format!(
                r#"{{"model":"gpt-4o-mini","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
            ),
            false,
        ),
        (
            "responses",
            "/v1/responses",
            format!(r#"{{"model":"gpt-4o-mini","stream":{stream},"input":"hi"}}"#),
            false,
        ),
        (
            "messages",
            "/v1/messages",
            format!(
                r#"{{"model":"claude-x","stream":{stream},"max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#
            ),
            true,
        ),
    ]
}

fn gateway(up: SocketAddr, d: Variant) -> ringgate::server::Running {
    start_gateway(up, d, &ANTHROPIC.replace("UP", &up.to_string()))
}

/// An error body in the client's dialect, as its SDK reads it.
fn dialect_error(r: &Response, anthropic: bool, what: &str) -> String {
    let v = r.json();
    let e = &v["error"];
    assert!(
        e["message"].is_string() && e["type"].is_string(),
        "{what}: {v}"
    );
    if anthropic {
        assert_eq!(v["type"], "error", "{what}: {v}");
    }
    e["message"].as_str().unwrap().to_string()
}

const PAGE: &str = "<html><head><title>502 Bad Gateway</title></head><body>no healthy upstream: backend-3.internal (10.1.2.3:8443)</body></html>";

#[test]
fn passthrough_error_pages_become_errors_in_the_client_dialect() {
    for d in variants() {
        let bodies: [(&str, &str, &[u8]); 3] = [
            (
                "502 Bad Gateway",
                "Content-Type: text/html\r\nRetry-After: 7\r\n",
                PAGE.as_bytes(),
            ),
            (
                "500 Internal Server Error",
                "Content-Type: text/plain\r\nRetry-After: 7\r\n",
                b"upstream connect error at 10.1.2.3",
            ),
            (
                "503 Service Unavailable",
                "Retry-After: 7\r\nContent-Type: application/json\r\n",
                b"",
            ),
        ];
        for (status, headers, body) in bodies {
            let up = upstream(move |_| response(status, headers, body));
            let gw = gateway(up, d);
            for (name, path, req, anthropic) in clients(false) {
                let what = format!("{d} {name} {status}");
                let r = request(gw.addr, &post(path, &req));
                assert_eq!(r.status.to_string(), status[..3], "{what}: {}", r.text());
                assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
                let msg = dialect_error(&r, anthropic, &what);
                let text = r.text();
                for leak in ["10.1.2.3", "backend-3", "<html", "upstream connect"] {
                    assert!(
                        !text.contains(leak),
                        "{what}: {leak} reached the client: {text}"
                    );
                }
                assert_eq!(
                    r.header("retry-after"),
                    Some("7"),
                    "{what}: Retry-After kept"
                );
                let id = r.header("x-request-id").expect("x-request-id");
                assert!(
                    is_gateway_id(id, d) && msg.contains(id),
                    "{what}: {id} {msg}"
                );
            }
            gw.stop();
        }
    }
}

#[test]
fn passthrough_errors_in_the_client_dialect_are_relayed_byte_for_byte() {
    const OA: &str = r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    const AN: &str =
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"Rate limit reached"}}"#;
    for d in variants() {
        let up = upstream(|n| {
            // Odd requests: the provider's own shape for both kinds (which body fits which
            // client is the point); even: JSON in no dialect's shape, with a message.
            let body = match n % 4 {
                1 => OA,
                3 => AN,
                _ => r#"{"detail":"quota exceeded for this key"}"#,
            };
            let headers = "Content-Type: application/json\r\nRetry-After: 3\r\nx-request-id: req_up_9\r\nx-ratelimit-remaining-requests: 0\r\n";
            response("400 Bad Request", headers, body.as_bytes())
        });
        let gw = gateway(up, d);
        let [chat, _, messages] = clients(false);
        for ((name, path, req, anthropic), want) in [(chat, OA), (messages, AN)] {
            let what = format!("{d} {name}");
            let r = request(gw.addr, &post(path, &req));
            assert_eq!(r.status, 400, "{what}");
            assert_eq!(r.text(), want, "{what}: the upstream's body as is");
            assert_eq!(r.header("retry-after"), Some("3"), "{what}");
            assert_eq!(
                r.header("x-upstream-request-id"),
                Some("req_up_9"),
                "{what}"
            );
            assert_eq!(
                r.header("x-ratelimit-remaining-requests"),
                Some("0"),
                "{what}"
            );
            // Another shape: the same status, the upstream's message, the client's shape.
            let r = request(gw.addr, &post(path, &req));
            assert_eq!(r.status, 400, "{what}");
            let msg = dialect_error(&r, anthropic, &what);
            assert_eq!(msg, "quota exceeded for this key", "{what}");
            assert_eq!(r.header("retry-after"), Some("3"), "{what}");
        }
        gw.stop();
    }
}

/// A Chat completion of about `size` bytes (its content padded).
fn completion(size: usize) -> String {
    let pad = "x".repeat(size.saturating_sub(200));
    format!(
        r#"{{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{{"index":0,"message":{{"role":"assistant","content":"{pad}"}},"finish_reason":"stop"}}]}}"#
    )
}

#[test]
fn invalid_passthrough_json_answers_are_a_502_in_the_client_dialect() {
    let ok = completion(1000);
    let cut = ok[..ok.len() / 2].to_string();
    for d in variants() {
        let (ok2, cut2) = (ok.clone(), cut.clone());
        let up = upstream(move |n| {
            let json = "Content-Type: application/json\r\n";
            match n {
                1 => response("200 OK", json, cut2.as_bytes()),
                2 => response("200 OK", json, PAGE.as_bytes()),
                3 => response("200 OK", json, b"{\"a\":1} {\"b\":2}"),
                // No Content-Type: taken as JSON, so vetted too.
                4 => response("200 OK", "", b"\xff"),
                _ => response("200 OK", json, ok2.as_bytes()),
            }
        });
        let gw = gateway(up, d);
        let [(_, path, req, _), ..] = clients(false);
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        for n in 1..=4 {
            let what = format!("{d} answer {n}");
            s.write_all(&post(path, &req)).unwrap();
            let r = read_response(&mut s, &mut buf).expect("a response");
            assert_eq!(r.status, 502, "{what}: {}", r.text());
            dialect_error(&r, false, &what);
            assert!(!r.text().contains("backend-3"), "{what}");
            assert!(r.header("x-request-id").is_some(), "{what}");
        }
        // The same connection serves the next request normally.
        s.write_all(&post(path, &req)).unwrap();
        let r = read_response(&mut s, &mut buf).expect("a response");
        assert_eq!((r.status, r.text()), (200, ok.clone()), "{d}");
        gw.stop();
    }
}

/// Send `req` and read everything until the gateway closes or 3 s pass: (head, body bytes).
fn raw_exchange(addr: SocketAddr, req: &[u8]) -> (String, Vec<u8>) {
    let mut s = connect(addr);
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.write_all(req).unwrap();
    let mut all = Vec::new();
    let mut tmp = [0u8; 65536];
    loop {
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => break,
            Ok(n) => all.extend_from_slice(&tmp[..n]),
        }
    }
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let head = String::from_utf8_lossy(&all[..end]).to_ascii_lowercase();
    (head, all[end..].to_vec())
}

#[test]
fn large_passthrough_json_answers_are_relayed_whole_or_cut_short() {
    // Past one 16 KiB relay chunk: relayed as it arrives under the structural check.
    let ok = completion(100_000);
    let mut cut = ok[..60_000].to_string();
    cut.push_str(&" ".repeat(40_000));
    let (ok2, cut2) = (ok.clone(), cut.clone());
    for d in variants() {
        let (ok2, cut2) = (ok2.clone(), cut2.clone());
        let up = upstream(move |n| {
            let json = "Content-Type: application/json\r\n";
            match n {
                1 => response("200 OK", json, ok2.as_bytes()),
                2 => response("200 OK", json, cut2.as_bytes()),
                _ => {
                    // Chunked, cut: ends without closing its object.
                    let mut out =
                        format!("HTTP/1.1 200 OK\r\n{json}Transfer-Encoding: chunked\r\n\r\n")
                            .into_bytes();
                    for piece in cut2.as_bytes()[..60_000].chunks(7000) {
                        out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                        out.extend_from_slice(piece);
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(b"0\r\n\r\n");
                    out
                }
            }
        });
        let gw = gateway(up, d);
        let [(_, path, req, _), ..] = clients(false);
        let r = request(gw.addr, &post(path, &req));
        assert_eq!((r.status, r.body.len()), (200, ok.len()), "{d}");
        assert!(r.body == ok.as_bytes(), "{d}: relayed intact");

        let (head, body) = raw_exchange(gw.addr, &post(path, &req));
        assert!(
            head.contains(&format!("content-length: {}", cut.len())),
            "{d}: {head}"
        );
        assert!(
            body.len() < cut.len(),
            "{d}: a bad body is cut short ({} of {} bytes)",
            body.len(),
            cut.len()
        );

        let (head, body) = raw_exchange(gw.addr, &post(path, &req));
        assert!(head.contains("transfer-encoding: chunked"), "{d}: {head}");
        assert!(
            !body.ends_with(b"0\r\n\r\n"),
            "{d}: no chunked end for a bad body"
        );
        gw.stop();
    }
}

const CHAT_EV: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"u\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n";
const CHAT_BAD: &str = "data: {\"id\":\"c1\",\"object\":\"chat.compl\n\n";
const CHAT_END: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"u\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
const MSG_EV: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"u\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":0}}}\n\n";
const MSG_BAD: &str = "event: content_block_start\ndata: <html>oops</html>\n\n";
const MSG_END: &str = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// The data payloads of an SSE transcript, each one asserted to be JSON (or `[DONE]`).
fn data_payloads(body: &[u8]) -> Vec<serde_json::Value> {
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.ends_with("\n\n"), "a partial event trails: {text:?}");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| {
            if d == "[DONE]" {
                serde_json::Value::String(d.into())
            } else {
                serde_json::from_str(d).unwrap_or_else(|e| panic!("not JSON ({e}): {d:?}"))
            }
        })
        .collect()
}

#[test]
fn passthrough_sse_events_whose_data_is_not_json_end_the_stream_with_an_error_event() {
    for d in variants() {
        for chunked_apart in [false, true] {
            let up = upstream(move |n| {
                let events = if n % 2 == 1 {
                    [CHAT_EV, CHAT_BAD, CHAT_END]
                } else {
                    [MSG_EV, MSG_BAD, MSG_END]
                };
                let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
                let pieces = if chunked_apart {
                    events.to_vec()
                } else {
                    vec![&*Box::leak(events.concat().into_boxed_str())]
                };
                for p in pieces {
                    out.extend_from_slice(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes());
                }
                out.extend_from_slice(b"0\r\n\r\n");
                out
            });
            let gw = gateway(up, d);
            let [(_, chat_path, chat, _), _, (_, msg_path, msg, _)] = clients(true);
            let what = format!("{d} chat apart={chunked_apart}");
            let r = request(gw.addr, &post(chat_path, &chat));
            assert_eq!(r.status, 200, "{what}");
            let data = data_payloads(&r.body);
            assert_eq!(
                data.len(),
                2,
                "{what}: the good event, then the error: {data:?}"
            );
            assert_eq!(data[0]["choices"][0]["delta"]["content"], "Hel", "{what}");
            assert!(data[1]["error"]["message"].is_string(), "{what}: {data:?}");

            let what = format!("{d} messages apart={chunked_apart}");
            let r = request(gw.addr, &post(msg_path, &msg));
            assert_eq!(r.status, 200, "{what}");
            let text = r.text();
            assert!(
                !text.contains("<html>"),
                "{what}: the bad event is not forwarded"
            );
            assert!(
                !text.contains("message_stop"),
                "{what}: nor anything after it"
            );
            let data = data_payloads(&r.body);
            assert_eq!(data.len(), 2, "{what}: {text}");
            assert_eq!(data[0]["type"], "message_start", "{what}");
            assert_eq!(data[1]["type"], "error", "{what}");
            assert!(text.contains("event: error\n"), "{what}: {text}");
            gw.stop();
        }
    }
}
