//! Prompt prefixes as chained block hashes, and the approximate per-engine index of recently
//! routed prefixes that `lb = "load"` scores affinity with.
//!
//! A request's prompt is the raw JSON of its `system`, `tools` and `messages` (or `input`)
//! fields, in that order — the order a chat template renders them — cut into `BLOCK_BYTES`
//! blocks (~16 tokens at the usual 4 bytes a token, vLLM's default KV block size). Block k's
//! hash covers blocks 0..=k (each hash is seeded with the previous one), so two prompts share
//! the first n hashes exactly when they share the first n blocks — what an engine's prefix
//! cache (vLLM automatic prefix caching, SGLang's radix tree, llama.cpp's slot cache) reuses.
//! At most `MAX_BLOCKS` blocks are hashed (a 16 KiB prefix): the cost per request is bounded
//! and a long conversation is identified by its head. A trailing partial block is not hashed
//! (an engine cannot reuse half a block either).
//!
//! `PrefixIndex`: per engine, a bounded table of block hashes → when last routed there
//! (an approximation of the engine's cache: it forgets by age and by capacity, never asks the
//! engine). `matched` counts the leading blocks of a prompt that are in it.
//!
//! Owns: `prompt_blocks`, `Blocks`, `PrefixIndex`. Must not: allocate per block beyond the
//! `Blocks` vector, read clocks (callers pass `now` as milliseconds), or do IO.

use std::cell::RefCell;
use std::collections::HashMap;

use smallvec::SmallVec;

/// Bytes per hashed block (~16 tokens).
pub const BLOCK_BYTES: usize = 64;
/// Blocks hashed at most per prompt (16 KiB of prompt JSON).
pub const MAX_BLOCKS: usize = 256;

/// A prompt's chained block hashes, in order.
pub type Blocks = SmallVec<[u64; 32]>;

const K: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(K).rotate_left(29)
}

/// Streaming block hasher: feed pieces, blocks cut across piece boundaries.
struct Chain {
    h: u64,
    fill: usize,
    word: u64,
    wbytes: u32,
    out: Blocks,
}

impl Chain {
    fn new() -> Chain {
        Chain {
            h: 0x5172_696e_6767_6174,
            fill: 0,
            word: 0,
            wbytes: 0,
            out: Blocks::new(),
        }
    }

    fn full(&self) -> bool {
        self.out.len() >= MAX_BLOCKS
    }

    fn byte(&mut self, b: u8) {
        self.word |= u64::from(b) << (8 * self.wbytes);
        self.wbytes += 1;
        if self.wbytes == 8 {
            self.word(self.word);
            self.word = 0;
            self.wbytes = 0;
        }
    }

    /// A whole little-endian word (8 bytes of the stream).
    fn word(&mut self, w: u64) {
        if self.full() {
            return;
        }
        self.h = mix(self.h, w);
        self.fill += 8;
        if self.fill == BLOCK_BYTES {
            // finalise: the chained hash of blocks 0..=k
            let f = mix(self.h, self.out.len() as u64 ^ 0xb10c);
            self.out.push(f);
            self.h = f;
            self.fill = 0;
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        // finish a partial word, then whole words (blocks are whole words), then the rest
        while self.wbytes != 0 {
            let [b, rest @ ..] = bytes else { return };
            self.byte(*b);
            bytes = rest;
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            if self.full() {
                return;
            }
            let mut a = [0u8; 8];
            a.copy_from_slice(w);
            self.word(u64::from_le_bytes(a));
        }
        for &b in words.remainder() {
            self.byte(b);
        }
    }
}

/// Hash these pieces of a prompt, in order, as one byte stream.
pub fn hash_pieces<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Blocks {
    let mut c = Chain::new();
    for p in pieces {
        c.feed(p);
        if c.full() {
            break;
        }
    }
    c.out
}

/// The block hashes of a chat request body's prompt (`system`, `tools`, `messages`, or
/// Responses' `instructions` / `input`). An unparsable body or one without a prompt gives no
/// blocks (no affinity, never an error: the request's own checks answer that).
pub fn prompt_blocks(body: &[u8]) -> Blocks {
    const KEYS: [&str; 5] = ["system", "instructions", "tools", "messages", "input"];
    let mut tree = sonic_rs::PointerTree::new();
    for k in KEYS {
        tree.add_path([k].iter());
    }
    let Ok(nodes) = sonic_rs::get_many(body, &tree) else {
        return Blocks::new();
    };
    hash_pieces(
        nodes
            .iter()
            .filter_map(|n| n.as_ref().map(|v| v.as_raw_str().as_bytes())),
    )
}

/// How many leading blocks of `blocks` satisfy `has`.
pub fn leading(blocks: &[u64], has: impl Fn(u64) -> bool) -> usize {
    blocks.iter().take_while(|&&b| has(b)).count()
}

/// Approximate index of the prefixes recently sent to one engine (see the module doc).
#[derive(Debug)]
pub struct PrefixIndex {
    /// block hash → last routed (ms since the index's epoch).
    seen: RefCell<HashMap<u64, u64>>,
    capacity: usize,
    ttl_ms: u64,
}

impl PrefixIndex {
    /// At most `capacity` blocks, each forgotten `ttl_ms` after it was last routed.
    pub fn new(capacity: usize, ttl_ms: u64) -> PrefixIndex {
        PrefixIndex {
            seen: RefCell::new(HashMap::new()),
            capacity: capacity.max(1),
            ttl_ms,
        }
    }

    /// Leading blocks of `blocks` routed here within the TTL.
    pub fn matched(&self, blocks: &[u64], now_ms: u64) -> usize {
        let seen = self.seen.borrow();
        leading(blocks, |b| {
            seen.get(&b)
                .is_some_and(|&t| now_ms.saturating_sub(t) <= self.ttl_ms)
        })
    }

    /// Remember that `blocks` were routed here at `now_ms`. When full, entries older than the
    /// TTL go first, then the oldest half (amortised: one sweep per `capacity / 2` inserts).
    pub fn insert(&self, blocks: &[u64], now_ms: u64) {
        let mut seen = self.seen.borrow_mut();
        for &b in blocks {
            seen.insert(b, now_ms);
        }
        if seen.len() > self.capacity {
            let ttl = self.ttl_ms;
            seen.retain(|_, t| now_ms.saturating_sub(*t) <= ttl);
            if seen.len() > self.capacity / 2 {
                let mut ages: Vec<u64> = seen.values().copied().collect();
                let cut = ages.len() - self.capacity / 2;
                ages.select_nth_unstable(cut.saturating_sub(1));
                let limit = ages[cut.saturating_sub(1)];
                seen.retain(|_, t| *t > limit);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.seen.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_share_leading_hashes() {
        let sys = "s".repeat(640);
        let a = format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{sys}"}},{{"role":"user","content":"question one, rather long to fill a block or two of bytes"}}]}}"#
        );
        let b = format!(
            r#"{{"messages":[{{"role":"system","content":"{sys}"}},{{"role":"user","content":"another question entirely different from the first"}}],"model":"m"}}"#
        );
        let (ha, hb) = (prompt_blocks(a.as_bytes()), prompt_blocks(b.as_bytes()));
        assert!(ha.len() >= 10 && hb.len() >= 10);
        let common = leading(&ha, |h| hb.contains(&h));
        assert!((10..ha.len()).contains(&common), "{common} of {}", ha.len());
        assert_ne!(ha.last(), hb.last());
        // field order outside the prompt does not matter; a short prompt has no whole block
        assert!(prompt_blocks(br#"{"messages":[]}"#).is_empty());
        assert!(prompt_blocks(b"{nope").is_empty());
    }

    #[test]
    fn pieces_hash_as_one_stream() {
        let text: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let whole = hash_pieces([&text[..]]);
        assert_eq!(whole.len(), 1000 / BLOCK_BYTES);
        for cut in [0, 1, 3, 7, 8, 9, 63, 64, 65, 500, 999] {
            let (a, b) = text.split_at(cut);
            assert_eq!(hash_pieces([a, b]), whole, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = text.chunks(3).collect();
        assert_eq!(hash_pieces(bytes), whole);
    }

    #[test]
    fn blocks_are_bounded() {
        let big = format!(r#"{{"messages":"{}"}}"#, "x".repeat(1 << 20));
        assert_eq!(prompt_blocks(big.as_bytes()).len(), MAX_BLOCKS);
        let pieces: Vec<&[u8]> = big.as_bytes().chunks(5).collect();
        assert_eq!(hash_pieces(pieces).len(), MAX_BLOCKS);
    }

    #[test]
    fn index_matches_forgets_by_age_and_stays_bounded() {
        let ix = PrefixIndex::new(100, 1_000);
        let p: Blocks = (1..=10).collect();
        ix.insert(&p, 0);
        assert_eq!(ix.matched(&p, 500), 10);
        let q: Blocks = [1, 2, 3, 99].into_iter().collect();
        assert_eq!(ix.matched(&q, 500), 3);
        assert_eq!(ix.matched(&p, 2_000), 0, "expired");
        for i in 0..1_000u64 {
            ix.insert(&[i * 7 + 1_000], i);
        }
        assert!(ix.len() <= 100, "{}", ix.len());
        assert_eq!(ix.matched(&[999 * 7 + 1_000], 999), 1, "the newest stays");
    }
}
