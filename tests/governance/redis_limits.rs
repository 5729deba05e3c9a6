//! Limits shared through a real `redis-server` (Debian package; `.ci/run` installs it): gateway
//! processes (the real binary) pointed at one store enforce one limit between them — requests
//! per minute, tokens per minute, requests in flight — keep serving on their own counters when
//! the store is gone (or refuse with 503 in `closed` mode), and go back to it, catching up,
//! when it returns. Each test starts its own `redis-server` on a free port in a temp dir.
//!
//! Windows are wall-clock minutes: a test that counts within one window first waits until
//! enough of the current minute is left (`window_with`), so it may wait up to ~25 s.

#[path = "../common/mod.rs"]
mod common;

#[path = "../common/redis.rs"]
mod redis;

#[path = "redis_limits/leased.rs"]
mod leased;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{connect, get, request, Response};
use redis::{Gateway, Redis, RedisOpts};

const SECRET: &str = "rg-redis-test-7d1e0c5b9a8f4e3d2c1b0a9f8e7d6c5b";
const FREE: &str = "rg-redis-test-free-0f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// A gateway config: `shards`, the `[limits]` lines, the mock `profile`, the key's limit lines.
fn config(shards: usize, driver: &str, limits: &str, profile: &str, key_limits: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"

[limits]
{limits}

[[provider]]
name = "mock"
kind = "mock"
profile = "{profile}"

[[model]]
name = "gpt-4o-mini"
provider = "mock"

[[key]]
name = "team-a"
key_sha256 = "{}"
{key_limits}

[[key]]
name = "free"
key_sha256 = "{}"
"#,
        common::key_digest_hex(SECRET),
        common::key_digest_hex(FREE)
    )
}

fn shared(redis: &Redis, mode: &str, extra: &str) -> String {
    format!(
        "store = \"redis\"\nredis_url = \"{}\"\non_store_error = \"{mode}\"\n{extra}",
        redis.url(0)
    )
}

fn chat(secret: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {secret}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const CHAT: &str =
    r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Wait until at least `secs` seconds are left in the current wall-clock minute (the store's
/// window); returns the window number.
fn window_with(secs: u64) -> u64 {
    let left = 60_000 - unix_ms() % 60_000;
    if left < secs * 1000 {
        std::thread::sleep(Duration::from_millis(left + 20));
    }
    unix_ms() / 60_000
}

fn header_u64(r: &Response, name: &str) -> u64 {
    r.header(name)
        .unwrap_or_else(|| panic!("no {name}: {:?}", r.headers))
        .parse()
        .unwrap()
}

#[test]
fn two_gateways_share_one_rpm_window() {
    let redis = Redis::start(RedisOpts::default());
    let limits = shared(&redis, "local", "");
    // one process with one shard (epoll), one with two (io_uring): no per-shard split
    let a = Gateway::start(&config(1, "epoll", &limits, "instant", "rpm = 20"));
    let b = Gateway::start(&config(2, "io_uring", &limits, "instant", "rpm = 20"));
    a.wait_metric("ringgate_limit_store_up", 1);
    b.wait_metric("ringgate_limit_store_up", 2);
    window_with(15);
    let (mut ok, mut limited) = (Vec::new(), 0);
    for i in 0..30 {
        let gw = if i % 2 == 0 { &a } else { &b };
        let r = request(gw.addr, &chat(SECRET, CHAT));
        assert_eq!(r.header("x-ratelimit-limit-requests"), Some("20"), "{i}");
        match r.status {
            200 => ok.push(header_u64(&r, "x-ratelimit-remaining-requests")),
            429 => {
                limited += 1;
                assert_eq!(r.json()["error"]["type"], "rate_limit_error");
                let retry = header_u64(&r, "retry-after");
                let left = (60_000 - unix_ms() % 60_000).div_ceil(1000);
                assert!(
                    (1..=60).contains(&retry) && retry.abs_diff(left) <= 1,
                    "retry-after {retry}, {left} s left in the window"
                );
                assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
            }
            s => panic!("{i}: {s} {}", r.text()),
        }
    }
    assert_eq!((ok.len(), limited), (20, 10), "remaining seen: {ok:?}");
    // one count for both processes: every value from 19 down to 0 seen once
    ok.sort_unstable();
    assert_eq!(ok, (0..20).collect::<Vec<u64>>());
    // (B's other shard publishes its metrics once a second)
    let rejected = |g: &Gateway| g.metric("ringgate_key_rejections_total{shard=");
    let deadline = Instant::now() + Duration::from_secs(5);
    while rejected(&a) + rejected(&b) != 10 {
        assert!(
            Instant::now() < deadline,
            "{} + {}",
            rejected(&a),
            rejected(&b)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // a key without limits never needs the store
    assert_eq!(request(a.addr, &chat(FREE, CHAT)).status, 200);
}

#[test]
fn in_flight_is_shared_and_a_crashed_process_frees_its_slots() {
    common::shard_counts().for_each(in_flight_is_shared_and_a_crashed_process_frees_its_slots_at);
}

fn in_flight_is_shared_and_a_crashed_process_frees_its_slots_at(shards: usize) {
    let redis = Redis::start(RedisOpts::default());
    // a lease of 1 s: a killed process's slots are freed within ~1 s
    let limits = shared(&redis, "local", "redis_lease_ms = 1000");
    let cfg = config(shards, "epoll", &limits, "paced", "max_in_flight = 1");
    let mut a = Gateway::start(&cfg);
    let b = Gateway::start(&cfg.replace("epoll", "io_uring"));
    a.wait_metric("ringgate_limit_store_up", shards as u64);
    b.wait_metric("ringgate_limit_store_up", shards as u64);
    // a paced stream of 50 deltas takes ~1 s
    let slow = r#"{"model":"gpt-4o-mini","stream":true,"messages":[],"max_tokens":50}"#;
    let mut s = connect(a.addr);
    s.write_all(&chat(SECRET, slow)).unwrap();
    let head_only = {
        // the SSE head arrives at once; the stream is still running on A
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).unwrap();
        String::from_utf8_lossy(&tmp[..n]).into_owned()
    };
    assert!(head_only.starts_with("HTTP/1.1 200"), "{head_only}");
    let r = request(b.addr, &chat(SECRET, CHAT));
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.text().contains("in flight"), "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    // the stream ends: its slot comes back (the release is sent without waiting: poll)
    let mut seen = head_only.into_bytes();
    let mut tmp = [0u8; 4096];
    while !seen.ends_with(b"0\r\n\r\n") {
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&tmp[..n]);
    }
    drop(s);
    let back = poll_status(b.addr, 200, Duration::from_secs(5));
    assert!(back < Duration::from_secs(1), "{back:?}");

    // now A dies holding a slot: B is refused until A's lease runs out, then admitted.
    // (B's last request may still hold the slot for a moment: its release is not awaited)
    let deadline = Instant::now() + Duration::from_secs(5);
    let _stream = loop {
        let mut s = connect(a.addr);
        s.write_all(&chat(SECRET, slow)).unwrap();
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).unwrap();
        if tmp[..n].starts_with(b"HTTP/1.1 200") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&tmp[..n])
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    a.kill();
    let killed = Instant::now();
    assert_eq!(request(b.addr, &chat(SECRET, CHAT)).status, 429);
    poll_status(b.addr, 200, Duration::from_secs(10));
    let freed = killed.elapsed();
    assert!(freed < Duration::from_millis(3000), "freed after {freed:?}");
}

/// Send requests to `addr` until one gets `status`; how long that took.
fn poll_status(addr: SocketAddr, status: u16, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let r = request(addr, &chat(SECRET, CHAT));
        if r.status == status {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "still {}: {}", r.status, r.text());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn tpm_is_shared_and_the_url_password_and_db_are_used_and_never_logged() {
    common::shard_counts()
        .for_each(tpm_is_shared_and_the_url_password_and_db_are_used_and_never_logged_at);
}

fn tpm_is_shared_and_the_url_password_and_db_are_used_and_never_logged_at(shards: usize) {
    let redis = Redis::start(RedisOpts {
        password: Some("s3cret-pw"),
        ..Default::default()
    });
    let limits = format!(
        "store = \"redis\"\nredis_url = \"{}\"\n",
        redis.url(3) // password and database 3
    );
    let a = Gateway::start(&config(shards, "epoll", &limits, "instant", "tpm = 1000"));
    let b = Gateway::start(&config(
        shards,
        "io_uring",
        &limits,
        "instant",
        "tpm = 1000",
    ));
    a.wait_metric("ringgate_limit_store_up", shards as u64);
    b.wait_metric("ringgate_limit_store_up", shards as u64);
    let w = window_with(10);
    // the estimate is bytes / 4 + max_tokens; the mock reports what it really counted
    let b1 = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello there"}],"max_tokens":100}"#;
    let est1 = b1.len() as u64 / 4 + 100;
    let r = request(a.addr, &chat(SECRET, b1));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-limit-tokens"), Some("1000"));
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-tokens"), 1000 - est1);
    let used1 = r.json()["usage"]["total_tokens"].as_u64().unwrap();
    assert_ne!(used1, est1, "the reconciliation must be visible");
    // A reconciles its reservation with the real usage (sent without waiting): in db 3
    let key = format!("ringgate:tpm:team-a:{w}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis.cmd_db(3, &["GET", &key]) != used1.to_string() {
        assert!(
            Instant::now() < deadline,
            "{}",
            redis.cmd_db(3, &["GET", &key])
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(redis.cmd_db(0, &["EXISTS", &key]), "0", "not in db 0");
    // B sees A's tokens
    let b2 = r#"{"model":"gpt-4o-mini","messages":[],"max_tokens":10}"#;
    let r = request(b.addr, &chat(SECRET, b2));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        header_u64(&r, "x-ratelimit-remaining-tokens"),
        1000 - used1 - (b2.len() as u64 / 4 + 10)
    );
    // a request whose estimate does not fit what is left between them: 429
    let big = r#"{"model":"gpt-4o-mini","messages":[],"max_tokens":990}"#;
    let r = request(b.addr, &chat(SECRET, big));
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.text().contains("tokens per minute"), "{}", r.text());
    let retry = header_u64(&r, "retry-after");
    assert!((1..=60).contains(&retry));
    // the key's TTL is set (windows expire)
    let ttl: i64 = redis.cmd_db(3, &["PTTL", &key]).parse().unwrap();
    assert!((1..=120_000).contains(&ttl), "{ttl}");
    for g in [&a, &b] {
        let log = g.log();
        assert!(log.contains(":***@127.0.0.1"), "{log}");
        assert!(!log.contains("s3cret-pw"), "{log}");
        let m = request(g.addr, &get("/metrics")).text();
        assert!(!m.contains("s3cret-pw"));
    }
}

#[test]
fn redis_stopped_local_mode_keeps_serving_and_catches_up_when_it_is_back() {
    common::shard_counts()
        .for_each(redis_stopped_local_mode_keeps_serving_and_catches_up_when_it_is_back_at);
}

fn redis_stopped_local_mode_keeps_serving_and_catches_up_when_it_is_back_at(shards: usize) {
    let mut redis = Redis::start(RedisOpts::default());
    let limits = shared(&redis, "local", "");
    let a = Gateway::start(&config(shards, "epoll", &limits, "instant", "rpm = 20"));
    let b = Gateway::start(&config(shards, "io_uring", &limits, "instant", "rpm = 20"));
    a.wait_metric("ringgate_limit_store_up", shards as u64);
    b.wait_metric("ringgate_limit_store_up", shards as u64);
    let w = window_with(30);
    for gw in [&a, &b, &a, &b] {
        assert_eq!(request(gw.addr, &chat(SECRET, CHAT)).status, 200);
    }
    redis.stop();
    a.wait_metric("ringgate_limit_store_up", 0);
    b.wait_metric("ringgate_limit_store_up", 0);
    // each process on its own counters (one shard: the whole limit), which remember the 2
    // requests it admitted through the store this window
    for gw in [&a, &b] {
        for _ in 0..5 {
            let r = request(gw.addr, &chat(SECRET, CHAT));
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.header("x-ratelimit-limit-requests"), Some("20"));
        }
        gw.wait_metric("ringgate_limit_store_fallbacks_total{mode=\"local\"}", 5);
    }
    // the outage is logged once per state change by each shard (each has its own store
    // connection; the line names the shard), however many reconnects fail
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.metric("ringgate_limit_store_errors_total{kind=\"connect\"}") < 3 {
        assert!(Instant::now() < deadline, "{}", a.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = a.log();
    assert_eq!(log.matches("unavailable").count(), shards, "{log}");
    assert!(log.contains("on_store_error = \"local\""), "{log}");

    redis.restart(); // same port, empty (no persistence)
    a.wait_metric("ringgate_limit_store_up", shards as u64);
    b.wait_metric("ringgate_limit_store_up", shards as u64);
    // caught up: the 5 + 5 admitted locally during the outage count in this window
    let key = format!("ringgate:rpm:team-a:{w}");
    assert_eq!(redis.cmd_db(0, &["GET", &key]), "10");
    // each shard catches up what it admitted (the 5 between them) and says so once per state
    // change (up at start, up again now)
    let log = a.log();
    let caught: u64 = log
        .split("caught up ")
        .skip(1)
        .filter_map(|t| t.split(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(caught, 5, "{log}");
    assert_eq!(
        log.matches(" up: limits are shared").count(),
        2 * shards,
        "{log}"
    );
    // and the shared limit holds again: 10 more between them, then 429
    let mut admitted = 0;
    for i in 0..14 {
        let gw = if i % 2 == 0 { &a } else { &b };
        match request(gw.addr, &chat(SECRET, CHAT)).status {
            200 => admitted += 1,
            429 => {}
            s => panic!("{s}"),
        }
    }
    assert_eq!(admitted, 10);
}

#[test]
fn closed_mode_refuses_limited_keys_with_503_while_the_store_is_down() {
    common::shard_counts()
        .for_each(closed_mode_refuses_limited_keys_with_503_while_the_store_is_down_at);
}

fn closed_mode_refuses_limited_keys_with_503_while_the_store_is_down_at(shards: usize) {
    let mut redis = Redis::start(RedisOpts::default());
    let limits = shared(&redis, "closed", "");
    let a = Gateway::start(&config(shards, "epoll", &limits, "instant", "rpm = 100"));
    a.wait_metric("ringgate_limit_store_up", shards as u64);
    assert_eq!(request(a.addr, &chat(SECRET, CHAT)).status, 200);
    redis.stop();
    a.wait_metric("ringgate_limit_store_up", 0);
    let r = request(a.addr, &chat(SECRET, CHAT));
    assert_eq!(r.status, 503, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], "limit_store_unavailable");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("rate-limit store is unavailable"));
    assert!(r.header("retry-after").is_some());
    let messages =
        r#"{"model":"gpt-4o-mini","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}"#;
    let raw = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nx-api-key: {SECRET}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{messages}",
        messages.len()
    );
    let r = request(a.addr, raw.as_bytes());
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    // a key without limits does not need the store
    assert_eq!(request(a.addr, &chat(FREE, CHAT)).status, 200);
    a.wait_metric("ringgate_limit_store_fallbacks_total{mode=\"closed\"}", 2);
    assert!(a.log().contains("on_store_error = \"closed\""));
    redis.restart();
    a.wait_metric("ringgate_limit_store_up", shards as u64);
    let r = request(a.addr, &chat(SECRET, CHAT));
    assert_eq!(r.status, 200, "{}\n{}", r.text(), a.log());
}

/// A fake store: completes the handshake (`SCRIPT LOAD`, the lease's `SET`), then never
/// answers a script call.
fn silent_store() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                loop {
                    // one command: *N, then N × ($len, arg)
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let n: usize = line.trim()[1..].parse().unwrap_or(0);
                    let mut args = Vec::new();
                    for _ in 0..n {
                        let mut len = String::new();
                        r.read_line(&mut len).unwrap();
                        let len: usize = len.trim()[1..].parse().unwrap();
                        let mut arg = vec![0u8; len + 2];
                        r.read_exact(&mut arg).unwrap();
                        args.push(String::from_utf8_lossy(&arg[..len]).into_owned());
                    }
                    let reply: &[u8] = match args.first().map(String::as_str) {
                        Some("SCRIPT") => b"$40\r\n0000000000000000000000000000000000000000\r\n",
                        Some("SET") => b"+OK\r\n",
                        _ => continue, // silence
                    };
                    if w.write_all(reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[test]
fn a_store_that_does_not_answer_costs_one_deadline_then_local_limits_decide() {
    common::shard_counts()
        .for_each(a_store_that_does_not_answer_costs_one_deadline_then_local_limits_decide_at);
}

fn a_store_that_does_not_answer_costs_one_deadline_then_local_limits_decide_at(shards: usize) {
    let port = silent_store();
    let limits = format!(
        "store = \"redis\"\nredis_url = \"redis://127.0.0.1:{port}/0\"\nredis_timeout_ms = 80\n"
    );
    let a = Gateway::start(&config(shards, "epoll", &limits, "instant", "rpm = 5"));
    a.wait_metric("ringgate_limit_store_up", shards as u64);
    let t0 = Instant::now();
    let r = request(a.addr, &chat(SECRET, CHAT));
    let took = t0.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        took >= Duration::from_millis(80) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // decided by the local counters (one shard: the whole limit)
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("4"));
    common::metric_until(
        a.addr,
        "ringgate_limit_store_errors_total{kind=\"timeout\"}",
        "the timeout is counted",
        |n| n >= 1,
    );
    a.wait_metric("ringgate_limit_store_fallbacks_total{mode=\"local\"}", 1);
    assert!(a.log().contains("no reply within 80 ms"), "{}", a.log());
}

#[test]
fn a_budget_spent_through_one_gateway_is_spent_for_the_fleet() {
    common::shard_counts().for_each(a_budget_spent_through_one_gateway_is_spent_for_the_fleet_at);
}

fn a_budget_spent_through_one_gateway_is_spent_for_the_fleet_at(shards: usize) {
    let redis = Redis::start(RedisOpts::default());
    let limits = shared(&redis, "local", "");
    // 1,000 USD per 1M tokens: a request of ~100 tokens costs ~0.1 USD, over the 0.05 budget
    let cfg = config(
        shards,
        "epoll",
        &limits,
        "instant",
        "budget_usd = 0.05\nbudget_period = \"day\"",
    )
    .replace(
        "provider = \"mock\"\n",
        "provider = \"mock\"\nprice_input_per_mtok = 1000.0\nprice_output_per_mtok = 1000.0\n",
    );
    let a = Gateway::start(&cfg);
    let b = Gateway::start(&cfg.replace("epoll", "io_uring"));
    a.wait_metric("ringgate_limit_store_up", shards as u64);
    b.wait_metric("ringgate_limit_store_up", shards as u64);
    let body =
        r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":100}"#;
    let r = request(a.addr, &chat(SECRET, body));
    assert_eq!(r.status, 200, "{}", r.text());
    // A recorded the cost in the store (sent without waiting: poll)
    let now = unix_ms() / 1000;
    let key = format!("ringgate:spend:team-a:day:{}", now - now % 86_400);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = redis.cmd_db(0, &["GET", &key]);
        if v.parse::<u64>().is_ok_and(|n| n >= 50_000_000) {
            break;
        }
        assert!(Instant::now() < deadline, "{key} = {v}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let ttl: i64 = redis.cmd_db(0, &["PTTL", &key]).parse().unwrap();
    assert!(ttl > 86_400_000, "a day's counter lives two days: {ttl}");
    // B has spent nothing itself, but the key has: refused like A would
    for gw in [&b, &a] {
        let r = request(gw.addr, &chat(SECRET, body));
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "insufficient_quota");
        assert_eq!(r.header("x-should-retry"), Some("false"));
    }
}
