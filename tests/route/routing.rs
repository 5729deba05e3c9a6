//! Routing and resilience end to end (issue 9 "Done when"), under both I/O drivers: a gateway
//! in front of one fault-injecting mock per deployment (`ringgate::mock` with a per-process
//! fault plan, as `ringgate mock --fault F`), real sockets on 127.0.0.1 port 0.
//!
//! Requests that reach a deployment are counted twice, independently: by a byte-transparent
//! counting TCP proxy in front of its mock (it parses request heads), and by the gateway's own
//! `ringgate_upstream_attempts_total` series on `/metrics` — the two must agree.
//!
//! Each test runs its two drivers concurrently. Measured numbers (split, failover latency, p2c
//! share) are printed: `cargo test --test routing -- --nocapture`.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{connect, get, read_response, request, variants, Response, Variant, SHARDS};
use ringgate::config::Config;
use ringgate::mock::fault::{Fault, Plan, Rule};
use ringgate::mock::server::MockServer;
use ringgate::mock::{text, Profile};
use ringgate::server::{self, Running};

/// Tokens each request asks for.
const N: u32 = 5;

/// Run `f` once per variant (driver × shard count): for each shard count, the drivers
/// concurrently.
fn both(f: impl Fn(Variant) + Sync) {
    for shards in SHARDS {
        thread::scope(|s| {
            let hs: Vec<_> = variants()
                .filter(|v| v.shards == shards)
                .map(|v| {
                    let f = &f;
                    s.spawn(move || f(v))
                })
                .collect();
            for h in hs {
                if let Err(e) = h.join() {
                    std::panic::resume_unwind(e);
                }
            }
        });
    }
}

/// A mock upstream answering normally, or with `fault` on every request.
fn mock(driver: Variant, fault: Option<&str>) -> MockServer {
    let plan = Plan {
        rules: fault
            .map(|f| vec![Rule::always(Fault::parse(f).unwrap())])
            .unwrap_or_default(),
        seed: 1,
    };
    common::start_mock_faulty(Profile::Instant, driver, plan)
}

/// A byte-transparent TCP proxy that counts the HTTP requests passing through it.
struct Counter {
    addr: SocketAddr,
    n: Arc<AtomicU64>,
}

impl Counter {
    fn new(target: SocketAddr) -> Counter {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let n = Arc::new(AtomicU64::new(0));
        let count = n.clone();
        // The accept thread lives as long as the test process (it blocks in accept).
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let Ok(up) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = c.set_nodelay(true);
                let _ = up.set_nodelay(true);
                let (mut ur, mut cw) = (up.try_clone().unwrap(), c.try_clone().unwrap());
                thread::spawn(move || {
                    let _ = std::io::copy(&mut ur, &mut cw);
                    let _ = cw.shutdown(Shutdown::Write);
                });
                let count = count.clone();
                thread::spawn(move || pump_counting(c, up, &count));
            }
        });
        Counter { addr, n }
    }

    fn get(&self) -> u64 {
        self.n.load(Ordering::SeqCst)
    }
}

/// Copy client → upstream, counting each request head (bodies are Content-Length framed).
fn pump_counting(mut c: TcpStream, mut up: TcpStream, count: &AtomicU64) {
    let mut buf = Vec::new();
    let mut skip = 0usize;
    let mut tmp = [0u8; 16384];
    loop {
        let n = match c.read(&mut tmp) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Count before forwarding: the answer (and the test's next assertion) can otherwise
        // overtake the increment.
        buf.extend_from_slice(&tmp[..n]);
        loop {
            if skip > 0 {
                let k = skip.min(buf.len());
                buf.drain(..k);
                skip -= k;
                if skip > 0 {
                    break;
                }
            }
            let mut hs = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Request::new(&mut hs);
            let Ok(httparse::Status::Complete(head)) = r.parse(&buf) else {
                break;
            };
            let cl = r
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                .unwrap_or(0usize);
            count.fetch_add(1, Ordering::SeqCst);
            buf.drain(..head);
            skip = cl;
        }
        if up.write_all(&tmp[..n]).is_err() {
            break;
        }
    }
    let _ = up.shutdown(Shutdown::Write);
}

/// An upstream that answers its first request with `429` + `Retry-After: 1` and never answers
/// any later one (it holds the connection until the peer closes it).
fn limited_then_stalled() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let seen = seen.clone();
            thread::spawn(move || {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 16384];
                loop {
                    // one whole request (head + Content-Length body)
                    let need = loop {
                        let mut hs = [httparse::EMPTY_HEADER; 64];
                        let mut r = httparse::Request::new(&mut hs);
                        if let Ok(httparse::Status::Complete(head)) = r.parse(&buf) {
                            let cl: usize = r
                                .headers
                                .iter()
                                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                                .unwrap_or(0);
                            if buf.len() >= head + cl {
                                break head + cl;
                            }
                        }
                        match c.read(&mut tmp) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    };
                    buf.drain(..need);
                    if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                        let body = r#"{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":null}}"#;
                        let resp = format!(
                            "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
                             retry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if c.write_all(resp.as_bytes()).is_err() {
                            return;
                        }
                    } else {
                        while matches!(c.read(&mut tmp), Ok(n) if n > 0) {}
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One deployment's upstream: its mock and, optionally, a counting proxy in front.
struct Up {
    mock: Option<MockServer>,
    counter: Option<Counter>,
    /// An upstream that is not a mock (scripted in the test).
    other: Option<SocketAddr>,
}

impl Up {
    fn new(driver: Variant, fault: Option<&str>) -> Up {
        Up {
            mock: Some(mock(driver, fault)),
            counter: None,
            other: None,
        }
    }

    fn counted(driver: Variant, fault: Option<&str>) -> Up {
        let mut u = Up::new(driver, fault);
        u.counter = u.mock.as_ref().map(|m| Counter::new(m.addr));
        u
    }

    /// Where the gateway sends this deployment's requests.
    fn addr(&self) -> SocketAddr {
        match (&self.counter, &self.mock, self.other) {
            (Some(c), _, _) => c.addr,
            (None, Some(m), _) => m.addr,
            (None, None, Some(a)) => a,
            (None, None, None) => unreachable!(),
        }
    }

    /// Requests that reached the mock (through the counting proxy).
    fn requests(&self) -> u64 {
        self.counter.as_ref().expect("not counted").get()
    }
}

/// A gateway and the upstreams behind it, stopped on drop (gateway first).
struct Net {
    addr: SocketAddr,
    gw: Option<Running>,
    ups: Vec<Up>,
}

impl Net {
    /// `providers`: (name, kind, upstream); `routing`: lines of `[routing]`; `models`: the
    /// `[[model]]` tables.
    fn start(v: Variant, routing: &str, providers: Vec<(&str, &str, Up)>, models: &str) -> Net {
        let Variant { driver, shards } = v;
        let mut text = format!(
            r#"
[server]
listen = "127.0.0.1:0"
shards = {shards}
pin = false
driver = "{driver}"

[upstream]
first_byte_timeout_ms = 3000
total_timeout_ms = 10000

[routing]
{routing}
"#
        );
        let mut ups = Vec::new();
        for (name, kind, up) in providers {
            let base = match kind {
                "anthropic" => format!("http://{}", up.addr()),
                _ => format!("http://{}/v1", up.addr()),
            };
            text.push_str(&format!(
                "\n[[provider]]\nname = \"{name}\"\nkind = \"{kind}\"\nbase_url = \"{base}\"\n"
            ));
            ups.push(up);
        }
        text.push_str(models);
        let cfg = Config::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        let gw = server::start(cfg).unwrap();
        Net {
            addr: gw.addr,
            gw: Some(gw),
            ups,
        }
    }

    fn up(&self, i: usize) -> &Up {
        &self.ups[i]
    }

    /// Sum of the `/metrics` series `name` over lines whose labels contain `label`.
    fn metric(&self, name: &str, label: &str) -> u64 {
        let r = request(self.addr, &get("/metrics"));
        r.text()
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Poll `metric(name, label)` until it equals `want`, for up to 10 s: at more than one shard
    /// a scrape has the other shards' numbers as they last published them (once a second).
    fn wait_metric(&self, name: &str, label: &str, want: u64, what: impl std::fmt::Display) {
        let t0 = Instant::now();
        loop {
            let got = self.metric(name, label);
            if got == want {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{what}: {name} {{{label}}} = {got}, want {want}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `ringgate_upstream_attempts_total` of deployment `label` (`provider/upstream_model`) once
    /// it equals `want` (as `wait_metric`).
    fn wait_attempts(&self, label: &str, want: u64, what: impl std::fmt::Display) {
        let label = format!("deployment=\"{label}\"");
        self.wait_metric("ringgate_upstream_attempts_total", &label, want, what);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(g) = self.gw.take() {
            g.stop();
        }
        for u in self.ups.drain(..) {
            if let Some(m) = u.mock {
                m.stop();
            }
        }
    }
}

/// A keep-alive client connection (reconnects after the gateway closed one).
struct Client {
    addr: SocketAddr,
    s: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Client {
    fn new(addr: SocketAddr) -> Client {
        Client {
            addr,
            s: None,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, raw: &[u8]) -> Response {
        let s = self.s.get_or_insert_with(|| connect(self.addr));
        s.write_all(raw).unwrap();
        let r = read_response(s, &mut self.buf).expect("no response");
        if r.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            self.s = None;
            self.buf.clear();
        }
        r
    }

    fn chat(&mut self, model: &str, stream: bool) -> Response {
        self.send(&chat(model, stream))
    }
}

fn chat(model: &str, stream: bool) -> Vec<u8> {
    common::post(
        "/v1/chat/completions",
        &format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{N},"stream":{stream}}}"#
        ),
    )
}

fn provider(r: &Response) -> &str {
    r.header("x-ringgate-provider").unwrap_or("<none>")
}

fn attempts(r: &Response) -> u32 {
    r.header("x-ringgate-attempts")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A complete, correct non-stream Chat answer.
fn assert_answer(r: &Response, what: impl std::fmt::Display) {
    assert_eq!(r.status, 200, "{what}: {}", r.text());
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        text::tokens(0, N),
        "{what}"
    );
}

fn two_deployments(lb: &str, w: (u32, u32)) -> String {
    format!(
        r#"
[[model]]
name = "gpt-4o-mini"
lb = "{lb}"
deployments = [
  {{ provider = "a", weight = {} }},
  {{ provider = "b", weight = {} }},
]
"#,
        w.0, w.1
    )
}

#[test]
fn weighted_3_to_1_splits_2000_requests_within_5_percent() {
    both(|d| {
        let net = Net::start(
            d,
            "",
            vec![
                ("a", "openai", Up::counted(d, None)),
                ("b", "openai", Up::counted(d, None)),
            ],
            &two_deployments("weighted", (3, 1)),
        );
        // Four concurrent keep-alive clients, 500 requests each.
        let counts: Vec<(u64, u64)> = thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut c = Client::new(net.addr);
                        let (mut a, mut b) = (0, 0);
                        for _ in 0..500 {
                            let r = c.chat("gpt-4o-mini", false);
                            assert_answer(&r, d);
                            assert_eq!(attempts(&r), 1, "{d}");
                            match provider(&r) {
                                "a" => a += 1,
                                "b" => b += 1,
                                p => panic!("{d}: provider {p}"),
                            }
                        }
                        (a, b)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let a: u64 = counts.iter().map(|c| c.0).sum();
        let b: u64 = counts.iter().map(|c| c.1).sum();
        let share = a as f64 / (a + b) as f64;
        eprintln!("{d}: weighted 3:1 over 2000 → a {a}, b {b} (a share {share:.3})");
        assert_eq!(a + b, 2000);
        assert!((share - 0.75).abs() <= 0.05, "{d}: a share {share}");
        // The headers, the upstreams and the gateway's metrics agree.
        assert_eq!(net.up(0).requests(), a, "{d}");
        assert_eq!(net.up(1).requests(), b, "{d}");
        net.wait_attempts("a/gpt-4o-mini", a, d);
        net.wait_attempts("b/gpt-4o-mini", b, d);
    });
}

#[test]
fn a_deployment_answering_500_gets_failures_plus_probes_while_clients_see_200() {
    const FAILURES: u64 = 3;
    const COOLDOWN_MS: u64 = 400;
    both(|d| {
        let net = Net::start(
            d,
            &format!("breaker = {{ failures = {FAILURES}, cooldown_ms = {COOLDOWN_MS} }}"),
            vec![
                ("a", "openai", Up::counted(d, Some("500"))),
                ("b", "openai", Up::counted(d, None)),
            ],
            &two_deployments("weighted", (1, 1)),
        );
        let mut c = Client::new(net.addr);
        let start = Instant::now();
        let mut n = 0u64;
        let mut failed_over = 0u64;
        while start.elapsed() < Duration::from_millis(1500) {
            let r = c.chat("gpt-4o-mini", false);
            assert_answer(&r, d);
            assert_eq!(provider(&r), "b", "{d}");
            match attempts(&r) {
                1 => {}
                2 => failed_over += 1,
                k => panic!("{d}: x-ringgate-attempts {k}"),
            }
            n += 1;
            thread::sleep(Duration::from_millis(5));
        }
        let elapsed = start.elapsed();
        let hit = net.up(0).requests();
        // After `failures` the breaker opens; each cooldown then lets one probe through.
        let probes = elapsed.as_millis() as u64 / COOLDOWN_MS;
        eprintln!(
            "{d}: 500-deployment got {hit} of {n} requests in {elapsed:?} \
             (bound {FAILURES} + {probes} probes); clients saw only 200s"
        );
        assert!(hit <= FAILURES + probes, "{d}: {hit} requests reached it");
        assert!(hit > FAILURES, "{d}: no half-open probe in {elapsed:?}");
        assert_eq!(
            failed_over, hit,
            "{d}: every failed attempt was retried on b"
        );
        assert_eq!(net.up(1).requests(), n, "{d}");
        net.wait_attempts("a/gpt-4o-mini", hit, d);
        // (polled: at two shards the other shard's count shows once it published)
        let t0 = Instant::now();
        while net.metric("ringgate_breaker_opens_total", "deployment=\"a/") == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{d}: no breaker opened"
            );
            thread::sleep(Duration::from_millis(20));
        }
    });
}

#[test]
fn a_429_with_retry_after_fails_over_and_cools_the_key() {
    both(|d| {
        let net = Net::start(
            d,
            "",
            vec![
                ("a", "openai", Up::counted(d, Some("429:retry-after=2"))),
                ("b", "openai", Up::counted(d, None)),
            ],
            // Round-robin: without the cooldown every other request would go to a.
            &two_deployments("weighted", (1, 1)),
        );
        let mut c = Client::new(net.addr);
        let t0 = Instant::now();
        let r = c.chat("gpt-4o-mini", false);
        assert_answer(&r, d);
        assert_eq!((provider(&r), attempts(&r)), ("b", 2), "{d}");
        assert_eq!(net.up(0).requests(), 1, "{d}");
        // During the 2 s cooldown a is not touched.
        let mut n = 0;
        while t0.elapsed() < Duration::from_millis(1500) {
            let r = c.chat("gpt-4o-mini", false);
            assert_answer(&r, d);
            assert_eq!((provider(&r), attempts(&r)), ("b", 1), "{d}");
            n += 1;
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(net.up(0).requests(), 1, "{d}: a was touched while cooling");
        net.wait_metric("ringgate_key_cooldowns_total", "provider=\"a\"", 1, d);
        // Once the cooldown is over, a is tried again (and cools again).
        thread::sleep(Duration::from_millis(2200).saturating_sub(t0.elapsed()));
        for _ in 0..2 {
            assert_answer(&c.chat("gpt-4o-mini", false), d);
        }
        assert_eq!(
            net.up(0).requests(),
            2,
            "{d}: a not retried after its cooldown"
        );
        eprintln!("{d}: 429 → failover; {n} requests during the 2 s cooldown, none reached a");
    });
}

#[test]
fn a_stalled_deployment_fails_over_after_the_first_byte_timeout() {
    const TIMEOUT_MS: u64 = 300;
    both(|d| {
        let net = Net::start(
            d,
            &format!("first_byte_timeout_ms = {TIMEOUT_MS}"),
            vec![
                ("a", "openai", Up::new(d, Some("stall"))),
                ("b", "openai", Up::counted(d, None)),
            ],
            &two_deployments("weighted", (1, 1)),
        );
        let mut c = Client::new(net.addr);
        let mut lat = Vec::new();
        // Round-robin: requests 1, 3, 5 go to a first (the breaker needs 5 failures).
        for i in 0..6 {
            let t = Instant::now();
            let r = c.chat("gpt-4o-mini", i % 4 == 2);
            let el = t.elapsed();
            assert_eq!(r.status, 200, "{d}: {}", r.text());
            assert_eq!(provider(&r), "b", "{d}");
            if attempts(&r) == 2 {
                lat.push(el);
                assert!(
                    el >= Duration::from_millis(TIMEOUT_MS)
                        && el < Duration::from_millis(TIMEOUT_MS + 5000),
                    "{d}: failover took {el:?}"
                );
            }
        }
        eprintln!("{d}: stall → failover after first_byte_timeout {TIMEOUT_MS} ms: {lat:?}");
        assert_eq!(lat.len(), 3, "{d}");
        net.wait_metric(
            "ringgate_upstream_failures_total",
            "reason=\"first-byte-timeout\"",
            3,
            d,
        );
    });
}

#[test]
fn fallback_to_another_dialect_when_every_deployment_fails() {
    both(|d| {
        let net = Net::start(
            d,
            "",
            vec![
                ("a", "openai", Up::counted(d, Some("500"))),
                ("a2", "openai-compatible", Up::counted(d, Some("500"))),
                ("b", "anthropic", Up::counted(d, None)),
            ],
            r#"
[[model]]
name = "gpt-4o-mini"
deployments = [{ provider = "a" }, { provider = "a2" }]
fallbacks = ["claude-haiku"]
max_attempts = 3

[[model]]
name = "claude-haiku"
provider = "b"
upstream_model = "claude-3-5-haiku-latest"
"#,
        );
        let mut c = Client::new(net.addr);
        let r = c.chat("gpt-4o-mini", false);
        assert_answer(&r, d);
        assert_eq!((provider(&r), attempts(&r)), ("b", 3), "{d}");
        let r = c.chat("gpt-4o-mini", true);
        assert_eq!(r.status, 200, "{d}");
        let (content, _, done) = common::sse_content(&r.body);
        assert!(done, "{d}: {}", r.text());
        assert_eq!(content, text::tokens(0, N), "{d}");
        assert_eq!((provider(&r), attempts(&r)), ("b", 3), "{d}");
        assert_eq!(
            (
                net.up(0).requests(),
                net.up(1).requests(),
                net.up(2).requests()
            ),
            (2, 2, 2),
            "{d}"
        );
        net.wait_metric(
            "ringgate_fallbacks_total",
            "fallback=\"claude-haiku\"",
            2,
            "{d}",
        );
    });
}

#[test]
fn a_stream_cut_mid_way_ends_with_an_error_event_and_is_not_retried() {
    both(|d| {
        let net = Net::start(
            d,
            "",
            vec![
                ("a", "openai", Up::counted(d, Some("cut-after=2"))),
                ("b", "openai", Up::counted(d, None)),
            ],
            &two_deployments("weighted", (1, 1)),
        );
        // Fresh connection: the gateway may close it after the error-ended stream.
        let r = request(net.addr, &chat("gpt-4o-mini", true));
        assert_eq!(r.status, 200, "{d}");
        assert_eq!((provider(&r), attempts(&r)), ("a", 1), "{d}");
        let text = r.text();
        let events: Vec<&str> = text
            .split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .collect();
        let error_at = events
            .iter()
            .position(|e| {
                e.strip_prefix("data: ")
                    .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
                    .is_some_and(|v| v["error"]["message"].is_string())
            })
            .unwrap_or_else(|| panic!("{d}: no error event in {text:?}"));
        assert!(
            error_at >= 2,
            "{d}: the first events were relayed: {text:?}"
        );
        assert!(
            events[error_at + 1..].iter().all(|e| *e == "data: [DONE]"),
            "{d}: {text:?}"
        );
        assert_eq!(net.up(0).requests(), 1, "{d}");
        assert_eq!(net.up(1).requests(), 0, "{d}: the cut stream was retried");
        net.wait_attempts("b/gpt-4o-mini", 0, d);
    });
}

#[test]
fn p2c_moves_traffic_away_from_a_slow_deployment() {
    both(|d| {
        let net = Net::start(
            d,
            "",
            vec![
                ("slow", "openai", Up::new(d, Some("slow-first-byte=50"))),
                ("fast", "openai", Up::new(d, None)),
            ],
            r#"
[[model]]
name = "gpt-4o-mini"
lb = "p2c"
deployments = [{ provider = "slow" }, { provider = "fast" }]
"#,
        );
        let mut c = Client::new(net.addr);
        let mut slow = 0;
        for _ in 0..400 {
            let r = c.chat("gpt-4o-mini", false);
            assert_answer(&r, d);
            if provider(&r) == "slow" {
                slow += 1;
            }
        }
        let share = slow as f64 / 400.0;
        eprintln!("{d}: p2c, slow-first-byte=50 vs 0: slow got {slow}/400 ({share:.3})");
        assert!(share < 0.25, "{d}: slow share {share}");
        net.wait_attempts("slow/gpt-4o-mini", slow, d);
    });
}

#[test]
fn a_one_deployment_model_relays_its_500_after_one_attempt() {
    both(|d| {
        let net = Net::start(
            d,
            "max_attempts = 3",
            vec![("a", "openai", Up::counted(d, Some("500")))],
            "\n[[model]]\nname = \"gpt-4o-mini\"\nprovider = \"a\"\n",
        );
        let r = request(net.addr, &chat("gpt-4o-mini", false));
        assert_eq!(r.status, 500, "{d}: {}", r.text());
        assert_eq!((provider(&r), attempts(&r)), ("a", 1), "{d}");
        assert_eq!(
            net.up(0).requests(),
            1,
            "{d}: the one deployment was tried again"
        );
    });
}

/// Found through the fault matrix (its concurrent 429 cells got 504s): after a 429 (or finding
/// the only key cooling) the plan waited for the key even when that left the attempt after the
/// wait almost no time before the deadline, so the provider's 429 became a 504 once the
/// client's time was spent. Now a cooldown is waited on only if the attempt after it gets its
/// whole first-byte timeout; else the client gets the 429 (+ Retry-After) at once.
#[test]
fn a_cooling_key_is_not_waited_on_when_no_whole_attempt_fits_before_the_deadline() {
    both(|d| {
        let up = Up {
            mock: None,
            counter: None,
            other: Some(limited_then_stalled()),
        };
        let net = Net::start(
            d,
            "timeout_ms = 1200\nfirst_byte_timeout_ms = 500",
            vec![("a", "openai", up)],
            "\n[[model]]\nname = \"gpt-4o-mini\"\nprovider = \"a\"\n",
        );
        // The key cools for 1 s; waiting would leave 0.2 s of the 1.2 s deadline: the
        // upstream's 429 is relayed, then a request during the cooldown gets 429 at once.
        let r = request(net.addr, &chat("gpt-4o-mini", false));
        assert_eq!((r.status, r.header("retry-after")), (429, Some("1")), "{d}");
        let t = Instant::now();
        let r = request(net.addr, &chat("gpt-4o-mini", false));
        let el = t.elapsed();
        assert_eq!(r.status, 429, "{d}: after {el:?}: {}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"), "{d}");
        assert_eq!(r.json()["error"]["type"], "rate_limit_error", "{d}");
        assert!(el < Duration::from_millis(500), "{d}: waited {el:?}");
    });
}
