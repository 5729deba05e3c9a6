//! Token usage read from an answer as it is relayed, without parsing it: the byte stream is
//! scanned (SIMD `memmem`) for the keys `"prompt_tokens"`, `"completion_tokens"`,
//! `"total_tokens"` (OpenAI Chat, embeddings), `"input_tokens"`, `"output_tokens"` (Anthropic,
//! OpenAI Responses) followed by `:` and a number. The last value of each key wins, so streams
//! work too (Anthropic's `message_delta` carries the final output count; OpenAI streams carry a
//! usage chunk when the client asked `stream_options.include_usage`).
//!
//! Only real keys match: inside a JSON string a quote is always escaped (`\"`), so an opening
//! quote preceded by a backslash is skipped, and nested names such as
//! `cache_creation_input_tokens` or `prompt_tokens_details` do not match (the name must start
//! right after a quote and end with `_tokens"`). A key split across two relayed pieces is found
//! in the seam (the last 48 bytes of one piece + the first 48 of the next).
//!
//! Owns: `UsageScan`. Must not: allocate, copy more than the seam, or change the bytes.

const NAMES: [&[u8]; 5] = [b"prompt", b"completion", b"total", b"input", b"output"];
const PROMPT: usize = 0;
const COMPLETION: usize = 1;
const TOTAL: usize = 2;
const INPUT: usize = 3;
const OUTPUT: usize = 4;
/// Bytes kept from the end of a piece to find keys cut between pieces.
const SEAM: usize = 48;

#[derive(Debug, Clone)]
pub struct UsageScan {
    tail: [u8; SEAM],
    tail_len: usize,
    values: [Option<u64>; 5],
}

impl Default for UsageScan {
    fn default() -> Self {
        UsageScan {
            tail: [0; SEAM],
            tail_len: 0,
            values: [None; 5],
        }
    }
}

impl UsageScan {
    /// Look at the next piece of the answer body.
    pub fn feed(&mut self, piece: &[u8]) {
        if piece.is_empty() {
            return;
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
        for i in memchr::memmem::find_iter(b, b"_tokens\"") {
            let before = &b[..i];
            let slot = NAMES.iter().position(|n| {
                before.ends_with(n) && {
                    let q = i - n.len(); // just after the opening quote
                    q >= 1 && b[q - 1] == b'"' && (q < 2 || b[q - 2] != b'\\')
                }
            });
            let Some(slot) = slot else { continue };
            let mut j = i + b"_tokens\"".len();
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
            let digits = b[j.min(b.len())..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .take(19)
                .fold(None, |acc: Option<u64>, &d| {
                    Some(acc.unwrap_or(0) * 10 + u64::from(d - b'0'))
                });
            if let Some(v) = digits {
                self.values[slot] = Some(v);
            }
        }
    }

    /// Tokens the answer reported: `total_tokens` when present, else prompt + completion
    /// (or input + output). `None`: no usage was seen.
    pub fn tokens(&self) -> Option<u64> {
        let v = &self.values;
        if let Some(t) = v[TOTAL] {
            return Some(t);
        }
        let input = v[PROMPT].or(v[INPUT]);
        let output = v[COMPLETION].or(v[OUTPUT]);
        match (input, output) {
            (None, None) => None,
            (i, o) => Some(i.unwrap_or(0) + o.unwrap_or(0)),
        }
    }
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
        let messages = br#"{"content":[],"usage":{"input_tokens":10,"cache_creation_input_tokens":99,"output_tokens":4}}"#;
        assert_eq!(scan_in(&[messages]), Some(14));
        let pretty =
            b"{\n  \"usage\": {\n    \"input_tokens\" : 7,\n    \"output_tokens\":\t2\n  }\n}";
        assert_eq!(scan_in(&[pretty]), Some(9));
        // an Anthropic stream: input in message_start, the final output count in message_delta
        let stream = b"event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"usage\":{\"output_tokens\":15}}\n\n";
        assert_eq!(scan_in(&[stream]), Some(35));
        assert_eq!(scan_in(&[b"{\"choices\":[]}"]), None);
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
}
