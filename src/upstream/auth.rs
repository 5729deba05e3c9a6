//! The per-request authorisation of the cloud kinds: Bedrock's SigV4 signer or Vertex's OAuth
//! token, picked per provider from its config (a Bedrock provider with an API key takes neither:
//! its key goes as `authorization: Bearer` through the ordinary key lines).
//!
//! Owns: `Auth`. Must not: resolve credentials itself (the `cloud` cells do, off the shard).

use std::sync::Arc;

use crate::error::Error;

/// The env var the AWS SDKs read a Bedrock API key from.
pub const BEDROCK_KEY_ENV: &str = "AWS_BEARER_TOKEN_BEDROCK";

/// The per-request authorisation of a cloud provider.
#[derive(Debug, Clone)]
pub enum Auth {
    /// SigV4 with the chain's (or the role's) credentials.
    Bedrock(Arc<crate::upstream::bedrock::Signer>),
    /// `authorization: Bearer` with the process's OAuth access token.
    Vertex(Arc<crate::upstream::vertex::Tokens>),
}

impl Auth {
    /// The authorisation `p` needs: Bedrock without an API key signs; Vertex always takes
    /// tokens; other kinds none.
    pub fn for_provider(p: &crate::config::ProviderConfig, keyed: bool) -> Option<Auth> {
        use crate::config::provider::ProviderKind;
        let name = p.name.get_ref();
        match p.kind.get_ref() {
            ProviderKind::Bedrock if !keyed => {
                let src = crate::upstream::bedrock::credentials::Source {
                    region: p
                        .region
                        .as_ref()
                        .map_or("us-east-1".into(), |r| r.get_ref().clone()),
                    role_arn: p.role_arn.as_ref().map(|r| r.get_ref().clone()),
                    sts_url: crate::config::cloud::sts_url(p),
                };
                Some(Auth::Bedrock(Arc::new(
                    crate::upstream::bedrock::Signer::new(name, src),
                )))
            }
            ProviderKind::Vertex => {
                let src = crate::upstream::vertex::Source {
                    credentials_file: p.credentials_file.as_ref().map(|f| f.get_ref().clone()),
                    token_url: p.token_url.as_ref().map(|u| u.get_ref().clone()),
                };
                Some(Auth::Vertex(Arc::new(
                    crate::upstream::vertex::Tokens::new(name, src),
                )))
            }
            _ => None,
        }
    }

    /// Append this request's authorisation lines (`host`: the `Host` header value, `target`:
    /// the request target, `body`: the exact body sent).
    pub async fn authorize(
        &self,
        host: &str,
        target: &str,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        match self {
            Auth::Bedrock(s) => s.authorize(host, target, body, out).await,
            Auth::Vertex(t) => t.authorize(out).await,
        }
    }
}
