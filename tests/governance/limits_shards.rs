//! Per-key limits are the key's, whatever shard a connection lands on: real sockets on
//! 127.0.0.1 port 0, `shards` = 2 and 4, every request on a fresh connection (SO_REUSEPORT
//! spreads connections over the shards by their address hash), both I/O drivers. `rpm`, `tpm`,
//! `max_in_flight` and budgets must hold exactly for the process, and the `x-ratelimit-*`
//! headers must give the key's own limit and what is left of it.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use ringgate::config::Config;
use ringgate::mock::Profile;
use ringgate::server::{self, Running};

const SECRET: &str = "rg-test-shards-7d6c5b4a39281706f5e4d3c2";
const SHARDS: [usize; 2] = [2, 4];

/// A gateway config with `shards`, one model in front of `upstream` (`{mock}` for the mock),
/// `model_extra` in the model, and one key with `key_extra`.
fn config(
    shards: usize,
    driver: &str,
    upstream: &str,
    model_extra: &str,
    key_extra: &str,
) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"

[upstream]
first_byte_timeout_ms = 20000

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{upstream}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"
{model_extra}

[[key]]
name = "team-a"
key_sha256 = "{}"
{key_extra}
"#,
        key_digest_hex(SECRET)
    )
}

fn start(text: &str) -> Running {
    let cfg = Config::parse(text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    server::start(cfg).unwrap()
}

fn chat(body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {SECRET}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const CHAT: &str =
    r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;

/// Every (driver, shards) pair.
fn each(f: impl Fn(&str, usize)) {
    for d in DRIVERS {
        for n in SHARDS {
            f(d, n);
        }
    }
}

#[test]
fn rpm_5_admits_exactly_5_whatever_the_shard() {
    each(|d, n| {
        let st = Stack::with_config(
            start_mock(Profile::Instant, d),
            &config(n, d, "{mock}", "", "rpm = 5"),
        );
        let mut statuses = Vec::new();
        for i in 0..16 {
            // a fresh connection each time: they land on every shard
            let r = request(st.addr, &chat(CHAT));
            statuses.push(r.status);
            let what = format!("{d} shards={n} request {}: {}", i + 1, r.text());
            assert_eq!(r.header("x-ratelimit-limit-requests"), Some("5"), "{what}");
            let left = 4u64.saturating_sub(i);
            assert_eq!(
                r.header("x-ratelimit-remaining-requests"),
                Some(left.to_string().as_str()),
                "{what}"
            );
            if r.status == 429 {
                assert!(r.text().contains("5 requests per minute"), "{what}");
                let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
                assert!((1..=60).contains(&retry), "{what}");
            }
        }
        let mut want = vec![200; 5];
        want.resize(16, 429);
        assert_eq!(statuses, want, "{d} shards={n}");
        // and the refusals came from more than one shard (the connections did spread)
        assert!(shards_refusing(st.addr, 11) >= 2, "{d} shards={n}");
    });
}

/// How many shards refused key requests, once `total` refusals are published (shards publish
/// their metrics about once a second; waits up to 10 s).
fn shards_refusing(addr: SocketAddr, total: u64) -> usize {
    let name = "ringgate_key_rejections_total{shard=";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = request(addr, &get("/metrics")).text();
        let rows: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        if rows.iter().sum::<u64>() >= total || Instant::now() > deadline {
            return rows.iter().filter(|&&v| v > 0).count();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn rpm_1_admits_one_and_never_says_0_requests() {
    each(|d, n| {
        let st = Stack::with_config(
            start_mock(Profile::Instant, d),
            &config(n, d, "{mock}", "", "rpm = 1"),
        );
        let statuses: Vec<u16> = (0..12)
            .map(|_| {
                let r = request(st.addr, &chat(CHAT));
                let text = r.text();
                assert!(!text.contains("0 requests"), "{d} shards={n}: {text}");
                if r.status == 429 {
                    assert!(text.contains("1 request per minute"), "{d} {n}: {text}");
                }
                r.status
            })
            .collect();
        let mut want = vec![200];
        want.resize(12, 429);
        assert_eq!(statuses, want, "{d} shards={n}");
    });
}

/// Read one response head from `s` (the body is left on the wire): its status.
fn read_head(s: &mut TcpStream) -> u16 {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut b).expect("a response head");
        assert!(n > 0, "closed before a head");
        buf.extend_from_slice(&b[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// A fake OpenAI upstream whose streams send their head and one event at once and finish only
/// when `release` is set (or after 30 s).
fn held_streams(release: Arc<AtomicBool>) -> SocketAddr {
    fake_upstream(move |s, _, _| {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        let ev = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n";
        let chunk = |t: &str| format!("{:x}\r\n{t}\r\n", t.len());
        if s.write_all(format!("{head}{}", chunk(ev)).as_bytes())
            .is_err()
        {
            return false;
        }
        let until = Instant::now() + Duration::from_secs(30);
        while !release.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let end = format!("{}0\r\n\r\n", chunk("data: [DONE]\n\n"));
        s.write_all(end.as_bytes()).is_ok()
    })
}

#[test]
fn max_in_flight_2_admits_two_streams_and_refuses_the_third_on_every_shard() {
    each(|d, n| {
        let release = Arc::new(AtomicBool::new(false));
        let up = held_streams(release.clone()).to_string();
        let gw = start(&config(n, d, &up, "", "max_in_flight = 2"));
        let stream =
            r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        // two streams, each on its own connection, held open by the upstream
        let held: Vec<TcpStream> = (0..2)
            .map(|i| {
                let mut s = connect(gw.addr);
                s.write_all(&chat(stream)).unwrap();
                assert_eq!(read_head(&mut s), 200, "{d} shards={n}: stream {}", i + 1);
                s
            })
            .collect();
        // a third, on fresh connections (every shard): refused while the two are in flight
        for _ in 0..12 {
            let r = request(gw.addr, &chat(CHAT));
            assert_eq!(r.status, 429, "{d} shards={n}: {}", r.text());
            assert!(
                r.text().contains("2 requests in flight is the limit"),
                "{d} shards={n}: {}",
                r.text()
            );
        }
        // the streams end: their slots come back
        release.store(true, Ordering::SeqCst);
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(10);
        let ok = loop {
            let r = request(gw.addr, &chat(CHAT));
            if r.status == 200 || Instant::now() > deadline {
                break r.status;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(ok, 200, "{d} shards={n}");
        gw.stop();
    });
}

/// A fake OpenAI upstream answering every chat with `prompt` + `completion` tokens of usage,
/// after waiting for `release` (set: at once; at most 30 s); `arrived` counts requests.
fn usage_upstream(
    prompt: u64,
    completion: u64,
    release: Arc<AtomicBool>,
    arrived: Arc<AtomicUsize>,
) -> SocketAddr {
    fake_upstream(move |s, _, _| {
        arrived.fetch_add(1, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(30);
        while !release.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let body = format!(
            r#"{{"id":"c","object":"chat.completion","created":0,"model":"gpt-4o-mini","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{}}}}}"#,
            prompt + completion
        );
        s.write_all(&json_response(&body)).is_ok()
    })
}

#[test]
fn tpm_is_exact_for_the_key_across_shards() {
    each(|d, n| {
        let release = Arc::new(AtomicBool::new(true));
        let up = usage_upstream(5, 20, release, Arc::default()).to_string();
        let gw = start(&config(n, d, &up, "", "tpm = 100"));
        let body = r#"{"model":"gpt-4o-mini","messages":[],"max_tokens":20}"#;
        let est = body.len() as u64 / 4 + 20;
        assert!(est > 25 && est <= 50, "estimate {est}");
        // each request reserves `est` and is reconciled to 25 used: admitted while
        // 25 × done + est <= 100
        let fit = (0..).take_while(|k| 25 * k + est <= 100).count();
        let mut statuses = Vec::new();
        for i in 0..10u64 {
            let r = request(gw.addr, &chat(body));
            let what = format!("{d} shards={n} request {}: {}", i + 1, r.text());
            assert_eq!(r.header("x-ratelimit-limit-tokens"), Some("100"), "{what}");
            let left: u64 = r
                .header("x-ratelimit-remaining-tokens")
                .unwrap()
                .parse()
                .unwrap();
            if r.status == 200 {
                assert_eq!(left, 100 - 25 * i - est, "{what}");
            } else {
                assert_eq!(r.status, 429, "{what}");
                assert!(r.text().contains("100 tokens per minute"), "{what}");
                assert_eq!(left, 100 - 25 * fit as u64, "{what}");
            }
            statuses.push(r.status);
        }
        let mut want = vec![200; fit];
        want.resize(10, 429);
        assert_eq!(statuses, want, "{d} shards={n}");
        gw.stop();
    });
}

#[test]
fn a_small_budget_with_40_concurrent_requests_overshoots_by_at_most_one_estimate() {
    each(|d, n| {
        let release = Arc::new(AtomicBool::new(false));
        let arrived = Arc::new(AtomicUsize::new(0));
        // 100 output tokens at 10 USD per 1M: 0.001 USD per request, and its estimate (the
        // prompt is free) is the same 0.001 USD
        let up = usage_upstream(0, 100, release.clone(), arrived.clone()).to_string();
        let gw = start(&config(
            n,
            d,
            &up,
            "price_input_per_mtok = 0.0\nprice_output_per_mtok = 10.0",
            "budget_usd = 0.005",
        ));
        let (estimate, budget) = (1_000_000u64, 5_000_000u64);
        let body = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":100}"#;
        let go = Arc::new(Barrier::new(40));
        let answered = Arc::new(AtomicUsize::new(0));
        let addr = gw.addr;
        let clients: Vec<_> = (0..40)
            .map(|_| {
                let (go, answered) = (go.clone(), answered.clone());
                std::thread::spawn(move || {
                    go.wait();
                    let mut s = connect(addr);
                    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                    s.write_all(&chat(body)).unwrap();
                    let mut buf = Vec::new();
                    let r = read_response(&mut s, &mut buf).expect("a response");
                    if r.status != 200 {
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        // the upstream holds every answer until each of the 40 was refused or reached it:
        // they are all in flight at once
        let deadline = Instant::now() + Duration::from_secs(30);
        while answered.load(Ordering::SeqCst) + arrived.load(Ordering::SeqCst) < 40
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        release.store(true, Ordering::SeqCst);
        let rs: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        let ok = rs.iter().filter(|r| r.status == 200).count() as u64;
        for r in rs.iter().filter(|r| r.status != 200) {
            assert_eq!(r.status, 429, "{d} shards={n}: {}", r.text());
            assert_eq!(
                r.json()["error"]["type"],
                "insufficient_quota",
                "{}",
                r.text()
            );
        }
        let spent: u64 = gw.spend.snapshot().iter().map(|r| r.spend_nanos).sum();
        assert_eq!(spent, ok * estimate, "{d} shards={n}");
        assert!(
            spent <= budget + estimate,
            "{d} shards={n}: {ok} admitted, {spent} nano-USD spent of a {budget} budget"
        );
        assert!(ok >= 5, "{d} shards={n}: the budget admits five: {ok}");
        // spent: the next request is refused on its head
        let r = request(gw.addr, &chat(body));
        assert_eq!(r.status, 429, "{d} shards={n}: {}", r.text());
        gw.stop();
    });
}
