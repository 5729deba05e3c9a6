//! Request translation: every inbound dialect → hub Chat request → every outbound dialect.
//!
//! Input: a client request body (JSON), tried as each dialect.
//! Invariants: never panics or overflows; every outbound body is valid JSON (an object); a
//! non-Gemini outbound body carries the upstream model.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::dialect::{chat_to_request, request_to_chat, Dialect};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    for from in Dialect::ALL {
        let Ok(hub) = request_to_chat(from, data) else {
            continue;
        };
        for to in Dialect::ALL {
            let Ok(out) = chat_to_request(to, &hub, "up-model") else {
                continue;
            };
            let v: Value = serde_json::from_slice(&out)
                .unwrap_or_else(|e| panic!("{from:?}->{to:?}: outbound body is not JSON: {e}"));
            assert!(
                v.is_object(),
                "{from:?}->{to:?}: outbound body is not an object"
            );
            if to != Dialect::Gemini {
                assert_eq!(
                    v.get("model").and_then(Value::as_str),
                    Some("up-model"),
                    "{from:?}->{to:?}"
                );
            }
        }
    }
});
