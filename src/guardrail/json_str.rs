//! Tool-call arguments: a JSON text, possibly streamed in pieces, masked only inside its string
//! values (and keys), so the result stays valid JSON. Each string's content is decoded
//! (escapes, surrogate pairs), run through the guardrails as one text (a match never spans two
//! strings), and re-escaped; everything outside strings passes unchanged.
//!
//! Owns: `JsonText`. Must not: validate or re-format the JSON (what is not a string is not
//! touched; an escape the decoder does not know becomes U+FFFD).

use std::rc::Rc;

use super::{Blocked, Chain, Guard, Phase, Session};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Outside,
    Inside,
    /// After a backslash inside a string.
    Escape,
    /// Inside `\uXXXX`: hex digits read so far and their value.
    Unicode(u8, u32),
}

/// The state of one JSON text being masked.
pub struct JsonText {
    state: State,
    /// A high surrogate waiting for its low half.
    high: Option<u32>,
    chain: Chain,
    /// Decoded string content not yet fed to the chain.
    text: String,
    released: String,
}

impl JsonText {
    pub fn new(guards: &[Rc<Guard>]) -> JsonText {
        JsonText {
            state: State::Outside,
            high: None,
            chain: Chain::new(guards),
            text: String::new(),
            released: String::new(),
        }
    }

    pub fn held(&self) -> usize {
        self.chain.held()
    }

    /// Feed `piece` of the JSON text; append what may go out to `out`. `last`: the text ends.
    pub fn feed(
        &mut self,
        guards: &[Rc<Guard>],
        sess: &Session,
        phase: Phase,
        piece: &str,
        last: bool,
        out: &mut String,
    ) -> Result<(), Blocked> {
        for c in piece.chars() {
            match self.state {
                State::Outside => {
                    out.push(c);
                    if c == '"' {
                        self.state = State::Inside;
                    }
                }
                State::Inside => match c {
                    '"' => {
                        self.flush_high();
                        self.push_text(guards, sess, phase, true, out)?;
                        out.push('"');
                        self.state = State::Outside;
                    }
                    '\\' => self.state = State::Escape,
                    c => {
                        self.flush_high();
                        self.text.push(c);
                    }
                },
                State::Escape => {
                    self.state = State::Inside;
                    let d = match c {
                        '"' => '"',
                        '\\' => '\\',
                        '/' => '/',
                        'b' => '\u{8}',
                        'f' => '\u{c}',
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        'u' => {
                            self.state = State::Unicode(0, 0);
                            continue;
                        }
                        _ => '\u{fffd}',
                    };
                    self.flush_high();
                    self.text.push(d);
                }
                State::Unicode(n, v) => {
                    let Some(h) = c.to_digit(16) else {
                        self.flush_high();
                        self.text.push('\u{fffd}');
                        self.state = State::Inside;
                        if c == '"' {
                            self.push_text(guards, sess, phase, true, out)?;
                            out.push('"');
                            self.state = State::Outside;
                        } else if c == '\\' {
                            self.state = State::Escape;
                        } else {
                            self.text.push(c);
                        }
                        continue;
                    };
                    let v = v * 16 + h;
                    if n < 3 {
                        self.state = State::Unicode(n + 1, v);
                        continue;
                    }
                    self.state = State::Inside;
                    match (self.high.take(), v) {
                        (None, 0xD800..=0xDBFF) => self.high = Some(v),
                        (Some(hi), 0xDC00..=0xDFFF) => {
                            let cp = 0x10000 + ((hi - 0xD800) << 10) + (v - 0xDC00);
                            self.text.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                        }
                        (hi, v) => {
                            if hi.is_some() {
                                self.text.push('\u{fffd}');
                            }
                            if (0xD800..=0xDBFF).contains(&v) {
                                self.high = Some(v);
                            } else {
                                self.text.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                            }
                        }
                    }
                }
            }
        }
        if matches!(
            self.state,
            State::Inside | State::Escape | State::Unicode(..)
        ) {
            self.push_text(guards, sess, phase, last, out)?;
        }
        Ok(())
    }

    fn flush_high(&mut self) {
        if self.high.take().is_some() {
            self.text.push('\u{fffd}');
        }
    }

    /// Run the decoded string content through the chain and append it, escaped, to `out`.
    fn push_text(
        &mut self,
        guards: &[Rc<Guard>],
        sess: &Session,
        phase: Phase,
        last: bool,
        out: &mut String,
    ) -> Result<(), Blocked> {
        if last {
            self.flush_high();
        }
        self.released.clear();
        let text = std::mem::take(&mut self.text);
        let r = self
            .chain
            .feed(guards, sess, phase, &text, last, &mut self.released);
        self.text = text;
        self.text.clear();
        r?;
        escape_into(&self.released, out);
        Ok(())
    }
}

/// `s` escaped as the inside of a JSON string.
pub fn escape_into(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = std::fmt::Write::write_fmt(out, format_args!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
}

/// One whole JSON text: `None` when nothing changed.
pub fn mask_json_text(
    guards: &[Rc<Guard>],
    sess: &Session,
    phase: Phase,
    text: &str,
) -> Result<Option<String>, Blocked> {
    if guards.is_empty() || !text.contains('"') {
        return Ok(None);
    }
    let mut out = String::with_capacity(text.len());
    JsonText::new(guards).feed(guards, sess, phase, text, true, &mut out)?;
    Ok((out != text).then_some(out))
}
