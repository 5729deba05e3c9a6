//! Micro benches (criterion, `Throughput::Bytes`), each with its baseline in the same group:
//! - head parsing: ringgate's `http::head::parse` vs raw `httparse`
//! - routing fields: `extract::routing_fields` (lazy sonic-rs) vs a full sonic-rs parse vs serde_json
//! - SSE: decode + re-encode a Chat stream vs a plain memchr event split
//! - translation overhead: passthrough (extract + splice) vs Messages→Chat→Chat request
//!   translation, and one streamed chunk relayed vs translated Chat→Messages
//!
//! Run: `cargo bench --bench micro` (results in target/criterion; summary in bench-results/).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ringgate::mock::{chat, MockRequest};
use ringgate::translate::{self, Dialect, SseDecoder, SseEvent, StreamTranslator};

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
            |b, body| b.iter(|| ringgate::extract::routing_fields(black_box(body))),
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
    chat::stream_transcript(&req)
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
                translate::encode_event(ev.event.as_deref(), &ev.data, &mut out);
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
            let f = ringgate::extract::routing_fields(black_box(&chat)).ok();
            f.map(|f| ringgate::extract::splice_model(&chat, &f.model_span, "gpt-4o-mini-2024"))
        })
    });
    g.bench_function("translated_messages_to_chat", |b| {
        b.iter(|| {
            let hub = translate::request_to_chat(Dialect::Messages, black_box(&msgs)).ok()?;
            translate::chat_to_request(Dialect::Chat, &hub, "gpt-4o-mini").ok()
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
    g.finish();
}

criterion_group!(benches, head, extract, sse, translation);
criterion_main!(benches);
