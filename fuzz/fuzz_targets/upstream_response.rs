//! Upstream response head parser (`upstream::exchange::parse_response_head`, via
//! `ringgate::fuzzing`) and the body framing it selects (Content-Length, chunked, close).
//!
//! Input: raw bytes as an upstream would send them (head, then body), or (first byte `0xFF`,
//! which no HTTP response starts with) a repetition amplifier `[0xFF, n_lo, n_hi, k, rest...]`
//! that sends the first `k` bytes of `rest` n times (n < 65,536) and then the remainder, so
//! long runs of interim `1xx` responses or header lines are reached without huge inputs.
//! Invariants: never panics or overflows; the head length lies inside the buffer; a strict
//! prefix of a complete head is never complete; the header lines forwarded to the client and
//! the content type hold no CR/LF/NUL or other control bytes (no response splitting); the
//! decoded body is never longer than the bytes after the head.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::fuzzing::parse_response_head;
use ringgate::http::chunked::ChunkedDecoder;
use ringgate::upstream::RespFraming;

fn clean(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

fn amplify(data: &[u8]) -> Option<Vec<u8>> {
    let [0xFF, lo, hi, k, rest @ ..] = data else {
        return None;
    };
    let n = usize::from(u16::from_le_bytes([*lo, *hi]));
    let (unit, tail) = rest.split_at(usize::from(*k).min(rest.len()));
    let mut out = unit.repeat(n);
    out.extend_from_slice(tail);
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let amplified = amplify(data);
    let data = amplified.as_deref().unwrap_or(data);
    let Ok(Some((head, len))) = parse_response_head(data) else {
        return;
    };
    assert!(len <= data.len());
    assert!(len > 0);
    if let Ok(Some((_, n))) = parse_response_head(&data[..len - 1]) {
        panic!("prefix of {} bytes complete with len {n}", len - 1);
    }
    assert!(
        clean(&head.content_type),
        "content type {:?}",
        head.content_type
    );
    let mut lines = head.forward.split(|&b| b == b'\n');
    let last = lines.next_back();
    assert_eq!(last, Some(&b""[..]), "forwarded headers end with CRLF");
    for line in lines {
        let line = line.strip_suffix(b"\r").expect("CRLF line endings");
        assert!(clean(line), "forwarded header line {line:?}");
    }
    if head.framing == RespFraming::Close {
        assert!(!head.keep_alive);
    }
    let rest = &data[len..];
    match head.framing {
        RespFraming::Length(n) => {
            let take = n.min(rest.len() as u64) as usize;
            assert!(take <= rest.len());
        }
        RespFraming::Chunked => {
            let mut d = ChunkedDecoder::new(u64::MAX);
            let mut out = Vec::new();
            if let Ok(used) = d.decode(rest, &mut out) {
                assert!(used <= rest.len());
                assert!(out.len() <= used);
            }
        }
        RespFraming::Close => {}
    }
});
