//! Engine-aware routing against real llama.cpp engines (issue 22): two `llama-server`
//! processes (SmolLM2-135M, one thread each, `-np 2`, built by `.ci/llama-engine`) with the
//! gateway in front at its default engine config (`engine = "llamacpp"`: the `/slots` signal).
//!
//! - one engine kept busy with long jobs → ≥ 90 % of new short requests go to the other;
//! - every slot and queue full (`max_waiting`) → 429 + Retry-After in the client's dialect,
//!   with nothing sent to an engine;
//! - an engine killed mid-stream → each client's stream (OpenAI Chat, Anthropic Messages) ends
//!   with its dialect's error event, new requests go to the survivor; restarted → back in rotation within one poll of its `/health` turning
//!   200 (at most the poll already on its way fails after that);
//! - `POST /v1/completions` through the gateway to the engine, stream and not;
//! - `doctor` catches a 501 signal URL (no `--metrics`) and a model-name mismatch (no `--alias`);
//! - with shared system prompts the engines' own cached-prompt counters (`/metrics`
//!   `prompt_tokens_cached_total`, each answer's `usage.prompt_tokens_details.cached_tokens`;
//!   `/slots`' `n_prompt_tokens_cache` is reset once a task ends) show `lb = "load"`
//!   reusing more of their prompt caches than p2c.
//!
//! Skipped (with a message) without `LLAMA_SERVER` / `LLAMA_MODEL`; `.ci/run` sets them and
//! `RINGGATE_REQUIRE_LLAMA`, so there they run. The tests run one at a time (`llama::serial`
//! inside one process, the nextest group `llama` across processes:
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
    gateway_lb(shards, engines, "load", model_extra)
}

/// As `gateway_for`, balanced by `lb`.
fn gateway_lb(
    shards: usize,
    engines: &[SocketAddr],
    lb: &str,
    model_extra: &str,
) -> server::Running {
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
        "\n[[model]]\nname = \"{ALIAS}\"\ndeployments = [ {} ]\nlb = \"{lb}\"\n{model_extra}\n",
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
        "\n[[model]]\nname = \"pinned\"\ndeployments = [ {{ provider = \"eng0\", upstream_model = \"{ALIAS}\" }} ]\n"
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
        // busy slots alone is a coin toss; the gateway's in-flight count says eng0 queues.
        // Each burst starts once the last one has ended at the gateway (its in-flight count on
        // eng1 back to 0): "new" requests, not ones racing the previous burst's ends
        let mut by = [0usize; 2];
        for round in 0..4 {
            common::wait_metric(
                gw.addr,
                "ringgate_engine_in_flight{provider=\"eng1\"",
                0,
                "the last burst has ended",
            );
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
    // model `pinned` goes to eng0 only: both streams (one per client dialect) run there
    let pinned = format!(
        "\n[[model]]\nname = \"pinned\"\ndeployments = [ {{ provider = \"eng0\", upstream_model = \"{ALIAS}\" }} ]\n"
    );
    // one shard: killing and restarting an engine is the slow part, and what it tests (the
    // engine's signal) is process-wide; the two-shard run is the routing tests'
    for shards in [1usize] {
        let gw = gateway_for(shards, &[engines[0].addr, engines[1].addr], &pinned);
        wait_polled(gw.addr, 2);
        let chat = long_job(gw.addr, "pinned");
        let messages = Held::open(
            gw.addr,
            "/v1/messages",
            // (no `ignore_eos` in the Anthropic dialect: a prompt that does not end soon)
            r#"{"model":"pinned","stream":true,"max_tokens":1500,"messages":[{"role":"user","content":"Count from 1 to 10000, one number per line."}]}"#,
        );
        assert!(
            chat.wait(Duration::from_secs(60), |t| t.matches("data: ").count() > 3),
            "no tokens: {}",
            chat.text()
        );
        assert!(
            messages.wait(Duration::from_secs(60), |t| t
                .matches("event: content_block_delta")
                .count()
                > 3),
            "no tokens: {}",
            messages.text()
        );
        let (victim, survivor) = (0usize, 1usize);
        engines[victim].kill();
        for held in [&chat, &messages] {
            assert!(
                held.wait(Duration::from_secs(30), |t| t.ends_with("\r\n0\r\n\r\n")),
                "the stream never ended: {}",
                held.text()
            );
        }
        let text = chat.text();
        assert!(text.contains("\"error\""), "no error event: {text}");
        assert!(
            !text.contains("data: [DONE]"),
            "a broken stream must not say [DONE]: {text}"
        );
        // the Anthropic client's stream ends with its dialect's error event, no message_stop
        let text = messages.text();
        assert!(
            text.contains("event: error\n"),
            "no Anthropic error event: {text}"
        );
        assert!(!text.contains("event: message_stop"), "{text}");
        drop((chat, messages));
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
        // back within one poll of its /health turning 200: after that moment at most the one
        // poll already on its way (it saw the engine still loading) fails; the next one is
        // good. Counted in polls, not timed
        let failed =
            format!("ringgate_engine_polls_total{{provider=\"eng{victim}\",result=\"failed\"}}");
        let polls = |gw: SocketAddr| {
            let m = request(gw, &common::get("/metrics")).text();
            common::metric_in(&m, &failed)
        };
        engines[victim].restart();
        let healthy_at = Instant::now();
        let failed_at_health = polls(gw.addr);
        common::metric_until(gw.addr, &down, "the restarted engine is back", |v| v == 1);
        let back = healthy_at.elapsed();
        let failed_after = polls(gw.addr) - failed_at_health;
        eprintln!(
            "back in rotation {back:?} after its /health was 200 (poll_ms = 100), {failed_after} \
             failed poll(s) after that"
        );
        assert!(
            failed_after <= 1,
            "{failed_after} polls failed after the engine's /health was 200"
        );
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
        // streamed: the engine's text chunks, passed through to the end
        let stream = body.replacen('{', r#"{"stream":true,"#, 1);
        let r = request(gw.addr, &post("/v1/completions", &stream));
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.text();
        let streamed: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_string))
            .collect();
        assert_eq!(
            streamed,
            want["choices"][0]["text"].as_str().unwrap(),
            "{text}"
        );
        assert!(text.contains("data: [DONE]"), "{text}");
        gw.stop();
    }
}

/// System prompt `i` of the affinity test: ~1,200 bytes (~250 tokens), distinct from its first
/// words on (the chat template puts it first, so its tokens lead the engine's prompt).
fn system_prompt(i: usize) -> String {
    const WORDS: [&str; 16] = [
        "policy", "order", "refund", "account", "shipping", "invoice", "warranty", "support",
        "escalate", "customer", "region", "tier", "premium", "return", "carrier", "tracking",
    ];
    let mut text = format!("You are assistant number {i} of the Acme help desk. ");
    let mut x = 2_654_435_761u64.wrapping_mul(i as u64 + 1);
    while text.len() < 1_200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(WORDS[(x % 16) as usize]);
        text.push(' ');
    }
    text
}

#[test]
fn the_engines_own_cache_counters_show_affinity_reusing_more_of_the_prompt_cache() {
    let Some(paths) = llama::paths() else { return };
    let _serial = llama::serial();
    // five shared system prompts, each sent four times with a new user turn, one request at a
    // time (so the queues are equal and only the prefix decides): `lb = "load"` keeps each
    // prompt on the engine that has it cached; p2c (the default) sends it to either. The
    // engines (default flags: 2 slots and the 8 GiB host prompt cache each) count what they
    // took from their caches. p2c would match the affinity's count only if every prompt's
    // four sends fell on one engine: (1/8)^5 ≈ 3e-5 were its picks random; they follow
    // latency (a cold prompt's slow answer sends the next request to the other engine), and
    // an odd number of prompts keeps a strict alternation from pinning each prompt by accident
    const PROMPTS: usize = 5;
    const ROUNDS: usize = 4;
    let prompts: Vec<String> = (0..PROMPTS).map(system_prompt).collect();
    for shards in common::shard_counts() {
        let mut got = Vec::new();
        for lb in ["load", "p2c"] {
            // fresh engines for each balancer: cold caches
            let engines = [
                Llama::start(&paths, &["--metrics"]),
                Llama::start(&paths, &["--metrics"]),
            ];
            let gw = gateway_lb(shards, &[engines[0].addr, engines[1].addr], lb, "");
            wait_polled(gw.addr, 2);
            let mut from_answers = 0i64;
            for round in 0..ROUNDS {
                for (i, system) in prompts.iter().enumerate() {
                    let body = serde_json::json!({
                        "model": ALIAS, "max_tokens": 1, "temperature": 0,
                        "messages": [
                            {"role": "system", "content": system},
                            {"role": "user", "content": format!("Question {round} for desk {i}: where is my order?")},
                        ],
                    });
                    let r = request(gw.addr, &post("/v1/chat/completions", &body.to_string()));
                    assert_eq!(r.status, 200, "{}", r.text());
                    // the engine's own count for this request (llama-server's usage; its
                    // /slots resets a slot's counters once the task is done)
                    from_answers += r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                        .as_i64()
                        .unwrap_or(0);
                }
            }
            let counter = |e: &Llama, name: &str| common::metric_in(&e.get("/metrics").1, name);
            let cached: u64 = engines
                .iter()
                .map(|e| counter(e, "llamacpp:prompt_tokens_cached_total"))
                .sum();
            let processed: u64 = engines
                .iter()
                .map(|e| counter(e, "llamacpp:prompt_tokens_total"))
                .sum();
            eprintln!(
                "lb = {lb}: engines' prompt_tokens_cached_total {cached}, prompt_tokens_total \
                 (processed) {processed}, answers' usage.prompt_tokens_details.cached_tokens summed \
                 {from_answers}"
            );
            got.push((cached, processed, from_answers));
            gw.stop();
        }
        let ((load_cached, load_processed, load_answers), (p2c_cached, p2c_processed, p2c_answers)) =
            (got[0], got[1]);
        assert!(
            load_cached > p2c_cached && load_processed < p2c_processed,
            "affinity reused no more of the cache: load {:?}, p2c {:?}",
            got[0],
            got[1]
        );
        assert!(
            load_answers > p2c_answers,
            "per answer: load {load_answers}, p2c {p2c_answers}"
        );
    }
}

/// A float sample of an engine's `/metrics` page (`None`: not on the page).
fn sample_of(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn polling_metrics_leaves_the_engines_gauges_to_its_scrapers_and_reads_its_queue() {
    let Some(paths) = llama::paths() else { return };
    let _serial = llama::serial();
    let e = Llama::start(&paths, &["--metrics"]);
    let ok_polls = "ringgate_engine_polls_total{provider=\"eng0\",result=\"ok\"}";
    for shards in common::shard_counts() {
        let mut text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nshards = {shards}\npin = false\n\n[[provider]]\nname = \"eng0\"\nkind = \"openai-compatible\"\nengine = \"llamacpp\"\nbase_url = \"http://{0}/v1\"\nmetrics_url = \"http://{0}/metrics\"\n",
            e.addr
        );
        text.push_str(&format!(
            "\n[[model]]\nname = \"{ALIAS}\"\nprovider = \"eng0\"\nlb = \"load\"\n"
        ));
        let gw = server::start(Config::parse(&text).unwrap()).unwrap();
        wait_polled(gw.addr, 1);
        // llama-server averages its throughput gauges over the window since the last GET of
        // /metrics: a request ends, the gateway polls (at least) three more times, and the
        // operator's scrape still sees the request's rate — the gateway read /slots, not
        // /metrics, while a slot was free
        let r = short_chat(gw.addr, 1);
        assert_eq!(r.status, 200, "{}", r.text());
        let scrape = || request(gw.addr, &common::get("/metrics")).text();
        let polls = common::metric_in(&scrape(), ok_polls);
        common::scrape_until(gw.addr, "three more polls", |m| {
            common::metric_in(m, ok_polls) >= polls + 3
        });
        let page = e.get("/metrics").1;
        let rate = sample_of(&page, "llamacpp:predicted_tokens_seconds");
        assert!(
            rate.is_some_and(|r| r > 0.0),
            "the gateway's polls reset the engine's gauge: {rate:?}\n{page}"
        );
        // other clients queue at the engine (not through the gateway): both slots busy, one
        // deferred. /slots cannot see it; /metrics (read while every slot is busy) can
        let direct: Vec<Held> = (0..3)
            .map(|_| {
                let h = long_job(e.addr, ALIAS);
                std::thread::sleep(Duration::from_millis(300));
                h
            })
            .collect();
        assert!(
            until(Duration::from_secs(60), || e.busy_slots() == 2),
            "slots never filled"
        );
        common::wait_metric(
            gw.addr,
            "ringgate_engine_waiting{provider=\"eng0\"",
            1,
            "the other clients' queued request",
        );
        drop(direct);
        assert!(until(Duration::from_secs(60), || e.busy_slots() == 0));
        common::wait_metric(
            gw.addr,
            "ringgate_engine_waiting{provider=\"eng0\"",
            0,
            "the queue drained",
        );
        gw.stop();
    }
}
