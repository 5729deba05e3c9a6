//! The exact layer in Redis/Valkey (`[cache] store = "redis"`): a fleet of gateways shares its
//! hits. The store is the `[limits]` one (`redis_url`, password, prefix, timeout), whether or not
//! the limits use it; each shard has its own pipelined connection (`governance::store::Store`,
//! the same client the limits use: reconnects with backoff, deadlines).
//!
//! Layout: `<prefix>cache:<32 hex of the key>` → 16 bytes of usage (input, output tokens,
//! little-endian u64, `u64::MAX` = not reported) then the stored answer; `SET … PX <ttl>`.
//! Redis's own `maxmemory` policy bounds it (`max_bytes` bounds the memory layer only). A store
//! that is down or slower than `redis_timeout_ms` is a miss and the answer is not stored —
//! never an error. Semantic entries (vectors) stay in process memory.
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

    /// The stored answer under `k` (`None`: absent, or the store is down or slow).
    pub async fn get(&self, k: &Key) -> Option<(Vec<u8>, Usage)> {
        let key = self.key(k);
        match self.store.call(&[Arg::S("GET"), Arg::S(&key)]).await {
            Ok(Reply::Bulk(Some(v))) => decode(v),
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

fn encode(body: &[u8], u: Usage) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + body.len());
    v.extend_from_slice(&u.prompt_tokens.unwrap_or(u64::MAX).to_le_bytes());
    v.extend_from_slice(&u.completion_tokens.unwrap_or(u64::MAX).to_le_bytes());
    v.extend_from_slice(body);
    v
}

fn decode(mut v: Vec<u8>) -> Option<(Vec<u8>, Usage)> {
    let n = |b: &[u8]| {
        let x = u64::from_le_bytes(b.try_into().ok()?);
        Some((x != u64::MAX).then_some(x))
    };
    let usage = Usage {
        prompt_tokens: n(v.get(..8)?)?,
        completion_tokens: n(v.get(8..16)?)?,
        cached_tokens: None,
    };
    v.drain(..16);
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
        assert_eq!(v.len(), 16 + 7);
        assert_eq!(decode(v), Some((b"{\"a\":1}".to_vec(), u)));
        assert_eq!(decode(vec![1, 2, 3]), None);
    }
}
