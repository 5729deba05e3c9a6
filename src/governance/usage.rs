//! Token usage read from an answer as it is relayed, without parsing it: the byte stream is
//! scanned (SIMD `memmem`) for the keys `"prompt_tokens"`, `"completion_tokens"`,
//! `"total_tokens"` (OpenAI Chat, embeddings), `"input_tokens"`, `"output_tokens"` (Anthropic,
//! OpenAI Responses), `"cache_creation_input_tokens"`, `"cache_read_input_tokens"` (Anthropic:
//! not part of its `input_tokens`) — or, for Gemini answers, `"promptTokenCount"`,
//! `"candidatesTokenCount"`, `"thoughtsTokenCount"`, `"totalTokenCount"` — followed by `:` and a
//! number. A value is a count only when it is 1 to 20 plain digits worth at most `u64::MAX`
//! (read exactly); a sign, fraction, exponent, string, `null` or a larger number makes the key
//! absent (hostile numbers such as `-5`, `1.5` or `1e308` are not read as the digits they
//! start with), and sums saturate. The last value of each key wins, so streams work too (Anthropic's `message_delta`
//! carries the final output count; Gemini repeats `usageMetadata` with growing counts; OpenAI
//! streams carry a usage chunk when `stream_options.include_usage` was sent, which the gateway
//! asks for, see `plan`).
//!
//! Only real keys match: inside a JSON string a quote is always escaped (`\"`), so an opening
//! quote preceded by a backslash is skipped, and nested names such as `prompt_tokens_details`
//! or `cached_tokens` do not match (the name must start right after a quote and end with the
//! suffix and its quote). A key split across two relayed pieces is found in the seam (the last
//! 48 bytes of one piece + the first 48 of the next).
//!
//! Answers translated from another dialect do not go through the scan: the translator parsed
//! their usage and hands it over (`UsageScan::set`).
//!
//! A traced request's scan also reads the answer's id, finish reasons and (content capture on)
//! text in the same `feed` call (`observe::answer::Facts`, boxed: `None` costs one branch).
//!
//! Owns: `UsageScan`. Must not: allocate (but a traced request's `Facts`), copy more than the
//! seam, or change the bytes.

use crate::dialect::Dialect;
use crate::observe::answer::Facts;

/// Key names before `_tokens"` (OpenAI, Anthropic).
const NAMES: [&[u8]; 7] = [
    b"prompt",
    b"completion",
    b"total",
    b"input",
    b"output",
    b"cache_creation_input",
    b"cache_read_input",
];
/// Key names before `TokenCount"` (Gemini), in the same slots.
const GEMINI: [&[u8]; 4] = [b"prompt", b"candidates", b"total", b"thoughts"];
const PROMPT: usize = 0;
const COMPLETION: usize = 1;
const TOTAL: usize = 2;
const INPUT: usize = 3;
const OUTPUT: usize = 4;
const CACHE_CREATE: usize = 5;
const CACHE_READ: usize = 6;
/// Gemini's `thoughtsTokenCount` (billed as output) uses this slot.
const THOUGHTS: usize = 3;
/// Bytes kept from the end of a piece to find keys cut between pieces.
const SEAM: usize = 48;

#[derive(Debug, Clone)]
pub struct UsageScan {
    tail: [u8; SEAM],
    tail_len: usize,
    values: [Option<u64>; 7],
    gemini: bool,
    /// Set by `set` (a translated answer): wins over scanned values.
    given: Option<(u64, u64)>,
    /// What the answer says about itself, for its trace (`None`: not traced).
    facts: Option<Box<Facts>>,
}

impl Default for UsageScan {
    fn default() -> Self {
        UsageScan::new(Dialect::Chat)
    }
}

impl UsageScan {
    /// A scan of an answer in `dialect`.
    pub fn new(dialect: Dialect) -> UsageScan {
        UsageScan {
            tail: [0; SEAM],
            tail_len: 0,
            values: [None; 7],
            gemini: dialect == Dialect::Gemini,
            given: None,
            facts: None,
        }
    }

    /// Also read the answer's id, finish reasons and (`capture`: up to this many bytes of)
    /// text, for its trace.
    pub fn observe(&mut self, capture: Option<usize>) {
        self.facts = Some(Box::new(Facts::new(capture)));
    }

    /// An answer's head arrived, in `dialect` (as a stream or not): scan it afresh (a retried
    /// attempt's answer left nothing), its facts too when they are read.
    pub fn restart(&mut self, dialect: Dialect, stream: bool) {
        let mut facts = self.facts.take();
        if let Some(f) = facts.as_deref_mut() {
            f.restart(dialect, stream);
        }
        *self = UsageScan::new(dialect);
        self.facts = facts;
    }

    /// A piece of an answer whose usage is handed over (`set`, translated answers): only its
    /// facts are read, when they are.
    pub fn observe_piece(&mut self, piece: &[u8]) {
        if let Some(f) = self.facts.as_deref_mut() {
            f.feed(piece);
        }
    }

    /// The facts read (`None`: not traced).
    pub fn take_facts(&mut self) -> Option<Box<Facts>> {
        self.facts.take()
    }

    /// The usage of an answer that was parsed elsewhere (translated answers): `input` and
    /// `output` tokens.
    pub fn set(&mut self, input: u64, output: u64) {
        self.given = Some((input, output));
    }

    /// Look at the next piece of the answer body.
    pub fn feed(&mut self, piece: &[u8]) {
        if piece.is_empty() {
            return;
        }
        if let Some(f) = self.facts.as_deref_mut() {
            f.feed(piece);
        }
        if self.tail_len > 0 {
            let mut seam = [0u8; 2 * SEAM];
            let head = piece.len().min(SEAM);
            let t = self.tail_len;
            seam[..t].copy_from_slice(&self.tail[..t]);
            seam[t..t + head].copy_from_slice(&piece[..head]);
            self.scan(&seam[..t + head]);
        }
        self.scan(piece);
        // keep the last SEAM bytes of (tail + piece)
        if piece.len() >= SEAM {
            self.tail.copy_from_slice(&piece[piece.len() - SEAM..]);
            self.tail_len = SEAM;
        } else {
            let keep = (SEAM - piece.len()).min(self.tail_len);
            self.tail
                .copy_within(self.tail_len - keep..self.tail_len, 0);
            self.tail[keep..keep + piece.len()].copy_from_slice(piece);
            self.tail_len = keep + piece.len();
        }
    }

    fn scan(&mut self, b: &[u8]) {
        let (suffix, names): (&[u8], &[&[u8]]) = if self.gemini {
            (b"TokenCount\"", &GEMINI)
        } else {
            (b"_tokens\"", &NAMES)
        };
        for i in memchr::memmem::find_iter(b, suffix) {
            let before = &b[..i];
            let slot = names.iter().position(|n| {
                before.ends_with(n) && {
                    let q = i - n.len(); // just after the opening quote
                    q >= 1 && b[q - 1] == b'"' && (q < 2 || b[q - 2] != b'\\')
                }
            });
            let Some(slot) = slot else { continue };
            let mut j = i + suffix.len();
            let skip_ws = |j: &mut usize| {
                while b
                    .get(*j)
                    .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
                {
                    *j += 1;
                }
            };
            skip_ws(&mut j);
            if b.get(j) != Some(&b':') {
                continue;
            }
            j += 1;
            skip_ws(&mut j);
            let rest = b.get(j..).unwrap_or_default();
            // The number token: JSON number characters (a sign, fraction or exponent included,
            // so that `-5`, `1.5` or `1e308` is seen whole, not as the digits it starts with).
            let len = rest
                .iter()
                .take_while(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                .count();
            if rest.is_empty() {
                // The piece ends before the value: the seam scan (this piece's tail + the next
                // one's head) reads it.
                continue;
            }
            // Anything but a plain count (a sign, fraction, exponent, a string, null, a value
            // over u64::MAX) is not usage: the key is absent. A value cut at the piece's end
            // is read again, whole, by the seam scan.
            self.values[slot] = count(&rest[..len]);
        }
    }

    /// (cache-read, cache-creation) input tokens the answer reported (Anthropic's
    /// `cache_read_input_tokens` / `cache_creation_input_tokens`), each `None` when absent.
    pub fn cached(&self) -> (Option<u64>, Option<u64>) {
        (self.values[CACHE_READ], self.values[CACHE_CREATE])
    }

    /// (input, output) tokens the answer reported, `None` when it reported none. Input counts
    /// every prompt token (Anthropic's cache reads and writes included); output counts every
    /// generated token (Gemini's thoughts included). An answer with only a total (e.g.
    /// embeddings without `prompt_tokens`) reports it as input.
    pub fn io(&self) -> Option<(u64, u64)> {
        if let Some(g) = self.given {
            return Some(g);
        }
        let v = &self.values;
        if self.gemini {
            let output = match (v[COMPLETION], v[THOUGHTS]) {
                (None, None) => None,
                (c, t) => Some(c.unwrap_or(0).saturating_add(t.unwrap_or(0))),
            };
            return match (v[PROMPT], output, v[TOTAL]) {
                (None, None, None) => None,
                (None, None, Some(t)) => Some((t, 0)),
                (i, o, _) => Some((i.unwrap_or(0), o.unwrap_or(0))),
            };
        }
        let anthropic_input = v[INPUT].map(|i| {
            i.saturating_add(v[CACHE_CREATE].unwrap_or(0))
                .saturating_add(v[CACHE_READ].unwrap_or(0))
        });
        let input = v[PROMPT].or(anthropic_input);
        let output = v[COMPLETION].or(v[OUTPUT]);
        match (input, output, v[TOTAL]) {
            (None, None, None) => None,
            (None, None, Some(t)) => Some((t, 0)),
            (i, o, _) => Some((i.unwrap_or(0), o.unwrap_or(0))),
        }
    }

    /// Tokens the answer reported (input + output), `None`: no usage was seen.
    pub fn tokens(&self) -> Option<u64> {
        self.io().map(|(i, o)| i.saturating_add(o))
    }
}

/// A token count: 1 to 20 ASCII digits worth at most `u64::MAX`, exactly; anything else
/// (empty, a sign, a fraction or exponent, an overflow) is `None`.
fn count(token: &[u8]) -> Option<u64> {
    if token.is_empty() || token.len() > 20 {
        return None;
    }
    token.iter().try_fold(0u64, |acc, &d| {
        if !d.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_in(pieces: &[&[u8]]) -> Option<u64> {
        let mut s = UsageScan::default();
        for p in pieces {
            s.feed(p);
        }
        s.tokens()
    }

    #[test]
    fn each_dialect() {
        let chat = br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,"prompt_tokens_details":{"cached_tokens":3}}}"#;
        assert_eq!(scan_in(&[chat]), Some(17));
        let messages = br#"{"content":[],"usage":{"input_tokens":10,"cache_creation_input_tokens":99,"cache_read_input_tokens":1,"output_tokens":4}}"#;
        assert_eq!(scan_in(&[messages]), Some(114));
        let pretty =
            b"{\n  \"usage\": {\n    \"input_tokens\" : 7,\n    \"output_tokens\":\t2\n  }\n}";
        assert_eq!(scan_in(&[pretty]), Some(9));
        // an Anthropic stream: input in message_start, the final output count in message_delta
        let stream = b"event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"usage\":{\"output_tokens\":15}}\n\n";
        assert_eq!(scan_in(&[stream]), Some(35));
        assert_eq!(scan_in(&[b"{\"choices\":[]}"]), None);
    }

    fn io_in(dialect: Dialect, body: &[u8]) -> Option<(u64, u64)> {
        let mut s = UsageScan::new(dialect);
        for cut in body.chunks(7) {
            s.feed(cut);
        }
        s.io()
    }

    #[test]
    fn input_and_output_apart() {
        let chat = br#"{"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,"prompt_tokens_details":{"cached_tokens":3},"completion_tokens_details":{"reasoning_tokens":2}}}"#;
        assert_eq!(io_in(Dialect::Chat, chat), Some((12, 5)));
        let emb = br#"{"data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}"#;
        assert_eq!(io_in(Dialect::Chat, emb), Some((8, 0)));
        let responses = br#"{"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":12}}"#;
        assert_eq!(io_in(Dialect::Responses, responses), Some((9, 3)));
        let stream = b"event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"usage\":{\"output_tokens\":15}}\n\n";
        assert_eq!(io_in(Dialect::Messages, stream), Some((25, 15)));
        // Gemini repeats usageMetadata with growing counts: the last one wins
        let gemini = b"data: {\"usageMetadata\":{\"promptTokenCount\":7,\"candidatesTokenCount\":1,\"totalTokenCount\":8}}\n\ndata: {\"usageMetadata\":{\"promptTokenCount\":7,\"candidatesTokenCount\":4,\"thoughtsTokenCount\":2,\"totalTokenCount\":13,\"cachedContentTokenCount\":3}}\n\n";
        assert_eq!(io_in(Dialect::Gemini, gemini), Some((7, 6)));
        assert_eq!(io_in(Dialect::Chat, gemini), None);
        let mut s = UsageScan::new(Dialect::Chat);
        s.feed(chat);
        s.set(1, 2);
        assert_eq!(s.io(), Some((1, 2)));
    }

    #[test]
    fn strings_never_match() {
        let body = br#"{"content":"say \"total_tokens\":999 and \"input_tokens\": 5","n":{"my_total_tokens":4}}"#;
        assert_eq!(scan_in(&[body]), None);
    }

    #[test]
    fn keys_and_numbers_cut_between_pieces() {
        let body =
            br#"{"usage":{"prompt_tokens":1234,"completion_tokens":56789,"total_tokens":58023}}"#;
        for cut in 0..body.len() {
            assert_eq!(
                scan_in(&[&body[..cut], &body[cut..]]),
                Some(58023),
                "cut at {cut}"
            );
        }
        // byte by byte
        let pieces: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(scan_in(&pieces), Some(58023));
        let body = br#"{"usage":{"input_tokens":1234,"output_tokens":56789}}"#;
        for cut in 0..body.len() {
            assert_eq!(
                scan_in(&[&body[..cut], &body[cut..]]),
                Some(58023),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn hostile_numbers_are_absent_and_u64_max_is_exact() {
        let body =
            |v: &str| format!(r#"{{"usage":{{"prompt_tokens":{v},"completion_tokens":3}}}}"#);
        for bad in [
            "-5",
            "-0",
            "1e308",
            "1E3",
            "1.5",
            "1.0",
            "+7",
            "18446744073709551616",
            "99999999999999999999",
            "100000000000000000000",
            "\"5\"",
            "null",
        ] {
            let b = body(bad);
            for step in [1, 7, b.len()] {
                let mut s = UsageScan::default();
                for cut in b.as_bytes().chunks(step) {
                    s.feed(cut);
                }
                assert_eq!(s.io(), Some((0, 3)), "{bad} in pieces of {step}");
            }
        }
        for (good, want) in [
            ("18446744073709551615", u64::MAX),
            ("18446744073709551614", u64::MAX - 1),
            ("0", 0),
            ("10000000000000000000", 10_000_000_000_000_000_000),
        ] {
            let b = body(good);
            for step in [1, 7, b.len()] {
                let mut s = UsageScan::default();
                for cut in b.as_bytes().chunks(step) {
                    s.feed(cut);
                }
                assert_eq!(s.io(), Some((want, 3)), "{good} in pieces of {step}");
            }
        }
        // sums saturate
        let max = br#"{"usage":{"input_tokens":18446744073709551615,"cache_read_input_tokens":9,"output_tokens":18446744073709551615}}"#;
        assert_eq!(io_in(Dialect::Messages, max), Some((u64::MAX, u64::MAX)));
        assert_eq!(scan_in(&[max]), Some(u64::MAX));
        let gem = br#"{"usageMetadata":{"candidatesTokenCount":18446744073709551615,"thoughtsTokenCount":2}}"#;
        assert_eq!(io_in(Dialect::Gemini, gem), Some((0, u64::MAX)));
    }
}
