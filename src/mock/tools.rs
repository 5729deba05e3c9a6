//! The mock's tool-call behaviour, shared by every dialect writer.
//!
//! Owns: the trigger rule (a non-empty tools list AND a last turn that is a user turn, not a tool
//! result), the canned answer ("Let me check." + one call of the first tool with `TOOL_ARGS`),
//! its ids, its usage, and the split of the arguments into stream fragments.
//! Must not: write any dialect's bytes or know its turn shapes (the dialect files do, in their
//! `Speaker`).

use super::speaker::Speaker;

/// The exact arguments of every mock tool call.
pub const TOOL_ARGS: &str = r#"{"location":"Paris, France","unit":"celsius"}"#;
/// The text that precedes the call.
pub const TOOL_TEXT: &str = "Let me check.";
/// Call id in OpenAI dialects (Chat `tool_calls[].id`, Responses `call_id`).
pub const CALL_ID: &str = "call_mock_1";
/// Anthropic `tool_use.id`.
pub const TOOLU_ID: &str = "toolu_mock_1";
/// Largest streamed argument fragment, in bytes (clients must reassemble).
pub const FRAGMENT_BYTES: usize = 7;
/// Output tokens reported for a tool-call answer: (text + arguments bytes) / 4, rounded up.
pub const OUTPUT_TOKENS: u32 = (TOOL_TEXT.len() + TOOL_ARGS.len()).div_ceil(4) as u32;

/// Number of argument fragments in a stream.
pub fn fragment_count() -> u32 {
    TOOL_ARGS.len().div_ceil(FRAGMENT_BYTES) as u32
}

/// The `i`-th argument fragment (`TOOL_ARGS` is ASCII, so byte splits are char boundaries).
pub fn fragment(i: u32) -> &'static str {
    let from = (i as usize) * FRAGMENT_BYTES;
    let to = (from + FRAGMENT_BYTES).min(TOOL_ARGS.len());
    TOOL_ARGS.get(from..to).unwrap_or("")
}

/// The tool to call, if the rule fires. `tools` is the raw JSON of the request's tools list,
/// `turns` the raw JSON of its turns (the dialect's `Speaker::turns` field: messages, Responses
/// `input`, Gemini `contents`).
pub fn decide(speaker: &Speaker, tools: &str, turns: Option<&str>) -> Option<String> {
    let name = first_tool_name(tools)?;
    last_is_user_turn(speaker, turns?).then_some(name)
}

/// The first named tool: `function.name` (Chat), `name` (Responses, Anthropic) or
/// `functionDeclarations[0].name` (Gemini).
fn first_tool_name(tools: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(tools).ok()?;
    v.as_array()?.iter().find_map(|t| {
        let decl = t
            .get("functionDeclarations")
            .or_else(|| t.get("function_declarations"))
            .and_then(|d| d.get(0));
        t.get("function")
            .and_then(|f| f.get("name"))
            .or_else(|| t.get("name"))
            .or_else(|| decl.and_then(|d| d.get("name")))
            .and_then(|n| n.as_str())
            .map(str::to_string)
    })
}

/// Whether the last of `turns` is a user's (the dialect's `Speaker::user_turn`); a string is
/// one user turn where the dialect allows it (`Speaker::string_turns`).
fn last_is_user_turn(speaker: &Speaker, turns: &str) -> bool {
    if turns.trim_start().starts_with('"') {
        return speaker.string_turns;
    }
    let mut last = None;
    for item in sonic_rs::to_array_iter(turns) {
        match item {
            Ok(v) => last = Some(v),
            Err(_) => return false,
        }
    }
    let Some(last) = last else { return false };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(last.as_raw_str()) else {
        return false;
    };
    (speaker.user_turn)(&v)
}

/// A turn's `role`.
pub fn role(turn: &serde_json::Value) -> Option<&str> {
    turn.get("role").and_then(|r| r.as_str())
}

/// Whether some element of the array `turn[key]` (a turn's parts) passes `is`.
pub fn has_part(
    turn: &serde_json::Value,
    key: &str,
    is: impl Fn(&serde_json::Value) -> bool,
) -> bool {
    turn.get(key)
        .and_then(|c| c.as_array())
        .is_some_and(|parts| parts.iter().any(is))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;

    fn decide(d: Dialect, tools: &str, turns: Option<&str>) -> Option<String> {
        super::decide(crate::mock::speaker_of(d), tools, turns)
    }

    #[test]
    fn fragments_reassemble() {
        let all: String = (0..fragment_count()).map(fragment).collect();
        assert_eq!(all, TOOL_ARGS);
        assert!((0..fragment_count()).all(|i| fragment(i).len() <= FRAGMENT_BYTES));
        assert_eq!(OUTPUT_TOKENS, 15);
    }

    #[test]
    fn trigger_rules() {
        let chat_tools =
            r#"[{"type":"function","function":{"name":"get_weather","parameters":{}}}]"#;
        let user = r#"[{"role":"system","content":"s"},{"role":"user","content":"hi"}]"#;
        let tool = r#"[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"c","content":"20C"}]"#;
        assert_eq!(
            decide(Dialect::Chat, chat_tools, Some(user)).as_deref(),
            Some("get_weather")
        );
        assert_eq!(decide(Dialect::Chat, chat_tools, Some(tool)), None);
        assert_eq!(decide(Dialect::Chat, "[]", Some(user)), None);
        let resp_tools = r#"[{"type":"web_search"},{"type":"function","name":"f"}]"#;
        assert_eq!(
            decide(Dialect::Responses, resp_tools, Some(r#""hi""#)).as_deref(),
            Some("f")
        );
        let out = r#"[{"role":"user","content":"x"},{"type":"function_call_output","call_id":"c","output":"1"}]"#;
        assert_eq!(decide(Dialect::Responses, resp_tools, Some(out)), None);
        let ant = r#"[{"name":"t","input_schema":{}}]"#;
        let res = r#"[{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":"1"}]}]"#;
        assert_eq!(
            decide(Dialect::Messages, ant, Some(user)).as_deref(),
            Some("t")
        );
        assert_eq!(decide(Dialect::Messages, ant, Some(res)), None);
        let gem = r#"[{"functionDeclarations":[{"name":"g"}]}]"#;
        let gu = r#"[{"role":"user","parts":[{"text":"hi"}]}]"#;
        let gr = r#"[{"role":"user","parts":[{"functionResponse":{"name":"g","response":{}}}]}]"#;
        assert_eq!(decide(Dialect::Gemini, gem, Some(gu)).as_deref(), Some("g"));
        assert_eq!(decide(Dialect::Gemini, gem, Some(gr)), None);
    }
}
