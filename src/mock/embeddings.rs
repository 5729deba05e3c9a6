//! The mock's OpenAI Embeddings dialect (`POST /v1/embeddings`): one deterministic 8-dimension
//! float vector per input (a string, an array of strings, a token array, or an array of token
//! arrays), derived from a hash of the input's JSON text.
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
    let tokens = (body.len() / 4).max(1);
    let mut out = Vec::with_capacity(64 + items.len() * 160);
    out.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"object\":\"embedding\",\"index\":");
        let _ = write!(out, "{i},\"embedding\":[");
        for (k, x) in vector(item).iter().enumerate() {
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
}
