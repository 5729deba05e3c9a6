//! RESP2 reply parser of the shared limits store (`governance::store::resp::parse`): the bytes a
//! Redis/Valkey server (or anything answering on its port) sends, parsed reply after reply as
//! the store's reader does, fed in two pieces split at a fuzzer-chosen offset.
//!
//! Input: `[split_lo, split_hi, reply bytes...]`.
//! Invariants: never panics; every reply uses at least one byte and no more than are there;
//! replies, bytes used and error/ok are the same whether the bytes come at once or in two
//! pieces (an incomplete reply is "need more", never an error that goes away with more bytes,
//! never a different reply); a bulk string is never larger than `MAX_BULK`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringgate::governance::store::resp::{self, Reply};

type Outcome = (Vec<Reply>, usize, bool);

/// Parse every complete reply of `input`, given in pieces as a socket would give them.
fn run(input: &[u8], split: usize) -> Outcome {
    let mut buf = Vec::new();
    let mut replies = Vec::new();
    let mut used = 0;
    for part in [&input[..split], &input[split..]] {
        buf.extend_from_slice(part);
        loop {
            match resp::parse(&buf[used..]) {
                Ok(Some((r, n))) => {
                    assert!(n > 0 && used + n <= buf.len());
                    check(&r, 0);
                    used += n;
                    replies.push(r);
                }
                Ok(None) => break,
                Err(_) => return (replies, used, true),
            }
        }
    }
    (replies, used, false)
}

fn check(r: &Reply, depth: usize) {
    assert!(depth < resp::MAX_DEPTH);
    match r {
        Reply::Bulk(Some(b)) => assert!(b.len() <= resp::MAX_BULK),
        Reply::Simple(l) | Reply::Error(l) => assert!(l.len() <= resp::MAX_LINE),
        Reply::Array(Some(items)) => {
            assert!(items.len() <= resp::MAX_ITEMS);
            for i in items {
                check(i, depth + 1);
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let [lo, hi, input @ ..] = data else {
        return;
    };
    let split = usize::from(u16::from_le_bytes([*lo, *hi])) % (input.len() + 1);
    let whole = run(input, input.len());
    let parts = run(input, split);
    assert_eq!(whole, parts, "split at {split}");
});
