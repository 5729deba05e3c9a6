//! Engine-aware routing (issue 13): recorded engine pages parse (and malformed / partial ones
//! do not), `lb = "load"` sends new requests to the idle engine, a shared system prompt sticks
//! to one engine, all engines full → 429 + Retry-After with nothing sent upstream, a dead
//! engine is skipped within one poll interval. Real sockets on 127.0.0.1 port 0: fake engines
//! with a fixed metrics page (counting what reaches them) and the engine simulator.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{post, read_request, request, Response};
use ringgate::config::Config;
use ringgate::engine::signal::{normalise, EngineKind, Sample};
use ringgate::mock::engine::{EngineKind as SimKind, EngineSpec};
use ringgate::server;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/engines/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn recorded_pages_normalise() {
    let s = |kind, name, slots| normalise(kind, &fixture(name), slots);
    let v = s(EngineKind::Vllm, "vllm.txt", false).unwrap();
    assert_eq!((v.waiting, v.running), (3, 8));
    assert_eq!(v.kv, Some(0.4375), "the busiest engine's KV");
    let v0 = s(EngineKind::Vllm, "vllm-v0.txt", false).unwrap();
    assert_eq!(
        v0,
        Sample {
            waiting: 0,
            running: 12,
            kv: Some(0.9123),
            slots: 0,
        },
        "older builds: gpu_cache_usage_perc"
    );
    let g = s(EngineKind::Sglang, "sglang.txt", false).unwrap();
    assert_eq!((g.waiting, g.running, g.kv), (2, 5, Some(0.28)));
    // llama.cpp: pages recorded from a real llama-server (-np 2; llamacpp/README.md)
    let ll = |name: &str, slots| normalise(EngineKind::Llamacpp, &llama_fixture(name), slots);
    for (page, busy) in [
        ("slots-idle-fresh.json", 0),
        ("slots-busy.json", 2),
        ("slots-queued.json", 2),
        ("slots-idle.json", 0),
    ] {
        let sl = ll(page, true).unwrap();
        assert_eq!(
            (sl.waiting, sl.running, sl.kv, sl.slots),
            (0, busy, None, 2),
            "{page}: busy slots, no queue (the page does not list it), no KV"
        );
    }
    for (page, waiting, running) in [
        ("metrics-idle.txt", 0, 0),
        ("metrics-busy.txt", 0, 2),
        ("metrics-queued.txt", 1, 2),
        ("metrics-idle-after.txt", 0, 0),
    ] {
        let l = ll(page, false).unwrap();
        assert_eq!(
            (l.waiting, l.running, l.kv),
            (waiting, running, None),
            "{page}"
        );
    }
    // the engine's 501s (started without --metrics, with --no-slots) are no signal; the
    // poller sees their status first and routes the engine by in-flight (engine::poller)
    for (page, slots) in [("metrics-501.json", false), ("slots-501.json", true)] {
        assert!(ll(page, slots).is_err());
    }
    let t = s(EngineKind::Tgi, "tgi.txt", false).unwrap();
    assert_eq!((t.waiting, t.running, t.kv), (7, 16, None));
    // malformed and partial pages are no signal (the engine counts as down), never a panic
    for kind in [
        EngineKind::Vllm,
        EngineKind::Sglang,
        EngineKind::Llamacpp,
        EngineKind::Tgi,
    ] {
        assert!(s(kind, "malformed.txt", false).is_err(), "{kind:?}");
    }
    assert!(s(EngineKind::Vllm, "vllm-partial.txt", false).is_err());
    assert!(s(EngineKind::Llamacpp, "slots-malformed.json", true).is_err());
    assert!(ll("health.json", true).is_err());
    assert!(s(EngineKind::Llamacpp, "vllm.txt", true).is_err());
    assert!(
        s(EngineKind::Vllm, "sglang.txt", false).is_err(),
        "another engine's page"
    );
    // a page cut anywhere never panics and never invents a value
    let page = fixture("vllm.txt");
    for cut in 0..page.len() {
        if let Ok(v) = normalise(EngineKind::Vllm, &page[..cut], false) {
            assert_eq!(v.waiting, 3);
        }
    }
}

/// A fake engine: `GET /metrics` answers `page`; any POST gets a Chat completion and is
/// counted.
struct Fake {
    addr: SocketAddr,
    page: Arc<Mutex<String>>,
    posts: Arc<AtomicUsize>,
}

fn vllm_page(waiting: u32, running: u32, kv: f64) -> String {
    format!(
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {waiting}.0\nvllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} {running}.0\nvllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} {kv}\n"
    )
}

impl Fake {
    fn start(page: String) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let page = Arc::new(Mutex::new(page));
        let posts = Arc::new(AtomicUsize::new(0));
        let (p, n) = (page.clone(), posts.clone());
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                let (p, n) = (p.clone(), n.clone());
                std::thread::spawn(move || serve(s, &p, &n));
            }
        });
        Fake { addr, page, posts }
    }

    fn posts(&self) -> usize {
        self.posts.load(Ordering::SeqCst)
    }
}

fn serve(mut s: TcpStream, page: &Mutex<String>, posts: &AtomicUsize) {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    while let Some(raw) = read_request(&mut s) {
        let (ct, body) = if raw.starts_with(b"GET /metrics") {
            ("text/plain; version=0.0.4", page.lock().unwrap().clone())
        } else {
            posts.fetch_add(1, Ordering::SeqCst);
            (
                "application/json",
                r#"{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#.to_string(),
            )
        };
        let out = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
    let _ = s.read(&mut [0u8; 1]);
}

fn gateway_for(
    shards: usize,
    engines: &[(SocketAddr, &str)],
    model_extra: &str,
) -> server::Running {
    gateway_with(shards, engines, model_extra, "")
}

fn gateway_with(
    shards: usize,
    engines: &[(SocketAddr, &str)],
    model_extra: &str,
    top: &str,
) -> server::Running {
    gateway_on(engines, model_extra, top, shards, "auto")
}

/// As `gateway_with`, at `shards` shards on I/O driver `driver`.
fn gateway_on(
    engines: &[(SocketAddr, &str)],
    model_extra: &str,
    top: &str,
    shards: usize,
    driver: &str,
) -> server::Running {
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\npin = false\ndriver = \"{driver}\"\n\n[routing]\nmax_attempts = 1\n{top}\n",
    );
    let mut deps = Vec::new();
    for (i, (addr, kind)) in engines.iter().enumerate() {
        text.push_str(&format!(
            "\n[[provider]]\nname = \"gpu{i}\"\nkind = \"openai-compatible\"\nengine = \"{kind}\"\nbase_url = \"http://{addr}/v1\"\npoll_ms = 50\n"
        ));
        deps.push(format!("{{ provider = \"gpu{i}\" }}"));
    }
    text.push_str(&format!(
        "\n[[model]]\nname = \"llama-3.1-8b\"\ndeployments = [ {} ]\nlb = \"load\"\n{model_extra}\n",
        deps.join(", ")
    ));
    let cfg = Config::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    server::start(cfg).unwrap()
}

/// Wait until the gateway has a good poll of every engine (its own metrics say so).
fn wait_polled(gw: SocketAddr, n: usize) {
    let t0 = Instant::now();
    loop {
        let m = request(gw, &common::get("/metrics")).text();
        let up = m
            .lines()
            .filter(|l| l.starts_with("ringgate_engine_polls_total") && l.contains("result=\"ok\""))
            .filter(|l| {
                l.rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    > 0
            })
            .count();
        if up == n {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "engines never polled:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn chat(gw: SocketAddr, system: &str, user: &str) -> Response {
    let body = format!(
        r#"{{"model":"llama-3.1-8b","max_tokens":2,"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{user}"}}]}}"#
    );
    request(gw, &post("/v1/chat/completions", &body))
}

#[test]
fn new_requests_go_to_the_idle_engine() {
    common::shard_counts().for_each(new_requests_go_to_the_idle_engine_at);
}

fn new_requests_go_to_the_idle_engine_at(shards: usize) {
    let busy = Fake::start(vllm_page(200, 8, 0.97));
    let idle = Fake::start(vllm_page(0, 0, 0.0));
    let gw = gateway_for(shards, &[(busy.addr, "vllm"), (idle.addr, "vllm")], "");
    wait_polled(gw.addr, 2);
    for i in 0..100 {
        let r = chat(gw.addr, "You are helpful.", &format!("question {i}"));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let (b, i) = (busy.posts(), idle.posts());
    assert_eq!(b + i, 100);
    assert!(i >= 90, "idle engine got {i} of 100, the busy one {b}");
    // the signals show in the gateway's metrics
    let m = request(gw.addr, &common::get("/metrics")).text();
    assert!(
        m.contains("ringgate_engine_waiting{provider=\"gpu0\",engine=\"vllm\"} 200"),
        "{m}"
    );
    gw.stop();
}

#[test]
fn a_shared_system_prompt_sticks_to_one_engine_while_both_are_light() {
    common::shard_counts()
        .for_each(a_shared_system_prompt_sticks_to_one_engine_while_both_are_light_at);
}

fn a_shared_system_prompt_sticks_to_one_engine_while_both_are_light_at(shards: usize) {
    let mut spec = EngineSpec::new(SimKind::Vllm, 8);
    spec.tpot = Duration::from_millis(1);
    let sims: Vec<_> = (0..2)
        .map(|_| {
            ringgate::mock::server::start_engine("127.0.0.1:0".parse().unwrap(), spec.clone())
                .unwrap()
        })
        .collect();
    let gw = gateway_for(
        shards,
        &[(sims[0].addr, "vllm"), (sims[1].addr, "vllm")],
        "max_waiting = 8",
    );
    wait_polled(gw.addr, 2);
    let system = "You are the support assistant of ACME. ".repeat(60);
    let mut by = [0usize; 2];
    for i in 0..30 {
        let r = chat(
            gw.addr,
            &system,
            &format!("my order {i} is late, what now?"),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let p = r.header("x-ringgate-provider").unwrap();
        by[usize::from(p == "gpu1")] += 1;
    }
    assert!(
        by.iter().any(|&n| n >= 29),
        "the shared prompt spread: {by:?}"
    );
    // a different system prompt is free to go elsewhere, and sticks too
    let other = "You translate English to French, tersely. ".repeat(60);
    let mut by2 = [0usize; 2];
    for i in 0..10 {
        let r = chat(gw.addr, &other, &format!("sentence {i}"));
        by2[usize::from(r.header("x-ringgate-provider") == Some("gpu1"))] += 1;
    }
    assert!(by2.iter().any(|&n| n >= 9), "{by2:?}");
    gw.stop();
    for s in sims {
        s.stop();
    }
}

#[test]
fn all_engines_full_answers_429_before_anything_goes_upstream() {
    common::shard_counts().for_each(all_engines_full_answers_429_before_anything_goes_upstream_at);
}

fn all_engines_full_answers_429_before_anything_goes_upstream_at(shards: usize) {
    let a = Fake::start(vllm_page(20, 8, 0.9));
    let b = Fake::start(vllm_page(9, 4, 1.0));
    let gw = gateway_for(
        shards,
        &[(a.addr, "vllm"), (b.addr, "vllm")],
        "max_waiting = 8",
    );
    wait_polled(gw.addr, 2);
    let r = chat(gw.addr, "s", "hello");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    let v = r.json();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at capacity"),
        "{v}"
    );
    // Anthropic clients get their own shape
    let m = request(
        gw.addr,
        &post(
            "/v1/messages",
            r#"{"model":"llama-3.1-8b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
    );
    assert_eq!(m.status, 429, "{}", m.text());
    assert_eq!(m.json()["type"], "error");
    assert_eq!(m.json()["error"]["type"], "rate_limit_error");
    assert_eq!((a.posts(), b.posts()), (0, 0), "nothing reached an engine");
    // one engine drains below the bound: it takes the traffic again at its next poll
    *b.page.lock().unwrap() = vllm_page(2, 4, 0.5);
    let t0 = Instant::now();
    loop {
        let r = chat(gw.addr, "s", "again");
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429);
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "never admitted again"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!((a.posts(), b.posts()), (0, 1));
    gw.stop();
}

#[test]
fn an_engine_going_down_is_skipped_within_one_poll_interval() {
    common::shard_counts().for_each(an_engine_going_down_is_skipped_within_one_poll_interval_at);
}

fn an_engine_going_down_is_skipped_within_one_poll_interval_at(shards: usize) {
    let mut spec = EngineSpec::new(SimKind::Sglang, 4);
    spec.tpot = Duration::from_millis(1);
    let a =
        ringgate::mock::server::start_engine("127.0.0.1:0".parse().unwrap(), spec.clone()).unwrap();
    let b = ringgate::mock::server::start_engine("127.0.0.1:0".parse().unwrap(), spec).unwrap();
    let gw = gateway_for(shards, &[(a.addr, "sglang"), (b.addr, "sglang")], "");
    wait_polled(gw.addr, 2);
    let ok = "ringgate_engine_polls_total{provider=\"gpu0\",result=\"ok\"}";
    let failed = "ringgate_engine_polls_total{provider=\"gpu0\",result=\"failed\"}";
    a.stop();
    // within one poll interval, counted in polls (not timed: CI is a loaded box): from the
    // moment it is gone at most the one poll already on its way succeeds, and the first that
    // fails takes it out (it is not left in rotation until stale_ms or a few failures)
    let ok_at_stop = common::metric_in(&request(gw.addr, &common::get("/metrics")).text(), ok);
    let m = common::scrape_until(gw.addr, "never marked down", |m| {
        m.contains("ringgate_engine_up{provider=\"gpu0\",engine=\"sglang\"} 0")
    });
    let (ok_after, failed_after) = (common::metric_in(&m, ok), common::metric_in(&m, failed));
    assert!(
        ok_after <= ok_at_stop + 1,
        "{} good polls of a stopped engine:\n{m}",
        ok_after - ok_at_stop
    );
    assert!(failed_after >= 1, "down without a failed poll:\n{m}");
    // every request goes to the live engine on its first attempt (max_attempts = 1: no retry
    // could hide a pick of the dead one)
    for i in 0..20 {
        let r = chat(gw.addr, "s", &format!("q{i}"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-ringgate-provider"), Some("gpu1"));
    }
    gw.stop();
    b.stop();
}

#[test]
fn block_mode_waits_bounded_for_an_engine_to_drain() {
    common::shard_counts().for_each(block_mode_waits_bounded_for_an_engine_to_drain_at);
}

fn block_mode_waits_bounded_for_an_engine_to_drain_at(shards: usize) {
    let a = Fake::start(vllm_page(20, 8, 0.9));
    let admission = "\n[admission]\nmode = \"block\"\nqueue_timeout_ms = 400\n";
    let gw = gateway_with(shards, &[(a.addr, "vllm")], "max_waiting = 8", admission);
    wait_polled(gw.addr, 1);
    // still full after the queue timeout: shed, nothing sent
    let t0 = Instant::now();
    let r = chat(gw.addr, "s", "hello");
    let took = t0.elapsed();
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(
        took >= Duration::from_millis(400),
        "shed after {took:?}, not after the wait"
    );
    assert_eq!(a.posts(), 0);
    // the engine drains while a request waits: it goes through
    let addr = gw.addr;
    let waiter = std::thread::spawn(move || {
        let t0 = Instant::now();
        (chat(addr, "s", "patient"), t0.elapsed())
    });
    // the engine stays full for 100 ms of the waiter's wait, then drains
    std::thread::sleep(Duration::from_millis(100));
    *a.page.lock().unwrap() = vllm_page(1, 8, 0.5);
    let (r, took) = waiter.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(took >= Duration::from_millis(100), "{took:?}");
    assert_eq!(a.posts(), 1);
    gw.stop();
}

/// Issue 20 item 8: a page with negative queue or KV values is a failed poll (the engine is
/// down), not an idle engine that wins every request.
#[test]
fn a_negative_page_is_a_failed_poll_not_an_idle_engine() {
    for d in common::DRIVERS {
        let liar = Fake::start(
        "vllm:num_requests_waiting{engine=\"0\"} -5\nvllm:num_requests_running{engine=\"0\"} 0\nvllm:kv_cache_usage_perc{engine=\"0\"} -0.5\n".into(),
    );
        let busy = Fake::start(vllm_page(6, 8, 0.8));
        let gw = gateway_on(&[(liar.addr, "vllm"), (busy.addr, "vllm")], "", "", 2, d);
        wait_polled(gw.addr, 1);
        let t0 = Instant::now();
        loop {
            let m = request(gw.addr, &common::get("/metrics")).text();
            if m.contains("ringgate_engine_up{provider=\"gpu0\",engine=\"vllm\"} 0") {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "never marked down:\n{m}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        for i in 0..20 {
            let r = chat(gw.addr, "s", &format!("q{i}"));
            assert_eq!(r.status, 200, "{}", r.text());
        }
        assert_eq!((liar.posts(), busy.posts()), (0, 20), "{d}");
        gw.stop();
    }
}

/// Issue 20 item 8: the only engine's metrics page is broken (no usable signal, ever): the
/// model is routed anyway by the gateway's own view — not answered 429 "queues full" forever —
/// and the gateway says so (a metric, and a log line once).
#[test]
fn a_model_whose_only_engine_has_no_usable_signal_is_routed_anyway() {
    for d in common::DRIVERS {
        let broken = Fake::start("<html>metrics are off</html>\n".into());
        let gw = gateway_on(&[(broken.addr, "vllm")], "max_waiting = 8", "", 2, d);
        let t0 = Instant::now();
        while !request(gw.addr, &common::get("/metrics"))
            .text()
            .lines()
            .any(|l| {
                l.starts_with("ringgate_engine_polls_total")
                    && l.contains("failed")
                    && !l.ends_with(" 0")
            })
        {
            assert!(t0.elapsed() < Duration::from_secs(5), "never polled");
            std::thread::sleep(Duration::from_millis(10));
        }
        for i in 0..5 {
            let r = chat(gw.addr, "s", &format!("q{i}"));
            assert_eq!(r.status, 200, "#{i}: {}", r.text());
        }
        assert_eq!(broken.posts(), 5);
        common::wait_metric(
            gw.addr,
            "ringgate_engine_blind_routes_total{provider=\"gpu0\"",
            5,
            d,
        );
        gw.stop();
    }
}

/// Issue 20 item 2: a conversation's next turn, on a fresh connection that may land on another
/// shard, goes to the engine its first turn went to (the prefix index is process-wide).
#[test]
fn turn_two_on_a_fresh_connection_finds_its_engine_at_two_shards() {
    for d in common::DRIVERS {
        let mut spec = EngineSpec::new(SimKind::Vllm, 8);
        spec.tpot = Duration::from_millis(1);
        let sims: Vec<_> = (0..2)
            .map(|_| {
                ringgate::mock::server::start_engine("127.0.0.1:0".parse().unwrap(), spec.clone())
                    .unwrap()
            })
            .collect();
        let engines = [(sims[0].addr, "vllm"), (sims[1].addr, "vllm")];
        let gw = gateway_on(&engines, "", "", 2, d);
        wait_polled(gw.addr, 2);
        let mut same = 0;
        let mut firsts = [0usize; 2];
        for c in 0..20 {
            let system =
                format!("Conversation {c}. ") + &"You are a careful assistant. ".repeat(40);
            let turn1 = format!(
                r#"{{"model":"llama-3.1-8b","max_tokens":2,"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"first question of conversation {c}"}}]}}"#
            );
            let r1 = request(gw.addr, &post("/v1/chat/completions", &turn1));
            assert_eq!(r1.status, 200, "{}", r1.text());
            let e1 = r1.header("x-ringgate-provider").unwrap().to_string();
            firsts[usize::from(e1 == "gpu1")] += 1;
            let turn2 = format!(
                r#"{{"model":"llama-3.1-8b","max_tokens":2,"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"first question of conversation {c}"}},{{"role":"assistant","content":"an answer"}},{{"role":"user","content":"and a follow-up"}}]}}"#
            );
            let r2 = request(gw.addr, &post("/v1/chat/completions", &turn2));
            assert_eq!(r2.status, 200, "{}", r2.text());
            same += usize::from(r2.header("x-ringgate-provider") == Some(e1.as_str()));
        }
        assert_eq!(
            same, 20,
            "{d}: turn 2 found turn 1's engine in {same} of 20 (firsts {firsts:?})"
        );
        gw.stop();
        for s in sims {
            s.stop();
        }
    }
}

/// A JSON value's shape: keys in order with their values' shapes, an array as the distinct
/// shapes of its elements, scalars by type (integers and floats apart, as a typed client
/// reads them).
fn shape(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "bool".into(),
        Value::Number(n) if n.is_f64() => "float".into(),
        Value::Number(_) => "int".into(),
        Value::String(_) => "string".into(),
        Value::Array(items) => {
            let mut seen: Vec<String> = Vec::new();
            for s in items.iter().map(shape) {
                if !seen.contains(&s) {
                    seen.push(s);
                }
            }
            format!("[{}]", seen.join(" | "))
        }
        Value::Object(m) => {
            let fields: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{k}: {}", shape(v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
    }
}

fn json_shape(page: &[u8]) -> String {
    shape(
        &serde_json::from_slice(page)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(page))),
    )
}

/// A Prometheus page's families: (name, TYPE, HELP, labelled) in order.
fn families(page: &str) -> Vec<(String, String, String, bool)> {
    let mut out: Vec<(String, String, String, bool)> = Vec::new();
    let mut help = String::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest.split_once(' ').map_or("", |(_, h)| h).to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push((name.into(), kind.into(), help.clone(), false));
        } else if let Some(last) = out.last_mut() {
            last.3 |= line.starts_with(&format!("{}{{", last.0));
        }
    }
    out
}

fn llama_fixture(name: &str) -> Vec<u8> {
    fixture(&format!("llamacpp/{name}"))
}

/// A streamed request held open on its own thread until the returned stream is shut down.
fn hold(addr: SocketAddr, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&post("/v1/chat/completions", body)).unwrap();
    let mut r = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
    });
    s
}

fn until(what: &str, ok: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Issue 22: `ringgate mock --engine llamacpp` serves pages shaped like the real llama-server's
/// (tests/fixtures/engines/llamacpp/, recorded from one): `/slots` idle before any task, busy,
/// busy with a queue, idle after (a slot keeps its last task); `/metrics` (its families, types
/// and help texts; only with `--metrics`, else the real 501), `/health`, `/v1/models`,
/// `/props`, its Chat answers (non-stream, and every kind of stream event in order) and its
/// 503 while loading. A change on either side that the other does not follow fails here.
#[test]
fn the_llamacpp_simulator_serves_pages_shaped_like_the_real_engines() {
    let mut spec = EngineSpec::new(SimKind::Llamacpp, 2);
    spec.tpot = Duration::from_millis(20);
    spec.metrics = true;
    spec.model_name = "smollm2".into();
    let sim =
        ringgate::mock::server::start_engine("127.0.0.1:0".parse().unwrap(), spec.clone()).unwrap();
    let page = |path: &str| {
        let r = request(sim.addr, &common::get(path));
        (r.status, r.body.clone())
    };
    let same_json = |path: &str, fixture: &str| {
        let (status, body) = page(path);
        assert_eq!(status, 200, "{path}");
        assert_eq!(
            json_shape(&body),
            json_shape(&llama_fixture(fixture)),
            "{path} against {fixture}:\n{}",
            String::from_utf8_lossy(&body)
        );
    };
    let same_metrics = |fixture: &str| {
        let (status, body) = page("/metrics");
        assert_eq!(status, 200);
        let (mine, real) = (
            String::from_utf8(body).unwrap(),
            String::from_utf8(llama_fixture(fixture)).unwrap(),
        );
        assert_eq!(families(&mine), families(&real), "{mine}");
        mine
    };
    let busy = |n: usize| {
        let (_, body) = page("/slots");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .filter(|s| s["is_processing"] == true)
            .count()
            == n
    };
    same_json("/slots", "slots-idle-fresh.json");
    same_metrics("metrics-idle.txt");
    same_json("/health", "health.json");
    same_json("/v1/models", "models.json");
    same_json("/props", "props.json");
    // its answers: finish_reason "length", cached tokens and timings, the first chunk's null
    let chat = r#"{"model":"smollm2","max_tokens":4,"messages":[{"role":"user","content":"Name three colours."}]}"#;
    let r = request(sim.addr, &post("/v1/chat/completions", chat));
    assert_eq!(r.status, 200);
    assert_eq!(
        json_shape(&r.body),
        json_shape(&llama_fixture("chat.json")),
        "{}",
        r.text()
    );
    assert_eq!(
        r.json()["choices"][0]["finish_reason"],
        "length",
        "at max_tokens"
    );
    let events = |sse: &str| {
        let mut out: Vec<String> = Vec::new();
        for d in sse.lines().filter_map(|l| l.strip_prefix("data: ")) {
            let s = if d == "[DONE]" {
                d.to_string()
            } else {
                json_shape(d.as_bytes())
            };
            if out.last() != Some(&s) {
                out.push(s);
            }
        }
        out
    };
    let streamed = chat.replacen(
        '{',
        r#"{"stream":true,"stream_options":{"include_usage":true},"#,
        1,
    );
    let r = request(sim.addr, &post("/v1/chat/completions", &streamed));
    assert_eq!(r.status, 200);
    let real = String::from_utf8(llama_fixture("chat-stream.txt")).unwrap();
    assert_eq!(events(&r.text()), events(&real), "{}", r.text());
    assert!(r
        .text()
        .contains(r#""delta":{"role":"assistant","content":null}"#));
    let long = r#"{"model":"smollm2","stream":true,"max_tokens":400,"messages":[{"role":"user","content":"Write a very long story about a lighthouse."}]}"#;
    let mut held = vec![hold(sim.addr, long), hold(sim.addr, long)];
    until("both slots busy", || busy(2));
    same_json("/slots", "slots-busy.json");
    same_metrics("metrics-busy.txt");
    held.push(hold(sim.addr, long));
    until("one deferred", || {
        let (_, body) = page("/metrics");
        String::from_utf8_lossy(&body).contains("\nllamacpp:requests_deferred 1\n")
    });
    same_json("/slots", "slots-queued.json");
    same_metrics("metrics-queued.txt");
    for s in held {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    until("idle again", || busy(0));
    same_json("/slots", "slots-idle.json");
    same_metrics("metrics-idle-after.txt");
    sim.stop();
    // without --metrics, with --no-slots: the real engine's 501 pages, byte for byte
    spec.metrics = false;
    spec.slots_page = false;
    let bare =
        ringgate::mock::server::start_engine("127.0.0.1:0".parse().unwrap(), spec.clone()).unwrap();
    for (path, fixture) in [
        ("/metrics", "metrics-501.json"),
        ("/slots", "slots-501.json"),
    ] {
        let r = request(bare.addr, &common::get(path));
        assert_eq!(r.status, 501, "{path}");
        assert_eq!(r.text(), String::from_utf8(llama_fixture(fixture)).unwrap());
    }
    bare.stop();
    // while its model loads (--load-ms): the real engine's 503, on its pages and requests
    spec.load_time = Duration::from_secs(600);
    let loading =
        ringgate::mock::server::start_engine("127.0.0.1:0".parse().unwrap(), spec).unwrap();
    let want = String::from_utf8(llama_fixture("health-loading.json")).unwrap();
    for raw in [
        common::get("/health"),
        common::get("/slots"),
        post("/v1/chat/completions", long),
    ] {
        let r = request(loading.addr, &raw);
        assert_eq!((r.status, r.text()), (503, want.clone()));
    }
    loading.stop();
}
