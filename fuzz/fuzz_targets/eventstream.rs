//! AWS event-stream decoder (`upstream::bedrock::eventstream`) and the Converse stream
//! translation behind it (`upstream::bedrock::events`).
//!
//! Input: `[split_lo, split_hi, stream bytes...]`.
//! Invariants: never panics; the frames (or the error) are identical whether the input is fed
//! at once or split at a fuzzer-chosen offset; a re-encoded decoded frame decodes back to it;
//! the Converse translation of any frames never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::upstream::bedrock::events::ConverseEvents;
use ringgate::upstream::bedrock::eventstream::{encode, Decoder, Frame};

fn decode(parts: &[&[u8]]) -> (Vec<Frame>, Option<String>) {
    let mut d = Decoder::new();
    let mut out = Vec::new();
    for p in parts {
        d.feed(p);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => out.push(f),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

fuzz_target!(|data: &[u8]| {
    let [lo, hi, input @ ..] = data else { return };
    let split = usize::from(u16::from_le_bytes([*lo, *hi])) % (input.len() + 1);
    let whole = decode(&[input]);
    let (a, b) = input.split_at(split);
    assert_eq!(whole, decode(&[a, b]), "split at {split}");
    for f in &whole.0 {
        let enc = encode(
            &[(":message-type", &f.message_type), (":event-type", &f.kind)],
            &f.payload,
        );
        let (back, err) = decode(&[&enc]);
        assert!(err.is_none());
        assert_eq!((&back[0].kind, &back[0].payload), (&f.kind, &f.payload));
    }
    let mut ev = ConverseEvents::new("id", 0, "m", true);
    ev.feed(a);
    ev.feed(b);
    ev.finish();
    while let Ok(Some(_)) = ev.next_event() {}
});
