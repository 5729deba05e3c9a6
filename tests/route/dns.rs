//! Upstream host names resolve off the shard (`upstream::resolve`): a `localhost` upstream
//! answers, a name that does not exist (`.invalid`) fails fast with a clean 502 while the shard
//! keeps serving, under both drivers.

#[path = "../common/mod.rs"]
mod common;

use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

use common::*;
use ringgate::mock::Profile;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

fn config(v: Variant, base_url: &str) -> String {
    let Variant { driver, shards } = v;
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"

[[provider]]
name = "named"
kind = "openai"
base_url = "{base_url}"

[[model]]
name = "m"
provider = "named"
max_attempts = 1
"#
    )
}

#[test]
fn localhost_upstream_is_resolved_off_the_shard() {
    // Bind the mock on whatever `localhost` resolves to first here (127.0.0.1 or ::1).
    let first = ("localhost", 0).to_socket_addrs().unwrap().next().unwrap();
    for driver in variants() {
        let mock = ringgate::mock::server::start(first, Profile::Instant, 1, driver_choice(driver))
            .unwrap();
        let port = mock.addr.port();
        let stack = Stack::with_config(
            mock,
            &config(driver, &format!("http://localhost:{port}/v1")),
        );
        for _ in 0..3 {
            let r = request(stack.addr, &post("/v1/chat/completions", CHAT));
            assert_eq!(r.status, 200, "{driver}: {}", r.text());
            assert_eq!(r.json()["object"], "chat.completion");
        }
    }
}

#[test]
fn a_name_that_does_not_resolve_is_a_clean_502_and_the_shard_keeps_serving() {
    for driver in variants() {
        let mock = start_mock(Profile::Instant, driver);
        let text = config(driver, "http://ringgate-test.invalid:9/v1")
            + "\n[[provider]]\nname = \"ok\"\nkind = \"openai\"\nbase_url = \"http://{mock}/v1\"\n\
               \n[[model]]\nname = \"good\"\nprovider = \"ok\"\n";
        let stack = Stack::with_config(mock, &text);
        for _ in 0..2 {
            let t = Instant::now();
            let r = request(stack.addr, &post("/v1/chat/completions", CHAT));
            assert_eq!(r.status, 502, "{driver}: {}", r.text());
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            let e = r.json();
            assert_eq!(e["error"]["type"], "upstream_error", "{e}");
            assert!(r.header("x-request-id").is_some());
            assert_eq!(r.header("x-ringgate-provider"), Some("named"));
        }
        let good = post(
            "/v1/chat/completions",
            &CHAT.replace("\"model\":\"m\"", "\"model\":\"good\""),
        );
        assert_eq!(request(stack.addr, &good).status, 200, "{driver}");
        wait_metric(
            stack.addr,
            "ringgate_upstream_failures_total{reason=\"connect\"}",
            2,
            &format!("{driver}: both failures counted"),
        );
    }
}
