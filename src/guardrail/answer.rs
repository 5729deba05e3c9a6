//! The response phase of a non-stream answer, in the client's dialect: Chat `choices[].message`
//! (content, reasoning, tool-call arguments), Responses `output[]` (message text, reasoning,
//! function-call arguments, `output_text`), Messages `content[]` (text, thinking, tool-use
//! input), Gemini `candidates[].content.parts` (text, function-call args). `block` → the same
//! 400 `guardrail_blocked` a request gets; `mask` → the answer re-serialized with masked text
//! (usage and every other field unchanged).
//!
//! Owns: `guard_answer`. Must not: change anything but text values.

use serde_json::Value;

use super::request::{guard_body, Walk};
use super::{Blocked, Phase, Session};
use crate::dialect::Dialect;
use crate::error::Error;

/// Check (and mask) a whole answer `body` in `dialect`. `Ok(None)`: relay it as it is.
pub fn guard_answer(
    sess: &Session,
    dialect: Dialect,
    body: &[u8],
) -> Result<Option<Vec<u8>>, Error> {
    guard_body(sess, Phase::Response, dialect, body, walk_answer)
}

/// The answer object's text values (also the `response` object of Responses stream events).
pub(super) fn walk_answer(
    w: &mut Walk<'_>,
    dialect: Dialect,
    v: &mut Value,
) -> Result<(), Blocked> {
    let Some(o) = v.as_object_mut() else {
        return Ok(());
    };
    match dialect {
        Dialect::Chat => {
            if let Some(Value::Array(cs)) = o.get_mut("choices") {
                for c in cs {
                    if let Some(m) = c.get_mut("message") {
                        w.chat_message(m)?;
                    }
                }
            }
        }
        Dialect::Responses => {
            w.text(o.get_mut("output_text"))?;
            if let Some(Value::Array(items)) = o.get_mut("output") {
                items.iter_mut().try_for_each(|i| w.part(i))?;
            }
        }
        Dialect::Messages => {
            if let Some(Value::Array(blocks)) = o.get_mut("content") {
                blocks.iter_mut().try_for_each(|b| w.part(b))?;
            }
        }
        Dialect::Gemini => {
            if let Some(Value::Array(cs)) = o.get_mut("candidates") {
                for c in cs {
                    w.gemini_content(c.get_mut("content"))?;
                }
            }
        }
    }
    Ok(())
}
