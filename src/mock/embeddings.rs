//! The mock's OpenAI Embeddings dialect (`POST /v1/embeddings`): one deterministic 64-dimension
//! float vector per input (a string, an array of strings, a token array, or an array of token
//! arrays) that approximates meaning well enough to test a semantic cache: a bag of normalised
//! words (filler dropped, plurals folded) where numbers and negations weigh three times a word,
//! so a paraphrase scores ≥ 0.95 by cosine and a prompt differing only in a number or a "not"
//! scores far below (see `vector`). With `encoding_format: "base64"` (what
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
pub const DIMS: usize = 64;

/// Weight of a number or a negation against an ordinary word's 1.0: prompts that differ only
/// in a number or a "not" must not look alike.
pub const HEAVY: f64 = 3.0;

/// Words that carry no meaning of their own for the mock (politeness, question framing,
/// articles, auxiliaries): "What is the capital of France?" and "Please tell me the capital of
/// France" have the same features.
const FILLER: &[&str] = &[
    "a", "about", "am", "an", "and", "are", "at", "be", "been", "briefly", "by", "can", "could",
    "did", "do", "does", "for", "give", "hello", "hey", "hi", "i", "in", "into", "is", "it", "its",
    "just", "kindly", "know", "let", "me", "my", "of", "on", "or", "please", "quick", "quickly",
    "say", "so", "tell", "that", "the", "there", "this", "to", "us", "want", "was", "were", "what",
    "whats", "which", "will", "would", "you", "your",
];

const NEGATIONS: &[&str] = &[
    "not", "no", "never", "none", "nothing", "neither", "nor", "without",
];

const NUMBER_WORDS: &[&str] = &[
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
];

/// The features of a text with their weights: content words (lowercased, a plural `s` or
/// `ies` and a possessive `'s` taken off) weigh 1; numbers (digits, or number words as digits)
/// and negations (`not`, `no`, `never`, `n't`, ...) weigh [`HEAVY`]; filler words are dropped.
pub fn features(text: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    let mut add = |f: String, w: f64| match out.iter_mut().find(|(g, _)| *g == f) {
        Some((_, x)) => *x += w,
        None => out.push((f, w)),
    };
    let lower = text.to_lowercase().replace('\u{2019}', "'");
    for raw in lower.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '.')) {
        let mut w = raw.trim_matches(|c| c == '\'' || c == '.').to_string();
        if w.is_empty() {
            continue;
        }
        if w.chars().any(|c| c.is_ascii_digit()) {
            add(format!("#{}", w.trim_end_matches('.')), HEAVY);
            continue;
        }
        w.retain(|c| c != '.');
        if let Some(stem) = w.strip_suffix("n't") {
            add("not".into(), HEAVY);
            w = stem.to_string();
        } else if w == "cannot" {
            add("not".into(), HEAVY);
            continue;
        }
        if let Some(stem) = w.strip_suffix("'s") {
            w = stem.to_string();
        }
        w.retain(|c| c != '\'');
        if NEGATIONS.contains(&w.as_str()) {
            add("not".into(), HEAVY);
            continue;
        }
        if let Some(n) = NUMBER_WORDS.iter().position(|n| *n == w) {
            add(format!("#{n}"), HEAVY);
            continue;
        }
        if w.is_empty() || FILLER.contains(&w.as_str()) {
            continue;
        }
        if let Some(stem) = w.strip_suffix("ies").filter(|s| s.len() > 2) {
            w = format!("{stem}y");
        } else if w.len() > 3 && w.ends_with('s') && !w.ends_with("ss") {
            w.pop();
        }
        add(w, 1.0);
    }
    out
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in s.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The deterministic, meaning-approximating vector for one input (its compact JSON text):
/// the text's [`features`] hashed into [`DIMS`] signed components (bag of normalised words),
/// scaled to unit length and rounded to 6 decimals. Paraphrases that keep the content words
/// score near 1 by cosine; a different number or an added negation moves the vector far
/// (both weigh [`HEAVY`]). A text without features (or a token array) gets a vector hashed
/// from the whole input.
pub fn vector(input: &str) -> [f64; DIMS] {
    let text = serde_json::from_str::<String>(input).unwrap_or_else(|_| input.to_string());
    let mut v = [0.0; DIMS];
    let f = features(&text);
    if f.is_empty() {
        let h = fnv(input);
        v[(h % DIMS as u64) as usize] = 1.0;
        return v;
    }
    for (name, w) in &f {
        let h = fnv(name);
        let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
        v[(h % DIMS as u64) as usize] += sign * w;
    }
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x = (*x / norm * 1e6).round() / 1e6;
        }
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
        Err(msg) => error::write(s, super::Dialect::Chat, 400, &msg, keep_alive).await,
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

    fn cosine(a: &str, b: &str) -> f64 {
        let (x, y) = (vector(&format!("{a:?}")), vector(&format!("{b:?}")));
        x.iter().zip(&y).map(|(p, q)| p * q).sum()
    }

    #[test]
    fn paraphrases_score_high_numbers_and_negations_low() {
        let base = "What is the capital of France?";
        for p in [
            "Please tell me the capital of France.",
            "what's the capital of france",
            "Capital of France?",
        ] {
            assert!(cosine(base, p) >= 0.95, "{p}: {}", cosine(base, p));
        }
        let n = cosine("List 3 facts about the Moon", "List 5 facts about the Moon");
        assert!(n < 0.8, "number: {n}");
        let n = cosine(
            "Is Paris the capital of France?",
            "Is Paris not the capital of France?",
        );
        assert!(n < 0.8, "not: {n}");
        let n = cosine(
            "Paris is the capital of France",
            "Paris isn't the capital of France",
        );
        assert!(n < 0.8, "n't: {n}");
        assert!(cosine("capital of France", "recipe for pancakes") < 0.5);
        assert_eq!(
            features("two dogs"),
            vec![("#2".into(), HEAVY), ("dog".into(), 1.0)]
        );
    }
}
