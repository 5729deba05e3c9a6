//! The shared store as people run it (issue 24): `rediss://` (TLS through rustls, a test CA,
//! the server name checked), an ACL user whose password comes from the environment — against
//! real `redis-server` processes (Debian's redis 7, `.ci/run` installs it) and real gateway
//! processes: one limit between processes over TLS, and a store whose certificate or
//! credentials are wrong never used (requests still served, `on_store_error = "local"`, the
//! log and metrics say why). Shared keys (`[fleet] share = ["keys"]`) over TLS and on the
//! Cluster: a key made through one node's admin API admits exactly its rpm across both.
//!
//! Windows are wall-clock minutes: a test that counts within one window first waits until
//! enough of the current minute is left (`window_with`), so it may wait up to ~25 s.

#[path = "redis_fleet/cluster.rs"]
mod cluster;
#[path = "redis_fleet/leased.rs"]
mod leased;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/redis.rs"]
mod harness;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{request, Response};
use harness::{Gateway, Redis, RedisOpts};

const SECRET: &str = "rg-fleet-test-6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d";

/// A gateway config: `shards`, `driver`, the `[limits]` lines (more tables may follow them),
/// the key's limit lines.
fn config(shards: usize, driver: &str, limits: &str, key_limits: &str) -> String {
    let state = harness::temp_dir("state");
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"
state_dir = "{}"

[limits]
{limits}

[[provider]]
name = "mock"
kind = "mock"
profile = "instant"

[[model]]
name = "gpt-4o-mini"
provider = "mock"

[[key]]
name = "team-a"
key_sha256 = "{}"
{key_limits}
"#,
        state.display(),
        common::key_digest_hex(SECRET)
    )
}

/// Shared keys and an admin listener, appended to the `[limits]` lines.
const FLEET_KEYS: &str = "\n[fleet]\nshare = [\"keys\"]\n\n[admin]\nlisten = \"127.0.0.1:0\"\n";
const TOKEN: &str = "redis-fleet-admin-token-0123456789abcdef";

fn admin(gw: &Gateway, method: &str, path: &str, body: Option<&str>) -> Response {
    let body = body.unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    request(gw.admin(), raw.as_bytes())
}

/// Make runtime key `name` with `rpm` on `made`, wait until every gateway of `all` lists it
/// (the fleet's change feed), then count 30 requests alternating over `all`: exactly `rpm`
/// admitted, one window for the fleet's key on every node.
pub fn fleet_key_shares_rpm(made: &Gateway, all: &[&Gateway], name: &str, rpm: u64) {
    let r = admin(
        made,
        "POST",
        "/admin/keys",
        Some(&format!("{{\"name\":\"{name}\",\"rpm\":{rpm}}}")),
    );
    assert_eq!(r.status, 201, "{}\n{}", r.text(), made.log());
    let secret = r.json()["key"].as_str().unwrap().to_string();
    for gw in all {
        let t0 = std::time::Instant::now();
        loop {
            let r = admin(gw, "GET", "/admin/keys", None);
            if r.text().contains(&format!("\"{name}\"")) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{name} not listed\n{}",
                gw.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    window_with(20);
    let (ok, limited, mut remaining) = spread_key(all, &secret, 30);
    assert_eq!(
        (ok, limited),
        (rpm as usize, 30 - rpm as usize),
        "{name}: {remaining:?}"
    );
    remaining.sort_unstable();
    assert_eq!(remaining, (0..rpm).collect::<Vec<u64>>(), "{name}");
}

fn chat_as(secret: &str) -> Vec<u8> {
    let body =
        r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;
    chat_body(secret, body)
}

fn chat_body(secret: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {secret}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Wait until at least `secs` seconds are left in the current wall-clock minute.
fn window_with(secs: u64) {
    let left = 60_000 - unix_ms() % 60_000;
    if left < secs * 1000 {
        std::thread::sleep(Duration::from_millis(left + 20));
    }
}

/// `n` requests alternating over `gws`: (admitted, limited, remaining seen), every other
/// status a failure.
fn spread(gws: &[&Gateway], n: usize) -> (usize, usize, Vec<u64>) {
    spread_key(gws, SECRET, n)
}

fn spread_key(gws: &[&Gateway], secret: &str, n: usize) -> (usize, usize, Vec<u64>) {
    let (mut ok, mut limited, mut remaining) = (0, 0, Vec::new());
    for i in 0..n {
        let gw = gws[i % gws.len()];
        let r: Response = request(gw.addr, &chat_as(secret));
        match r.status {
            200 => {
                ok += 1;
                if let Some(v) = r.header("x-ratelimit-remaining-requests") {
                    remaining.push(v.parse().unwrap());
                }
            }
            429 => limited += 1,
            s => panic!("{i}: {s} {}\n{}", r.text(), gw.log()),
        }
    }
    (ok, limited, remaining)
}

const ACL: (&str, &str) = ("ringgate", "acl-pw-5f4e3d");

#[test]
fn two_gateways_share_one_rpm_window_over_tls_as_an_acl_user() {
    let redis = Redis::start(RedisOpts {
        tls_names: Some(vec!["localhost", "127.0.0.1"]),
        acl: Some(ACL),
        ..Default::default()
    });
    let ca = redis.dir.join("ca.pem");
    let limits = format!(
        "store = \"redis\"\nredis_url = \"rediss://localhost:{}/0\"\nredis_ca_file = \"{}\"\nredis_username = \"{}\"\nredis_password_env = \"RG_TEST_REDIS_PW\"\nredis_timeout_ms = 2000\nmode = \"exact\"\n",
        redis.port,
        ca.display(),
        ACL.0
    );
    let env = [("RG_TEST_REDIS_PW", ACL.1), ("RINGGATE_ADMIN_TOKEN", TOKEN)];
    let limits = format!("{limits}{FLEET_KEYS}");
    // one process with one shard (epoll), one with two (io_uring)
    let a = Gateway::start_env(&config(1, "epoll", &limits, "rpm = 20"), &env);
    let b = Gateway::start_env(&config(2, "io_uring", &limits, "rpm = 20"), &env);
    a.wait_metric("ringgate_limit_store_up", 1);
    b.wait_metric("ringgate_limit_store_up", 2);
    let log = a.log();
    assert!(log.contains("rediss://ringgate:***@localhost:"), "{log}");
    assert!(!log.contains(ACL.1) && !b.log().contains(ACL.1));
    window_with(20);
    let (ok, limited, mut remaining) = spread(&[&a, &b], 30);
    assert_eq!((ok, limited), (20, 10), "remaining seen: {remaining:?}");
    // one count for both processes: every value from 19 down to 0 seen once
    remaining.sort_unstable();
    assert_eq!(remaining, (0..20).collect::<Vec<u64>>());
    // shared keys over TLS: a key made on B has one rpm window on both
    fleet_key_shares_rpm(&b, &[&a, &b], "team-tls", 20);
}

#[test]
fn a_tls_store_with_the_wrong_name_or_ca_or_password_is_never_used() {
    // the certificate names localhost only
    let redis = Redis::start(RedisOpts {
        tls_names: Some(vec!["localhost"]),
        acl: Some(ACL),
        ..Default::default()
    });
    let dir = &redis.dir;
    let env = [("RG_TEST_REDIS_PW", ACL.1)];
    let limits = |host: &str, ca: &str, user: &str| {
        format!(
            "store = \"redis\"\nredis_url = \"rediss://{host}:{}/0\"\nredis_ca_file = \"{}\"\nredis_username = \"{user}\"\nredis_password_env = \"RG_TEST_REDIS_PW\"\n",
            redis.port,
            dir.join(ca).display()
        )
    };
    // 127.0.0.1 is not a name on the certificate
    let wrong_name = Gateway::start_env(
        &config(1, "epoll", &limits("127.0.0.1", "ca.pem", ACL.0), "rpm = 2"),
        &env,
    );
    // a CA that did not sign it
    let wrong_ca = Gateway::start_env(
        &config(
            2,
            "io_uring",
            &limits("localhost", "other-ca.pem", ACL.0),
            "rpm = 2",
        ),
        &env,
    );
    // the right TLS, a user the server does not know
    let wrong_user = Gateway::start_env(
        &config(
            1,
            "io_uring",
            &limits("localhost", "ca.pem", "nobody"),
            "rpm = 2",
        ),
        &env,
    );
    let cert_error = wrong_name.wait_log("unavailable (TLS handshake:");
    assert!(
        cert_error.contains("certificate not valid for name \"127.0.0.1\""),
        "{cert_error}"
    );
    let ca_error = wrong_ca.wait_log("unavailable (TLS handshake:");
    assert!(ca_error.contains("invalid peer certificate"), "{ca_error}");
    let auth_error = wrong_user.wait_log("unavailable (AUTH:");
    assert!(auth_error.contains("WRONGPASS"), "{auth_error}");
    for gw in [&wrong_name, &wrong_ca, &wrong_user] {
        gw.wait_metric_by(
            "ringgate_limit_store_errors_total{shard=\"0\",kind=\"connect\"}",
            |v| v >= 2,
            "at least 2 (it keeps trying)",
        );
        assert_eq!(gw.metric("ringgate_limit_store_up"), 0);
        assert!(!gw.log().contains(ACL.1));
        // served on this process's own counters (on_store_error = "local"): rpm 2 per process
        window_with(10);
        let (ok, limited, _) = spread(&[gw], 3);
        assert_eq!((ok, limited), (2, 1), "{}", gw.log());
        gw.wait_metric_by(
            "ringgate_limit_store_fallbacks_total{mode=\"local\"}",
            |v| v >= 1,
            ">= 1",
        );
    }
}
