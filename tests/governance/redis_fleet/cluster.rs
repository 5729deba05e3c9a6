//! A 3-master Redis Cluster (`redis_cluster = true`): the limits' keys of one virtual key
//! share a slot (hash tags), each call goes to its slot's master, and a slot moved after the
//! gateways fetched the map is followed through `MOVED`.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::common::{connect, request};
use crate::harness::{Gateway, RedisCluster};
use crate::{spread_key, window_with};

pub const KEYS: [(&str, &str); 3] = [
    (
        "team-a",
        "rg-fleet-cluster-a-0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    ),
    (
        "team-b",
        "rg-fleet-cluster-b-0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    ),
    (
        "team-c",
        "rg-fleet-cluster-c-0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    ),
];

/// `rpm = 20` keys, shared keys and an admin listener.
fn config_fleet(shards: usize, driver: &str, seed: u16) -> String {
    let state = crate::harness::temp_dir("state");
    config_with(
        shards,
        driver,
        seed,
        "rpm = 20",
        "instant",
        crate::FLEET_KEYS,
    )
    .replace(
        "pin = false\n",
        &format!("pin = false\nstate_dir = \"{}\"\n", state.display()),
    )
}

pub fn config_with(
    shards: usize,
    driver: &str,
    seed: u16,
    limits: &str,
    profile: &str,
    extra: &str,
) -> String {
    let mut keys = String::new();
    for (name, secret) in KEYS {
        keys.push_str(&format!(
            "[[key]]\nname = \"{name}\"\nkey_sha256 = \"{}\"\n{limits}\n\n",
            crate::common::key_digest_hex(secret)
        ));
    }
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"

[limits]
store = "redis"
redis_url = "redis://127.0.0.1:{seed}"
redis_cluster = true
redis_timeout_ms = 2000
{extra}

[[provider]]
name = "mock"
kind = "mock"
profile = "{profile}"

[[model]]
name = "gpt-4o-mini"
provider = "mock"

{keys}"#
    )
}

#[test]
fn two_gateways_share_rpm_on_a_cluster_and_follow_a_moved_slot() {
    let cluster = RedisCluster::start();
    let seed = cluster.nodes[0].port;
    let env = [("RINGGATE_ADMIN_TOKEN", crate::TOKEN)];
    let a = Gateway::start_env(&config_fleet(1, "epoll", seed), &env);
    let b = Gateway::start_env(&config_fleet(2, "io_uring", seed), &env);
    a.wait_metric("ringgate_limit_store_up", 1);
    b.wait_metric("ringgate_limit_store_up", 2);
    assert!(a.log().contains("(Cluster of 3 masters)"), "{}", a.log());
    a.wait_metric("ringgate_limit_store_nodes_up", 3);
    b.wait_metric("ringgate_limit_store_nodes_up", 6);
    window_with(25);
    // team-c's slot moves to another master after both gateways have the map, and team-c is
    // asked for first (each shard fetches the map again every 10 s: its first call after the
    // move meets the old master's MOVED)
    let slot: u16 = cluster.nodes[0]
        .cmd(&["CLUSTER", "KEYSLOT", "team-c"])
        .parse()
        .unwrap();
    let from = cluster.owner(slot);
    let to = (from + 1) % 3;
    cluster.move_slot(slot, to);
    assert_eq!(cluster.owner(slot), to);
    let mut owners = Vec::new();
    for (name, secret) in KEYS.iter().rev().copied() {
        let (ok, limited, mut remaining) = spread_key(&[&a, &b], secret, 30);
        assert_eq!(
            (ok, limited),
            (20, 10),
            "{name}: remaining seen {remaining:?}"
        );
        remaining.sort_unstable();
        assert_eq!(remaining, (0..20).collect::<Vec<u64>>(), "{name}");
        // the window's counter is on its slot's master, with the name as its hash tag
        let slot: u16 = cluster.nodes[0]
            .cmd(&["CLUSTER", "KEYSLOT", name])
            .parse()
            .unwrap();
        let owner = cluster.owner(slot);
        let w = crate::unix_ms() / 60_000;
        let key = format!("ringgate:rpm:{{{name}}}:{w}");
        assert_eq!(cluster.nodes[owner].cmd(&["GET", &key]), "20", "{key}");
        owners.push(owner);
    }
    assert_eq!(owners[0], to, "team-c is counted where its slot went");
    owners.sort_unstable();
    owners.dedup();
    assert!(
        owners.len() >= 2,
        "the keys' slots are on one master only: {owners:?}"
    );
    let redirects = |g: &Gateway| g.metric("ringgate_limit_store_redirects_total");
    assert!(redirects(&a) + redirects(&b) >= 1, "no MOVED was followed");
    // shared keys on the Cluster ({fleet} hash tag: the script's keys in one slot)
    crate::fleet_key_shares_rpm(&a, &[&a, &b], "team-cluster", 20);
    for g in [&a, &b] {
        assert_eq!(
            g.metric("ringgate_limit_store_fallbacks_total"),
            0,
            "{}",
            g.log()
        );
    }
}

#[test]
fn in_flight_is_shared_on_a_cluster_and_a_crashed_process_frees_its_slots() {
    let cluster = RedisCluster::start();
    let seed = cluster.nodes[1].port;
    // a lease of 1 s: a killed process's slots are freed within ~1 s
    let cfg = |shards, driver| {
        config_with(
            shards,
            driver,
            seed,
            "max_in_flight = 1",
            "paced",
            "redis_lease_ms = 1000",
        )
    };
    let mut a = Gateway::start(&cfg(2, "epoll"));
    let b = Gateway::start(&cfg(1, "io_uring"));
    a.wait_metric("ringgate_limit_store_up", 2);
    b.wait_metric("ringgate_limit_store_up", 1);
    let (_, secret) = KEYS[1];
    let slow = r#"{"model":"gpt-4o-mini","stream":true,"messages":[],"max_tokens":400}"#;
    // a paced stream of 400 deltas (several seconds) holds team-b's one slot on A...
    let hold = |gw: &Gateway| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut s = connect(gw.addr);
            s.write_all(&crate::chat_body(secret, slow)).unwrap();
            let mut tmp = [0u8; 4096];
            let n = s.read(&mut tmp).unwrap();
            if tmp[..n].starts_with(b"HTTP/1.1 200") {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{}",
                String::from_utf8_lossy(&tmp[..n])
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let stream = hold(&a);
    // ...so B, another process, is refused
    let r = request(b.addr, &crate::chat_as(secret));
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.text().contains("in flight"), "{}", r.text());
    // the count and its live key are in the key's slot (hash tag)
    let slot: u16 = cluster.nodes[0]
        .cmd(&["CLUSTER", "KEYSLOT", "team-b"])
        .parse()
        .unwrap();
    let owner = &cluster.nodes[cluster.owner(slot)];
    let fields = owner.cmd(&["HGETALL", "ringgate:inflight:{team-b}"]);
    assert!(fields.ends_with("\n1"), "{fields}");
    // held past several lease renewals (1 s / 3): A's slot stays counted while A lives
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(request(b.addr, &crate::chat_as(secret)).status, 429);
    // A dies holding it: B is admitted once A's lease ran out
    a.kill();
    drop(stream);
    let killed = Instant::now();
    loop {
        let r = request(b.addr, &crate::chat_as(secret));
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429, "{}", r.text());
        assert!(killed.elapsed() < Duration::from_secs(15), "never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        b.metric("ringgate_limit_store_fallbacks_total"),
        0,
        "{}",
        b.log()
    );
}
