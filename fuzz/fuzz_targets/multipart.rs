//! The multipart model reader (`http::multipart`): the bounded look for one field in the first
//! parts of a `multipart/form-data` body.
//!
//! Input: `[split_lo, split_hi, boundary_len, boundary..., body...]`.
//! Invariants: never panics; a found value lies inside the body and within `MAX_VALUE`; a
//! prefix of the body (fed as not complete) answers `More` or exactly what the whole body
//! answers (nothing found early is contradicted later).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::http::multipart::{boundary, find_field, Scan, MAX_VALUE};

fuzz_target!(|data: &[u8]| {
    let [lo, hi, blen, rest @ ..] = data else {
        return;
    };
    let blen = usize::from(*blen).min(rest.len());
    let (b, body) = rest.split_at(blen);
    let mut ct = b"multipart/form-data; boundary=".to_vec();
    ct.extend_from_slice(b);
    let Ok(b) = boundary(&ct) else { return };
    let whole = find_field(body, b, b"model", true);
    if let Ok(Scan::Found(r)) = &whole {
        assert!(r.end <= body.len() && r.len() <= MAX_VALUE);
    }
    let cut = usize::from(u16::from_le_bytes([*lo, *hi])) % (body.len() + 1);
    match find_field(&body[..cut], b, b"model", false) {
        Ok(Scan::More) => {}
        early => assert_eq!(early, whole, "cut at {cut}"),
    }
});
