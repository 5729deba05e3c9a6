//! Upstream faults seen through the gateway, with raw-socket fake upstreams on 127.0.0.1 port 0:
//! stale bytes on pooled connections, streams cut mid-event (chunked and close-delimited,
//! passthrough and translated), client disconnects while the upstream is silent, drain cuts,
//! and what the client and the log learn about an upstream failure.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

fn each_driver(f: impl Fn(&str)) {
    for d in DRIVERS {
        f(d);
    }
}

/// Read one request (head + Content-Length body) from `s`. None: the peer closed.
fn read_request(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let cl: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + cl {
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    Some(buf)
}

/// A raw fake upstream: every accepted connection is served on its own thread; for each
/// request read, `answer(stream, n)` (n counts requests across connections, from 1) writes
/// whatever it likes and returns whether to keep the connection open.
fn fake_upstream<F>(answer: F) -> SocketAddr
where
    F: Fn(&mut TcpStream, usize) -> bool + Send + Sync + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let answer = Arc::new(answer);
    let count = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let answer = answer.clone();
            let count = count.clone();
            std::thread::spawn(move || {
                while read_request(&mut s).is_some() {
                    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                    if !answer(&mut s, n) {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn json_response(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn bytes_sent_after_a_complete_response_never_reach_the_next_request() {
    each_driver(|d| {
        let up = fake_upstream(|s, n| {
            s.write_all(&json_response(&format!("{{\"n\":{n}}}")))
                .unwrap();
            // A late second response on the same connection, after the first one ended.
            std::thread::sleep(Duration::from_millis(20));
            let _ = s.write_all(&json_response(r#"{"bogus":true}"#));
            true
        });
        let gw = start_gateway(up, d, "");
        let r = request(gw.addr, &post("/v1/chat/completions", CHAT));
        assert_eq!(r.json()["n"], 1, "{d}: {}", r.text());
        std::thread::sleep(Duration::from_millis(100));
        let r = request(gw.addr, &post("/v1/chat/completions", CHAT));
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        assert_eq!(
            r.json()["n"],
            2,
            "{d}: the second request gets its own answer, not the stale bytes: {}",
            r.text()
        );
        gw.stop();
    });
}
