//! Deterministic output text: N "tokens" of about 4 bytes of English each, and the reasoning
//! an answer carries when the request asks for reasoning.
//!
//! Owns: the word lists. Must not: depend on time or randomness (tests assert exact content).

const WORDS: &[&str] = &[
    " the", " gate", " ring", " fast", " core", " byte", " path", " tail", " load", " mock",
    " lane", " wire", " time", " zero", " copy", " flow",
];

/// The reasoning of an answer to a request that asks for it (Chat `reasoning_effort`,
/// Anthropic `thinking`), as streamed pieces.
pub const REASONING: &[&str] = &["Thinking", " it", " over."];
/// The signature of the mock's Anthropic thinking block.
pub const SIGNATURE: &str = "mock-signature";

/// The whole reasoning text.
pub fn reasoning() -> String {
    REASONING.concat()
}

/// The `i`-th token.
pub fn token(i: u32) -> &'static str {
    WORDS[(i as usize) % WORDS.len()]
}

/// Tokens `from..to` concatenated.
pub fn tokens(from: u32, to: u32) -> String {
    let mut s = String::with_capacity(((to.saturating_sub(from)) * 5) as usize);
    for i in from..to {
        s.push_str(token(i));
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn deterministic() {
        assert_eq!(super::tokens(0, 3), " the gate ring");
        assert_eq!(super::tokens(0, 100).len(), super::tokens(0, 100).len());
    }
}
