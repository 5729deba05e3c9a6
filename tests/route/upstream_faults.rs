//! Upstream faults seen through the gateway, with raw-socket fake upstreams on 127.0.0.1 port 0:
//! stale bytes on pooled connections, streams cut mid-event (chunked and close-delimited,
//! passthrough and translated), client disconnects while the upstream is silent, drain cuts,
//! and what the client and the log learn about an upstream failure.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

fn each_driver(f: impl Fn(Variant)) {
    for v in variants() {
        f(v);
    }
}

const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn bytes_sent_after_a_complete_response_never_reach_the_next_request() {
    each_driver(|d| {
        // Late: the extra response comes 20 ms after the first (the pooled connection is idle
        // by then); glued: in the same write (already buffered when the first one ends).
        for late in [true, false] {
            let up = fake_upstream(move |s, n, _| {
                let mut out = json_response(&format!("{{\"n\":{n}}}"));
                if late {
                    s.write_all(&out).unwrap();
                    out.clear();
                    std::thread::sleep(Duration::from_millis(20));
                }
                out.extend_from_slice(&json_response(r#"{"bogus":true}"#));
                let _ = s.write_all(&out);
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
                "{d} late={late}: the second request gets its own answer, not stale bytes: {}",
                r.text()
            );
            gw.stop();
        }
    });
}

#[test]
fn a_reused_connection_closed_before_answering_is_retried_once_on_a_fresh_one() {
    each_driver(|d| {
        // Per connection: answer the first request; read the second and close unanswered.
        let up = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            std::thread::spawn(move || {
                for s in l.incoming() {
                    let Ok(mut s) = s else { return };
                    std::thread::spawn(move || {
                        if read_request(&mut s).is_some() {
                            s.write_all(&json_response(r#"{"ok":1}"#)).unwrap();
                        }
                        let _ = read_request(&mut s);
                    });
                }
            });
            addr
        };
        let gw = start_gateway(up, d, "");
        // One client connection: its requests stay on one shard, so on one upstream pool.
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        for _ in 0..3 {
            s.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
            let r = read_response(&mut s, &mut buf).expect("an answer");
            assert_eq!(r.status, 200, "{d}: {}", r.text());
        }
        wait_metric(
            gw.addr,
            "ringgate_upstream_retries_total",
            2,
            &format!(
                "{d}: requests 2 and 3 found the pooled connection quiet, lost it, retried once"
            ),
        );
        gw.stop();
    });
}

// ------------------------------------------------------------------ stream endings

const CHAT_EV: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"u\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n";
const CHAT_CUT: &str = "data: {\"id\":\"c1\",\"object\":\"chat.compl";
const CHAT_END: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"u\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
const MSG_EV: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"u\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":0}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n";
const MSG_CUT: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_del";
const MSG_END: &str = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// A fake SSE upstream: the head (chunked or close-delimited), `body` (in one chunk for
/// chunked), then — if `finish` — the chunked end, else a close (a cut for chunked).
fn sse_upstream(chunked: bool, body: &'static str, finish: bool) -> SocketAddr {
    fake_upstream(move |s, _, _| {
        let te = if chunked {
            "Transfer-Encoding: chunked\r\n"
        } else {
            "Connection: close\r\n"
        };
        let mut out =
            format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{te}\r\n").into_bytes();
        if chunked {
            out.extend_from_slice(format!("{:x}\r\n{body}\r\n", body.len()).as_bytes());
            if finish {
                out.extend_from_slice(b"0\r\n\r\n");
            }
        } else {
            out.extend_from_slice(body.as_bytes());
        }
        s.write_all(&out).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        chunked && finish
    })
}

/// Split a client SSE transcript into (event name, data) pairs, asserting that every data
/// payload is whole JSON (or `[DONE]`) and that nothing trails the last event.
fn events(body: &[u8]) -> Vec<(Option<String>, serde_json::Value)> {
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "a partial event trails: {text:?}"
    );
    let mut out = Vec::new();
    for ev in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let mut name = None;
        let mut data = String::new();
        for line in ev.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_string());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data.push_str(d);
            } else {
                panic!("unexpected line {line:?} in {text:?}");
            }
        }
        let v = if data == "[DONE]" {
            serde_json::Value::String("[DONE]".into())
        } else {
            serde_json::from_str(&data)
                .unwrap_or_else(|e| panic!("event data is not whole JSON ({e}): {data:?}"))
        };
        out.push((name, v));
    }
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
"#;

fn chat_stream(addr: SocketAddr) -> Response {
    request(
        addr,
        &post(
            "/v1/chat/completions",
            r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
    )
}

fn messages_stream(addr: SocketAddr, model: &str) -> Response {
    request(
        addr,
        &post(
            "/v1/messages",
            &format!(
                r#"{{"model":"{model}","stream":true,"max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#
            ),
        ),
    )
}

/// The last event is the dialect's error event; no earlier event is an error.
fn ends_with_error(
    evs: &[(Option<String>, serde_json::Value)],
    anthropic: bool,
    what: impl std::fmt::Display,
) {
    let (name, last) = evs.last().unwrap_or_else(|| panic!("{what}: no events"));
    if anthropic {
        assert_eq!(name.as_deref(), Some("error"), "{what}: {evs:?}");
        assert_eq!(last["type"], "error", "{what}");
    } else {
        assert!(last["error"]["message"].is_string(), "{what}: {evs:?}");
    }
    let errors = evs
        .iter()
        .filter(|(n, v)| n.as_deref() == Some("error") || v.get("error").is_some())
        .count();
    assert_eq!(errors, 1, "{what}: {evs:?}");
}

#[test]
fn chat_passthrough_stream_cut_mid_event_ends_with_a_whole_error_event() {
    each_driver(|d| {
        for chunked in [true, false] {
            let what = format!("{d} chunked={chunked}");
            let body: &'static str = Box::leak(format!("{CHAT_EV}{CHAT_CUT}").into_boxed_str());
            let gw = start_gateway(sse_upstream(chunked, body, false), d, "");
            let r = chat_stream(gw.addr);
            assert_eq!(r.status, 200, "{what}");
            let evs = events(&r.body);
            assert_eq!(evs[0].1["choices"][0]["delta"]["content"], "Hel", "{what}");
            ends_with_error(&evs, false, &what);
            gw.stop();
        }
    });
}

#[test]
fn close_delimited_streams_are_complete_only_with_their_terminal_event() {
    each_driver(|d| {
        // Whole events but no [DONE]: a cut, not a success.
        let gw = start_gateway(sse_upstream(false, CHAT_EV, false), d, "");
        let evs = events(&chat_stream(gw.addr).body);
        assert_eq!(evs.len(), 2, "{d}: {evs:?}");
        ends_with_error(&evs, false, d);
        gw.stop();
        // With [DONE]: relayed as is, no error.
        let body: &'static str = Box::leak(format!("{CHAT_EV}{CHAT_END}").into_boxed_str());
        let gw = start_gateway(sse_upstream(false, body, false), d, "");
        let evs = events(&chat_stream(gw.addr).body);
        assert_eq!(evs.last().unwrap().1, "[DONE]", "{d}: {evs:?}");
        assert!(evs.iter().all(|(_, v)| v.get("error").is_none()), "{d}");
        gw.stop();
        // A chunked stream that ends cleanly with a last event missing its blank line: completed.
        let body: &'static str = Box::leak(format!("{CHAT_EV}data: [DONE]\n").into_boxed_str());
        let gw = start_gateway(sse_upstream(true, body, true), d, "");
        let evs = events(&chat_stream(gw.addr).body);
        assert_eq!(evs.len(), 2, "{d}: {evs:?}");
        assert_eq!(evs[1].1, "[DONE]", "{d}");
        gw.stop();
    });
}

#[test]
fn messages_passthrough_stream_cut_mid_event_ends_with_an_anthropic_error_event() {
    each_driver(|d| {
        for chunked in [true, false] {
            let what = format!("{d} chunked={chunked}");
            let body: &'static str = Box::leak(format!("{MSG_EV}{MSG_CUT}").into_boxed_str());
            let up = sse_upstream(chunked, body, false);
            let gw = start_gateway(up, d, &ANTHROPIC.replace("UP", &up.to_string()));
            let r = messages_stream(gw.addr, "claude-x");
            assert_eq!(r.status, 200, "{what}: {}", r.text());
            let evs = events(&r.body);
            assert_eq!(evs.len(), 4, "{what}: {evs:?}");
            ends_with_error(&evs, true, &what);
            gw.stop();
        }
        // Close-delimited, whole events, no message_stop: a cut.
        let up = sse_upstream(false, MSG_EV, false);
        let gw = start_gateway(up, d, &ANTHROPIC.replace("UP", &up.to_string()));
        let evs = events(&messages_stream(gw.addr, "claude-x").body);
        ends_with_error(&evs, true, d);
        gw.stop();
        // Close-delimited and complete: no error.
        let body: &'static str = Box::leak(format!("{MSG_EV}{MSG_END}").into_boxed_str());
        let up = sse_upstream(false, body, false);
        let gw = start_gateway(up, d, &ANTHROPIC.replace("UP", &up.to_string()));
        let evs = events(&messages_stream(gw.addr, "claude-x").body);
        assert_eq!(
            evs.last().unwrap().0.as_deref(),
            Some("message_stop"),
            "{d}"
        );
        gw.stop();
    });
}

#[test]
fn translated_streams_cut_mid_event_end_with_the_client_dialect_error_event() {
    each_driver(|d| {
        for chunked in [true, false] {
            let what = format!("{d} chunked={chunked} messages→chat");
            // Anthropic client, OpenAI upstream cut inside an event.
            let body: &'static str = Box::leak(format!("{CHAT_EV}{CHAT_CUT}").into_boxed_str());
            let gw = start_gateway(sse_upstream(chunked, body, false), d, "");
            let r = messages_stream(gw.addr, "gpt-4o-mini");
            assert_eq!(r.status, 200, "{what}: {}", r.text());
            let evs = events(&r.body);
            assert!(
                evs.iter()
                    .any(|(n, _)| n.as_deref() == Some("content_block_delta")),
                "{what}: the whole event got through: {evs:?}"
            );
            assert!(
                evs.iter()
                    .position(|(n, _)| n.as_deref() == Some("error"))
                    .is_some(),
                "{what}: {evs:?}"
            );
            assert!(
                evs.iter().all(|(_, v)| v["type"] != "message_delta"
                    || v["delta"]["stop_reason"] != "end_turn"),
                "{what}: a cut stream never claims a normal end: {evs:?}"
            );
            gw.stop();

            let what = format!("{d} chunked={chunked} chat→messages");
            // OpenAI client, Anthropic upstream cut inside an event.
            let body: &'static str = Box::leak(format!("{MSG_EV}{MSG_CUT}").into_boxed_str());
            let up = sse_upstream(chunked, body, false);
            let extra = ANTHROPIC.replace("UP", &up.to_string());
            let gw = start_gateway(up, d, &extra);
            let r = request(
                gw.addr,
                &post(
                    "/v1/chat/completions",
                    r#"{"model":"claude-x","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
                ),
            );
            let evs = events(&r.body);
            assert!(
                evs.iter().any(|(_, v)| v.get("error").is_some()),
                "{what}: {evs:?}"
            );
            assert!(
                evs.iter()
                    .all(|(_, v)| v["choices"][0]["finish_reason"] != "stop"),
                "{what}: a cut stream never claims a normal end: {evs:?}"
            );
            gw.stop();
        }
        // Close-delimited OpenAI upstream without [DONE] under an Anthropic client: a cut.
        let gw = start_gateway(sse_upstream(false, CHAT_EV, false), d, "");
        let evs = events(&messages_stream(gw.addr, "gpt-4o-mini").body);
        assert!(
            evs.iter().any(|(n, _)| n.as_deref() == Some("error")),
            "{d}: {evs:?}"
        );
        gw.stop();
        // ... and with [DONE]: a normal end.
        let body: &'static str = Box::leak(format!("{CHAT_EV}{CHAT_END}").into_boxed_str());
        let gw = start_gateway(sse_upstream(false, body, false), d, "");
        let evs = events(&messages_stream(gw.addr, "gpt-4o-mini").body);
        assert_eq!(
            evs.last().unwrap().0.as_deref(),
            Some("message_stop"),
            "{d}"
        );
        assert!(
            evs.iter().all(|(n, _)| n.as_deref() != Some("error")),
            "{d}: {evs:?}"
        );
        gw.stop();
    });
}

// ------------------------------------------------------------------ client gone, drain

/// The client left at `left` and the upstream saw the gateway hang up at `seen`: within a
/// second, and nothing of the request stays in flight at the gateway.
fn cancelled_promptly(gw: ringgate::server::Running, d: Variant, left: Instant, seen: Instant) {
    assert!(
        seen.duration_since(left) < Duration::from_secs(1),
        "{d}: noticed after {:?}",
        seen.duration_since(left)
    );
    wait_metric(
        gw.addr,
        "ringgate_requests_in_flight",
        1,
        "only the scrape itself is in flight",
    );
    gw.stop();
}

#[test]
fn a_client_that_leaves_while_the_upstream_is_silent_cancels_the_upstream_request() {
    each_driver(|d| {
        let (tx, rx) = std::sync::mpsc::channel::<Instant>();
        let up = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            std::thread::spawn(move || {
                for s in l.incoming() {
                    let Ok(mut s) = s else { return };
                    let tx = tx.clone();
                    std::thread::spawn(move || {
                        // Read the request, never answer, report when the gateway hangs up.
                        if read_request(&mut s).is_some() {
                            let mut b = [0u8; 64];
                            while matches!(s.read(&mut b), Ok(n) if n > 0) {}
                            let _ = tx.send(Instant::now());
                        }
                    });
                }
            });
            addr
        };
        let gw = start_gateway(up, d, "");
        let mut c = connect(gw.addr);
        c.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let left = Instant::now();
        drop(c);
        let seen = rx
            .recv_timeout(Duration::from_secs(2))
            .unwrap_or_else(|_| panic!("{d}: the upstream connection stayed open"));
        cancelled_promptly(gw, d, left, seen);
    });
}

/// The same on a pooled connection: the second request goes out on the connection the first
/// answer came back on (its armed read is what starts the client watch, see `upstream::slow`).
#[test]
fn a_client_that_leaves_while_a_pooled_upstream_is_silent_cancels_the_upstream_request() {
    each_driver(|d| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Instant)>();
        let up = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            std::thread::spawn(move || {
                for (conns, s) in l.incoming().enumerate() {
                    let Ok(mut s) = s else { return };
                    let tx = tx.clone();
                    std::thread::spawn(move || {
                        // Answer the first request, read the second, never answer it, report
                        // when the gateway hangs up (and on which connection).
                        if read_request(&mut s).is_none() {
                            return;
                        }
                        s.write_all(&json_response(r#"{"n":1}"#)).unwrap();
                        if read_request(&mut s).is_some() {
                            let mut b = [0u8; 64];
                            while matches!(s.read(&mut b), Ok(n) if n > 0) {}
                            let _ = tx.send((conns + 1, Instant::now()));
                        }
                    });
                }
            });
            addr
        };
        let gw = start_gateway(up, d, "");
        // one client connection: one shard, one pool
        let mut c = connect(gw.addr);
        c.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
        let r = read_response(&mut c, &mut Vec::new()).expect("response");
        assert_eq!(r.json()["n"], 1, "{d}: {}", r.text());
        c.write_all(&post("/v1/chat/completions", CHAT)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let left = Instant::now();
        drop(c);
        let (conn, seen) = rx
            .recv_timeout(Duration::from_secs(2))
            .unwrap_or_else(|_| panic!("{d}: the upstream connection stayed open"));
        assert_eq!(
            conn, 1,
            "{d}: the second request reused the first connection"
        );
        cancelled_promptly(gw, d, left, seen);
    });
}

#[test]
fn pipelined_requests_survive_the_client_watch() {
    each_driver(|d| {
        let up = fake_upstream(|s, n, _| {
            std::thread::sleep(Duration::from_millis(150));
            s.write_all(&json_response(&format!("{{\"n\":{n}}}")))
                .unwrap();
            true
        });
        let gw = start_gateway(up, d, "");
        let mut c = connect(gw.addr);
        let mut two = post("/v1/chat/completions", CHAT);
        two.extend_from_slice(&post("/v1/chat/completions", CHAT));
        c.write_all(&two).unwrap();
        let mut buf = Vec::new();
        for want in [1, 2] {
            let r = read_response(&mut c, &mut buf).expect("response");
            assert_eq!(r.json()["n"], want, "{d}: {}", r.text());
        }
        gw.stop();
    });
}

#[test]
fn streams_running_at_the_end_of_the_drain_end_with_an_error_event_and_a_chunked_end() {
    each_driver(|d| {
        let mock = start_mock(ringgate::mock::Profile::Paced, d);
        let gw = start_gateway_with(mock.addr, d, "drain_timeout_ms = 300", "");
        let addr = gw.addr;
        let stream = std::thread::spawn(move || {
            request(
                addr,
                &post(
                    "/v1/chat/completions",
                    r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":1000}"#,
                ),
            )
        });
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        gw.stop();
        let stopped = t0.elapsed();
        // `request` reads the chunked body to its last chunk (it panics on EOF inside it).
        let r = stream.join().unwrap();
        assert_eq!(r.status, 200, "{d}");
        let evs = events(&r.body);
        assert!(evs.len() > 5, "{d}: the stream ran: {}", evs.len());
        ends_with_error(&evs, false, d);
        assert!(
            evs.last().unwrap().1["error"]["message"]
                .as_str()
                .unwrap()
                .contains("shutting down"),
            "{d}: {evs:?}"
        );
        assert!(
            stopped < Duration::from_secs(2),
            "{d}: stop took {stopped:?} with a 300 ms drain"
        );
        mock.stop();
    });
}

// ------------------------------------------------------------------ what clients and logs learn

/// The `ringgate` binary on a config; returns the child, its address and a channel of its
/// stderr lines.
fn spawn_binary(
    config: &str,
    v: Variant,
) -> (std::process::Child, SocketAddr, mpsc::Receiver<String>) {
    use std::io::BufRead;
    let Variant { driver, shards } = v;
    let path = std::env::temp_dir().join(format!(
        "ringgate-upstream-faults-{}-{driver}-{shards}.toml",
        std::process::id()
    ));
    std::fs::write(&path, config).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ringgate"))
        .args(["--config", path.to_str().unwrap()])
        .env("RINGGATE_DRIVER", driver)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the gateway did not start");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    (child, addr, rx)
}

#[test]
fn upstream_failures_reach_the_client_generic_with_a_request_id_and_the_log_in_full() {
    each_driver(|d| {
        // A port nothing listens on.
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let shards = d.shards;
        let cfg = format!(
            r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false

[[provider]]
name = "backend-7"
kind = "openai"
base_url = "http://{closed}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "backend-7"
"#
        );
        let (mut child, addr, log) = spawn_binary(&cfg, d);
        let r = request(addr, &post("/v1/chat/completions", CHAT));
        let _ = child.kill();
        assert_eq!(r.status, 502, "{d}: {}", r.text());
        let body = r.text();
        let port = closed.port().to_string();
        assert!(
            !body.contains("127.0.0.1") && !body.contains(&port),
            "{d}: the client learns nothing about the upstream's address: {body}"
        );
        assert_eq!(r.json()["error"]["code"], "upstream_connect_error", "{d}");
        let id = r.header("x-request-id").expect("x-request-id").to_string();
        assert!(is_gateway_id(&id, d), "{d}: {id}");
        assert!(body.contains(&id), "{d}: {body}");
        let line = loop {
            let l = log
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("{d}: no log line names {id}"));
            if l.contains(&id) {
                break l;
            }
        };
        assert!(line.contains("backend-7"), "{d}: {line}");
        assert!(
            line.contains(&port),
            "{d}: the log keeps the detail: {line}"
        );
        let _ = child.wait();
    });
}

/// A stream that broke mid-way still ends as a whole HTTP message (the error event, the chunked
/// end), so the client's keep-alive connection stays usable: the next request on it is
/// answered. (Closing it raced the client's next request on that connection: SDKs saw
/// "connection error" on their healthy call after a fault.)
#[test]
fn a_broken_stream_leaves_the_client_connection_usable() {
    each_driver(|d| {
        let body: &'static str = Box::leak(format!("{CHAT_EV}{CHAT_CUT}").into_boxed_str());
        let gw = start_gateway(sse_upstream(true, body, false), d, "");
        let chat =
            r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let messages = r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
        for (path, body, anthropic) in [
            ("/v1/chat/completions", chat, false),
            ("/v1/messages", messages, true),
        ] {
            let what = format!("{d} {path}");
            let mut s = connect(gw.addr);
            let mut buf = Vec::new();
            for round in 0..2 {
                s.write_all(&post(path, body)).unwrap();
                let r = read_response(&mut s, &mut buf)
                    .unwrap_or_else(|| panic!("{what}: round {round}: connection closed"));
                assert_eq!(r.status, 200, "{what}");
                assert_ne!(r.header("connection"), Some("close"), "{what}");
                ends_with_error(&events(&r.body), anthropic, format!("{what} #{round}"));
            }
        }
        gw.stop();
    });
}
