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
//! `PrefixIndex`: per deployment, process-wide (every shard routes into and reads the same
//! one, `forward::shared`, so a conversation's next turn finds its engine whichever shard its
//! connection lands on), a fixed-size table of block hashes → when last routed there (an
//! approximation of the engine's cache: it forgets by age and by capacity, never asks the
//! engine). `matched` counts the leading blocks of a prompt that are in it.
//!
//! The table: `capacity` `AtomicU64` slots in two-way buckets (the bucket from a hash's low
//! bits; a slot holds the hash's high 40 bits and when it was routed, in 16 ms units, 24 bits,
//! compared wrapping — 74 h). A lookup is two `Relaxed` loads per block, an insert two loads
//! and a store; a new block takes the free or older slot of its bucket. Concurrent inserts may
//! overwrite each other (one of them is forgotten): approximate, never wrong about safety, and
//! bounded — `capacity × 8` bytes whatever the traffic.
//!
//! Owns: `prompt_blocks`, `Blocks`, `PrefixIndex`. Must not: allocate per block beyond the
//! `Blocks` vector, read clocks (callers pass `now` as milliseconds), or do IO.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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

/// Slot layout: the hash's high 40 bits (never all zero: an empty slot is 0) | 24 bits of time.
const TIME_BITS: u32 = 24;
const TIME_MASK: u64 = (1 << TIME_BITS) - 1;
/// Time unit of a slot: 16 ms (`now_ms >> 4`).
const TIME_SHIFT: u32 = 4;

/// Approximate index of the prefixes recently sent to one engine (see the module doc).
#[derive(Debug)]
pub struct PrefixIndex {
    slots: Box<[AtomicU64]>,
    /// Buckets − 1 (two slots a bucket; a power of two).
    mask: u64,
    ttl: u64,
}

impl PrefixIndex {
    /// About `capacity` blocks (rounded up to a power of two, at least 2), each forgotten
    /// `ttl_ms` after it was last routed.
    pub fn new(capacity: usize, ttl_ms: u64) -> PrefixIndex {
        let slots = capacity.max(2).next_power_of_two();
        PrefixIndex {
            slots: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            mask: (slots / 2 - 1) as u64,
            ttl: (ttl_ms >> TIME_SHIFT).min(TIME_MASK / 2),
        }
    }

    fn tag(h: u64) -> u64 {
        (h >> TIME_BITS | 1) << TIME_BITS
    }

    fn bucket(&self, h: u64) -> usize {
        ((h & self.mask) * 2) as usize
    }

    /// Age of a slot in time units; negative for another shard's slightly later clock read.
    fn age(slot: u64, now: u64) -> i64 {
        let d = (now.wrapping_sub(slot) & TIME_MASK) as i64;
        if d > (TIME_MASK / 2) as i64 {
            d - (1 << TIME_BITS)
        } else {
            d
        }
    }

    fn fresh(&self, slot: u64, now: u64) -> bool {
        slot != 0 && Self::age(slot, now).unsigned_abs() <= self.ttl
    }

    /// Leading blocks of `blocks` routed here within the TTL.
    pub fn matched(&self, blocks: &[u64], now_ms: u64) -> usize {
        let now = now_ms >> TIME_SHIFT;
        leading(blocks, |h| {
            let (tag, b) = (Self::tag(h), self.bucket(h));
            self.slots[b..b + 2].iter().any(|s| {
                let v = s.load(Relaxed);
                v & !TIME_MASK == tag && self.fresh(v, now)
            })
        })
    }

    /// Remember that `blocks` were routed here at `now_ms`: each takes its own slot, else the
    /// free or older one of its bucket.
    pub fn insert(&self, blocks: &[u64], now_ms: u64) {
        let now = now_ms >> TIME_SHIFT;
        for &h in blocks {
            let (tag, b) = (Self::tag(h), self.bucket(h));
            let pair = &self.slots[b..b + 2];
            let (x, y) = (pair[0].load(Relaxed), pair[1].load(Relaxed));
            let age = |v: u64| match v {
                0 => u64::MAX,
                v if !self.fresh(v, now) => u64::MAX - 1,
                v => Self::age(v, now).max(0) as u64,
            };
            let i = if x & !TIME_MASK == tag {
                0
            } else if y & !TIME_MASK == tag {
                1
            } else {
                usize::from(age(y) > age(x))
            };
            pair[i].store(tag | (now & TIME_MASK), Relaxed);
        }
    }

    /// Slots holding a block routed within the TTL at `now_ms`.
    pub fn len_at(&self, now_ms: u64) -> usize {
        let now = now_ms >> TIME_SHIFT;
        self.slots
            .iter()
            .filter(|s| self.fresh(s.load(Relaxed), now))
            .count()
    }

    /// Slots in the table (the bound).
    pub fn capacity(&self) -> usize {
        self.slots.len()
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
        let ix = PrefixIndex::new(128, 1_000);
        let p: Blocks = (1..=10u64).map(|i| i.wrapping_mul(K)).collect();
        ix.insert(&p, 0);
        assert_eq!(ix.matched(&p, 500), 10);
        let q: Blocks = p[..3]
            .iter()
            .copied()
            .chain([99u64.wrapping_mul(K)])
            .collect();
        assert_eq!(ix.matched(&q, 500), 3);
        assert_eq!(ix.matched(&p, 2_000), 0, "expired");
        for i in 0..10_000u64 {
            ix.insert(&[(i + 1_000).wrapping_mul(K)], i);
        }
        assert_eq!(ix.capacity(), 128);
        assert!(ix.len_at(9_999) <= 128);
        assert_eq!(
            ix.matched(&[10_999u64.wrapping_mul(K)], 9_999),
            1,
            "the newest stays"
        );
        // shared: one shard routes, another reads (the table is `Sync`)
        let ix = std::sync::Arc::new(PrefixIndex::new(64, 1_000));
        let (w, q) = (ix.clone(), p.clone());
        std::thread::spawn(move || w.insert(&q, 10)).join().unwrap();
        assert_eq!(ix.matched(&p, 20), 10);
    }
}
