//! The agent-traffic sections of `docs/conformance.md`: thinking / reasoning, prompt-cache
//! markers and usage, structured output, tool choice, errors and stream endings per dialect
//! (client ← upstream), and what becomes of each request field per target dialect.
//!
//! Every cell runs the real conversion. A cell either passes or states why the feature cannot
//! be mapped; such a statement is checked too (the field really is dropped, or really is a
//! 400), so a cell that stops matching what it says turns into `FAIL (…)`.

use ringgate::dialect::extensions::{fit_chat_upstream, ChatUpstream};
use ringgate::dialect::{self, encode_event, Dialect, SseDecoder, StreamTranslator};
use serde_json::{json, Value};

use super::name;

#[path = "agent_fields.rs"]
mod fields;
#[path = "agent_read.rs"]
mod read;
#[path = "agent_wire.rs"]
mod wire;

use read::*;
use wire::*;

const R: &str = "R-TEXT";
const SIG: &str = "SIG-1";
const TOOL: &str = "ringgate_structured_output";

// ------------------------------------------------------------ running

pub(super) fn hub_of(client: Dialect, body: &Value) -> Option<Value> {
    dialect::request_to_chat(client, &serde_json::to_vec(body).ok()?).ok()
}

/// Client request → upstream request (`to` picks what a Chat upstream keeps).
pub(super) fn upstream_req(
    client: Dialect,
    up: Dialect,
    body: &Value,
    to: ChatUpstream,
) -> Option<Value> {
    let mut hub = hub_of(client, body)?;
    if up == Dialect::Chat {
        fit_chat_upstream(&mut hub, to);
    }
    serde_json::from_slice(&dialect::chat_to_request(up, &hub, "up").ok()?).ok()
}

pub(super) fn answer(client: Dialect, up: Dialect, body: &Value) -> Option<Value> {
    let hub = dialect::response_to_chat(up, &serde_json::to_vec(body).ok()?).ok()?;
    serde_json::from_slice(&dialect::chat_to_response(client, &hub, "m").ok()?).ok()
}

pub(super) fn sse(events: &[(Option<&str>, Value)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (e, v) in events {
        let data = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        encode_event(*e, &data, &mut out);
    }
    out
}

/// Upstream SSE → the client's events (name, data).
pub(super) fn stream(
    client: Dialect,
    up: Dialect,
    input: &[u8],
) -> Option<Vec<(Option<String>, String)>> {
    let mut t = StreamTranslator::new(up, client, "m").with_chat_usage(true);
    let mut dec = SseDecoder::new();
    let mut out = Vec::new();
    dec.feed(input);
    dec.finish();
    while let Some(ev) = dec.next_event() {
        t.push(&ev, &mut out).ok()?;
    }
    t.finish(&mut out);
    let mut d = SseDecoder::new();
    d.feed(&out);
    d.finish();
    Some(
        std::iter::from_fn(|| d.next_event())
            .map(|e| (e.event, e.data))
            .collect(),
    )
}

pub(super) fn datas(evs: &[(Option<String>, String)]) -> Vec<Value> {
    evs.iter()
        .filter_map(|(_, d)| serde_json::from_str(d).ok())
        .collect()
}

// ------------------------------------------------------------ the dialect × feature table

const FEATURES: [&str; 9] = [
    "reasoning request",
    "reasoning answer",
    "reasoning stream",
    "thinking signature",
    "cache markers",
    "cache usage",
    "structured output",
    "tool choice",
    "error stream end",
];

/// The forced answer tool comes back as the client's text (non-stream and streamed).
fn structured_back(client: Dialect) -> bool {
    let body = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "u",
        "content": [{"type": "tool_use", "id": "t", "name": TOOL, "input": {"city": "Paris"}}],
        "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 1}});
    let text = |d: Dialect, v: &Value| -> String {
        match d {
            Dialect::Chat => v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .into(),
            Dialect::Responses => v["output"][0]["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .into(),
            Dialect::Messages => v["content"][0]["text"].as_str().unwrap_or_default().into(),
            Dialect::Gemini => v["candidates"][0]["content"]["parts"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .into(),
        }
    };
    let whole = answer(client, Dialect::Messages, &body)
        .is_some_and(|v| text(client, &v) == r#"{"city":"Paris"}"#);
    let streamed = sse(&[
        an(
            json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 1}}}),
        ),
        an(
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t", "name": TOOL, "input": {}}}),
        ),
        an(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"city\":"}}),
        ),
        an(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
        ),
        an(json!({"type": "content_block_stop", "index": 0})),
        an(
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 1}}),
        ),
        an(json!({"type": "message_stop"})),
    ]);
    let got = stream(client, Dialect::Messages, &streamed).map(|evs| {
        datas(&evs)
            .iter()
            .filter_map(|v| match client {
                Dialect::Chat => v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_string),
                Dialect::Responses if v["type"] == "response.output_text.delta" => {
                    v["delta"].as_str().map(str::to_string)
                }
                Dialect::Messages if v["delta"]["type"] == "text_delta" => {
                    v["delta"]["text"].as_str().map(str::to_string)
                }
                Dialect::Gemini => v["candidates"][0]["content"]["parts"][0]["text"]
                    .as_str()
                    .map(str::to_string),
                _ => None,
            })
            .collect::<String>()
    });
    whole && got.as_deref() == Some(r#"{"city":"Paris"}"#)
}

/// One cell: `Ok(text)` when the behaviour matches what the text says, `Err(why)` else.
fn cell(client: Dialect, up: Dialect, feature: &str) -> Result<String, String> {
    use Dialect::*;
    let pass = |ok: bool, what: &str| {
        if ok {
            Ok("pass".to_string())
        } else {
            Err(what.to_string())
        }
    };
    let stated = |ok: bool, text: &str| {
        if ok {
            Ok(text.to_string())
        } else {
            Err(format!("not as stated: {text}"))
        }
    };
    let oa = ChatUpstream::OpenAi;
    if client == up {
        return Ok("passthrough".into());
    }
    match feature {
        "reasoning request" => {
            let r = upstream_req(client, up, &reasoning_req(client), oa);
            pass(r.is_some_and(|r| reasoning_knob(up, &r)), "effort lost")
        }
        "reasoning answer" => {
            let a = answer(client, up, &reasoning_answer(up));
            pass(
                a.is_some_and(|a| answer_reasoning(client, &a) == R),
                "reasoning lost",
            )
        }
        "reasoning stream" => {
            let e = stream(client, up, &reasoning_stream(up));
            pass(
                e.is_some_and(|e| stream_reasoning(client, &e) == R),
                "reasoning lost",
            )
        }
        "thinking signature" => {
            if up != Messages {
                return Ok("n/a: no signatures upstream".into());
            }
            let a = answer(client, up, &reasoning_answer(up)).unwrap_or(Value::Null);
            let text = a.to_string();
            match client {
                Messages => stated(text.contains(SIG), "pass"),
                Chat => stated(
                    a["choices"][0]["message"]["thinking_blocks"][0]["signature"] == SIG,
                    "pass (`thinking_blocks`; streams: dropped)",
                ),
                _ => stated(!text.contains(SIG), "dropped: no field for it"),
            }
        }
        "cache markers" => {
            if client == Gemini {
                return Ok("n/a: Gemini caches by `cachedContent`".into());
            }
            let r = upstream_req(client, up, &cache_req(client), oa).unwrap_or(Value::Null);
            match up {
                Messages => pass(markers(&r) == 2, "markers lost"),
                Chat => {
                    let compat =
                        upstream_req(client, up, &cache_req(client), ChatUpstream::Compatible);
                    stated(
                        markers(&r) == 0 && compat.is_some_and(|c| markers(&c) == 2),
                        "OpenAI: dropped (caches by itself); compatible: kept",
                    )
                }
                _ => stated(markers(&r) == 0, "dropped: no markers"),
            }
        }
        "cache usage" => {
            let a = answer(client, up, &reasoning_answer(up)).map(|a| answer_usage(client, &a));
            let s = stream(client, up, &reasoning_stream(up)).map(|e| stream_usage(client, &e));
            pass(
                a == Some((1000, 900)) && s == Some((1000, 900)),
                "cache usage lost",
            )
        }
        "structured output" => {
            let r = upstream_req(client, up, &structured_req(client), oa);
            let sent = r.is_some_and(|r| structured_sent(up, &r));
            if up == Messages {
                pass(sent && structured_back(client), "schema or answer lost")
            } else {
                pass(sent, "schema lost")
            }
        }
        "tool choice" => {
            let mut ok = true;
            for v in ["auto", "none", "required", "named"] {
                let r = upstream_req(client, up, &tool_choice_req(client, v), oa);
                let (got, par) = r.map(|r| tool_choice_sent(up, &r)).unwrap_or_default();
                let par_expected = client != Gemini && up != Gemini && v != "none";
                ok &= got == v && (par == par_expected || v == "none");
            }
            if client == Gemini || up == Gemini {
                stated(ok, "pass (parallel off: no Gemini switch)")
            } else {
                pass(ok, "a variant lost")
            }
        }
        "error stream end" => {
            let e = stream(client, up, &failing_stream(up));
            pass(
                e.is_some_and(|e| ends_with_error(client, &e)),
                "not ended by the error",
            )
        }
        _ => Err("unknown feature".into()),
    }
}

fn feature_table() -> (String, usize) {
    let mut md = String::from(
        "\n## Agent features: thinking, caching, structured output, tool choice, errors\n\n\
         Client dialect ← upstream dialect, through the hub (`src/dialect/`). Same-dialect routes\n\
         forward the bytes untouched (`passthrough`: thinking blocks with their signatures, cache\n\
         markers, `output_format`, error events as the provider sent them). A cell passes, or says\n\
         why the feature cannot be mapped (that statement is checked as well). Mappings:\n\
         `src/dialect/thinking.rs` (the effort ⇄ budget table), `cache.rs`, `structured.rs`,\n\
         `extensions.rs`.\n\n\
         * reasoning request: effort `high` (Anthropic / Gemini: 16,384 tokens) reaches the upstream's\n  \
           knob (`reasoning_effort`, `reasoning.effort`, `thinking.budget_tokens`, `thinkingConfig`)\n\
         * reasoning answer / stream: the upstream's reasoning reaches the client (Chat\n  \
           `reasoning_content`, a Responses `reasoning` item, Anthropic `thinking` blocks, Gemini\n  \
           `thought` parts)\n\
         * thinking signature: an Anthropic thinking block's signature reaches the client\n\
         * cache markers: `cache_control` on a system prompt and a tool reach the upstream\n\
         * cache usage: 900 cached of 1,000 prompt tokens reach the client (non-stream and streamed)\n\
         * structured output: a JSON schema reaches the upstream (Anthropic: the forced answer tool,\n  \
           whose input comes back as the answer's text, non-stream and streamed)\n\
         * tool choice: `auto`, `none`, `required`, a named tool, each with parallel calls off\n\
         * error stream end: an upstream error mid-stream ends the client's stream with its error\n  \
           (Responses `response.failed`, Anthropic `error`), nothing claiming success after it\n\n",
    );
    md.push_str("| client ← upstream |");
    for f in FEATURES {
        md.push_str(&format!(" {f} |"));
    }
    md.push_str("\n|---|");
    for _ in FEATURES {
        md.push_str("---|");
    }
    md.push('\n');
    let mut failures = 0;
    for c in Dialect::ALL {
        for up in Dialect::ALL {
            md.push_str(&format!("| {} ← {} |", name(c), name(up)));
            for f in FEATURES {
                match cell(c, up, f) {
                    Ok(t) => md.push_str(&format!(" {t} |")),
                    Err(why) => {
                        failures += 1;
                        md.push_str(&format!(" FAIL ({why}) |"));
                    }
                }
            }
            md.push('\n');
        }
    }
    (md, failures)
}

/// The agent sections of `docs/conformance.md` and their failing cells.
pub fn sections() -> (String, usize) {
    let mut md = String::new();
    let mut failures = 0;
    for (s, f) in [
        feature_table(),
        fields::error_table(),
        fields::fields_table(),
    ] {
        md.push_str(&s);
        failures += f;
    }
    (md, failures)
}
