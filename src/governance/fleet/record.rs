//! One runtime key as the fleet's store holds it: its name, the SHA-256 of its secret (never
//! the secret), its settings (`KeySpec` JSON), created/updated/revoked Unix seconds and the
//! store version that wrote it.
//!
//! In the store a record is one hash field: `<ver> <sha256 hex> <created> <updated> <revoked>
//! <spec>` (`revoked` 0: live), written only by `keys.lua`. Records read back are hostile
//! bytes like any reply: `parse` checks every field (the name rule, 64 hex digits, numbers,
//! a bounded spec) and refuses the record otherwise; the spec itself is checked by
//! `KeySpec::from_json` where it is applied.
//!
//! Owns: `Shared`, its wire form. Must not: know about the registry or do IO.

use crate::config::keys::key_name_ok;

/// Longest spec JSON accepted from the store (a key's settings are a few hundred bytes).
pub const MAX_SPEC: usize = 32 * 1024;

/// A key record of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shared {
    pub name: String,
    pub sha256: [u8; 32],
    pub created: i64,
    pub updated: i64,
    /// `Some`: revoked then (a tombstone: it stays revoked in the fleet).
    pub revoked: Option<i64>,
    /// `KeySpec` JSON.
    pub spec: String,
    /// The store version that wrote it (0: not in the store yet).
    pub ver: u64,
}

impl Shared {
    /// The digest as 64 lowercase hex digits.
    pub fn sha_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.sha256 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// `revoked` as the script's argument (0: live).
    pub fn revoked_arg(&self) -> i64 {
        self.revoked.unwrap_or(0)
    }

    /// Parse the store's record of `name` (the hash field's value).
    pub fn parse(name: &[u8], value: &[u8]) -> Result<Shared, String> {
        let name = std::str::from_utf8(name)
            .ok()
            .filter(|n| key_name_ok(n))
            .ok_or("a key name that breaks the [[key]] name rule")?;
        let text = std::str::from_utf8(value).map_err(|_| "a record that is not UTF-8")?;
        let mut f = text.splitn(6, ' ');
        let num = |v: Option<&str>, what: &str| -> Result<i64, String> {
            v.and_then(|v| v.parse::<i64>().ok())
                .filter(|v| *v >= 0)
                .ok_or_else(|| format!("key {name:?}: bad {what}"))
        };
        let ver = num(f.next(), "version")?;
        let hex = f.next().unwrap_or_default();
        let sha256 = crate::config::keys::parse_sha256(hex)
            .ok_or_else(|| format!("key {name:?}: bad sha256"))?;
        let created = num(f.next(), "created")?;
        let updated = num(f.next(), "updated")?;
        let revoked = num(f.next(), "revoked")?;
        let spec = f.next().unwrap_or_default();
        if spec.len() > MAX_SPEC || !spec.starts_with('{') {
            return Err(format!("key {name:?}: bad settings"));
        }
        Ok(Shared {
            name: name.to_string(),
            sha256,
            created,
            updated,
            revoked: (revoked > 0).then_some(revoked),
            spec: spec.to_string(),
            ver: ver as u64,
        })
    }

    /// The wire form (what the script writes; for tests and the store's answer).
    pub fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.ver,
            self.sha_hex(),
            self.created,
            self.updated,
            self.revoked_arg(),
            self.spec
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_hostile_ones_are_refused() {
        let r = Shared {
            name: "team-a".into(),
            sha256: [0xab; 32],
            created: 10,
            updated: 12,
            revoked: Some(13),
            spec: r#"{"rpm":5,"note":"a b"}"#.into(),
            ver: 7,
        };
        assert_eq!(
            Shared::parse(b"team-a", r.encode().as_bytes()),
            Ok(r.clone())
        );
        let live = Shared {
            revoked: None,
            ..r.clone()
        };
        assert_eq!(
            Shared::parse(b"team-a", live.encode().as_bytes())
                .unwrap()
                .revoked,
            None
        );
        for bad in [
            "x abab 1 1 0 {}",
            "1 zz 1 1 0 {}",
            &format!("1 {} -1 1 0 {{}}", r.sha_hex()),
            &format!("1 {} 1 1 0 nope", r.sha_hex()),
            &format!("1 {} 1 1", r.sha_hex()),
            &format!("1 {} 1 1 0 {{{}", r.sha_hex(), "x".repeat(MAX_SPEC)),
        ] {
            assert!(Shared::parse(b"team-a", bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(Shared::parse(b"bad name", r.encode().as_bytes()).is_err());
        assert!(Shared::parse(&[0xff], r.encode().as_bytes()).is_err());
    }
}
