//! The guardrails' streaming masker (`guardrail::scan`, `guardrail::chain`) over every
//! built-in detector, a custom pattern and literal words.
//!
//! Input: `[n, cut bytes (2 per cut, n ≤ 16)..., text...]` (text taken as lossy UTF-8).
//! Invariants: never panics; the text fed in pieces cut at the chosen offsets gives exactly
//! the output of masking it whole; after every piece at most the hold-back bound is held.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::fuzzing::guardrail_stream_vs_whole;

fuzz_target!(|data: &[u8]| {
    let [n, rest @ ..] = data else { return };
    let n = usize::from(*n % 17);
    if rest.len() < 2 * n {
        return;
    }
    let (cuts, text) = rest.split_at(2 * n);
    let text = String::from_utf8_lossy(text);
    let cuts: Vec<usize> = cuts
        .chunks(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (text.len() + 1))
        .collect();
    let (streamed, whole, held, bound) = guardrail_stream_vs_whole(&text, &cuts);
    assert_eq!(streamed, whole, "cuts {cuts:?}");
    assert!(held <= bound, "held {held} > {bound}");
});
