//! Chunked body decoder (`http::chunked::ChunkedDecoder`), fed in two pieces split at a
//! fuzzer-chosen offset, compared with one-shot decoding.
//!
//! Input: `[split_lo, split_hi, limit_sel, body bytes...]`.
//! Invariants: never panics; decoded payload ≤ consumed input; payload, consumed count,
//! completion and error/ok are the same whatever the split; when done, payload length equals
//! `decoded()`; the body limit is honoured.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::http::chunked::ChunkedDecoder;

type Outcome = Result<(Vec<u8>, usize, bool, u64), u16>;

fn run(input: &[u8], split: usize, max_body: u64) -> Outcome {
    let mut d = ChunkedDecoder::new(max_body);
    let mut out = Vec::new();
    let mut used = 0;
    for part in [&input[..split], &input[split..]] {
        if d.is_done() {
            break;
        }
        let n = d.decode(part, &mut out).map_err(|e| e.status())?;
        assert!(n <= part.len());
        // The decoder stops early only at the end of the body.
        assert!(n == part.len() || d.is_done());
        used += n;
        assert!(out.len() <= used, "decoded {} from {used} bytes", out.len());
    }
    Ok((out, used, d.is_done(), d.decoded()))
}

fuzz_target!(|data: &[u8]| {
    let [lo, hi, l, input @ ..] = data else {
        return;
    };
    let split = usize::from(u16::from_le_bytes([*lo, *hi])) % (input.len() + 1);
    let max_body = match l % 4 {
        0 => 0,
        1 => 16,
        2 => 4096,
        _ => u64::MAX,
    };
    let whole = run(input, input.len(), max_body);
    let parts = run(input, split, max_body);
    assert_eq!(whole, parts, "split at {split}");
    if let Ok((out, _, done, decoded)) = &whole {
        assert!(decoded <= &max_body);
        if *done {
            assert_eq!(out.len() as u64, *decoded);
        }
    }
});
