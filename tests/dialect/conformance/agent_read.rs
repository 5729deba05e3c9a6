//! Readers of the agent sections: what a client answer or stream, or an upstream request, says
//! about reasoning, cache usage, structured output, tool choice and error endings.

use ringgate::dialect::Dialect;
use serde_json::{json, Value};

use super::{datas, TOOL};

// ------------------------------------------------------------ readers

/// The reasoning text of a client answer.
pub(super) fn answer_reasoning(d: Dialect, v: &Value) -> String {
    let items = |k: &str| v[k].as_array().cloned().unwrap_or_default();
    match d {
        Dialect::Chat => v["choices"][0]["message"]["reasoning_content"]
            .as_str()
            .unwrap_or_default()
            .into(),
        Dialect::Responses => items("output")
            .iter()
            .filter(|i| i["type"] == "reasoning")
            .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|c| c["text"].as_str().map(str::to_string))
            .collect(),
        Dialect::Messages => items("content")
            .iter()
            .filter(|b| b["type"] == "thinking")
            .filter_map(|b| b["thinking"].as_str().map(str::to_string))
            .collect(),
        Dialect::Gemini => v["candidates"][0]["content"]["parts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|p| p["thought"] == true)
            .filter_map(|p| p["text"].as_str().map(str::to_string))
            .collect(),
    }
}

/// The reasoning text of a client stream.
pub(super) fn stream_reasoning(d: Dialect, evs: &[(Option<String>, String)]) -> String {
    let mut out = String::new();
    for v in datas(evs) {
        let piece = match d {
            Dialect::Chat => v["choices"][0]["delta"]["reasoning_content"].as_str(),
            Dialect::Responses
                if v["type"] == "response.reasoning_text.delta"
                    || v["type"] == "response.reasoning_summary_text.delta" =>
            {
                v["delta"].as_str()
            }
            Dialect::Messages if v["delta"]["type"] == "thinking_delta" => {
                v["delta"]["thinking"].as_str()
            }
            Dialect::Gemini => v["candidates"][0]["content"]["parts"][0]
                .as_object()
                .filter(|p| p.get("thought") == Some(&json!(true)))
                .and_then(|p| p.get("text"))
                .and_then(Value::as_str),
            _ => None,
        };
        out.push_str(piece.unwrap_or_default());
    }
    out
}

/// (prompt, cached) as the client reads them (Anthropic: input + cache read).
pub(super) fn cache_usage(d: Dialect, u: &Value) -> (u64, u64) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    match d {
        Dialect::Chat => (
            n(&u["prompt_tokens"]),
            n(&u["prompt_tokens_details"]["cached_tokens"]),
        ),
        Dialect::Responses => (
            n(&u["input_tokens"]),
            n(&u["input_tokens_details"]["cached_tokens"]),
        ),
        Dialect::Messages => (
            n(&u["input_tokens"]) + n(&u["cache_read_input_tokens"]),
            n(&u["cache_read_input_tokens"]),
        ),
        Dialect::Gemini => (n(&u["promptTokenCount"]), n(&u["cachedContentTokenCount"])),
    }
}

pub(super) fn answer_usage(d: Dialect, v: &Value) -> (u64, u64) {
    let key = match d {
        Dialect::Gemini => "usageMetadata",
        _ => "usage",
    };
    cache_usage(d, &v[key])
}

pub(super) fn stream_usage(d: Dialect, evs: &[(Option<String>, String)]) -> (u64, u64) {
    let mut got = (0, 0);
    for v in datas(evs) {
        let u = match d {
            Dialect::Chat => &v["usage"],
            Dialect::Responses => &v["response"]["usage"],
            Dialect::Messages if v["type"] == "message_start" => &v["message"]["usage"],
            Dialect::Messages => &v["usage"],
            Dialect::Gemini => &v["usageMetadata"],
        };
        let c = cache_usage(d, u);
        if c.0 > 0 {
            got = c;
        }
    }
    got
}

/// Whether a client stream's last event is its error form, and nothing claims success.
pub(super) fn ends_with_error(d: Dialect, evs: &[(Option<String>, String)]) -> bool {
    let Some((name, data)) = evs.last() else {
        return false;
    };
    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    let success = evs.iter().any(|(n, d)| {
        matches!(n.as_deref(), Some("message_stop" | "response.completed")) || d == "[DONE]"
    });
    let last_is_error = match d {
        Dialect::Chat | Dialect::Gemini => v["error"]["message"] == "boom",
        Dialect::Responses => {
            name.as_deref() == Some("response.failed")
                && v["response"]["error"]["message"] == "boom"
        }
        Dialect::Messages => name.as_deref() == Some("error") && v["error"]["message"] == "boom",
    };
    last_is_error && !success
}

pub(super) fn reasoning_knob(d: Dialect, r: &Value) -> bool {
    match d {
        Dialect::Chat => r["reasoning_effort"] == "high",
        Dialect::Responses => r["reasoning"]["effort"] == "high",
        Dialect::Messages => r["thinking"]["budget_tokens"] == 16384,
        Dialect::Gemini => r["generationConfig"]["thinkingConfig"]["thinkingBudget"] == 16384,
    }
}

pub(super) fn structured_sent(up: Dialect, r: &Value) -> bool {
    let city = |s: &Value| {
        s["properties"]["city"]["type"]
            .as_str()
            .map(str::to_ascii_lowercase)
    };
    let s = Some("string".to_string());
    match up {
        Dialect::Chat => city(&r["response_format"]["json_schema"]["schema"]) == s,
        Dialect::Responses => city(&r["text"]["format"]["schema"]) == s,
        Dialect::Messages => {
            let tools = r["tools"].as_array().cloned().unwrap_or_default();
            tools
                .iter()
                .any(|t| t["name"] == TOOL && city(&t["input_schema"]) == s)
                && r["tool_choice"]["name"] == TOOL
        }
        Dialect::Gemini => {
            r["generationConfig"]["responseMimeType"] == "application/json"
                && city(&r["generationConfig"]["responseSchema"]) == s
        }
    }
}

/// (variant, parallel off) as the upstream request says it.
pub(super) fn tool_choice_sent(up: Dialect, r: &Value) -> (String, bool) {
    let v = match up {
        Dialect::Chat | Dialect::Responses => match &r["tool_choice"] {
            Value::String(s) => s.clone(),
            c if c["function"]["name"] == "g" || c["name"] == "g" => "named".into(),
            _ => "?".into(),
        },
        Dialect::Messages => match r["tool_choice"]["type"].as_str() {
            Some("any") => "required".into(),
            Some("tool") if r["tool_choice"]["name"] == "g" => "named".into(),
            Some(s) => s.into(),
            None => "?".into(),
        },
        Dialect::Gemini => {
            let f = &r["toolConfig"]["functionCallingConfig"];
            match f["mode"].as_str() {
                Some("ANY") if f["allowedFunctionNames"] == json!(["g"]) => "named".into(),
                Some("ANY") => "required".into(),
                Some(m) => m.to_ascii_lowercase(),
                None => "?".into(),
            }
        }
    };
    let parallel_off = match up {
        Dialect::Chat | Dialect::Responses => r["parallel_tool_calls"] == false,
        Dialect::Messages => r["tool_choice"]["disable_parallel_tool_use"] == true,
        Dialect::Gemini => false,
    };
    (v, parallel_off)
}

pub(super) fn markers(r: &Value) -> usize {
    r.to_string().matches("\"cache_control\"").count()
}
