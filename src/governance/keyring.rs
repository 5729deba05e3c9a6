//! The virtual keys of one gateway, compiled from `[[key]]`: names, allow-lists, limits, expiry,
//! and the SHA-256 digests of the secrets (never the secrets themselves).
//!
//! Owns: reading each `key_env` secret once at start (hashing it and dropping the value),
//! `Digest` and its constant-time equality, lookup of a presented secret, the allow-list rule,
//! and the snapshot structure (`Keyring`, `Slots`: a change makes the next snapshot in O(log n),
//! sharing every unchanged key).
//! Must not: keep, log or display a secret (errors and logs use the key's name), or hold
//! per-request state (that is `Governance` per shard).
//!
//! Lookup: the presented secret is hashed (SHA-256, `ring`) and the digest looked up in a
//! persistent map (`trie`) keyed by std's randomly seeded SipHash of the digest. What the
//! lookup's timing can reveal is about *digests* of attacker-chosen strings: how deep the
//! SipHash value's path goes (a secret per-process seed: nothing about digest bytes) and
//! whether a stored digest sits there, then equality, which is
//! constant-time (`subtle`) so no prefix of a stored digest leaks either. Learning a stored digest
//! would still not give the secret (preimage resistance), but it would allow an offline search of
//! a low-entropy secret; hence constant-time equality, and `ringgate check` warns about short
//! secrets.

use std::hash::{BuildHasher, Hash, Hasher, RandomState};

use subtle::ConstantTimeEq;

use super::spend::{usd_to_nanos, Period};
use super::trie::Trie;
use crate::config::{keys::parse_sha256, AuthMode, Config};

/// SHA-256 of a secret. Equality is constant-time.
#[derive(Clone, Copy, Debug)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub fn of(secret: &[u8]) -> Digest {
        let d = ring::digest::digest(&ring::digest::SHA256, secret);
        let mut out = [0u8; 32];
        out.copy_from_slice(d.as_ref());
        Digest(out)
    }
}

impl PartialEq for Digest {
    /// Constant-time: four 64-bit words compared with `subtle` (no early exit, one optimisation
    /// barrier per word rather than per byte).
    fn eq(&self, other: &Digest) -> bool {
        let word = |d: &Digest, i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&d.0[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(w)
        };
        let same = (0..4).fold(subtle::Choice::from(1), |acc, i| {
            acc & word(self, i).ct_eq(&word(other, i))
        });
        same.into()
    }
}

impl Eq for Digest {}

impl Hash for Digest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

/// A model allow-list entry: an exact name or a `prefix*`.
#[derive(Debug, Clone)]
pub enum ModelRule {
    Exact(Box<str>),
    Prefix(Box<str>),
}

/// One compiled `[[key]]`.
#[derive(Debug, Clone)]
pub struct Key {
    pub name: Box<str>,
    /// `None`: every model.
    pub models: Option<Box<[ModelRule]>>,
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    pub max_in_flight: Option<u64>,
    /// Unix seconds after which the key is refused.
    pub expires: Option<i64>,
    pub enabled: bool,
    /// Nano-USD per `period` (`budget_usd`).
    pub budget_nanos: Option<u64>,
    /// `budget_period` (default `total`): the period of the key's budget and ledger rows.
    pub period: Period,
    /// `mcp_tools`: globs over federated MCP tool names (`None`: every tool).
    pub mcp_tools: Option<std::sync::Arc<[Box<str>]>>,
}

impl Key {
    /// Whether this key may request `model` (the client's name).
    pub fn allows(&self, model: &str) -> bool {
        let Some(rules) = &self.models else {
            return true;
        };
        rules.iter().any(|r| match r {
            ModelRule::Exact(m) => **m == *model,
            ModelRule::Prefix(p) => model.starts_with(&**p),
        })
    }

    /// Whether any per-request counter applies (rate or token headers, limits).
    pub fn limited(&self) -> bool {
        self.rpm.is_some() || self.tpm.is_some() || self.max_in_flight.is_some()
    }
}

/// A snapshot's keys by slot: a persistent vector (`trie::Trie` keyed by slot), so the next
/// snapshot shares every key it did not change with this one.
#[derive(Debug, Clone, Default)]
pub struct Slots {
    trie: Trie<Slot>,
}

#[derive(Debug)]
struct Slot {
    key: Key,
    /// `None`: the key cannot be presented (revoked, or its secret is unknown).
    digest: Option<Digest>,
}

impl Slots {
    /// The key in slot `i`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&Key> {
        self.trie.get(i as u64).map(|s| &s.key)
    }

    /// How many slots (live keys and tombstones).
    pub fn len(&self) -> usize {
        self.trie.len()
    }

    pub fn is_empty(&self) -> bool {
        self.trie.is_empty()
    }

    /// Every key in slot order (O(n log n): listings and metrics, not the request path).
    pub fn iter(&self) -> impl Iterator<Item = &Key> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The slots set since `old` (a snapshot this one was derived from: only the changed paths
    /// are visited), in slot order.
    pub fn changed_since<'a>(&'a self, old: &'a Slots) -> Vec<(usize, &'a Key)> {
        let mut out = Vec::new();
        self.trie.diff(&old.trie, &mut |i, _, new| {
            if let Some(s) = new {
                out.push((i as usize, &s.key));
            }
        });
        out.sort_unstable_by_key(|(i, _)| *i);
        out
    }
}

/// Every virtual key and the digest index: one snapshot. Built at start from the config (and
/// the state store); runtime changes publish a new snapshot through `governance::directory`,
/// and each shard refreshes its own view of it.
///
/// Slots are stable: index `i` names the same key in every snapshot one process publishes
/// (new keys are appended, changed ones updated in place, a revoked key stays as a tombstone
/// with no digest, so nothing can present it) — shards carry each key's windows and in-flight
/// count across snapshots by index.
///
/// Both maps are persistent (`trie`): `set` makes the next snapshot in O(log n) and shares
/// everything else with this one; `Slots::changed_since` tells a shard which slots to look at.
/// The digest index is keyed by a per-process seeded SipHash of the digest (`RandomState`, the
/// same seed in every snapshot of a process), so lookup timing says as little about stored
/// digests as a `HashMap` bucket did; equality at the leaf is constant-time.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    /// `server.auth` resolved: keys are checked only in `AuthMode::Keys`.
    pub checked: bool,
    pub keys: Slots,
    /// Seeded hash of a digest → the slots with that hash (one, but for a 2⁻⁶⁴ collision).
    by_digest: Trie<Box<[(Digest, u32)]>>,
    /// Keys that can be presented.
    usable: usize,
    seed: RandomState,
}

impl Keyring {
    /// Compile the config's keys, reading `key_env` secrets now. A key whose env var is unset
    /// matches nothing (logged); two keys with the same secret are an error (which key's limits
    /// would apply?). The config is assumed validated.
    pub fn build(cfg: &Config) -> Result<Keyring, String> {
        let checked = cfg.auth_mode() == AuthMode::Keys;
        if !checked {
            return Ok(Keyring::default());
        }
        let mut keys = Vec::with_capacity(cfg.keys.len());
        for k in &cfg.keys {
            let name = k.name.get_ref().as_str();
            let digest = match (&k.key_env, &k.key_sha256) {
                (Some(env), _) => match std::env::var_os(env.get_ref()) {
                    Some(v) if !v.is_empty() => Some(Digest::of(
                        std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()),
                    )),
                    // unusable (`config::keys::warnings` says so at start and in `check`)
                    _ => None,
                },
                (None, Some(hex)) => parse_sha256(hex.get_ref()).map(Digest),
                (None, None) => None,
            };
            let models = k.models.as_ref().map(|ms| {
                ms.iter()
                    .map(|m| match m.get_ref().strip_suffix('*') {
                        Some(p) => ModelRule::Prefix(p.into()),
                        None => ModelRule::Exact(m.get_ref().as_str().into()),
                    })
                    .collect()
            });
            let key = Key {
                name: name.into(),
                models,
                rpm: k.rpm.as_ref().map(|v| *v.get_ref()),
                tpm: k.tpm.as_ref().map(|v| *v.get_ref()),
                max_in_flight: k.max_in_flight.as_ref().map(|v| *v.get_ref()),
                expires: k.expires_unix().ok().flatten(),
                enabled: k.enabled,
                budget_nanos: k.budget_usd.as_ref().map(|b| usd_to_nanos(*b.get_ref())),
                period: k
                    .budget_period
                    .as_ref()
                    .and_then(|p| Period::parse(p.get_ref()))
                    .unwrap_or_default(),
                mcp_tools: k
                    .mcp_tools
                    .as_ref()
                    .map(|ts| ts.iter().map(|t| t.get_ref().as_str().into()).collect()),
            };
            keys.push((key, digest));
        }
        Keyring::assemble(checked, keys)
    }

    /// A snapshot from compiled keys and their digests, in slot order (`None`: the key cannot
    /// be presented: revoked, or its secret is unknown). Two keys with one digest are refused.
    pub fn assemble(checked: bool, keys: Vec<(Key, Option<Digest>)>) -> Result<Keyring, String> {
        let mut ring = Keyring {
            checked,
            ..Keyring::default()
        };
        for (i, (key, digest)) in keys.into_iter().enumerate() {
            let slot = u32::try_from(i).map_err(|_| "too many keys".to_string())?;
            ring = ring.set(slot, key, digest)?;
        }
        Ok(ring)
    }

    /// The next snapshot: slot `slot` (an existing one, or the next new one) holds `key`, with
    /// `digest` (`None`: it cannot be presented). O(log n); this snapshot is unchanged. A digest
    /// another slot already has is refused.
    pub fn set(&self, slot: u32, key: Key, digest: Option<Digest>) -> Result<Keyring, String> {
        if slot as usize > self.keys.len() {
            return Err(format!(
                "key slot {slot} is past the end ({})",
                self.keys.len()
            ));
        }
        if let Some(d) = digest {
            if let Some(other) = self.slot_of(&d).filter(|o| *o != slot) {
                let other = self.keys.get(other as usize).map_or("?", |k| &*k.name);
                return Err(format!(
                    "keys {other:?} and {:?} have the same secret; give each key its own",
                    &*key.name
                ));
            }
        }
        let mut next = self.clone();
        let old = self.keys.trie.get(u64::from(slot)).and_then(|s| s.digest);
        if let Some(d) = old {
            next.unindex(d, slot);
        }
        if let Some(d) = digest {
            next.index(d, slot);
        }
        next.keys.trie = next.keys.trie.insert(u64::from(slot), Slot { key, digest });
        Ok(next)
    }

    /// This snapshot with `checked` set.
    pub fn with_checked(mut self, checked: bool) -> Keyring {
        self.checked = checked;
        self
    }

    fn hash(&self, d: &Digest) -> u64 {
        self.seed.hash_one(d.0)
    }

    fn slot_of(&self, d: &Digest) -> Option<u32> {
        let list = self.by_digest.get(self.hash(d))?;
        list.iter().find(|(stored, _)| stored == d).map(|(_, i)| *i)
    }

    fn index(&mut self, d: Digest, slot: u32) {
        let h = self.hash(&d);
        let mut list: Vec<(Digest, u32)> = self
            .by_digest
            .get(h)
            .map(|l| l.iter().filter(|(_, i)| *i != slot).copied().collect())
            .unwrap_or_default();
        list.push((d, slot));
        self.by_digest = self.by_digest.insert(h, list.into());
        self.usable += 1;
    }

    fn unindex(&mut self, d: Digest, slot: u32) {
        let h = self.hash(&d);
        let Some(list) = self.by_digest.get(h) else {
            return;
        };
        let rest: Vec<(Digest, u32)> = list
            .iter()
            .filter(|(stored, i)| !(*i == slot && *stored == d))
            .copied()
            .collect();
        if rest.len() == list.len() {
            return;
        }
        self.usable = self.usable.saturating_sub(1);
        self.by_digest = match rest.is_empty() {
            true => self.by_digest.remove(h),
            false => self.by_digest.insert(h, rest.into()),
        };
    }

    /// The index of the key whose secret is `secret`.
    pub fn lookup(&self, secret: &[u8]) -> Option<u32> {
        self.slot_of(&Digest::of(secret))
    }

    /// Keys that can actually be presented (their secret is known).
    pub fn usable(&self) -> usize {
        self.usable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_lookup_and_rules() {
        let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"; // "test"
        let text = format!(
            "[[key]]\nname = \"a\"\nkey_sha256 = \"{hex}\"\nmodels = [\"gpt-4o-mini\", \"claude-*\"]\nrpm = 5\n"
        );
        let ring = Keyring::build(&Config::parse(&text).unwrap()).unwrap();
        assert!(ring.checked);
        assert_eq!(ring.lookup(b"test"), Some(0));
        assert_eq!(ring.lookup(b"tesT"), None);
        let k = ring.keys.get(0).unwrap();
        assert!(k.allows("gpt-4o-mini") && k.allows("claude-3-haiku"));
        assert!(!k.allows("gpt-4o") && !k.allows("gpt-4o-mini-2"));
        assert_eq!(k.rpm, Some(5));
        assert_eq!(Digest::of(b"test"), Digest(parse_sha256(hex).unwrap()));
        for i in 0..32 {
            let mut other = Digest::of(b"test");
            other.0[i] ^= 1;
            assert_ne!(Digest::of(b"test"), other, "byte {i}");
        }
    }

    #[test]
    fn set_keeps_the_digest_index_right() {
        let key = |n: &str| Key {
            name: n.into(),
            models: None,
            rpm: None,
            tpm: None,
            max_in_flight: None,
            expires: None,
            enabled: true,
            budget_nanos: None,
            period: Period::default(),
            mcp_tools: None,
        };
        let (a, b) = (Digest::of(b"secret-a"), Digest::of(b"secret-b"));
        let r0 = Keyring::assemble(true, vec![(key("a"), Some(a)), (key("b"), Some(b))]).unwrap();
        assert_eq!((r0.lookup(b"secret-a"), r0.usable()), (Some(0), 2));
        // the same digest in another slot is refused; in its own slot (a patch) it is kept
        assert!(r0
            .set(1, key("b"), Some(a))
            .unwrap_err()
            .contains("same secret"));
        let r1 = r0.set(0, key("a2"), Some(a)).unwrap();
        assert_eq!((r1.lookup(b"secret-a"), r1.usable()), (Some(0), 2));
        // revoked: no digest; the old snapshot still has it
        let r2 = r1.set(1, key("b"), None).unwrap();
        assert_eq!((r2.lookup(b"secret-b"), r2.usable()), (None, 1));
        assert_eq!(r1.lookup(b"secret-b"), Some(1));
        // two keys trade secrets: off both, then on again
        let r3 = r1
            .set(0, key("a"), None)
            .unwrap()
            .set(1, key("b"), None)
            .unwrap();
        let r3 = r3
            .set(0, key("a"), Some(b))
            .unwrap()
            .set(1, key("b"), Some(a))
            .unwrap();
        assert_eq!(
            (r3.lookup(b"secret-a"), r3.lookup(b"secret-b")),
            (Some(1), Some(0))
        );
        assert_eq!(r3.usable(), 2);
        // slots are dense
        assert!(r3.set(3, key("c"), None).is_err());
        assert_eq!(r3.set(2, key("c"), None).unwrap().keys.len(), 3);
    }

    #[test]
    fn same_secret_twice_is_refused_and_auth_none_checks_nothing() {
        std::env::set_var("RG_KEYRING_TEST_SECRET", "test");
        let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let text = format!(
            "[[key]]\nname = \"a\"\nkey_sha256 = \"{hex}\"\n\n[[key]]\nname = \"b\"\nkey_env = \"RG_KEYRING_TEST_SECRET\"\n"
        );
        let err = Keyring::build(&Config::parse(&text).unwrap()).unwrap_err();
        assert!(
            err.contains("\"a\"") && err.contains("\"b\"") && !err.contains("test\""),
            "{err}"
        );
        let text = format!("[server]\nauth = \"none\"\n{text}");
        let ring = Keyring::build(&Config::parse(&text).unwrap()).unwrap();
        assert!(!ring.checked && ring.keys.is_empty());
    }
}
