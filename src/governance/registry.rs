//! The authoritative list of virtual keys while the gateway runs: `[[key]]` entries from the
//! config and keys made through the admin API, with their settings, sources and lifecycle
//! (created, updated, revoked). Every change is written to the state store first (when there is
//! one), then published as a new `Keyring` snapshot to the directory every shard follows.
//!
//! Rules (README "Admin API"):
//! - Names are unique among live keys (409), follow the `[[key]]` name rule, and keep their slot
//!   for the life of the process: a name revoked and made again gets the same slot (its
//!   counters and metrics series carry on).
//! - Config keys can be revoked at runtime (persisted by name and digest: the same secret stays
//!   revoked after a restart, a new secret in the file makes the key live again) but not patched
//!   (409: the file is their source).
//! - Auth: with `server.auth` unset, keys are checked as soon as any key exists — in the config,
//!   or ever made through the admin API (a revoked one counts: revoking the last key never
//!   opens the gateway). `auth = "none"` refuses key creation (409).
//! - Secrets: `rg-` + 48 hex digits (192 bits from the OS, `ring::rand::SystemRandom`), shown
//!   once in the create answer; only the SHA-256 is kept.
//!
//! Owns: `Registry`. Must not: run on a shard (it is the admin thread's, behind a mutex), or
//! keep a secret.

use std::sync::Arc;

use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Map, Value};

use super::keyring::{Digest, Keyring};
use super::spec::KeySpec;
use super::Directory;
use super::SpendBook;
use crate::config::keys::{key_name_ok, parse_sha256, KEY_NAME_RULE};
use crate::config::Config;
use crate::error::{Error, Kind};
use crate::state::{KeyRow, KeyWrite, Store};

/// Where a key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Config,
    Api,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Api => "api",
        }
    }
}

/// One key's slot.
#[derive(Debug, Clone)]
pub struct Record {
    pub name: String,
    pub source: Source,
    /// `None`: the secret is unknown (a config key whose env var is unset).
    pub digest: Option<Digest>,
    pub spec: KeySpec,
    pub created: Option<i64>,
    pub updated: Option<i64>,
    /// Set: revoked (a tombstone; the slot stays).
    pub revoked: Option<i64>,
    /// The state store row (API keys).
    pub row: Option<i64>,
}

pub struct Registry {
    records: Vec<Record>,
    /// `server.auth` as written (`Some(true)`: keys, `Some(false)`: none).
    explicit: Option<bool>,
    checked: bool,
    dir: Arc<Directory>,
    store: Option<Arc<Store>>,
    /// The spend ledger: each key's budget is set on it with every change (shards do too, when
    /// they take the snapshot; this makes it right before any request arrives).
    book: Option<Arc<SpendBook>>,
    rng: SystemRandom,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registry({} keys)", self.records.len())
    }
}

impl Registry {
    /// The config's keys (their `key_env` secrets read now) and the stored ones. Returns the
    /// registry (its first snapshot already in its directory) and lines for the start-up log.
    pub fn build(
        cfg: &Config,
        stored: &[KeyRow],
        store: Option<Arc<Store>>,
    ) -> Result<(Registry, Vec<String>), String> {
        let explicit = cfg
            .server
            .auth
            .as_ref()
            .map(|a| a.get_ref().as_str() != "none");
        let mut log = Vec::new();
        let mut records = Vec::new();
        if explicit != Some(false) {
            for k in &cfg.keys {
                let name = k.name.get_ref().clone();
                let digest = config_digest(k);
                let revoked = stored
                    .iter()
                    .filter(|r| r.source == "config" && r.name == name)
                    .filter(|r| digest.is_some_and(|d| d == Digest(r.sha256)))
                    .find_map(|r| r.revoked);
                if revoked.is_some() {
                    log.push(format!(
                        "key {name:?} (config) was revoked through the admin API and stays revoked; give it a new secret to use it again"
                    ));
                }
                records.push(Record {
                    name,
                    source: Source::Config,
                    digest,
                    spec: KeySpec::from_config(k),
                    created: None,
                    updated: None,
                    revoked,
                    row: None,
                });
            }
            for r in stored
                .iter()
                .filter(|r| r.source == "api" && r.revoked.is_none())
            {
                if records.iter().any(|c| c.name == r.name) {
                    return Err(format!(
                        "key {:?} is in the config and was also made through the admin API (in the state_dir); \
                         rename the [[key]] or revoke the runtime key first",
                        r.name
                    ));
                }
                let spec = KeySpec::from_json(&r.spec)
                    .map_err(|e| format!("state: key {:?}: {e}", r.name))?;
                records.push(Record {
                    name: r.name.clone(),
                    source: Source::Api,
                    digest: Some(Digest(r.sha256)),
                    spec,
                    created: Some(r.created),
                    updated: Some(r.updated),
                    revoked: None,
                    row: Some(r.id),
                });
            }
        }
        let ever = !cfg.keys.is_empty() || stored.iter().any(|r| r.source == "api");
        let checked = explicit.unwrap_or(ever);
        let mut reg = Registry {
            records,
            explicit,
            checked,
            dir: Arc::new(Directory::new(Keyring::default())),
            store,
            book: None,
            rng: SystemRandom::new(),
        };
        let ring = reg.snapshot()?;
        reg.dir = Arc::new(Directory::new(ring));
        Ok((reg, log))
    }

    /// Set each key's budget and period on its ledger in `book`, now and with every change.
    pub fn with_book(mut self, book: Arc<SpendBook>) -> Registry {
        self.book = Some(book);
        self.apply_budgets();
        self
    }

    fn apply_budgets(&self) {
        let Some(book) = &self.book else { return };
        for r in self.records.iter().filter(|r| r.revoked.is_none()) {
            let k = r.spec.compile(&r.name);
            book.ensure_key(&r.name)
                .set_budget(k.budget_nanos, Some(k.period));
        }
    }

    /// The directory the shards follow.
    pub fn directory(&self) -> Arc<Directory> {
        self.dir.clone()
    }

    /// Whether API requests need a key now.
    pub fn checked(&self) -> bool {
        self.checked
    }

    /// Whether keys can ever be checked in this process (`auth = "none"` says never).
    pub fn can_check(&self) -> bool {
        self.explicit != Some(false)
    }

    fn snapshot(&self) -> Result<Keyring, String> {
        Keyring::assemble(
            self.checked,
            self.records
                .iter()
                .map(|r| {
                    let digest = if r.revoked.is_none() { r.digest } else { None };
                    (r.spec.compile(&r.name), digest)
                })
                .collect(),
        )
    }

    fn publish(&self) -> Result<(), Error> {
        let ring = self.snapshot().map_err(|e| Error::new(Kind::Internal, e))?;
        self.apply_budgets();
        self.dir.publish(ring);
        Ok(())
    }

    fn live(&self, name: &str) -> Result<usize, Error> {
        self.records
            .iter()
            .position(|r| r.name == name && r.revoked.is_none())
            .ok_or_else(|| Error::new(Kind::NotFound, format!("no key named {name:?}")))
    }

    fn persist(&self, w: KeyWrite) -> Result<Option<i64>, Error> {
        match &self.store {
            Some(s) => s
                .write_key(w)
                .map(Some)
                .map_err(|e| Error::new(Kind::Internal, format!("state store: {e}"))),
            None => Ok(None),
        }
    }

    /// Live keys, in slot order.
    pub fn list(&self) -> Vec<Value> {
        self.records
            .iter()
            .filter(|r| r.revoked.is_none())
            .map(view)
            .collect()
    }

    pub fn get(&self, name: &str) -> Result<Value, Error> {
        Ok(view(&self.records[self.live(name)?]))
    }

    /// Live key names (for usage listings).
    pub fn names(&self) -> Vec<String> {
        self.records
            .iter()
            .filter(|r| r.revoked.is_none())
            .map(|r| r.name.clone())
            .collect()
    }

    /// Make a key from a create body; returns its view and its secret (shown this once).
    pub fn create(
        &mut self,
        body: &Map<String, Value>,
        now: i64,
    ) -> Result<(Value, String), Error> {
        if !self.can_check() {
            return Err(Error::new(
                Kind::Conflict,
                "server.auth = \"none\": keys are not checked; remove that line to use keys",
            ));
        }
        let name = match body.get("name") {
            Some(Value::String(n)) if key_name_ok(n) => n.clone(),
            Some(Value::String(_)) => return Err(invalid(KEY_NAME_RULE.to_string())),
            _ => return Err(invalid("name is required (a string)".into())),
        };
        if self.live(&name).is_ok() {
            return Err(Error::new(
                Kind::Conflict,
                format!("a key named {name:?} exists; revoke it first or pick another name"),
            ));
        }
        let mut spec = KeySpec::default();
        spec.apply(body, &["name"]).map_err(invalid)?;
        let mut raw = [0u8; 24];
        self.rng
            .fill(&mut raw)
            .map_err(|_| Error::new(Kind::Internal, "no randomness from the OS"))?;
        let mut secret = String::with_capacity(3 + 48);
        secret.push_str("rg-");
        for b in raw {
            secret.push_str(&format!("{b:02x}"));
        }
        let digest = Digest::of(secret.as_bytes());
        let row = self.persist(KeyWrite::Insert {
            name: name.clone(),
            source: "api",
            sha256: digest.0,
            spec: spec.to_json(),
            at: now,
            revoked: None,
        })?;
        let rec = Record {
            name: name.clone(),
            source: Source::Api,
            digest: Some(digest),
            spec,
            created: Some(now),
            updated: Some(now),
            revoked: None,
            row,
        };
        let slot = match self.records.iter().position(|r| r.name == name) {
            Some(i) => {
                self.records[i] = rec;
                i
            }
            None => {
                self.records.push(rec);
                self.records.len() - 1
            }
        };
        if !self.checked {
            self.checked = true;
            crate::log::info(format_args!(
                "admin: first key created: API requests need a key from now on"
            ));
        }
        self.publish()?;
        crate::log::info(format_args!("admin: key {name:?} created"));
        Ok((view(&self.records[slot]), secret))
    }

    /// Change an API key's settings.
    pub fn patch(
        &mut self,
        name: &str,
        body: &Map<String, Value>,
        now: i64,
    ) -> Result<Value, Error> {
        let i = self.live(name)?;
        if self.records[i].source == Source::Config {
            return Err(Error::new(
                Kind::Conflict,
                format!("key {name:?} comes from the config file: change it there (config keys can only be revoked here)"),
            ));
        }
        let mut spec = self.records[i].spec.clone();
        spec.apply(body, &[]).map_err(invalid)?;
        if let Some(id) = self.records[i].row {
            self.persist(KeyWrite::Update {
                id,
                spec: spec.to_json(),
                at: now,
            })?;
        }
        let r = &mut self.records[i];
        r.spec = spec;
        r.updated = Some(now);
        self.publish()?;
        crate::log::info(format_args!("admin: key {name:?} updated"));
        Ok(view(&self.records[i]))
    }

    /// Revoke a key: it stops on every shard at their next request.
    pub fn revoke(&mut self, name: &str, now: i64) -> Result<Value, Error> {
        let i = self.live(name)?;
        let r = &self.records[i];
        let write = match (r.source, r.row) {
            (Source::Api, Some(id)) => Some(KeyWrite::Revoke { id, at: now }),
            (Source::Api, None) => None,
            (Source::Config, _) => r.digest.map(|d| KeyWrite::Insert {
                name: r.name.clone(),
                source: "config",
                sha256: d.0,
                spec: r.spec.to_json(),
                at: now,
                revoked: Some(now),
            }),
        };
        if let Some(w) = write {
            self.persist(w)?;
        }
        self.records[i].revoked = Some(now);
        self.records[i].updated = Some(now);
        self.publish()?;
        crate::log::info(format_args!("admin: key {name:?} revoked"));
        let mut v = view(&self.records[i]);
        if let Value::Object(m) = &mut v {
            m.insert("revoked".into(), Value::from(crate::date::rfc3339(now)));
        }
        Ok(v)
    }
}

/// A config key's secret digest (its `key_env` read now, or its `key_sha256`).
fn config_digest(k: &crate::config::KeyConfig) -> Option<Digest> {
    match (&k.key_env, &k.key_sha256) {
        (Some(env), _) => std::env::var_os(env.get_ref())
            .filter(|v| !v.is_empty())
            .map(|v| Digest::of(std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()))),
        (None, Some(hex)) => parse_sha256(hex.get_ref()).map(Digest),
        (None, None) => None,
    }
}

impl Registry {
    /// A reload: the config's keys become `cfg`'s (their secrets read again), keys made through
    /// the admin API stay. Slots are stable: a key removed from the file becomes a tombstone
    /// (revoked), a new one takes a new slot, a changed one keeps its slot and counters. A
    /// config key revoked through the admin API stays revoked until its secret changes (as at
    /// start). Checks first and changes nothing when `cfg` does not fit (a name that is also a
    /// runtime key). `server.auth` itself is a restart-needed setting.
    pub fn reload_config_keys(
        &mut self,
        cfg: &Config,
    ) -> Result<(), Vec<crate::config::ConfigError>> {
        if !self.can_check() {
            return Ok(());
        }
        let problems: Vec<crate::config::ConfigError> = cfg
            .keys
            .iter()
            .filter(|k| {
                self.records.iter().any(|r| {
                    r.source == Source::Api && r.revoked.is_none() && &r.name == k.name.get_ref()
                })
            })
            .map(|k| crate::config::ConfigError {
                line: None,
                message: format!(
                    "key {:?} is also a key made through the admin API; rename the [[key]] or revoke the runtime key first",
                    k.name.get_ref()
                ),
            })
            .collect();
        if !problems.is_empty() {
            return Err(problems);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        for r in self
            .records
            .iter_mut()
            .filter(|r| r.source == Source::Config)
        {
            if r.revoked.is_none() && !cfg.keys.iter().any(|k| k.name.get_ref() == &r.name) {
                // removed from the file: a tombstone with no secret (re-adding it revives it)
                r.revoked = Some(now);
                r.digest = None;
            }
        }
        for k in &cfg.keys {
            let name = k.name.get_ref();
            let digest = config_digest(k);
            let spec = KeySpec::from_config(k);
            match self
                .records
                .iter_mut()
                .find(|r| r.source == Source::Config && &r.name == name)
            {
                Some(r) => {
                    // revoked through the admin API with this same secret: stays revoked
                    let keep_revoked =
                        r.revoked.is_some() && r.digest.is_some() && r.digest == digest;
                    if !keep_revoked {
                        r.revoked = None;
                    }
                    r.digest = digest;
                    r.spec = spec;
                }
                None => self.records.push(Record {
                    name: name.clone(),
                    source: Source::Config,
                    digest,
                    spec,
                    created: None,
                    updated: None,
                    revoked: None,
                    row: None,
                }),
            }
        }
        if self.explicit.is_none() && !cfg.keys.is_empty() {
            self.checked = true;
        }
        self.publish().map_err(|e| {
            vec![crate::config::ConfigError {
                line: None,
                message: e.message,
            }]
        })
    }
}

fn invalid(msg: String) -> Error {
    Error::new(Kind::InvalidBody, msg)
}

/// A key as the admin API shows it: never a secret or a digest.
fn view(r: &Record) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), Value::from(r.name.clone()));
    m.insert("source".into(), Value::from(r.source.as_str()));
    r.spec.write(&mut m);
    let time = |t: Option<i64>| t.map_or(Value::Null, |t| Value::from(crate::date::rfc3339(t)));
    m.insert("created".into(), time(r.created));
    m.insert("updated".into(), time(r.updated));
    m.insert("usable".into(), Value::from(r.digest.is_some()));
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str) -> Map<String, Value> {
        serde_json::from_str::<Value>(text)
            .unwrap()
            .as_object()
            .unwrap()
            .clone()
    }

    #[test]
    fn create_patch_revoke_publish_snapshots_with_stable_slots() {
        let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"; // "test"
        let cfg = Config::parse(&format!(
            "[[key]]\nname = \"cfg\"\nkey_sha256 = \"{hex}\"\n"
        ))
        .unwrap();
        let (mut reg, _) = Registry::build(&cfg, &[], None).unwrap();
        let dir = reg.directory();
        assert!(reg.checked());
        let (v, secret) = reg.create(&body(r#"{"name":"a","rpm":5}"#), 100).unwrap();
        assert!(secret.starts_with("rg-") && secret.len() == 51, "{secret}");
        assert_eq!(v["source"], "api");
        assert!(!v.to_string().contains(&secret[3..]));
        let (_, ring) = dir.load();
        assert_eq!(ring.lookup(secret.as_bytes()), Some(1));
        assert_eq!(ring.lookup(b"test"), Some(0));
        // duplicates, unknowns, bad names, config keys
        let e = reg.create(&body(r#"{"name":"a"}"#), 101).unwrap_err();
        assert_eq!(e.status(), 409);
        assert_eq!(
            reg.create(&body(r#"{"name":"a b"}"#), 101)
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            reg.create(&body(r#"{"rpm":1}"#), 101).unwrap_err().status(),
            400
        );
        assert_eq!(reg.patch("nope", &body("{}"), 1).unwrap_err().status(), 404);
        assert_eq!(
            reg.patch("cfg", &body(r#"{"rpm":1}"#), 1)
                .unwrap_err()
                .status(),
            409
        );
        let v = reg
            .patch("a", &body(r#"{"rpm":7,"enabled":false}"#), 102)
            .unwrap();
        assert_eq!(
            (v["rpm"].as_u64(), v["enabled"].as_bool()),
            (Some(7), Some(false))
        );
        assert_eq!(dir.load().1.keys[1].rpm, Some(7));
        // revoke: gone from lookups and listings, slot kept; the name can be made again
        reg.revoke("a", 103).unwrap();
        assert_eq!(dir.load().1.lookup(secret.as_bytes()), None);
        assert_eq!(reg.list().len(), 1);
        let (_, again) = reg.create(&body(r#"{"name":"a"}"#), 104).unwrap();
        let ring = dir.load().1;
        assert_eq!(
            (ring.keys.len(), ring.lookup(again.as_bytes())),
            (2, Some(1))
        );
        reg.revoke("cfg", 105).unwrap();
        assert_eq!(dir.load().1.lookup(b"test"), None);
        assert_eq!(reg.revoke("cfg", 106).unwrap_err().status(), 404);
    }

    #[test]
    fn auth_turns_on_with_the_first_key_and_none_refuses_keys() {
        let (mut reg, _) = Registry::build(&Config::parse("").unwrap(), &[], None).unwrap();
        assert!(!reg.checked() && !reg.directory().load().1.checked);
        reg.create(&body(r#"{"name":"first"}"#), 1).unwrap();
        assert!(reg.checked() && reg.directory().load().1.checked);
        reg.revoke("first", 2).unwrap();
        assert!(
            reg.directory().load().1.checked,
            "revoking the last key keeps keys on"
        );
        let none = Config::parse("[server]\nauth = \"none\"\n").unwrap();
        let (mut reg, _) = Registry::build(&none, &[], None).unwrap();
        assert_eq!(
            reg.create(&body(r#"{"name":"x"}"#), 1)
                .unwrap_err()
                .status(),
            409
        );
    }
}
