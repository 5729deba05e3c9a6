//! The request phase: the text a client sends, per dialect — Chat `messages` (content strings
//! and text parts, tool results, assistant tool-call arguments), Responses `instructions` and
//! `input` (strings, message parts, function call outputs and arguments), Messages `system`
//! and `messages` (text blocks, tool results, tool-use input), Gemini `systemInstruction` and
//! `contents` (text parts, function calls and responses) — checked before anything goes
//! upstream. `block` → 400 `guardrail_blocked` in the client's dialect; `mask` → the body sent
//! upstream carries the masked text.
//!
//! Owns: `guard_request`, the `Walk` over JSON values the answer phase shares. Must not:
//! change anything but text values (structure, keys, numbers and order stay).

use std::rc::Rc;

use serde_json::Value;

use super::{chain::mask_text, json_str::mask_json_text, Blocked, Guard, Phase, Session};
use crate::dialect::Dialect;
use crate::error::{Error, Kind};

/// A whole-text masker: `chain::mask_text` or `json_str::mask_json_text`.
type Mask = fn(&[Rc<Guard>], &Session, Phase, &str) -> Result<Option<String>, Blocked>;

/// A walk over one JSON document's text values under a phase's guardrails.
pub(super) struct Walk<'a> {
    pub guards: &'a [Rc<Guard>],
    pub sess: &'a Session,
    pub phase: Phase,
    pub changed: bool,
}

impl<'a> Walk<'a> {
    /// A walk under `guards` (`sess`'s of `phase`), nothing changed yet.
    pub fn new(guards: &'a [Rc<Guard>], sess: &'a Session, phase: Phase) -> Walk<'a> {
        Walk {
            guards,
            sess,
            phase,
            changed: false,
        }
    }

    /// A walk of an answer under `sess`'s response guardrails.
    pub fn response(sess: &'a Session) -> Walk<'a> {
        Walk::new(&sess.response, sess, Phase::Response)
    }

    /// A text value.
    pub fn text(&mut self, v: Option<&mut Value>) -> Result<(), Blocked> {
        self.masked(v, mask_text)
    }

    /// A string holding a JSON text (tool-call arguments): masked inside its string values.
    pub fn json_text(&mut self, v: Option<&mut Value>) -> Result<(), Blocked> {
        self.masked(v, mask_json_text)
    }

    /// A string value replaced by what `mask` makes of it (when it changes anything).
    fn masked(&mut self, v: Option<&mut Value>, mask: Mask) -> Result<(), Blocked> {
        if let Some(Value::String(s)) = v {
            if let Some(m) = mask(self.guards, self.sess, self.phase, s)? {
                *s = m;
                self.changed = true;
            }
        }
        Ok(())
    }

    /// Every string value inside `v` (tool inputs and results given as JSON values).
    pub fn deep(&mut self, v: Option<&mut Value>) -> Result<(), Blocked> {
        match v {
            Some(s @ Value::String(_)) => self.text(Some(s)),
            Some(Value::Array(a)) => a.iter_mut().try_for_each(|x| self.deep(Some(x))),
            Some(Value::Object(o)) => o.values_mut().try_for_each(|x| self.deep(Some(x))),
            _ => Ok(()),
        }
    }

    /// A string, or an array of parts each with a `text` (or a nested `content`).
    pub fn content(&mut self, v: Option<&mut Value>) -> Result<(), Blocked> {
        match v {
            Some(s @ Value::String(_)) => self.text(Some(s)),
            Some(Value::Array(parts)) => parts.iter_mut().try_for_each(|p| self.part(p)),
            _ => Ok(()),
        }
    }

    /// One content part or block, of any dialect.
    pub fn part(&mut self, p: &mut Value) -> Result<(), Blocked> {
        let Some(o) = p.as_object_mut() else {
            return Ok(());
        };
        self.text(o.get_mut("text"))?;
        self.text(o.get_mut("thinking"))?;
        // Messages tool_result (content), Responses function_call_output (output)
        self.content(o.get_mut("content"))?;
        self.content(o.get_mut("output"))?;
        // Messages tool_use input; Responses / Chat call arguments
        self.deep(o.get_mut("input"))?;
        self.json_text(o.get_mut("arguments"))?;
        // Gemini parts
        if let Some(Value::Object(fc)) = o.get_mut("functionCall") {
            self.deep(fc.get_mut("args"))?;
        }
        if let Some(Value::Object(fr)) = o.get_mut("functionResponse") {
            self.deep(fr.get_mut("response"))?;
        }
        // Responses reasoning summaries
        if let Some(Value::Array(s)) = o.get_mut("summary") {
            s.iter_mut().try_for_each(|x| self.part(x))?;
        }
        Ok(())
    }

    /// A Chat message (request or answer): content, reasoning, tool-call arguments.
    pub fn chat_message(&mut self, m: &mut Value) -> Result<(), Blocked> {
        let Some(o) = m.as_object_mut() else {
            return Ok(());
        };
        self.content(o.get_mut("content"))?;
        self.text(o.get_mut("reasoning_content"))?;
        self.text(o.get_mut("reasoning"))?;
        if let Some(Value::Array(calls)) = o.get_mut("tool_calls") {
            for c in calls {
                if let Some(f) = c.get_mut("function") {
                    self.json_text(f.get_mut("arguments"))?;
                }
            }
        }
        Ok(())
    }

    /// Gemini `contents` entries or a `systemInstruction`: their parts.
    pub fn gemini_content(&mut self, c: Option<&mut Value>) -> Result<(), Blocked> {
        match c {
            Some(Value::Array(a)) => a.iter_mut().try_for_each(|x| self.gemini_content(Some(x))),
            Some(Value::Object(o)) => match o.get_mut("parts") {
                Some(Value::Array(parts)) => parts.iter_mut().try_for_each(|p| self.part(p)),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// Check (and mask) the text of a request `body` in `dialect` under the session's request
/// guardrails. `Ok(None)`: send it as it is; `Ok(Some(b))`: send `b` instead; `Err`: 400.
pub fn guard_request(
    sess: &Session,
    dialect: Dialect,
    body: &[u8],
) -> Result<Option<Vec<u8>>, Error> {
    // the body was parsed once already (routing fields): it is JSON within the depth bound
    guard_body(sess, Phase::Request, dialect, body, walk_request)
}

/// `body` (JSON; anything else passes as it is) walked by `walk` under the session's guardrails
/// of `phase`: `Ok(None)` when nothing changed, else the masked body; a block is the 400.
pub(super) fn guard_body(
    sess: &Session,
    phase: Phase,
    dialect: Dialect,
    body: &[u8],
    walk: fn(&mut Walk<'_>, Dialect, &mut Value) -> Result<(), Blocked>,
) -> Result<Option<Vec<u8>>, Error> {
    let guards = match phase {
        Phase::Request => &sess.request,
        Phase::Response => &sess.response,
    };
    if guards.is_empty() {
        return Ok(None);
    }
    let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    let mut w = Walk::new(guards, sess, phase);
    walk(&mut w, dialect, &mut v).map_err(|b| b.error())?;
    if !w.changed {
        return Ok(None);
    }
    serde_json::to_vec(&v)
        .map(Some)
        .map_err(|e| Error::new(Kind::Internal, format!("guardrail: {e}")))
}

fn walk_request(w: &mut Walk<'_>, dialect: Dialect, v: &mut Value) -> Result<(), Blocked> {
    let Some(o) = v.as_object_mut() else {
        return Ok(());
    };
    match dialect {
        Dialect::Chat => {
            if let Some(Value::Array(ms)) = o.get_mut("messages") {
                ms.iter_mut().try_for_each(|m| w.chat_message(m))?;
            }
        }
        Dialect::Responses => {
            w.text(o.get_mut("instructions"))?;
            match o.get_mut("input") {
                Some(s @ Value::String(_)) => w.text(Some(s))?,
                Some(Value::Array(items)) => items.iter_mut().try_for_each(|i| w.part(i))?,
                _ => {}
            }
        }
        Dialect::Messages => {
            w.content(o.get_mut("system"))?;
            if let Some(Value::Array(ms)) = o.get_mut("messages") {
                for m in ms {
                    w.content(m.get_mut("content"))?;
                }
            }
        }
        Dialect::Gemini => {
            w.gemini_content(o.get_mut("systemInstruction"))?;
            w.gemini_content(o.get_mut("system_instruction"))?;
            w.gemini_content(o.get_mut("contents"))?;
        }
    }
    Ok(())
}
