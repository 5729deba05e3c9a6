//! The client edge: browser-borne requests (Origin allow-list, CORS preflight, loopback Host),
//! bare-LF heads, and the health endpoints at the connection cap. Real sockets on 127.0.0.1,
//! both I/O drivers.

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::time::Duration;

use common::*;
use ringgate::mock::Profile;

fn each_driver(f: impl Fn(Variant)) {
    for v in variants() {
        f(v);
    }
}

const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
const MESSAGES: &str =
    r#"{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;

/// A POST as a browser form/fetch would send it cross-site: `text/plain` needs no preflight.
fn browser_post(path: &str, body: &str, origin: &str, host: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn foreign_origin_is_refused_in_the_clients_dialect() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        let r = request(
            gw.addr,
            &browser_post(
                "/v1/chat/completions",
                CHAT,
                "https://evil.example",
                "localhost",
            ),
        );
        assert_eq!(r.status, 403, "{d}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "forbidden", "{d}");
        assert!(r.header("access-control-allow-origin").is_none());
        let r = request(
            gw.addr,
            &browser_post("/v1/messages", MESSAGES, "null", "localhost"),
        );
        assert_eq!(r.status, 403, "{d}: {}", r.text());
        assert_eq!(r.json()["type"], "error", "{d}: Anthropic shape");
        assert_eq!(r.json()["error"]["type"], "permission_error", "{d}");
        // Nothing reached the upstream; the gateway still serves SDK traffic (no Origin).
        wait_metric(
            gw.addr,
            "ringgate_upstream_idle_connections",
            0,
            "nothing reached the upstream",
        );
        let r = request(gw.addr, &post("/v1/chat/completions", CHAT));
        assert_eq!(r.status, 200, "{d}: {}", r.text());
    });
}

#[test]
fn allowed_origin_gets_preflight_and_cors_headers() {
    each_driver(|d| {
        let gw = Stack::with_server(
            Profile::Instant,
            d,
            r#"cors_allow_origins = ["https://app.example"]"#,
            "",
        );
        // preflight, then the request, on one keep-alive connection
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        s.write_all(b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: https://app.example\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n\r\n").unwrap();
        let r = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(r.status, 204, "{d}: {}", r.text());
        assert_eq!(
            r.header("access-control-allow-origin"),
            Some("https://app.example")
        );
        assert_eq!(
            r.header("access-control-allow-headers"),
            Some("authorization, content-type")
        );
        assert!(r
            .header("access-control-allow-methods")
            .unwrap()
            .contains("POST"));
        assert_eq!(r.header("access-control-max-age"), Some("600"));
        assert!(
            r.header("content-length").is_none(),
            "no Content-Length on 204"
        );
        assert!(r.body.is_empty());
        for stream in [false, true] {
            let body = format!(
                r#"{{"model":"gpt-4o-mini","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
            );
            s.write_all(&browser_post(
                "/v1/chat/completions",
                &body,
                "https://app.example",
                "localhost",
            ))
            .unwrap();
            let r = read_response(&mut s, &mut buf).unwrap();
            assert_eq!(r.status, 200, "{d} stream={stream}: {}", r.text());
            assert_eq!(
                r.header("access-control-allow-origin"),
                Some("https://app.example"),
                "{d} stream={stream}"
            );
            assert_eq!(r.header("vary"), Some("Origin"));
        }
        // translated path (Messages in, OpenAI upstream) and an error answer carry them too
        s.write_all(&browser_post(
            "/v1/messages",
            MESSAGES,
            "https://app.example",
            "localhost",
        ))
        .unwrap();
        let r = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        assert_eq!(
            r.header("access-control-allow-origin"),
            Some("https://app.example")
        );
        s.write_all(&browser_post(
            "/v1/chat/completions",
            r#"{"model":"nope","messages":[]}"#,
            "https://app.example",
            "localhost",
        ))
        .unwrap();
        let r = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(r.status, 404, "{d}: {}", r.text());
        assert_eq!(
            r.header("access-control-allow-origin"),
            Some("https://app.example")
        );
        // a request without Origin on the same connection gets no CORS headers
        s.write_all(&get("/healthz")).unwrap();
        let r = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(r.status, 200);
        assert!(r.header("access-control-allow-origin").is_none(), "{d}");
        // other origins: preflight and request refused
        let r = request(gw.addr, b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n\r\n");
        assert_eq!(r.status, 403, "{d}");
        let r = request(
            gw.addr,
            &browser_post(
                "/v1/chat/completions",
                CHAT,
                "https://evil.example",
                "localhost",
            ),
        );
        assert_eq!(r.status, 403, "{d}");
    });
}

#[test]
fn non_loopback_host_is_refused_on_a_loopback_listener() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        let port = gw.addr.port();
        for host in [
            "evil.example",
            "attacker.example:8080",
            "localhost.evil.example",
        ] {
            let raw = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{CHAT}",
                CHAT.len()
            );
            let r = request(gw.addr, raw.as_bytes());
            assert_eq!(r.status, 403, "{d} {host}: {}", r.text());
            assert_eq!(r.json()["error"]["code"], "forbidden");
        }
        for host in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            "app.localhost".to_string(),
            "127.0.0.2".to_string(),
            "[::1]:1".to_string(),
        ] {
            let raw = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n");
            assert_eq!(request(gw.addr, raw.as_bytes()).status, 200, "{d} {host}");
        }
    });
}

#[test]
fn bare_lf_head_is_a_400_and_the_connection_closes() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "");
        // The smuggling shape: a bare-LF head, with a CRLF request hidden after it.
        let mut s = connect(gw.addr);
        s.write_all(b"GET /healthz HTTP/1.1\nHost: localhost\n\nGET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut buf = Vec::new();
        let r = read_response(&mut s, &mut buf).unwrap();
        assert_eq!(r.status, 400, "{d}: {}", r.text());
        assert_eq!(r.header("connection"), Some("close"));
        assert!(buf.is_empty(), "{d}: only one answer");
        assert!(is_closed(&mut s), "{d}");
        // a bare LF in a chunked request body's framing, too
        let r = request(gw.addr, b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n2\n{}\r\n0\r\n\r\n");
        assert_eq!(r.status, 400, "{d}: {}", r.text());
        assert_eq!(request(gw.addr, &get("/healthz")).status, 200, "{d}");
    });
}
#[test]
fn health_endpoints_answer_at_the_connection_cap() {
    variants().for_each(|d| {
        let gw = Stack::with_server(Profile::Instant, d, "max_connections = 4", "");
        // fill the cap with idle keep-alive connections (each served one request)
        let mut idle = Vec::new();
        for _ in 0..4 {
            let mut s = connect(gw.addr);
            s.write_all(&get("/healthz")).unwrap();
            let mut buf = Vec::new();
            assert_eq!(read_response(&mut s, &mut buf).unwrap().status, 200);
            idle.push(s);
        }
        std::thread::sleep(Duration::from_millis(50));
        for path in ["/healthz", "/readyz"] {
            let r = request(gw.addr, &get(path));
            assert_eq!(r.status, 200, "{d} {path} at the cap: {}", r.text());
        }
        let r = request(gw.addr, &post("/v1/chat/completions", CHAT));
        assert_eq!(r.status, 503, "{d}: {}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"));
        // the idle ones still work
        let mut buf = Vec::new();
        idle[0]
            .write_all(&post("/v1/chat/completions", CHAT))
            .unwrap();
        assert_eq!(read_response(&mut idle[0], &mut buf).unwrap().status, 200);
        drop(idle);
        std::thread::sleep(Duration::from_millis(100));
        let r = request(gw.addr, &post("/v1/chat/completions", CHAT));
        assert_eq!(r.status, 200, "{d}: {}", r.text());
    });
}

#[test]
fn idle_connections_give_their_buffers_back_and_keep_serving() {
    each_driver(|d| {
        // Release after 5 ms: every pause below crosses (or races) the release.
        let gw = Stack::with_server(Profile::Instant, d, "idle_release_ms = 5", "");
        let mut conns: Vec<_> = (0..8).map(|_| connect(gw.addr)).collect();
        let mut bufs: Vec<Vec<u8>> = vec![Vec::new(); conns.len()];
        for round in 0..12u64 {
            for (i, s) in conns.iter_mut().enumerate() {
                let raw = post("/v1/chat/completions", CHAT);
                if (round + i as u64) % 3 == 0 {
                    // the head arrives in two pieces, after the release
                    let (a, b) = raw.split_at(20);
                    s.write_all(a).unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                    s.write_all(b).unwrap();
                } else {
                    s.write_all(&raw).unwrap();
                }
                let r = read_response(s, &mut bufs[i]).unwrap();
                assert_eq!(r.status, 200, "{d} round {round} conn {i}: {}", r.text());
            }
            std::thread::sleep(Duration::from_millis(round % 8));
        }
        // two pipelined requests after an idle pause
        std::thread::sleep(Duration::from_millis(20));
        let mut two = get("/healthz");
        two.extend_from_slice(&post("/v1/chat/completions", CHAT));
        conns[0].write_all(&two).unwrap();
        for _ in 0..2 {
            let r = read_response(&mut conns[0], &mut bufs[0]).unwrap();
            assert_eq!(r.status, 200, "{d}: {}", r.text());
        }
    });
}

/// Absolute-form request targets (RFC 9112 §3.2.2: a server MUST accept them) are routed by
/// their path and query; their authority is held to the loopback Host rule as `Host` is (and
/// `Host` still is), so neither can carry a foreign name past it. 1 and 2 shards.
#[test]
fn absolute_form_targets_are_served_and_held_to_the_host_rule() {
    each_driver(|d| {
        // (each_driver yields both shard counts)
        for shards in [d.shards] {
            let cfg = format!(
                r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{}"

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{{mock}}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"
"#,
                d.driver
            );
            let gw = Stack::with_config(start_mock(Profile::Instant, d), &cfg);
            let port = gw.addr.port();
            let chat = |target: &str, host: &str| {
                format!(
                    "POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{CHAT}",
                    CHAT.len()
                )
            };
            let models =
                |target: &str, host: &str| format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n");
            let what = format!("{d} shards={shards}");
            for (raw, want) in [
                (models("http://localhost/v1/models", "localhost"), 200),
                (
                    models(
                        &format!("HTTP://127.0.0.1:{port}/v1/models?x=1"),
                        "127.0.0.1",
                    ),
                    200,
                ),
                (
                    chat(
                        &format!("http://localhost:{port}/v1/chat/completions"),
                        "localhost",
                    ),
                    200,
                ),
                (chat("https://[::1]/v1/chat/completions", "[::1]"), 200),
                // a foreign authority, or a foreign Host beside a loopback authority
                (models("http://evil.example/v1/models", "localhost"), 403),
                (
                    chat("http://evil.example/v1/chat/completions", "localhost"),
                    403,
                ),
                (models("http://localhost/v1/models", "evil.example"), 403),
                (
                    chat(
                        "http://localhost.evil.example/v1/chat/completions",
                        "localhost",
                    ),
                    403,
                ),
                // no host, or a userinfo leading the authority
                (models("http:///v1/models", "localhost"), 400),
                (
                    models("http://evil.example@localhost/v1/models", "localhost"),
                    400,
                ),
            ] {
                let r = request(gw.addr, raw.as_bytes());
                assert_eq!(r.status, want, "{what} {raw:?}: {}", r.text());
                if want == 200 && raw.starts_with("GET") {
                    assert_eq!(r.json()["data"][0]["id"], "gpt-4o-mini", "{what}");
                }
                if want == 200 && raw.starts_with("POST") {
                    assert!(r.json()["choices"][0]["message"].is_object(), "{what}");
                }
                if want == 403 {
                    assert_eq!(r.json()["error"]["code"], "forbidden", "{what}");
                }
            }
        }
    });
}

const KEY: &str = "rg-edge-test-key-5e4d3c2b1a0f9e8d7c6b";

fn key_hex() -> String {
    ringgate::governance::keyring::Digest::of(KEY.as_bytes())
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn keyed(raw: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(raw).replacen(
        "Host: localhost\r\n",
        &format!("Host: localhost\r\nAuthorization: Bearer {KEY}\r\n"),
        1,
    );
    text.into_bytes()
}

/// Whether `s` reaches its end (after whatever the server wrote) within 10 s.
fn ends(s: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = Vec::new();
    match s.read_to_end(&mut sink) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// Item 6: connections that send nothing cannot starve keyed clients. A per-address cap (100
/// here) refuses the 101st connection of one address; 2,000 idle connections from 20
/// addresses take at most the connection share of a small budget, so a keyed request on an
/// open connection still gets 200 and a keyed client's new connection is served past the
/// share; the idle ones are closed after `first_request_timeout_ms` (2 s here), not the 60 s
/// keep-alive idle time. Before: no cap, the idle connections took the whole budget and keyed
/// requests got 503 while `/healthz` stayed 200.
#[test]
fn idle_connections_do_not_starve_keyed_clients() {
    // (each_driver yields both shard counts)
    each_driver(|d| {
        let shards = d.shards;
        let mock = start_mock(Profile::Instant, d);
        let cfg = format!(
            r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{}"
max_connections_per_address = 100
first_request_timeout_ms = 2000

[admission]
memory_budget = "4MiB"

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{{mock}}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"

[[key]]
name = "k"
key_sha256 = "{}"
"#,
            d.driver,
            key_hex()
        );
        let gw = Stack::with_config(mock, &cfg);
        let chat = keyed(&post("/v1/chat/completions", CHAT));
        // a keyed client, connected before the flood
        let mut client = connect(gw.addr);
        let mut buf = Vec::new();
        client.write_all(&chat).unwrap();
        assert_eq!(read_response(&mut client, &mut buf).unwrap().status, 200);
        // the per-address cap
        let one = [127, 0, 2, 1];
        let mut capped: Vec<_> = (0..100).map(|_| connect_from(one, gw.addr)).collect();
        std::thread::sleep(Duration::from_millis(300));
        let models = get("/v1/models");
        let r = request_from(one, gw.addr, &models).map(|r| r.status);
        assert_eq!(r, Some(503), "{d}/{shards}: the 101st of one address");
        let r = request_from([127, 0, 2, 2], gw.addr, &models).map(|r| r.status);
        assert_eq!(
            r,
            Some(401),
            "{d}/{shards}: another address reaches the key check"
        );
        // the flood: 2,000 connections that send nothing
        let mut flood: Vec<_> = (0..2000u32)
            .map(|i| connect_from([127, 0, 1, 10 + (i % 20) as u8], gw.addr))
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        for i in 0..3 {
            client.write_all(&chat).unwrap();
            let r = read_response(&mut client, &mut buf).unwrap();
            assert_eq!(
                r.status,
                200,
                "{d}/{shards}: keyed request {i}: {}",
                r.text()
            );
        }
        // a keyed client's new connection (past the connection share; the few over-cap
        // probe places may be busy with flood connections for a second: retried)
        let mut status = Vec::new();
        for _ in 0..5 {
            let s = request_from([127, 0, 0, 1], gw.addr, &chat).map_or(0, |r| r.status);
            status.push(s);
            if s == 200 {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        assert_eq!(status.last(), Some(&200), "{d}/{shards}: {status:?}");
        assert_eq!(request(gw.addr, &get("/healthz")).status, 200);
        // idle connections are closed after the short first-request timeout
        let mut open = flood.iter_mut().chain(capped.iter_mut());
        assert!(open.all(ends), "{d}/{shards}: idle connections stay");
        client.write_all(&chat).unwrap();
        assert_eq!(read_response(&mut client, &mut buf).unwrap().status, 200);
    });
}

/// `Expect: 100-continue` from the client: the interim `100 Continue` comes once the head is
/// admitted and before any body byte was sent, the final answer after the body, on a
/// connection that stays open. A head refused on its own (a declared body over `max_body`) gets
/// its final 413 and no interim answer; a request without a body gets none either.
#[test]
fn expect_continue_interim_answer_only_before_an_admitted_body() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, "\n[admission]\nmax_body = \"4KiB\"\n");
        let mut s = connect(gw.addr);
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            CHAT.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        // the body is not sent yet: what comes now is the interim answer, and only it
        let want = b"HTTP/1.1 100 Continue\r\n\r\n";
        let mut got = vec![0u8; want.len()];
        std::io::Read::read_exact(&mut s, &mut got).expect("100 Continue before the body");
        assert_eq!(
            &got[..],
            &want[..],
            "{d}: {}",
            String::from_utf8_lossy(&got)
        );
        s.write_all(CHAT.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let r = read_response(&mut s, &mut buf).expect("final answer");
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        assert!(
            r.json()["choices"][0]["message"].is_object(),
            "{d}: {}",
            r.text()
        );

        // the same connection: a declared body over max_body → 413 first, no 100
        let over = "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n";
        s.write_all(over.as_bytes()).unwrap();
        buf.clear();
        let r = read_response(&mut s, &mut buf).expect("413");
        assert_eq!(r.status, 413, "{d}: {}", r.text());
        assert!(
            r.text().contains("4096"),
            "{d}: says the limit: {}",
            r.text()
        );

        // no body declared (a GET) → no interim answer, just the answer
        let mut s = connect(gw.addr);
        s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n\r\n")
            .unwrap();
        let mut buf = Vec::new();
        let r = read_response(&mut s, &mut buf).expect("models");
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        assert!(r.json()["data"].is_array(), "{d}");
    });
}
