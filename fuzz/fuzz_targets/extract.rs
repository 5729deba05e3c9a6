//! `model`/`stream` extraction (`extract::routing_fields`) and the passthrough splice
//! (`extract::splice`, as `forward::plan` runs it).
//!
//! Input: either a raw body, or (first byte `0xFF`) a nesting amplifier
//! `[0xFF, n_lo, n_hi, open, prefix_len, prefix..., suffix...]` that builds
//! `prefix + open×n + close×n + suffix` with n up to 20,000, so depths that overflowed a
//! shard's stack (issue 8: ~11,000 `[`) are reached without huge inputs. Runs on the fuzzer's
//! default (main-thread) stack: a missing depth bound shows up as a stack-overflow crash.
//! Invariants: never panics or overflows; on success the model span lies in the body and holds
//! the JSON string of the model; splicing another (valid) model in, with or without the Chat
//! usage ask, yields a body whose routing fields are the new model and the same `stream`, and
//! with the ask (where the body's `stream_options` is absent or not asking) one that asks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::dialect::extract::{routing_fields, splice, UsageOption};

const SPLICED: &str = "org/fz-model_1.5:latest@v+2";
/// Deepest nest the amplifier builds: past the 12,000 levels that overflowed a 2 MiB shard
/// stack (and an ASan-instrumented 8 MiB main thread), yet small enough to keep runs fast.
const MAX_AMPLIFIED: usize = 20_000;

fn amplify(data: &[u8]) -> Option<Vec<u8>> {
    let [0xFF, lo, hi, open, plen, rest @ ..] = data else {
        return None;
    };
    let n = usize::from(u16::from_le_bytes([*lo, *hi])) % (MAX_AMPLIFIED + 1);
    let (o, c) = if open % 2 == 0 {
        (b'[', b']')
    } else {
        (b'{', b'}')
    };
    let plen = usize::from(*plen).min(rest.len());
    let (prefix, suffix) = rest.split_at(plen);
    let mut body = Vec::with_capacity(prefix.len() + 2 * n + suffix.len());
    body.extend_from_slice(prefix);
    if o == b'{' {
        // `{"a":{"a":...}}`: an object nest needs keys to be valid.
        for _ in 0..n {
            body.extend_from_slice(b"{\"a\":");
        }
        body.extend_from_slice(b"0");
    } else {
        body.resize(body.len() + n, o);
    }
    body.resize(body.len() + n, c);
    body.extend_from_slice(suffix);
    Some(body)
}

fuzz_target!(|data: &[u8]| {
    let amplified = amplify(data);
    let body = amplified.as_deref().unwrap_or(data);
    let Ok(f) = routing_fields(body) else { return };
    let raw = body
        .get(f.model_span.clone())
        .expect("model span inside the body");
    let parsed: String = serde_json::from_slice(raw).expect("model span is a JSON string");
    assert_eq!(parsed, f.model);
    // The pipeline splices in the route's upstream model, which is a valid model identifier,
    // and asks a metered Chat stream's upstream for usage when the client did not.
    let ask = matches!(
        f.usage_option,
        UsageOption::Absent | UsageOption::NotAsked(_)
    ) && data.len() % 2 == 0;
    let spliced = splice(body, &f, Some(SPLICED), ask);
    match routing_fields(&spliced) {
        Ok(g) => {
            assert_eq!(g.model, SPLICED);
            assert_eq!(g.stream, f.stream);
            if ask {
                assert_eq!(g.usage_option, UsageOption::Asked);
            }
        }
        Err(e) => panic!("spliced body rejected: {}", e.message),
    }
});
