//! `kind = "bedrock"`: AWS Bedrock's Converse API. `sigv4` signs each request with the
//! credentials `credentials` resolves (on the process's helper thread, `upstream::cloud`);
//! `eventstream` decodes ConverseStream's binary framing and `events` turns it into hub Chat
//! events. A Bedrock API key (`api_key_env`, default `AWS_BEARER_TOKEN_BEDROCK` when set) is
//! sent as `authorization: Bearer …` instead, through the provider's ordinary key lines.
//!
//! Owns: `Signer` (the per-provider signing setup). Must not: translate bodies (that is
//! `dialect::converse`), or log a credential.

pub mod credentials;
pub mod events;
pub mod eventstream;
pub mod sigv4;

use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::upstream::cloud::{self, Cell};

/// The signing name of Bedrock Runtime (botocore's `signingName`).
pub const SERVICE: &str = "bedrock";

/// SigV4 signing for one provider: its region, the process's credential cell, and the day's
/// signing key (the four-HMAC chain from the secret: about a fifth of a signature's work on a
/// 1 KB body, the same for every request of a day and credential set).
#[derive(Debug)]
pub struct Signer {
    pub region: String,
    pub cell: Arc<Cell<sigv4::Credentials>>,
    key: Mutex<Option<DayKey>>,
}

/// A signing key and what it was derived from (the credentials by identity: a refresh makes a
/// new `Arc`, and so a new key).
struct DayKey {
    creds: Arc<sigv4::Credentials>,
    date: [u8; 8],
    key: ring::hmac::Key,
}

impl std::fmt::Debug for DayKey {
    // never the key
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DayKey").finish_non_exhaustive()
    }
}

impl Signer {
    /// The signer for `src` (one credential cell per distinct setup and environment).
    pub fn new(provider: &str, src: credentials::Source) -> Signer {
        let key = format!("bedrock|{src:?}|{}", env_fingerprint());
        let what = format!("AWS credentials for provider {provider}");
        let s = src.clone();
        let cell = cloud::cell(key, what, move || {
            credentials::resolve(&s).map(|c| {
                let exp = c.expires;
                (c, exp)
            })
        });
        Signer {
            region: src.region,
            cell,
            key: Mutex::new(None),
        }
    }

    /// Append the SigV4 lines for `POST target` to `host` with `body`.
    pub async fn authorize(
        &self,
        host: &str,
        target: &str,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let creds = self.cell.get().await?;
        let date = sigv4::amz_date(cloud::now());
        let r = sigv4::Request {
            region: &self.region,
            service: SERVICE,
            host,
            target,
            body,
            amz_date: &date,
        };
        let key = day_key(&self.key, &creds, r.day(), &self.region);
        out.extend(sigv4::sign_with(&key, &creds, &r));
        Ok(())
    }
}

/// The signing key for `creds` on `date` (`YYYYMMDD`) in `region`: the one kept in `slot` when
/// it was derived from the same credentials (by identity) for the same day, else derived and
/// kept — unless another shard holds the lock this instant: then derived for this request
/// only (a shard never waits on another here).
fn day_key(
    slot: &Mutex<Option<DayKey>>,
    creds: &Arc<sigv4::Credentials>,
    date: &str,
    region: &str,
) -> ring::hmac::Key {
    let mut guard = slot.try_lock().ok();
    if let Some(Some(k)) = guard.as_deref() {
        if Arc::ptr_eq(&k.creds, creds) && k.date.as_slice() == date.as_bytes() {
            return k.key.clone();
        }
    }
    let key = sigv4::signing_key(creds, date, region, SERVICE);
    if let (Some(g), Ok(d)) = (guard.as_mut(), <[u8; 8]>::try_from(date.as_bytes())) {
        **g = Some(DayKey {
            creds: creds.clone(),
            date: d,
            key: key.clone(),
        });
    }
    key
}

/// The environment the chain reads, hashed (a reload after it changed starts a new cell;
/// the values themselves are never kept in the key).
fn env_fingerprint() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for v in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_PROFILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    ] {
        std::env::var(v).ok().hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(secret: &str) -> Arc<sigv4::Credentials> {
        Arc::new(sigv4::Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: secret.into(),
            session_token: None,
            expires: None,
        })
    }

    /// Same key as deriving afresh: compared by what it signs.
    fn same(a: &ring::hmac::Key, b: &ring::hmac::Key) -> bool {
        ring::hmac::sign(a, b"x").as_ref() == ring::hmac::sign(b, b"x").as_ref()
    }

    #[test]
    fn the_day_key_is_kept_for_its_day_and_credentials_only() {
        let slot = Mutex::new(None);
        let a = creds("secret-a");
        let k1 = day_key(&slot, &a, "20261203", "us-east-1");
        assert!(same(
            &k1,
            &sigv4::signing_key(&a, "20261203", "us-east-1", SERVICE)
        ));
        let kept = |slot: &Mutex<Option<DayKey>>| {
            let g = slot.lock().unwrap();
            let k = g.as_ref().unwrap();
            (Arc::as_ptr(&k.creds), k.date)
        };
        assert_eq!(kept(&slot), (Arc::as_ptr(&a), *b"20261203"));
        // the same day: the kept key
        assert!(same(&day_key(&slot, &a, "20261203", "us-east-1"), &k1));
        // the next day: derived again, and kept
        let k2 = day_key(&slot, &a, "20261204", "us-east-1");
        assert!(!same(&k2, &k1));
        assert!(same(
            &k2,
            &sigv4::signing_key(&a, "20261204", "us-east-1", SERVICE)
        ));
        assert_eq!(kept(&slot).1, *b"20261204");
        // refreshed credentials (a new Arc, even with the same secret) on the same day: again
        let b = creds("secret-b");
        let k3 = day_key(&slot, &b, "20261204", "us-east-1");
        assert!(same(
            &k3,
            &sigv4::signing_key(&b, "20261204", "us-east-1", SERVICE)
        ));
        assert_eq!(kept(&slot).0, Arc::as_ptr(&b));
        // another shard holding the lock: derived for this request, nothing waits
        let held = slot.lock().unwrap();
        let k4 = day_key(&slot, &a, "20261205", "us-east-1");
        assert!(same(
            &k4,
            &sigv4::signing_key(&a, "20261205", "us-east-1", SERVICE)
        ));
        drop(held);
        assert_eq!(kept(&slot).1, *b"20261204");
    }
}
