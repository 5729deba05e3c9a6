//! The mock's input token count: the prompt's text, not its JSON. Every dialect counts the
//! same text the same way — the bytes of the system text and of each turn's text (a string
//! `content`, or the `text` of its parts), divided by 4 and rounded up (at least 1) — so a
//! request translated from one dialect to another reports the same input tokens, and tests can
//! assert exact counts whatever framing, field order or splice the body went through. Tool
//! definitions, tool calls and tool results are not counted.
//!
//! Owns: `input_tokens`. Must not: build a document (lazy `sonic-rs` reads of the few fields).

use sonic_rs::JsonValueTrait;

use super::speaker::Speaker;

/// Input tokens of a request whose turns (the dialect's `Speaker::turns` field) and system
/// text (`Speaker::system`) are these raw JSON values; each turn's text is its
/// `Speaker::text` field, as is an object system text's (Gemini `systemInstruction.parts`).
pub fn input_tokens(speaker: &Speaker, turns: Option<&str>, system: Option<&str>) -> u32 {
    let mut bytes = 0usize;
    if let Some(s) = system {
        bytes += match field(s, speaker.text) {
            Some(parts) => content(&parts),
            None => content(s),
        };
    }
    if let Some(t) = turns {
        if speaker.string_turns && t.starts_with('"') {
            bytes += content(t);
        } else {
            for item in sonic_rs::to_array_iter(t).flatten() {
                bytes += field(item.as_raw_str(), speaker.text).map_or(0, |c| content(&c));
            }
        }
    }
    u32::try_from(bytes.div_ceil(4)).unwrap_or(u32::MAX).max(1)
}

/// `raw[key]`'s raw JSON, when `raw` is an object that has it.
fn field(raw: &str, key: &str) -> Option<String> {
    if !raw.starts_with('{') {
        return None;
    }
    sonic_rs::get(raw, [key])
        .ok()
        .map(|v| v.as_raw_str().to_string())
}

/// Text bytes of a content value: a string, or an array of parts with `text` strings.
fn content(raw: &str) -> usize {
    if raw.starts_with('"') {
        return sonic_rs::from_str::<String>(raw).map_or(0, |s| s.len());
    }
    sonic_rs::to_array_iter(raw)
        .flatten()
        .filter_map(|part| {
            let raw = part.as_raw_str();
            if !raw.starts_with('{') {
                return None;
            }
            let text = sonic_rs::get(raw, ["text"]).ok()?;
            text.as_str().map(str::len)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use crate::dialect::Dialect;

    fn input_tokens(d: Dialect, turns: Option<&str>, system: Option<&str>) -> u32 {
        super::input_tokens(crate::mock::speaker_of(d), turns, system)
    }

    #[test]
    fn the_same_text_counts_the_same_in_every_dialect() {
        // "be brief" (8) + "hello there" (11) + "hi" (2) = 21 bytes → 6 tokens
        let chat = r#"[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hello there"}]},{"role":"assistant","content":"hi"}]"#;
        assert_eq!(input_tokens(Dialect::Chat, Some(chat), None), 6);
        let messages = r#"[{"role":"user","content":"hello there"},{"role":"assistant","content":[{"type":"text","text":"hi"}]}]"#;
        assert_eq!(
            input_tokens(Dialect::Messages, Some(messages), Some(r#""be brief""#)),
            6
        );
        let input = r#"[{"role":"user","content":[{"type":"input_text","text":"hello there"}]},{"role":"assistant","content":"hi"}]"#;
        assert_eq!(
            input_tokens(Dialect::Responses, Some(input), Some(r#""be brief""#)),
            6
        );
        assert_eq!(
            input_tokens(Dialect::Responses, Some(r#""hello there\"hi""#), None),
            4 // 14 bytes unescaped
        );
        let contents = r#"[{"role":"user","parts":[{"text":"hello there"}]},{"role":"model","parts":[{"text":"hi"}]}]"#;
        let sys = r#"{"parts":[{"text":"be brief"}]}"#;
        assert_eq!(input_tokens(Dialect::Gemini, Some(contents), Some(sys)), 6);
        assert_eq!(input_tokens(Dialect::Chat, None, None), 1);
    }
}
