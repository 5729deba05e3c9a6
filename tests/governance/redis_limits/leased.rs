//! `[limits] mode = "leased"` with a real `redis-server`: each process leases units of the key's
//! window and decides locally. The store grants units atomically, so two processes never admit
//! more than the limit together, and every unit the store counted is either admitted or still
//! held by a process (`ringgate_limit_lease_units_left`); a process whose units run out while
//! the store is down follows `on_store_error`.

use super::*;

fn leased(redis: &Redis, on_error: &str) -> String {
    shared(redis, on_error, "mode = \"leased\"")
}

/// The store's count of team-a's window `w`.
fn counted(redis: &Redis, w: u64) -> u64 {
    let v = redis.cmd(&["GET", &format!("ringgate:rpm:team-a:{w}")]);
    v.trim().parse().unwrap_or(0)
}

#[test]
fn leased_two_gateways_admit_at_most_the_limit_and_every_unit_is_accounted_for() {
    let redis = Redis::start(RedisOpts::default());
    // the accounting is under test, not the store's deadline: the default 50 ms can pass on a
    // loaded 2-core box, and a timed-out lease falls back to local counting (a failure here)
    let limits = shared(
        &redis,
        "local",
        "mode = \"leased\"\nredis_timeout_ms = 2000",
    );
    // one process with one shard (epoll), one with two (io_uring): units are per process
    let a = Gateway::start(&config(1, "epoll", &limits, "instant", "rpm = 20"));
    let b = Gateway::start(&config(2, "io_uring", &limits, "instant", "rpm = 20"));
    a.wait_metric("ringgate_limit_store_up", 1);
    b.wait_metric("ringgate_limit_store_up", 2);
    let w = window_with(20);
    let (mut ok, mut limited) = (0, 0);
    for i in 0..40 {
        let gw = if i % 2 == 0 { &a } else { &b };
        let r = request(gw.addr, &chat(SECRET, CHAT));
        assert_eq!(r.header("x-ratelimit-limit-requests"), Some("20"), "{i}");
        match r.status {
            200 => ok += 1,
            429 => {
                limited += 1;
                assert_eq!(r.json()["error"]["type"], "rate_limit_error");
                let retry = header_u64(&r, "retry-after");
                assert!((1..=60).contains(&retry), "retry-after {retry}");
                assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
            }
            s => panic!("{i}: {s} {}", r.text()),
        }
    }
    assert_eq!(unix_ms() / 60_000, w, "the run left its window");
    // never over the limit; the store granted the whole window (40 asked for 20)
    assert!(ok <= 20, "{ok} admitted of rpm = 20");
    assert_eq!(ok + limited, 40);
    assert_eq!(counted(&redis, w), 20);
    // every unit counted in the store is admitted or still held (the documented slack)
    // (a refill the store granted may still be on its way back to its process: the units it
    // counted reach `units_left` when the reply lands, so wait for that on a loaded box)
    let held = |g: &Gateway| g.metric("ringgate_limit_lease_units_left{key=\"team-a\"");
    let deadline = Instant::now() + Duration::from_secs(10);
    let (ha, hb) = loop {
        let (ha, hb) = (held(&a), held(&b));
        if ok + ha + hb >= 20 || Instant::now() > deadline {
            break (ha, hb);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ok + ha + hb, 20, "admitted {ok}, held {ha} + {hb}");
    // the bound of docs/keys-and-limits.md: a process holds at most cap + cap / 4 units
    // unused, cap = ceil(rpm / 16) = 2
    assert!(ha <= 2 && hb <= 2, "held {ha} + {hb}");
    // leases were granted (on the request path and by the refill tasks)
    let refills = |g: &Gateway| g.metric("ringgate_limit_lease_refills_total{shard=");
    assert!(
        refills(&a) >= 1 && refills(&b) >= 1,
        "{} {}",
        refills(&a),
        refills(&b)
    );
    assert_eq!(a.metric("ringgate_limit_lease_failures_total{shard="), 0);
    // a key without limits never needs the store
    assert_eq!(request(a.addr, &chat(FREE, CHAT)).status, 200);
}

#[test]
fn leased_requests_are_decided_without_a_round_trip_and_refilled_in_the_background() {
    common::shard_counts().for_each(leased_requests_are_decided_locally_at);
}

fn leased_requests_are_decided_locally_at(shards: usize) {
    let redis = Redis::start(RedisOpts::default());
    let limits = leased(&redis, "local");
    let a = Gateway::start(&config(shards, "epoll", &limits, "instant", "rpm = 6000"));
    a.wait_metric("ringgate_limit_store_up", shards as u64);
    let w = window_with(20);
    for i in 0..200 {
        let r = request(a.addr, &chat(SECRET, CHAT));
        assert_eq!(r.status, 200, "{i}: {}", r.text());
    }
    assert_eq!(unix_ms() / 60_000, w, "the run left its window");
    // every shard has published its metrics since (once a second)
    a.wait_metric("ringgate_key_requests_total{key=\"team-a\"", 200);
    let m = |name: &str| a.metric(name);
    let waits = m("ringgate_limit_lease_waits_total{shard=");
    let refills = m("ringgate_limit_lease_refills_total{shard=");
    // leases double per refill (up to ceil(6000 / 16) = 375): a few requests asked the store,
    // the rest took a unit the refill task had leased ahead
    assert!(waits <= 50, "{waits} of 200 requests waited for a lease");
    assert!(refills > waits, "refills {refills}, waits {waits}");
    let held = a.metric("ringgate_limit_lease_units_left{key=\"team-a\"");
    assert_eq!(counted(&redis, w), 200 + held, "held {held}");
}

#[test]
fn leased_closed_mode_serves_the_units_it_holds_then_refuses_while_the_store_is_down() {
    let mut redis = Redis::start(RedisOpts::default());
    let limits = leased(&redis, "closed");
    let a = Gateway::start(&config(1, "epoll", &limits, "instant", "rpm = 600"));
    a.wait_metric("ringgate_limit_store_up", 1);
    window_with(30);
    for _ in 0..20 {
        assert_eq!(request(a.addr, &chat(SECRET, CHAT)).status, 200);
    }
    redis.stop();
    a.wait_metric("ringgate_limit_store_up", 0);
    let held = a.metric("ringgate_limit_lease_units_left{key=\"team-a\"");
    // the units held are served; then 503 (closed), never more than held + 0
    let mut codes = Vec::new();
    for _ in 0..held + 5 {
        let r = request(a.addr, &chat(SECRET, CHAT));
        if r.status == 503 {
            assert!(r.text().contains("unavailable"), "{}", r.text());
        }
        codes.push(r.status);
    }
    let served = codes.iter().take_while(|&&c| c == 200).count() as u64;
    assert_eq!(served, held, "{codes:?}");
    assert!(
        codes[served as usize..].iter().all(|&c| c == 503),
        "{codes:?}"
    );
    assert!(a.metric("ringgate_limit_lease_failures_total{shard=") >= 1);
    assert!(a.metric("ringgate_limit_store_fallbacks_total{mode=\"closed\"") >= 5);
    // a key without limits is still served
    assert_eq!(request(a.addr, &chat(FREE, CHAT)).status, 200);
    redis.restart();
    a.wait_metric("ringgate_limit_store_up", 1);
    let r = request(a.addr, &chat(SECRET, CHAT));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn leased_local_mode_keeps_serving_on_the_process_counters_while_the_store_is_down() {
    let mut redis = Redis::start(RedisOpts::default());
    let limits = leased(&redis, "local");
    let a = Gateway::start(&config(1, "epoll", &limits, "instant", "rpm = 20"));
    a.wait_metric("ringgate_limit_store_up", 1);
    let w = window_with(30);
    for _ in 0..5 {
        assert_eq!(request(a.addr, &chat(SECRET, CHAT)).status, 200);
    }
    redis.stop();
    a.wait_metric("ringgate_limit_store_up", 0);
    // the process's own window remembers the 5: 15 more, then 429
    let mut codes = Vec::new();
    for _ in 0..20 {
        codes.push(request(a.addr, &chat(SECRET, CHAT)).status);
    }
    assert_eq!(codes.iter().filter(|&&c| c == 200).count(), 15, "{codes:?}");
    assert!(codes[15..].iter().all(|&c| c == 429), "{codes:?}");
    assert!(a.metric("ringgate_limit_lease_failures_total{shard=") >= 1);
    assert!(a.metric("ringgate_limit_store_fallbacks_total{mode=\"local\"") >= 1);
    // back: what was admitted locally is caught up into the window
    redis.restart();
    a.wait_metric("ringgate_limit_store_up", 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while counted(&redis, w) == 0 {
        assert!(Instant::now() < deadline, "nothing caught up");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(counted(&redis, w) >= 10, "{}", counted(&redis, w));
}
