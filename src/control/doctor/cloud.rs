//! Doctor: the credentials of the cloud kinds, resolved the way the gateway resolves them
//! (`upstream::auth::Auth::for_provider`: the same chain, on its helper thread): Bedrock's
//! SigV4 credentials (env, shared files and `AWS_PROFILE`, web identity, container, IMDSv2, the
//! provider's `role_arn`) or its API key, Vertex's OAuth access token (service-account file,
//! `GOOGLE_APPLICATION_CREDENTIALS`, the metadata server).
//!
//! Owns: that probe and its verdict. Must not: print a secret, a token or an error body (the
//! resolver's messages name sources and statuses, never values).

use std::time::{Duration, Instant};

use crate::config::provider::ProviderKind;
use crate::config::ProviderConfig;
use crate::upstream::auth::{Auth, BEDROCK_KEY_ENV};

/// Longest wait for a first resolution (a chain may try IMDS and STS in turn).
const WAIT: Duration = Duration::from_secs(10);

/// `Ok(what was found)` or `Err((problem, fix))`; `None` for other kinds.
pub(super) fn credentials(
    p: &ProviderConfig,
    keyed: Option<&str>,
) -> Option<Result<String, (String, String)>> {
    let kind = *p.kind.get_ref();
    let keyed = match (kind, keyed) {
        (ProviderKind::Bedrock, Some(env)) => Some(env.to_string()),
        (ProviderKind::Bedrock, None) if p.key_refs().is_empty() => std::env::var(BEDROCK_KEY_ENV)
            .ok()
            .filter(|v| !v.is_empty())
            .map(|_| BEDROCK_KEY_ENV.to_string()),
        _ => None,
    };
    if let Some(env) = keyed {
        return Some(Ok(format!("Bedrock API key from {env} (Bearer, no SigV4)")));
    }
    let auth = Auth::for_provider(p, false)?;
    let start = Instant::now();
    let (got, what) = loop {
        let (peek, what) = match &auth {
            Auth::Bedrock(s) => (s.cell.peek().map(|v| v.is_some()), "AWS credentials"),
            Auth::Vertex(t) => (t.cell.peek().map(|v| v.is_some()), "a Google access token"),
        };
        match peek {
            Ok(false) if start.elapsed() < WAIT => std::thread::sleep(Duration::from_millis(50)),
            other => break (other, what),
        }
    };
    let fix = match kind {
        ProviderKind::Bedrock => "give the gateway AWS credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE with ~/.aws files, AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, a container or instance role, or AWS_BEARER_TOKEN_BEDROCK (see docs/cloud.md)",
        _ => "give the gateway Google credentials: credentials_file on the provider, GOOGLE_APPLICATION_CREDENTIALS, or a metadata server (GCE_METADATA_HOST; see docs/cloud.md)",
    };
    Some(match got {
        Ok(true) => Ok(format!(
            "{what} obtained in {:.1} s",
            start.elapsed().as_secs_f64()
        )),
        Ok(false) => Err((
            format!("no {what} within {} s", WAIT.as_secs()),
            fix.to_string(),
        )),
        Err(e) => Err((format!("{what}: {e}"), fix.to_string())),
    })
}
