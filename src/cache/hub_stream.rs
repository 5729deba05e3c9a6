//! Between a hub Chat completion and the Chat stream that says the same thing: `aggregate`
//! folds a Chat stream's chunks into one completion (how a stream answer is stored), `chunks`
//! unfolds a completion into the chunks a live stream would carry (how a stored answer is
//! replayed to a stream client; other dialects get them through `translate::StreamTranslator`,
//! so a replayed stream has the event structure of a live translated one).
//!
//! Owns: both directions. Must not: do IO. Pure: unit-tested.

use serde_json::{json, Map, Value};

/// Why a stream is not stored.
pub type Refusal = &'static str;

/// Fold the `data` of a Chat stream's events (in order, `[DONE]` included) into a completion.
/// Refused: an error event, no finish reason (a cut stream), more than one choice.
pub fn aggregate<'a>(events: impl IntoIterator<Item = &'a str>) -> Result<Value, Refusal> {
    let mut id = Value::Null;
    let mut created = Value::Null;
    let mut model = Value::Null;
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut refusal = String::new();
    let mut tools: Vec<(Value, String, String)> = Vec::new();
    let mut finish: Option<String> = None;
    let mut usage = None;
    let mut done = false;
    for data in events {
        if data.trim() == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).map_err(|_| "malformed event")?;
        if v.get("error").is_some_and(|e| !e.is_null()) {
            return Err("error event");
        }
        if id.is_null() {
            id = v.get("id").cloned().unwrap_or(Value::Null);
            created = v.get("created").cloned().unwrap_or(Value::Null);
            model = v.get("model").cloned().unwrap_or(Value::Null);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            usage = Some(u.clone());
        }
        for c in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if c.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                return Err("several choices");
            }
            if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
                finish = Some(f.to_string());
            }
            let Some(d) = c.get("delta") else { continue };
            let text = |k: &str| d.get(k).and_then(Value::as_str);
            if let Some(t) = text("content") {
                content.push_str(t);
            }
            if let Some(t) = text("reasoning_content").or_else(|| text("reasoning")) {
                reasoning.push_str(t);
            }
            if let Some(t) = text("refusal") {
                refusal.push_str(t);
            }
            for t in d
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let i = t.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                if i > 64 {
                    return Err("tool call index");
                }
                while tools.len() <= i {
                    tools.push((Value::Null, String::new(), String::new()));
                }
                let slot = &mut tools[i];
                if let Some(tid) = t.get("id").filter(|x| x.is_string()) {
                    slot.0 = tid.clone();
                }
                if let Some(f) = t.get("function") {
                    if let Some(n) = f.get("name").and_then(Value::as_str) {
                        slot.1.push_str(n);
                    }
                    if let Some(a) = f.get("arguments").and_then(Value::as_str) {
                        slot.2.push_str(a);
                    }
                }
            }
        }
    }
    let Some(finish) = finish.filter(|_| done) else {
        return Err("incomplete stream");
    };
    let mut msg = Map::new();
    msg.insert("role".into(), "assistant".into());
    msg.insert(
        "content".into(),
        if content.is_empty() && !tools.is_empty() {
            Value::Null
        } else {
            content.into()
        },
    );
    if !reasoning.is_empty() {
        msg.insert("reasoning_content".into(), reasoning.into());
    }
    if !refusal.is_empty() {
        msg.insert("refusal".into(), refusal.into());
    }
    if !tools.is_empty() {
        let calls: Vec<Value> = tools
            .into_iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect();
        msg.insert("tool_calls".into(), calls.into());
    }
    let mut out = Map::new();
    out.insert("id".into(), id);
    out.insert("object".into(), "chat.completion".into());
    out.insert("created".into(), created);
    out.insert("model".into(), model);
    out.insert(
        "choices".into(),
        json!([{"index": 0, "message": Value::Object(msg), "finish_reason": finish}]),
    );
    if let Some(u) = usage {
        out.insert("usage".into(), u);
    }
    Ok(Value::Object(out))
}

/// The chunks (each one event's `data`) of a live Chat stream saying what completion `c` says:
/// role, reasoning, content, each tool call, the finish reason, then (when `usage`) the
/// usage-only chunk. Refused when `c` has no first choice.
pub fn chunks(c: &Value, model: &str, usage: bool) -> Result<Vec<String>, Refusal> {
    let choice = c
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .ok_or("no choice")?;
    let msg = choice.get("message").cloned().unwrap_or(Value::Null);
    let id = c
        .get("id")
        .cloned()
        .unwrap_or_else(|| "chatcmpl-cached".into());
    let created = c.get("created").cloned().unwrap_or(0.into());
    let fingerprint = c.get("system_fingerprint").cloned();
    let chunk = |choices: Value| {
        let mut m = Map::new();
        m.insert("id".into(), id.clone());
        m.insert("object".into(), "chat.completion.chunk".into());
        m.insert("created".into(), created.clone());
        m.insert("model".into(), model.into());
        if let Some(f) = &fingerprint {
            m.insert("system_fingerprint".into(), f.clone());
        }
        m.insert("choices".into(), choices);
        Value::Object(m).to_string()
    };
    let delta = |d: Value| json!([{"index": 0, "delta": d, "finish_reason": null}]);
    let mut out = vec![chunk(delta(json!({"role": "assistant", "content": ""})))];
    let text = |k: &str| msg.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    if let Some(r) = text("reasoning_content").or_else(|| text("reasoning")) {
        out.push(chunk(delta(json!({ "reasoning_content": r }))));
    }
    if let Some(t) = text("content") {
        out.push(chunk(delta(json!({ "content": t }))));
    }
    if let Some(t) = text("refusal") {
        out.push(chunk(delta(json!({ "refusal": t }))));
    }
    for (i, t) in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let f = t.get("function").cloned().unwrap_or(Value::Null);
        out.push(chunk(delta(json!({"tool_calls": [{
            "index": i,
            "id": t.get("id").cloned().unwrap_or(Value::Null),
            "type": "function",
            "function": {"name": f.get("name").cloned().unwrap_or("".into()),
                         "arguments": f.get("arguments").cloned().unwrap_or("".into())}
        }]}))));
    }
    let finish = choice
        .get("finish_reason")
        .cloned()
        .unwrap_or_else(|| "stop".into());
    out.push(chunk(
        json!([{"index": 0, "delta": {}, "finish_reason": finish}]),
    ));
    if usage {
        if let Some(u) = c.get("usage").filter(|u| u.is_object()) {
            let mut m = Map::new();
            m.insert("id".into(), id.clone());
            m.insert("object".into(), "chat.completion.chunk".into());
            m.insert("created".into(), created.clone());
            m.insert("model".into(), model.into());
            m.insert("choices".into(), json!([]));
            m.insert("usage".into(), u.clone());
            out.push(Value::Object(m).to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion() -> Value {
        json!({"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m",
               "choices":[{"index":0,"message":{"role":"assistant","content":"Hello there",
               "tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
               "finish_reason":"tool_calls"}],
               "usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}})
    }

    #[test]
    fn unfold_then_fold_is_the_same_answer() {
        let c = completion();
        let mut ev = chunks(&c, "m", true).unwrap();
        ev.push("[DONE]".into());
        let back = aggregate(ev.iter().map(String::as_str)).unwrap();
        assert_eq!(back["choices"], c["choices"]);
        assert_eq!(back["usage"], c["usage"]);
        assert_eq!(back["id"], "chatcmpl-1");
        // without usage: no usage-only chunk
        let n = chunks(&c, "m", false).unwrap();
        assert_eq!(n.len(), ev.len() - 2);
        assert!(n.iter().all(|e| !e.contains("\"usage\"")));
    }

    #[test]
    fn cut_or_failed_streams_are_refused() {
        let c = completion();
        let ev = chunks(&c, "m", false).unwrap();
        // no [DONE]
        assert!(aggregate(ev.iter().map(String::as_str)).is_err());
        // no finish reason
        let cut: Vec<&str> = vec![ev[0].as_str(), ev[1].as_str(), "[DONE]"];
        assert_eq!(aggregate(cut), Err("incomplete stream"));
        let err = vec![ev[0].as_str(), r#"{"error":{"message":"boom"}}"#, "[DONE]"];
        assert_eq!(aggregate(err), Err("error event"));
    }
}
