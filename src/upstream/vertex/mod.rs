//! `kind = "vertex"`: Google Vertex AI. The request paths are `config::provider`'s (Gemini
//! models under `publishers/google`, Anthropic models' `rawPredict` under
//! `publishers/anthropic`); this module gives every request its OAuth access token, one per
//! process per credential setup, cached and renewed before it expires on the helper thread
//! (`upstream::cloud`).
//!
//! Where the token comes from, in the SDKs' order: the provider's `credentials_file`, else
//! `GOOGLE_APPLICATION_CREDENTIALS` — a service-account key (an RS256-signed JWT assertion,
//! `jwt`, exchanged at `token_url`, default the key's `token_uri`) or an authorized-user file
//! (its refresh token) — else the metadata server (`GCE_METADATA_HOST`, default
//! `metadata.google.internal`; header `Metadata-Flavor: Google`).
//!
//! Owns: `Tokens`, `Source`, the token sources. Must not: log a key or a token, or run a
//! source on a shard.

pub mod jwt;

use std::sync::Arc;

use crate::error::Error;
use crate::upstream::cloud::{self, Cell};
use crate::upstream::fetch::{self, form_value};

/// The OAuth scope asked for.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// Where a provider's tokens come from besides the environment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Source {
    pub credentials_file: Option<String>,
    pub token_url: Option<String>,
}

/// An access token (never printed).
pub struct Token {
    pub value: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// The process's token cell for one provider setup.
#[derive(Debug)]
pub struct Tokens {
    pub cell: Arc<Cell<Token>>,
}

impl Tokens {
    pub fn new(provider: &str, src: Source) -> Tokens {
        let adc = std::env::var("GOOGLE_APPLICATION_CREDENTIALS").ok();
        let meta = std::env::var("GCE_METADATA_HOST").ok();
        let key = format!("vertex|{src:?}|{adc:?}|{meta:?}");
        let what = format!("Google credentials for provider {provider}");
        let cell = cloud::cell(key, what, move || resolve(&src));
        Tokens { cell }
    }

    /// Append `authorization: Bearer <token>`.
    pub async fn authorize(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        let t = self.cell.get().await?;
        out.extend_from_slice(b"authorization: Bearer ");
        out.extend_from_slice(t.value.as_bytes());
        out.extend_from_slice(b"\r\n");
        Ok(())
    }
}

/// An access token and its expiry (Unix seconds), from `src` or the environment.
pub fn resolve(src: &Source) -> Result<(Token, Option<u64>), String> {
    let file = src.credentials_file.clone().or_else(|| {
        std::env::var("GOOGLE_APPLICATION_CREDENTIALS")
            .ok()
            .filter(|f| !f.is_empty())
    });
    match file {
        Some(f) => from_file(&f, src.token_url.as_deref()),
        None => metadata(),
    }
}

fn from_file(path: &str, token_url: Option<&str>) -> Result<(Token, Option<u64>), String> {
    let text = std::fs::read(path).map_err(|e| format!("credentials file {path}: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&text).map_err(|_| format!("credentials file {path}: not JSON"))?;
    let s = |k: &str| v.get(k).and_then(|x| x.as_str());
    match s("type") {
        Some("service_account") => {
            let email = s("client_email").ok_or("the key file has no client_email")?;
            let pem = s("private_key").ok_or("the key file has no private_key")?;
            let uri = token_url
                .or(s("token_uri"))
                .unwrap_or("https://oauth2.googleapis.com/token");
            let now = cloud::now();
            let assertion = jwt::assertion(pem, s("private_key_id"), email, SCOPE, uri, now)
                .map_err(|e| format!("credentials file {path}: {e}"))?;
            let mut form = String::from(
                "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=",
            );
            form_value(&assertion, &mut form);
            token_exchange(uri, &form, now)
        }
        Some("authorized_user") => {
            let uri = token_url.unwrap_or("https://oauth2.googleapis.com/token");
            let mut form = String::from("grant_type=refresh_token&client_id=");
            form_value(
                s("client_id").ok_or("the file has no client_id")?,
                &mut form,
            );
            form.push_str("&client_secret=");
            form_value(
                s("client_secret").ok_or("the file has no client_secret")?,
                &mut form,
            );
            form.push_str("&refresh_token=");
            form_value(
                s("refresh_token").ok_or("the file has no refresh_token")?,
                &mut form,
            );
            token_exchange(uri, &form, cloud::now())
        }
        other => Err(format!(
            "credentials file {path}: type {:?} is not service_account or authorized_user",
            other.unwrap_or("<missing>")
        )),
    }
}

fn token_answer(
    status: u16,
    body: &[u8],
    now: u64,
    what: &str,
) -> Result<(Token, Option<u64>), String> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if status != 200 {
        // the OAuth error code only (never the request's assertion)
        let code = v.get("error").and_then(|e| e.as_str()).unwrap_or("");
        return Err(format!("{what} answered {status} {code}"));
    }
    let token = v
        .get("access_token")
        .and_then(|t| t.as_str())
        .ok_or_else(|| format!("{what} answered without access_token"))?;
    crate::http::target::header_value(token)
        .map_err(|_| format!("{what} answered a token that is not a header value"))?;
    let exp = v
        .get("expires_in")
        .and_then(|e| e.as_u64())
        .map(|s| now.saturating_add(s));
    Ok((
        Token {
            value: token.to_string(),
        },
        exp,
    ))
}

fn token_exchange(uri: &str, form: &str, now: u64) -> Result<(Token, Option<u64>), String> {
    let r = fetch::fetch(
        "POST",
        uri,
        b"content-type: application/x-www-form-urlencoded\r\naccept: application/json\r\n",
        form.as_bytes(),
    )
    .map_err(|e| format!("token endpoint: {e}"))?;
    token_answer(r.status, &r.body, now, "the token endpoint")
}

fn metadata() -> Result<(Token, Option<u64>), String> {
    let host = std::env::var("GCE_METADATA_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "metadata.google.internal".into());
    let url = format!("http://{host}/computeMetadata/v1/instance/service-accounts/default/token");
    let now = cloud::now();
    let r = fetch::fetch("GET", &url, b"metadata-flavor: Google\r\n", b"").map_err(|e| {
        format!(
            "no credentials_file or GOOGLE_APPLICATION_CREDENTIALS, and the metadata server: {e}"
        )
    })?;
    token_answer(r.status, &r.body, now, "the metadata server")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_answers() {
        let (t, exp) = token_answer(
            200,
            br#"{"access_token":"ya29.x","expires_in":3599}"#,
            10,
            "t",
        )
        .unwrap();
        assert_eq!((t.value.as_str(), exp), ("ya29.x", Some(3609)));
        let e = token_answer(
            400,
            br#"{"error":"invalid_grant","error_description":"x"}"#,
            0,
            "t",
        )
        .unwrap_err();
        assert_eq!(e, "t answered 400 invalid_grant");
        assert!(token_answer(200, br#"{"access_token":"a\r\nb"}"#, 0, "t").is_err());
    }
}
