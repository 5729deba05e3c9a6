//! The service-account JWT assertion (RFC 7523 with Google's claims): header
//! `{"alg":"RS256","typ":"JWT","kid":…}`, claims `iss` (the key's `client_email`), `scope`,
//! `aud` (the token endpoint), `iat`, `exp` (`iat` + 1 h), signed RSASSA-PKCS1-v1_5 SHA-256
//! with the key's PKCS#8 private key (ring's `RsaKeyPair`).
//!
//! Owns: `assertion`, base64 (standard, for PEM; URL-safe unpadded, for JWT). Must not: log or
//! keep the key.

use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};

const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Unpadded URL-safe base64.
pub fn b64url(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..=c.len() {
            out.push(URL[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// Standard base64 decoding (whitespace skipped, padding optional).
pub fn b64decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for b in text.bytes() {
        if b.is_ascii_whitespace() || b == b'=' {
            continue;
        }
        let v = STD.iter().position(|&c| c == b)? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// The DER of a `-----BEGIN PRIVATE KEY-----` PEM.
fn pkcs8_der(pem: &str) -> Result<Vec<u8>, &'static str> {
    let body = pem
        .split("-----BEGIN PRIVATE KEY-----")
        .nth(1)
        .and_then(|r| r.split("-----END PRIVATE KEY-----").next())
        .ok_or("private_key is not a PKCS#8 PEM (BEGIN PRIVATE KEY)")?;
    b64decode(body).ok_or("private_key has bad base64")
}

/// A signed assertion for `iss` asking `scope` at `aud`, issued at `iat`.
pub fn assertion(
    pem: &str,
    kid: Option<&str>,
    iss: &str,
    scope: &str,
    aud: &str,
    iat: u64,
) -> Result<String, String> {
    let der = pkcs8_der(pem)?;
    let key = RsaKeyPair::from_pkcs8(&der).map_err(|e| format!("private_key: {e}"))?;
    let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
    if let Some(k) = kid {
        header["kid"] = k.into();
    }
    let claims = serde_json::json!({
        "iss": iss, "scope": scope, "aud": aud, "iat": iat, "exp": iat + 3600,
    });
    let mut msg = b64url(header.to_string().as_bytes());
    msg.push('.');
    msg.push_str(&b64url(claims.to_string().as_bytes()));
    let mut sig = vec![0u8; key.public().modulus_len()];
    key.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        msg.as_bytes(),
        &mut sig,
    )
    .map_err(|_| "RS256 signing failed".to_string())?;
    msg.push('.');
    msg.push_str(&b64url(&sig));
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_both_ways() {
        assert_eq!(b64url(b"f"), "Zg");
        assert_eq!(b64url(b"fo"), "Zm8");
        assert_eq!(b64url(b"foo"), "Zm9v");
        assert_eq!(b64url(&[0xfb, 0xff]), "-_8");
        assert_eq!(b64decode("Zm9vYg==").unwrap(), b"foob");
        assert_eq!(b64decode("Zm9v\nYmE=").unwrap(), b"fooba");
        assert!(b64decode("Zm9v*").is_none());
        assert!(assertion("nope", None, "a", "s", "u", 0).is_err());
    }
}
