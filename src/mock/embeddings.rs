//! The mock's OpenAI Embeddings dialect (`POST /v1/embeddings`): one deterministic 8-dimension
//! float vector per input (a string, an array of strings, a token array, or an array of token
//! arrays), derived from a hash of the input's JSON text. With `encoding_format: "base64"` (what
//! openai-node and LangChain JS ask for by default) each vector is the base64 of its components
//! as little-endian `f32`s, as OpenAI sends it; `"float"` or no field: a JSON number array.
//!
//! Owns: the request reading and the exact response bytes. Must not: parse HTTP, pace streams
//! (embeddings never stream; the non-stream delay comes from `pace::json`).

use std::io::{self, Write};

use monoio::io::AsyncWriteRent;

use super::{error, pace, Profile};
use crate::error::push_json_str;

/// Vector length.
pub const DIMS: usize = 8;

/// The deterministic vector for one input (its compact JSON text), components in [-1, 1].
pub fn vector(input: &str) -> [f64; DIMS] {
    // FNV-1a seed, then splitmix64 per component.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in input.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut v = [0.0; DIMS];
    for x in &mut v {
        h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = h;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        *x = ((unit * 2.0 - 1.0) * 1e6).round() / 1e6;
    }
    v
}

/// The inputs of a request, each as compact JSON text.
fn inputs(v: &serde_json::Value) -> Option<Vec<String>> {
    match v {
        serde_json::Value::String(_) => Some(vec![v.to_string()]),
        serde_json::Value::Array(a) if a.is_empty() => None,
        serde_json::Value::Array(a) if a.iter().all(|x| x.is_number()) => Some(vec![v.to_string()]),
        serde_json::Value::Array(a) if a.iter().all(|x| x.is_string() || x.is_array()) => {
            Some(a.iter().map(|x| x.to_string()).collect())
        }
        _ => None,
    }
}

/// The response body, or a message for a 400.
pub fn embeddings_body(body: &[u8]) -> Result<Vec<u8>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let model = v
        .get("model")
        .and_then(|m| m.as_str())
        .ok_or("missing \"model\"")?;
    let items = v
        .get("input")
        .and_then(inputs)
        .ok_or("\"input\" must be a non-empty string, array of strings, or token array(s)")?;
    let base64 = match v.get("encoding_format") {
        None | Some(serde_json::Value::Null) => false,
        Some(f) if f == "float" => false,
        Some(f) if f == "base64" => true,
        Some(_) => return Err("\"encoding_format\" must be \"float\" or \"base64\"".into()),
    };
    let tokens = (body.len() / 4).max(1);
    let mut out = Vec::with_capacity(64 + items.len() * 160);
    out.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"object\":\"embedding\",\"index\":");
        let _ = write!(out, "{i},\"embedding\":");
        let v = vector(item);
        if base64 {
            out.push(b'"');
            push_base64(&mut out, &le_f32(&v));
            out.extend_from_slice(b"\"}");
            continue;
        }
        out.push(b'[');
        for (k, x) in v.iter().enumerate() {
            if k > 0 {
                out.push(b',');
            }
            let _ = write!(out, "{x}");
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b"],\"model\":");
    push_json_str(&mut out, model);
    let _ = write!(
        out,
        ",\"usage\":{{\"prompt_tokens\":{tokens},\"total_tokens\":{tokens}}}}}"
    );
    Ok(out)
}

/// The components as little-endian `f32` bytes (OpenAI's base64 embedding layout).
fn le_f32(v: &[f64; DIMS]) -> [u8; DIMS * 4] {
    let mut b = [0u8; DIMS * 4];
    for (chunk, x) in b.chunks_exact_mut(4).zip(v) {
        chunk.copy_from_slice(&(*x as f32).to_le_bytes());
    }
    b
}

/// Append standard base64 (RFC 4648, padded) of `bytes`.
fn push_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
}

/// Write a complete HTTP response (200 or an OpenAI-shaped 400).
pub async fn respond<S: AsyncWriteRent>(
    s: &mut S,
    body: &[u8],
    profile: Profile,
    keep_alive: bool,
) -> io::Result<()> {
    match embeddings_body(body) {
        Ok(b) => pace::json(s, 200, &b, profile, keep_alive).await,
        Err(msg) => error::write(s, error::Shape::OpenAi, 400, &msg, keep_alive).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_vectors() {
        let b = embeddings_body(br#"{"model":"e","input":["a","b"]}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 2);
        assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), DIMS);
        assert_eq!(vector("\"a\""), vector("\"a\""));
        assert_ne!(vector("\"a\""), vector("\"b\""));
        assert!(vector("x").iter().all(|x| (-1.0..=1.0).contains(x)));
        assert!(embeddings_body(br#"{"model":"e","input":[]}"#).is_err());
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let mut b = Vec::new();
        for (input, want) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
        ] {
            b.clear();
            push_base64(&mut b, input);
            assert_eq!(b, want.as_bytes());
        }
        let out =
            embeddings_body(br#"{"model":"e","input":"a","encoding_format":"base64"}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let s = v["data"][0]["embedding"].as_str().unwrap();
        assert_eq!(s.len(), (DIMS * 4).div_ceil(3) * 4);
        let mut want = Vec::new();
        push_base64(&mut want, &le_f32(&vector("\"a\"")));
        assert_eq!(s.as_bytes(), &want[..]);
        // The floats come back: decode by hand.
        let val = |c: u8| ALPHA.iter().position(|&a| a == c).unwrap() as u32;
        const ALPHA: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut raw = Vec::new();
        for q in s.as_bytes().chunks(4) {
            let n = q
                .iter()
                .take_while(|&&c| c != b'=')
                .enumerate()
                .fold(0u32, |n, (i, &c)| n | val(c) << (18 - 6 * i));
            let k = q.iter().filter(|&&c| c != b'=').count() - 1;
            raw.extend_from_slice(&n.to_be_bytes()[1..1 + k]);
        }
        let first = f32::from_le_bytes(raw[..4].try_into().unwrap());
        assert_eq!(first, vector("\"a\"")[0] as f32);
        let float =
            embeddings_body(br#"{"model":"e","input":"a","encoding_format":"float"}"#).unwrap();
        let float: serde_json::Value = serde_json::from_slice(&float).unwrap();
        assert_eq!(float["data"][0]["embedding"][0], vector("\"a\"")[0]);
        assert!(embeddings_body(br#"{"model":"e","input":"a","encoding_format":"hex"}"#).is_err());
    }
}
