//! The Responses-state section: what a Responses client's references become on each route.
//! Translated routes expand them from the gateway's store (`dialect::references`, with an
//! in-memory store here; the store itself is tested in `tests/dialect/responses_state.rs`); the
//! same-dialect route forwards them untouched.

use std::collections::HashMap;
use std::sync::Arc;

use ringgate::dialect::references::{self, PastTurn, Recall};
use ringgate::dialect::{self, Dialect};
use serde_json::{json, Value};

use super::name;

#[derive(Default)]
struct Mem {
    items: HashMap<String, Arc<[u8]>>,
    turns: HashMap<String, Arc<PastTurn>>,
}

impl Recall for Mem {
    fn item(&mut self, id: &str) -> Option<Arc<[u8]>> {
        self.items.get(id).cloned()
    }
    fn response(&mut self, id: &str) -> Option<Arc<PastTurn>> {
        self.turns.get(id).cloned()
    }
}

const CALL: &str = r#"{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}","status":"completed"}"#;
const TEXT: &str = r#"{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Let me check.","annotations":[]}]}"#;

fn store() -> Mem {
    let mut m = Mem::default();
    m.items.insert("fc_1".into(), CALL.as_bytes().into());
    m.items.insert("msg_1".into(), TEXT.as_bytes().into());
    m.turns.insert(
        "resp_1".into(),
        Arc::new(PastTurn {
            previous: None,
            input: br#"[{"type":"message","role":"user","content":"EARLIER-QUESTION"}]"#[..].into(),
            output: format!("[{TEXT},{CALL}]").into_bytes().into(),
        }),
    );
    m
}

/// The upstream request a Responses body becomes for `up` after expansion.
fn upstream(body: &Value, up: Dialect) -> Result<String, String> {
    let raw = body.to_string();
    let e = references::expand(raw.as_bytes(), &mut store()).map_err(|e| e.message)?;
    let hub = dialect::request_to_chat(Dialect::Responses, &e.body).map_err(|e| e.message)?;
    let out = dialect::chat_to_request(up, &hub, "u").map_err(|e| e.message)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn cell(up: Dialect, feature: &str) -> Result<String, String> {
    if up == Dialect::Responses {
        return Ok("passthrough (the upstream's own state)".into());
    }
    let tools =
        json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]);
    let has_all = |out: &str, want: &[&str]| {
        want.iter()
            .all(|w| out.contains(w))
            .then(|| "pass".to_string())
            .ok_or_else(|| format!("missing one of {want:?} in {out}"))
    };
    match feature {
        "item_reference" => {
            let body = json!({"model": "m", "tools": tools, "input": [
                {"role": "user", "content": "QUESTION"},
                {"type": "item_reference", "id": "msg_1"},
                {"type": "item_reference", "id": "fc_1"},
                {"type": "function_call_output", "call_id": "call_1", "output": "TOOL-RESULT"}]});
            has_all(
                &upstream(&body, up)?,
                &["QUESTION", "Let me check.", "Paris", "TOOL-RESULT"],
            )
        }
        "previous_response_id" => {
            let body = json!({"model": "m", "tools": tools, "previous_response_id": "resp_1",
                "input": [{"type": "function_call_output", "call_id": "call_1", "output": "TOOL-RESULT"}]});
            let out = upstream(&body, up)?;
            if out.contains("previous_response_id") {
                return Err("previous_response_id went upstream".into());
            }
            has_all(
                &out,
                &["EARLIER-QUESTION", "Let me check.", "Paris", "TOOL-RESULT"],
            )
        }
        "unknown id" => {
            let body = json!({"model": "m", "previous_response_id": "resp_gone", "input": "x"});
            match references::expand(body.to_string().as_bytes(), &mut store()) {
                Err(e) if e.param == "previous_response_id" => {
                    Ok("400 `invalid_request_error`, `param` named".into())
                }
                other => Err(format!("expected a 400 naming the field: {other:?}")),
            }
        }
        "store: false" => {
            match references::own_input(br#"{"model":"m","input":"x","store":false}"#) {
                None => Ok("nothing stored".into()),
                Some(_) => Err("store: false was kept".into()),
            }
        }
        _ => Err("unknown feature".into()),
    }
}

pub fn section() -> (String, usize) {
    let features = [
        "item_reference",
        "previous_response_id",
        "unknown id",
        "store: false",
    ];
    let mut md = String::from(
        "\n## Responses state on translated routes\n\n\
         A Responses client's references — `{\"type\":\"item_reference\",\"id\":…}` input items (the\n\
         Vercel AI SDK's second step of a tool loop) and `previous_response_id` — on each route.\n\
         Translated routes expand them before translation from the gateway's store of its own\n\
         recent Responses answers (per tenant, TTL, byte-bounded: dialects.md, \"Responses state\");\n\
         the same-dialect route forwards them untouched. Other client dialects carry their\n\
         history in every request and need no state.\n\n\
         * item_reference: a stored assistant message and function call, referenced, reach the\n  \
           upstream in full with the tool result\n\
         * previous_response_id: the earlier turn (its input, then its output) reaches the upstream\n  \
           before the new input; the field itself does not\n\
         * unknown id: never stored, expired or evicted\n\
         * store: false: the client's answer is not kept\n\n\
         | client → upstream |",
    );
    for f in features {
        md.push_str(&format!(" {f} |"));
    }
    md.push_str("\n|---|");
    for _ in features {
        md.push_str("---|");
    }
    md.push('\n');
    let mut failures = 0;
    for up in Dialect::ALL {
        md.push_str(&format!("| Responses → {} |", name(up)));
        for f in features {
            match cell(up, f) {
                Ok(t) => md.push_str(&format!(" {t} |")),
                Err(why) => {
                    failures += 1;
                    md.push_str(&format!(" FAIL ({why}) |"));
                }
            }
        }
        md.push('\n');
    }
    (md, failures)
}
