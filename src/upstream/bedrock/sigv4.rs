//! AWS Signature Version 4 for one upstream request (the SigV4 spec, "Create a signed AWS API
//! request"): canonical request → string to sign → HMAC-SHA256 chain → `Authorization`.
//! `tests/sdk/test_bedrock.py` recomputes every signature the gateway sends with botocore's
//! `SigV4Auth` on the same inputs and refuses mismatches.
//!
//! The canonical URI is the request path percent-encoded once more (every byte outside
//! `A-Z a-z 0-9 - _ . ~ /`, as botocore's `quote(path, safe='/~')` for every service but S3):
//! the model id `a:0`, sent as `a%3A0`, is signed as `a%253A0`. Signed headers: `host`,
//! `x-amz-date`, and `x-amz-security-token` with temporary credentials; the payload hash is the
//! SHA-256 of the body.
//!
//! Owns: `sign`, `signing_key`, `Request`, `Credentials`. Must not: log (a secret or a signature is never printed), read
//! clocks (the caller passes the time), or do IO.

use ring::{digest, hmac};

/// One set of AWS credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Unix seconds when they expire (`None`: long-term keys).
    pub expires: Option<u64>,
}

impl std::fmt::Debug for Credentials {
    // never the secret or the token
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex(bytes: &[u8], out: &mut String) {
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
}

fn sha256_hex(data: &[u8]) -> String {
    let mut s = String::with_capacity(64);
    hex(digest::digest(&digest::SHA256, data).as_ref(), &mut s);
    s
}

fn hmac(key: &[u8], msg: &[u8]) -> hmac::Tag {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), msg)
}

/// `path` encoded once more for the canonical request (see the module doc).
fn canonical_uri(path: &str, out: &mut String) {
    if path.is_empty() {
        out.push('/');
    }
    for &b in path.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize].to_ascii_uppercase() as char);
            out.push(HEX[(b & 15) as usize].to_ascii_uppercase() as char);
        }
    }
}

/// The query's `k=v` pairs sorted (they are already encoded by whoever built the target).
fn canonical_query(query: &str, out: &mut String) {
    let mut pairs: Vec<(&str, &str)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    pairs.sort_unstable();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
}

/// What one signature covers: `POST target` to `host` with `body`, at `amz_date`
/// (`YYYYMMDDTHHMMSSZ`), for `service` in `region`.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub region: &'a str,
    pub service: &'a str,
    pub host: &'a str,
    pub target: &'a str,
    pub body: &'a [u8],
    pub amz_date: &'a str,
}

impl Request<'_> {
    /// The day (`YYYYMMDD`) of `amz_date`: what the signing key is derived for.
    pub fn day(&self) -> &str {
        self.amz_date.get(..8).unwrap_or(self.amz_date)
    }
}

/// The SigV4 header lines (`x-amz-date`, `x-amz-security-token`, `authorization`, each ending
/// in CRLF) for `r`.
pub fn sign(creds: &Credentials, r: &Request) -> Vec<u8> {
    sign_with(&signing_key(creds, r.day(), r.region, r.service), creds, r)
}

/// The signing key of one day (`YYYYMMDD`), region and service: the four-HMAC chain from the
/// secret, which changes only when one of those does (`Signer` keeps it for the day).
pub fn signing_key(creds: &Credentials, date: &str, region: &str, service: &str) -> hmac::Key {
    let k = hmac(
        format!("AWS4{}", creds.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    let k = hmac(k.as_ref(), region.as_bytes());
    let k = hmac(k.as_ref(), service.as_bytes());
    let k = hmac(k.as_ref(), b"aws4_request");
    hmac::Key::new(hmac::HMAC_SHA256, k.as_ref())
}

/// As [`sign`], with `key` = [`signing_key`] of `creds` for `r`'s day, region and service
/// (the caller keeps that true).
pub fn sign_with(key: &hmac::Key, creds: &Credentials, r: &Request) -> Vec<u8> {
    let Request {
        region,
        service,
        host,
        target,
        body,
        amz_date,
    } = *r;
    let date = r.day();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut cr = String::with_capacity(256 + path.len());
    cr.push_str("POST\n");
    canonical_uri(path, &mut cr);
    cr.push('\n');
    canonical_query(query, &mut cr);
    cr.push('\n');
    cr.push_str("host:");
    cr.push_str(host.trim());
    cr.push_str("\nx-amz-date:");
    cr.push_str(amz_date);
    cr.push('\n');
    let signed = match &creds.session_token {
        Some(t) => {
            cr.push_str("x-amz-security-token:");
            cr.push_str(t.trim());
            cr.push('\n');
            "host;x-amz-date;x-amz-security-token"
        }
        None => "host;x-amz-date",
    };
    cr.push('\n');
    cr.push_str(signed);
    cr.push('\n');
    cr.push_str(&sha256_hex(body));
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let sts = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(cr.as_bytes())
    );
    let sig = hmac::sign(key, sts.as_bytes());
    let mut out = String::with_capacity(320);
    out.push_str("x-amz-date: ");
    out.push_str(amz_date);
    out.push_str("\r\n");
    if let Some(t) = &creds.session_token {
        out.push_str("x-amz-security-token: ");
        out.push_str(t);
        out.push_str("\r\n");
    }
    out.push_str("authorization: AWS4-HMAC-SHA256 Credential=");
    out.push_str(&creds.access_key_id);
    out.push('/');
    out.push_str(&scope);
    out.push_str(", SignedHeaders=");
    out.push_str(signed);
    out.push_str(", Signature=");
    hex(sig.as_ref(), &mut out);
    out.push_str("\r\n");
    out.into_bytes()
}

/// `YYYYMMDDTHHMMSSZ` for Unix seconds `t` (UTC).
pub fn amz_date(t: u64) -> String {
    let (y, mo, d) = crate::util::date::civil_from_days((t / 86_400) as i64);
    let s = t % 86_400;
    format!(
        "{y:04}{mo:02}{d:02}T{:02}{:02}{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(token: Option<&str>) -> Credentials {
        Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: token.map(String::from),
            expires: None,
        }
    }

    /// The AWS SigV4 test suite's `post-vanilla` case (host, x-amz-date; empty body).
    #[test]
    fn aws_suite_post_vanilla() {
        let h = sign(
            &creds(None),
            &Request {
                region: "us-east-1",
                service: "service",
                host: "example.amazonaws.com",
                target: "/",
                body: b"",
                amz_date: "20150830T123600Z",
            },
        );
        let h = String::from_utf8(h).unwrap();
        assert!(
            h.ends_with(
                "Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b\r\n"
            ),
            "{h}"
        );
        assert!(h.contains("Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date,"));
    }

    #[test]
    fn path_is_encoded_again_and_token_signed() {
        let mut u = String::new();
        canonical_uri("/model/a.b-v2%3A0/converse", &mut u);
        assert_eq!(u, "/model/a.b-v2%253A0/converse");
        let h = String::from_utf8(sign(
            &creds(Some("tok")),
            &Request {
                region: "r",
                service: "bedrock",
                host: "h",
                target: "/x",
                body: b"{}",
                amz_date: "20260101T000000Z",
            },
        ))
        .unwrap();
        assert!(h.contains("x-amz-security-token: tok\r\n"));
        assert!(h.contains("SignedHeaders=host;x-amz-date;x-amz-security-token,"));
        assert_eq!(amz_date(1_767_225_600), "20260101T000000Z");
        assert!(!format!("{:?}", creds(Some("tok"))).contains("wJalr"));
    }
}
