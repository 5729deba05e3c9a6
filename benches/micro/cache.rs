//! Micro bench group `cache` (see benches/micro.rs): the response cache's key, tenant and
//! directives, locked lookups, replay and record per dialect, semantic brute-force search.

use criterion::{black_box, Criterion};

use ringgate::dialect::Dialect;

use crate::HEAD;

pub fn cache(c: &mut Criterion) {
    use ringgate::cache::{answer, key, store};
    use std::time::{Duration, Instant};
    let body = br#"{"model":"gpt-4o-mini","temperature":0,"user":"u-42","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are a helpful assistant that answers briefly and precisely."},{"role":"user","content":"What is the capital of France? Answer in one sentence, and mention the river that runs through it, the approximate population, and one famous landmark."}],"max_tokens":128}"#;
    let answer_json = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Paris is the capital of France; the Seine runs through it, about 2.1 million people live there, and the Eiffel Tower is its best-known landmark."},"finish_reason":"stop"}],"usage":{"prompt_tokens":52,"completion_tokens":34,"total_tokens":86}}"#;
    let messages_json = br#"{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Paris is the capital of France; the Seine runs through it, about 2.1 million people live there, and the Eiffel Tower is its best-known landmark."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":52,"output_tokens":34}}"#;
    let mut g = c.benchmark_group("cache");
    g.bench_function("key_canonical_sha256", |b| {
        b.iter(|| {
            let canon = key::canonical(black_box(body)).unwrap_or_default();
            black_box(key::exact_key(
                "client:0123456789abcdef",
                "gpt-4o-mini",
                Dialect::Chat,
                &canon,
            ))
        })
    });
    let h = ringgate::http::head::parse(HEAD, 16 * 1024, 64)
        .ok()
        .flatten()
        .expect("head");
    g.bench_function("tenant_and_directives", |b| {
        b.iter(|| {
            let d = key::Directives::of(
                h.header(HEAD, &h.cache_control),
                h.header(HEAD, &h.x_ringgate_cache),
            );
            let cred = h.header(HEAD, &h.authorization).unwrap_or_default();
            black_box((d, key::client_tenant(black_box(cred))))
        })
    });
    let now = Instant::now();
    let st = std::sync::Mutex::new(store::Store::default());
    let entry = |i: u32| store::Entry {
        body: answer_json.to_vec().into(),
        tenant: "client:0123456789abcdef".into(),
        model: "gpt-4o-mini".into(),
        usage: Default::default(),
        expires: now + Duration::from_secs(3600),
        owner: (i % 2) as usize,
        semantic: None,
    };
    let k = |i: u32| key::digest(&[&i.to_le_bytes()]);
    {
        let mut s = st.lock().expect("lock");
        let mut freed = Vec::new();
        for i in 0..10_000 {
            s.insert(k(i), entry(i), u64::MAX, &mut freed);
        }
    }
    let hit = k(5_000);
    let miss = k(20_000);
    g.bench_function("lookup_hit_10k_entries", |b| {
        b.iter(|| {
            let mut freed = Vec::new();
            let mut s = st.lock().expect("lock");
            black_box(s.get(black_box(&hit), now, &mut freed).is_some())
        })
    });
    g.bench_function("lookup_miss_10k_entries", |b| {
        b.iter(|| {
            let mut freed = Vec::new();
            let mut s = st.lock().expect("lock");
            black_box(s.get(black_box(&miss), now, &mut freed).is_some())
        })
    });
    g.bench_function("replay_json", |b| {
        b.iter(|| {
            black_box(answer::replay(
                black_box(answer_json),
                Dialect::Chat,
                false,
                "gpt-4o-mini",
                false,
            ))
        })
    });
    g.bench_function("replay_chat_stream", |b| {
        b.iter(|| {
            black_box(answer::replay(
                black_box(answer_json),
                Dialect::Chat,
                true,
                "gpt-4o-mini",
                true,
            ))
        })
    });
    g.bench_function("replay_messages_stream", |b| {
        b.iter(|| {
            black_box(answer::replay(
                black_box(messages_json),
                Dialect::Messages,
                true,
                "m",
                true,
            ))
        })
    });
    let mut raw = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        answer_json.len()
    )
    .into_bytes();
    raw.extend_from_slice(answer_json);
    g.bench_function("record_json", |b| {
        b.iter(|| {
            black_box(answer::record(
                black_box(&raw),
                Dialect::Chat,
                "gpt-4o-mini",
                false,
            ))
        })
    });
    let (sse, _) =
        answer::replay(answer_json, Dialect::Chat, true, "gpt-4o-mini", true).expect("replay");
    let mut raw_sse = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n",
        sse.len()
    )
    .into_bytes();
    raw_sse.extend_from_slice(&sse);
    raw_sse.extend_from_slice(b"\r\n0\r\n\r\n");
    g.bench_function("record_chat_stream", |b| {
        b.iter(|| {
            black_box(answer::record(
                black_box(&raw_sse),
                Dialect::Chat,
                "gpt-4o-mini",
                false,
            ))
        })
    });
    for dims in [64usize, 1536] {
        let mut s = store::Store::default();
        let mut freed = Vec::new();
        let group = key::digest(&[b"group"]);
        for i in 0..1_000u32 {
            let mut e = entry(i);
            let v: Vec<f32> = (0..dims)
                .map(|d| (((i as usize * 31 + d * 17) % 97) as f32 - 48.0) / 48.0)
                .collect();
            let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            e.semantic = Some((group, v.iter().map(|x| x / n).collect::<Vec<f32>>().into()));
            s.insert(k(i), e, u64::MAX, &mut freed);
        }
        let q: Vec<f32> = (0..dims)
            .map(|d| 1.0 / (dims as f32).sqrt() * if d % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        g.bench_function(format!("semantic_search_1k_entries_{dims}d"), |b| {
            b.iter(|| black_box(s.nearest(&group, black_box(&q))))
        });
    }
    g.finish();
}
