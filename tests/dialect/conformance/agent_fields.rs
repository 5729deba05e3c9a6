//! The error-status and request-field tables of the agent sections: what status and error type
//! each client dialect gets for an upstream error, and what a translated request carries of
//! each field per target dialect (mapped, dropped with the reason, or a 400).

use ringgate::dialect::extensions::ChatUpstream;
use ringgate::dialect::{self, error, Dialect};
use serde_json::{json, Value};

use super::wire::client;
use super::{hub_of, name, upstream_req, TOOL};

// ------------------------------------------------------------ errors per dialect

pub(super) fn error_table() -> (String, usize) {
    let mut md = String::from(
        "\n## Upstream error statuses per client dialect\n\n\
         The status and error type each client dialect gets for an upstream error answer (every\n\
         provider kind; the SDK exception each raises is asserted in `tests/sdk/test_dialect_errors.py`).\n\
         Anthropic's overloaded 529 and OpenAI's / Gemini's 503 name one condition: each client gets\n\
         its own. `Retry-After` is kept (from a Gemini body's `RetryInfo` when there is no header); an\n\
         HTML or text error page becomes a dialect-shaped error with a request id.\n\n\
         | upstream status | OpenAI clients (Chat, Responses) | Anthropic clients | Gemini clients |\n\
         |---|---|---|---|\n",
    );
    let mut failures = 0;
    for st in [400u16, 401, 403, 404, 413, 429, 500, 503, 529] {
        md.push_str(&format!("| {st} |"));
        for c in [Dialect::Chat, Dialect::Messages, Dialect::Gemini] {
            // The status every upstream dialect's error gets (they must agree per client, bar
            // the 503/529 pair, which depends on whether the upstream is Anthropic).
            let mut cells: Vec<String> = Vec::new();
            for up in Dialect::ALL {
                let s = error::client_status(up, c, st);
                let body = dialect::error_body(c, s, "m");
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let ty = match c {
                    Dialect::Gemini => v["error"]["status"].as_str(),
                    _ => v["error"]["type"].as_str(),
                }
                .unwrap_or("?");
                let t = format!("{s} `{ty}`");
                if !cells.contains(&t) {
                    cells.push(t);
                }
            }
            if !dialect::is_error_shape(
                c,
                &serde_json::from_slice(&dialect::error_body(c, st, "m")).unwrap_or(Value::Null),
            ) {
                failures += 1;
            }
            let text = match (c, st, cells.as_slice()) {
                (Dialect::Messages, 503, [_, _]) => {
                    "503 from Anthropic, else 529 `overloaded_error`".into()
                }
                (Dialect::Chat | Dialect::Gemini, 529, [_, _]) => {
                    let t = if c == Dialect::Gemini {
                        "UNAVAILABLE"
                    } else {
                        "server_error"
                    };
                    format!("503 `{t}` from Anthropic, else 529")
                }
                (_, _, [one]) => one.clone(),
                _ => {
                    failures += 1;
                    format!("FAIL ({})", cells.join(", "))
                }
            };
            md.push_str(&format!(" {text} |"));
        }
        md.push('\n');
    }
    (md, failures)
}

// ------------------------------------------------------------ request fields per target

#[derive(Clone, Copy)]
enum Want {
    /// The target request has this (JSON pointer) with this value.
    To(&'static str, &'static str, Value2),
    Dropped(&'static str),
    Rejected,
}

#[derive(Clone, Copy)]
enum Value2 {
    Str(&'static str),
    Num(u64),
    Any,
}

fn matches_value(v: &Value, want: Value2) -> bool {
    match want {
        Value2::Str(s) => v == s,
        Value2::Num(n) => v.as_u64() == Some(n),
        Value2::Any => !v.is_null(),
    }
}

/// (field as the client sends it, client dialect, extra body, [Chat, Responses, Messages,
/// Gemini] targets). A Chat target's `To` is what OpenAI-compatible engines get; `Dropped`
/// there holds for OpenAI too.
fn field_rows() -> Vec<(&'static str, Dialect, Value, [Want; 4])> {
    use Value2::*;
    use Want::*;
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
    vec![
        (
            "`reasoning_effort`",
            Dialect::Chat,
            json!({"reasoning_effort": "low", "max_tokens": 9000}),
            [
                To("", "", Any),
                To("/reasoning/effort", "`reasoning.effort`", Str("low")),
                To(
                    "/thinking/budget_tokens",
                    "`thinking.budget_tokens` (table)",
                    Num(2048),
                ),
                To(
                    "/generationConfig/thinkingConfig/thinkingBudget",
                    "`thinkingConfig.thinkingBudget` (table)",
                    Num(2048),
                ),
            ],
        ),
        (
            "`reasoning.effort`",
            Dialect::Responses,
            json!({"reasoning": {"effort": "low"}, "max_output_tokens": 9000}),
            [
                To("/reasoning_effort", "`reasoning_effort`", Str("low")),
                To("", "", Any),
                To(
                    "/thinking/budget_tokens",
                    "`thinking.budget_tokens` (table)",
                    Num(2048),
                ),
                To(
                    "/generationConfig/thinkingConfig/thinkingBudget",
                    "`thinkingConfig.thinkingBudget` (table)",
                    Num(2048),
                ),
            ],
        ),
        (
            "`seed`",
            Dialect::Chat,
            json!({"seed": 7}),
            [
                To("", "", Any),
                Dropped("no seed in Responses"),
                Dropped("no seed in Messages"),
                To("/generationConfig/seed", "`generationConfig.seed`", Num(7)),
            ],
        ),
        (
            "`metadata`",
            Dialect::Chat,
            json!({"metadata": {"k": "v"}}),
            [
                To("", "", Any),
                To("/metadata/k", "`metadata`", Str("v")),
                Dropped("only `metadata.user_id` (from `user`)"),
                Dropped("no request metadata"),
            ],
        ),
        (
            "`service_tier`",
            Dialect::Chat,
            json!({"service_tier": "default"}),
            [
                To("", "", Any),
                To("/service_tier", "`service_tier`", Str("default")),
                To(
                    "/service_tier",
                    "`service_tier` (`standard_only`)",
                    Str("standard_only"),
                ),
                Dropped("no service tiers"),
            ],
        ),
        (
            "`response_format`",
            Dialect::Chat,
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}),
            [
                To("", "", Any),
                To("/text/format/schema", "`text.format`", Any),
                To("/tool_choice/name", "forced answer tool", Str(TOOL)),
                To("/generationConfig/responseSchema", "`responseSchema`", Any),
            ],
        ),
        (
            "`text.format`",
            Dialect::Responses,
            json!({"text": {"format": {"type": "json_object"}}}),
            [
                To(
                    "/response_format/type",
                    "`response_format`",
                    Str("json_object"),
                ),
                To("", "", Any),
                To("/tool_choice/name", "forced answer tool", Str(TOOL)),
                To(
                    "/generationConfig/responseMimeType",
                    "`responseMimeType`",
                    Str("application/json"),
                ),
            ],
        ),
        (
            "`n` = 2",
            Dialect::Chat,
            json!({"n": 2}),
            [To("", "", Any), Rejected, Rejected, Rejected],
        ),
        (
            "`thinking`",
            Dialect::Messages,
            json!({"thinking": {"type": "enabled", "budget_tokens": 20000}}),
            [
                To(
                    "/reasoning_effort",
                    "`reasoning_effort` (table)",
                    Str("high"),
                ),
                To(
                    "/reasoning/effort",
                    "`reasoning.effort` (table)",
                    Str("high"),
                ),
                To("", "", Any),
                To(
                    "/generationConfig/thinkingConfig/thinkingBudget",
                    "`thinkingConfig.thinkingBudget` (table)",
                    Num(16384),
                ),
            ],
        ),
        (
            "`top_k`",
            Dialect::Messages,
            json!({"top_k": 5}),
            [
                To(
                    "/top_k",
                    "`top_k` (compatible engines; OpenAI: dropped)",
                    Num(5),
                ),
                Dropped("no top_k in Responses"),
                To("", "", Any),
                To("/generationConfig/topK", "`topK`", Num(5)),
            ],
        ),
        (
            "`cache_control`",
            Dialect::Messages,
            json!({"system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]}),
            [
                To(
                    "/messages/0/content/0/cache_control/type",
                    "kept (compatible engines; OpenAI: dropped)",
                    Str("ephemeral"),
                ),
                Dropped("no markers (OpenAI caches by itself)"),
                To("", "", Any),
                Dropped("no markers (`cachedContent` only)"),
            ],
        ),
        (
            "`service_tier`",
            Dialect::Messages,
            json!({"service_tier": "auto"}),
            [
                To("/service_tier", "`service_tier`", Str("auto")),
                To("/service_tier", "`service_tier`", Str("auto")),
                To("", "", Any),
                Dropped("no service tiers"),
            ],
        ),
    ]
}

pub(super) fn fields_table() -> (String, usize) {
    let mut md = String::from(
        "\n## Request fields per target dialect\n\n\
         What a translated request carries of each field (client dialect in the first column).\n\
         `passthrough`: the client's own dialect, forwarded untouched. Dropped fields do not change\n\
         what the answer means; where dropping would (`n` > 1, structured output that cannot be a\n\
         tool input), the request is refused with a 400 in the client's dialect.\n\n\
         | field (client) | → Chat | → Responses | → Messages | → Gemini |\n|---|---|---|---|---|\n",
    );
    let mut failures = 0;
    for (field, c, extra, wants) in field_rows() {
        md.push_str(&format!("| {field} ({}) |", name(c)));
        for (up, want) in Dialect::ALL.into_iter().zip(wants) {
            if up == c {
                md.push_str(" passthrough |");
                continue;
            }
            let body = client(c, extra.clone());
            let got = upstream_req(c, up, &body, ChatUpstream::Compatible);
            let strict = upstream_req(c, up, &body, ChatUpstream::OpenAi);
            let rejected =
                hub_of(c, &body).is_some_and(|h| dialect::chat_to_request(up, &h, "up").is_err());
            let (ok, text) = match want {
                Want::To(ptr, text, v) => (
                    got.as_ref()
                        .is_some_and(|g| matches_value(g.pointer(ptr).unwrap_or(&Value::Null), v)),
                    format!("→ {text}"),
                ),
                Want::Dropped(why) => {
                    let key = field
                        .trim_matches('`')
                        .split(['.', ' '])
                        .next()
                        .unwrap_or_default();
                    let absent = |g: &Option<Value>| {
                        g.as_ref()
                            .is_some_and(|g| !g.to_string().contains(&format!("\"{key}\"")))
                    };
                    (absent(&got) && absent(&strict), format!("dropped: {why}"))
                }
                Want::Rejected => (rejected, "400".to_string()),
            };
            if ok {
                md.push_str(&format!(" {text} |"));
            } else {
                failures += 1;
                md.push_str(&format!(" FAIL (want {text}) |"));
            }
        }
        md.push('\n');
    }
    (md, failures)
}
