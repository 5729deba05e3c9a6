//! JSON-schema adaptation between OpenAI-style tool/response schemas and
//! Gemini's OpenAPI-subset `Schema` objects.
//!
//! Must not: perform IO; it only rebuilds the schema values it is given.

use serde_json::Value;

/// Lowercase JSON-schema `type` values (Gemini uses `OBJECT`, `STRING`, …).
pub(crate) fn schema_to_json(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("type", Value::String(t)) => (k.clone(), Value::from(t.to_ascii_lowercase())),
                    _ => (k.clone(), schema_to_json(v)),
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(schema_to_json).collect()),
        other => other.clone(),
    }
}

/// Strip JSON-schema keys that Gemini's schema subset rejects.
pub(crate) fn schema_to_gemini(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "$schema" | "additionalProperties"))
                .map(|(k, v)| (k.clone(), schema_to_gemini(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(schema_to_gemini).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_types_lowercased_and_stripped() {
        let v = schema_to_json(&json!({"type": "OBJECT", "properties": {"a": {"type": "STRING"}}}));
        assert_eq!(v["properties"]["a"]["type"], "string");
        let g = schema_to_gemini(
            &json!({"type": "object", "additionalProperties": false, "$schema": "x"}),
        );
        assert_eq!(g, json!({"type": "object"}));
    }
}
