//! SSE decoder (`translate::sse::SseDecoder`): split feeding and the encoder round trip.
//!
//! Input: `[split_lo, split_hi, stream bytes...]`.
//! Invariants: never panics; the events (and last event id) are identical whether the input is
//! fed at once, split at a fuzzer-chosen offset, or byte by byte; `encode_event` of a decoded
//! event decodes back to the same event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::dialect::sse::{encode_event, SseDecoder, SseEvent};

fn decode(parts: &[&[u8]]) -> (Vec<SseEvent>, Option<String>) {
    let mut d = SseDecoder::new();
    let mut evs = Vec::new();
    for p in parts {
        d.feed(p);
        while let Some(e) = d.next_event() {
            evs.push(e);
        }
    }
    d.finish();
    while let Some(e) = d.next_event() {
        evs.push(e);
    }
    assert_eq!(d.pending_bytes(), 0);
    (evs, d.last_event_id().map(str::to_string))
}

fuzz_target!(|data: &[u8]| {
    let [lo, hi, input @ ..] = data else { return };
    let split = usize::from(u16::from_le_bytes([*lo, *hi])) % (input.len() + 1);
    let whole = decode(&[input]);
    let (a, b) = input.split_at(split);
    assert_eq!(whole, decode(&[a, b]), "split at {split}");
    if input.len() <= 512 {
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(whole, decode(&bytes), "byte by byte");
    }
    for ev in &whole.0 {
        let mut enc = Vec::new();
        encode_event(ev.event.as_deref(), &ev.data, &mut enc);
        let (back, _) = decode(&[&enc]);
        assert_eq!(back.as_slice(), std::slice::from_ref(ev));
    }
});
