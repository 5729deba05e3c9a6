//! Shared keys (issue 24, `[fleet] share = ["keys"]`) between three real gateway processes and
//! a real `redis-server`: a key made through one node's admin API works on the others, a patch
//! and a revocation made on any node apply on every node, `GET /admin/keys` on any node lists
//! the fleet's keys (config keys stay per node), the store never holds a secret, a node
//! restarted with the store down serves from its SQLite copy (refusing the revoked key), and
//! changes made while the store was away (on a fresh, empty server) are reconciled when it is
//! back. `on_store_error = "closed"` refuses key changes while the store is down. Shared
//! Responses state (`share = ["responses"]`): a chain started on one node continues on the
//! others (`responses_chains_continue_on_any_node`).
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

/// One node sharing Responses state (`[fleet] share = ["responses"]`): an Anthropic upstream
/// (the capturing fake) behind a translated route, two config keys (the same on every node).
fn responses_config(v: common::Variant, node: &str, up: SocketAddr, limits: &str) -> String {
    let state = temp_dir(node);
    let mut keys = String::new();
    for (name, secret) in [("k1", RESP_K1), ("k2", RESP_K2)] {
        keys.push_str(&format!(
            "[[key]]\nname = \"{name}\"\nkey_sha256 = \"{}\"\n",
            common::key_digest_hex(secret)
        ));
    }
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {}
pin = false
driver = "{}"
state_dir = "{}"

[admin]
listen = "127.0.0.1:0"

[limits]
{limits}

[fleet]
share = ["responses"]
node = "{node}"

[[provider]]
name = "an"
kind = "anthropic"
base_url = "http://{up}"

[[model]]
name = "to-an"
provider = "an"
upstream_model = "up"
{keys}"#,
        v.shards,
        v.driver,
        state.display()
    )
}

const RESP_K1: &str = "rg-fleet-responses-k1-0123456789abcdef01";
const RESP_K2: &str = "rg-fleet-responses-k2-0123456789abcdef02";

fn responses(addr: SocketAddr, secret: &str, body: &serde_json::Value) -> Response {
    let body = body.to_string();
    let raw = format!(
        "POST /v1/responses HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {secret}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    request(addr, raw.as_bytes())
}

/// The store's Responses keys now.
fn resp_keys(redis: &Redis) -> Vec<String> {
    let mut keys: Vec<String> = redis
        .cmd(&["KEYS", "ringgate:resp:*"])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    keys.sort();
    keys
}

/// A Responses chain started on A continues on B and then C (each node at another shard count
/// and driver), by `previous_response_id` and by `item_reference`; another key's tenant sees
/// none of it; the store holds neither secrets nor key names; a record in the store that is
/// not one of ours is refused (400 on a node that does not hold it, counted); with the store
/// down a node answers from what it holds and counts the miss.
#[test]
fn responses_chains_continue_on_any_node() {
    use serde_json::json;
    let mut redis = Redis::start(RedisOpts::default());
    let cap = common::capture::Capture::start("");
    let limits = format!(
        "store = \"redis\"\nredis_url = \"{}\"\nredis_timeout_ms = 2000",
        redis.url(0)
    );
    let vs: Vec<_> = common::variants().collect();
    let nodes: Vec<Gateway> = (0..3)
        .map(|i| {
            let cfg = responses_config(vs[i % vs.len()], &format!("node-{i}"), cap.addr, &limits);
            start(&cfg)
        })
        .collect();
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    // every shard of every node connected (the first request may land on any shard)
    for (i, gw) in nodes.iter().enumerate() {
        wait_store_up(gw, vs[i % vs.len()].shards);
    }
    let seen = |n: usize| cap.nth(n).json();

    let r1 = responses(
        a.addr,
        RESP_K1,
        &json!({"model": "to-an", "input": "first question"}),
    );
    assert_eq!(r1.status, 200, "{}\n{}", r1.text(), a.log());
    let id1 = r1.json()["id"].as_str().unwrap().to_string();
    let answer1 = r1.json()["output"][0]["content"][0]["text"].clone();
    let item1 = r1.json()["output"][0]["id"].as_str().unwrap().to_string();

    // on B: the history comes from the store
    let r2 = responses(
        b.addr,
        RESP_K1,
        &json!({"model": "to-an", "input": "second question", "previous_response_id": id1}),
    );
    assert_eq!(r2.status, 200, "{}\n{}", r2.text(), b.log());
    let msgs = seen(1)["messages"].as_array().unwrap().clone();
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert!(msgs[0]["content"].to_string().contains("first question"));
    assert_eq!(msgs[1]["content"][0]["text"], answer1, "{msgs:?}");
    assert!(msgs[2]["content"].to_string().contains("second question"));
    assert!(b.metric("ringgate_responses_fleet_fetched_total") >= 1);

    // on C: the whole chain (B's turn, written by B)
    let id2 = r2.json()["id"].as_str().unwrap().to_string();
    let r3 = responses(
        c.addr,
        RESP_K1,
        &json!({"model": "to-an", "input": "third", "previous_response_id": id2}),
    );
    assert_eq!(r3.status, 200, "{}\n{}", r3.text(), c.log());
    assert_eq!(
        seen(2)["messages"].as_array().unwrap().len(),
        5,
        "{}",
        seen(2)
    );
    // an output item by reference, on C
    let r4 = responses(
        c.addr,
        RESP_K1,
        &json!({"model": "to-an", "input": [
            {"role": "user", "content": "again"},
            {"type": "item_reference", "id": item1}]}),
    );
    assert_eq!(r4.status, 200, "{}", r4.text());
    let msgs = seen(3)["messages"].as_array().unwrap().clone();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(msgs[1]["content"][0]["text"], answer1, "{msgs:?}");

    // another tenant: not found, on a node that holds k1's entries and on one that may not
    for gw in [a, b] {
        let r = responses(
            gw.addr,
            RESP_K2,
            &json!({"model": "to-an", "input": "x", "previous_response_id": id1}),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], "previous_response_id");
    }

    // fleet usage: every node's k1 requests (A 1, B 1, C 2), asked on any node
    let t0 = Instant::now();
    loop {
        let r = admin(b.admin(), "GET", "/admin/keys/k1/usage?scope=fleet", None);
        assert_eq!(r.status, 200, "{}\n{}", r.text(), b.log());
        let v = r.json();
        let per_node: Vec<(String, u64)> = v["fleet"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let reqs = n["usage"].as_array().unwrap().iter();
                let sum = reqs.map(|u| u["requests"].as_u64().unwrap()).sum();
                (n["node"].as_str().unwrap().to_string(), sum)
            })
            .collect();
        let total: u64 = v["fleet"]["usage"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["requests"].as_u64().unwrap())
            .sum();
        let own: u64 = v["usage"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["requests"].as_u64().unwrap())
            .sum();
        let want = vec![
            ("node-0".into(), 1),
            ("node-1".into(), 1),
            ("node-2".into(), 2),
        ];
        if per_node == want {
            assert_eq!(
                (total, own, v["fleet"]["node"].as_str()),
                (4, 1, Some("node-1"))
            );
            break;
        }
        assert!(t0.elapsed() < DEADLINE, "fleet usage: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = admin(a.admin(), "GET", "/admin/usage?scope=fleet", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["fleet"]["nodes"].as_array().unwrap().len(), 3);
    let r = admin(a.admin(), "GET", "/admin/usage?scope=galaxy", None);
    assert_eq!(r.status, 400, "{}", r.text());

    // neither secrets nor key names in the store's keys or values
    let before = resp_keys(&redis);
    assert!(!before.is_empty());
    for k in &before {
        let v = redis.cmd(&["GET", k]);
        for s in [RESP_K1, RESP_K2] {
            assert!(!k.contains(&s[3..]) && !v.contains(&s[3..]), "{k}: {v}");
        }
        assert!(!k.contains("k1") && !k.contains("k2"), "a key name in {k}");
        let ttl: i64 = redis.cmd(&["PTTL", k]).trim().parse().unwrap();
        assert!(ttl > 3_000_000 && ttl <= 3_600_000, "{k}: pttl {ttl}");
    }

    // k2's first turn on A; its records in the store replaced by hostile bytes: B refuses them
    let r5 = responses(
        a.addr,
        RESP_K2,
        &json!({"model": "to-an", "input": "k2 turn"}),
    );
    assert_eq!(r5.status, 200, "{}", r5.text());
    let id5 = r5.json()["id"].as_str().unwrap().to_string();
    let fresh: Vec<String> = resp_keys(&redis)
        .into_iter()
        .filter(|k| !before.contains(k))
        .collect();
    assert!(!fresh.is_empty());
    for k in &fresh {
        redis.cmd(&["SET", k, "RGR1t\u{0}\u{0}{\"evil\":1}"]);
    }
    let next = json!({"model": "to-an", "input": "k2 again", "previous_response_id": id5});
    let r = responses(b.addr, RESP_K2, &next);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(b.metric("ringgate_responses_fleet_refused_total") >= 1);
    // A holds its own copy: the chain goes on there
    assert_eq!(responses(a.addr, RESP_K2, &next).status, 200);

    // the store down: A still answers from what it holds, B says not found and counts it;
    // fleet usage is a 503, the node's own usage still answers
    redis.stop();
    let r = admin(a.admin(), "GET", "/admin/usage?scope=fleet", None);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(admin(a.admin(), "GET", "/admin/usage", None).status, 200);
    let r = responses(a.addr, RESP_K2, &next);
    assert_eq!(r.status, 200, "{}", r.text());
    let before = b.metric("ringgate_responses_fleet_errors_total");
    let r = responses(b.addr, RESP_K2, &next);
    assert_eq!(r.status, 400, "{}", r.text());
    b.wait_metric_by(
        "ringgate_responses_fleet_errors_total",
        |v| v > before,
        "more errors",
    );
}

/// Every shard of `gw` connected to the store for Responses state (one log line each).
fn wait_store_up(gw: &Gateway, shards: usize) {
    let t0 = Instant::now();
    while gw.log().matches(": responses store ").count() < shards {
        assert!(t0.elapsed() < DEADLINE, "no store up\n{}", gw.log());
        std::thread::sleep(Duration::from_millis(25));
    }
}
