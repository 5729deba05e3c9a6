//! Shared keys (issue 24, `[fleet] share = ["keys"]`) between three real gateway processes and
//! a real `redis-server`: a key made through one node's admin API works on the others, a patch
//! and a revocation made on any node apply on every node, `GET /admin/keys` on any node lists
//! the fleet's keys (config keys stay per node), the store never holds a secret, a node
//! restarted with the store down serves from its SQLite copy (refusing the revoked key), and
//! changes made while the store was away (on a fresh, empty server) are reconciled when it is
//! back. `on_store_error = "closed"` refuses key changes while the store is down.
//!
//! Every wait is a poll with a generous deadline (the box is loaded); how long a change took
//! to reach another node is printed, not asserted (the feed polls every 250 ms).

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/redis.rs"]
mod redis;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{request, Response};
use redis::{temp_dir, Gateway, Redis, RedisOpts};

const TOKEN: &str = "fleet-admin-token-0123456789abcdef";
const CONFIG_SECRET: &str = "rg-fleet-config-key-a-1f2e3d4c5b6a7988";
const DEADLINE: Duration = Duration::from_secs(20);

/// One node: `shards`, `driver`, its state dir, the `[limits]` lines, more config.
fn config(shards: usize, driver: &str, state: &Path, limits: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"
state_dir = "{}"

[admin]
listen = "127.0.0.1:0"

[limits]
{limits}

[fleet]
share = ["keys"]

[[provider]]
name = "mock"
kind = "mock"
profile = "instant"

[[model]]
name = "gpt-4o-mini"
provider = "mock"
{extra}
"#,
        state.display()
    )
}

fn start(cfg: &str) -> Gateway {
    Gateway::start_env(cfg, &[("RINGGATE_ADMIN_TOKEN", TOKEN)])
}

fn admin(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Response {
    let raw = match body {
        Some(b) => format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        ),
        None => format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        ),
    };
    request(addr, raw.as_bytes())
}

fn chat(addr: SocketAddr, secret: &str) -> Response {
    let body =
        r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {secret}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    request(addr, raw.as_bytes())
}

/// Make key `name` through `gw`'s admin API: its secret.
fn create(gw: &Gateway, body: &str) -> String {
    let r = admin(gw.admin(), "POST", "/admin/keys", Some(body));
    assert_eq!(r.status, 201, "{}\n{}", r.text(), gw.log());
    r.json()["key"].as_str().unwrap().to_string()
}

/// Poll `secret`'s chat status on `gw` until it is `status`; how long it took.
fn until_status(gw: &Gateway, secret: &str, status: u16, what: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        let r = chat(gw.addr, secret);
        if r.status == status {
            let took = t0.elapsed();
            eprintln!("{what}: {status} after {took:?}");
            return took;
        }
        assert!(
            t0.elapsed() < DEADLINE,
            "{what}: still {} ({})\n{}",
            r.status,
            r.text(),
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Poll `GET /admin/keys` on `gw` until it lists `name`; how long it took.
fn until_listed(gw: &Gateway, name: &str, what: &str) -> Duration {
    let t0 = Instant::now();
    while !listed(gw).iter().any(|n| n == name) {
        assert!(t0.elapsed() < DEADLINE, "{what}: not listed\n{}", gw.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t0.elapsed();
    eprintln!("{what}: listed after {took:?}");
    took
}

/// The names `GET /admin/keys` lists on `gw`.
fn listed(gw: &Gateway) -> Vec<String> {
    let r = admin(gw.admin(), "GET", "/admin/keys", None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn keys_made_patched_and_revoked_on_any_node_reach_every_node_and_survive_the_store() {
    let mut redis = Redis::start(RedisOpts::default());
    let limits = format!("store = \"redis\"\nredis_url = \"{}\"", redis.url(0));
    let states: Vec<_> = (0..3).map(|i| temp_dir(&format!("state{i}"))).collect();
    // node A has a config key of its own: it stays A's
    let a_extra = format!(
        "[[key]]\nname = \"local-a\"\nkey_sha256 = \"{}\"\n",
        common::key_digest_hex(CONFIG_SECRET)
    );
    let cfgs = [
        config(1, "epoll", &states[0], &limits, &a_extra),
        config(2, "io_uring", &states[1], &limits, ""),
        config(1, "epoll", &states[2], &limits, ""),
    ];
    let a = start(&cfgs[0]);
    let b = start(&cfgs[1]);
    let mut c = start(&cfgs[2]);
    for gw in [&a, &b, &c] {
        gw.wait_metric("ringgate_fleet_store_up", 1);
    }

    // made on A: works on B and C
    let x = create(&a, r#"{"name":"team-x"}"#);
    assert_eq!(chat(a.addr, &x).status, 200);
    // B and C have no key of their own (auth off until one exists): the fleet's key turns
    // their keys on, so a wrong secret is refused there from then on
    for (gw, n) in [(&b, "B"), (&c, "C")] {
        until_listed(gw, "team-x", &format!("team-x made on A, on {n}"));
        assert_eq!(chat(gw.addr, &x).status, 200);
        assert_eq!(chat(gw.addr, "rg-not-a-key").status, 401);
    }
    // every node lists the fleet's keys; the config key stays A's
    assert!(listed(&a).contains(&"local-a".to_string()));
    for gw in [&b, &c] {
        let names = listed(gw);
        assert!(
            names.contains(&"team-x".to_string()),
            "{names:?}\n{}",
            gw.log()
        );
        assert!(!names.contains(&"local-a".to_string()), "{names:?}");
    }
    assert_eq!(chat(b.addr, CONFIG_SECRET).status, 401);
    // the store holds digests, never secrets
    let stored = redis.cmd(&["HGETALL", "ringgate:{fleet}:keys"]);
    assert!(stored.contains(&common::key_digest_hex(&x)), "{stored}");
    assert!(!stored.contains(&x[3..]), "a secret in the store: {stored}");

    // patched on C: applies on A
    let r = admin(
        c.admin(),
        "PATCH",
        "/admin/keys/team-x",
        Some(r#"{"rpm":7}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let t0 = Instant::now();
    loop {
        let r = chat(a.addr, &x);
        if r.header("x-ratelimit-limit-requests") == Some("7") {
            eprintln!("rpm patched on C, on A after {:?}", t0.elapsed());
            break;
        }
        assert!(
            t0.elapsed() < DEADLINE,
            "A: {:?}\n{}",
            r.header("x-ratelimit-limit-requests"),
            a.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let got = admin(a.admin(), "GET", "/admin/keys/team-x", None).json();
    assert_eq!(got["rpm"], 7, "{got}");

    // made on B (for the restart below), revoked team-x on B: 401 on A and C
    let y = create(&b, r#"{"name":"team-y"}"#);
    until_status(&c, &y, 200, "team-y made on B, on C");
    let r = admin(b.admin(), "DELETE", "/admin/keys/team-x", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(chat(b.addr, &x).status, 401);
    for (gw, n) in [(&a, "A"), (&c, "C")] {
        until_status(gw, &x, 401, &format!("team-x revoked on B, on {n}"));
    }

    // C restarted with the store down: it knows every key from its copy, refuses the revoked
    c.kill();
    redis.stop();
    let mut c = start(&cfgs[2]);
    c.wait_log("fleet: store");
    assert_eq!(c.metric("ringgate_fleet_store_up"), 0);
    assert_eq!(chat(c.addr, &y).status, 200, "{}", c.log());
    assert_eq!(chat(c.addr, &x).status, 401, "{}", c.log());
    let names = listed(&c);
    assert!(
        names.contains(&"team-y".to_string()) && !names.contains(&"team-x".to_string()),
        "{names:?}"
    );
    for gw in [&a, &b] {
        gw.wait_metric("ringgate_fleet_store_up", 0);
        assert_eq!(chat(gw.addr, &y).status, 200, "still served: {}", gw.log());
    }

    // changes while the store is away: made on C, revoked on A (pending on each)
    let r = admin(
        c.admin(),
        "POST",
        "/admin/keys",
        Some(r#"{"name":"team-z"}"#),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["fleet_pending"], true, "{}", r.text());
    let z = r.json()["key"].as_str().unwrap().to_string();
    let r = admin(a.admin(), "DELETE", "/admin/keys/team-y", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(chat(a.addr, &y).status, 401);
    assert_eq!(chat(b.addr, &z).status, 401, "not on B yet");

    // the store back, empty (a fresh server): every node writes back what it holds, the
    // pending changes land, the revocation is not lost
    redis.restart();
    for gw in [&a, &b, &c] {
        gw.wait_metric("ringgate_fleet_store_up", 1);
    }
    for (gw, n) in [(&a, "A"), (&b, "B")] {
        until_status(gw, &z, 200, &format!("team-z made on C while away, on {n}"));
    }
    for (gw, n) in [(&b, "B"), (&c, "C")] {
        until_status(
            gw,
            &y,
            401,
            &format!("team-y revoked on A while away, on {n}"),
        );
    }
    for gw in [&a, &b, &c] {
        assert_eq!(chat(gw.addr, &x).status, 401, "team-x stays revoked");
    }
    let stored = redis.cmd(&["HGETALL", "ringgate:{fleet}:keys"]);
    assert!(
        stored.contains("team-x") && stored.contains("team-z"),
        "{stored}"
    );
    // a node started now, with an empty state dir, learns the fleet's keys from the store
    let d = start(&config(1, "epoll", &temp_dir("state3"), &limits, ""));
    until_listed(&d, "team-z", "team-z on a new node");
    assert_eq!(chat(d.addr, &z).status, 200);
    assert_eq!(chat(d.addr, &y).status, 401);
    assert_eq!(chat(d.addr, &x).status, 401);
    c.kill();
    for s in states {
        let _ = std::fs::remove_dir_all(s);
    }
}

#[test]
fn closed_mode_refuses_key_changes_while_the_store_is_down() {
    let mut redis = Redis::start(RedisOpts::default());
    redis.stop();
    let state = temp_dir("closed");
    let limits = format!(
        "store = \"redis\"\nredis_url = \"{}\"\non_store_error = \"closed\"",
        redis.url(0)
    );
    let gw = start(&config(1, "epoll", &state, &limits, ""));
    gw.wait_log("fleet: store");
    let r = admin(
        gw.admin(),
        "POST",
        "/admin/keys",
        Some(r#"{"name":"team-c"}"#),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("closed"), "{}", r.text());
    assert!(listed(&gw).is_empty());
    redis.restart();
    gw.wait_metric("ringgate_fleet_store_up", 1);
    let s = create(&gw, r#"{"name":"team-c"}"#);
    assert_eq!(chat(gw.addr, &s).status, 200);
    let _ = std::fs::remove_dir_all(state);
}
