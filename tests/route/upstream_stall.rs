//! An upstream that accepts the connection and never reads it: the gateway's request write
//! stalls once the socket buffers are full. The write is bounded by the attempt's first-byte
//! timeout (capped by the total deadline), so the client gets a 504 in its dialect and the
//! request's permit is released, instead of the request being held until the upstream closes.
//! Buffered bodies (chat, messages) and streamed uploads (`/v1/files`), both drivers, 1 and 2
//! shards.

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;

/// The body: large enough to fill the gateway's send buffer and the upstream's (small) receive
/// buffer many times over.
const BODY_BYTES: usize = 12 << 20;

/// A raw TCP upstream on port 0 with a 4 KiB receive buffer that accepts and never reads (the
/// accepted sockets are kept open until the process ends).
fn never_reading_upstream() -> SocketAddr {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    s.listen(16).unwrap();
    let l: std::net::TcpListener = s.into();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming() {
            let Ok(c) = c else { return };
            held.push(c);
        }
    });
    addr
}

/// Send `head` + `body` from a thread (the gateway stops reading the client once its upstream
/// write stalls) and read the answer here: the response and how long it took.
fn stalled(addr: SocketAddr, head: String, body: Vec<u8>) -> (Response, Duration) {
    let mut s = connect(addr);
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut w: TcpStream = s.try_clone().unwrap();
    let start = Instant::now();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(head.as_bytes());
        let _ = w.write_all(&body);
    });
    let mut buf = Vec::new();
    let r = read_response(&mut s, &mut buf).expect("no answer: the stalled write held the request");
    let took = start.elapsed();
    drop(s);
    let _ = writer.join();
    (r, took)
}

fn json_post(path: &str, body: &[u8]) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
}

fn big_prompt(model: &str, messages: bool) -> Vec<u8> {
    let pad = "x".repeat(BODY_BYTES);
    let max = if messages { r#""max_tokens":5,"# } else { "" };
    format!(r#"{{"model":"{model}",{max}"messages":[{{"role":"user","content":"{pad}"}}]}}"#)
        .into_bytes()
}

#[test]
fn a_request_write_the_upstream_never_reads_ends_in_a_504_within_the_first_byte_timeout() {
    for d in variants() {
        // one attempt, 800 ms for the upstream to take the request and answer
        let extra = r#"
[[model]]
name = "stuck"
provider = "local"
first_byte_timeout_ms = 800
max_attempts = 1
"#;
        let gw = start_gateway(never_reading_upstream(), d, extra);
        for (path, messages) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
            let what = format!("{d} {path}");
            let body = big_prompt("stuck", messages);
            let (r, took) = stalled(gw.addr, json_post(path, &body), body);
            assert_eq!(r.status, 504, "{what}: {}", r.text());
            let j = r.json();
            if messages {
                assert_eq!(j["type"], "error", "{what}: Anthropic's shape: {j}");
                assert_eq!(j["error"]["type"], "timeout_error", "{what}: {j}");
            } else {
                assert!(
                    j["error"]["message"].is_string(),
                    "{what}: OpenAI's shape: {j}"
                );
            }
            assert!(
                took < Duration::from_secs(6),
                "{what}: bounded by the 800 ms first-byte timeout, took {took:?}"
            );
        }
        wait_metric(
            gw.addr,
            "ringgate_permits_in_flight",
            0,
            "the stalled requests' permits are released",
        );
        gw.stop();
    }
}

#[test]
fn a_streamed_upload_the_upstream_never_reads_ends_in_a_504() {
    for d in variants() {
        // uploads name no model: the [upstream] first-byte timeout (3 s in the test config)
        let gw = start_gateway(never_reading_upstream(), d, "");
        let boundary = "b0undary";
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.resize(body.len() + BODY_BYTES, b'x');
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let head = format!(
            "POST /v1/files HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let (r, took) = stalled(gw.addr, head, body);
        assert_eq!(r.status, 504, "{d}: {}", r.text());
        assert!(
            took < Duration::from_secs(10),
            "{d}: bounded by the 3 s first-byte timeout, took {took:?}"
        );
        wait_metric(
            gw.addr,
            "ringgate_permits_in_flight",
            0,
            "the stalled upload's permit is released",
        );
        gw.stop();
    }
}

/// A raw TCP upstream on port 0 that reads the first 8 MiB slowly but steadily (256 KiB, then a
/// 100 ms pause: over 3 s), the rest at once (what the kernel buffers hold when the gateway's
/// write ends must not take a first-byte timeout to drain), and answers a chat completion once
/// the whole request is in.
fn slowly_reading_upstream() -> SocketAddr {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = vec![0u8; 64 << 10];
                let mut burst = 0;
                let want = loop {
                    if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if got.len() >= end + 4 + len {
                            break true;
                        }
                    }
                    let Ok(n) = c.read(&mut buf) else { break false };
                    if n == 0 {
                        break false;
                    }
                    got.extend_from_slice(&buf[..n]);
                    burst += n;
                    if burst >= 256 << 10 && got.len() < 8 << 20 {
                        burst = 0;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                };
                if want {
                    let body = r#"{"id":"x","object":"chat.completion","created":0,"model":"slow","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = c.write_all(answer.as_bytes());
                }
            });
        }
    });
    addr
}

/// The bound is on a write that stalls, not on the whole request: an upstream that takes a
/// 12 MiB body for seconds (longer than the first-byte timeout, with pauses far below it) gets
/// it all and its answer reaches the client.
#[test]
fn a_request_write_the_upstream_takes_slowly_is_not_cut() {
    for d in variants() {
        let extra = r#"
[[model]]
name = "slow"
provider = "local"
first_byte_timeout_ms = 1500
max_attempts = 1
"#;
        let gw = start_gateway(slowly_reading_upstream(), d, extra);
        let body = big_prompt("slow", false);
        let (r, took) = stalled(gw.addr, json_post("/v1/chat/completions", &body), body);
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        assert_eq!(r.json()["choices"][0]["message"]["content"], "ok", "{d}");
        assert!(
            took > Duration::from_millis(1500),
            "{d}: the write took longer than the first-byte timeout ({took:?}): the test shows nothing"
        );
        gw.stop();
    }
}
