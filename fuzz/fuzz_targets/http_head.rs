//! Request-head parser (`http::head::parse`) under fuzzer-chosen limits.
//!
//! Input: `[max_head_sel, max_headers_sel, head bytes...]`.
//! Invariants: never panics; a complete head lies inside the buffer and within `max_head`;
//! every range it returns points inside the head; a strict prefix of a complete head is never
//! complete and never an error (the gateway reads heads incrementally, so a valid head must
//! not be rejected because of where a TCP segment ended).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::http::head::parse;

fuzz_target!(|data: &[u8]| {
    let [a, b, buf @ ..] = data else { return };
    let max_head = match a % 4 {
        0 => 64,
        1 => 512,
        2 => 8 * 1024,
        _ => 64 * 1024,
    };
    let max_headers = usize::from(*b % 130);
    let Ok(Some(h)) = parse(buf, max_head, max_headers) else {
        return;
    };
    assert!(h.len <= buf.len() && h.len <= max_head);
    assert!(h.target.start <= h.target.end && h.target.end <= h.len);
    for r in [
        &h.authorization,
        &h.x_api_key,
        &h.anthropic_version,
        &h.host,
        &h.authority,
    ]
    .into_iter()
    .flatten()
    {
        assert!(r.start <= r.end && r.end <= h.len);
    }
    let path = h.path(buf);
    let target = &buf[h.target.clone()];
    assert!(target.starts_with(path));
    if let Some(q) = h.query(buf) {
        assert_eq!(path.len() + 1 + q.len(), target.len());
    }
    // Incremental reads: every strict prefix is "need more bytes".
    for cut in [0, h.len / 2, h.len.saturating_sub(1)] {
        if cut < h.len {
            match parse(&buf[..cut], max_head, max_headers) {
                Ok(None) => {}
                Ok(Some(p)) => panic!("prefix of {cut} bytes complete with len {}", p.len),
                Err(e) => panic!("prefix of {cut} bytes rejected: {}", e.message),
            }
        }
    }
});
