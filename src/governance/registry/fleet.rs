//! The registry's side of shared keys (`governance::fleet`): handing an API key's change to
//! the fleet's store before it is kept here (`share`), applying the records other nodes wrote
//! (`apply_fleet`: the store wins, a revocation made here is never undone), and the changes
//! still to be pushed (`Sink::pending`).
//!
//! Owns: those rules. Must not: wait on the store while the fleet thread needs the registry
//! (the fleet thread only ever `try_lock`s it: `Sink`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, TryLockError};

use super::{Record, Registry, Source};
use crate::error::{Error, Kind};
use crate::governance::fleet::{Fleet, KeySink, Put, Shared};
use crate::governance::keyring::Digest;
use crate::governance::spec::KeySpec;
use crate::governance::state::{KeyRow, KeyWrite};

impl Registry {
    /// Share this registry's API keys through `fleet` (its thread follows the store).
    pub fn with_fleet(&mut self, fleet: Arc<Fleet>) {
        self.fleet = Some(fleet);
    }

    /// Whether this registry shares its API keys (`[fleet] share` has "keys").
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// `rec` (an API key's new state, made on store version `base`) to the fleet's store:
    /// `rec.fleet`/`rec.pending` say where it stands. The store's own record wins a conflict
    /// (it is applied here, and the change is refused: 409); with the store away the change is
    /// pending (`on_store_error = "local"`) or refused (503, `"closed"`).
    pub(super) fn share(&mut self, rec: &mut Record, base: Option<u64>) -> Result<(), Error> {
        let Some(fleet) = self.fleet.clone() else {
            if self.shared {
                // sharing on, the thread not (yet) started: the change is this node's for now
                rec.pending = true;
            }
            return Ok(());
        };
        let Some(shared) = to_shared(rec) else {
            return Ok(());
        };
        match fleet.put(&shared, base) {
            Put::Stored(r) => {
                rec.fleet = Some(r.ver);
                rec.pending = false;
                Ok(())
            }
            Put::Conflict(r) => {
                let name = r.name.clone();
                let live = r.revoked.is_none();
                self.apply_fleet(&[r], now());
                Err(Error::new(
                    Kind::Conflict,
                    match (base, live) {
                        (None, _) => format!("a key named {name:?} exists in the fleet (made on another node); revoke it first or pick another name"),
                        (Some(_), true) => format!("key {name:?} was changed on another node of the fleet; its current settings are applied here now: read it and try again"),
                        (Some(_), false) => format!("key {name:?} was revoked on another node of the fleet"),
                    },
                ))
            }
            Put::Down if self.closed => Err(Error::new(
                Kind::LimitStoreDown,
                "the fleet's store is unavailable and on_store_error = \"closed\": key changes are refused until it is back",
            )),
            Put::Down => {
                rec.pending = true;
                crate::observe::log::info(format_args!(
                    "fleet: key {:?} changed here while the store is away: it reaches the fleet when the store is back",
                    rec.name
                ));
                Ok(())
            }
        }
    }

    /// `w` with the fleet columns of `rec` (when keys are shared).
    pub(super) fn mark(&self, rec: &Record, w: KeyWrite) -> KeyWrite {
        if !self.shared {
            return w;
        }
        KeyWrite::Marked {
            write: Box::new(w),
            fleet_ver: rec.fleet.and_then(|v| i64::try_from(v).ok()),
            pending: rec.pending,
        }
    }

    /// Apply records read from the fleet's store. The store wins, except that a key revoked
    /// here stays revoked (and is pushed again); a fleet key named like a config key is not
    /// applied (config keys are this node's). Each applied change is one state-store row.
    pub fn apply_fleet(&mut self, recs: &[Shared], now: i64) {
        if !self.can_check() {
            return;
        }
        let mut ring = self.ring.clone();
        let mut slots = Vec::new();
        let mut live_added = false;
        for r in recs {
            let Some((i, rec, writes)) = self.fleet_change(r, now) else {
                continue;
            };
            match self.stage(&ring, i, &rec) {
                Ok(next) => ring = next,
                Err(e) => {
                    crate::observe::log::info(format_args!(
                        "fleet: key {:?} not applied: {}",
                        r.name, e.message
                    ));
                    continue;
                }
            }
            let mut rec = rec;
            for w in writes {
                match self.persist(w) {
                    Ok(Some(id)) if rec.row.is_none() => rec.row = Some(id),
                    Ok(_) => {}
                    Err(e) => crate::observe::log::info(format_args!(
                        "fleet: key {:?}: {}",
                        r.name, e.message
                    )),
                }
            }
            live_added |= rec.revoked.is_none();
            self.put(i, rec);
            slots.push(i);
        }
        if slots.is_empty() {
            return;
        }
        if live_added && !self.checked {
            self.checked = true;
            crate::observe::log::info(format_args!(
                "fleet: first key from the fleet: API requests need a key from now on"
            ));
        }
        self.commit(ring, &slots);
    }

    /// What the store's record `r` changes here: the slot, its new record and the state-store
    /// writes (`None`: nothing).
    fn fleet_change(&mut self, r: &Shared, now: i64) -> Option<(usize, Record, Vec<KeyWrite>)> {
        let spec = match KeySpec::from_json(&r.spec) {
            Ok(s) => s,
            Err(e) => {
                crate::observe::log::info(format_args!(
                    "fleet: key {:?} in the store has settings this node refuses: {e}",
                    r.name
                ));
                return None;
            }
        };
        let digest = Digest(r.sha256);
        let slot = self.by_name.get(&r.name).copied();
        let local = slot.and_then(|i| self.records.get(i)).cloned();
        let marked = |w: KeyWrite, ver: Option<u64>, pending: bool| KeyWrite::Marked {
            write: Box::new(w),
            fleet_ver: ver.and_then(|v| i64::try_from(v).ok()),
            pending,
        };
        let insert = |rec: &Record| {
            marked(
                KeyWrite::Insert {
                    name: rec.name.clone(),
                    source: "api",
                    sha256: digest.0,
                    spec: rec.spec.to_json(),
                    at: rec.created.unwrap_or(now),
                    revoked: rec.revoked,
                },
                rec.fleet,
                false,
            )
        };
        let fresh = Record {
            name: r.name.clone(),
            source: Source::Api,
            digest: Some(digest),
            spec: spec.clone(),
            created: Some(r.created),
            updated: Some(r.updated),
            revoked: r.revoked,
            row: None,
            fleet: Some(r.ver),
            pending: false,
        };
        let Some(local) = local else {
            // a key this node never had; a tombstone of one is nothing to know
            if r.revoked.is_some() {
                return None;
            }
            let w = insert(&fresh);
            return Some((self.records.len(), fresh, vec![w]));
        };
        let i = slot?;
        if local.source == Source::Config {
            if r.revoked.is_none() && local.revoked.is_none() {
                crate::observe::log::info(format_args!(
                    "fleet: key {:?} of the fleet is also a [[key]] of this node's config: the config key stays here",
                    r.name
                ));
            }
            return None;
        }
        if local.digest == Some(digest) {
            // the same version with the same content: nothing to do (a version alone is not
            // enough: a store that lost its records numbers them again from 1)
            let same = local.revoked.is_some() == r.revoked.is_some()
                && local.spec.to_json() == spec.to_json();
            if local.fleet == Some(r.ver) && !local.pending && same {
                return None;
            }
            if local.revoked.is_some() && r.revoked.is_none() {
                // revoked here: never undone; pushed (again) at the next reconcile
                let mut rec = local.clone();
                rec.pending = true;
                let w = rec.row.map(|id| {
                    marked(
                        KeyWrite::Revoke {
                            id,
                            at: rec.revoked.unwrap_or(now),
                        },
                        rec.fleet,
                        true,
                    )
                });
                return Some((i, rec, w.into_iter().collect()));
            }
            let mut rec = Record {
                row: local.row,
                ..fresh
            };
            rec.created = local.created.or(rec.created);
            let writes = match rec.row {
                Some(id) => {
                    let mut w = vec![marked(
                        KeyWrite::Update {
                            id,
                            spec: rec.spec.to_json(),
                            at: r.updated,
                        },
                        rec.fleet,
                        false,
                    )];
                    if let (Some(at), None) = (r.revoked, local.revoked) {
                        w.push(KeyWrite::Revoke { id, at });
                    }
                    w
                }
                None => vec![insert(&rec)],
            };
            return Some((i, rec, writes));
        }
        // another key of that name
        if r.revoked.is_some() {
            if local.revoked.is_none() && !local.pending {
                // the store does not hold this node's live key: push it
                let mut rec = local.clone();
                rec.pending = true;
                return Some((i, rec, Vec::new()));
            }
            return None;
        }
        if local.revoked.is_none() && local.pending {
            crate::observe::log::info(format_args!(
                "fleet: key {:?} made here while the store was away is replaced by the fleet's key of that name (the store wins)",
                r.name
            ));
        }
        let mut writes = Vec::new();
        if let (Some(id), None) = (local.row, local.revoked) {
            writes.push(KeyWrite::Revoke { id, at: now });
        }
        writes.push(insert(&fresh));
        Some((i, fresh, writes))
    }
}

/// An API key's record as the store holds it (`None`: no digest to share).
fn to_shared(rec: &Record) -> Option<Shared> {
    Some(Shared {
        name: rec.name.clone(),
        sha256: rec.digest?.0,
        created: rec.created.unwrap_or(0),
        updated: rec.updated.unwrap_or(0),
        revoked: rec.revoked,
        spec: rec.spec.to_json(),
        ver: rec.fleet.unwrap_or(0),
    })
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// At start: API keys revoked here while the store was away (their last row revoked and
/// pending, no live key of that name) become tombstones that remember their digest, so the
/// revocation is pushed when the store is back and a stale live record never revives them.
pub(super) fn pending_revocations(
    stored: &[KeyRow],
    records: &mut Vec<Record>,
    by_name: &mut HashMap<String, usize>,
) {
    let mut last: HashMap<&str, &KeyRow> = HashMap::new();
    for r in stored.iter().filter(|r| r.source == "api") {
        last.insert(r.name.as_str(), r);
    }
    let mut rows: Vec<&KeyRow> = last
        .into_values()
        .filter(|r| r.revoked.is_some() && r.pending)
        .collect();
    rows.sort_by_key(|r| r.id);
    for r in rows {
        if by_name.contains_key(&r.name) {
            continue;
        }
        let Ok(spec) = KeySpec::from_json(&r.spec) else {
            continue;
        };
        by_name.insert(r.name.clone(), records.len());
        records.push(Record {
            pending: true,
            ..Record::stored(r, spec)
        });
    }
}

/// The fleet thread's way into the registry: `try_lock` only (the admin thread may hold the
/// lock while it waits on the fleet thread for a write).
pub struct Sink(pub Arc<Mutex<Registry>>);

impl Sink {
    fn with<T>(&self, f: impl FnOnce(&mut Registry) -> T) -> Option<T> {
        match self.0.try_lock() {
            Ok(mut r) => Some(f(&mut r)),
            Err(TryLockError::WouldBlock) => None,
            Err(TryLockError::Poisoned(p)) => Some(f(&mut p.into_inner())),
        }
    }
}

impl KeySink for Sink {
    fn apply(&self, recs: &[Shared]) -> bool {
        self.with(|r| r.apply_fleet(recs, now())).is_some()
    }

    fn pending(&self) -> Option<Vec<(Shared, Option<u64>)>> {
        self.with(|reg| {
            reg.records
                .iter()
                .filter(|r| r.source == Source::Api && r.pending)
                .filter_map(|r| Some((to_shared(r)?, r.fleet)))
                .collect()
        })
    }

    fn top(&self) -> Option<u64> {
        self.with(|reg| {
            reg.records
                .iter()
                .filter_map(|r| r.fleet)
                .max()
                .unwrap_or(0)
        })
    }

    fn reseed(&self) -> bool {
        self.with(|reg| {
            for r in reg.records.iter_mut().filter(|r| r.source == Source::Api) {
                if r.digest.is_some() {
                    r.pending = true;
                }
            }
        })
        .is_some()
    }
}
