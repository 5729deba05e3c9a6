//! The exact layer in Redis/Valkey (`[cache] store = "redis"`): a fleet of gateways shares its
//! hits. The store is the `[limits]` one (`redis_url`, password, prefix, timeout), whether or not
//! the limits use it; each shard has its own pipelined connection (`governance::store::Store`,
//! the same client the limits use: reconnects with backoff, deadlines).
//!
//! Layout: `<prefix>cache:<32 hex of the key>` → `RGC1`, the answer's length (u32), its
//! FNV-1a 64 hash, 16 bytes of usage (input, output tokens, `u64::MAX` = not reported; all
//! little-endian) then the stored answer; `SET … PX <ttl>`. Read back in `GETRANGE` pieces
//! (each under the store client's bulk bound, `resp::MAX_BULK`), at most `max_entry_bytes` of
//! answer; a value whose length or hash does not match (another node replaced it between two
//! pieces, or bytes that are not ours) is a miss. Redis's own `maxmemory` policy bounds it
//! (`max_bytes` bounds the memory layer only). A store that is down or slower than
//! `redis_timeout_ms` is a miss and the answer is not stored — never an error. Semantic entries
//! (vectors) stay in process memory.
//!
//! Owns: `Remote` and the value layout. Must not: block the shard, or be used off its shard.

use std::time::Duration;

use super::key::{hex, Key};
use crate::dialect::Usage;
use crate::governance::store::resp::{Arg, Reply};
use crate::governance::store::{Settings, Store};

/// One shard's connection to the cache's Redis.
pub struct Remote {
    store: Store,
    prefix: String,
}

impl Remote {
    pub fn new(s: Settings, shard: usize) -> Remote {
        let prefix = format!("{}cache:", s.prefix);
        Remote {
            store: Store::new(s, shard),
            prefix,
        }
    }

    /// Connect and reconnect for as long as the shard runs.
    pub async fn maintain(&self) {
        self.store.maintain(&String::new, &|| {}).await
    }

    fn key(&self, k: &Key) -> String {
        let mut s = String::with_capacity(self.prefix.len() + 32);
        s.push_str(&self.prefix);
        s.push_str(&hex(k));
        s
    }

    /// The stored answer under `k`, at most `max_body` bytes of it (`None`: absent, too large,
    /// not a whole value of ours, or the store is down or slow).
    pub async fn get(&self, k: &Key, max_body: u64) -> Option<(Vec<u8>, Usage)> {
        let key = self.key(k);
        let mut v = self.piece(&key, 0).await?;
        let total = HEAD as u64 + u64::from(u32::from_le_bytes(v.get(4..8)?.try_into().ok()?));
        if v.get(..4)? != MAGIC || total > HEAD as u64 + max_body {
            return None;
        }
        while (v.len() as u64) < total {
            let more = self.piece(&key, v.len()).await?;
            if more.is_empty() {
                return None;
            }
            v.extend_from_slice(&more);
        }
        decode(v)
    }

    /// `PIECE` bytes of the value under `key` from byte `from` (fewer at its end).
    async fn piece(&self, key: &str, from: usize) -> Option<Vec<u8>> {
        let args = [
            Arg::S("GETRANGE"),
            Arg::S(key),
            Arg::U(from as u64),
            Arg::U((from + PIECE - 1) as u64),
        ];
        match self.store.call(&args).await {
            Ok(Reply::Bulk(Some(v))) => Some(v),
            _ => None,
        }
    }

    /// Store `body` under `k` for `ttl` (not waited for; false when the store is down).
    pub fn set(&self, k: &Key, body: &[u8], usage: Usage, ttl: Duration) -> bool {
        let key = self.key(k);
        let v = encode(body, usage);
        let ms = ttl.as_millis().max(1) as u64;
        self.store.send_command(&[
            Arg::S("SET"),
            Arg::S(&key),
            Arg::B(&v),
            Arg::S("PX"),
            Arg::U(ms),
        ])
    }
}

/// Bytes read per `GETRANGE`: under the store client's bulk bound (`resp::MAX_BULK`).
const PIECE: usize = 60 * 1024;
const MAGIC: &[u8; 4] = b"RGC1";
/// Magic, answer length (u32), FNV-1a 64 of the answer, two usage counts.
const HEAD: usize = 4 + 4 + 8 + 16;

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn encode(body: &[u8], u: Usage) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEAD + body.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    v.extend_from_slice(&fnv1a(body).to_le_bytes());
    v.extend_from_slice(&u.prompt_tokens.unwrap_or(u64::MAX).to_le_bytes());
    v.extend_from_slice(&u.completion_tokens.unwrap_or(u64::MAX).to_le_bytes());
    v.extend_from_slice(body);
    v
}

/// A whole value of ours: magic, length and hash checked.
fn decode(mut v: Vec<u8>) -> Option<(Vec<u8>, Usage)> {
    let u = |b: &[u8]| Some(u64::from_le_bytes(b.try_into().ok()?));
    let n = |b: &[u8]| Some(u(b)?).map(|x| (x != u64::MAX).then_some(x));
    let len = u32::from_le_bytes(v.get(4..8)?.try_into().ok()?) as usize;
    if v.get(..4)? != MAGIC || v.len() != HEAD.checked_add(len)? {
        return None;
    }
    let usage = Usage {
        prompt_tokens: n(v.get(16..24)?)?,
        completion_tokens: n(v.get(24..32)?)?,
        cached_tokens: None,
    };
    if u(v.get(8..16)?)? != fnv1a(v.get(HEAD..)?) {
        return None;
    }
    v.drain(..HEAD);
    Some((v, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_layout_round_trips() {
        let u = Usage {
            prompt_tokens: Some(3),
            completion_tokens: None,
            cached_tokens: None,
        };
        let v = encode(b"{\"a\":1}", u);
        assert_eq!(v.len(), HEAD + 7);
        assert_eq!(decode(v.clone()), Some((b"{\"a\":1}".to_vec(), u)));
        assert_eq!(decode(vec![1, 2, 3]), None);
        // a value cut short, one byte longer, or one whose answer changed: not ours
        assert_eq!(decode(v[..v.len() - 1].to_vec()), None);
        let mut longer = v.clone();
        longer.push(b' ');
        assert_eq!(decode(longer), None);
        let mut other = v.clone();
        let last = other.len() - 1;
        other[last] = b']';
        assert_eq!(decode(other), None);
        let mut old = v;
        old[..4].copy_from_slice(b"RGC0");
        assert_eq!(decode(old), None);
    }
}
