//! Engine-aware routing against real llama.cpp engines (issue 22): two `llama-server`
//! processes (SmolLM2-135M, one thread each, `-np 2`, built by `.ci/llama-engine`) with the
//! gateway in front at its default engine config (`engine = "llamacpp"`: the `/slots` signal).
//!
//! - one engine kept busy with long jobs → ≥ 90 % of new short requests go to the other;
//! - every slot and queue full (`max_waiting`) → 429 + Retry-After in the client's dialect,
//!   with nothing sent to an engine;
//! - an engine killed mid-stream → the client's stream ends with an error event, new requests
//!   go to the survivor; restarted → back in rotation once its `/health` is 200;
//! - `POST /v1/completions` through the gateway to the engine.
//!
//! Skipped (with a message) without `LLAMA_SERVER` / `LLAMA_MODEL`; `.ci/run` sets them and
//! `RINGGATE_REQUIRE_LLAMA`, so there they run. The tests run one at a time (`llama::serial`:
//! the engines share CPU 1); the gateway runs at 1 and 2 shards where the test is not too slow.

#[path = "../common/mod.rs"]
mod common;
#[path = "engines_real/llama.rs"]
mod llama;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{post, request};
use llama::{until, Held, Llama, ALIAS};
use ringgate::config::Config;
use ringgate::server;

/// A gateway in front of `engines` (providers `eng0`, `eng1`, …) serving model `smollm2`
/// with `lb = "load"` and `model_extra`; the engine config is the default one.
fn gateway_for(shards: usize, engines: &[SocketAddr], model_extra: &str) -> server::Running {
    common::quiet_logs();
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\npin = false\n\n[routing]\nmax_attempts = 2\n"
    );
    let mut deps = Vec::new();
    for (i, addr) in engines.iter().enumerate() {
        text.push_str(&format!(
            "\n[[provider]]\nname = \"eng{i}\"\nkind = \"openai-compatible\"\nengine = \"llamacpp\"\nbase_url = \"http://{addr}/v1\"\n"
        ));
        deps.push(format!("{{ provider = \"eng{i}\" }}"));
    }
    text.push_str(&format!(
        "\n[[model]]\nname = \"{ALIAS}\"\ndeployments = [ {} ]\nlb = \"load\"\n{model_extra}\n",
        deps.join(", ")
    ));
    let cfg = Config::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    server::start(cfg).unwrap()
}

/// Wait until the gateway has polled every engine successfully.
fn wait_polled(gw: SocketAddr, n: usize) {
    common::scrape_until(gw, "engines never polled", |m| {
        (0..n).all(|i| {
            common::metric_in(
                m,
                &format!("ringgate_engine_polls_total{{provider=\"eng{i}\",result=\"ok\"}}"),
            ) > 0
        })
    });
}

/// A long streamed job (1,500 tokens, `ignore_eos`): occupies a slot or a queue place for as
/// long as it is held.
fn long_job(gw: SocketAddr, model: &str) -> Held {
    let body = format!(
        r#"{{"model":"{model}","stream":true,"max_tokens":1500,"ignore_eos":true,"temperature":1.0,"messages":[{{"role":"user","content":"Write a very long story about a lighthouse."}}]}}"#
    );
    Held::open(gw, "/v1/chat/completions", &body)
}

fn short_chat(gw: SocketAddr, i: usize) -> common::Response {
    let body = format!(
        r#"{{"model":"{ALIAS}","max_tokens":4,"messages":[{{"role":"user","content":"Say hi to number {i}."}}]}}"#
    );
    request(gw, &post("/v1/chat/completions", &body))
}

#[test]
fn a_busy_engine_gets_few_of_the_new_requests() {
    let Some(paths) = llama::paths() else { return };
    let _serial = llama::serial();
    let engines = [Llama::start(&paths, &[]), Llama::start(&paths, &[])];
    // model `pinned` goes to eng0 only: how one engine gets busy with the gateway's own jobs
    let pinned = format!(
        "\n[[model]]\nname = \"pinned\"\nupstream_model = \"{ALIAS}\"\ndeployments = [ {{ provider = \"eng0\" }} ]\n"
    );
    for shards in common::shard_counts() {
        let gw = gateway_for(shards, &[engines[0].addr, engines[1].addr], &pinned);
        wait_polled(gw.addr, 2);
        // eng0: four long jobs (both slots busy, two queued behind them)
        let held: Vec<Held> = (0..4).map(|_| long_job(gw.addr, "pinned")).collect();
        assert!(
            until(Duration::from_secs(60), || engines[0].busy_slots() == 2),
            "eng0's slots never filled"
        );
        // short requests in bursts of four: every slot is busy most of the time, so a pick by
        // busy slots alone is a coin toss; the gateway's in-flight count says eng0 queues
        let mut by = [0usize; 2];
        for round in 0..4 {
            let addr = gw.addr;
            let burst: Vec<_> = (0..4)
                .map(|k| std::thread::spawn(move || short_chat(addr, round * 4 + k)))
                .collect();
            for t in burst {
                let r = t.join().unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                by[usize::from(r.header("x-ringgate-provider") == Some("eng1"))] += 1;
            }
        }
        eprintln!("short requests by engine (eng0 busy, eng1 idle): {by:?}");
        assert!(
            by[1] * 10 >= (by[0] + by[1]) * 9,
            "the idle engine got {} of {}: {by:?}",
            by[1],
            by[0] + by[1]
        );
        drop(held);
        assert!(
            until(Duration::from_secs(60), || engines[0].busy_slots() == 0),
            "the long jobs never ended"
        );
        gw.stop();
    }
}

#[test]
fn full_slots_and_queues_shed_with_429_before_anything_goes_upstream() {
    let Some(paths) = llama::paths() else { return };
    let _serial = llama::serial();
    let engines = [
        Llama::start(&paths, &["--metrics"]),
        Llama::start(&paths, &["--metrics"]),
    ];
    for shards in common::shard_counts() {
        let gw = gateway_for(
            shards,
            &[engines[0].addr, engines[1].addr],
            "max_waiting = 1",
        );
        wait_polled(gw.addr, 2);
        // two slots and one queued request per engine: six long jobs through the gateway
        let mut held = Vec::new();
        for _ in 0..6 {
            held.push(long_job(gw.addr, ALIAS));
            std::thread::sleep(Duration::from_millis(300));
        }
        assert!(
            until(Duration::from_secs(60), || engines
                .iter()
                .all(|e| e.busy_slots() == 2)),
            "slots never filled"
        );
        let deferred = |e: &Llama| {
            let (_, m) = e.get("/metrics");
            common::metric_in(&m, "llamacpp:requests_deferred")
        };
        assert!(
            until(Duration::from_secs(30), || engines
                .iter()
                .all(|e| deferred(e) == 1)),
            "each engine should queue one: {} / {}",
            deferred(&engines[0]),
            deferred(&engines[1])
        );
        let tasks_before: Vec<String> = engines.iter().map(|e| e.get("/slots").1).collect();
        let r = short_chat(gw.addr, 0);
        assert_eq!(r.status, 429, "{}", r.text());
        assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.text());
        let m = request(
            gw.addr,
            &post(
                "/v1/messages",
                &format!(
                    r#"{{"model":"{ALIAS}","max_tokens":4,"messages":[{{"role":"user","content":"hi"}}]}}"#
                ),
            ),
        );
        assert_eq!(m.status, 429, "{}", m.text());
        assert!(m.header("retry-after").is_some());
        assert_eq!(m.json()["type"], "error");
        assert_eq!(m.json()["error"]["type"], "rate_limit_error");
        // nothing was sent: each engine still has exactly one queued, no new task id in /slots
        for (e, before) in engines.iter().zip(&tasks_before) {
            assert_eq!(deferred(e), 1);
            let ids = |page: &str| -> Vec<i64> {
                let v: serde_json::Value = serde_json::from_str(page).unwrap_or_default();
                v.as_array()
                    .map(|a| a.iter().filter_map(|s| s["id_task"].as_i64()).collect())
                    .unwrap_or_default()
            };
            assert_eq!(
                ids(&e.get("/slots").1),
                ids(before),
                "a slot took a new task"
            );
        }
        drop(held);
        assert!(until(Duration::from_secs(60), || engines
            .iter()
            .all(|e| e.busy_slots() == 0 && deferred(e) == 0)));
        gw.stop();
    }
}

#[test]
fn a_killed_engine_ends_the_stream_with_an_error_and_a_restarted_one_comes_back() {
    let Some(paths) = llama::paths() else { return };
    let _serial = llama::serial();
    let mut engines = [Llama::start(&paths, &[]), Llama::start(&paths, &[])];
    // one shard: killing and restarting an engine is the slow part, and what it tests (the
    // engine's signal) is process-wide; the two-shard run is the routing tests'
    for shards in [1usize] {
        let gw = gateway_for(shards, &[engines[0].addr, engines[1].addr], "");
        wait_polled(gw.addr, 2);
        let held = long_job(gw.addr, ALIAS);
        assert!(
            held.wait(Duration::from_secs(60), |t| t.matches("data: ").count() > 3),
            "no tokens: {}",
            held.text()
        );
        let victim = usize::from(engines[1].busy_slots() == 1);
        let survivor = 1 - victim;
        engines[victim].kill();
        assert!(
            held.wait(Duration::from_secs(30), |t| t.ends_with("\r\n0\r\n\r\n")),
            "the stream never ended: {}",
            held.text()
        );
        let text = held.text();
        assert!(text.contains("\"error\""), "no error event: {text}");
        assert!(
            !text.contains("data: [DONE]"),
            "a broken stream must not say [DONE]: {text}"
        );
        drop(held);
        for i in 0..6 {
            let r = short_chat(gw.addr, i);
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(
                r.header("x-ringgate-provider"),
                Some(format!("eng{survivor}").as_str())
            );
        }
        let down = format!("ringgate_engine_up{{provider=\"eng{victim}\"");
        common::wait_metric(gw.addr, &down, 0, "the killed engine is down");
        engines[victim].restart();
        let healthy_at = Instant::now();
        common::metric_until(gw.addr, &down, "the restarted engine is back", |v| v == 1);
        let back = healthy_at.elapsed();
        eprintln!("back in rotation {back:?} after its /health was 200 (poll_ms = 100)");
        // and it serves again: two at once go one to each (least in flight breaks the tie)
        let mut by = [0usize; 2];
        for round in 0..3 {
            let addr = gw.addr;
            let pair: Vec<_> = (0..2)
                .map(|k| std::thread::spawn(move || short_chat(addr, 100 + round * 2 + k)))
                .collect();
            for t in pair {
                let r = t.join().unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                by[usize::from(r.header("x-ringgate-provider") == Some("eng1"))] += 1;
            }
        }
        assert!(by[victim] > 0, "the restarted engine got nothing: {by:?}");
        gw.stop();
    }
}

#[test]
fn doctor_fails_a_501_signal_url_and_warns_of_a_model_name_mismatch() {
    let Some(paths) = llama::paths() else { return };
    let _serial = llama::serial();
    // no --metrics, no --alias: what a user starts first
    let e = Llama::start_as(&paths, None, &[]);
    let (_, listed) = e.get("/v1/models");
    let dir = std::env::temp_dir().join(format!("ringgate-engines-real-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("ringgate.toml");
    let doctor = |metrics_url: &str| {
        std::fs::write(
            &cfg,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nshards = 1\n\n[[provider]]\nname = \"eng0\"\nkind = \"openai-compatible\"\nengine = \"llamacpp\"\nbase_url = \"http://{}/v1\"\n{metrics_url}\n\n[[model]]\nname = \"{ALIAS}\"\nprovider = \"eng0\"\nlb = \"load\"\n",
                e.addr
            ),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringgate"))
            .args(["doctor", "--config", cfg.to_str().unwrap()])
            .env_remove("RINGGATE_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = doctor(&format!("metrics_url = \"http://{}/metrics\"", e.addr));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  eng0: load signal GET"), "{out}");
    assert!(out.contains("→ 501"), "{out}");
    assert!(out.contains("--metrics"), "{out}");
    assert!(
        out.contains(&format!(
            "the gateway sends model {ALIAS} but the engine lists"
        )),
        "{out}\n{listed}"
    );
    assert!(out.contains(&format!("--alias {ALIAS}")), "{out}");
    // the default signal (/slots) reads: no problem from the engines section
    let (_, out) = doctor("");
    let engines = out.split("\nengines\n").nth(1).unwrap_or("");
    assert!(engines.contains("slot(s) busy"), "{out}");
    assert!(!engines.contains("FAIL"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn text_completions_reach_the_engine_with_its_usage() {
    let Some(paths) = llama::paths() else { return };
    let _serial = llama::serial();
    let e = Llama::start(&paths, &[]);
    let body = format!(
        r#"{{"model":"{ALIAS}","prompt":"The colours of the rainbow are","max_tokens":6,"temperature":0}}"#
    );
    let direct = request(e.addr, &post("/v1/completions", &body));
    assert_eq!(direct.status, 200, "{}", direct.text());
    let want = direct.json();
    for shards in common::shard_counts() {
        let gw = gateway_for(shards, &[e.addr], "");
        let r = request(gw.addr, &post("/v1/completions", &body));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["object"], "text_completion", "{v}");
        assert_eq!(v["choices"][0]["text"], want["choices"][0]["text"], "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 6, "{v}");
        assert_eq!(
            v["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"],
            "{v}"
        );
        assert_eq!(r.header("x-ringgate-provider"), Some("eng0"));
        gw.stop();
    }
}
