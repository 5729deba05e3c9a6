//! End-to-end: real sockets on 127.0.0.1 port 0, the project's mock upstream, every test under
//! both I/O drivers (io_uring and epoll).

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::time::Duration;

use common::*;
use ringgate::mock::{text, Profile};

fn each_driver(f: impl Fn(Variant)) {
    for v in variants() {
        f(v);
    }
}

#[test]
fn non_stream_passthrough_and_model_rewrite() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        let r = request(
            gw.addr,
            &post(
                "/v1/chat/completions",
                r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":7}"#,
            ),
        );
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        let v = r.json();
        assert_eq!(
            v["choices"][0]["message"]["content"],
            text::tokens(0, 7),
            "{d}"
        );
        assert_eq!(v["model"], "gpt-4o-mini");
        assert_eq!(
            r.header("x-upstream-request-id"),
            Some("mock"),
            "upstream request id is forwarded under its own name"
        );
        assert!(
            r.header("x-request-id")
                .is_some_and(|id| is_gateway_id(id, d)),
            "the gateway's request id: {:?}",
            r.header("x-request-id")
        );
        // alias → upstream_model: the mock echoes the model it received
        let r = request(
            gw.addr,
            &post(
                "/v1/chat/completions",
                r#"{"model":"alias","messages":[],"max_tokens":2}"#,
            ),
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["model"], "real-model", "{d}");
    });
}

#[test]
fn stream_is_relayed_event_by_event() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        let r = request(
            gw.addr,
            &post(
                "/v1/chat/completions",
                r#"{"model":"gpt-4o-mini","stream":true,"messages":[],"max_tokens":40,"stream_options":{"include_usage":true}}"#,
            ),
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        assert_eq!(r.header("transfer-encoding"), Some("chunked"));
        let (content, events, done) = sse_content(&r.body);
        assert_eq!(content, text::tokens(0, 40), "{d}");
        assert!(done, "{d}: ends with [DONE]");
        // role + 40 tokens + finish + usage + [DONE]
        assert_eq!(events, 44, "{d}");
        assert!(r.text().contains("\"usage\":{\"prompt_tokens\""));
    });
}

#[test]
fn seed_stream_arrives_paced_and_complete() {
    one_driver("io_uring").for_each(seed_stream_arrives_paced_and_complete_at);
}

fn seed_stream_arrives_paced_and_complete_at(v: Variant) {
    let gw = Stack::new(Profile::Seed, v, "");
    let t0 = std::time::Instant::now();
    let r = request(
        gw.addr,
        &post(
            "/v1/chat/completions",
            r#"{"model":"gpt-4o-mini","stream":true,"messages":[],"max_tokens":100}"#,
        ),
    );
    let took = t0.elapsed();
    assert_eq!(sse_content(&r.body).0, text::tokens(0, 100));
    assert!(
        took >= Duration::from_millis(500),
        "seed profile spans ≥ 550 ms, took {took:?}"
    );
}

#[test]
fn keep_alive_and_pipelining() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        for i in 1..=3 {
            s.write_all(&post(
                "/v1/chat/completions",
                &format!(r#"{{"model":"gpt-4o-mini","max_tokens":{i}}}"#),
            ))
            .unwrap();
            let r = read_response(&mut s, &mut buf).unwrap();
            assert_eq!(
                r.json()["choices"][0]["message"]["content"],
                text::tokens(0, i),
                "{d}"
            );
        }
        // three pipelined requests in one write, one of them chunked
        let mut batch = post(
            "/v1/chat/completions",
            r#"{"model":"gpt-4o-mini","max_tokens":1}"#,
        );
        batch.extend_from_slice(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"model\":\"gpt-4o\r\n12\r\n-mini\",\"max_tokens\r\n4\r\n\":2}\r\n0\r\n\r\n");
        batch.extend_from_slice(&get("/healthz"));
        s.write_all(&batch).unwrap();
        let a = read_response(&mut s, &mut buf).unwrap();
        let b = read_response(&mut s, &mut buf).unwrap();
        let c = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(
            a.json()["choices"][0]["message"]["content"],
            text::tokens(0, 1)
        );
        assert_eq!(
            b.json()["choices"][0]["message"]["content"],
            text::tokens(0, 2),
            "{d}: chunked request body"
        );
        assert_eq!(c.json()["status"], "ok");
        // upstream connection was pooled and reused
        wait_metric(
            gw.addr,
            "ringgate_upstream_idle_connections",
            1,
            &format!("{d}"),
        );
    });
}

#[test]
fn malformed_requests_get_openai_errors_and_the_gateway_keeps_serving() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        // (raw request, status, error code, connection must close)
        let cases: Vec<(Vec<u8>, u16, &str, bool)> = vec![
            (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}".to_vec(), 400, "bad_request", true),
            (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}".to_vec(), 400, "bad_request", true),
            (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n".to_vec(), 400, "bad_request", true),
            (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(), 400, "bad_request", true),
            (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nX-A: 1\r\n folded\r\nContent-Length: 2\r\n\r\n{}".to_vec(), 400, "bad_request", true),
            (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(), 501, "not_implemented", true),
            (format!("GET /{} HTTP/1.1\r\nHost: localhost\r\n\r\n", "a".repeat(20_000)).into_bytes(), 431, "head_too_large", true),
            (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1073741824\r\n\r\n".to_vec(), 413, "body_too_large", true),
            (post("/v1/chat/completions", "{not json"), 400, "invalid_body", false),
            (post("/v1/chat/completions", r#"{"messages":[]}"#), 400, "invalid_body", false),
            (post("/v1/chat/completions", r#"{"model":"gpt-4o-mini","stream":"yes"}"#), 400, "invalid_body", false),
            (post("/v1/chat/completions", r#"{"model":"no-such-model"}"#), 404, "model_not_found", false),
            (get("/v1/nothing"), 404, "not_found", false),
            (get("/v1/chat/completions"), 405, "method_not_allowed", false),
        ];
        for (raw, status, code, closes) in cases {
            let mut s = connect(gw.addr);
            s.write_all(&raw).unwrap();
            let mut buf = Vec::new();
            let r = read_response(&mut s, &mut buf).unwrap_or_else(|| {
                panic!(
                    "{d}: no response to {:?}",
                    String::from_utf8_lossy(&raw[..40.min(raw.len())])
                )
            });
            assert_eq!(r.status, status, "{d}: {}", r.text());
            let v = r.json();
            assert_eq!(v["error"]["code"], code, "{d}");
            assert!(v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()));
            assert!(v["error"]["type"].is_string());
            if closes {
                assert!(
                    is_closed(&mut s),
                    "{d}: connection must close after {status}"
                );
            } else {
                // still usable
                s.write_all(&get("/healthz")).unwrap();
                assert_eq!(read_response(&mut s, &mut buf).unwrap().status, 200, "{d}");
            }
        }
        let r = request(
            gw.addr,
            &post("/v1/chat/completions", r#"{"model":"gpt-4o-mini"}"#),
        );
        assert_eq!(r.status, 200, "{d}: still serving");
    });
}

#[test]
fn slow_head_times_out_with_408() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        let mut s = connect(gw.addr);
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
            .unwrap();
        let mut buf = Vec::new();
        let r = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(r.status, 408, "{d}");
        assert!(is_closed(&mut s));
    });
}

#[test]
fn upstream_down_is_a_502_and_a_stale_pooled_connection_is_retried() {
    each_driver(|d| {
        let mock = start_mock(Profile::Instant, d);
        let port = mock.addr;
        let gw = start_gateway(mock.addr, d, "");
        let body = r#"{"model":"gpt-4o-mini","max_tokens":3}"#;
        assert_eq!(
            request(gw.addr, &post("/v1/chat/completions", body)).status,
            200
        );
        wait_metric(gw.addr, "ringgate_upstream_idle_connections", 1, "pooled");
        mock.stop();
        std::thread::sleep(Duration::from_millis(100));
        let r = request(gw.addr, &post("/v1/chat/completions", body));
        assert_eq!(r.status, 502, "{d}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "upstream_connect_error");
        // bring the upstream back on the same port: a pooled connection from before is dead
        let mock =
            ringgate::mock::server::start(port, Profile::Instant, 1, driver_choice(d)).unwrap();
        assert_eq!(
            request(gw.addr, &post("/v1/chat/completions", body)).status,
            200
        );
        mock.stop();
        std::thread::sleep(Duration::from_millis(100));
        let mock =
            ringgate::mock::server::start(port, Profile::Instant, 1, driver_choice(d)).unwrap();
        let r = request(gw.addr, &post("/v1/chat/completions", body));
        assert_eq!(
            r.status,
            200,
            "{d}: a pooled connection the upstream closed is never used: {}",
            r.text()
        );
        // (The before-reuse peek now discards it; the retry-once rule for a connection that
        // dies after the peek is tested in upstream_faults.rs.)
        gw.stop();
        mock.stop();
    });
}

#[test]
fn client_disconnect_mid_stream_releases_the_upstream_connection() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Seed, d, "");
        let mut s = connect(gw.addr);
        s.write_all(&post(
            "/v1/chat/completions",
            r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":200}"#,
        ))
        .unwrap();
        let mut first = [0u8; 256];
        let n = std::io::Read::read(&mut s, &mut first).unwrap();
        assert!(std::str::from_utf8(&first[..n])
            .unwrap()
            .starts_with("HTTP/1.1 200"));
        drop(s);
        std::thread::sleep(Duration::from_millis(800));
        wait_metric(
            gw.addr,
            "ringgate_client_disconnects_total",
            1,
            &format!("{d}"),
        );
        wait_metric(
            gw.addr,
            "ringgate_upstream_idle_connections",
            0,
            &format!("{d}: the cut stream's connection is closed, not pooled"),
        );
        wait_metric(
            gw.addr,
            "ringgate_requests_in_flight",
            1,
            "only the scrape itself is in flight",
        );
    });
}

#[test]
fn local_endpoints() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        assert_eq!(request(gw.addr, &get("/healthz")).json()["status"], "ok");
        assert_eq!(request(gw.addr, &get("/readyz")).status, 200);
        let models = request(gw.addr, &get("/v1/models")).json();
        let ids: Vec<&str> = models["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["gpt-4o-mini", "alias"]);
        let m = request(gw.addr, &get("/metrics"));
        assert!(m.header("content-type").unwrap().starts_with("text/plain"));
        assert!(m.text().contains("ringgate_connections_open"));
    });
}

#[test]
fn embedded_default_serves_model_mock() {
    common::shard_counts().for_each(embedded_default_serves_model_mock_at);
}

fn embedded_default_serves_model_mock_at(shards: usize) {
    let mut cfg = ringgate::config::Config::embedded();
    cfg.server.listen = toml::Spanned::new(0..0, "127.0.0.1:0".to_string());
    cfg.server.shards = Some(shards);
    let gw = ringgate::server::start(cfg).unwrap();
    let r = request(
        gw.addr,
        &post(
            "/v1/chat/completions",
            r#"{"model":"mock","messages":[{"role":"user","content":"hi"}]}"#,
        ),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        text::tokens(0, ringgate::mock::DEFAULT_OUTPUT_TOKENS)
    );
    let r = request(
        gw.addr,
        &post("/v1/chat/completions", r#"{"model":"mock","stream":true}"#),
    );
    assert!(sse_content(&r.body).2);
    gw.stop();
}

#[test]
fn stop_drains_in_flight_streams_and_refuses_new_connections() {
    one_driver("io_uring").for_each(stop_drains_in_flight_streams_and_refuses_new_connections_at);
}

fn stop_drains_in_flight_streams_and_refuses_new_connections_at(v: Variant) {
    let mock = start_mock(Profile::Seed, v);
    let gw = start_gateway(mock.addr, v, "");
    let addr = gw.addr;
    let idle = connect(addr); // an idle keep-alive connection: closed at once on stop
    let inflight = std::thread::spawn(move || {
        request(
            addr,
            &post(
                "/v1/chat/completions",
                r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":50}"#,
            ),
        )
    });
    std::thread::sleep(Duration::from_millis(150));
    let t0 = std::time::Instant::now();
    gw.stop();
    let r = inflight.join().unwrap();
    let (content, _, done) = sse_content(&r.body);
    assert!(done, "the in-flight stream finished during the drain");
    assert_eq!(content, text::tokens(0, 50));
    assert!(t0.elapsed() < Duration::from_secs(5));
    let mut idle = idle;
    assert!(
        is_closed(&mut idle),
        "idle connections are closed by the drain"
    );
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "listener closed"
    );
    mock.stop();
}

#[test]
fn translated_stream_keeps_both_connections_alive() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        for _ in 0..3 {
            s.write_all(&post(
                "/v1/messages",
                r#"{"model":"gpt-4o-mini","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            ))
            .unwrap();
            let r = read_response(&mut s, &mut buf).unwrap();
            assert_eq!(r.status, 200);
            assert!(
                r.text().contains("event: message_stop"),
                "{d}: {}",
                r.text()
            );
        }
        wait_metric(
            gw.addr,
            "ringgate_connections_total",
            2,
            &format!("{d}: one client connection for the three streams (+ the scrape)"),
        );
        wait_metric(
            gw.addr,
            "ringgate_upstream_idle_connections",
            1,
            &format!("{d}: the upstream connection of a translated stream is pooled, not dropped"),
        );
    });
}

#[test]
fn multi_megabyte_stream_arrives_intact_through_one_chunk_buffer() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        // ~20,000 events (~4 MB of SSE) relayed through a 16 KiB pool chunk, and the same
        // through translation to the Anthropic dialect.
        let r = request(
            gw.addr,
            &post(
                "/v1/chat/completions",
                r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":20000}"#,
            ),
        );
        let (content, events, done) = sse_content(&r.body);
        assert!(done, "{d}");
        assert_eq!(events, 20_003, "{d}");
        assert_eq!(content, text::tokens(0, 20_000), "{d}");
        let r = request(
            gw.addr,
            &post(
                "/v1/messages",
                r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":20000,"messages":[{"role":"user","content":"hi"}]}"#,
            ),
        );
        let text: String = String::from_utf8_lossy(&r.body)
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .filter(|v| v["type"] == "content_block_delta")
            .filter_map(|v| v["delta"]["text"].as_str().map(str::to_string))
            .collect();
        assert_eq!(text, text::tokens(0, 20_000), "{d}: translated");
        assert!(
            r.text()
                .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
            "{d}"
        );
    });
}
