//! Response translation: every upstream dialect → hub Chat completion → every client dialect,
//! and upstream error bodies → every client dialect's error shape.
//!
//! Input: `[status_sel, body bytes...]`.
//! Invariants: never panics or overflows; every client body is a JSON object; a translated
//! error body is a JSON object with an `error` member (all four dialects put it there).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::dialect::{chat_to_response, response_to_chat, upstream_error_to_client, Dialect};
use serde_json::Value;

const STATUSES: [u16; 8] = [400, 401, 403, 404, 429, 500, 502, 503];

fn object(bytes: &[u8], what: &str) -> Value {
    let v: Value = serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("{what}: not JSON: {e}: {}", String::from_utf8_lossy(bytes)));
    assert!(v.is_object(), "{what}: not an object");
    v
}

fuzz_target!(|data: &[u8]| {
    let [s, body @ ..] = data else { return };
    for from in Dialect::ALL {
        if let Ok(hub) = response_to_chat(from, body) {
            for to in Dialect::ALL {
                if let Ok(out) = chat_to_response(to, &hub, "client-model") {
                    object(&out, &format!("response {from:?}->{to:?}"));
                }
            }
        }
    }
    let status = STATUSES[usize::from(*s) % STATUSES.len()];
    for up in Dialect::ALL {
        for client in Dialect::ALL {
            let out = upstream_error_to_client(up, client, status, body);
            let v = object(&out, &format!("error {up:?}->{client:?}"));
            assert!(
                v.get("error").is_some(),
                "error {up:?}->{client:?}: no `error`"
            );
        }
    }
});
