//! Stream translation: SSE events decoded from the input, pushed through a `StreamTranslator`
//! for every (upstream, client) dialect pair.
//!
//! Input: `[flags, upstream SSE bytes...]`; flag bit 0 = Chat client asked for usage.
//! Invariants: never panics; after an error the translator still ends the stream; the client
//! bytes decode as SSE, and for translated pairs every event's data is JSON (or Chat's
//! `[DONE]`); `finish` marks the stream done and is idempotent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::dialect::{Dialect, SseDecoder, SseEvent, StreamTranslator};

fn events(bytes: &[u8]) -> Vec<SseEvent> {
    let mut d = SseDecoder::new();
    d.feed(bytes);
    d.finish();
    std::iter::from_fn(|| d.next_event()).collect()
}

fuzz_target!(|data: &[u8]| {
    let [flags, input @ ..] = data else { return };
    let upstream_events = events(input);
    for up in Dialect::ALL {
        for client in Dialect::ALL {
            let mut t =
                StreamTranslator::new(up, client, "client-model").with_chat_usage(flags & 1 == 1);
            let mut out = Vec::new();
            for ev in &upstream_events {
                if let Err(e) = t.push(ev, &mut out) {
                    t.error(&e.to_string(), &mut out);
                    break;
                }
            }
            t.finish(&mut out);
            assert!(t.is_done(), "{up:?}->{client:?}: not done after finish");
            let len = out.len();
            t.finish(&mut out);
            assert_eq!(out.len(), len, "{up:?}->{client:?}: finish not idempotent");
            if up == client {
                continue;
            }
            for ev in events(&out) {
                if ev.data == "[DONE]" && client == Dialect::Chat {
                    continue;
                }
                if let Err(e) = serde_json::from_str::<serde_json::Value>(&ev.data) {
                    panic!(
                        "{up:?}->{client:?}: client event is not JSON: {e}: {:?}",
                        ev.data
                    );
                }
            }
        }
    }
});
