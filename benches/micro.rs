//! Micro benches (criterion, `Throughput::Bytes`), each with its baseline in the same group:
//! - head parsing: ringgate's `http::head::parse` vs raw `httparse`
//! - routing fields: `extract::routing_fields` (lazy sonic-rs) vs a full sonic-rs parse vs serde_json
//! - SSE: decode + re-encode a Chat stream vs a plain memchr event split
//! - translation overhead: passthrough (extract + splice) vs Messages→Chat→Chat request
//!   translation (issue 12's agent turn too: thinking, cache markers), and one streamed chunk
//!   relayed vs translated Chat→Messages (a content delta, a `reasoning_content` delta)
//! - passthrough vetting: a ~1 KB non-stream answer validated whole (`vet::json`), one streamed
//!   chunk's data validated (`vet::sse_events`), a 16 KiB relay chunk under the incremental
//!   check (`vet::Scan`), each against copying the same bytes (what the relay does anyway)
//! - governance: the per-request key + limit checks with keys off (the baseline; and with an
//!   admin listener's live key directory but no key) vs 1,000 keys (fixed, and live)
//!   configured (key only; key + rpm/tpm/in-flight windows + model check + reconcile)
//! - spend: a keyed request's governance life with its answer (usage scanned and recorded)
//!   without the ledger, with it but no prices or budgets, with prices and a budget; and the
//!   usage scan over a 16 KiB stream
//! - observability: the request id, the trace's clock reads, the request metrics, the access log
//!   off and on
//! - header policy (`upstream::headers`): an SDK head with nothing to forward (the common case:
//!   the provider's lines are borrowed) vs an Anthropic SDK head (version, two betas, a request
//!   id) copied, checked and written as upstream lines; six upstream response lines renamed for
//!   a client of another dialect
//! - engine load (`lb = "load"`, issue 13): a prompt's block hashes (2 KB system prompt +
//!   a user turn), the load pick over two engines with prefix lookup + index insert, vs the
//!   p2c pick it replaces
//! - response cache (`micro/cache.rs`): what a request to a cached model pays — the key (canonical body + SHA-256),
//!   the tenant and directives off the head, a lookup in a store of 10,000 entries (hit and
//!   miss, under the process-wide lock), replaying a hit as JSON and as a Chat / Messages
//!   stream, recording a miss's answer (JSON and a Chat stream), a semantic search over 1,000
//!   entries (64 and 1,536 dimensions); with the cache off a request pays one branch
//! - Responses state (`micro/responses_state.rs`): a translated Responses request and answer
//!   with the store off vs on, a tool loop's second step expanded
//! - Guardrails (`micro/guardrails.rs`): detector throughput on plain text, one streamed
//!   event's rewrite with pii + secrets on vs the off path
//!
//! Run: `cargo bench --bench micro` (results in target/criterion; summary in bench-results/).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ringgate::dialect::{self, Dialect, SseDecoder, SseEvent, StreamTranslator};
use ringgate::mock::{chat, pace, MockRequest};

#[path = "micro/cache.rs"]
mod cache;
#[path = "micro/guardrails.rs"]
mod guardrails;
#[path = "micro/responses_state.rs"]
mod responses_state;

const HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\nUser-Agent: OpenAI/Python 1.57.0\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.57.0\r\nX-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\nX-Stainless-Runtime-Version: 3.11.7\r\nAuthorization: Bearer sk-test-0123456789abcdef\r\nX-Stainless-Async: false\r\nX-Stainless-Retry-Count: 0\r\nContent-Length: 1234\r\n\r\n";

fn chat_body(prompt_bytes: usize) -> Vec<u8> {
    let text = "lorem ipsum dolor sit amet ".repeat(prompt_bytes / 27 + 1);
    serde_json::to_vec(&serde_json::json!({
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": &text[..prompt_bytes]}
        ],
        "model": "gpt-4o-mini",
        "max_tokens": 256,
        "stream": false,
        "temperature": 0.2
    }))
    .unwrap_or_default()
}

fn messages_body(prompt_bytes: usize) -> Vec<u8> {
    let text = "lorem ipsum dolor sit amet ".repeat(prompt_bytes / 27 + 1);
    serde_json::to_vec(&serde_json::json!({
        "model": "claude-on-openai",
        "max_tokens": 256,
        "system": "You are a helpful assistant.",
        "messages": [{"role": "user", "content": &text[..prompt_bytes]}]
    }))
    .unwrap_or_default()
}

/// An agent turn in the Messages dialect (~2 KB prompt): thinking on, cache markers on the
/// system prompt, a tool and the last user block, a signed thinking block and a tool round in
/// the history.
fn messages_agent_body(prompt_bytes: usize) -> Vec<u8> {
    agent_turn(prompt_bytes, true)
}

/// The same turn without issue 12's features (no thinking, markers or thinking block): the
/// baseline of the agent-turn benches.
fn messages_agent_plain_body(prompt_bytes: usize) -> Vec<u8> {
    agent_turn(prompt_bytes, false)
}

fn agent_turn(prompt_bytes: usize, features: bool) -> Vec<u8> {
    let text = "lorem ipsum dolor sit amet ".repeat(prompt_bytes / 27 + 1);
    let cc = serde_json::json!({"type": "ephemeral"});
    let mut body = serde_json::json!({
        "model": "claude-on-openai",
        "max_tokens": 20000,
        "thinking": {"type": "enabled", "budget_tokens": 8192},
        "system": [{"type": "text", "text": "You are a helpful assistant.", "cache_control": cc}],
        "tools": [{"name": "get_weather", "description": "Weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            "cache_control": cc}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should call the tool.", "signature": "EqQBCgIYAhIM"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                {"type": "text", "text": &text[..prompt_bytes], "cache_control": cc}]}]
    });
    if !features {
        let strip = |v: &mut serde_json::Value| {
            if let Some(o) = v.as_object_mut() {
                o.remove("cache_control");
            }
        };
        if let Some(o) = body.as_object_mut() {
            o.remove("thinking");
        }
        strip(&mut body["system"][0]);
        strip(&mut body["tools"][0]);
        strip(&mut body["messages"][2]["content"][1]);
        if let Some(a) = body["messages"][1]["content"].as_array_mut() {
            a.remove(0);
        }
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

fn head(c: &mut Criterion) {
    let mut g = c.benchmark_group("head");
    g.throughput(Throughput::Bytes(HEAD.len() as u64));
    g.bench_function("ringgate_parse", |b| {
        b.iter(|| ringgate::http::head::parse(black_box(HEAD), 16 * 1024, 64))
    });
    g.bench_function("baseline_httparse", |b| {
        b.iter(|| {
            let mut h = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Request::new(&mut h);
            let n = r.parse(black_box(HEAD));
            black_box(n.is_ok())
        })
    });
    g.finish();
}

fn extract(c: &mut Criterion) {
    let mut g = c.benchmark_group("routing_fields");
    for size in [800usize, 2_000, 80_000] {
        let body = chat_body(size);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("ringgate_lazy_sonic", size),
            &body,
            |b, body| b.iter(|| ringgate::dialect::extract::routing_fields(black_box(body))),
        );
        g.bench_with_input(
            BenchmarkId::new("baseline_sonic_full", size),
            &body,
            |b, body| b.iter(|| sonic_rs::from_slice::<sonic_rs::Value>(black_box(body)).is_ok()),
        );
        g.bench_with_input(
            BenchmarkId::new("baseline_serde_json", size),
            &body,
            |b, body| {
                b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(body)).is_ok())
            },
        );
    }
    g.finish();
}

fn stream_transcript(n: u32) -> Vec<u8> {
    let req = MockRequest::parse(
        format!(r#"{{"model":"m","stream":true,"max_tokens":{n},"stream_options":{{"include_usage":true}}}}"#).as_bytes(),
    )
    .unwrap_or_else(|_| MockRequest::parse(br#"{"model":"m"}"#).unwrap_or_else(|_| unreachable!()));
    let t = pace::transcript(&mut chat::events(&req));
    t
}

fn sse(c: &mut Criterion) {
    let t = stream_transcript(200);
    let mut g = c.benchmark_group("sse");
    g.throughput(Throughput::Bytes(t.len() as u64));
    g.bench_function("decode_encode", |b| {
        b.iter(|| {
            let mut d = SseDecoder::new();
            d.feed(black_box(&t));
            let mut out = Vec::with_capacity(t.len());
            while let Some(ev) = d.next_event() {
                dialect::encode_event(ev.event.as_deref(), &ev.data, &mut out);
            }
            out
        })
    });
    g.bench_function("baseline_memchr_split", |b| {
        b.iter(|| {
            let mut n = 0;
            for _ in memchr::memmem::find_iter(black_box(&t), b"\n\n") {
                n += 1;
            }
            n
        })
    });
    g.finish();
}

fn translation(c: &mut Criterion) {
    let mut g = c.benchmark_group("request");
    let chat = chat_body(2_000);
    let msgs = messages_body(2_000);
    g.throughput(Throughput::Bytes(chat.len() as u64));
    g.bench_function("passthrough_extract_splice", |b| {
        b.iter(|| {
            let f = ringgate::dialect::extract::routing_fields(black_box(&chat)).ok();
            f.map(|f| {
                let rename = Some("gpt-4o-mini-2024");
                ringgate::dialect::extract::splice(&chat, &f, rename, false)
            })
        })
    });
    g.bench_function("translated_messages_to_chat", |b| {
        b.iter(|| {
            let hub = dialect::request_to_chat(Dialect::Messages, black_box(&msgs)).ok()?;
            dialect::chat_to_request(Dialect::Chat, &hub, "gpt-4o-mini").ok()
        })
    });
    // Issue 12's features on: thinking, cache markers, a thinking block in the history, fitted
    // to OpenAI's documented fields; and back, a Chat request with structured output and
    // reasoning to Anthropic (forced answer tool, markers kept).
    let agent = messages_agent_body(2_000);
    let plain = messages_agent_plain_body(2_000);
    g.bench_function("translated_messages_agent_plain_to_chat", |b| {
        use dialect::extensions::{fit_chat_upstream, ChatUpstream};
        b.iter(|| {
            let mut hub = dialect::request_to_chat(Dialect::Messages, black_box(&plain)).ok()?;
            fit_chat_upstream(&mut hub, ChatUpstream::OpenAi);
            dialect::chat_to_request(Dialect::Chat, &hub, "gpt-4o-mini").ok()
        })
    });
    g.bench_function("translated_messages_agent_to_chat", |b| {
        use dialect::extensions::{fit_chat_upstream, ChatUpstream};
        b.iter(|| {
            let mut hub = dialect::request_to_chat(Dialect::Messages, black_box(&agent)).ok()?;
            fit_chat_upstream(&mut hub, ChatUpstream::OpenAi);
            dialect::chat_to_request(Dialect::Chat, &hub, "gpt-4o-mini").ok()
        })
    });
    g.bench_function("translated_messages_agent_to_messages", |b| {
        b.iter(|| {
            let hub = dialect::request_to_chat(Dialect::Messages, black_box(&agent)).ok()?;
            dialect::chat_to_request(Dialect::Messages, &hub, "claude").ok()
        })
    });
    g.finish();

    // one typical streamed chunk (a content delta)
    let chunk = br#"{"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1700000000,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":" gate"},"logprobs":null,"finish_reason":null}]}"#;
    let ev = SseEvent {
        event: None,
        data: String::from_utf8_lossy(chunk).into_owned(),
    };
    let mut g = c.benchmark_group("chunk");
    g.throughput(Throughput::Bytes(chunk.len() as u64 + 8));
    g.bench_function("passthrough_relay", |b| {
        let mut framed = b"data: ".to_vec();
        framed.extend_from_slice(chunk);
        framed.extend_from_slice(b"\n\n");
        let mut out = Vec::with_capacity(512);
        b.iter(|| {
            out.clear();
            let end = memchr::memmem::rfind(black_box(&framed), b"\n\n").map_or(0, |i| i + 2);
            out.extend_from_slice(&framed[..end]);
            out.len()
        })
    });
    g.bench_function("translated_chat_to_messages", |b| {
        let mut tr = StreamTranslator::new(Dialect::Chat, Dialect::Messages, "claude");
        let mut out = Vec::with_capacity(1024);
        // prime: message_start/content_block_start are emitted once
        let _ = tr.push(&ev, &mut out);
        b.iter(|| {
            out.clear();
            let _ = tr.push(black_box(&ev), &mut out);
            out.len()
        })
    });
    // a reasoning_content chunk (vLLM / DeepSeek) → Anthropic thinking_delta
    let reasoning = SseEvent {
        event: None,
        data: r#"{"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1700000000,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"reasoning_content":" gate"},"logprobs":null,"finish_reason":null}]}"#.into(),
    };
    g.bench_function("translated_reasoning_chat_to_messages", |b| {
        let mut tr = StreamTranslator::new(Dialect::Chat, Dialect::Messages, "claude");
        let mut out = Vec::with_capacity(1024);
        let _ = tr.push(&reasoning, &mut out);
        b.iter(|| {
            out.clear();
            let _ = tr.push(black_box(&reasoning), &mut out);
            out.len()
        })
    });
    g.finish();
}

/// A ~1 KB Chat completion, as the mock answers a short prompt.
fn completion_1k() -> Vec<u8> {
    let content = "lorem ipsum dolor sit amet ".repeat(28);
    serde_json::to_vec(&serde_json::json!({
        "id": "chatcmpl-0123456789", "object": "chat.completion", "created": 1_700_000_000,
        "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0123",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
            "refusal": null}, "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 180, "total_tokens": 192}
    }))
    .unwrap_or_default()
}

fn vetting(c: &mut Criterion) {
    use ringgate::answer::vet;
    let body = completion_1k();
    let mut g = c.benchmark_group("vet_json");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("whole_1k", |b| {
        b.iter(|| vet::json(black_box(&body)).is_ok())
    });
    g.bench_function("baseline_copy_1k", |b| {
        let mut out = Vec::with_capacity(2048);
        b.iter(|| {
            out.clear();
            out.extend_from_slice(black_box(&body));
            out.len()
        })
    });
    g.finish();

    let event = br#"data: {"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1700000000,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":" gate"},"logprobs":null,"finish_reason":null}]}

"#;
    let mut g = c.benchmark_group("vet_sse");
    g.throughput(Throughput::Bytes(event.len() as u64));
    g.bench_function("event_data", |b| {
        b.iter(|| vet::sse_events(black_box(event)).is_ok())
    });
    g.finish();

    // 16 KiB prefixes of large answers: a long completion (mostly one string) and an
    // embeddings answer (mostly numbers, the scan's slow case).
    let long = serde_json::to_vec(&serde_json::json!({"choices": [{"message":
        {"content": "lorem ipsum dolor sit amet ".repeat(1000)}}]}))
    .unwrap_or_default();
    let floats: Vec<f64> = (0..3072)
        .map(|i| ((i * 7919) % 1000) as f64 / 7777.0 - 0.06)
        .collect();
    let emb = serde_json::to_vec(&serde_json::json!({"object": "list", "data": [
        {"object": "embedding", "index": 0, "embedding": floats}]}))
    .unwrap_or_default();
    let mut g = c.benchmark_group("vet_scan");
    g.throughput(Throughput::Bytes(16 * 1024));
    for (name, body) in [("completion_16k", &long), ("embedding_16k", &emb)] {
        let piece = &body[..body.len().min(16 * 1024)];
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut s = vet::Scan::new();
                s.feed(black_box(piece)).is_ok()
            })
        });
    }
    g.finish();
}

/// The governance stages of one request (identify → admit → check_model → grant dropped), on a
/// parsed head, with `keys` = 1,000 configured keys; the presented one is the last.
fn governance(c: &mut Criterion) {
    use ringgate::config::provider::Op;
    use ringgate::config::Config;
    use ringgate::governance::{keyring::Digest, Gate, Governance, Keyring};
    let secret = |i: usize| format!("rg-bench-{i:04}-0123456789abcdef0123456789");
    let build = |limits: &str| {
        let mut text = String::new();
        for i in 0..1000 {
            let hex: String = Digest::of(secret(i).as_bytes())
                .0
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            text.push_str(&format!(
                "[[key]]\nname = \"k{i}\"\nkey_sha256 = \"{hex}\"\nmodels = [\"gpt-*\"]\n{limits}\n"
            ));
        }
        let cfg = Config::parse(&text).unwrap_or_else(|e| panic!("{e:?}"));
        Keyring::build(&cfg).unwrap_or_default()
    };
    // following a live key directory (an admin listener): one generation load per request
    let live = |ring: Keyring| {
        let dir = std::sync::Arc::new(ringgate::governance::Directory::new(ring));
        Governance::follow(dir, true, 0)
    };
    let raw = String::from_utf8_lossy(HEAD).replace("sk-test-0123456789abcdef", &secret(999));
    let raw = raw.as_bytes();
    let Ok(Some(head)) = ringgate::http::head::parse(raw, 16 * 1024, 64) else {
        return;
    };
    let body = chat_body(800);
    let Ok(fields) = ringgate::dialect::extract::routing_fields(&body) else {
        return;
    };
    let routes = ringgate::route::RouteTable::build(
        &Config::parse("[[provider]]\nname = \"p\"\nkind = \"mock\"\n[[model]]\nname = \"gpt-*\"\nprovider = \"p\"\n")
            .unwrap_or_else(|e| panic!("{e:?}")),
    );
    let Some(route) = routes.route(0) else {
        return;
    };
    let mut g = c.benchmark_group("governance");
    let mut headers = Vec::with_capacity(256);
    let off = Governance::off();
    let mut run = |name: &str, gov: &Governance| {
        g.bench_function(name, |b| {
            b.iter(|| {
                headers.clear();
                let caller = gov.identify(black_box(&head), black_box(raw));
                let grant = gov.admit(caller, Gate::Limits, &mut headers);
                if let Ok(Some(mut grant)) = grant {
                    let ok = grant.check_model(
                        black_box(&fields),
                        route,
                        Op::Generate,
                        body.len(),
                        &mut headers,
                    );
                    black_box(ok.is_ok());
                }
            })
        });
    };
    run("keys_off", &off);
    run("keys_off_admin_live", &live(Keyring::default()));
    run("key_1000", &Governance::new(build(""), 0));
    run("key_1000_live", &live(build("")));
    // limits so high they never refuse: the windows, headers and reconcile run every time
    run(
        "key_1000_rpm_tpm_in_flight",
        &Governance::new(
            build("rpm = 1000000000000\ntpm = 1000000000000000\nmax_in_flight = 1000000"),
            0,
        ),
    );
    // the same, while a second shard on another thread runs the same key's requests without
    // pause: the key's counters (one cache line, process-wide) move between cores on every
    // request, the cross-core worst case of limits per key
    let ring = build("rpm = 1000000000000\ntpm = 1000000000000000\nmax_in_flight = 1000000");
    let counters = std::sync::Arc::new(ringgate::governance::Counters::new());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let other = {
        let (ring, counters, stop) = (ring.clone(), counters.clone(), stop.clone());
        let (raw, body) = (raw.to_vec(), body.clone());
        std::thread::spawn(move || {
            let gov = Governance::new(ring, 1).with_counters(counters);
            let (Ok(Some(head)), Ok(fields)) = (
                ringgate::http::head::parse(&raw, 16 * 1024, 64),
                ringgate::dialect::extract::routing_fields(&body),
            ) else {
                return;
            };
            let routes = ringgate::route::RouteTable::build(
                &Config::parse("[[provider]]\nname = \"p\"\nkind = \"mock\"\n[[model]]\nname = \"gpt-*\"\nprovider = \"p\"\n")
                    .unwrap_or_else(|e| panic!("{e:?}")),
            );
            let Some(route) = routes.route(0) else {
                return;
            };
            let mut headers = Vec::with_capacity(256);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                headers.clear();
                let caller = gov.identify(&head, &raw);
                if let Ok(Some(mut grant)) = gov.admit(caller, Gate::Limits, &mut headers) {
                    let ok =
                        grant.check_model(&fields, route, Op::Generate, body.len(), &mut headers);
                    black_box(ok.is_ok());
                }
            }
        })
    };
    run(
        "key_1000_rpm_tpm_in_flight_contended",
        &Governance::new(ring, 0).with_counters(counters),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = other.join();
    g.finish();
}

/// What issue 11's observability adds to one request (one shard, plain integers): the request
/// id, the trace's extra clock reads, the metrics (series lookup, latency/overhead/TTFT/upstream
/// histograms), and the access log off (one branch) and on (one JSON line into the shard's
/// buffer; handing full 16 KiB buffers to the writer thread is amortised in it).
fn observability(c: &mut Criterion) {
    use ringgate::http::request_id::IdGen;
    use ringgate::observe::accesslog::{AccessLog, Entry, ShardLog};
    use ringgate::observe::metrics::RequestMetrics;
    use ringgate::observe::trace::{Endpoint, Trace};
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let mut g = c.benchmark_group("observability");
    let ids = IdGen::new(0, 0x5f3a_9c01);
    let mut headers = Vec::with_capacity(256);
    g.bench_function("request_id_generated", |b| {
        b.iter(|| {
            headers.clear();
            ids.assign(black_box(None)).header_line(&mut headers);
            black_box(headers.len())
        })
    });
    g.bench_function("clock_reads_x5", |b| {
        b.iter(|| {
            for _ in 0..5 {
                black_box(Instant::now());
            }
        })
    });
    let start = Instant::now();
    let mut t = Trace::new(start);
    t.endpoint = Endpoint::ChatCompletions;
    t.route = Some(3);
    t.served = Some((3, 0));
    t.stream = true;
    t.upstream = Duration::from_millis(48);
    t.first_piece = Some(start + Duration::from_millis(12));
    t.tokens = Some((120, 256));
    let end = start + Duration::from_millis(50);
    let metrics = RequestMetrics::default();
    // a few series exist, as on a running gateway
    for (ep, r, p) in [
        (Endpoint::Responses, 1, 0),
        (Endpoint::Messages, 2, 1),
        (Endpoint::ChatCompletions, 3, 0),
    ] {
        let mut o = t.clone();
        o.endpoint = ep;
        o.route = Some(r);
        metrics.observe(&o, 200, Some(p), end);
    }
    g.bench_function("metrics_observe", |b| {
        b.iter(|| metrics.observe(black_box(&t), 200, Some(0), black_box(end)))
    });
    let entry = Entry {
        request_id: "rg-0-5f3a9c01-123456",
        key: Some("team-a"),
        endpoint: "chat_completions",
        model: Some("gpt-4o-mini"),
        deployment: Some("openai/gpt-4o-mini"),
        provider: Some("openai"),
        status: 200,
        stream: true,
        tokens: Some((120, 256)),
        latency: Duration::from_micros(50_123),
        overhead: Duration::from_micros(31),
        upstream: Duration::from_micros(50_092),
        first_token: Some(Duration::from_micros(12_004)),
        bytes_in: 1_234,
        bytes_out: 4_567,
        attempts: 1,
        guardrail_hits: None,
        cost_nano_usd: None,
        trace_id: None,
        mcp: None,
    };
    let off = ShardLog::new(None);
    g.bench_function("access_log_off", |b| {
        b.iter(|| {
            if black_box(&off).on() {
                off.write(&entry);
            }
        })
    });
    let sink = Box::new(std::io::sink());
    if let Ok((log, _writer)) = AccessLog::start_with(sink, 64, Arc::new(AtomicU64::new(0))) {
        let on = ShardLog::new(Some(log));
        g.bench_function("access_log_on", |b| {
            b.iter(|| {
                if black_box(&on).on() {
                    on.write(black_box(&entry));
                }
            })
        });
    }
    // A scrape on one shard of 8: its own rendering plus 7 snapshots, 20 models × 2 endpoints
    // each with every histogram filled, merged into one exposition.
    let mut cfg = String::from("[[provider]]\nname = \"p\"\nkind = \"mock\"\n");
    for m in 0..20 {
        cfg.push_str(&format!(
            "[[model]]\nname = \"model-{m}\"\nprovider = \"p\"\n"
        ));
    }
    let routes = ringgate::route::RouteTable::build(
        &ringgate::config::Config::parse(&cfg).unwrap_or_else(|e| panic!("{e:?}")),
    );
    let shard = RequestMetrics::default();
    for r in 0..20 {
        for ep in [Endpoint::ChatCompletions, Endpoint::Messages] {
            let mut o = t.clone();
            o.endpoint = ep;
            o.route = Some(r);
            o.served = Some((r, 0));
            shard.observe(&o, 200, Some(0), end);
        }
    }
    let mut part = String::new();
    shard.render(&routes, &mut part);
    let parts: Vec<&str> = (0..8).map(|_| part.as_str()).collect();
    let lines = part.lines().count() * 8;
    g.bench_function(format!("scrape_merge_8_shards_{lines}_lines"), |b| {
        b.iter(|| black_box(ringgate::observe::metrics::expose::merge(black_box(&parts))).len())
    });
    g.finish();
}

/// A keyed request's whole governance life with its answer: identify → admit → check_model →
/// the answer's head → its usage scanned → grant dropped (usage recorded). Keys with no ledger,
/// with the ledger but no prices or budgets, and with prices and a budget (never reached); plus
/// the usage scan over a 16 KiB stream (what every keyed answer's bytes go through).
fn spend(c: &mut Criterion) {
    use ringgate::config::provider::Op;
    use ringgate::config::Config;
    use ringgate::dialect::Dialect;
    use ringgate::governance::{keyring::Digest, Gate, Governance, Keyring, SpendBook};
    let secret = |i: usize| format!("rg-bench-{i:04}-0123456789abcdef0123456789");
    let config = |key_extra: &str, price: &str| {
        let mut text = format!(
            "[[provider]]\nname = \"p\"\nkind = \"mock\"\n[[model]]\nname = \"gpt-*\"\nprovider = \"p\"\n{price}\n"
        );
        for i in 0..1000 {
            let hex: String = Digest::of(secret(i).as_bytes())
                .0
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            text.push_str(&format!(
                "[[key]]\nname = \"k{i}\"\nkey_sha256 = \"{hex}\"\n{key_extra}\n"
            ));
        }
        Config::parse(&text).unwrap_or_else(|e| panic!("{e:?}"))
    };
    let raw = String::from_utf8_lossy(HEAD).replace("sk-test-0123456789abcdef", &secret(999));
    let raw = raw.as_bytes();
    let Ok(Some(head)) = ringgate::http::head::parse(raw, 16 * 1024, 64) else {
        return;
    };
    let body = chat_body(800);
    let Ok(fields) = ringgate::dialect::extract::routing_fields(&body) else {
        return;
    };
    let usage = br#"data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":212,"completion_tokens":64,"total_tokens":276}}

data: [DONE]

"#;
    let mut g = c.benchmark_group("spend");
    let mut headers = Vec::with_capacity(256);
    let mut run = |name: &str, cfg: &Config, ledger: bool| {
        let routes = ringgate::route::RouteTable::build(cfg);
        let book = std::sync::Arc::new(SpendBook::new());
        let mut gov = Governance::new(Keyring::build(cfg).unwrap_or_default(), 0);
        if ledger {
            gov = gov.with_spend(&book, &routes);
        }
        let Some(route) = routes.route(0) else {
            return;
        };
        let Some(dep) = route.deployments.first() else {
            return;
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                headers.clear();
                let caller = gov.identify(black_box(&head), black_box(raw));
                let grant = gov.admit(caller, Gate::Limits, &mut headers);
                if let Ok(Some(mut grant)) = grant {
                    let ok = grant.check_model(
                        black_box(&fields),
                        route,
                        Op::Generate,
                        body.len(),
                        &mut headers,
                    );
                    let mut ans = ringgate::upstream::ResponseHead {
                        status: 200,
                        framing: ringgate::upstream::RespFraming::Chunked,
                        keep_alive: true,
                        content_type: b"text/event-stream".to_vec().into(),
                        forward: Vec::new(),
                    };
                    grant.on_answer(&mut ans, Some((route, dep)), Dialect::Chat);
                    grant.usage().feed(black_box(usage));
                    black_box(ok.is_ok());
                }
            })
        });
    };
    run("keyed_no_ledger", &config("", ""), false);
    run("ledger_no_prices", &config("", ""), true);
    run(
        "prices_and_budget",
        &config(
            "budget_usd = 1000000000.0\nbudget_period = \"month\"",
            "price_input_per_mtok = 0.15\nprice_output_per_mtok = 0.60",
        ),
        true,
    );
    // the scan every keyed answer's bytes go through: a 16 KiB Chat stream
    let mut stream = Vec::new();
    while stream.len() < 16 * 1024 {
        stream.extend_from_slice(br#"data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" the gate"},"finish_reason":null}]}

"#);
    }
    stream.extend_from_slice(usage);
    g.bench_function("usage_scan_16k_stream", |b| {
        b.iter(|| {
            let mut s = ringgate::governance::usage::UsageScan::new(Dialect::Chat);
            s.feed(black_box(&stream));
            black_box(s.io())
        })
    });
    g.finish();
}

fn header_policy(c: &mut Criterion) {
    use ringgate::config::provider::ProviderKind;
    use ringgate::http::request_id::RequestId;
    use ringgate::upstream::headers::{self, ClientHeaders};
    const ANTHROPIC_HEAD: &[u8] = b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: application/json\r\nContent-Type: application/json\r\nUser-Agent: Anthropic/Python 0.40.0\r\nX-Stainless-Lang: python\r\nanthropic-version: 2023-06-01\r\nanthropic-beta: prompt-caching-2024-07-31\r\nanthropic-beta: token-efficient-tools-2025-02-19\r\nx-request-id: 0b7c3d4e-1f2a-4b5c-8d9e-0f1a2b3c4d5e\r\nx-api-key: sk-ant-test-0123456789\r\nContent-Length: 1234\r\n\r\n";
    let auth: &[u8] = b"anthropic-version: 2023-06-01\r\nx-api-key: sk-provider-0123456789\r\n";
    let mut g = c.benchmark_group("headers");
    for (name, raw, kind) in [
        ("openai_sdk_nothing_forwarded", HEAD, ProviderKind::OpenAi),
        (
            "anthropic_sdk_forwarded",
            ANTHROPIC_HEAD,
            ProviderKind::Anthropic,
        ),
    ] {
        let h = ringgate::http::head::parse(raw, 16 * 1024, 64)
            .ok()
            .flatten()
            .expect("head");
        let id = h
            .header(raw, &h.x_request_id)
            .and_then(RequestId::from_client)
            .unwrap_or_default();
        g.bench_function(name, |b| {
            b.iter(|| {
                let c = ClientHeaders::capture(black_box(&h), black_box(raw), id).expect("ok");
                black_box(c.upstream_lines(kind, auth).len())
            })
        });
    }
    let lines = b"x-upstream-request-id: req_0123456789\r\nx-ratelimit-limit-requests: 5000\r\nx-ratelimit-remaining-requests: 4999\r\nx-ratelimit-limit-tokens: 2000000\r\nx-ratelimit-remaining-tokens: 1999000\r\nx-ratelimit-reset-requests: 12ms\r\n";
    g.bench_function("response_lines_renamed", |b| {
        b.iter(|| {
            let mut l = black_box(&lines[..]).to_vec();
            headers::to_client(&mut l, Dialect::Chat, Dialect::Messages);
            black_box(l.len())
        })
    });
    // the baseline: the same lines copied and looked at for a client of the same family
    g.bench_function("baseline_response_lines_same_family", |b| {
        b.iter(|| {
            let mut l = black_box(&lines[..]).to_vec();
            headers::to_client(&mut l, Dialect::Chat, Dialect::Responses);
            black_box(l.len())
        })
    });
    g.finish();
}

fn engine_load(c: &mut Criterion) {
    use ringgate::config::policy::Lb;
    use ringgate::engine::load::{LoadPick, LoadPicker, LoadSettings};
    use ringgate::engine::prefix::prompt_blocks;
    use ringgate::engine::signal::{EngineCell, EngineKind, Sample};
    use ringgate::forward::balance::{Balancer, EWMA_DECAY};
    use ringgate::util::rng::Rng;
    use std::sync::Arc;
    let sys = "You are the support assistant of ACME. ".repeat(52);
    let body = format!(
        r#"{{"model":"llama-3.1-8b","stream":true,"messages":[{{"role":"system","content":"{sys}"}},{{"role":"user","content":"my order 1234 is late, what now?"}}]}}"#
    );
    let mut g = c.benchmark_group("engine_load");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("prompt_blocks_2kb", |b| {
        b.iter(|| black_box(prompt_blocks(black_box(body.as_bytes())).len()))
    });
    let cells: Vec<Arc<EngineCell>> = (0..2)
        .map(|i| {
            let c = Arc::new(EngineCell::new(EngineKind::Vllm, true, u64::MAX / 2));
            let s = Sample {
                waiting: i,
                running: 4,
                kv: Some(0.3),
                slots: 0,
            };
            c.publish(s, 1);
            c
        })
        .collect();
    let picker = LoadPicker::new(
        LoadSettings {
            max_waiting: Some(8),
            ..LoadSettings::default()
        },
        cells.iter().cloned().map(Some).collect(),
    );
    let blocks = prompt_blocks(body.as_bytes());
    let rng = Rng::new(1);
    g.bench_function("load_pick_and_route_2_engines", |b| {
        b.iter(|| {
            if let LoadPick::Pick(d) = picker.pick(100, black_box(&blocks), &rng, |_| true, |_| 0) {
                picker.routed(d, &blocks, 100);
                cells[d].start(500);
                cells[d].end();
            }
        })
    });
    let p2c = Balancer::new(Lb::P2c, &[1, 1], EWMA_DECAY);
    let now = std::time::Instant::now();
    g.bench_function("baseline_p2c_pick", |b| {
        b.iter(|| black_box(p2c.pick(now, &rng, |_| true)))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = guardrails::guardrails, engine_load, cache::cache, head, extract, sse, translation,
        vetting, governance, observability, spend, header_policy, responses_state::responses_state
}
criterion_main!(benches);
