//! JSON-schema adaptation between OpenAI-style tool/response schemas and
//! Gemini's OpenAPI-subset `Schema` objects.
//!
//! Must not: perform IO; it only rebuilds the schema values it is given.

use serde_json::Value;

/// Gemini `Schema` (OpenAPI subset, as the `google-genai` SDKs send it) → JSON Schema, for
/// OpenAI and Anthropic upstreams, which reject Gemini's spellings:
/// * `type` upper case (`OBJECT`, `STRING`, …) → lower case; `TYPE_UNSPECIFIED` → no `type`;
/// * `nullable: true` → `type: [<type>, "null"]` (or `"null"` added to a type list);
/// * `propertyOrdering` (Gemini-only) dropped;
/// * walked structurally: `properties` / `$defs` / `definitions` map names to schemas (a
///   property *named* `type` is left alone), `items`, `not`, `additionalProperties` and the
///   members of `anyOf` / `oneOf` / `allOf` / `prefixItems` are schemas; every other key
///   (`description`, `enum`, `required`, `format`, bounds, …) is copied as is.
///
/// A JSON Schema given as is (`parametersJsonSchema`, `responseJsonSchema`) passes through
/// unchanged apart from the same rules, which do not alter valid lower-case JSON Schema.
pub(crate) fn schema_to_json(v: &Value) -> Value {
    let Value::Object(m) = v else {
        return v.clone();
    };
    let nullable = m.get("nullable").and_then(Value::as_bool) == Some(true);
    let mut out = serde_json::Map::with_capacity(m.len());
    for (k, val) in m {
        let mapped = match (k.as_str(), val) {
            ("nullable" | "propertyOrdering", _) => continue,
            ("type", Value::String(t)) if t == "TYPE_UNSPECIFIED" => continue,
            ("type", Value::String(t)) => {
                let t = Value::from(t.to_ascii_lowercase());
                if nullable {
                    Value::Array(vec![t, Value::from("null")])
                } else {
                    t
                }
            }
            ("type", Value::Array(ts)) => {
                let mut ts: Vec<Value> = ts
                    .iter()
                    .map(|t| match t {
                        Value::String(s) => Value::from(s.to_ascii_lowercase()),
                        other => other.clone(),
                    })
                    .collect();
                if nullable && !ts.iter().any(|t| t == "null") {
                    ts.push(Value::from("null"));
                }
                Value::Array(ts)
            }
            ("properties" | "$defs" | "definitions", Value::Object(props)) => Value::Object(
                props
                    .iter()
                    .map(|(name, s)| (name.clone(), schema_to_json(s)))
                    .collect(),
            ),
            ("items" | "not" | "additionalProperties", s @ Value::Object(_)) => schema_to_json(s),
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(a)) => {
                Value::Array(a.iter().map(schema_to_json).collect())
            }
            _ => val.clone(),
        };
        out.insert(k.clone(), mapped);
    }
    Value::Object(out)
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
        // as the google-genai SDK sends a declaration
        let g = json!({"type": "OBJECT", "propertyOrdering": ["type", "tags"],
            "properties": {
                "type": {"type": "STRING", "enum": ["A", "B"], "format": "enum", "nullable": true},
                "tags": {"type": "ARRAY", "items": {"type": "STRING"}, "description": "OBJECT"},
                "any": {"anyOf": [{"type": "INTEGER"}, {"type": "NUMBER", "nullable": false}]},
                "free": {"type": "TYPE_UNSPECIFIED"}},
            "required": ["type"]});
        assert_eq!(
            schema_to_json(&g),
            json!({"type": "object",
                "properties": {
                    "type": {"type": ["string", "null"], "enum": ["A", "B"], "format": "enum"},
                    "tags": {"type": "array", "items": {"type": "string"}, "description": "OBJECT"},
                    "any": {"anyOf": [{"type": "integer"}, {"type": "number"}]},
                    "free": {}},
                "required": ["type"]})
        );
        // valid lower-case JSON Schema is left as it was
        let j = json!({"type": "object", "properties": {"x": {"type": ["string", "null"]}},
            "additionalProperties": false, "$defs": {"d": {"type": "integer"}}});
        assert_eq!(schema_to_json(&j), j);
        let g = schema_to_gemini(
            &json!({"type": "object", "additionalProperties": false, "$schema": "x"}),
        );
        assert_eq!(g, json!({"type": "object"}));
    }
}
