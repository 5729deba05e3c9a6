//! Structured output and tool-choice variants across dialects.
//!
//! Structured output (hub: Chat `response_format`; Responses `text.format` and Anthropic
//! `output_format` map onto it on the way in):
//! * to Anthropic: a forced tool. The hub's `json_schema` becomes the input schema of one extra
//!   tool named [`JSON_TOOL`] (`json_object`: any object), and `tool_choice` forces it — or,
//!   when the client offered tools of its own (and did not say `none`), `any`, so the model
//!   picks one of those or the answer tool. The answer's `tool_use` of [`JSON_TOOL`] comes back
//!   as the message's text content (its input, as JSON), finish `stop`; streamed, its
//!   `input_json_delta` fragments are the text deltas. A schema whose top level is not an
//!   object cannot be a tool input: 400. A client tool named [`JSON_TOOL`]: 400. Thinking is
//!   not combined with a forced tool (Anthropic refuses it): structured output wins, thinking is
//!   dropped for that request.
//! * to Gemini: `responseMimeType: application/json` + `responseSchema` (`gemini.rs`).
//! * to Responses: `text.format` (`responses.rs`).
//!
//! Tool choice: `auto` / `none` / `required` (Anthropic `any`, Gemini `ANY`) / a named tool
//! (Anthropic `tool`, Gemini `ANY` + `allowedFunctionNames`) / parallel calls off (Anthropic
//! `disable_parallel_tool_use`, Responses `parallel_tool_calls`; Gemini has none: dropped).
//! Chat's `allowed_tools` (Responses: `{"type":"allowed_tools",…}`) goes to dialects without
//! it as the filtered tool list with mode `auto` / `required` ([`narrow_allowed_tools`]).
//!
//! Must not: perform IO, or allocate beyond the values it returns.

use super::cache;
use super::util::{arr, s, Obj};
use super::TranslateError;
use serde_json::{json, Value};

/// The name of the answer tool that carries structured output to Anthropic.
pub const JSON_TOOL: &str = "ringgate_structured_output";

/// The Anthropic answer tool and `tool_choice` for a hub request's `response_format`
/// (`None`: free text). `client_tools`: whether the client offered tools of its own.
pub(crate) fn anthropic_answer_tool(
    chat: &Value,
    client_tools: bool,
) -> Result<Option<(Value, Value)>, TranslateError> {
    let Some(rf) = chat.get("response_format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let (schema, what) = match s(rf, "type") {
        Some("text") => return Ok(None),
        Some("json_object") => (json!({"type": "object"}), String::from("a JSON object.")),
        Some("json_schema") => {
            let js = rf.get("json_schema").unwrap_or(&Value::Null);
            let schema = js
                .get("schema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            if let Some(t) = schema.get("type").filter(|t| *t != "object") {
                return Err(TranslateError::new(format!(
                    "response_format json_schema with a top-level type {t} cannot be mapped to \
                     an Anthropic provider (structured output travels as a tool input, which \
                     must be an object)"
                )));
            }
            let mut what = format!(
                "JSON matching the schema `{}`.",
                s(js, "name").unwrap_or("output")
            );
            if let Some(d) = s(js, "description") {
                what.push(' ');
                what.push_str(d);
            }
            (schema, what)
        }
        other => {
            return Err(TranslateError::new(format!(
                "response_format type {:?} cannot be mapped to an Anthropic provider",
                other.unwrap_or("<missing>")
            )))
        }
    };
    let tool = json!({
        "name": JSON_TOOL,
        "description": format!(
            "Give the final answer by calling this tool; its input is the answer: {what}"
        ),
        "input_schema": schema,
    });
    let none = chat.get("tool_choice").and_then(Value::as_str) == Some("none");
    let choice = if client_tools && !none {
        json!({"type": "any"})
    } else {
        json!({"type": "tool", "name": JSON_TOOL})
    };
    Ok(Some((tool, choice)))
}

/// Reject a client tool named like the answer tool (its calls would come back as text).
pub(crate) fn check_tool_name(name: Option<&str>) -> Result<(), TranslateError> {
    if name == Some(JSON_TOOL) {
        return Err(TranslateError::new(format!(
            "tool name `{JSON_TOOL}` is reserved by the gateway on translated routes"
        )));
    }
    Ok(())
}

/// Anthropic `output_format` (structured outputs) → hub `response_format`.
pub(crate) fn output_format_to_hub(of: &Value) -> Option<Value> {
    match s(of, "type") {
        Some("json_schema") => Some(json!({"type": "json_schema", "json_schema": {
            "name": "output",
            "schema": of.get("schema").cloned().unwrap_or_else(|| json!({"type": "object"})),
        }})),
        _ => None,
    }
}

/// For a target without `allowed_tools` (Anthropic, Gemini): a hub whose `tool_choice` is
/// Chat's `{"type":"allowed_tools","allowed_tools":{"mode","tools"}}` becomes the tools list
/// filtered to the allowed ones with `tool_choice` `auto` / `required`. Other hubs unchanged.
pub(crate) fn narrow_allowed_tools(chat: &Value) -> Option<Value> {
    let tc = chat.get("tool_choice")?;
    if s(tc, "type") != Some("allowed_tools") {
        return None;
    }
    let at = tc.get("allowed_tools").unwrap_or(tc);
    let allowed: Vec<&str> = arr(at, "tools")
        .iter()
        .filter_map(|t| {
            t.get("function")
                .and_then(|f| s(f, "name"))
                .or_else(|| s(t, "name"))
        })
        .collect();
    let mode = match s(at, "mode") {
        Some("required") => "required",
        _ => "auto",
    };
    let mut out: Obj = chat.as_object()?.clone();
    let tools: Vec<Value> = arr(chat, "tools")
        .iter()
        .filter(|t| {
            let name = t.get("function").and_then(|f| s(f, "name"));
            name.is_some_and(|n| allowed.contains(&n))
        })
        .cloned()
        .collect();
    out.insert("tools".into(), Value::Array(tools));
    out.insert("tool_choice".into(), mode.into());
    Some(Value::Object(out))
}

/// Chat tool → Anthropic tool (name, description, input schema, cache marker).
pub(crate) fn anthropic_tool(t: &Value) -> Option<Value> {
    let f = t.get("function")?;
    let mut out = Obj::new();
    super::util::copy(f, "name", &mut out, "name");
    super::util::copy(f, "description", &mut out, "description");
    let schema = f
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    out.insert("input_schema".into(), schema);
    cache::copy(t, &mut out);
    Some(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_tool_forced_or_any() {
        let hub = json!({"response_format": {"type": "json_schema", "json_schema": {
            "name": "person", "schema": {"type": "object", "properties": {"n": {"type": "string"}}}}}});
        let (tool, choice) = anthropic_answer_tool(&hub, false).unwrap().unwrap();
        assert_eq!(tool["name"], JSON_TOOL);
        assert_eq!(tool["input_schema"]["properties"]["n"]["type"], "string");
        assert_eq!(choice, json!({"type": "tool", "name": JSON_TOOL}));
        let (_, choice) = anthropic_answer_tool(&hub, true).unwrap().unwrap();
        assert_eq!(choice, json!({"type": "any"}));
        let obj = json!({"response_format": {"type": "json_object"}});
        let (tool, _) = anthropic_answer_tool(&obj, false).unwrap().unwrap();
        assert_eq!(tool["input_schema"], json!({"type": "object"}));
        assert!(
            anthropic_answer_tool(&json!({"response_format": {"type": "text"}}), false)
                .unwrap()
                .is_none()
        );
        let arr_schema = json!({"response_format": {"type": "json_schema", "json_schema": {
            "name": "l", "schema": {"type": "array"}}}});
        assert!(anthropic_answer_tool(&arr_schema, false).is_err());
        assert!(check_tool_name(Some(JSON_TOOL)).is_err());
    }

    #[test]
    fn allowed_tools_narrowed() {
        let hub = json!({"tools": [
            {"type": "function", "function": {"name": "a"}},
            {"type": "function", "function": {"name": "b"}}],
            "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required",
                "tools": [{"type": "function", "function": {"name": "b"}}]}}});
        let n = narrow_allowed_tools(&hub).unwrap();
        assert_eq!(n["tools"].as_array().unwrap().len(), 1);
        assert_eq!(n["tools"][0]["function"]["name"], "b");
        assert_eq!(n["tool_choice"], "required");
        assert!(narrow_allowed_tools(&json!({"tool_choice": "auto"})).is_none());
    }
}
