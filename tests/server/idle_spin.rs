//! `[server] idle_spin_us`: a spinning shard serves as usual, its timeouts still fire while
//! steady traffic keeps it spinning (the timer wheel only turns when the runtime parks), and
//! it stops burning its core once traffic stops. Both drivers; a raw fake upstream on
//! 127.0.0.1 port 0.

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use ringgate::server;

/// Answers every request with a small chat completion, except one whose body mentions
/// `"stall-me"`: that one is never answered (the connection stays open and silent).
fn stalling_upstream() -> SocketAddr {
    fake_upstream(|s, _, req| {
        if req.windows(8).any(|w| w == b"stall-me") {
            std::thread::sleep(Duration::from_secs(30));
            return false;
        }
        let body = r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
        s.write_all(&json_response(body)).is_ok()
    })
}

/// The test config (`common::start_gateway_with`: first-byte timeout 3 s) with a 10 ms spin
/// budget, longer than a request takes here, so steady traffic never lets the shard park.
fn start(driver: Variant, upstream: SocketAddr) -> server::Running {
    start_gateway_with(upstream, driver, "idle_spin_us = 10000", "")
}

fn chat(content: &str) -> Vec<u8> {
    post(
        "/v1/chat/completions",
        &format!(
            r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{content}"}}]}}"#
        ),
    )
}

/// CPU time (user + system, clock ticks) of this process's threads named `ringgate-shard-*`.
fn shard_ticks() -> u64 {
    let mut total = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ... : comm may hold spaces, so split after the last ')'
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !stat[open + 1..close].starts_with("ringgate-shard") {
            continue;
        }
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        // fields after comm: state(0) ... utime(11) stime(12)
        total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    total
}

#[test]
fn a_spinning_shard_serves_its_timeouts_fire_and_it_sleeps_once_traffic_stops() {
    // one test: the idle check reads the CPU time of every shard thread in this process
    for d in variants() {
        let up = stalling_upstream();
        let gw = start(d, up);
        steady_traffic_leaves_timeouts_punctual(d, gw.addr);
        sleeps_once_traffic_stops(d);
        gw.stop();
    }
}

fn steady_traffic_leaves_timeouts_punctual(d: Variant, addr: SocketAddr) {
    // a request whose upstream never answers: its first-byte timeout (3 s) must fire while
    // the traffic below keeps the shard spinning
    let stalled = std::thread::spawn(move || {
        let t = Instant::now();
        let r = request(addr, &chat("stall-me"));
        (r.status, t.elapsed())
    });
    let until = Instant::now() + Duration::from_millis(6000);
    let mut s = connect(addr);
    let mut buf = Vec::new();
    let mut served = 0u32;
    while Instant::now() < until && !stalled.is_finished() {
        s.write_all(&chat("hello")).unwrap();
        let r = read_response(&mut s, &mut buf).expect("answer");
        assert_eq!(r.status, 200, "driver {d}: {}", r.text());
        served += 1;
    }
    assert!(
        stalled.is_finished(),
        "driver {d}: the stalled request did not time out within 6 s of steady traffic"
    );
    let (status, took) = stalled.join().unwrap();
    assert_eq!(status, 504, "driver {d}");
    assert!(
        took < Duration::from_millis(4500),
        "driver {d}: first-byte timeout of 3 s fired after {took:?}"
    );
    assert!(served > 50, "driver {d}: only {served} requests meanwhile");
}

fn sleeps_once_traffic_stops(d: Variant) {
    // traffic stopped: after the budget (10 ms) the shard must sleep, not spin
    std::thread::sleep(Duration::from_millis(100));
    let t0 = shard_ticks();
    std::thread::sleep(Duration::from_millis(1000));
    let idle = shard_ticks().saturating_sub(t0);
    let hz = 100; // USER_HZ on Linux
    assert!(
        idle * 100 / hz < 10,
        "driver {d}: the shard used {idle} ticks (of {hz}) in 1 s without traffic"
    );
}
