//! `mode = "leased"` on the stores people run: over TLS as an ACL user, and on a 3-master
//! Cluster (the lease script's one key carries the key's name as its hash tag). Two processes
//! at `rpm = 20` never admit more than 20 together, and every unit the store granted is
//! admitted or still held by a process (`ringgate_limit_lease_units_left`).

use crate::harness::{Gateway, Redis, RedisCluster, RedisOpts};
use crate::{config, spread_key, window_with, ACL, SECRET};

/// 40 requests of `secret` alternating over `a` and `b` at `rpm = 20`, leased: at most 20
/// admitted, and admitted + units held = 20 (the store granted the whole window).
fn leased_share(a: &Gateway, b: &Gateway, secret: &str, key: &str) -> usize {
    window_with(20);
    let (ok, limited, _) = spread_key(&[a, b], secret, 40);
    assert!(ok <= 20, "{key}: {ok} admitted of rpm = 20");
    assert_eq!(ok + limited, 40);
    let held =
        |g: &Gateway| { g.metric(&format!("ringgate_limit_lease_units_left{{key=\"{key}\"")) }
            as usize;
    let (ha, hb) = (held(a), held(b));
    assert_eq!(ok + ha + hb, 20, "{key}: admitted {ok}, held {ha} + {hb}");
    // a process holds at most cap + cap / 4 units unused (cap = ceil(20 / 16) = 2)
    assert!(ha <= 2 && hb <= 2, "{key}: held {ha} + {hb}");
    ok
}

#[test]
fn leased_over_tls_as_an_acl_user_admits_at_most_the_limit() {
    let redis = Redis::start(RedisOpts {
        tls_names: Some(vec!["localhost"]),
        acl: Some(ACL),
        ..Default::default()
    });
    let limits = format!(
        "store = \"redis\"\nredis_url = \"rediss://localhost:{}/0\"\nredis_ca_file = \"{}\"\nredis_username = \"{}\"\nredis_password_env = \"RG_TEST_REDIS_PW\"\nredis_timeout_ms = 2000\nmode = \"leased\"\n",
        redis.port,
        redis.dir.join("ca.pem").display(),
        ACL.0
    );
    let env = [("RG_TEST_REDIS_PW", ACL.1)];
    let a = Gateway::start_env(&config(1, "epoll", &limits, "rpm = 20"), &env);
    let b = Gateway::start_env(&config(2, "io_uring", &limits, "rpm = 20"), &env);
    a.wait_metric("ringgate_limit_store_up", 1);
    b.wait_metric("ringgate_limit_store_up", 2);
    leased_share(&a, &b, SECRET, "team-a");
    assert!(a.metric("ringgate_limit_lease_refills_total{shard=") >= 1);
    assert_eq!(a.metric("ringgate_limit_lease_failures_total{shard="), 0);
}

#[test]
fn leased_on_a_cluster_admits_at_most_the_limit_per_key() {
    let cluster = RedisCluster::start();
    let seed = cluster.nodes[0].port;
    let cfg = |shards, driver| {
        super::cluster::config_with(
            shards,
            driver,
            seed,
            "rpm = 20",
            "instant",
            "mode = \"leased\"",
        )
    };
    let a = Gateway::start(&cfg(1, "epoll"));
    let b = Gateway::start(&cfg(2, "io_uring"));
    a.wait_metric("ringgate_limit_store_nodes_up", 3);
    b.wait_metric("ringgate_limit_store_nodes_up", 6);
    for (name, secret) in super::cluster::KEYS {
        leased_share(&a, &b, secret, name);
        // the lease counts in the window's key on its slot's master, under its hash tag
        let slot: u16 = cluster.nodes[0]
            .cmd(&["CLUSTER", "KEYSLOT", name])
            .parse()
            .unwrap();
        let w = crate::unix_ms() / 60_000;
        let key = format!("ringgate:rpm:{{{name}}}:{w}");
        assert_eq!(
            cluster.nodes[cluster.owner(slot)].cmd(&["GET", &key]),
            "20",
            "{key}"
        );
    }
    for g in [&a, &b] {
        assert_eq!(
            g.metric("ringgate_limit_store_fallbacks_total"),
            0,
            "{}",
            g.log()
        );
        assert_eq!(g.metric("ringgate_limit_lease_failures_total{shard="), 0);
    }
}
