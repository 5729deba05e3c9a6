//! Micro bench group `guardrails` (see benches/micro.rs): the detectors' throughput on plain
//! text (pii + secrets, MB/s), one streamed Chat event through the stream guard with pii +
//! secrets on against the off path (the event copied as the relay copies it), and a short
//! answer's whole stream (first event to `[DONE]`).

use std::rc::Rc;

use criterion::{black_box, Criterion, Throughput};
use ringgate::dialect::Dialect;
use ringgate::guardrail::{chain::mask_text, stream::StreamGuard, Guard, Phase, Session};

const CONFIG: &str = r#"
[[guardrail]]
name = "pii"
detect = ["email", "phone", "credit_card", "iban", "us_ssn", "ipv4"]
action = "mask"

[[guardrail]]
name = "secrets"
detect = ["secrets"]
action = "block"
"#;

fn session() -> Rc<Session> {
    let cfg = ringgate::config::Config::parse(CONFIG).expect("bench config");
    let g: Vec<Rc<Guard>> = cfg
        .guardrails
        .iter()
        .map(|c| Rc::new(Guard::compile(c).expect("compiles")))
        .collect();
    Rc::new(Session {
        request: g.clone(),
        response: g,
        hits: Default::default(),
    })
}

fn event(text: &str) -> Vec<u8> {
    let v = serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
        "created": 1_700_000_000, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
    format!("data: {v}\n\n").into_bytes()
}

pub fn guardrails(c: &mut Criterion) {
    let sess = session();
    let mut g = c.benchmark_group("guardrails");
    let plain = "The quick brown fox jumps over the lazy dog, and then it rests for a while. "
        .repeat(64 * 1024 / 76);
    g.throughput(Throughput::Bytes(plain.len() as u64));
    g.bench_function("detect_plain_text_64k", |b| {
        b.iter(|| mask_text(&sess.response, &sess, Phase::Response, black_box(&plain)))
    });
    let pii = "Reach me at alice@example.com or +1 415 555 2671; card 4111 1111 1111 1111. "
        .repeat(64 * 1024 / 77);
    g.throughput(Throughput::Bytes(pii.len() as u64));
    g.bench_function("mask_pii_text_64k", |b| {
        b.iter(|| mask_text(&sess.response, &sess, Phase::Response, black_box(&pii)))
    });
    g.throughput(Throughput::Elements(1));
    let ev = event(" jumps over");
    g.bench_function("stream_event_off", |b| {
        let mut out = Vec::with_capacity(4096);
        b.iter(|| {
            out.clear();
            out.extend_from_slice(black_box(&ev));
            black_box(out.len())
        })
    });
    g.bench_function("stream_event_on", |b| {
        let mut sg = StreamGuard::new(&sess, Dialect::Chat).expect("guarded");
        let mut out = Vec::with_capacity(4096);
        b.iter(|| {
            out.clear();
            let _ = sg.rewrite(black_box(&ev), &mut out);
            black_box(out.len())
        })
    });
    let words: Vec<Vec<u8>> = "Paris is the capital of France; the Seine runs through it and \
         about two million people live there."
        .split_inclusive(' ')
        .map(event)
        .collect();
    g.throughput(Throughput::Elements(words.len() as u64));
    g.bench_function("stream_answer_19_events_on", |b| {
        let mut out = Vec::with_capacity(16 * 1024);
        b.iter(|| {
            let mut sg = StreamGuard::new(&sess, Dialect::Chat).expect("guarded");
            out.clear();
            for w in &words {
                let _ = sg.rewrite(w, &mut out);
            }
            let _ = sg.rewrite(b"data: [DONE]\n\n", &mut out);
            black_box(out.len())
        })
    });
    g.finish();
}
