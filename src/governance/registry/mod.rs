//! The authoritative list of virtual keys while the gateway runs: `[[key]]` entries from the
//! config and keys made through the admin API, with their settings, sources and lifecycle
//! (created, updated, revoked). Every change is written to the state store first (when there is
//! one: one row), then published as a new `Keyring` snapshot to the directory every shard
//! follows. A change costs O(log n) whatever the number of keys: names and live slots are
//! indexed (`by_name`, `live`), the next snapshot is derived from the last (`Keyring::set`),
//! only the changed key's budget is set; listings are pages (`page`, O(log n + page)).
//!
//! Rules (docs/admin-api.md):
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
//! Shared keys (`[fleet] share = ["keys"]`, `fleet`): an API key's change goes to the fleet's
//! store first (`governance::fleet`; the store's script decides), then to the state store, then
//! into the snapshot; records other nodes wrote arrive through `apply_fleet` (the store wins,
//! a local revocation is never undone). Config keys stay this node's.
//!
//! Owns: `Registry`. Must not: run on a shard (it is the admin thread's, behind a mutex), or
//! keep a secret.

mod fleet;

pub use fleet::Sink;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Map, Value};

use super::fleet::Fleet;
use super::keyring::{Digest, Keyring};
use super::spec::KeySpec;
use super::Directory;
use super::SpendBook;
use crate::config::keys::{key_name_ok, parse_sha256, KEY_NAME_RULE};
use crate::config::Config;
use crate::error::{Error, Kind};
use crate::governance::state::{KeyRow, KeyWrite, Store};

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
    /// Shared keys: the fleet store's version this record is (or was last) in step with.
    pub fleet: Option<u64>,
    /// Shared keys: changed here while the store was away (pushed when it is back).
    pub pending: bool,
}

impl Record {
    /// An API key's record from its state row `r` (its `spec` already parsed).
    fn stored(r: &KeyRow, spec: KeySpec) -> Record {
        Record {
            name: r.name.clone(),
            source: Source::Api,
            digest: Some(Digest(r.sha256)),
            spec,
            created: Some(r.created),
            updated: Some(r.updated),
            revoked: r.revoked,
            row: Some(r.id),
            fleet: r.fleet_ver.map(|v| v as u64),
            pending: r.pending,
        }
    }

    /// The digest a request can present (none once revoked).
    fn presentable(&self) -> Option<Digest> {
        self.digest.filter(|_| self.revoked.is_none())
    }
}

pub struct Registry {
    /// By slot (the index is the key's slot in every snapshot).
    records: Vec<Record>,
    /// The slot of every name this process has seen, live or tombstone (a name keeps its slot).
    by_name: HashMap<String, usize>,
    /// The live slots, in order (listing pages).
    live: BTreeSet<usize>,
    /// The snapshot last published; the next one is derived from it (`Keyring::set`).
    ring: Keyring,
    /// `server.auth` as written (`Some(true)`: keys, `Some(false)`: none).
    explicit: Option<bool>,
    checked: bool,
    dir: Arc<Directory>,
    store: Option<Arc<Store>>,
    /// The spend ledger: each key's budget is set on it with every change (shards do too, when
    /// they take the snapshot; this makes it right before any request arrives).
    book: Option<Arc<SpendBook>>,
    rng: SystemRandom,
    /// Shared keys: the fleet thread's handle (`None`: keys are this node's).
    fleet: Option<Arc<Fleet>>,
    /// `on_store_error = "closed"`: with the store away, key changes are refused (503).
    closed: bool,
    /// Whether this process shares its API keys (`[fleet] share` has "keys").
    shared: bool,
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
        let mut by_name = HashMap::new();
        if explicit != Some(false) {
            // revoked config keys by name (a name may have several rows: several secrets)
            let mut revoked_config: HashMap<&str, Vec<&KeyRow>> = HashMap::new();
            for r in stored.iter().filter(|r| r.source == "config") {
                revoked_config.entry(r.name.as_str()).or_default().push(r);
            }
            for k in &cfg.keys {
                let name = k.name.get_ref().clone();
                let digest = config_digest(k);
                let revoked = revoked_config
                    .get(name.as_str())
                    .into_iter()
                    .flatten()
                    .filter(|r| digest.is_some_and(|d| d == Digest(r.sha256)))
                    .find_map(|r| r.revoked);
                if revoked.is_some() {
                    log.push(format!(
                        "key {name:?} (config) was revoked through the admin API and stays revoked; give it a new secret to use it again"
                    ));
                }
                by_name.insert(name.clone(), records.len());
                records.push(Record {
                    name,
                    source: Source::Config,
                    digest,
                    spec: KeySpec::from_config(k),
                    created: None,
                    updated: None,
                    revoked,
                    row: None,
                    fleet: None,
                    pending: false,
                });
            }
            for r in stored
                .iter()
                .filter(|r| r.source == "api" && r.revoked.is_none())
            {
                if by_name.contains_key(&r.name) {
                    return Err(format!(
                        "key {:?} is in the config and was also made through the admin API (in the state_dir); \
                         rename the [[key]] or revoke the runtime key first",
                        r.name
                    ));
                }
                let spec = KeySpec::from_json(&r.spec)
                    .map_err(|e| format!("state: key {:?}: {e}", r.name))?;
                by_name.insert(r.name.clone(), records.len());
                records.push(Record {
                    // shared keys: a key the store never held is pushed at the first connect
                    pending: r.pending || (cfg.fleet.keys() && r.fleet_ver.is_none()),
                    ..Record::stored(r, spec)
                });
            }
            if cfg.fleet.keys() {
                fleet::pending_revocations(stored, &mut records, &mut by_name);
            }
        }
        let ever = !cfg.keys.is_empty() || stored.iter().any(|r| r.source == "api");
        let checked = explicit.unwrap_or(ever);
        let live = records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.revoked.is_none())
            .map(|(i, _)| i)
            .collect();
        let ring = Keyring::assemble(
            checked,
            records
                .iter()
                .map(|r| (r.spec.compile(&r.name), r.presentable()))
                .collect(),
        )?;
        let reg = Registry {
            records,
            by_name,
            live,
            dir: Arc::new(Directory::new(ring.clone())),
            ring,
            explicit,
            checked,
            store,
            book: None,
            rng: SystemRandom::new(),
            fleet: None,
            closed: cfg.limits.closed(),
            shared: cfg.fleet.keys(),
        };
        Ok((reg, log))
    }

    /// Set each key's budget and period on its ledger in `book`, now and with every change.
    pub fn with_book(mut self, book: Arc<SpendBook>) -> Registry {
        self.book = Some(book);
        self.apply_budgets();
        self
    }

    fn apply_budgets(&self) {
        for i in &self.live {
            self.apply_budget(*i);
        }
    }

    /// Set slot `i`'s budget on its ledger (a live key's; a revoked key's ledger is history).
    fn apply_budget(&self, i: usize) {
        let (Some(book), Some(r)) = (&self.book, self.records.get(i)) else {
            return;
        };
        if r.revoked.is_none() {
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

    /// The next snapshot with `rec` in slot `i` (O(log n); nothing changes yet).
    fn stage(&self, ring: &Keyring, i: usize, rec: &Record) -> Result<Keyring, Error> {
        let slot =
            u32::try_from(i).map_err(|_| Error::new(Kind::Internal, "too many keys (slots)"))?;
        ring.set(slot, rec.spec.compile(&rec.name), rec.presentable())
            .map_err(|e| Error::new(Kind::Internal, e))
    }

    /// Take `ring` (made by `stage` from the current one), set the budgets of `changed` and
    /// publish it: the shards apply just those slots (`Governance::refresh`).
    fn commit(&mut self, ring: Keyring, changed: &[usize]) {
        self.ring = ring.with_checked(self.checked);
        for i in changed {
            self.apply_budget(*i);
        }
        self.dir.publish(self.ring.clone());
    }

    /// Put `rec` in slot `i` (an existing slot, or the next new one) and index it.
    fn put(&mut self, i: usize, rec: Record) {
        if rec.revoked.is_none() {
            self.live.insert(i);
        } else {
            self.live.remove(&i);
        }
        self.by_name.insert(rec.name.clone(), i);
        match self.records.get_mut(i) {
            Some(r) => *r = rec,
            None => self.records.push(rec),
        }
    }

    fn live(&self, name: &str) -> Result<usize, Error> {
        self.by_name
            .get(name)
            .copied()
            .filter(|&i| self.records.get(i).is_some_and(|r| r.revoked.is_none()))
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

    /// A page of live keys in slot order (creation order): at most `limit`, starting after the
    /// key named `after` (the last one of the previous page; a revoked name still marks its
    /// place). Returns the page and whether more follow. O(log n + limit). An unknown `after`
    /// is a 400.
    pub fn page(&self, after: Option<&str>, limit: usize) -> Result<(Vec<Value>, bool), Error> {
        let from = match after {
            None => 0,
            Some(name) => self.by_name.get(name).map(|i| i + 1).ok_or_else(|| {
                Error::new(
                    Kind::BadRequest,
                    format!(
                        "after: no key named {name:?} (pass the last name of the previous page)"
                    ),
                )
            })?,
        };
        let mut slots = self.live.range(from..);
        let page = slots
            .by_ref()
            .take(limit)
            .filter_map(|i| self.records.get(*i))
            .map(view)
            .collect();
        Ok((page, slots.next().is_some()))
    }

    pub fn get(&self, name: &str) -> Result<Value, Error> {
        let i = self.live(name)?;
        self.records
            .get(i)
            .map(view)
            .ok_or_else(|| Error::new(Kind::NotFound, format!("no key named {name:?}")))
    }

    /// Live key names (for usage listings).
    pub fn names(&self) -> Vec<String> {
        self.live
            .iter()
            .filter_map(|i| self.records.get(*i))
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
        let mut rec = Record {
            name: name.clone(),
            source: Source::Api,
            digest: Some(digest),
            spec,
            created: Some(now),
            updated: Some(now),
            revoked: None,
            row: None,
            fleet: None,
            pending: false,
        };
        // a name keeps its slot (a revoked one made again); a new name takes the next slot
        let slot = self
            .by_name
            .get(&name)
            .copied()
            .unwrap_or(self.records.len());
        let ring = self.stage(&self.ring, slot, &rec)?;
        self.share(&mut rec, None)?;
        rec.row = self.persist(self.mark(
            &rec,
            KeyWrite::Insert {
                name: name.clone(),
                source: "api",
                sha256: digest.0,
                spec: rec.spec.to_json(),
                at: now,
                revoked: None,
            },
        ))?;
        self.put(slot, rec);
        if !self.checked {
            self.checked = true;
            crate::observe::log::info(format_args!(
                "admin: first key created: API requests need a key from now on"
            ));
        }
        self.commit(ring, &[slot]);
        crate::observe::log::info(format_args!("admin: key {name:?} created"));
        Ok((self.get(&name)?, secret))
    }

    /// Change an API key's settings.
    pub fn patch(
        &mut self,
        name: &str,
        body: &Map<String, Value>,
        now: i64,
    ) -> Result<Value, Error> {
        let i = self.live(name)?;
        let Some(old) = self.records.get(i) else {
            return Err(Error::new(Kind::NotFound, format!("no key named {name:?}")));
        };
        if old.source == Source::Config {
            return Err(Error::new(
                Kind::Conflict,
                format!("key {name:?} comes from the config file: change it there (config keys can only be revoked here)"),
            ));
        }
        let mut rec = old.clone();
        rec.spec.apply(body, &[]).map_err(invalid)?;
        rec.updated = Some(now);
        let ring = self.stage(&self.ring, i, &rec)?;
        self.share(&mut rec, old.fleet)?;
        if let Some(id) = rec.row {
            self.persist(self.mark(
                &rec,
                KeyWrite::Update {
                    id,
                    spec: rec.spec.to_json(),
                    at: now,
                },
            ))?;
        }
        self.put(i, rec);
        self.commit(ring, &[i]);
        crate::observe::log::info(format_args!("admin: key {name:?} updated"));
        self.get(name)
    }

    /// Revoke a key: it stops on every shard at their next request.
    pub fn revoke(&mut self, name: &str, now: i64) -> Result<Value, Error> {
        let i = self.live(name)?;
        let Some(old) = self.records.get(i) else {
            return Err(Error::new(Kind::NotFound, format!("no key named {name:?}")));
        };
        let write = match (old.source, old.row) {
            (Source::Api, Some(id)) => Some(KeyWrite::Revoke { id, at: now }),
            (Source::Api, None) => None,
            (Source::Config, _) => old.digest.map(|d| KeyWrite::Insert {
                name: old.name.clone(),
                source: "config",
                sha256: d.0,
                spec: old.spec.to_json(),
                at: now,
                revoked: Some(now),
            }),
        };
        let mut rec = old.clone();
        rec.revoked = Some(now);
        rec.updated = Some(now);
        let ring = self.stage(&self.ring, i, &rec)?;
        if rec.source == Source::Api {
            self.share(&mut rec, old.fleet)?;
        }
        if let Some(w) = write {
            let w = match rec.source {
                Source::Api => self.mark(&rec, w),
                Source::Config => w,
            };
            self.persist(w)?;
        }
        let mut v = view(&rec);
        self.put(i, rec);
        self.commit(ring, &[i]);
        crate::observe::log::info(format_args!("admin: key {name:?} revoked"));
        if let Value::Object(m) = &mut v {
            m.insert(
                "revoked".into(),
                Value::from(crate::util::date::rfc3339(now)),
            );
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
                self.by_name
                    .get(k.name.get_ref().as_str())
                    .and_then(|i| self.records.get(*i))
                    .is_some_and(|r| r.source == Source::Api && r.revoked.is_none())
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
        // the new records of the slots this reload changes (applied only if the snapshot builds)
        let in_file: HashSet<&str> = cfg.keys.iter().map(|k| k.name.get_ref().as_str()).collect();
        let mut changes: Vec<(usize, Record)> = Vec::new();
        for (i, r) in self.records.iter().enumerate() {
            if r.source == Source::Config
                && r.revoked.is_none()
                && !in_file.contains(r.name.as_str())
            {
                // removed from the file: a tombstone with no secret (re-adding it revives it)
                let mut r = r.clone();
                r.revoked = Some(now);
                r.digest = None;
                changes.push((i, r));
            }
        }
        let mut new_names: HashMap<&str, usize> = HashMap::new();
        for k in &cfg.keys {
            let name = k.name.get_ref();
            let digest = config_digest(k);
            let spec = KeySpec::from_config(k);
            let fresh = Record {
                name: name.clone(),
                source: Source::Config,
                digest,
                spec: spec.clone(),
                created: None,
                updated: None,
                revoked: None,
                row: None,
                fleet: None,
                pending: false,
            };
            let (i, rec) = match self.by_name.get(name.as_str()) {
                Some(&i) => match self.records.get(i) {
                    Some(r) if r.source == Source::Config => {
                        // revoked through the admin API with this same secret: stays revoked
                        let keep_revoked =
                            r.revoked.is_some() && r.digest.is_some() && r.digest == digest;
                        let mut r = r.clone();
                        if !keep_revoked {
                            r.revoked = None;
                        }
                        r.digest = digest;
                        r.spec = spec;
                        (i, r)
                    }
                    // a revoked runtime key's name (a live one was refused above): its slot
                    _ => (i, fresh),
                },
                None if new_names.contains_key(name.as_str()) => continue,
                None => {
                    let i = self.records.len() + new_names.len();
                    new_names.insert(name.as_str(), i);
                    (i, fresh)
                }
            };
            changes.push((i, rec));
        }
        let config_error = |e: Error| {
            vec![crate::config::ConfigError {
                line: None,
                message: e.message,
            }]
        };
        // secrets first taken off every changed slot, then put back: two keys may trade secrets
        let mut ring = self.ring.clone();
        for (i, rec) in &changes {
            let hidden = Record {
                digest: None,
                ..rec.clone()
            };
            ring = self.stage(&ring, *i, &hidden).map_err(config_error)?;
        }
        for (i, rec) in changes.iter().filter(|(_, r)| r.presentable().is_some()) {
            ring = self.stage(&ring, *i, rec).map_err(config_error)?;
        }
        let slots: Vec<usize> = changes.iter().map(|(i, _)| *i).collect();
        for (i, rec) in changes {
            self.put(i, rec);
        }
        if self.explicit.is_none() && !cfg.keys.is_empty() {
            self.checked = true;
        }
        self.commit(ring, &slots);
        Ok(())
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
    let time =
        |t: Option<i64>| t.map_or(Value::Null, |t| Value::from(crate::util::date::rfc3339(t)));
    m.insert("created".into(), time(r.created));
    m.insert("updated".into(), time(r.updated));
    m.insert("usable".into(), Value::from(r.digest.is_some()));
    if r.pending {
        // shared keys: made here while the store was away; reaches the fleet when it is back
        m.insert("fleet_pending".into(), Value::from(true));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests;
