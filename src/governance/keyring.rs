//! The virtual keys of one gateway, compiled from `[[key]]`: names, allow-lists, limits, expiry,
//! and the SHA-256 digests of the secrets (never the secrets themselves).
//!
//! Owns: reading each `key_env` secret once at start (hashing it and dropping the value),
//! `Digest` and its constant-time equality, lookup of a presented secret, the allow-list rule.
//! Must not: keep, log or display a secret (errors and logs use the key's name), or hold
//! per-request state (that is `Governance` per shard).
//!
//! Lookup: the presented secret is hashed (SHA-256, `ring`) and the digest looked up in a
//! `HashMap` with std's randomly seeded SipHash. What the lookup's timing can reveal is about
//! *digests* of attacker-chosen strings: which bucket (SipHash with a secret per-process seed:
//! nothing about digest bytes) and whether a stored digest sits there, then equality, which is
//! constant-time (`subtle`) so no prefix of a stored digest leaks either. Learning a stored digest
//! would still not give the secret (preimage resistance), but it would allow an offline search of
//! a low-entropy secret; hence constant-time equality, and `ringgate check` warns about short
//! secrets.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use subtle::ConstantTimeEq;

use super::spend::{usd_to_nanos, Period};
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

/// Every virtual key and the digest index: one snapshot. Built at start from the config (and
/// the state store); runtime changes publish a new snapshot through `governance::directory`,
/// and each shard refreshes its own view of it.
///
/// Slots are stable: index `i` names the same key in every snapshot one process publishes
/// (new keys are appended, changed ones updated in place, a revoked key stays as a tombstone
/// with no digest, so nothing can present it) — shards carry each key's windows and in-flight
/// count across snapshots by index.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    /// `server.auth` resolved: keys are checked only in `AuthMode::Keys`.
    pub checked: bool,
    pub keys: Vec<Key>,
    by_digest: HashMap<Digest, u32>,
}

impl Keyring {
    /// Compile the config's keys, reading `key_env` secrets now. A key whose env var is unset
    /// matches nothing (logged); two keys with the same secret are an error (which key's limits
    /// would apply?). The config is assumed validated.
    pub fn build(cfg: &Config) -> Result<Keyring, String> {
        let checked = cfg.auth_mode() == AuthMode::Keys;
        let mut ring = Keyring {
            checked,
            ..Keyring::default()
        };
        if !checked {
            return Ok(ring);
        }
        for (i, k) in cfg.keys.iter().enumerate() {
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
            if let Some(d) = digest {
                if let Some(&other) = ring.by_digest.get(&d) {
                    let other = cfg
                        .keys
                        .get(other as usize)
                        .map_or("?", |o| o.name.get_ref());
                    return Err(format!(
                        "keys {other:?} and {name:?} have the same secret; give each key its own"
                    ));
                }
                ring.by_digest.insert(d, i as u32);
            }
            let models = k.models.as_ref().map(|ms| {
                ms.iter()
                    .map(|m| match m.get_ref().strip_suffix('*') {
                        Some(p) => ModelRule::Prefix(p.into()),
                        None => ModelRule::Exact(m.get_ref().as_str().into()),
                    })
                    .collect()
            });
            ring.keys.push(Key {
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
            });
        }
        Ok(ring)
    }

    /// A snapshot from compiled keys and their digests, in slot order (`None`: the key cannot
    /// be presented: revoked, or its secret is unknown). Two keys with one digest are refused.
    pub fn assemble(checked: bool, keys: Vec<(Key, Option<Digest>)>) -> Result<Keyring, String> {
        let mut ring = Keyring {
            checked,
            keys: Vec::with_capacity(keys.len()),
            by_digest: HashMap::with_capacity(keys.len()),
        };
        for (i, (key, digest)) in keys.into_iter().enumerate() {
            if let Some(d) = digest {
                if let Some(&other) = ring.by_digest.get(&d) {
                    let other = ring.keys.get(other as usize).map_or("?", |k| &*k.name);
                    return Err(format!(
                        "keys {other:?} and {:?} have the same secret; give each key its own",
                        &*key.name
                    ));
                }
                ring.by_digest.insert(d, i as u32);
            }
            ring.keys.push(key);
        }
        Ok(ring)
    }

    /// The index of the key whose secret is `secret`.
    pub fn lookup(&self, secret: &[u8]) -> Option<u32> {
        self.by_digest.get(&Digest::of(secret)).copied()
    }

    /// Keys that can actually be presented (their secret is known).
    pub fn usable(&self) -> usize {
        self.by_digest.len()
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
        let k = &ring.keys[0];
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
