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

use std::sync::Arc;

use crate::error::Error;
use crate::upstream::cloud::{self, Cell};

/// The signing name of Bedrock Runtime (botocore's `signingName`).
pub const SERVICE: &str = "bedrock";

/// SigV4 signing for one provider: its region and the process's credential cell.
#[derive(Debug)]
pub struct Signer {
    pub region: String,
    pub cell: Arc<Cell<sigv4::Credentials>>,
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
        out.extend(sigv4::sign(
            &creds,
            &self.region,
            SERVICE,
            host,
            target,
            body,
            &date,
        ));
        Ok(())
    }
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
