//! Virtual keys and per-key limits end to end: real sockets on 127.0.0.1 port 0, the project's
//! mock (or a raw fake upstream that records what reaches it), every test under both drivers;
//! plus the binary's secure-by-default start rule.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ringgate::mock::Profile;

fn each_driver(f: impl Fn(Variant)) {
    for v in variants() {
        f(v);
    }
}

const SECRET: &str = "rg-test-4f1c2a9e8b7d6c5f4e3d2c1b0a998877";
const OTHER: &str = "rg-test-0000000000000000000000000000000b";

/// A `[[key]]` entry named `name` for `secret`, with more lines.
fn key(name: &str, secret: &str, extra: &str) -> String {
    format!(
        "\n[[key]]\nname = \"{name}\"\nkey_sha256 = \"{}\"\n{extra}\n",
        key_digest_hex(secret)
    )
}

/// A request with a body and extra header lines.
fn post_with(path: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn bearer(secret: &str) -> String {
    format!("Authorization: Bearer {secret}\r\n")
}

const CHAT: &str =
    r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;
const MESSAGES: &str =
    r#"{"model":"gpt-4o-mini","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn no_key_or_a_wrong_key_is_401_in_the_clients_dialect() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, &key("team-a", SECRET, ""));
        for headers in [String::new(), bearer(OTHER), "x-api-key: \r\n".into()] {
            let r = request(gw.addr, &post_with("/v1/chat/completions", &headers, CHAT));
            assert_eq!(r.status, 401, "{d} {headers:?}: {}", r.text());
            let v = r.json();
            assert_eq!(v["error"]["type"], "invalid_request_error");
            assert_eq!(v["error"]["code"], "invalid_api_key");
            assert!(!r.text().contains(OTHER), "the key is never echoed");
            let r = request(gw.addr, &post_with("/v1/messages", &headers, MESSAGES));
            assert_eq!(r.status, 401, "{d}: {}", r.text());
            assert_eq!(r.json()["error"]["type"], "authentication_error");
        }
        // two keys in one request
        let two = format!("x-api-key: {SECRET}\r\nx-api-key: {OTHER}\r\n");
        let r = request(gw.addr, &post_with("/v1/chat/completions", &two, CHAT));
        assert_eq!(r.status, 401, "{d}");
        // the model list needs a key; health, readiness and metrics do not
        assert_eq!(request(gw.addr, &get("/v1/models")).status, 401);
        let models = format!(
            "GET /v1/models HTTP/1.1\r\nHost: localhost\r\n{}\r\n",
            bearer(SECRET)
        );
        assert_eq!(request(gw.addr, models.as_bytes()).status, 200);
        assert_eq!(request(gw.addr, &get("/healthz")).status, 200);
        assert_eq!(request(gw.addr, &get("/readyz")).status, 200);
        wait_metric(
            gw.addr,
            "ringgate_key_rejections_total{key=\"\",reason=\"auth\"}",
            8,
            &format!("{d}"),
        );
        let m = request(gw.addr, &get("/metrics")).text();
        assert!(!m.contains(SECRET) && !m.contains(OTHER) && !m.contains(&key_digest_hex(SECRET)));
    });
}

#[test]
fn a_valid_key_works_the_way_each_sdk_sends_it() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, &key("team-a", SECRET, ""));
        for h in [
            bearer(SECRET),
            format!("authorization: bearer {SECRET}\r\n"),
            format!("x-api-key: {SECRET}\r\n"),
            format!("api-key: {SECRET}\r\n"),
            format!("x-goog-api-key: {SECRET}\r\n"),
        ] {
            let r = request(gw.addr, &post_with("/v1/chat/completions", &h, CHAT));
            assert_eq!(r.status, 200, "{d} {h:?}: {}", r.text());
            assert!(
                r.header("x-ratelimit-limit-requests").is_none(),
                "no limits, no headers"
            );
        }
        let r = request(
            gw.addr,
            &post_with(
                "/v1/messages",
                &format!("x-api-key: {SECRET}\r\n"),
                MESSAGES,
            ),
        );
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        wait_metric(
            gw.addr,
            "ringgate_key_requests_total{key=\"team-a\",model=\"gpt-4o-mini\"}",
            6,
            &format!("{d}"),
        );
    });
}

#[test]
fn disabled_and_expired_keys_are_401() {
    each_driver(|d| {
        let keys = key("off", SECRET, "enabled = false")
            + &key("old", OTHER, "expires = \"2001-01-01T00:00:00+00:00\"");
        let gw = Stack::new(Profile::Instant, d, &keys);
        for (secret, word) in [(SECRET, "disabled"), (OTHER, "expired")] {
            let r = request(
                gw.addr,
                &post_with("/v1/chat/completions", &bearer(secret), CHAT),
            );
            assert_eq!(r.status, 401, "{d}");
            assert!(r.text().contains(word), "{d}: {}", r.text());
        }
    });
}

#[test]
fn a_model_outside_the_allow_list_is_403() {
    each_driver(|d| {
        let gw = Stack::new(
            Profile::Instant,
            d,
            &key("team-a", SECRET, "models = [\"alias\"]"),
        );
        let r = request(
            gw.addr,
            &post_with("/v1/chat/completions", &bearer(SECRET), CHAT),
        );
        assert_eq!(r.status, 403, "{d}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "model_not_allowed");
        let r = request(
            gw.addr,
            &post_with("/v1/messages", &bearer(SECRET), MESSAGES),
        );
        assert_eq!(r.status, 403, "{d}");
        assert_eq!(r.json()["error"]["type"], "permission_error");
        let alias = CHAT.replace("gpt-4o-mini", "alias");
        let r = request(
            gw.addr,
            &post_with("/v1/chat/completions", &bearer(SECRET), &alias),
        );
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        wait_metric(
            gw.addr,
            "ringgate_key_rejections_total{key=\"team-a\",reason=\"forbidden_model\"}",
            2,
            &format!("{d}"),
        );
    });
}

#[test]
fn rpm_over_the_limit_is_429_with_retry_after_and_rate_headers() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, &key("team-a", SECRET, "rpm = 2"));
        // one keep-alive connection, like an SDK
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        let mut send = |path: &str, body: &str| {
            s.write_all(&post_with(path, &bearer(SECRET), body))
                .unwrap();
            read_response(&mut s, &mut buf).unwrap()
        };
        for left in ["1", "0"] {
            let r = send("/v1/chat/completions", CHAT);
            assert_eq!(r.status, 200, "{d}: {}", r.text());
            assert_eq!(r.header("x-ratelimit-limit-requests"), Some("2"));
            assert_eq!(r.header("x-ratelimit-remaining-requests"), Some(left));
            assert!(r
                .header("x-ratelimit-reset-requests")
                .unwrap()
                .ends_with('s'));
        }
        let r = send("/v1/chat/completions", CHAT);
        assert_eq!(r.status, 429, "{d}: {}", r.text());
        assert_eq!(r.json()["error"]["type"], "rate_limit_error");
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((58..=60).contains(&retry), "{d}: retry-after {retry}");
        assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
        // the connection survives a 429 refused on the head (its body was never read: closed)
        let r = request(
            gw.addr,
            &post_with("/v1/messages", &bearer(SECRET), MESSAGES),
        );
        assert_eq!(r.status, 429, "{d}");
        assert_eq!(r.json()["error"]["type"], "rate_limit_error");
        assert!(r.header("retry-after").is_some());
        wait_metric(
            gw.addr,
            "ringgate_key_rejections_total{key=\"team-a\",reason=\"rpm\"}",
            2,
            &format!("{d}"),
        );
    });
}

#[test]
fn max_in_flight_refuses_the_request_over_it() {
    each_driver(|d| {
        // seed profile: a stream takes ~550 ms
        let gw = Stack::new(
            Profile::Seed,
            d,
            &key("team-a", SECRET, "max_in_flight = 1"),
        );
        let addr = gw.addr;
        let slow = r#"{"model":"gpt-4o-mini","stream":true,"messages":[],"max_tokens":20}"#;
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let mut s = connect(addr);
            s.write_all(&post_with("/v1/chat/completions", &bearer(SECRET), slow))
                .unwrap();
            let mut buf = Vec::new();
            // the head arrives at once (SSE): the stream holds the key's slot from then on
            let mut tmp = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut tmp).unwrap();
                assert!(n > 0, "EOF before the stream's head");
                buf.extend_from_slice(&tmp[..n]);
            }
            tx.send(()).unwrap();
            // the body over ~0.5 s
            read_response(&mut s, &mut buf).unwrap().status
        });
        rx.recv().unwrap();
        let r = request(
            addr,
            &post_with("/v1/chat/completions", &bearer(SECRET), CHAT),
        );
        assert_eq!(r.status, 429, "{d}: {}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"));
        assert!(r.text().contains("in flight"));
        assert_eq!(t.join().unwrap(), 200);
        // the slot comes back when the stream has ended: the gateway gives it back after the
        // last byte is written, so a request sent the moment the client read that byte may
        // still find it taken (429 "in flight"); within 10 s it is served
        let t0 = Instant::now();
        loop {
            let r = request(
                addr,
                &post_with("/v1/chat/completions", &bearer(SECRET), CHAT),
            );
            if r.status == 200 {
                break;
            }
            assert_eq!(r.status, 429, "{d}: {}", r.text());
            assert!(r.text().contains("in flight"), "{d}: {}", r.text());
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{d}: the slot never came back: {}",
                r.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

#[test]
fn tpm_reserves_an_estimate_and_reconciles_with_the_reported_usage() {
    each_driver(|d| {
        let gw = Stack::new(Profile::Instant, d, &key("team-a", SECRET, "tpm = 1000"));
        let mut s = connect(gw.addr);
        let mut buf = Vec::new();
        let mut send = |body: &str| {
            s.write_all(&post_with("/v1/chat/completions", &bearer(SECRET), body))
                .unwrap();
            read_response(&mut s, &mut buf).unwrap()
        };
        // no max_tokens: the estimate is bytes / 4; the mock answers 16 tokens on top
        let b1 = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello there"}]}"#;
        let est1 = b1.len() as u64 / 4;
        let r = send(b1);
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        assert_eq!(r.header("x-ratelimit-limit-tokens"), Some("1000"));
        let left = |r: &Response| -> u64 {
            r.header("x-ratelimit-remaining-tokens")
                .unwrap()
                .parse()
                .unwrap()
        };
        assert_eq!(left(&r), 1000 - est1, "{d}");
        let used1 = r.json()["usage"]["total_tokens"].as_u64().unwrap();
        // the mock's usage: the prompt text's bytes / 4 ("hello there": 3) + 16
        assert_eq!(used1, 3 + 16, "the mock's usage");
        // the next request sees the real usage of the first, plus its own estimate
        let b2 = r#"{"model":"gpt-4o-mini","messages":[],"max_tokens":10}"#;
        let r = send(b2);
        assert_eq!(r.status, 200, "{d}");
        assert_eq!(left(&r), 1000 - used1 - (b2.len() as u64 / 4 + 10), "{d}");
        // streamed with usage: counted too
        let b3 = r#"{"model":"gpt-4o-mini","stream":true,"messages":[],"max_tokens":5,"stream_options":{"include_usage":true}}"#;
        let r = send(b3);
        assert_eq!(r.status, 200, "{d}");
        // a request whose estimate does not fit: 429 with the window's reset
        let big = r#"{"model":"gpt-4o-mini","messages":[],"max_tokens":990}"#;
        let r = send(big);
        assert_eq!(r.status, 429, "{d}: {}", r.text());
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((58..=60).contains(&retry), "{d}: {retry}");
        assert!(r.text().contains("tokens per minute"), "{}", r.text());
        let before = left(&r);
        // count_tokens generates nothing: no reservation, nothing charged (it is a request)
        let ct = r#"{"model":"gpt-4o-mini","max_tokens":990,"messages":[{"role":"user","content":"hi"}]}"#;
        let r = request(
            gw.addr,
            &post_with("/v1/messages/count_tokens", &bearer(SECRET), ct),
        );
        assert_eq!(r.status, 200, "{d}: {}", r.text());
        assert_eq!(left(&r), before, "{d}");
        // the refused request reserved nothing
        let r = send(b2);
        assert_eq!(r.status, 200, "{d}");
        assert_eq!(left(&r), before - (b2.len() as u64 / 4 + 10), "{d}");
        wait_metric(
            gw.addr,
            "ringgate_key_rejections_total{key=\"team-a\",reason=\"tpm\"}",
            1,
            &format!("{d}"),
        );
    });
}

/// A raw upstream that records every request head it gets and answers a small chat body.
fn recording_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let seen = seen.clone();
            std::thread::spawn(move || loop {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 8192];
                let end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    match s.read(&mut tmp) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                let cl: usize = head
                    .to_ascii_lowercase()
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                while buf.len() < end + cl {
                    match s.read(&mut tmp) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
                seen.lock().unwrap().push(head);
                let body = r#"{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
                let out = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-ratelimit-remaining-requests: 4999\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if s.write_all(out.as_bytes()).is_err() {
                    return;
                }
            });
        }
    });
    (addr, heads)
}

#[test]
fn the_clients_key_never_reaches_the_upstream() {
    each_driver(|d| {
        std::env::set_var("RG_KEYS_TEST_PROVIDER_KEY", "sk-provider-secret");
        for keys_on in [true, false] {
            let (up, heads) = recording_upstream();
            let text = format!(
                r#"
[server]
listen = "127.0.0.1:0"
shards = {}
pin = false
driver = "{}"

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{up}/v1"
api_key_env = "RG_KEYS_TEST_PROVIDER_KEY"

[[model]]
name = "gpt-4o-mini"
provider = "local"
{}"#,
                d.shards,
                d.driver,
                if keys_on {
                    key("team-a", SECRET, "rpm = 100")
                } else {
                    String::new()
                }
            );
            let gw =
                ringgate::server::start(ringgate::config::Config::parse(&text).unwrap()).unwrap();
            let all = format!("{}x-goog-api-key: {SECRET}\r\n", bearer(SECRET));
            for h in [
                bearer(SECRET),
                format!("x-api-key: {SECRET}\r\n"),
                format!("api-key: {SECRET}\r\n"),
                all,
            ] {
                let r = request(gw.addr, &post_with("/v1/chat/completions", &h, CHAT));
                assert_eq!(r.status, 200, "{d} keys={keys_on} {h:?}: {}", r.text());
                if keys_on {
                    // ours, not the provider's
                    assert_eq!(r.header("x-ratelimit-limit-requests"), Some("100"), "{d}");
                    let n = r
                        .headers
                        .iter()
                        .filter(|(k, _)| k == "x-ratelimit-remaining-requests")
                        .count();
                    assert_eq!(n, 1, "{d}: {:?}", r.headers);
                }
            }
            gw.stop();
            let heads = heads.lock().unwrap();
            assert_eq!(heads.len(), 4, "{d}");
            for head in heads.iter() {
                assert!(
                    !head.contains(SECRET),
                    "{d} keys={keys_on}: client key forwarded:\n{head}"
                );
                assert!(
                    head.contains("authorization: Bearer sk-provider-secret\r\n"),
                    "{d}: the provider key goes up:\n{head}"
                );
                let lower = head.to_ascii_lowercase();
                for name in ["x-api-key:", "\r\napi-key:", "x-goog-api-key:"] {
                    assert!(!lower.contains(name), "{d}: {name} forwarded:\n{head}");
                }
                assert_eq!(lower.matches("authorization:").count(), 1, "{head}");
            }
        }
    });
}

#[test]
fn limits_across_shards_admit_exactly_the_limit() {
    let mock = start_mock(Profile::Instant, "epoll");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = 2\npin = false\ndriver = \"epoll\"\n\n[[provider]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"http://{{mock}}/v1\"\n\n[[model]]\nname = \"gpt-4o-mini\"\nprovider = \"local\"\n{}",
        key("team-a", SECRET, "rpm = 4")
    );
    let gw = Stack::with_config(mock, &text);
    let ok = (0..24)
        .filter(|_| {
            request(
                gw.addr,
                &post_with("/v1/chat/completions", &bearer(SECRET), CHAT),
            )
            .status
                == 200
        })
        .count();
    assert_eq!(ok, 4, "the key's limit, not a shard's");
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringgate"))
}

#[test]
fn a_non_loopback_listener_without_keys_refuses_to_start() {
    let out = bin()
        .args(["--listen", "0.0.0.0:0"])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without keys")
            && err.contains("auth = \"none\""),
        "{err}"
    );
    // `check` says the same about such a file
    let dir = std::env::temp_dir().join(format!("rg-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("open.toml");
    std::fs::write(&path, "[server]\nlisten = \"0.0.0.0:8080\"\n").unwrap();
    let out = bin()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("without keys"));
    // saying auth = "none" on purpose starts it
    std::fs::write(&path, "[server]\nlisten = \"0.0.0.0:0\"\nauth = \"none\"\n").unwrap();
    let (mut child, line) = spawn_serving(bin().args(["--config"]).arg(&path));
    assert!(line.contains("auth none"), "{line}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bare_ringgate_on_loopback_serves_without_a_key() {
    let (mut child, line) = spawn_serving(bin().args(["--listen", "127.0.0.1:0"]));
    let addr: SocketAddr = line
        .split("listening on http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let r = request(
        addr,
        &post("/v1/chat/completions", r#"{"model":"mock","messages":[]}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let _ = child.kill();
    let _ = child.wait();
}

/// Start a command and wait for its "listening on" log line.
fn spawn_serving(cmd: &mut Command) -> (std::process::Child, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let mut b = [0u8; 1];
    while Instant::now() < deadline {
        match err.read(&mut b) {
            Ok(1) => {
                seen.push(b[0]);
                if b[0] == b'\n' {
                    let text = String::from_utf8_lossy(&seen).into_owned();
                    if let Some(line) = text.lines().find(|l| l.contains("listening on")) {
                        return (child, line.to_string());
                    }
                }
            }
            _ => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("did not start: {}", String::from_utf8_lossy(&seen));
}
