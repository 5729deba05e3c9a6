//! Engine load-signal pages (`engine::prom::scan`, `engine::signal::normalise`): the bounded
//! Prometheus-text reader and llama.cpp's `/slots` JSON.
//!
//! Input: `[kind, page bytes...]` (kind % 5: vllm, sglang, llamacpp, ollama, tgi; odd kinds
//! also read the page as `/slots`).
//! Invariants: never panics; a sample's counts are whole and its KV usage within 0..=1; the
//! scan of a page is the same as the scan of the page with a comment line prepended (comments
//! and HELP/TYPE lines never change a value).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::engine::prom::{scan, Fold};
use ringgate::engine::signal::{normalise, EngineKind};

fuzz_target!(|data: &[u8]| {
    let [k, page @ ..] = data else { return };
    let kind = [
        EngineKind::Vllm,
        EngineKind::Sglang,
        EngineKind::Llamacpp,
        EngineKind::Ollama,
        EngineKind::Tgi,
    ][usize::from(*k) % 5];
    for slots in [false, k % 2 == 1] {
        if let Ok(s) = normalise(kind, page, slots) {
            if let Some(kv) = s.kv {
                assert!((0.0..=1.0).contains(&kv), "{kv}");
            }
        }
    }
    let wanted = [("vllm:num_requests_waiting", Fold::Sum), ("a", Fold::Max)];
    let plain = scan(page, &wanted);
    let mut commented = b"# HELP vllm:num_requests_waiting 9\n".to_vec();
    commented.extend_from_slice(page);
    let lines = page.iter().filter(|&&b| b == b'\n').count();
    if commented.len() <= ringgate::engine::prom::MAX_PAGE
        && lines + 2 < ringgate::engine::prom::MAX_LINES
    {
        let with = scan(&commented, &wanted);
        // a first line that was a partial sample is now a whole line on its own: compare
        // only when the page starts a fresh line
        if page.first().is_none_or(|&b| b == b'\n' || b == b'#') {
            assert_eq!(
                plain.map(|v| v.map(f64::to_bits)),
                with.map(|v| v.map(f64::to_bits))
            );
        }
    }
    for v in plain.into_iter().flatten() {
        assert!(v.is_finite());
    }
});
